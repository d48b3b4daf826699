#include "trainer/device_setup.h"

#include <cstdlib>
#include <cstring>
#include <sstream>

#include "common/data/synthetic.h"
#include "common/device/caching_allocator.h"
#include "common/device/placement.h"
#include "common/ops/ops.h"
#include "common/status.h"
#include "examples/mlp_regression/model.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

// A "GPU" whose memory is host memory (see common/device/placement_test.cc).
class FakeGpuBackend : public DeviceBackend {
 public:
  FakeGpuBackend()
      : alloc_([](size_t n) { return std::malloc(n); }, [](void* p) { std::free(p); }) {}
  std::shared_ptr<char> Allocate(const Place&, size_t bytes) override {
    return alloc_.AllocateShared(bytes);
  }
  void Copy(void* dst, const Place&, const void* src, const Place&, size_t bytes) override {
    std::memcpy(dst, src, bytes);
  }
  void SetZero(const Place&, void* p, size_t bytes) override { std::memset(p, 0, bytes); }
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
  auto two = PlanTrainerDevices("gpu", "0,1", *cpu, model, &lo);
  ASSERT_FALSE(two.ok());
  EXPECT_NE(two.status().message().find("--devices=0,1"), std::string::npos) << two.status();
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
  ASSERT_TRUE(GpuKernelTable()->Register("relu", FakeRelu).ok());
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
    auto plan = PlanTrainerDevices(gpu ? "gpu" : "cpu", "", *cpu, *model, &lo);
    ASSERT_TRUE(plan.ok()) << plan.status();
    EXPECT_EQ(plan->on_gpu(), gpu == 1);
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

}  // namespace
}  // namespace tessera
