#include "common/data/sampler.h"

#include <algorithm>
#include <map>
#include <numeric>
#include <set>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tessera {
namespace data {
namespace {

using ::testing::HasSubstr;

DistributedSampler MakeSampler(int64_t n, int replicas, int rank, bool shuffle, bool drop_last,
                               uint64_t seed = 0) {
  DistributedSampler::Options o;
  o.num_samples = n;
  o.num_replicas = replicas;
  o.rank = rank;
  o.shuffle = shuffle;
  o.drop_last = drop_last;
  o.seed = seed;
  absl::StatusOr<DistributedSampler> s = DistributedSampler::Create(o);
  EXPECT_TRUE(s.ok()) << s.status();
  return *s;
}

TEST(SeededPermutationTest, IsAPermutationAndFixedPerSeed) {
  for (int64_t n : {0, 1, 2, 17, 1000}) {
    std::vector<int64_t> p = SeededPermutation(n, 5);
    ASSERT_EQ(p.size(), static_cast<size_t>(n));
    EXPECT_EQ(p, SeededPermutation(n, 5));
    std::vector<int64_t> sorted = p;
    std::sort(sorted.begin(), sorted.end());
    for (int64_t i = 0; i < n; ++i) EXPECT_EQ(sorted[i], i);
  }
  EXPECT_NE(SeededPermutation(1000, 5), SeededPermutation(1000, 6));
  // Golden value: every platform and standard library must produce this order.
  EXPECT_EQ(SeededPermutation(10, 42), (std::vector<int64_t>{1, 7, 9, 0, 3, 8, 4, 2, 5, 6}));
}

TEST(SeededPermutationTest, AllOrdersEquallyLikely) {
  std::map<std::vector<int64_t>, int> counts;
  constexpr int kSeeds = 60000;
  for (int seed = 0; seed < kSeeds; ++seed) ++counts[SeededPermutation(3, seed)];
  ASSERT_EQ(counts.size(), 6u);
  // 10000 expected each, standard deviation ~91.
  for (const auto& [perm, count] : counts) EXPECT_NEAR(count, 10000, 500);
}

TEST(DistributedSamplerTest, RejectsBadOptions) {
  DistributedSampler::Options o;
  o.num_samples = 10;
  o.num_replicas = 4;
  o.rank = 4;
  absl::Status s = DistributedSampler::Create(o).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("rank 4 is outside [0, num_replicas=4)"));
  o.rank = -1;
  EXPECT_FALSE(DistributedSampler::Create(o).ok());
  o.rank = 0;
  o.num_replicas = 0;
  s = DistributedSampler::Create(o).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("num_replicas must be >= 1, got 0"));
  o.num_replicas = 1;
  o.num_samples = -3;
  s = DistributedSampler::Create(o).status();
  EXPECT_THAT(std::string(s.message()), HasSubstr("got -3"));
}

TEST(DistributedSamplerTest, InOrderPadsByWrappingAround) {
  // N = 10, R = 3: the order 0..9 padded to 12 with 0, 1; rank r takes positions r, r+3, ...
  EXPECT_EQ(MakeSampler(10, 3, 0, false, false).Indices(), (std::vector<int64_t>{0, 3, 6, 9}));
  EXPECT_EQ(MakeSampler(10, 3, 1, false, false).Indices(), (std::vector<int64_t>{1, 4, 7, 0}));
  EXPECT_EQ(MakeSampler(10, 3, 2, false, false).Indices(), (std::vector<int64_t>{2, 5, 8, 1}));
  EXPECT_EQ(MakeSampler(10, 3, 2, false, false).num_samples_per_replica(), 4);
  // Fewer examples than replicas: wraps around more than once.
  EXPECT_EQ(MakeSampler(2, 5, 4, false, false).Indices(), (std::vector<int64_t>{0}));
  EXPECT_EQ(MakeSampler(2, 5, 3, false, false).Indices(), (std::vector<int64_t>{1}));
}

TEST(DistributedSamplerTest, InOrderDropLastTruncates) {
  EXPECT_EQ(MakeSampler(10, 3, 0, false, true).Indices(), (std::vector<int64_t>{0, 3, 6}));
  EXPECT_EQ(MakeSampler(10, 3, 1, false, true).Indices(), (std::vector<int64_t>{1, 4, 7}));
  EXPECT_EQ(MakeSampler(10, 3, 2, false, true).Indices(), (std::vector<int64_t>{2, 5, 8}));
  EXPECT_TRUE(MakeSampler(2, 5, 0, false, true).Indices().empty());
}

TEST(DistributedSamplerTest, RanksShareOnePermutationPerEpoch) {
  constexpr int64_t kN = 23;
  constexpr int kR = 4;
  for (int64_t epoch : {0, 1, 7}) {
    std::vector<int64_t> expected = SeededPermutation(kN, 100 + epoch);
    for (int r = 0; r < kR; ++r) {
      DistributedSampler s = MakeSampler(kN, kR, r, true, false, 100);
      s.SetEpoch(epoch);
      std::vector<int64_t> mine = s.Indices();
      ASSERT_EQ(mine.size(), 6u);
      for (size_t i = 0; i < mine.size(); ++i) {
        EXPECT_EQ(mine[i], expected[(r + i * kR) % kN]) << "rank " << r << " i " << i;
      }
    }
  }
  DistributedSampler s = MakeSampler(kN, kR, 0, true, false, 100);
  std::vector<int64_t> epoch0 = s.Indices();
  s.SetEpoch(1);
  EXPECT_NE(s.Indices(), epoch0);
  s.SetEpoch(0);
  EXPECT_EQ(s.Indices(), epoch0);
}

TEST(DistributedSamplerTest, SweepCoversEveryExample) {
  for (int64_t n : {0, 1, 2, 5, 7, 64, 101}) {
    for (int replicas : {1, 2, 3, 8}) {
      for (bool drop_last : {false, true}) {
        std::vector<int64_t> all;
        const int64_t per = drop_last ? n / replicas : (n + replicas - 1) / replicas;
        for (int r = 0; r < replicas; ++r) {
          DistributedSampler s = MakeSampler(n, replicas, r, true, drop_last, 9);
          s.SetEpoch(3);
          std::vector<int64_t> mine = s.Indices();
          EXPECT_EQ(static_cast<int64_t>(mine.size()), per);
          EXPECT_EQ(s.num_samples_per_replica(), per);
          all.insert(all.end(), mine.begin(), mine.end());
        }
        std::set<int64_t> distinct(all.begin(), all.end());
        for (int64_t i : all) EXPECT_TRUE(i >= 0 && i < n);
        if (drop_last) {
          EXPECT_EQ(distinct.size(), all.size()) << "n=" << n << " R=" << replicas;
          EXPECT_EQ(static_cast<int64_t>(all.size()), n / replicas * replicas);
        } else {
          EXPECT_EQ(static_cast<int64_t>(distinct.size()), n) << "n=" << n << " R=" << replicas;
        }
      }
    }
  }
}

TEST(BatchSharderTest, ContiguousBalancedShards) {
  absl::StatusOr<BatchSharder> s = BatchSharder::Create(3, 0);
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(s->ShardOf(10, 0), (ShardRange{0, 4}));
  EXPECT_EQ(s->ShardOf(10, 1), (ShardRange{4, 7}));
  EXPECT_EQ(s->ShardOf(10, 2), (ShardRange{7, 10}));
  EXPECT_EQ(s->ShardOf(2, 2), (ShardRange{2, 2}));
  EXPECT_EQ(s->Shard(9), (ShardRange{0, 3}));

  for (int64_t batch : {0, 1, 2, 7, 8, 100, 101}) {
    for (int trainers : {1, 2, 3, 5, 8}) {
      int64_t next = 0, smallest = batch, largest = 0;
      for (int k = 0; k < trainers; ++k) {
        absl::StatusOr<BatchSharder> sk = BatchSharder::Create(trainers, k);
        ASSERT_TRUE(sk.ok());
        const ShardRange r = sk->Shard(batch);
        EXPECT_EQ(r.begin, next);
        next = r.end;
        smallest = std::min(smallest, r.size());
        largest = std::max(largest, r.size());
      }
      EXPECT_EQ(next, batch);
      EXPECT_LE(largest - smallest, 1);
    }
  }
}

TEST(BatchSharderTest, SliceAndValidation) {
  std::vector<int> batch = {10, 11, 12, 13, 14};
  absl::StatusOr<BatchSharder> s = BatchSharder::Create(2, 1);
  ASSERT_TRUE(s.ok());
  absl::Span<const int> part = s->Slice(absl::Span<const int>(batch));
  EXPECT_EQ(std::vector<int>(part.begin(), part.end()), (std::vector<int>{13, 14}));

  absl::Status bad = BatchSharder::Create(2, 2).status();
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.message()), HasSubstr("trainer_id 2 is outside [0, num_trainers=2)"));
  EXPECT_FALSE(BatchSharder::Create(0, 0).ok());
  EXPECT_FALSE(BatchSharder::Create(3, -1).ok());
}

}  // namespace
}  // namespace data
}  // namespace tessera
