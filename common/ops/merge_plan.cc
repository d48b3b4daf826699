#include "common/ops/merge_plan.h"

#include <atomic>
#include <cstring>
#include <deque>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/ops/sharding.h"

namespace tessera {
namespace {

bool SameRows(const MergePlan& plan, absl::Span<const int64_t> rows) {
  return !rows.empty() && plan.rows.size() == rows.size() && plan.rows.front() == rows.front() &&
         std::memcmp(plan.rows.data(), rows.data(), rows.size() * sizeof(int64_t)) == 0;
}

class OfferedPlans {
 public:
  void Offer(std::shared_ptr<const MergePlan> plan) {
    absl::MutexLock lock(&mu_);
    if (plans_.size() == kMaxOffered) plans_.pop_front();
    plans_.push_back(std::move(plan));
    any_.store(true, std::memory_order_relaxed);
  }

  // The newest offered plan of `rows`, or null.
  std::shared_ptr<const MergePlan> Find(absl::Span<const int64_t> rows) {
    if (!any_.load(std::memory_order_relaxed)) return nullptr;
    absl::MutexLock lock(&mu_);
    for (auto it = plans_.rbegin(); it != plans_.rend(); ++it) {
      if (SameRows(**it, rows)) {
        taken_.fetch_add(1, std::memory_order_relaxed);
        return *it;
      }
    }
    return nullptr;
  }

  int64_t taken() const { return taken_.load(std::memory_order_relaxed); }

 private:
  absl::Mutex mu_;
  std::deque<std::shared_ptr<const MergePlan>> plans_ ABSL_GUARDED_BY(mu_);
  std::atomic<bool> any_{false};  // nothing to look for in a process that never offers
  std::atomic<int64_t> taken_{0};
};

OfferedPlans& Offered() {
  static OfferedPlans* offered = new OfferedPlans;  // never destroyed: used at exit by threads
  return *offered;
}

}  // namespace

void BuildMergePlan(absl::Span<const int64_t> rows, MergePlan* plan) {
  const size_t n = rows.size();
  const IdHashSlots slots(n);
  thread_local std::vector<int32_t> table;  // index into plan->ids, -1 = empty
  table.assign(slots.capacity, -1);
  plan->rows.assign(rows.begin(), rows.end());
  plan->slot_of.resize(n);
  plan->first.resize(n);
  plan->ids.clear();
  plan->ids.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    const int64_t id = rows[i];
    size_t h = slots.Home(id);
    for (;;) {
      const int32_t u = table[h];
      if (u < 0) {
        table[h] = static_cast<int32_t>(plan->ids.size());
        plan->slot_of[i] = static_cast<int32_t>(plan->ids.size());
        plan->first[i] = 1;
        plan->ids.push_back(id);
        break;
      }
      if (plan->ids[u] == id) {
        plan->slot_of[i] = u;
        plan->first[i] = 0;
        break;
      }
      h = (h + 1) & slots.mask();
    }
  }
}

void OfferMergePlan(std::shared_ptr<const MergePlan> plan) {
  if (plan == nullptr || plan->rows.empty() || plan->rows.size() > kMaxOfferedRows) return;
  Offered().Offer(std::move(plan));
}

const MergePlan& PlanMerge(const std::vector<int64_t>& rows) {
  thread_local MergePlan plan;
  if (SameRows(plan, rows)) return plan;
  if (std::shared_ptr<const MergePlan> offered = Offered().Find(rows)) {
    plan = *offered;
    return plan;
  }
  BuildMergePlan(rows, &plan);
  return plan;
}

int64_t MergePlansTaken() { return Offered().taken(); }

}  // namespace tessera
