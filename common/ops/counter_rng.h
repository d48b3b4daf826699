// Counter-based random numbers: a value is a pure function of (seed, index), so any slice of a
// tensor, or any row of a sparse table, can be generated on its own and equals the same elements
// of the whole tensor generated at once. Pservers rely on this to initialize parameter blocks
// and sparse-table rows (created on first touch) exactly as single-machine training would.
//
// Indexing convention: element (row r, column j) of a [rows, width] tensor has
//   index = uint64_t(r) * uint64_t(width) + uint64_t(j)
// computed with wrapping (mod 2^64) arithmetic, so r may be any int64 id, negative included.
// An op generating a tensor whose first element is row r0 uses offset = r0 * width.
//
// The mixing is splitmix64 (Steele, Lea, Flood 2014): the value for (seed, index) is the
// index-th output of a splitmix64 stream whose state starts at Mix(seed). All functions are
// pure, header-only and thread-safe. Results are bit-identical across runs and machines that
// use the same libm (CounterGaussian calls std::log/std::cos).
#ifndef TESSERA_COMMON_OPS_COUNTER_RNG_H_
#define TESSERA_COMMON_OPS_COUNTER_RNG_H_

#include <cmath>
#include <cstdint>

#include "common/base/splitmix64.h"

namespace tessera {

namespace counter_rng_internal {

inline constexpr uint64_t kGolden = kSplitMix64Gamma;

inline uint64_t Mix64(uint64_t z) { return SplitMix64Mix(z); }

// Stream keys: two independent streams per seed (the second feeds Box-Muller's angle).
inline uint64_t StreamKey(uint64_t seed, uint64_t stream) {
  return Mix64(seed * kGolden + stream * 0xd1b54a32d192ed03ULL + 0x632be59bd9b4e019ULL);
}

inline uint64_t Bits(uint64_t key, uint64_t index) { return Mix64(key + (index + 1) * kGolden); }

// The top 53 bits of `bits` as a double in [0, 1).
inline double ToUnit(uint64_t bits) { return static_cast<double>(bits >> 11) * 0x1.0p-53; }

// A standard normal from two uniforms in [0, 1) (1 - u1 is in (0, 1], so the log is finite).
inline double BoxMuller(double u1, double u2) {
  constexpr double kTwoPi = 6.283185307179586476925286766559;
  return std::sqrt(-2.0 * std::log(1.0 - u1)) * std::cos(kTwoPi * u2);
}

}  // namespace counter_rng_internal

// 64 random bits for (seed, index).
inline uint64_t CounterBits(uint64_t seed, uint64_t index) {
  namespace cri = counter_rng_internal;
  return cri::Bits(cri::StreamKey(seed, 0), index);
}

// Uniform double in [0, 1) for (seed, index); multiples of 2^-53.
inline double CounterUniform(uint64_t seed, uint64_t index) {
  return counter_rng_internal::ToUnit(CounterBits(seed, index));
}

// Standard normal double for (seed, index): Box-Muller over two uniforms of the same index
// drawn from two independent streams of `seed`.
inline double CounterGaussian(uint64_t seed, uint64_t index) {
  namespace cri = counter_rng_internal;
  return cri::BoxMuller(cri::ToUnit(cri::Bits(cri::StreamKey(seed, 0), index)),
                        cri::ToUnit(cri::Bits(cri::StreamKey(seed, 1), index)));
}

// out[k] = min + (max - min) * CounterUniform(seed, first_index + k) for k in [0, n), rounded
// to T (float or double) and, when min < max, kept below max.
template <typename T>
void FillCounterUniform(uint64_t seed, uint64_t first_index, double min, double max, T* out,
                        int64_t n) {
  namespace cri = counter_rng_internal;
  const uint64_t key = cri::StreamKey(seed, 0);
  const double range = max - min;
  const T hi = static_cast<T>(max);
  const T below_hi = std::nextafter(hi, static_cast<T>(min));
  for (int64_t k = 0; k < n; ++k) {
    const uint64_t index = first_index + static_cast<uint64_t>(k);
    const T v = static_cast<T>(min + range * cri::ToUnit(cri::Bits(key, index)));
    out[k] = (v >= hi && min < max) ? below_hi : v;
  }
}

// out[k] = mean + stddev * CounterGaussian(seed, first_index + k) for k in [0, n), rounded to T.
template <typename T>
void FillCounterGaussian(uint64_t seed, uint64_t first_index, double mean, double stddev, T* out,
                         int64_t n) {
  namespace cri = counter_rng_internal;
  const uint64_t key1 = cri::StreamKey(seed, 0);
  const uint64_t key2 = cri::StreamKey(seed, 1);
  for (int64_t k = 0; k < n; ++k) {
    const uint64_t index = first_index + static_cast<uint64_t>(k);
    const double z =
        cri::BoxMuller(cri::ToUnit(cri::Bits(key1, index)), cri::ToUnit(cri::Bits(key2, index)));
    out[k] = static_cast<T>(mean + stddev * z);
  }
}

}  // namespace tessera

#endif  // TESSERA_COMMON_OPS_COUNTER_RNG_H_
