// Collective mode with ranks as real processes: tests/collective_worker joins a job by TCP
// rendezvous (rank 0 serves the store on a free port), through a fresh directory (FILE_SYSTEM)
// or under mpirun (MPI, skipped when mpirun is not installed), for 1-4 ranks, and runs every
// operation. Also: a missing rank and a killed rank end in bounded time with an error naming
// the problem. Every process is killed by pid at the end (ProcessGroup).
// And the trainer daemon in collective mode: trainers with 2 CPU places each equal
// single-machine training; fp16 and top-k (with error feedback) compression of the gradient
// all-reduce converge close to the uncompressed run while sending fewer bytes; a model file with
// gradient clipping equals single-machine training of the same file.
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/layers/model_file.h"
#include "common/ops/ops.h"
#include "common/framework/params_io.h"
#include "examples/registry.h"
#include "gtest/gtest.h"
#include "tests/cluster_util.h"
#include "tests/equivalence_util.h"
#include "trainer/local_trainer.h"

namespace tessera {
namespace {

constexpr absl::Duration kJobTimeout = absl::Seconds(60);

std::string Worker() { return RunfilePath("tests/collective_worker"); }

bool ExitedWith(int status, int code) { return WIFEXITED(status) && WEXITSTATUS(status) == code; }

// Starts `world` workers with per-rank flags and expects every one to exit 0.
void RunJob(const std::string& dir, int world, const std::vector<std::string>& flags) {
  ProcessGroup group;
  std::vector<pid_t> pids;
  for (int r = 0; r < world; ++r) {
    std::vector<std::string> argv = {Worker(), absl::StrCat("--rank=", r),
                                     absl::StrCat("--world_size=", world)};
    argv.insert(argv.end(), flags.begin(), flags.end());
    auto pid = group.Start(argv, absl::StrCat(dir, "/rank", r, ".log"));
    ASSERT_TRUE(pid.ok()) << pid.status();
    pids.push_back(*pid);
  }
  for (int r = 0; r < world; ++r) {
    const std::string log = absl::StrCat(dir, "/rank", r, ".log");
    auto status = group.Wait(pids[r], kJobTimeout);
    ASSERT_TRUE(status.ok()) << "rank " << r << ": " << status.status() << "\n"
                             << ReadFileOrEmpty(log);
    EXPECT_TRUE(ExitedWith(*status, 0)) << "rank " << r << " failed:\n" << ReadFileOrEmpty(log);
    EXPECT_NE(ReadFileOrEmpty(log).find(absl::StrCat("rank ", r, " of ", world, ": OK")),
              std::string::npos)
        << ReadFileOrEmpty(log);
  }
}

class CollectiveClusterTest : public ::testing::TestWithParam<int> {};

TEST_P(CollectiveClusterTest, TcpRendezvous) {
  const int world = GetParam();
  auto eps = FreeEndpoints(1);
  ASSERT_TRUE(eps.ok()) << eps.status();
  RunJob(MakeTempDir(absl::StrCat("collective_tcp", world)), world,
         {"--init=tcp", "--endpoint=" + (*eps)[0]});
}

TEST_P(CollectiveClusterTest, FileSystemRendezvous) {
  const int world = GetParam();
  const std::string dir = MakeTempDir(absl::StrCat("collective_file", world));
  RunJob(dir, world, {"--init=file_system", "--path=" + dir + "/rendezvous"});
}

INSTANTIATE_TEST_SUITE_P(Ranks, CollectiveClusterTest, ::testing::Values(1, 2, 3, 4),
                         [](const auto& info) { return absl::StrCat("world", info.param); });

std::string FindOnPath(const std::string& name) {
  const char* path = std::getenv("PATH");
  std::vector<std::string> dirs = absl::StrSplit(path != nullptr ? path : "", ':');
  dirs.push_back("/usr/bin");
  for (const std::string& d : dirs) {
    const std::string candidate = d + "/" + name;
    if (::access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return "";
}

TEST(CollectiveMpiTest, MpirunTwoRanks) {
  const std::string mpirun = FindOnPath("mpirun");
  if (mpirun.empty()) GTEST_SKIP() << "mpirun is not installed (deploy/setup installs openmpi-bin)";
  const std::string dir = MakeTempDir("collective_mpi");
  ProcessGroup group;
  auto pid = group.Start({mpirun, "--allow-run-as-root", "--oversubscribe", "-np", "2", "--mca",
                          "btl", "self,tcp", Worker(), "--init=mpi", "--timeout_s=30"},
                         dir + "/mpirun.log");
  ASSERT_TRUE(pid.ok()) << pid.status();
  auto status = group.Wait(*pid, kJobTimeout);
  if (!status.ok()) group.Kill(*pid, SIGTERM);  // mpirun takes its ranks down with it
  ASSERT_TRUE(status.ok()) << status.status() << "\n" << ReadFileOrEmpty(dir + "/mpirun.log");
  const std::string log = ReadFileOrEmpty(dir + "/mpirun.log");
  EXPECT_TRUE(ExitedWith(*status, 0)) << log;
  EXPECT_NE(log.find("rank 0 of 2: OK"), std::string::npos) << log;
  EXPECT_NE(log.find("rank 1 of 2: OK"), std::string::npos) << log;
  EXPECT_NE(log.find("(mpi)"), std::string::npos) << log;
}

TEST(CollectiveFailureTest, MissingRankTimesOutNamingTheEndpoint) {
  auto eps = FreeEndpoints(1);
  ASSERT_TRUE(eps.ok());
  const std::string dir = MakeTempDir("collective_missing");
  ProcessGroup group;
  // Rank 1 of 2 without rank 0: nobody serves the store.
  auto pid = group.Start({Worker(), "--rank=1", "--world_size=2", "--init=tcp",
                          "--endpoint=" + (*eps)[0], "--timeout_s=2"},
                         dir + "/rank1.log");
  ASSERT_TRUE(pid.ok());
  auto status = group.Wait(*pid, absl::Seconds(30));
  ASSERT_TRUE(status.ok()) << status.status();
  const std::string log = ReadFileOrEmpty(dir + "/rank1.log");
  EXPECT_TRUE(ExitedWith(*status, 1)) << log;
  EXPECT_NE(log.find((*eps)[0]), std::string::npos) << log;
}

TEST(CollectiveFailureTest, KilledPeerFailsTheSurvivorInBoundedTime) {
  auto eps = FreeEndpoints(1);
  ASSERT_TRUE(eps.ok());
  const std::string dir = MakeTempDir("collective_killed");
  ProcessGroup group;
  std::vector<pid_t> pids;
  for (int r = 0; r < 2; ++r) {
    auto pid = group.Start({Worker(), absl::StrCat("--rank=", r), "--world_size=2", "--init=tcp",
                            "--endpoint=" + (*eps)[0], "--timeout_s=5", "--mode=loop"},
                           absl::StrCat(dir, "/rank", r, ".log"));
    ASSERT_TRUE(pid.ok());
    pids.push_back(*pid);
  }
  // Wait (bounded) until both ranks are exchanging data, then kill rank 1.
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (ReadFileOrEmpty(dir + "/rank0.log").find("looping") == std::string::npos ||
         ReadFileOrEmpty(dir + "/rank1.log").find("looping") == std::string::npos) {
    ASSERT_LT(absl::Now(), deadline)
        << ReadFileOrEmpty(dir + "/rank0.log") << ReadFileOrEmpty(dir + "/rank1.log");
    ASSERT_TRUE(group.Running(pids[0]) && group.Running(pids[1]));
    absl::SleepFor(absl::Milliseconds(20));
  }
  group.Kill(pids[1], SIGKILL);
  auto status = group.Wait(pids[0], absl::Seconds(30));
  ASSERT_TRUE(status.ok()) << "the survivor hangs: " << status.status();
  const std::string log = ReadFileOrEmpty(dir + "/rank0.log");
  EXPECT_TRUE(ExitedWith(*status, 3)) << log;
  EXPECT_NE(log.find("all_reduce failed"), std::string::npos) << log;
}

// ---------------------------------------------------------------------------------------------
// tessera_trainer --mode=collective.

// Starts `n` trainers of one collective job with `flags` and expects each to exit 0 within 120 s.
void RunTrainers(const std::string& dir, int n, const std::vector<std::string>& flags) {
  std::vector<std::string> all = {"--example=mlp_regression", "--log_every_steps=0"};
  all.insert(all.end(), flags.begin(), flags.end());
  RunCollectiveTrainers(dir, n, all);
}

// The number after `key` in trainer 0's log (-1 if absent).
double FromLog(const std::string& dir, const std::string& key) {
  const std::string log = ReadFileOrEmpty(dir + "/trainer.0.log");
  const size_t pos = log.find(key);
  EXPECT_NE(pos, std::string::npos) << key << " not in:\n" << log;
  return pos == std::string::npos ? -1 : std::strtod(log.c_str() + pos + key.size(), nullptr);
}

// The mlp_regression data of these tests: 960 examples (64 held out), seed 4.
examples::ExampleOptions MlpData() {
  examples::ExampleOptions eo;
  eo.name = "mlp_regression";
  eo.num_examples = 960;
  eo.num_test_examples = 64;
  eo.seed = 4;
  return eo;
}

TEST(CollectiveTrainerTest, TwoCpuPlacesPerTrainerEqualSingleMachine) {
  const std::string dir = MakeTempDir("collective_places");
  // Global batches of 50 (and a last one of 10): places of 13 and 12 (3 and 2) examples.
  RunTrainers(dir, 2,
              {"--num_examples=960", "--num_test_examples=64", "--batch_size=50", "--epochs=2",
               "--seed=4", "--cpu_places=2"});
  if (HasFatalFailure()) return;
  const Params want = SingleMachine(MlpData(), 50, 4, 2);
  EXPECT_EQ(want.size(), 4u);
  ExpectDumpsClose(dir, 2, want, 1e-5);
}

// A model file given with --model, with clipping by global norm at a bound every step exceeds:
// collective trainers clip the all-reduced gradients, which are one machine's, so they end where
// one machine does with the same file (and not where training without clipping ends).
TEST(CollectiveTrainerTest, ModelFileWithGradientClippingEqualsSingleMachine) {
  const std::string dir = MakeTempDir("collective_clip");
  absl::StatusOr<ModelFile> file = examples::ExampleModelFile("mlp_regression");
  ASSERT_TRUE(file.ok()) << file.status();
  file->mutable_optimizer()->set_clip_global_norm(0.05f);
  const std::string path = dir + "/clipped.pbtxt";
  ASSERT_TRUE(WriteModelFile(*file, path).ok());
  RunTrainers(dir, 2,
              {"--model=" + path, "--num_examples=960", "--num_test_examples=64",
               "--batch_size=64", "--epochs=2", "--seed=4"});
  if (HasFatalFailure()) return;
  const examples::ExampleOptions eo = MlpData();
  auto registry = NewStandardOpRegistry();
  absl::StatusOr<ModelSpec> model = CompileModel(*file, *registry, path);
  ASSERT_TRUE(model.ok()) << model.status();
  absl::StatusOr<examples::ExampleData> data = examples::LoadExampleData(eo);
  ASSERT_TRUE(data.ok()) << data.status();
  LocalTrainerOptions lo;
  lo.batch_size = 64;
  lo.epochs = 2;
  lo.seed = 4;
  lo.log_every_steps = 0;
  const LocalRun clipped = TrainModelLocally(*model, data->train, lo);
  ASSERT_TRUE(clipped.create_status.ok()) << clipped.create_status;
  ExpectDumpsClose(dir, 2, clipped.params, 1e-5);
  const Params unclipped = SingleMachine(eo, 64, 4, 2);
  const double differ = MaxAbsDifference(clipped.params, unclipped);
  EXPECT_GT(differ, 1e-3) << "clipping changed nothing: the bound is never reached";
}

// fp16 halves the gradient bytes; top-k at 10% (with error feedback) sends a fifth of them
// (8-byte index/value pairs). Both reach a held-out loss within 1.2x of the uncompressed run.
TEST(CollectiveTrainerTest, CompressedAllReduceConvergesWithFewerBytes) {
  const std::vector<std::string> common = {"--num_examples=2048", "--num_test_examples=512",
                                           "--batch_size=64", "--epochs=40", "--seed=7"};
  struct Result {
    double loss, bytes, first_epoch_loss;
  };
  auto run = [&](const std::string& name, std::vector<std::string> extra) -> Result {
    const std::string dir = MakeTempDir("collective_" + name);
    extra.insert(extra.end(), common.begin(), common.end());
    RunTrainers(dir, 2, extra);
    return {FromLog(dir, "held-out loss "), FromLog(dir, "gradient all-reduce bytes="),
            FromLog(dir, "epoch 0 mean loss ")};
  };
  const Result none = run("none", {});
  const Result fp16 = run("fp16", {"--allreduce_compression=fp16"});
  const Result topk = run("topk", {"--allreduce_compression=topk", "--allreduce_topk=0.1"});
  ASSERT_GT(none.bytes, 0);
  ASSERT_GT(none.loss, 0);
  EXPECT_LT(none.loss, 0.01 * none.first_epoch_loss);  // it trained
  EXPECT_LE(fp16.loss, 1.2 * none.loss) << "fp16 " << fp16.loss << " vs " << none.loss;
  EXPECT_LE(topk.loss, 1.2 * none.loss) << "top-k " << topk.loss << " vs " << none.loss;
  EXPECT_NEAR(fp16.bytes / none.bytes, 0.5, 0.01);
  EXPECT_LT(topk.bytes / none.bytes, 0.3);
}

}  // namespace
}  // namespace tessera
