// Trainer-side cost of split_by_shard (merge of duplicate gradient rows, then split by pserver)
// on one step's gradient of the sparse_rpc workload: 4096 Zipf(1.1) ids over 10^7, dim 16.
// Also times MergeRows (the sort-based merge split_by_shard used before) on the same rows.
//
//   bazel build //tests/bench:split_merge && bazel-bin/tests/bench/split_merge
#include <chrono>
#include <cstdio>
#include <cstring>
#include <vector>

#include "common/data/synthetic.h"
#include "common/framework/executor.h"
#include "common/ops/ops.h"
#include "common/ops/selected_rows_util.h"

namespace tessera {
namespace {

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
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
      if (!exec.RunOp(split, &scope).ok()) return 1;
      t += Now() - t0;
      rows_out += scope.FindVar("g.shard0")->Get<SelectedRows>().rows.size();
    }
    std::printf(
        "split_by_shard, %d output(s): %.1f us per %d-row gradient "
        "(%.0f rows to shard 0)\n",
        shards, 1e6 * t / kReps, kIds, static_cast<double>(rows_out) / kReps);
  }
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
