// The Fashion-MNIST examples (fashion_mnist_mlp, lenet) on the real data, in every mode:
// parameter-server sync (2 pservers x 2 trainers) and collective mode (2 trainers, Gloo) reach
// the parameters of single-machine training; PS async and the compressed all-reduces (fp16,
// top-k with error feedback) reach a held-out accuracy near the uncompressed run's; and the MPI
// recipe (deploy/mpi/tessera_mpirun.sh, as the DDP tutorial's mpiexec -n 2 --bind-to socket)
// trains the same collective job. The data is Debian's dataset-fashion-mnist (deploy/setup).
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <csignal>
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/framework/params_io.h"
#include "examples/fashion_mnist/model.h"
#include "gtest/gtest.h"
#include "tests/cluster_util.h"
#include "tests/equivalence_util.h"

namespace tessera {
namespace {

bool HaveFashionMnist() {
  struct stat st;
  return stat(absl::StrCat(examples::kFashionMnistTrain, "-images-idx3-ubyte.gz").c_str(), &st) ==
         0;
}

#define REQUIRE_DATA()                                                                        \
  if (!HaveFashionMnist()) {                                                                  \
    GTEST_FAIL() << "Fashion-MNIST is not installed under /usr/share/datasets/fashion-mnist " \
                    "(deploy/setup installs dataset-fashion-mnist)";                          \
  }

struct ImageJob {
  std::string example;
  int64_t examples;
  int64_t batch;
  int epochs;
};

std::string PrintJob(const ::testing::TestParamInfo<ImageJob>& info) { return info.param.example; }

examples::ExampleOptions Options(const ImageJob& job) {
  examples::ExampleOptions eo;
  eo.name = job.example;
  eo.num_examples = job.examples;
  eo.num_test_examples = 64;
  eo.seed = 3;
  return eo;
}

// The MLP on 1024 images (16 steps of 64, 2 epochs); LeNet on 192 images (6 steps of 32): its
// 4-D filters are sliced across the pservers (--min_block_size=400).
const ImageJob kJobs[] = {{"fashion_mnist_mlp", 1024, 64, 2}, {"lenet", 192, 32, 1}};

class ImageEquivalenceTest : public ::testing::TestWithParam<ImageJob> {};

TEST_P(ImageEquivalenceTest, PsSyncTwoByTwoEqualsSingleMachine) {
  REQUIRE_DATA();
  const ImageJob& j = GetParam();
  const examples::ExampleOptions eo = Options(j);
  PsJob job;
  job.example = j.example;
  job.flags = ExampleFlags(eo, j.batch, j.epochs);
  job.flags.push_back("--min_block_size=400");
  const std::string dir = MakeTempDir("image_sync_" + j.example);
  std::vector<Params> params = RunPsJob(job, dir);
  ASSERT_EQ(params.size(), 2u);
  const Params want = SingleMachine(eo, j.batch, eo.seed, j.epochs);
  for (const Params& p : params) ExpectParamsClose(p, want, 1e-5, "sync 2x2");
  EXPECT_NE(ReadFileOrEmpty(dir + "/trainer.0.log").find(" accuracy "), std::string::npos)
      << ReadFileOrEmpty(dir + "/trainer.0.log");
}

TEST_P(ImageEquivalenceTest, CollectiveTwoTrainersEqualSingleMachine) {
  REQUIRE_DATA();
  const ImageJob& j = GetParam();
  const examples::ExampleOptions eo = Options(j);
  std::vector<std::string> flags = ExampleFlags(eo, j.batch, j.epochs);
  flags.push_back("--example=" + j.example);
  const std::string dir = MakeTempDir("image_collective_" + j.example);
  RunCollectiveTrainers(dir, 2, flags);
  if (HasFatalFailure()) return;
  ExpectDumpsClose(dir, 2, SingleMachine(eo, j.batch, eo.seed, j.epochs), 1e-5);
}

INSTANTIATE_TEST_SUITE_P(Examples, ImageEquivalenceTest, ::testing::ValuesIn(kJobs), PrintJob);

// The number after `key` in trainer 0's log of `dir` (-1 if absent).
double FromLog(const std::string& dir, const std::string& key) {
  const std::string log = ReadFileOrEmpty(dir + "/trainer.0.log");
  const size_t pos = log.find(key);
  EXPECT_NE(pos, std::string::npos) << key << " not in:\n" << log;
  return pos == std::string::npos ? -1 : std::strtod(log.c_str() + pos + key.size(), nullptr);
}

// The MLP on 4096 images for 5 epochs, held-out accuracy on 1000 test images: the compressed
// all-reduces (SINGA's variants, deterministic) come within 0.05 of uncompressed collective
// training, which itself is far above chance (0.1); PS async, whose trainer 0 evaluates while
// the other may still push, within 0.1 (seen: 0.74-0.79 against 0.81).
TEST(ImageModesTest, AsyncAndCompressedAllReduceReachTheAccuracyOfSync) {
  REQUIRE_DATA();
  const std::vector<std::string> data = {"--example=fashion_mnist_mlp",
                                         "--num_examples=4096",
                                         "--num_test_examples=1000",
                                         "--batch_size=64",
                                         "--epochs=5",
                                         "--seed=5",
                                         "--log_every_steps=0"};
  auto collective = [&](const std::string& name, std::vector<std::string> extra) {
    const std::string dir = MakeTempDir("image_" + name);
    extra.insert(extra.end(), data.begin(), data.end());
    RunCollectiveTrainers(dir, 2, extra);
    return FromLog(dir, " accuracy ");
  };
  const double none = collective("none", {});
  const double fp16 = collective("fp16", {"--allreduce_compression=fp16"});
  const double topk = collective("topk", {"--allreduce_compression=topk", "--allreduce_topk=0.1"});
  PsJob async;
  async.example = "fashion_mnist_mlp";
  async.flags = data;
  async.flags.push_back("--sync_mode=false");
  const std::string async_dir = MakeTempDir("image_async");
  RunPsJob(async, async_dir);
  const double ps_async = FromLog(async_dir, " accuracy ");
  std::cout << "accuracy: collective " << none << ", fp16 " << fp16 << ", top-k " << topk
            << ", PS async " << ps_async << std::endl;
  EXPECT_GT(none, 0.7);
  EXPECT_GT(fp16, none - 0.05) << "fp16 " << fp16 << " vs " << none;
  EXPECT_GT(topk, none - 0.05) << "top-k " << topk << " vs " << none;
  EXPECT_GT(ps_async, none - 0.1) << "PS async " << ps_async << " vs " << none;
}

std::string FindOnPath(const std::string& name) {
  for (const char* dir : {"/usr/bin", "/usr/local/bin"}) {
    const std::string candidate = absl::StrCat(dir, "/", name);
    if (::access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return "";
}

// deploy/mpi/tessera_mpirun.sh -np 2 --bind-to socket (its default) -- --example=...: Open MPI
// starts both ranks, which train the collective job; both end with single-machine parameters.
TEST(ImageMpiTest, MpirunRecipeTrainsTheCollectiveJob) {
  REQUIRE_DATA();
  if (FindOnPath("mpirun").empty()) {
    GTEST_FAIL() << "mpirun is not installed (deploy/setup installs openmpi-bin)";
  }
  const ImageJob j = kJobs[0];
  const examples::ExampleOptions eo = Options(j);
  const std::string dir = MakeTempDir("image_mpi");
  auto eps = FreeEndpoints(2);
  ASSERT_TRUE(eps.ok()) << eps.status();
  const std::string trainer = RunfilePath("trainer/tessera_trainer");
  const std::string bin_dir = trainer.substr(0, trainer.rfind('/'));
  // Every rank writes the same parameters (collective mode keeps the replicas equal); the
  // write is atomic.
  std::vector<std::string> args = {"/bin/bash",
                                   RunfilePath("deploy/mpi/tessera_mpirun.sh"),
                                   "-np",
                                   "2",
                                   "--endpoints",
                                   absl::StrJoin(*eps, ","),
                                   "--",
                                   "--example=" + j.example,
                                   "--barrier_timeout_s=60",
                                   "--log_every_steps=0",
                                   absl::StrCat("--dump_params=", dir, "/params.0")};
  for (const std::string& f : ExampleFlags(eo, j.batch, j.epochs)) args.push_back(f);
  ::setenv("TESSERA_MPI_BIN_DIR", bin_dir.c_str(), 1);
  ::setenv("TESSERA_MPIRUN_ARGS", "--allow-run-as-root --oversubscribe --mca btl self,tcp", 1);
  ProcessGroup group;
  auto pid = group.Start(args, dir + "/trainer.0.log");
  ASSERT_TRUE(pid.ok()) << pid.status();
  auto status = group.Wait(*pid, absl::Seconds(180));
  if (!status.ok()) group.Kill(*pid, SIGTERM);  // mpirun takes its ranks down with it
  const std::string log = ReadFileOrEmpty(dir + "/trainer.0.log");
  ASSERT_TRUE(status.ok()) << status.status() << "\n" << log;
  ASSERT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << log;
  EXPECT_NE(log.find("trainer 1"), std::string::npos) << log;
  ExpectDumpsClose(dir, 1, SingleMachine(eo, j.batch, eo.seed, j.epochs), 1e-5);
}

}  // namespace
}  // namespace tessera
