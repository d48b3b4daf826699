// Trainer-side cost of split_by_shard (merge of duplicate gradient rows, then split by pserver)
// on one step's gradient of the sparse_rpc workload: 4096 Zipf(1.1) ids over 10^7, dim 16.
// Also times MergeRows (the sort-based merge split_by_shard used before) on the same rows, and
// the 52 split_by_shard ops of one trainer step of the CTR job at 2x2 (26 slots, each a deep
// table of dim 8 and a wide table of dim 1 fed by the same ids; 128 Zipf(1.1) ids over 10^4 per
// slot; 1 and 2 pservers).
//
//   bazel build //tests/bench:split_merge && bazel-bin/tests/bench/split_merge
#include <chrono>
#include <cstdio>
#include <cstring>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/data/synthetic.h"
#include "common/framework/executor.h"
#include "common/framework/op_desc.h"
#include "common/ops/ops.h"
#include "common/ops/selected_rows_util.h"

namespace tessera {
namespace {

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// The CTR job's step (see the top): per pserver count, microseconds per step of 52 splits.
int CtrStep(Executor& exec) {
  constexpr int kSlots = 26, kIds = 128, kSteps = 64, kReps = 400;
  auto zipf = data::ZipfSampler::Create(10000, 1.1, 11);
  // Per step and slot: the deep table's and the wide table's gradient (the same ids).
  std::vector<std::vector<SelectedRows>> steps(kSteps);
  for (auto& step : steps) {
    for (int s = 0; s < kSlots; ++s) {
      SelectedRows deep;
      deep.rows.resize(kIds);
      for (auto& id : deep.rows) id = static_cast<int64_t>(zipf->Next()) * 1000003 + s;
      for (int64_t dim : {8, 1}) {
        SelectedRows g;
        g.rows = deep.rows;
        g.value.Resize(FLOAT32, {kIds, dim});
        float* v = g.value.data<float>();
        for (int64_t i = 0; i < kIds * dim; ++i) v[i] = static_cast<float>(i % 89) * 0.01f;
        step.push_back(std::move(g));
      }
    }
  }
  for (int shards : {1, 2}) {
    Scope scope;
    std::vector<OpDesc> ops;
    for (int t = 0; t < 2 * kSlots; ++t) {
      std::vector<std::string> outs;
      for (int k = 0; k < shards; ++k) outs.push_back(absl::StrCat("g", t, ".shard", k));
      ops.push_back(MakeOp("split_by_shard", {{"X", {absl::StrCat("g", t)}}}, {{"Out", outs}}));
      scope.Var(absl::StrCat("g", t));
    }
    double t = 0;
    for (int r = 0; r < kReps; ++r) {
      const auto& step = steps[r % kSteps];
      for (int g = 0; g < 2 * kSlots; ++g) {
        *scope.FindVar(absl::StrCat("g", g))->GetMutable<SelectedRows>() = step[g];
      }
      const double t0 = Now();
      for (const OpDesc& op : ops) {
        absl::Status s = exec.RunOp(op, &scope);
        if (!s.ok()) {
          std::fprintf(stderr, "split_merge: split_by_shard of %s failed: %s\n",
                       OpInput(op, "X").c_str(), s.ToString().c_str());
          return 1;
        }
      }
      t += Now() - t0;
    }
    std::printf("CTR step, 52 split_by_shard, %d output(s) each: %.1f us per step\n", shards,
                1e6 * t / kReps);
  }
  return 0;
}

int Run() {
  constexpr int kDim = 16, kIds = 4096, kBatches = 64, kReps = 2000;
  auto zipf = data::ZipfSampler::Create(10000000, 1.1, 7);
  std::vector<SelectedRows> batches(kBatches);
  for (auto& b : batches) {
    b.height = 10000000;
    b.rows.resize(kIds);
    for (auto& id : b.rows) id = zipf->Next();
    b.value.Resize(FLOAT32, {kIds, kDim});
    float* v = b.value.data<float>();
    for (int i = 0; i < kIds * kDim; ++i) v[i] = static_cast<float>(i % 97) * 0.01f;
  }
  auto registry = NewStandardOpRegistry();
  Executor exec(registry.get());
  for (int shards : {1, 2}) {
    Scope scope;
    std::vector<std::string> outs;
    for (int k = 0; k < shards; ++k) outs.push_back("g.shard" + std::to_string(k));
    OpDesc split = MakeOp("split_by_shard", {{"X", {"g"}}}, {{"Out", outs}});
    SelectedRows* g = scope.Var("g")->GetMutable<SelectedRows>();
    double t = 0;
    size_t rows_out = 0;
    for (int r = 0; r < kReps; ++r) {
      *g = batches[r % kBatches];  // shares the value buffer; the op only reads it
      const double t0 = Now();
      absl::Status s = exec.RunOp(split, &scope);
      if (!s.ok()) {
        std::fprintf(stderr, "split_merge: split_by_shard failed: %s\n", s.ToString().c_str());
        return 1;
      }
      t += Now() - t0;
      rows_out += scope.FindVar("g.shard0")->Get<SelectedRows>().rows.size();
    }
    std::printf(
        "split_by_shard, %d output(s): %.1f us per %d-row gradient "
        "(%.0f rows to shard 0)\n",
        shards, 1e6 * t / kReps, kIds, static_cast<double>(rows_out) / kReps);
  }
  if (CtrStep(exec) != 0) return 1;
  double t = 0;
  size_t merged = 0;
  for (int r = 0; r < kReps; ++r) {
    const double t0 = Now();
    SelectedRows m = MergeRows(batches[r % kBatches]);
    t += Now() - t0;
    merged += m.rows.size();
  }
  std::printf("MergeRows (sort): %.1f us per %d-row gradient (%.0f distinct)\n", 1e6 * t / kReps,
              kIds, static_cast<double>(merged) / kReps);
  return 0;
}

}  // namespace
}  // namespace tessera

int main() { return tessera::Run(); }
