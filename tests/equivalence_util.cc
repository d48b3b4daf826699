#include "tests/equivalence_util.h"

#include <sys/wait.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/time.h"
#include "common/ops/ops.h"
#include "common/framework/params_io.h"
#include "gtest/gtest.h"
#include "tests/cluster_util.h"

namespace tessera {

LocalRun TrainLocally(const examples::ExampleOptions& eo, LocalTrainerOptions options) {
  auto registry = NewStandardOpRegistry();
  auto model = examples::BuildExampleModel(*registry, eo);
  EXPECT_TRUE(model.ok()) << model.status();
  auto data = examples::LoadExampleData(eo);
  EXPECT_TRUE(data.ok()) << data.status();
  if (!model.ok() || !data.ok()) return LocalRun{};
  return TrainModelLocally(*model, data->train, options);
}

LocalRun TrainModelLocally(const ModelSpec& model, const data::Dataset& train,
                           LocalTrainerOptions options) {
  LocalRun run;
  auto registry = NewStandardOpRegistry();
  std::ostringstream sink;
  options.log = &sink;
  auto trainer = LocalTrainer::Create(registry.get(), model, options);
  run.create_status = trainer.status();
  if (!trainer.ok()) return run;
  auto stats = (*trainer)->Train(train);
  EXPECT_TRUE(stats.ok()) << stats.status();
  if (stats.ok()) run.epochs = *stats;
  for (const auto& v : model.main.blocks(0).vars()) {
    if (v.trainable()) {
      run.params[v.name()] = (*trainer)->scope()->FindVar(v.name())->Get<Tensor>().Clone();
    }
  }
  return run;
}

Params SingleMachine(const examples::ExampleOptions& eo, int64_t batch, uint64_t seed,
                     int epochs) {
  LocalTrainerOptions lo;
  lo.batch_size = batch;
  lo.epochs = epochs;
  lo.seed = seed;
  lo.log_every_steps = 0;
  LocalRun run = TrainLocally(eo, lo);
  EXPECT_TRUE(run.create_status.ok()) << run.create_status;
  return run.params;
}

void ExpectParamsClose(const Params& got, const Params& want, double rtol,
                       const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (const auto& [name, w] : want) {
    auto it = got.find(name);
    ASSERT_NE(it, got.end()) << what << " " << name;
    const Tensor& g = it->second;
    ASSERT_EQ(g.shape(), w.shape()) << what << " " << name;
    double worst = 0;
    for (int64_t i = 0; i < w.numel(); ++i) {
      double a = g.data<float>()[i], b = w.data<float>()[i];
      worst = std::max(worst, std::fabs(a - b) / std::max(1e-2, std::fabs(b)));
    }
    EXPECT_LT(worst, rtol) << what << " " << name;
  }
}

double MaxAbsDifference(const Params& a, const Params& b) {
  double worst = 0;
  for (const auto& [name, t] : a) {
    auto other = b.find(name);
    if (other == b.end() || other->second.shape() != t.shape()) {
      return std::numeric_limits<double>::infinity();
    }
    const Tensor& u = other->second;
    for (int64_t i = 0; i < t.numel(); ++i) {
      worst = std::max<double>(worst, std::abs(t.data<float>()[i] - u.data<float>()[i]));
    }
  }
  return worst;
}

std::vector<std::string> ExampleFlags(const examples::ExampleOptions& eo, int64_t batch,
                                      int epochs) {
  std::vector<std::string> flags = {absl::StrCat("--num_examples=", eo.num_examples),
                                    absl::StrCat("--num_test_examples=", eo.num_test_examples),
                                    absl::StrCat("--batch_size=", batch),
                                    absl::StrCat("--epochs=", epochs),
                                    absl::StrCat("--seed=", eo.seed)};
  if (eo.name == "ctr") flags.push_back(absl::StrCat("--vocab_per_slot=", eo.vocab_per_slot));
  return flags;
}

std::vector<Params> RunPsJob(const PsJob& job, const std::string& dir) {
  ProcessGroup group;
  auto eps = FreeEndpoints(job.pservers);
  EXPECT_TRUE(eps.ok());
  std::vector<std::string> common = {absl::StrCat("--pservers=", absl::StrJoin(*eps, ",")),
                                     absl::StrCat("--trainers=", job.trainers),
                                     "--example=" + job.example,
                                     "--job_id=test",
                                     "--barrier_timeout_s=60",
                                     "--rpc_deadline_s=60"};
  if (job.trainer_endpoints) {
    auto trainer_eps = FreeEndpoints(job.trainers);
    EXPECT_TRUE(trainer_eps.ok());
    if (trainer_eps.ok()) {
      common.push_back(absl::StrCat("--trainer_endpoints=", absl::StrJoin(*trainer_eps, ",")));
    }
  }
  common.insert(common.end(), job.flags.begin(), job.flags.end());
  std::vector<pid_t> pids;
  for (int p = 0; p < job.pservers; ++p) {
    std::vector<std::string> args = {RunfilePath("pserver/tessera_pserver"),
                                     "--current_endpoint=" + (*eps)[p]};
    args.insert(args.end(), common.begin(), common.end());
    auto pid = group.Start(args, absl::StrCat(dir, "/pserver.", p, ".log"));
    EXPECT_TRUE(pid.ok());
    pids.push_back(*pid);
  }
  for (int k = 0; k < job.trainers; ++k) {
    std::vector<std::string> args = {RunfilePath("trainer/tessera_trainer"),
                                     absl::StrCat("--trainer_id=", k),
                                     absl::StrCat("--dump_params=", dir, "/params.", k)};
    args.insert(args.end(), common.begin(), common.end());
    auto pid = group.Start(args, absl::StrCat(dir, "/trainer.", k, ".log"));
    EXPECT_TRUE(pid.ok());
    pids.push_back(*pid);
  }
  // Trainers first (bounded); a failed trainer makes the pservers pointless to wait for.
  std::vector<size_t> order;
  for (size_t i = job.pservers; i < pids.size(); ++i) order.push_back(i);
  for (int i = 0; i < job.pservers; ++i) order.push_back(i);
  bool trainer_failed = false;
  for (size_t i : order) {
    bool is_pserver = i < static_cast<size_t>(job.pservers);
    if (is_pserver && trainer_failed) break;  // the group kills them
    auto status = group.Wait(pids[i], is_pserver ? absl::Seconds(60) : absl::Seconds(240));
    std::string name = i < static_cast<size_t>(job.pservers)
                           ? absl::StrCat("pserver.", i)
                           : absl::StrCat("trainer.", i - job.pservers);
    EXPECT_TRUE(status.ok()) << name << ": " << status.status();
    if (!status.ok()) {
      trainer_failed |= !is_pserver;
      continue;
    }
    bool ok = WIFEXITED(*status) && WEXITSTATUS(*status) == 0;
    EXPECT_TRUE(ok) << name << " failed:\n"
                    << ReadFileOrEmpty(absl::StrCat(dir, "/", name, ".log"));
    trainer_failed |= !ok && !is_pserver;
  }
  std::vector<std::map<std::string, Tensor>> params;
  for (int k = 0; k < job.trainers; ++k) {
    auto p = LoadVariables(absl::StrCat(dir, "/params.", k));
    EXPECT_TRUE(p.ok()) << p.status();
    params.push_back(p.ok() ? *p : std::map<std::string, Tensor>{});
  }
  return params;
}

void RunCollectiveTrainers(const std::string& dir, int n, const std::vector<std::string>& flags) {
  auto eps = FreeEndpoints(n);
  ASSERT_TRUE(eps.ok()) << eps.status();
  ProcessGroup group;
  std::vector<pid_t> pids;
  for (int k = 0; k < n; ++k) {
    std::vector<std::string> args = {RunfilePath("trainer/tessera_trainer"),
                                     "--mode=collective",
                                     "--job_id=coll",
                                     absl::StrCat("--trainer_endpoints=", absl::StrJoin(*eps, ",")),
                                     absl::StrCat("--trainers=", n),
                                     absl::StrCat("--trainer_id=", k),
                                     "--barrier_timeout_s=60",
                                     absl::StrCat("--dump_params=", dir, "/params.", k)};
    args.insert(args.end(), flags.begin(), flags.end());
    auto pid = group.Start(args, absl::StrCat(dir, "/trainer.", k, ".log"));
    ASSERT_TRUE(pid.ok()) << pid.status();
    pids.push_back(*pid);
  }
  for (int k = 0; k < n; ++k) {
    const std::string log = absl::StrCat(dir, "/trainer.", k, ".log");
    auto status = group.Wait(pids[k], absl::Seconds(120));
    ASSERT_TRUE(status.ok()) << status.status() << "\n" << ReadFileOrEmpty(log);
    ASSERT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << ReadFileOrEmpty(log);
  }
}

void ExpectDumpsClose(const std::string& dir, int n, const Params& want, double rtol) {
  for (int k = 0; k < n; ++k) {
    auto got = LoadVariables(absl::StrCat(dir, "/params.", k));
    ASSERT_TRUE(got.ok()) << got.status();
    ExpectParamsClose(*got, want, rtol, absl::StrCat("trainer ", k));
  }
}

}  // namespace tessera
