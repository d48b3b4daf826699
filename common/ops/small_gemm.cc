#include "common/ops/small_gemm.h"

#include "Eigen/Core"

#if defined(EIGEN_VECTORIZE_AVX2) && defined(EIGEN_VECTORIZE_FMA) && \
    !defined(EIGEN_VECTORIZE_AVX512)
#define TESSERA_SMALL_GEMM 1
#include <immintrin.h>
#endif

namespace tessera {

#ifdef TESSERA_SMALL_GEMM
namespace {

// Element (i, p) of A, for A row-major (kUnitCol: a[i * stride + p]) or the transpose of a
// row-major matrix (a[i + p * stride]); a unit stride known at compile time keeps the address
// arithmetic out of the inner loops.
template <bool kUnitCol>
struct AView {
  const float* a;
  int64_t stride;
  const float* At(int64_t i, int64_t p) const {
    return kUnitCol ? a + i * stride + p : a + i + p * stride;
  }
  AView Row(int64_t i) const { return {At(i, 0), stride}; }
};

// Eigen's view of C = A * B (row-major) is the column-major C^T = B^T * A^T: its GEBP "rows" are
// our columns j, in blocks of 24, 16, 8 and 4 (3, 2, 1 and half a packet), its "columns" our
// rows i, in groups of 4 and then one at a time. Below, kRows rows of C by kPackets packets of 8
// columns, each element a single chain of fused multiply-adds over p from zero: Eigen's 3pX4,
// 2pX4 and every ...X1 kernel. The small loops are unrolled so that the accumulators stay in
// registers (without that, GCC stores the arrays to the stack on every step of p).
template <int kRows, int kPackets, typename A>
inline void ChainTile(const A& a, const float* b, int64_t ldb, int64_t k, float* c, int64_t ldc) {
  __m256 acc[kRows][kPackets];
#pragma GCC unroll 16
  for (int r = 0; r < kRows; ++r) {
#pragma GCC unroll 16
    for (int w = 0; w < kPackets; ++w) acc[r][w] = _mm256_setzero_ps();
  }
  for (int64_t p = 0; p < k; ++p) {
    __m256 bv[kPackets];
#pragma GCC unroll 16
    for (int w = 0; w < kPackets; ++w) bv[w] = _mm256_loadu_ps(b + p * ldb + 8 * w);
#pragma GCC unroll 16
    for (int r = 0; r < kRows; ++r) {
      const __m256 av = _mm256_broadcast_ss(a.At(r, p));
#pragma GCC unroll 16
      for (int w = 0; w < kPackets; ++w) acc[r][w] = _mm256_fmadd_ps(bv[w], av, acc[r][w]);
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < kRows; ++r) {
#pragma GCC unroll 16
    for (int w = 0; w < kPackets; ++w) _mm256_storeu_ps(c + r * ldc + 8 * w, acc[r][w]);
  }
}

// One row, 4 columns, a single chain (Eigen's half-packet X1 kernel).
template <typename A>
inline void ChainQuad(const A& a, const float* b, int64_t ldb, int64_t k, float* c) {
  __m128 acc = _mm_setzero_ps();
  for (int64_t p = 0; p < k; ++p) {
    acc = _mm_fmadd_ps(_mm_loadu_ps(b + p * ldb), _mm_broadcast_ss(a.At(0, p)), acc);
  }
  _mm_storeu_ps(c, acc);
}

// Four rows by one packet (8 or 4 columns, Vec = __m256 or __m128): Eigen's 1pX4 and halfX4
// kernels, which accumulate even p below k & ~7 in one chain and odd p in another, add them,
// then continue the sum over the last k % 8.
template <typename Vec>
struct Ops;
template <>
struct Ops<__m256> {
  static __m256 Zero() { return _mm256_setzero_ps(); }
  static __m256 Load(const float* p) { return _mm256_loadu_ps(p); }
  static __m256 Splat(const float* p) { return _mm256_broadcast_ss(p); }
  static __m256 Fma(__m256 x, __m256 y, __m256 z) { return _mm256_fmadd_ps(x, y, z); }
  static __m256 Add(__m256 x, __m256 y) { return _mm256_add_ps(x, y); }
  static void Store(float* p, __m256 v) { _mm256_storeu_ps(p, v); }
};
template <>
struct Ops<__m128> {
  static __m128 Zero() { return _mm_setzero_ps(); }
  static __m128 Load(const float* p) { return _mm_loadu_ps(p); }
  static __m128 Splat(const float* p) { return _mm_broadcast_ss(p); }
  static __m128 Fma(__m128 x, __m128 y, __m128 z) { return _mm_fmadd_ps(x, y, z); }
  static __m128 Add(__m128 x, __m128 y) { return _mm_add_ps(x, y); }
  static void Store(float* p, __m128 v) { _mm_storeu_ps(p, v); }
};

template <typename Vec, typename A>
inline void SplitTile4(const A& a, const float* b, int64_t ldb, int64_t k, float* c, int64_t ldc) {
  using O = Ops<Vec>;
  Vec even[4], odd[4];
#pragma GCC unroll 16
  for (int r = 0; r < 4; ++r) even[r] = odd[r] = O::Zero();
  const int64_t peeled = k & ~int64_t{7};
  int64_t p = 0;
  for (; p < peeled; p += 2) {
    const Vec b0 = O::Load(b + p * ldb), b1 = O::Load(b + (p + 1) * ldb);
#pragma GCC unroll 16
    for (int r = 0; r < 4; ++r) {
      even[r] = O::Fma(b0, O::Splat(a.At(r, p)), even[r]);
      odd[r] = O::Fma(b1, O::Splat(a.At(r, p + 1)), odd[r]);
    }
  }
#pragma GCC unroll 16
  for (int r = 0; r < 4; ++r) even[r] = O::Add(even[r], odd[r]);
  for (; p < k; ++p) {
    const Vec b0 = O::Load(b + p * ldb);
#pragma GCC unroll 16
    for (int r = 0; r < 4; ++r) even[r] = O::Fma(b0, O::Splat(a.At(r, p)), even[r]);
  }
#pragma GCC unroll 16
  for (int r = 0; r < 4; ++r) O::Store(c + r * ldc, even[r]);
}

// One row of C: every element a single chain (Eigen's X1 kernels), so the row goes in chunks of
// 8 packets (independent chains to keep the FMA units busy), then packets, then 4 columns.
template <typename A>
inline void ChainRow(const A& a, const float* b, int64_t k, int64_t n, float* c) {
  int64_t j = 0;
  for (; j + 64 <= n; j += 64) ChainTile<1, 8>(a, b + j, n, k, c + j, n);
  for (; j + 32 <= n; j += 32) ChainTile<1, 4>(a, b + j, n, k, c + j, n);
  for (; j + 8 <= n; j += 8) ChainTile<1, 1>(a, b + j, n, k, c + j, n);
  if (j < n) ChainQuad(a, b + j, n, k, c + j);
}

// Four rows of C: 24- and 16-column blocks are single chains, the 8- and 4-column blocks at the
// right edge split chains.
template <typename A>
inline void FourRows(const A& a, const float* b, int64_t k, int64_t n, float* c) {
  const int64_t n3 = n / 24 * 24;
  const int64_t n2 = n3 + (n - n3) / 16 * 16;
  const int64_t n1 = n2 + (n - n2) / 8 * 8;
  int64_t j = 0;
  for (; j < n3; j += 24) ChainTile<4, 3>(a, b + j, n, k, c + j, n);
  for (; j < n2; j += 16) ChainTile<4, 2>(a, b + j, n, k, c + j, n);
  for (; j < n1; j += 8) SplitTile4<__m256>(a, b + j, n, k, c + j, n);
  if (j < n) SplitTile4<__m128>(a, b + j, n, k, c + j, n);
}

template <typename A>
void Gemm(const A& a, const float* b, int64_t m, int64_t k, int64_t n, float* c) {
  const int64_t m4 = m / 4 * 4;
  int64_t i = 0;
  for (; i < m4; i += 4) FourRows(a.Row(i), b, k, n, c + i * n);
  for (; i < m; ++i) ChainRow(a.Row(i), b, k, n, c + i * n);
}

}  // namespace

bool SmallGemm(const float* a, int64_t a_row_stride, int64_t a_col_stride, const float* b,
               int64_t m, int64_t k, int64_t n, float* c) {
  if (m < 2 || n < 2 || k < 1 || k > 128 || m > 512 || n > 512 || n % 4 != 0 ||
      k + m + n < EIGEN_GEMM_TO_COEFFBASED_THRESHOLD) {
    return false;
  }
  if (a_col_stride == 1) {
    Gemm(AView<true>{a, a_row_stride}, b, m, k, n, c);
  } else if (a_row_stride == 1) {
    Gemm(AView<false>{a, a_col_stride}, b, m, k, n, c);
  } else {
    return false;
  }
  return true;
}

#else  // no AVX2 + FMA build, or AVX-512: Eigen's kernels differ; leave every product to Eigen

bool SmallGemm(const float*, int64_t, int64_t, const float*, int64_t, int64_t, int64_t, float*) {
  return false;
}

#endif

}  // namespace tessera
