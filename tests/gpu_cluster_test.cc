// The daemons on a GPU (--device=gpu), against the same jobs on the CPU: collective mode with the
// NCCL backend (one rank), hybrid mode (tables on a pserver, the dense gradients all-reduced by
// NCCL) and parameter-server mode. Each job's dumped parameters equal the CPU job's within the
// float32 drift of GPU kernels. Built with --config=cuda only; skips itself without a GPU.
#include <string>
#include <vector>

#include "common/device/cuda/cuda_device.h"
#include "gtest/gtest.h"
#include "tests/cluster_util.h"
#include "tests/equivalence_util.h"

namespace tessera {
namespace {

// GPU kernels sum in other orders than Eigen: parameters drift apart by float32 roundings.
constexpr double kGpuRtol = 5e-3;

examples::ExampleOptions Example(const std::string& name) {
  examples::ExampleOptions eo;
  eo.name = name;
  eo.num_examples = 1024;
  eo.num_test_examples = 64;
  eo.seed = 3;
  if (name == "ctr") eo.vocab_per_slot = 2000;
  return eo;
}

class GpuClusterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (CudaDeviceCount() < 1) GTEST_SKIP() << "no GPU";
  }
};

TEST_F(GpuClusterTest, CollectiveWithNcclEqualsTheCpuJob) {
  const examples::ExampleOptions eo = Example("mlp_regression");
  std::vector<std::string> flags = ExampleFlags(eo, 64, 2);
  flags.push_back("--example=mlp_regression");
  const std::string cpu = MakeTempDir("gpu_collective_cpu");
  RunCollectiveTrainers(cpu, 1, flags);
  if (HasFatalFailure()) return;
  flags.push_back("--device=gpu");
  const std::string gpu = MakeTempDir("gpu_collective_gpu");
  RunCollectiveTrainers(gpu, 1, flags);
  if (HasFatalFailure()) return;
  EXPECT_NE(ReadFileOrEmpty(gpu + "/trainer.0.log").find("collective (NCCL all-reduce)"),
            std::string::npos)
      << ReadFileOrEmpty(gpu + "/trainer.0.log");
  // Single machine on the CPU: the reference both jobs are held to.
  const Params want = SingleMachine(eo, 64, eo.seed, 2);
  ExpectDumpsClose(cpu, 1, want, 1e-5);
  ExpectDumpsClose(gpu, 1, want, kGpuRtol);
}

// `example` in `mode` (pserver or hybrid) with 1 pserver and 1 trainer, on the GPU and on the
// CPU. CTR keeps its distributed tables on the pserver.
void ExpectGpuJobEqualsCpuJob(const std::string& example, const std::string& mode) {
  const examples::ExampleOptions eo = Example(example);
  PsJob job;
  job.example = example;
  job.pservers = 1;
  job.trainers = 1;
  job.trainer_endpoints = mode == "hybrid";
  job.flags = ExampleFlags(eo, 128, 1);
  job.flags.push_back("--mode=" + mode);
  std::vector<Params> cpu = RunPsJob(job, MakeTempDir("gpu_" + example + "_" + mode + "_cpu"));
  job.flags.push_back("--device=gpu");
  const std::string dir = MakeTempDir("gpu_" + example + "_" + mode + "_gpu");
  std::vector<Params> gpu = RunPsJob(job, dir);
  ASSERT_EQ(cpu.size(), 1u);
  ASSERT_EQ(gpu.size(), 1u);
  ExpectParamsClose(gpu[0], cpu[0], kGpuRtol, example + " " + mode);
  EXPECT_NE(ReadFileOrEmpty(dir + "/trainer.0.log").find("ops on gpu:0"), std::string::npos)
      << ReadFileOrEmpty(dir + "/trainer.0.log");
  if (mode == "hybrid") {
    EXPECT_NE(ReadFileOrEmpty(dir + "/trainer.0.log").find("NCCL"), std::string::npos);
  }
}

TEST_F(GpuClusterTest, HybridWithNcclEqualsTheCpuJob) { ExpectGpuJobEqualsCpuJob("ctr", "hybrid"); }

TEST_F(GpuClusterTest, CtrOnAGpuTrainerWithACpuPserverEqualsTheCpuJob) {
  ExpectGpuJobEqualsCpuJob("ctr", "pserver");
}

TEST_F(GpuClusterTest, MlpOnAGpuTrainerWithACpuPserverEqualsTheCpuJob) {
  ExpectGpuJobEqualsCpuJob("mlp_regression", "pserver");
}

}  // namespace
}  // namespace tessera
