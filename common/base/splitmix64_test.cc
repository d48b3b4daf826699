#include "common/base/splitmix64.h"

#include "common/ops/sharding.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

// The reference splitmix64 stream from seed 0 (Vigna's splitmix64.c): these values fix which
// pserver owns a table id and every id's initial row, so they must never change.
TEST(SplitMix64Test, MatchesTheReferenceStream) {
  uint64_t state = 0;
  EXPECT_EQ(SplitMix64Next(state), 0xe220a8397b1dcdafULL);
  state += kSplitMix64Gamma;
  EXPECT_EQ(SplitMix64Next(state), 0x6e789e6aa1b965f4ULL);
  state += kSplitMix64Gamma;
  EXPECT_EQ(SplitMix64Next(state), 0x06c45d188009454fULL);
  static_assert(SplitMix64Mix(0) == 0, "the mix fixes 0");
}

TEST(SplitMix64Test, HashShardingUsesIt) {
  for (int64_t id : {int64_t{0}, int64_t{1}, int64_t{-1}, int64_t{123456789}}) {
    EXPECT_EQ(ShardOf(id, 7, ShardMethod::kHash),
              static_cast<int>(SplitMix64Next(static_cast<uint64_t>(id)) % 7));
  }
}

}  // namespace
}  // namespace tessera
