#include "common/ops/small_gemm.h"

#include <cstring>
#include <random>
#include <vector>

#include "Eigen/Core"
#include "gtest/gtest.h"

namespace tessera {
namespace {

using Mat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

std::vector<float> Random(int64_t n, std::mt19937* rng) {
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<float> v(static_cast<size_t>(n));
  for (float& x : v) x = u(*rng);
  return v;
}

// Every shape of the grid that SmallGemm handles gives Eigen's bits, for a row-major A (mul's
// forward) and a transposed one (mul_grad's Y@GRAD = X^T dOut); covers each of Eigen's column
// blocks (n % 24 = 0, 4, ..., 20), row groups (m % 4) and k around the 8-step peeling.
TEST(SmallGemmTest, SameBitsAsEigen) {
  std::mt19937 rng(5);
  int handled = 0;
  for (int64_t m : {2, 3, 4, 5, 7, 8, 13, 32, 33}) {
    for (int64_t k : {1, 2, 3, 7, 8, 9, 10, 15, 16, 17, 31, 32, 64, 128}) {
      for (int64_t n = 4; n <= 120; n += 4) {
        SCOPED_TRACE(testing::Message() << "m=" << m << " k=" << k << " n=" << n);
        const std::vector<float> a = Random(m * k, &rng), b = Random(k * n, &rng);
        Mat want(m, n);
        std::vector<float> got(static_cast<size_t>(m * n), 7.0f);
        // A row-major [m, k].
        want.noalias() =
            Eigen::Map<const Mat>(a.data(), m, k) * Eigen::Map<const Mat>(b.data(), k, n);
        if (SmallGemm(a.data(), k, 1, b.data(), m, k, n, got.data())) {
          ++handled;
          EXPECT_EQ(std::memcmp(got.data(), want.data(), sizeof(float) * got.size()), 0);
        }
        // A the transpose of a row-major [k, m].
        want.noalias() = Eigen::Map<const Mat>(a.data(), k, m).transpose() *
                         Eigen::Map<const Mat>(b.data(), k, n);
        if (SmallGemm(a.data(), 1, m, b.data(), m, k, n, got.data())) {
          ++handled;
          EXPECT_EQ(std::memcmp(got.data(), want.data(), sizeof(float) * got.size()), 0);
        }
      }
    }
  }
#if defined(EIGEN_VECTORIZE_AVX2) && defined(EIGEN_VECTORIZE_FMA) && \
    !defined(EIGEN_VECTORIZE_AVX512)
  EXPECT_GT(handled, 7000);  // the grid is mostly in range on builds that have the kernels
#else
  EXPECT_EQ(handled, 0);
#endif
}

// Shapes Eigen computes with other kernels are declined, and C is left alone.
TEST(SmallGemmTest, DeclinesOtherShapes) {
  std::vector<float> a(600 * 200, 0.5f), b(200 * 600, 0.25f), c(600 * 600, 3.0f);
  struct Shape {
    int64_t m, k, n;
  };
  for (const Shape& s : {Shape{1, 10, 100},    // one row: GEMV
                         Shape{32, 10, 1},     // one column: GEMV
                         Shape{4, 4, 8},       // k + m + n < 20: coefficient-based
                         Shape{32, 10, 101},   // n % 4 != 0: one row of Eigen's at a time
                         Shape{32, 129, 100},  // k > 128: Eigen may split k
                         Shape{513, 10, 100}, Shape{32, 10, 516}}) {
    SCOPED_TRACE(testing::Message() << "m=" << s.m << " k=" << s.k << " n=" << s.n);
    EXPECT_FALSE(SmallGemm(a.data(), s.k, 1, b.data(), s.m, s.k, s.n, c.data()));
    EXPECT_EQ(c[0], 3.0f);
  }
  // Neither A's rows nor its columns contiguous.
  EXPECT_FALSE(SmallGemm(a.data(), 20, 2, b.data(), 32, 10, 100, c.data()));
}

}  // namespace
}  // namespace tessera
