// The daemons on a GPU (--device=gpu), against the same jobs on the CPU: collective mode with the
// NCCL backend (one rank), hybrid mode (tables on a pserver, the dense gradients all-reduced by
// NCCL) and parameter-server mode. Each job's dumped parameters equal the CPU job's within the
// float32 drift of GPU kernels; a GPU trainer's log reports its placement per step, and its
// trace's compute spans time the ops on device kernels. Built with --config=cuda only; skips
// itself without a GPU.
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "common/device/cuda/cuda_device.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
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

constexpr int kTracedSteps = 3;

// The ops the "compute" spans of the trace at `path` ran, over all its traced steps (-1 when the
// trace cannot be read).
int64_t ComputeOps(const std::string& path) {
  google::protobuf::Struct doc;
  if (!google::protobuf::util::JsonStringToMessage(ReadFileOrEmpty(path), &doc).ok()) return -1;
  auto events = doc.fields().find("traceEvents");
  if (events == doc.fields().end()) return -1;
  int64_t ops = 0;
  for (const google::protobuf::Value& v : events->second.list_value().values()) {
    const auto& f = v.struct_value().fields();
    auto name = f.find("name"), args = f.find("args");
    if (name == f.end() || name->second.string_value() != "compute" || args == f.end()) continue;
    auto n = args->second.struct_value().fields().find("ops");
    if (n != args->second.struct_value().fields().end()) ops += n->second.number_value();
  }
  return ops;
}

// The "ops on device kernels" of a GPU trainer log's placement line (-1 when absent).
double OpsOnDevicePerStep(const std::string& log) {
  const std::string key = "placement per step: ";
  size_t at = log.find(key);
  if (at == std::string::npos) return -1;
  at += key.size();
  double n = -1;
  return absl::SimpleAtod(log.substr(at, log.find(' ', at) - at), &n) ? n : -1;
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
  const std::string dir = MakeTempDir("gpu_" + example + "_" + mode + "_gpu");
  job.flags.push_back("--device=gpu");
  job.flags.push_back("--trace=" + dir + "/trace.json");
  job.flags.push_back("--trace_first_step=2");
  job.flags.push_back("--trace_steps=" + std::to_string(kTracedSteps));
  std::vector<Params> gpu = RunPsJob(job, dir);
  ASSERT_EQ(cpu.size(), 1u);
  ASSERT_EQ(gpu.size(), 1u);
  ExpectParamsClose(gpu[0], cpu[0], kGpuRtol, example + " " + mode);
  const std::string log = ReadFileOrEmpty(dir + "/trainer.0.log");
  EXPECT_NE(log.find("ops on gpu:0"), std::string::npos) << log;
  const double on_device = OpsOnDevicePerStep(log);
  EXPECT_GT(on_device, 0) << log;
  // The trace's compute spans time the ops on device kernels too (with the CPU kernels that are
  // not RPCs), so they hold at least every traced step's device ops.
  EXPECT_GE(ComputeOps(dir + "/trace.json"), kTracedSteps * on_device) << log;
  if (mode == "hybrid") {
    EXPECT_NE(log.find("NCCL"), std::string::npos);
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
