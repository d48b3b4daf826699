#include "common/ops/merge_plan.h"

#include <cstdint>
#include <memory>
#include <random>
#include <thread>
#include <utility>
#include <vector>

#include "gtest/gtest.h"

namespace tessera {
namespace {

void ExpectSamePlan(const MergePlan& got, const MergePlan& want) {
  EXPECT_EQ(got.rows, want.rows);
  EXPECT_EQ(got.ids, want.ids);
  EXPECT_EQ(got.slot_of, want.slot_of);
  EXPECT_EQ(got.first, want.first);
}

// A plan of `rows` as the trainer's prefetch offers it.
std::shared_ptr<const MergePlan> Planned(const std::vector<int64_t>& rows) {
  auto plan = std::make_shared<MergePlan>();
  BuildMergePlan(rows, plan.get());
  return plan;
}

std::vector<int64_t> RandomIds(size_t n, int64_t range, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int64_t> u(0, range - 1);
  std::vector<int64_t> ids(n);
  for (int64_t& id : ids) id = u(rng) * 1000003;  // large, spread ids
  return ids;
}

TEST(MergePlanTest, BuildsDistinctIdsInOrderOfFirstAppearance) {
  MergePlan plan;
  BuildMergePlan(std::vector<int64_t>{5, 3, 5, 7, 3}, &plan);
  EXPECT_EQ(plan.ids, (std::vector<int64_t>{5, 3, 7}));
  EXPECT_EQ(plan.slot_of, (std::vector<int32_t>{0, 1, 0, 2, 1}));
  EXPECT_EQ(plan.first, (std::vector<uint8_t>{1, 1, 0, 1, 0}));
}

TEST(MergePlanTest, PlanMergeTakesAPlanOfferedOnAnotherThread) {
  const std::vector<int64_t> rows = RandomIds(256, 100, 11);
  std::thread offer([&rows] { OfferMergePlan(Planned(rows)); });
  offer.join();
  const int64_t before = MergePlansTaken();
  MergePlan hashed;
  BuildMergePlan(rows, &hashed);
  ExpectSamePlan(PlanMerge(rows), hashed);
  EXPECT_EQ(MergePlansTaken(), before + 1);
  // The same rows again: this thread's own last plan.
  ExpectSamePlan(PlanMerge(rows), hashed);
  EXPECT_EQ(MergePlansTaken(), before + 1);
  // Other rows, of the same length and first id: built here, nothing taken.
  std::vector<int64_t> other = rows;
  other.back() += 1;
  MergePlan other_hashed;
  BuildMergePlan(other, &other_hashed);
  ExpectSamePlan(PlanMerge(other), other_hashed);
  EXPECT_EQ(MergePlansTaken(), before + 1);
}

TEST(MergePlanTest, OffersAreBounded) {
  const int64_t before = MergePlansTaken();
  // Too many rows: not kept.
  const std::vector<int64_t> big = RandomIds(kMaxOfferedRows + 1, 1000, 3);
  OfferMergePlan(Planned(big));
  PlanMerge(big);
  EXPECT_EQ(MergePlansTaken(), before);
  // The oldest of kMaxOffered + 1 plans is gone, the newest kept.
  std::vector<std::vector<int64_t>> offered;
  for (size_t i = 0; i <= kMaxOffered; ++i) {
    offered.push_back(RandomIds(16, 1000, 100 + i));
    OfferMergePlan(Planned(offered.back()));
  }
  PlanMerge(offered.front());
  EXPECT_EQ(MergePlansTaken(), before);
  PlanMerge(offered.back());
  EXPECT_EQ(MergePlansTaken(), before + 1);
}

}  // namespace
}  // namespace tessera
