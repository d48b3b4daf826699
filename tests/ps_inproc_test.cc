// Parameter-server mode with trainers and pservers as threads of one process (in-process RPC):
// sync training with N trainers, each fed 1/N of every global batch, ends with the same
// parameters as single-machine training on the full batches.
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "common/framework/executor.h"
#include "common/ops/merge_plan.h"
#include "common/ops/ops.h"
#include "gtest/gtest.h"
#include "tests/inproc_cluster.h"

namespace tessera {
namespace {

constexpr int kVocab = 1000;
constexpr int kDim = 16;
constexpr int kIdRange = 50;  // ids repeat within and across trainers
constexpr int kBatch = 12;
constexpr int kSteps = 4;

InprocModelOptions ModelOptions(const std::string& optimizer, bool distributed_table = false) {
  InprocModelOptions o;
  o.vocab = kVocab;
  o.emb_dim = kDim;
  o.optimizer = optimizer;
  o.distributed_table = distributed_table;
  return o;
}

std::map<std::string, Tensor> SingleMachine(const std::string& optimizer) {
  auto registry = NewStandardOpRegistry();
  InprocModel m = BuildInprocModel(*registry, ModelOptions(optimizer));
  Executor exec(registry.get());
  Scope scope;
  EXPECT_TRUE(exec.Run(m.startup, 0, &scope).ok());
  for (int step = 0; step < kSteps; ++step) {
    FeedInprocBatch(&scope, step, 0, kBatch, kIdRange);
    absl::Status s = exec.Run(m.main, 0, &scope);
    EXPECT_TRUE(s.ok()) << s;
  }
  std::map<std::string, Tensor> params;
  for (const auto& v : m.main.blocks(0).vars()) {
    if (v.trainable()) params[v.name()] = scope.FindVar(v.name())->Get<Tensor>().Clone();
  }
  return params;
}

struct Cluster {
  int trainers;
  int pservers;
  SplitMethod split = SplitMethod::kRoundRobin;
  bool slice = true;
  std::string optimizer = "sgd";
  bool distributed_table = false;  // "emb" lives only on the pservers
};

std::map<std::string, Tensor> Distributed(const Cluster& c) {
  InprocJobOptions jo;
  jo.trainers = c.trainers;
  jo.pservers = c.pservers;
  jo.split = c.split;
  jo.slice = c.slice;
  jo.batch = kBatch;
  jo.first_step = 0;
  jo.last_step = kSteps;
  jo.id_range = kIdRange;
  std::vector<std::map<std::string, Tensor>> results(c.trainers);
  const int64_t plans_taken = MergePlansTaken();
  const InprocModelOptions mo = ModelOptions(c.optimizer, c.distributed_table);
  auto job = RunInprocJob(mo, jo, [&](int k, const InprocModel& m, const Scope& scope) {
    for (const auto& v : m.main.blocks(0).vars()) {
      if (!v.trainable()) continue;
      if (v.is_distributed()) {
        EXPECT_EQ(scope.FindVar(v.name()), nullptr) << "a distributed table on a trainer";
        continue;
      }
      results[k][v.name()] = scope.FindVar(v.name())->Get<Tensor>().Clone();
    }
  });
  // Each trainer step merges its table gradient by its prefetch's dedup (a plan offered by the
  // prefetch op), not by hashing the ids again.
  EXPECT_EQ(MergePlansTaken() - plans_taken, c.distributed_table ? c.trainers * kSteps : 0);
  if (c.distributed_table) {  // gather the table's rows by id from the owning pservers
    Tensor table(FLOAT32, {kVocab, kDim});
    for (const auto& [id, row] : GatherTableRows(*job, "emb", kVocab, kDim, 0)) {
      std::memcpy(table.data<float>() + id * kDim, row.data(), kDim * sizeof(float));
    }
    results[0]["emb"] = table;
  }
  // Every trainer ends with identical parameters.
  for (int k = 1; k < c.trainers; ++k) {
    for (const auto& [name, t] : results[0]) {
      if (name == "emb" && c.distributed_table) continue;  // gathered from the pservers
      EXPECT_EQ(0, std::memcmp(t.raw_data(), results[k][name].raw_data(), t.nbytes())) << name;
    }
  }
  return results[0];
}

void ExpectClose(const std::map<std::string, Tensor>& a, const std::map<std::string, Tensor>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [name, t] : a) {
    const Tensor& u = b.at(name);
    ASSERT_EQ(t.shape(), u.shape()) << name;
    // Relative error, with values below 1e-2 compared to 1e-7 absolute (float32 rounding).
    EXPECT_LT(WorstRelativeError(t, u, 1e-2), 1e-5) << name;
  }
}

class PsInprocTest : public ::testing::TestWithParam<Cluster> {};

TEST_P(PsInprocTest, SyncEqualsSingleMachine) {
  const Cluster& c = GetParam();
  ExpectClose(Distributed(c), SingleMachine(c.optimizer));
}

INSTANTIATE_TEST_SUITE_P(
    Clusters, PsInprocTest,
    ::testing::Values(Cluster{2, 2, SplitMethod::kRoundRobin, true, "sgd"},
                      Cluster{2, 2, SplitMethod::kHashName, true, "sgd"},
                      Cluster{2, 2, SplitMethod::kRoundRobin, false, "sgd"},
                      Cluster{2, 2, SplitMethod::kRoundRobin, true, "adam"},
                      Cluster{2, 2, SplitMethod::kHashName, false, "adam"},
                      Cluster{3, 3, SplitMethod::kRoundRobin, true, "sgd"},
                      Cluster{3, 3, SplitMethod::kHashName, true, "adam"},
                      Cluster{2, 2, SplitMethod::kRoundRobin, true, "sgd", true},
                      Cluster{2, 2, SplitMethod::kHashName, true, "adam", true},
                      Cluster{3, 3, SplitMethod::kRoundRobin, false, "adagrad", true}));

}  // namespace
}  // namespace tessera
