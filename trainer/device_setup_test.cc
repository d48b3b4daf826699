#include "trainer/device_setup.h"

#include <cmath>
#include <cstdlib>
#include <map>
#include <cstring>
#include <sstream>

#include "common/data/synthetic.h"
#include "common/device/caching_allocator.h"
#include "common/device/placement.h"
#include "common/ops/ops.h"
#include "common/base/status.h"
#include "examples/mlp_regression/model.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

// A "GPU" whose memory is host memory (see common/device/placement_test.cc).
class FakeGpuBackend : public DeviceBackend {
 public:
  FakeGpuBackend()
      : alloc_([](size_t n) { return std::malloc(n); }, [](void* p) { std::free(p); }) {}
  absl::StatusOr<std::shared_ptr<char>> Allocate(const Place&, size_t bytes) override {
    return alloc_.AllocateShared(bytes);
  }
  absl::Status Copy(void* dst, const Place&, const void* src, const Place&, size_t bytes) override {
    std::memcpy(dst, src, bytes);
    return absl::OkStatus();
  }
  absl::Status SetZero(const Place&, void* p, size_t bytes) override {
    std::memset(p, 0, bytes);
    return absl::OkStatus();
  }
  CachingAllocator alloc_;
};

// relu "on the device": host code over the fake device's memory.
absl::StatusOr<bool> FakeRelu(OpContext& ctx, const Place& place) {
  TS_ASSIGN_OR_RETURN(const Tensor* x, ctx.Input("X"));
  if (x->dtype() != FLOAT32) return false;
  TS_ASSIGN_OR_RETURN(x, PlacedInput(ctx, "X", place));
  TS_ASSIGN_OR_RETURN(Tensor * out, PlacedOutput(ctx, "Out", place));
  if (out != x) out->Resize(FLOAT32, x->shape());
  for (int64_t i = 0; i < x->numel(); ++i) {
    out->data<float>()[i] = std::max(0.0f, x->data<float>()[i]);
  }
  return true;
}

// The fake device's kernel table: its relu only (in a --config=cuda build too, where the plan
// would otherwise register the CUDA kernels), and the gradients of several fake GPUs combined
// on the host (NCCL needs real ones).
DeviceSetupOptions FakeGpuSetup() {
  DeviceSetupOptions setup;
  setup.register_kernels = [](DeviceKernelTable* table) {
    return table->Register("relu", FakeRelu);
  };
  setup.reduce_on_devices = false;
  return setup;
}

TEST(DeviceSetupTest, CpuKeepsTheRegistry) {
  auto cpu = NewStandardOpRegistry();
  ModelSpec model;
  LocalTrainerOptions lo;
  auto plan = PlanTrainerDevices("cpu", "", *cpu, model, &lo);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_FALSE(plan->on_gpu());
  EXPECT_EQ(plan->executor_registry(cpu.get()), cpu.get());
  EXPECT_FALSE(static_cast<bool>(lo.after_run));
}

TEST(DeviceSetupTest, BadSettingsAndMissingRuntimeAreNamed) {
  auto cpu = NewStandardOpRegistry();
  ModelSpec model;
  LocalTrainerOptions lo;
  DeviceBackend* saved = GetDeviceBackend();
  SetDeviceBackend(nullptr);  // as in a binary built without --config=cuda
  auto gpu = PlanTrainerDevices("gpu", "", *cpu, model, &lo);
  SetDeviceBackend(saved);
  ASSERT_FALSE(gpu.ok());
  EXPECT_EQ(gpu.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(gpu.status().message().find("--config=cuda"), std::string::npos) << gpu.status();
  auto bad = PlanTrainerDevices("fpga", "", *cpu, model, &lo);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("'fpga'"), std::string::npos) << bad.status();
}

// The whole LocalTrainer loop on the fake GPU: same losses as on the CPU (bit for bit: the fake
// kernel computes what the CPU one does), fetches and feeds on the host after every run, and
// the hidden activations moving up and down once per step.
TEST(DeviceSetupTest, TrainsOnTheFakeGpuLikeOnTheCpu) {
  static FakeGpuBackend* fake = new FakeGpuBackend();
  SetDeviceBackend(fake);
  auto cpu = NewStandardOpRegistry();
  auto data = data::MakeRegressionData(512, 3);
  ASSERT_TRUE(data.ok());
  std::vector<double> losses[2];
  for (int gpu = 0; gpu < 2; ++gpu) {
    auto model = examples::BuildMlpRegression(*cpu);
    ASSERT_TRUE(model.ok());
    std::ostringstream log;
    LocalTrainerOptions lo;
    lo.batch_size = 64;
    lo.epochs = 2;
    lo.log = &log;
    lo.after_step = [&losses, gpu](int64_t, double loss, int64_t) {
      losses[gpu].push_back(loss);
    };
    int runs = 0;
    const std::string loss_name = model->loss, feed = model->feeds.dense;
    lo.after_run = [&runs, loss_name, feed](Scope* scope) -> absl::Status {
      ++runs;
      for (const std::string& name : {loss_name, feed}) {
        const Variable* v = scope->FindVar(name);
        if (v != nullptr && v->Is<Tensor>() && !v->Get<Tensor>().place().is_cpu()) {
          return absl::InternalError(name + " is not on the host after the run");
        }
      }
      return absl::OkStatus();
    };
    auto plan = PlanTrainerDevices(gpu ? "gpu" : "cpu", "", *cpu, *model, &lo, FakeGpuSetup());
    ASSERT_TRUE(plan.ok()) << plan.status();
    EXPECT_EQ(plan->on_gpu(), gpu == 1);
    if (gpu) EXPECT_EQ(plan->kernels->Types(), std::vector<std::string>{"relu"});
    auto trainer = LocalTrainer::Create(plan->executor_registry(cpu.get()), *model, lo);
    ASSERT_TRUE(trainer.ok()) << trainer.status();
    const PlacementCounters before = GetPlacementCounters();
    auto stats = (*trainer)->Train(*data);
    ASSERT_TRUE(stats.ok()) << stats.status();
    const PlacementCounters after = GetPlacementCounters();
    const int64_t steps = 2 * 512 / 64;
    if (gpu) {
      EXPECT_EQ(runs, 1 + steps);  // startup + every step
      EXPECT_EQ(after.ops_on_device - before.ops_on_device, steps);  // one relu per step
      // Per step: the relu input goes up; it and the relu output come down, read by the CPU
      // ops after it (mul reads the output; relu_grad binds both).
      EXPECT_EQ(after.copies_to_device - before.copies_to_device, steps);
      EXPECT_EQ(after.copies_to_host - before.copies_to_host, 2 * steps);
    } else {
      EXPECT_EQ(after.ops_on_device, before.ops_on_device);
    }
  }
  ASSERT_EQ(losses[0].size(), losses[1].size());
  for (size_t i = 0; i < losses[0].size(); ++i) EXPECT_EQ(losses[0][i], losses[1][i]) << i;
}

// Two fake GPUs in one trainer: each runs forward and backward on its half of the local batch
// with its own copy of the parameters, their gradients meet on the host (the host reducer: the
// NCCL one needs real GPUs, nccl_place_reducer_test), and the trainer
// trains as with two CPU places (the same arithmetic: bit for bit) and as one place (1e-5).
TEST(DeviceSetupTest, TwoFakeGpusTrainLikeTwoCpuPlacesAndLikeOnePlace) {
  static FakeGpuBackend* fake = new FakeGpuBackend();
  SetDeviceBackend(fake);
  auto cpu = NewStandardOpRegistry();
  auto data = data::MakeRegressionData(512, 5);
  ASSERT_TRUE(data.ok());
  struct Run {
    std::vector<double> losses;
    std::map<std::string, std::vector<float>> params;
  };
  auto train = [&](const std::string& device, const std::string& devices, int cpu_places,
                   int64_t* device_ops) -> Run {
    Run run;
    auto model = examples::BuildMlpRegression(*cpu);
    EXPECT_TRUE(model.ok());
    std::ostringstream log;
    LocalTrainerOptions lo;
    lo.batch_size = 66;  // places of 33 (and 29 + 29 in the last batch of 58)
    lo.epochs = 2;
    lo.log = &log;
    lo.cpu_places = cpu_places;
    lo.after_step = [&run](int64_t, double loss, int64_t) { run.losses.push_back(loss); };
    auto plan = PlanTrainerDevices(device, devices, *cpu, *model, &lo, FakeGpuSetup());
    EXPECT_TRUE(plan.ok()) << plan.status();
    if (!plan.ok()) return run;
    EXPECT_EQ(plan->place_reducer, nullptr);  // the host reducer
    EXPECT_EQ(lo.place_reducer, nullptr);
    auto trainer = LocalTrainer::Create(plan->executor_registry(cpu.get()), *model, lo);
    EXPECT_TRUE(trainer.ok()) << trainer.status();
    if (!trainer.ok()) return run;
    const PlacementCounters before = GetPlacementCounters();
    EXPECT_TRUE((*trainer)->Train(*data).ok());
    *device_ops = GetPlacementCounters().ops_on_device - before.ops_on_device;
    for (const auto& v : model->main.blocks(0).vars()) {
      if (!v.trainable()) continue;
      const Tensor& t = (*trainer)->scope()->FindVar(v.name())->Get<Tensor>();
      EXPECT_TRUE(t.place().is_cpu()) << v.name();
      run.params[v.name()] = std::vector<float>(t.data<float>(), t.data<float>() + t.numel());
    }
    return run;
  };
  int64_t gpu_ops = 0, cpu_ops = 0, one_ops = 0;
  const Run gpus = train("gpu", "0,1", 1, &gpu_ops);
  const Run places = train("cpu", "", 2, &cpu_ops);
  const Run one = train("cpu", "", 1, &one_ops);
  const int64_t steps = 2 * ((512 + 65) / 66);
  EXPECT_EQ(gpu_ops, 2 * steps);  // one relu per place and step, on its fake GPU
  EXPECT_EQ(cpu_ops, 0);
  ASSERT_EQ(gpus.losses.size(), static_cast<size_t>(steps));
  EXPECT_EQ(gpus.losses, places.losses);
  EXPECT_EQ(gpus.params, places.params);
  ASSERT_EQ(gpus.params.size(), one.params.size());
  for (const auto& [name, values] : one.params) {
    const std::vector<float>& got = gpus.params.at(name);
    ASSERT_EQ(got.size(), values.size()) << name;
    for (size_t i = 0; i < values.size(); ++i) {
      EXPECT_NEAR(got[i], values[i], 1e-5 * std::max(1.0f, std::fabs(values[i]))) << name << i;
    }
  }
  // Both at once is refused, naming the flags.
  auto model = examples::BuildMlpRegression(*cpu);
  LocalTrainerOptions lo;
  lo.cpu_places = 2;
  auto both = PlanTrainerDevices("gpu", "0,1", *cpu, *model, &lo);
  ASSERT_FALSE(both.ok());
  EXPECT_NE(both.status().message().find("--cpu_places=2"), std::string::npos) << both.status();
}

}  // namespace
}  // namespace tessera
