#include "common/collective/half.h"

#include <cstring>

#ifdef __F16C__
#include <immintrin.h>
#endif

namespace tessera {
namespace collective {
namespace {

uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}

float FromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

template <typename Op>
void HalfBinary(uint16_t* c, const uint16_t* a, const uint16_t* b, size_t n, Op op) {
  size_t i = 0;
#ifdef __F16C__
  for (; i + 8 <= n; i += 8) {
    const __m256 x = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(a + i)));
    const __m256 y = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + i)));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(c + i),
                     _mm256_cvtps_ph(op(x, y), _MM_FROUND_TO_NEAREST_INT));
  }
#endif
  for (; i < n; ++i) {
    c[i] = FloatToHalf(op(HalfToFloat(a[i]), HalfToFloat(b[i])));
  }
}

#ifdef __F16C__
struct SumOp {
  __m256 operator()(__m256 x, __m256 y) const { return _mm256_add_ps(x, y); }
  float operator()(float x, float y) const { return x + y; }
};
struct MaxOp {
  __m256 operator()(__m256 x, __m256 y) const { return _mm256_max_ps(x, y); }
  float operator()(float x, float y) const { return x > y ? x : y; }
};
struct MinOp {
  __m256 operator()(__m256 x, __m256 y) const { return _mm256_min_ps(x, y); }
  float operator()(float x, float y) const { return x < y ? x : y; }
};
#else
struct SumOp {
  float operator()(float x, float y) const { return x + y; }
};
struct MaxOp {
  float operator()(float x, float y) const { return x > y ? x : y; }
};
struct MinOp {
  float operator()(float x, float y) const { return x < y ? x : y; }
};
#endif

}  // namespace

uint16_t PortableFloatToHalf(float f) {
  const uint32_t x = Bits(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t abs = x & 0x7fffffffu;
  if (abs >= 0x7f800000u) {  // inf or NaN
    return static_cast<uint16_t>(sign | 0x7c00u | (abs > 0x7f800000u ? 0x200u : 0u));
  }
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // rounds to inf
  if (abs < 0x38800000u) {  // fp16 subnormal or zero: scale into integer range and round
    const float scaled = FromBits(abs) * 16777216.0f;  // 2^24: one unit = smallest subnormal
    const uint32_t m = static_cast<uint32_t>(scaled);
    const float rest = scaled - static_cast<float>(m);
    uint32_t r = m;
    if (rest > 0.5f || (rest == 0.5f && (m & 1u))) ++r;
    return static_cast<uint16_t>(sign | r);
  }
  // Normal: rebias exponent (127 -> 15) and round the 13 dropped mantissa bits to nearest even.
  uint32_t h = ((abs - 0x38000000u) >> 13);
  const uint32_t dropped = abs & 0x1fffu;
  if (dropped > 0x1000u || (dropped == 0x1000u && (h & 1u))) ++h;
  return static_cast<uint16_t>(sign | h);
}

float PortableHalfToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t man = h & 0x3ffu;
  if (exp == 0) {
    const float v = static_cast<float>(man) * (1.0f / 16777216.0f);
    return sign ? -v : v;
  }
  if (exp == 31) return FromBits(sign | 0x7f800000u | (man << 13));
  return FromBits(sign | ((exp + 112u) << 23) | (man << 13));
}

uint16_t FloatToHalf(float f) {
#ifdef __F16C__
  return static_cast<uint16_t>(_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT));
#else
  return PortableFloatToHalf(f);
#endif
}

float HalfToFloat(uint16_t h) {
#ifdef __F16C__
  return _cvtsh_ss(h);
#else
  return PortableHalfToFloat(h);
#endif
}

void FloatToHalf(const float* in, uint16_t* out, size_t n) {
  size_t i = 0;
#ifdef __F16C__
  for (; i + 8 <= n; i += 8) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(out + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(in + i), _MM_FROUND_TO_NEAREST_INT));
  }
#endif
  for (; i < n; ++i) out[i] = FloatToHalf(in[i]);
}

void HalfToFloat(const uint16_t* in, float* out, size_t n) {
  size_t i = 0;
#ifdef __F16C__
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(out + i,
                     _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(in + i))));
  }
#endif
  for (; i < n; ++i) out[i] = HalfToFloat(in[i]);
}

void DoubleToHalf(const double* in, uint16_t* out, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = FloatToHalf(static_cast<float>(in[i]));
}

void HalfToDouble(const uint16_t* in, double* out, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = HalfToFloat(in[i]);
}

void HalfSum(uint16_t* c, const uint16_t* a, const uint16_t* b, size_t n) {
  HalfBinary(c, a, b, n, SumOp());
}
void HalfMax(uint16_t* c, const uint16_t* a, const uint16_t* b, size_t n) {
  HalfBinary(c, a, b, n, MaxOp());
}
void HalfMin(uint16_t* c, const uint16_t* a, const uint16_t* b, size_t n) {
  HalfBinary(c, a, b, n, MinOp());
}

void HalfScale(uint16_t* x, float s, size_t n) {
  for (size_t i = 0; i < n; ++i) x[i] = FloatToHalf(HalfToFloat(x[i]) * s);
}

}  // namespace collective
}  // namespace tessera
