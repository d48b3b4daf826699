// NcclPlaceReducer against CpuPlaceReducer, and trainers on two GPUs against one place.
//
// One GPU (communicator of 1 rank): dense float32 sums through NCCL equal the CPU reducer's up
// to float32 rounding, the output is a fresh host tensor, and every other case (sparse rows,
// float64, values on the host or two on one GPU, errors) is the CPU reducer's own result on host
// copies, bit for bit, with the places' variables left on their device. Two GPUs (skipped with
// fewer): the same for a 2-rank reduce in either order, and LocalTrainer with --devices=0,1
// (MLP and CTR: dense and sparse gradients) training like one CPU place within the float32
// drift of gpu_train_test and like the host reducer on the same GPUs within 1e-4, with fewer
// copies to the host. Built with --config=cuda only; prints SKIPPED and passes without a GPU.
#include "trainer/nccl_place_reducer.h"

#include <cmath>
#include <cstring>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/device/cuda/cuda_device.h"
#include "common/device/cuda/gpu_test_main.h"
#include "common/device/placement.h"
#include "common/ops/ops.h"
#include "examples/registry.h"
#include "trainer/device_setup.h"
#include "trainer/local_trainer.h"
#include "trainer/places.h"

namespace tessera {
namespace {

Tensor RandomTensor(DataType dtype, Shape shape, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> u(-2.0, 2.0);
  Tensor t(dtype, std::move(shape));
  for (int64_t i = 0; i < t.numel(); ++i) {
    if (dtype == FLOAT32) {
      t.data<float>()[i] = static_cast<float>(u(rng));
    } else {
      t.data<double>()[i] = u(rng);
    }
  }
  return t;
}

Tensor OnGpu(const Tensor& host, int device) {
  Tensor t;
  t.ResetPlace(Place::Gpu(device));
  t.CopyFrom(host);
  return t;
}

Tensor ToHost(const Tensor& t) {
  Tensor h;
  h.CopyFrom(t);
  return h;
}

Variable Dense(const Tensor& t) {
  Variable v;
  *v.GetMutable<Tensor>() = t;
  return v;
}

Variable Sparse(std::vector<int64_t> rows, int64_t height, const Tensor& value) {
  Variable v;
  SelectedRows* sr = v.GetMutable<SelectedRows>();
  sr->rows = std::move(rows);
  sr->height = height;
  sr->value = value;
  return v;
}

// Host copies of `values` (as the CPU reducer needs them).
std::vector<Variable> HostCopies(const std::vector<const Variable*>& values) {
  std::vector<Variable> out;
  for (const Variable* v : values) {
    Variable c = *v;
    EXPECT_TRUE(MoveToPlace(&c, Place::Cpu()).ok());
    out.push_back(std::move(c));
  }
  return out;
}

std::vector<const Variable*> Pointers(const std::vector<Variable>& vars) {
  std::vector<const Variable*> out;
  for (const Variable& v : vars) out.push_back(&v);
  return out;
}

void ExpectNear(const Tensor& got, const Tensor& want, double rel, const std::string& what) {
  ASSERT_TRUE(got.place().is_cpu()) << what;
  ASSERT_EQ(got.dtype(), FLOAT32) << what;
  ASSERT_EQ(got.shape(), want.shape()) << what;
  for (int64_t i = 0; i < got.numel(); ++i) {
    const double w = want.data<float>()[i];
    ASSERT_NEAR(got.data<float>()[i], w, rel * std::max(1.0, std::fabs(w)))
        << what << "[" << i << "]";
  }
}

void ExpectSameBytes(const Tensor& got, const Tensor& want, const std::string& what) {
  ASSERT_TRUE(got.place().is_cpu()) << what;
  ASSERT_EQ(got.dtype(), want.dtype()) << what;
  ASSERT_EQ(got.shape(), want.shape()) << what;
  EXPECT_EQ(std::memcmp(got.raw_data(), want.raw_data(), want.nbytes()), 0) << what;
}

// What the CPU reducer makes of host copies of `values`.
Variable CpuWeightedSum(const std::vector<const Variable*>& values,
                        const std::vector<double>& weights, absl::Status* status) {
  std::vector<Variable> host = HostCopies(values);
  CpuPlaceReducer cpu;
  Variable out;
  *status = cpu.WeightedSum("g", Pointers(host), weights, &out);
  return out;
}

class NcclPlaceReducerTest : public ::testing::Test {
 protected:
  void SetUp() override { RegisterCudaBackend(); }
};

TEST_F(NcclPlaceReducerTest, CreateNamesBadDeviceLists) {
  auto none = NcclPlaceReducer::Create({});
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), absl::StatusCode::kInvalidArgument);
  auto twice = NcclPlaceReducer::Create({0, 0});
  ASSERT_FALSE(twice.ok());
  EXPECT_EQ(twice.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(twice.status().message().find("GPU 0 is listed twice"), std::string::npos)
      << twice.status();
  auto missing = NcclPlaceReducer::Create({CudaDeviceCount()});
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kFailedPrecondition) << missing.status();
}

TEST_F(NcclPlaceReducerTest, OneGpuSumsLikeTheCpuIntoAFreshHostTensor) {
  auto reducer = NcclPlaceReducer::Create({0});
  ASSERT_TRUE(reducer.ok()) << reducer.status();
  for (const Shape& shape : {Shape{1}, Shape{3, 5}, Shape{1 << 20}}) {
    for (double w : {0.25, 1.0, 0.7}) {
      const std::string what = absl::StrCat(ShapeString(shape), " w=", w);
      const Tensor host = RandomTensor(FLOAT32, shape, 7);
      const Variable on_gpu = Dense(OnGpu(host, 0));
      const void* gpu_buffer = on_gpu.Get<Tensor>().raw_data();
      Variable out;
      *out.GetMutable<Tensor>() = on_gpu.Get<Tensor>();  // must be replaced, not written into
      ASSERT_TRUE((*reducer)->WeightedSum("g", {&on_gpu}, {w}, &out).ok()) << what;
      absl::Status cpu_status;
      const Variable want = CpuWeightedSum({&on_gpu}, {w}, &cpu_status);
      ASSERT_TRUE(cpu_status.ok()) << cpu_status;
      ExpectNear(out.Get<Tensor>(), want.Get<Tensor>(), 1e-6, what);
      // A buffer of its own, on the host; the place's value untouched on its GPU.
      EXPECT_NE(out.Get<Tensor>().raw_data(), gpu_buffer) << what;
      ASSERT_EQ(on_gpu.Get<Tensor>().place().DebugString(), "gpu:0") << what;
      EXPECT_EQ(on_gpu.Get<Tensor>().raw_data(), gpu_buffer) << what;
      out.GetMutable<Tensor>()->data<float>()[0] = 1234.0f;
      ExpectSameBytes(ToHost(on_gpu.Get<Tensor>()), host, what);
    }
  }
}

TEST_F(NcclPlaceReducerTest, EverythingElseIsTheCpuReducersOnHostCopies) {
  auto reducer = NcclPlaceReducer::Create({0});
  ASSERT_TRUE(reducer.ok()) << reducer.status();
  const Tensor a = RandomTensor(FLOAT32, {4, 3}, 1), b = RandomTensor(FLOAT32, {4, 3}, 2);
  const Tensor d = RandomTensor(FLOAT64, {4, 3}, 3);
  const Tensor rows_a = RandomTensor(FLOAT32, {2, 3}, 4), rows_b = RandomTensor(FLOAT32, {3, 3}, 5);
  struct Case {
    std::string name;
    std::vector<Variable> values;
    std::vector<double> weights;
  };
  std::vector<Case> cases;
  cases.push_back({"host values", {Dense(a), Dense(b), Dense(a)}, {0.5, 0.25, 0.25}});
  cases.push_back({"one on the host", {Dense(OnGpu(a, 0)), Dense(b)}, {0.5, 0.5}});
  cases.push_back({"two on one GPU", {Dense(OnGpu(a, 0)), Dense(OnGpu(b, 0))}, {0.75, 0.25}});
  cases.push_back({"float64", {Dense(OnGpu(d, 0))}, {0.25}});
  cases.push_back({"sparse rows",
                   {Sparse({3, 1}, 10, OnGpu(rows_a, 0)), Sparse({1, 7, 2}, 10, rows_b)},
                   {0.4, 0.6}});
  cases.push_back({"sparse on the GPU", {Sparse({3, 1}, 10, OnGpu(rows_a, 0))}, {0.25}});
  // Errors: the CPU reducer's, word for word.
  cases.push_back({"shape mismatch", {Dense(OnGpu(a, 0)), Dense(rows_b)}, {0.5, 0.5}});
  cases.push_back({"dense and sparse", {Dense(OnGpu(a, 0)), Sparse({1}, 10, rows_a)}, {0.5, 0.5}});
  cases.push_back({"weights", {Dense(OnGpu(a, 0))}, {0.5, 0.5}});
  cases.push_back({"missing", {Dense(OnGpu(a, 0)), Variable()}, {0.5, 0.5}});
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    const std::vector<const Variable*> values = Pointers(c.values);
    // Where each place's value lives before the call.
    auto value_of = [](const Variable* v) -> const Tensor* {
      if (const Tensor* t = v->GetIf<Tensor>()) return t;
      const SelectedRows* sr = v->GetIf<SelectedRows>();
      return sr != nullptr ? &sr->value : nullptr;
    };
    std::vector<const void*> buffers;
    std::vector<Place> places;
    for (const Variable* v : values) {
      const Tensor* t = value_of(v);
      buffers.push_back(t != nullptr ? t->raw_data() : nullptr);
      places.push_back(t != nullptr ? t->place() : Place::Cpu());
    }
    Variable got;
    const absl::Status status = (*reducer)->WeightedSum("g", values, c.weights, &got);
    absl::Status cpu_status;
    const Variable want = CpuWeightedSum(values, c.weights, &cpu_status);
    EXPECT_EQ(status, cpu_status);
    if (!status.ok() || !cpu_status.ok()) continue;
    if (want.Is<Tensor>()) {
      ExpectSameBytes(got.Get<Tensor>(), want.Get<Tensor>(), c.name);
    } else {
      ASSERT_TRUE(got.Is<SelectedRows>());
      EXPECT_EQ(got.Get<SelectedRows>().rows, want.Get<SelectedRows>().rows);
      EXPECT_EQ(got.Get<SelectedRows>().height, want.Get<SelectedRows>().height);
      ExpectSameBytes(got.Get<SelectedRows>().value, want.Get<SelectedRows>().value, c.name);
    }
    // The places' variables stay as they were (on their device, same buffers).
    for (size_t p = 0; p < values.size(); ++p) {
      const Tensor* t = value_of(values[p]);
      if (t == nullptr) continue;
      EXPECT_EQ(t->raw_data(), buffers[p]) << p;
      EXPECT_EQ(t->place().DebugString(), places[p].DebugString()) << p;
    }
  }
  // ConcatRows: through the host as well.
  const Variable on_gpu = Dense(OnGpu(a, 0)), on_host = Dense(b);
  Variable got, want;
  ASSERT_TRUE((*reducer)->ConcatRows("ids", {&on_gpu, &on_host}, &got).ok());
  std::vector<Variable> host = HostCopies({&on_gpu, &on_host});
  CpuPlaceReducer cpu;
  ASSERT_TRUE(cpu.ConcatRows("ids", Pointers(host), &want).ok());
  ExpectSameBytes(got.Get<Tensor>(), want.Get<Tensor>(), "concat");
  EXPECT_EQ(on_gpu.Get<Tensor>().place().DebugString(), "gpu:0");
}

TEST_F(NcclPlaceReducerTest, TwoGpusSumLikeTheCpu) {
  if (CudaDeviceCount() < 2) GTEST_SKIP() << "needs 2 GPUs";
  for (const std::vector<int>& ordinals : {std::vector<int>{0, 1}, std::vector<int>{1, 0}}) {
    auto reducer = NcclPlaceReducer::Create(ordinals);
    ASSERT_TRUE(reducer.ok()) << reducer.status();
    for (const Shape& shape : {Shape{1}, Shape{33, 7}, Shape{1 << 20}}) {
      const Tensor a = RandomTensor(FLOAT32, shape, 11), b = RandomTensor(FLOAT32, shape, 12);
      // Place p on GPU ordinals[p], and the other way round (values[0]'s GPU is the root).
      for (bool swapped : {false, true}) {
        const std::string what = absl::StrCat(ordinals[0], ",", ordinals[1], " ",
                                              ShapeString(shape), swapped ? " swapped" : "");
        const Variable x = Dense(OnGpu(a, swapped ? ordinals[1] : ordinals[0]));
        const Variable y = Dense(OnGpu(b, swapped ? ordinals[0] : ordinals[1]));
        Variable out;
        ASSERT_TRUE((*reducer)->WeightedSum("g", {&x, &y}, {0.75, 0.25}, &out).ok()) << what;
        absl::Status cpu_status;
        const Variable want = CpuWeightedSum({&x, &y}, {0.75, 0.25}, &cpu_status);
        ASSERT_TRUE(cpu_status.ok()) << cpu_status;
        ExpectNear(out.Get<Tensor>(), want.Get<Tensor>(), 1e-6, what);
        ExpectSameBytes(ToHost(x.Get<Tensor>()), a, what);
        ExpectSameBytes(ToHost(y.Get<Tensor>()), b, what);
      }
    }
  }
}

struct TrainRun {
  std::vector<double> losses;
  int64_t copies_to_host = 0;
  bool nccl = false;
};

// One epoch of `example` on `devices` ("" = one CPU place).
TrainRun Train(const std::string& example, const std::string& devices, bool reduce_on_devices) {
  TrainRun run;
  auto registry = NewStandardOpRegistry();
  examples::ExampleOptions eo;
  eo.name = example;
  eo.vocab_per_slot = 1000;
  eo.num_examples = 2048;
  eo.num_test_examples = 256;
  auto model = examples::BuildExampleModel(*registry, eo);
  EXPECT_TRUE(model.ok()) << model.status();
  auto data = examples::LoadExampleData(eo);
  EXPECT_TRUE(data.ok()) << data.status();
  if (!model.ok() || !data.ok()) return run;
  std::ostringstream log;
  LocalTrainerOptions lo;
  lo.batch_size = 128;
  lo.seed = 5;
  lo.log = &log;
  lo.after_step = [&run](int64_t, double loss, int64_t) { run.losses.push_back(loss); };
  DeviceSetupOptions setup;
  setup.reduce_on_devices = reduce_on_devices;
  auto plan =
      PlanTrainerDevices(devices.empty() ? "cpu" : "gpu", devices, *registry, *model, &lo, setup);
  EXPECT_TRUE(plan.ok()) << plan.status();
  if (!plan.ok()) return run;
  run.nccl = dynamic_cast<NcclPlaceReducer*>(lo.place_reducer.get()) != nullptr;
  auto trainer = LocalTrainer::Create(plan->executor_registry(registry.get()), *model, lo);
  EXPECT_TRUE(trainer.ok()) << trainer.status();
  if (!trainer.ok()) return run;
  const PlacementCounters before = GetPlacementCounters();
  const auto stats = (*trainer)->Train(data->train);
  EXPECT_TRUE(stats.ok()) << stats.status();
  run.copies_to_host = GetPlacementCounters().copies_to_host - before.copies_to_host;
  return run;
}

void ExpectLosses(const TrainRun& got, const TrainRun& want, double rel, const std::string& what) {
  ASSERT_FALSE(want.losses.empty()) << what;
  ASSERT_EQ(got.losses.size(), want.losses.size()) << what;
  for (size_t i = 0; i < want.losses.size(); ++i) {
    EXPECT_LE(std::abs(got.losses[i] - want.losses[i]),
              rel * std::max(1.0, std::abs(want.losses[i])))
        << what << " step " << i << ": " << got.losses[i] << " vs " << want.losses[i];
  }
}

TEST_F(NcclPlaceReducerTest, TwoGpuTrainerTrainsLikeOnePlace) {
  if (CudaDeviceCount() < 2) GTEST_SKIP() << "needs 2 GPUs";
  for (const std::string example : {"mlp_regression", "ctr"}) {
    SCOPED_TRACE(example);
    const TrainRun one = Train(example, "", true);
    const TrainRun nccl = Train(example, "0,1", true);
    const TrainRun host = Train(example, "0,1", false);
    EXPECT_TRUE(nccl.nccl);
    EXPECT_FALSE(host.nccl);
    ExpectLosses(nccl, one, 2e-3, "NCCL vs one CPU place");
    ExpectLosses(nccl, host, 1e-4, "NCCL vs the host reducer");
    // The dense gradients no longer come to the host one place at a time.
    EXPECT_LT(nccl.copies_to_host, host.copies_to_host);
  }
}

}  // namespace
}  // namespace tessera

TESSERA_GPU_TEST_MAIN()
