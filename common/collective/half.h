// IEEE 754 binary16 ("fp16") conversions, for sending float gradients as 16-bit values.
// Round-to-nearest-even; values beyond the fp16 range become +-inf, NaN stays NaN. Uses the
// F16C instructions when the build enables them (-mf16c), a portable path otherwise.
#ifndef TESSERA_COMMON_COLLECTIVE_HALF_H_
#define TESSERA_COMMON_COLLECTIVE_HALF_H_

#include <cstddef>
#include <cstdint>

namespace tessera {
namespace collective {

uint16_t FloatToHalf(float f);
float HalfToFloat(uint16_t h);

// Element-wise over n values (in and out must not overlap).
void FloatToHalf(const float* in, uint16_t* out, size_t n);
void HalfToFloat(const uint16_t* in, float* out, size_t n);
void DoubleToHalf(const double* in, uint16_t* out, size_t n);
void HalfToDouble(const uint16_t* in, double* out, size_t n);

// c[i] = half(float(a[i]) op float(b[i])); c may alias a or b. For reductions on fp16 buffers.
void HalfSum(uint16_t* c, const uint16_t* a, const uint16_t* b, size_t n);
void HalfMax(uint16_t* c, const uint16_t* a, const uint16_t* b, size_t n);
void HalfMin(uint16_t* c, const uint16_t* a, const uint16_t* b, size_t n);
// x[i] = half(float(x[i]) * s).
void HalfScale(uint16_t* x, float s, size_t n);

// The portable scalar conversions (used when F16C is not available; tests check that both
// paths agree).
uint16_t PortableFloatToHalf(float f);
float PortableHalfToFloat(uint16_t h);

}  // namespace collective
}  // namespace tessera

#endif  // TESSERA_COMMON_COLLECTIVE_HALF_H_
