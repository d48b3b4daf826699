// SmallGemm: C = op(A) * B for the small float products of thin layers (a 10-100-1 MLP at batch
// 32, the CTR model's 64-32 layer), bit for bit what Eigen computes for
//   EigenMatrix<float>(c, m, n).noalias() = op(A) * ConstEigenMatrix<float>(b, k, n);
// but without what Eigen spends around its micro kernels at these sizes: zeroing C, packing both
// operands, sizing cache blocks (32x10 * 10x100: about 1.2 us in Eigen, 0.85 us here, on the
// 2-core development VM).
//
// The same bits: each element of C is accumulated in the order Eigen's GEBP micro kernels
// (Eigen 3.4, AVX2 + FMA, float) use for the column block it falls in, fused multiply-adds
// from zero over k; in the 8- and 4-wide blocks at the right edge, even and odd k in two chains
// added before the last k % 8 (Eigen's 1pX4 kernels). Shapes whose elements Eigen handles
// otherwise are declined: single rows or columns (GEMV), k + m + n < 20 (coefficient-based
// products), n not a multiple of 4 (Eigen's one-row-at-a-time kernel), k > 128 (Eigen could
// split k into cache blocks), m or n > 512 (the range verified). small_gemm_test compares every
// handled shape of a grid with Eigen's product bitwise; builds without AVX2 and FMA, or with
// AVX-512, decline every shape.
#ifndef TESSERA_COMMON_OPS_SMALL_GEMM_H_
#define TESSERA_COMMON_OPS_SMALL_GEMM_H_

#include <cstdint>

namespace tessera {

// C [m, n] (row-major, contiguous) = A [m, k] * B [k, n] (row-major, contiguous rows), where
// element (i, p) of A is a[i * a_row_stride + p * a_col_stride]: (k, 1) for a row-major A,
// (1, m) for the transpose of a row-major [k, m] matrix. C must not overlap A or B. Returns
// false, leaving C alone, for a shape it does not handle (see above); the caller then uses Eigen.
bool SmallGemm(const float* a, int64_t a_row_stride, int64_t a_col_stride, const float* b,
               int64_t m, int64_t k, int64_t n, float* c);

}  // namespace tessera

#endif  // TESSERA_COMMON_OPS_SMALL_GEMM_H_
