// How a sparse gradient's duplicate rows merge: its distinct ids in order of first appearance
// and, for each row, the index of its id there. split_by_shard merges every distributed table's
// gradient this way on the trainer's step thread, and the trainer's prefetch op has already
// deduplicated the same ids by this plan when it looked the batch up (IdShards in
// trainer/rpc_ops.cc, most often a step ahead, on the look-ahead thread). The prefetch offers
// its plans, and PlanMerge takes an offered plan of equal rows instead of hashing the ids again.
#ifndef TESSERA_COMMON_OPS_MERGE_PLAN_H_
#define TESSERA_COMMON_OPS_MERGE_PLAN_H_

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "absl/types/span.h"

namespace tessera {

struct MergePlan {
  std::vector<int64_t> rows;     // the plan's input: the gradient's ids, one per row
  std::vector<int64_t> ids;      // the distinct ids, in order of first appearance
  std::vector<int32_t> slot_of;  // per row: the index of its id in `ids`
  std::vector<uint8_t> first;    // per row: 1 where its id appears first
};

// The plan of `rows`, built by hashing (an open-addressing table on the id).
void BuildMergePlan(absl::Span<const int64_t> rows, MergePlan* plan);

// Offers `plan` to PlanMerge on any thread. Only plans of at most kMaxOfferedRows rows are
// kept, the last kMaxOffered of them (a step's tables, twice: the look-ahead offers the next
// batch's while the step merges its own).
constexpr size_t kMaxOffered = 128;
constexpr size_t kMaxOfferedRows = size_t{1} << 16;
void OfferMergePlan(std::shared_ptr<const MergePlan> plan);

// The plan of `rows`: this thread's last plan when its rows are equal (the deep and wide tables
// of one slot), else an offered plan of equal rows, else one built by hashing. Valid until this
// thread's next call.
const MergePlan& PlanMerge(const std::vector<int64_t>& rows);

// Offered plans PlanMerge took (for tests and benchmarks).
int64_t MergePlansTaken();

}  // namespace tessera

#endif  // TESSERA_COMMON_OPS_MERGE_PLAN_H_
