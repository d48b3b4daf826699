// Training on a GPU against training on the CPU (LocalTrainer, same programs, seeds and data):
// the MLP regression example and the CTR example (local tables: embedding gathers, sparse
// gradients and sparse Adam on the device). Per-step losses must agree within
// 2e-3 * max(1, |cpu loss|) — float32 kernels summing in other orders than Eigen drift a little
// over the steps — and the device allocator must (almost) not grow after the first epoch.
// Built with --config=cuda only; prints SKIPPED and passes without a GPU.
#include <cmath>
#include <sstream>
#include <vector>

#include "common/device/cuda/cuda_device.h"
#include "common/device/cuda/gpu_test_main.h"
#include "common/device/placement.h"
#include "common/ops/ops.h"
#include "examples/registry.h"
#include "trainer/device_setup.h"
#include "trainer/local_trainer.h"

namespace tessera {
namespace {

struct RunResult {
  std::vector<double> losses;
  double eval_loss = 0;
  int64_t host_ops = 0;
  int64_t device_misses_epoch1 = 0, device_misses_epoch2 = 0;
};

RunResult Train(const std::string& example, bool gpu) {
  RunResult r;
  auto registry = NewStandardOpRegistry();
  examples::ExampleOptions eo;
  eo.name = example;
  eo.vocab_per_slot = 1000;
  eo.distributed_tables = false;
  eo.num_examples = 2048;
  eo.num_test_examples = 512;
  auto model = examples::BuildExampleModel(*registry, eo);
  EXPECT_TRUE(model.ok()) << model.status();
  auto data = examples::LoadExampleData(eo);
  EXPECT_TRUE(data.ok()) << data.status();
  if (!model.ok() || !data.ok()) return r;
  std::ostringstream log;
  LocalTrainerOptions lo;
  lo.batch_size = 128;
  lo.epochs = 1;
  lo.seed = 5;
  lo.log = &log;
  lo.after_step = [&r](int64_t, double loss, int64_t) { r.losses.push_back(loss); };
  auto plan = PlanTrainerDevices(gpu ? "gpu" : "cpu", "", *registry, *model, &lo);
  EXPECT_TRUE(plan.ok()) << plan.status();
  if (!plan.ok()) return r;
  auto trainer = LocalTrainer::Create(plan->executor_registry(registry.get()), *model, lo);
  EXPECT_TRUE(trainer.ok()) << trainer.status();
  if (!trainer.ok()) return r;
  const PlacementCounters before = GetPlacementCounters();
  EXPECT_TRUE((*trainer)->Train(data->train).ok());
  if (gpu) r.device_misses_epoch1 = (*CudaDevice::Get(0))->device_stats().misses;
  EXPECT_TRUE((*trainer)->Train(data->train).ok());
  if (gpu) r.device_misses_epoch2 = (*CudaDevice::Get(0))->device_stats().misses;
  r.host_ops = GetPlacementCounters().ops_on_host - before.ops_on_host;
  auto eval = (*trainer)->Evaluate(data->test);
  EXPECT_TRUE(eval.ok()) << eval.status();
  if (eval.ok()) r.eval_loss = eval->mean_loss;
  return r;
}

// max_new_blocks: cudaMallocs allowed in the second epoch (CTR's merged sparse gradients vary
// in size with the number of distinct ids per batch, so a new size class may still turn up).
void Compare(const RunResult& cpu, const RunResult& gpu, int64_t max_new_blocks) {
  ASSERT_FALSE(cpu.losses.empty());
  ASSERT_EQ(cpu.losses.size(), gpu.losses.size());
  for (size_t i = 0; i < cpu.losses.size(); ++i) {
    EXPECT_LE(std::abs(gpu.losses[i] - cpu.losses[i]), 2e-3 * std::max(1.0, std::abs(cpu.losses[i])))
        << "step " << i << ": gpu " << gpu.losses[i] << " cpu " << cpu.losses[i];
  }
  EXPECT_LE(std::abs(gpu.eval_loss - cpu.eval_loss), 2e-3 * std::max(1.0, cpu.eval_loss));
  // (Almost) no cudaMalloc in the second epoch: buffers come from the cache.
  EXPECT_LE(gpu.device_misses_epoch2 - gpu.device_misses_epoch1, max_new_blocks);
  EXPECT_GT(gpu.device_misses_epoch1, 0);
}

TEST(GpuTrainTest, MlpRegressionMatchesTheCpu) {
  RunResult cpu = Train("mlp_regression", false);
  RunResult gpu = Train("mlp_regression", true);
  Compare(cpu, gpu, 0);
  EXPECT_EQ(gpu.host_ops, 0) << "every MLP op has a GPU kernel";
}

// Two GPUs in one trainer (--devices=0,1: one place per GPU, dense gradients summed on the
// GPUs by the NcclPlaceReducer) against one CPU place: the same per-step losses within the
// float32 drift above. (nccl_place_reducer_test compares it with the host reducer as well.)
TEST(GpuTrainTest, TwoGpusInOneTrainerMatchTheCpu) {
  if (CudaDeviceCount() < 2) GTEST_SKIP() << "needs 2 GPUs";
  auto registry = NewStandardOpRegistry();
  examples::ExampleOptions eo;
  eo.name = "mlp_regression";
  eo.num_examples = 2048;
  auto data = examples::LoadExampleData(eo);
  ASSERT_TRUE(data.ok()) << data.status();
  std::vector<double> losses[2];
  for (int gpus = 0; gpus < 2; ++gpus) {
    auto model = examples::BuildExampleModel(*registry, eo);
    ASSERT_TRUE(model.ok()) << model.status();
    std::ostringstream log;
    LocalTrainerOptions lo;
    lo.batch_size = 128;
    lo.seed = 5;
    lo.log = &log;
    lo.after_step = [&losses, gpus](int64_t, double loss, int64_t) {
      losses[gpus].push_back(loss);
    };
    auto plan = PlanTrainerDevices(gpus ? "gpu" : "cpu", gpus ? "0,1" : "", *registry, *model,
                                   &lo);
    ASSERT_TRUE(plan.ok()) << plan.status();
    auto trainer = LocalTrainer::Create(plan->executor_registry(registry.get()), *model, lo);
    ASSERT_TRUE(trainer.ok()) << trainer.status();
    ASSERT_TRUE((*trainer)->Train(data->train).ok());
  }
  ASSERT_EQ(losses[0].size(), losses[1].size());
  for (size_t i = 0; i < losses[0].size(); ++i) {
    EXPECT_LE(std::abs(losses[1][i] - losses[0][i]), 2e-3 * std::max(1.0, std::abs(losses[0][i])))
        << "step " << i;
  }
}

TEST(GpuTrainTest, CtrMatchesTheCpu) {
  RunResult cpu = Train("ctr", false);
  RunResult gpu = Train("ctr", true);
  Compare(cpu, gpu, 8);
  EXPECT_EQ(gpu.host_ops, 0) << "every CTR op (local tables) has a GPU kernel";
}

}  // namespace
}  // namespace tessera

TESSERA_GPU_TEST_MAIN()
