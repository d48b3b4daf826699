#include "common/collective/compression.h"

#include <vector>

#include "gtest/gtest.h"

namespace tessera {
namespace collective {
namespace {

TEST(CompressionTest, TopKCount) {
  EXPECT_EQ(TopKCount(0, 0.1), 0u);
  EXPECT_EQ(TopKCount(1, 0.01), 1u);
  EXPECT_EQ(TopKCount(1000, 0.01), 10u);
  EXPECT_EQ(TopKCount(1001, 0.01), 11u);
  EXPECT_EQ(TopKCount(10, 1.0), 10u);
}

TEST(CompressionTest, TopKPicksLargestMagnitudes) {
  const std::vector<float> v = {0.1f, -5, 3, 0, -3, 7, 0.2f};
  EXPECT_EQ(TopKIndices(v.data(), v.size(), 3), (std::vector<uint32_t>{1, 2, 5}));  // tie 3 / -3
  EXPECT_EQ(TopKIndices(v.data(), v.size(), 1), (std::vector<uint32_t>{5}));
  EXPECT_EQ(TopKIndices(v.data(), v.size(), 100).size(), v.size());
  const std::vector<double> d = {1, -2, 0.5};
  EXPECT_EQ(TopKIndices(d.data(), d.size(), 2), (std::vector<uint32_t>{0, 1}));
}

TEST(CompressionTest, Threshold) {
  const std::vector<float> v = {0.1f, -5, 3, 0, -3, 7, 0.2f};
  EXPECT_EQ(ThresholdIndices(v.data(), v.size(), 3.0), (std::vector<uint32_t>{1, 2, 4, 5}));
  EXPECT_TRUE(ThresholdIndices(v.data(), v.size(), 100.0).empty());
  EXPECT_EQ(ThresholdIndices(v.data(), v.size(), 0.0).size(), v.size());
}

TEST(CompressionTest, PackAndAccumulateWithPadding) {
  const std::vector<float> a = {1, 2, 3, 4};
  const std::vector<float> b = {10, 20, 30, 40};
  std::vector<uint8_t> wire;
  PackSparse(a.data(), {0, 3}, 3, &wire);  // two entries and one pad
  PackSparse(b.data(), {3}, 3, &wire);     // one entry and two pads
  EXPECT_EQ(wire.size(), 6 * SparseEntryBytes<float>());
  std::vector<float> out(4, 0);
  ASSERT_TRUE(AccumulateSparse(wire.data(), 6, out.data(), out.size()).ok());
  EXPECT_EQ(out, (std::vector<float>{1, 0, 0, 44}));
  std::vector<float> small(2, 0);
  EXPECT_TRUE(absl::IsInvalidArgument(AccumulateSparse(wire.data(), 6, small.data(), 2)));

  const std::vector<double> d = {0.5, 1.5};
  std::vector<uint8_t> dw;
  PackSparse(d.data(), {1}, 1, &dw);
  EXPECT_EQ(dw.size(), 12u);
  std::vector<double> dout(2, 1.0);
  ASSERT_TRUE(AccumulateSparse(dw.data(), 1, dout.data(), 2).ok());
  EXPECT_EQ(dout, (std::vector<double>{1.0, 2.5}));
}

TEST(CompressionTest, Validate) {
  CompressionOptions c;
  EXPECT_TRUE(ValidateCompression(c).ok());
  c.kind = Compression::kTopK;
  c.topk_fraction = 0;
  EXPECT_TRUE(absl::IsInvalidArgument(ValidateCompression(c)));
  c.topk_fraction = 1.5;
  EXPECT_TRUE(absl::IsInvalidArgument(ValidateCompression(c)));
  c.kind = Compression::kThreshold;
  c.threshold = -1;
  EXPECT_TRUE(absl::IsInvalidArgument(ValidateCompression(c)));
}

}  // namespace
}  // namespace collective
}  // namespace tessera
