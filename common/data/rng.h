// Deterministic random helpers for the data layer.
//
// std::uniform_int_distribution, std::normal_distribution and std::shuffle produce sequences
// that differ between standard libraries. Shards and generated files must be identical on every
// machine, so the data layer takes only raw std::mt19937_64 outputs (a sequence the C++ standard
// fixes) and transforms them with the functions below. All functions are pure or touch only the
// generator passed in; thread-compatible.
#ifndef TESSERA_COMMON_DATA_RNG_H_
#define TESSERA_COMMON_DATA_RNG_H_

#include <cmath>
#include <cstdint>
#include <random>

#include "common/base/splitmix64.h"

namespace tessera {
namespace data {

// Uniform integer in [0, bound), bound >= 1, without modulo bias (rejects the 2^64 mod bound
// smallest raw outputs).
inline uint64_t UniformBelow(std::mt19937_64& rng, uint64_t bound) {
  const uint64_t threshold = (0 - bound) % bound;
  while (true) {
    const uint64_t r = rng();
    if (r >= threshold) return r % bound;
  }
}

// Uniform double in [0, 1) from the top 53 bits of one raw output.
inline double UniformDouble(std::mt19937_64& rng) {
  return static_cast<double>(rng() >> 11) * 0x1.0p-53;
}

// A standard normal value from two independent uniforms in [0, 1) (Box-Muller).
inline double NormalFromUniforms(double u1, double u2) {
  constexpr double kTwoPi = 6.283185307179586476925286766559;
  return std::sqrt(-2.0 * std::log1p(-u1)) * std::cos(kTwoPi * u2);
}

// A standard normal value from two draws of `rng`.
inline double Normal(std::mt19937_64& rng) {
  const double u1 = UniformDouble(rng);
  return NormalFromUniforms(u1, UniformDouble(rng));
}

// A fixed bijection of the 64-bit integers with good avalanche (the SplitMix64 finalizer).
inline constexpr uint64_t Mix64(uint64_t z) { return SplitMix64Mix(z); }

namespace internal {
// Multiplicative inverse of an odd number modulo 2^64 (Newton's iteration doubles the correct
// low bits each step: 5 steps take 3 correct bits to 96).
inline constexpr uint64_t InverseMod64(uint64_t a) {
  uint64_t x = a;  // Correct to 3 bits for odd a.
  for (int i = 0; i < 5; ++i) x *= 2 - a * x;
  return x;
}
// Inverse of z ^= z >> shift.
inline constexpr uint64_t UnXorShift(uint64_t z, int shift) {
  uint64_t x = z;
  for (int i = shift; i < 64; i += shift) x = z ^ (x >> shift);
  return x;
}
}  // namespace internal

// The inverse of Mix64: UnMix64(Mix64(x)) == x for every x.
inline constexpr uint64_t UnMix64(uint64_t z) {
  z = internal::UnXorShift(z, 31);
  z *= internal::InverseMod64(0x94d049bb133111ebULL);
  z = internal::UnXorShift(z, 27);
  z *= internal::InverseMod64(0xbf58476d1ce4e5b9ULL);
  return internal::UnXorShift(z, 30);
}

// A uniform double in [0, 1) that is a fixed function of `key`.
inline double HashToUnit(uint64_t key) { return static_cast<double>(Mix64(key) >> 11) * 0x1.0p-53; }

}  // namespace data
}  // namespace tessera

#endif  // TESSERA_COMMON_DATA_RNG_H_
