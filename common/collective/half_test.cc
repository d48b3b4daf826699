#include "common/collective/half.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "gtest/gtest.h"

namespace tessera {
namespace collective {
namespace {

TEST(HalfTest, KnownValues) {
  EXPECT_EQ(FloatToHalf(0.0f), 0x0000);
  EXPECT_EQ(FloatToHalf(-0.0f), 0x8000);
  EXPECT_EQ(FloatToHalf(1.0f), 0x3c00);
  EXPECT_EQ(FloatToHalf(-2.0f), 0xc000);
  EXPECT_EQ(FloatToHalf(65504.0f), 0x7bff);                      // largest finite
  EXPECT_EQ(FloatToHalf(65520.0f), 0x7c00);                      // rounds to +inf
  EXPECT_EQ(FloatToHalf(std::ldexp(1.0f, -24)), 0x0001);         // smallest subnormal
  EXPECT_EQ(FloatToHalf(std::ldexp(1.0f, -14)), 0x0400);         // smallest normal
  EXPECT_EQ(FloatToHalf(1.0f + std::ldexp(1.0f, -11)), 0x3c00);  // tie rounds to even
  EXPECT_EQ(FloatToHalf(std::numeric_limits<float>::infinity()), 0x7c00);
  EXPECT_TRUE(std::isnan(HalfToFloat(FloatToHalf(std::nanf("")))));
  EXPECT_EQ(HalfToFloat(0x3555), 0.333251953125f);
  EXPECT_EQ(HalfToFloat(0x0001), std::ldexp(1.0f, -24));
}

TEST(HalfTest, PortablePathMatchesForEveryHalfAndManyFloats) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float f = PortableHalfToFloat(static_cast<uint16_t>(h));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(HalfToFloat(static_cast<uint16_t>(h))));
      continue;
    }
    ASSERT_EQ(HalfToFloat(static_cast<uint16_t>(h)), f) << h;
    ASSERT_EQ(PortableFloatToHalf(f), h) << h;  // exact round trip
  }
  // Floats between halves: both paths round the same way.
  uint32_t bits = 0x00000001;
  for (int i = 0; i < 200000; ++i) {
    bits = bits * 1664525u + 1013904223u;
    float f;
    std::memcpy(&f, &bits, 4);
    if (std::isnan(f)) continue;
    ASSERT_EQ(FloatToHalf(f), PortableFloatToHalf(f)) << f;
  }
}

TEST(HalfTest, BulkConversionsAndReductions) {
  std::vector<float> in(1003);
  for (size_t i = 0; i < in.size(); ++i) in[i] = static_cast<float>(i) * 0.25f - 100;
  std::vector<uint16_t> h(in.size()), h2(in.size());
  std::vector<float> back(in.size());
  FloatToHalf(in.data(), h.data(), in.size());
  HalfToFloat(h.data(), back.data(), in.size());
  for (size_t i = 0; i < in.size(); ++i) ASSERT_EQ(back[i], in[i]) << i;  // exact in fp16
  HalfSum(h2.data(), h.data(), h.data(), h.size());
  HalfMax(h.data(), h.data(), h2.data(), h.size());  // aliasing output and input
  for (size_t i = 0; i < in.size(); ++i) {
    ASSERT_EQ(HalfToFloat(h2[i]), 2 * in[i]) << i;
    ASSERT_EQ(HalfToFloat(h[i]), std::max(in[i], 2 * in[i])) << i;
  }
  HalfScale(h2.data(), 0.5f, h2.size());
  for (size_t i = 0; i < in.size(); ++i) ASSERT_EQ(HalfToFloat(h2[i]), in[i]) << i;
}

}  // namespace
}  // namespace collective
}  // namespace tessera
