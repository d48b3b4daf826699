#include "common/data/rng.h"

#include <cstdint>
#include <random>
#include <vector>

#include "gtest/gtest.h"

namespace tessera {
namespace data {
namespace {

TEST(RngTest, Mt19937_64IsTheStandardSequence) {
  // The C++ standard fixes this value ([rand.predef]); everything in the data layer relies on it.
  std::mt19937_64 rng;
  rng.discard(9999);
  EXPECT_EQ(rng(), 9981545732273789042ULL);
}

TEST(RngTest, UnMix64InvertsMix64) {
  std::mt19937_64 rng(7);
  for (int i = 0; i < 100000; ++i) {
    const uint64_t x = rng();
    EXPECT_EQ(UnMix64(Mix64(x)), x);
    EXPECT_EQ(Mix64(UnMix64(x)), x);
  }
  for (uint64_t x : {uint64_t{0}, uint64_t{1}, ~uint64_t{0}, uint64_t{1} << 63}) {
    EXPECT_EQ(UnMix64(Mix64(x)), x);
  }
  EXPECT_NE(Mix64(1), 1u);
}

TEST(RngTest, UniformBelowStaysInRangeAndIsFlat) {
  std::mt19937_64 rng(3);
  EXPECT_EQ(UniformBelow(rng, 1), 0u);
  std::vector<int> counts(6, 0);
  constexpr int kDraws = 600000;
  for (int i = 0; i < kDraws; ++i) {
    const uint64_t v = UniformBelow(rng, 6);
    ASSERT_LT(v, 6u);
    ++counts[v];
  }
  // Expected 100000 each, standard deviation ~289.
  for (int c : counts) EXPECT_NEAR(c, 100000, 1500);
  // A bound near 2^64 rejects almost half of the raw outputs and still terminates.
  const uint64_t big = (uint64_t{1} << 63) + 1;
  for (int i = 0; i < 1000; ++i) EXPECT_LT(UniformBelow(rng, big), big);
}

TEST(RngTest, UniformDoubleAndNormalMoments) {
  std::mt19937_64 rng(11);
  double sum = 0, sum_sq = 0, nsum = 0, nsum_sq = 0;
  constexpr int kDraws = 200000;
  for (int i = 0; i < kDraws; ++i) {
    const double u = UniformDouble(rng);
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    sum += u;
    sum_sq += u * u;
    const double z = Normal(rng);
    nsum += z;
    nsum_sq += z * z;
  }
  EXPECT_NEAR(sum / kDraws, 0.5, 0.003);
  EXPECT_NEAR(sum_sq / kDraws - 0.25, 1.0 / 12, 0.003);
  EXPECT_NEAR(nsum / kDraws, 0.0, 0.01);
  EXPECT_NEAR(nsum_sq / kDraws, 1.0, 0.015);
}

TEST(RngTest, HashToUnitIsAFixedFunction) {
  EXPECT_EQ(HashToUnit(12345), HashToUnit(12345));
  EXPECT_NE(HashToUnit(12345), HashToUnit(12346));
  EXPECT_GE(HashToUnit(0), 0.0);
  EXPECT_LT(HashToUnit(~uint64_t{0}), 1.0);
}

}  // namespace
}  // namespace data
}  // namespace tessera
