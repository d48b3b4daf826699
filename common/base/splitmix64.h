// SplitMix64 (Steele, Lea, Flood 2014), the one copy every hash and counter-based random stream
// of Tessera builds on: the hash-sharding of table ids (common/ops/sharding.h), the per-id row
// initializers (common/ops/counter_rng.h) and the data generators (common/data/rng.h). Their
// outputs are part of the wire and checkpoint formats (which pserver owns an id, a row's
// initial value), so this function must never change.
#ifndef TESSERA_COMMON_BASE_SPLITMIX64_H_
#define TESSERA_COMMON_BASE_SPLITMIX64_H_

#include <cstdint>

namespace tessera {

// The splitmix64 state increment (2^64 / golden ratio, odd).
inline constexpr uint64_t kSplitMix64Gamma = 0x9e3779b97f4a7c15ULL;

// The splitmix64 output function: a bijection of the 64-bit words with good avalanche.
inline constexpr uint64_t SplitMix64Mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// The next output of a splitmix64 stream whose state was `state` (the state advances by
// kSplitMix64Gamma first).
inline constexpr uint64_t SplitMix64Next(uint64_t state) {
  return SplitMix64Mix(state + kSplitMix64Gamma);
}

}  // namespace tessera

#endif  // TESSERA_COMMON_BASE_SPLITMIX64_H_
