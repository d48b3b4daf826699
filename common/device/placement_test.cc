#include "common/device/placement.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/device/caching_allocator.h"
#include "common/framework/executor.h"
#include "common/ops/ops.h"
#include "common/base/status.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

// A "GPU" whose memory is host memory from a caching allocator: placement's bookkeeping runs
// for real (places, copies, fallbacks) and kernels written in host code can check it.
class FakeGpuBackend : public DeviceBackend {
 public:
  FakeGpuBackend()
      : alloc_([](size_t n) { return std::malloc(n); }, [](void* p) { std::free(p); }) {}
  absl::StatusOr<std::shared_ptr<char>> Allocate(const Place& place, size_t bytes) override {
    EXPECT_TRUE(place.is_gpu());
    return alloc_.AllocateShared(bytes);
  }
  absl::Status Copy(void* dst, const Place& dst_place, const void* src, const Place& src_place,
                    size_t bytes) override {
    EXPECT_TRUE(dst_place.is_gpu() || src_place.is_gpu());
    ++copies;
    std::memcpy(dst, src, bytes);
    return absl::OkStatus();
  }
  absl::Status SetZero(const Place& place, void* p, size_t bytes) override {
    std::memset(p, 0, bytes);
    return absl::OkStatus();
  }
  CachingAllocator alloc_;
  int copies = 0;
};

// The fake GPU with injected failures, off unless armed: a device that runs out of memory
// after `allocations_left` more allocations, and copies that fail with a device's error.
// Single-threaded tests only; Disarm() before the next test.
class FaultyGpuBackend : public FakeGpuBackend {
 public:
  absl::StatusOr<std::shared_ptr<char>> Allocate(const Place& place, size_t bytes) override {
    if (allocations_left == 0) {
      ++failed_allocations;
      return absl::ResourceExhaustedError(absl::StrCat("out of memory on ", place.DebugString(),
                                                       " allocating ", bytes, " bytes (injected)"));
    }
    if (allocations_left > 0) --allocations_left;
    return FakeGpuBackend::Allocate(place, bytes);
  }
  absl::Status Copy(void* dst, const Place& dst_place, const void* src, const Place& src_place,
                    size_t bytes) override {
    const absl::Status& injected = dst_place.is_cpu() ? to_host_error : to_device_error;
    if (!injected.ok()) return injected;
    return FakeGpuBackend::Copy(dst, dst_place, src, src_place, bytes);
  }
  void Disarm() {
    allocations_left = -1;
    to_host_error = absl::OkStatus();
    to_device_error = absl::OkStatus();
    failed_allocations = 0;
  }
  int allocations_left = -1;  // < 0: never out of memory
  absl::Status to_host_error;
  absl::Status to_device_error;
  int failed_allocations = 0;
};

FaultyGpuBackend* Backend() {
  static auto* b = [] {
    auto* fake = new FaultyGpuBackend();
    SetDeviceBackend(fake);
    return fake;
  }();
  return b;
}

// What a CUDA copy fails with after a kernel faulted (the text CudaBackend gives).
absl::Status IllegalAddress() {
  return absl::InternalError(
      "gpu:0: copying 48 bytes to the host: cudaMemcpyAsync(device to host): "
      "cudaErrorIllegalAddress: an illegal memory access was encountered");
}

bool Has(const absl::Status& s, absl::string_view text) {
  return s.message().find(text) != absl::string_view::npos;
}

// relu on the fake GPU: fails unless placement put X there; float32 only (else: CPU kernel).
absl::StatusOr<bool> FakeGpuRelu(OpContext& ctx, const Place& place) {
  TS_ASSIGN_OR_RETURN(const Tensor* x, ctx.Input("X"));
  if (x->dtype() != FLOAT32) return false;
  TS_ASSIGN_OR_RETURN(x, PlacedInput(ctx, "X", place));
  if (x->place() != place) return absl::InternalError("X not moved to the device");
  TS_ASSIGN_OR_RETURN(Tensor * out, PlacedOutput(ctx, "Out", place, x->dtype(), x->shape()));
  if (out->place() != place) return absl::InternalError("Out not on the device");
  for (int64_t i = 0; i < x->numel(); ++i) {
    out->data<float>()[i] = std::max(0.0f, x->data<float>()[i]);
  }
  return true;
}

// A CPU op that fails when its input is not on the host.
absl::Status CheckHost(OpContext& ctx) {
  TS_ASSIGN_OR_RETURN(const Tensor* x, ctx.Input("X"));
  if (!x->place().is_cpu()) return ctx.Error("X is on " + x->place().DebugString());
  TS_ASSIGN_OR_RETURN(Tensor * out, ctx.Output("Out"));
  out->CopyFrom(*x);
  return absl::OkStatus();
}

class PlacementTest : public ::testing::Test {
 protected:
  void SetUp() override {
    Backend()->Disarm();
    ASSERT_TRUE(RegisterStandardOps(&cpu_).ok());
    ASSERT_TRUE(cpu_.Register("check_host", {CheckHost, nullptr}).ok());
    ASSERT_TRUE(table_.Register("relu", FakeGpuRelu).ok());
  }
  void TearDown() override { Backend()->Disarm(); }
  void Feed(Scope* scope) {
    Tensor* x = scope->Var("x")->GetMutable<Tensor>();
    x->Resize(FLOAT32, {3, 4});
    for (int i = 0; i < 12; ++i) x->data<float>()[i] = static_cast<float>(i % 5) - 2.0f;
  }
  // x as Feed writes it, on the host.
  void ExpectFed(const Scope& scope) {
    const Tensor& x = scope.FindVar("x")->Get<Tensor>();
    ASSERT_TRUE(x.place().is_cpu());
    ASSERT_EQ(x.shape(), (Shape{3, 4}));
    for (int i = 0; i < 12; ++i) EXPECT_EQ(x.data<float>()[i], static_cast<float>(i % 5) - 2.0f);
  }
  std::vector<OpDesc> Program() {
    return {MakeOp("relu", {{"X", {"x"}}}, {{"Out", {"a"}}}),
            MakeOp("sigmoid", {{"X", {"a"}}}, {{"Out", {"b"}}}),
            MakeOp("relu", {{"X", {"b"}}}, {{"Out", {"c"}}}),
            MakeOp("check_host", {{"X", {"c"}}}, {{"Out", {"d"}}}),
            MakeOp("mean", {{"X", {"d"}}}, {{"Out", {"loss"}}})};
  }
  OpRegistry cpu_;
  DeviceKernelTable table_;
};

TEST_F(PlacementTest, ParseDevices) {
  auto cpu = ParseDevices("cpu", "");
  ASSERT_TRUE(cpu.ok());
  EXPECT_EQ(*cpu, std::vector<Place>{Place::Cpu()});
  auto one = ParseDevices("gpu", "");
  ASSERT_TRUE(one.ok());
  EXPECT_EQ(*one, std::vector<Place>{Place::Gpu(0)});
  auto two = ParseDevices("gpu", "1,0");
  ASSERT_TRUE(two.ok());
  EXPECT_EQ(*two, (std::vector<Place>{Place::Gpu(1), Place::Gpu(0)}));
  EXPECT_NE(ParseDevices("tpu", "").status().message().find("--device='tpu'"), std::string::npos);
  EXPECT_NE(ParseDevices("gpu", "0,x").status().message().find("'x'"), std::string::npos);
  EXPECT_NE(ParseDevices("gpu", "0,0").status().message().find("'0'"), std::string::npos);
  EXPECT_NE(ParseDevices("cpu", "1").status().message().find("--devices=1"), std::string::npos);
  auto p = ParsePlace("gpu:3");
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->DebugString(), "gpu:3");
  EXPECT_NE(ParsePlace("gpu:-1").status().message().find("gpu:-1"), std::string::npos);
}

TEST_F(PlacementTest, CpuPlaceKeepsTheCpuKernels) {
  auto placed = MakePlacedRegistry(cpu_, Place::Cpu(), table_);
  ASSERT_TRUE(placed.ok());
  EXPECT_EQ((*placed)->Types(), cpu_.Types());
  Scope scope;
  Feed(&scope);
  Executor exec(placed->get());
  for (const OpDesc& op : Program()) ASSERT_TRUE(exec.RunOp(op, &scope).ok());
  EXPECT_TRUE(scope.FindVar("a")->Get<Tensor>().place().is_cpu());
}

TEST_F(PlacementTest, MigratesLazilyAndMatchesTheCpuRun) {
  Scope ref;
  Feed(&ref);
  Executor cpu_exec(&cpu_);
  for (const OpDesc& op : Program()) ASSERT_TRUE(cpu_exec.RunOp(op, &ref).ok());

  auto placed = MakePlacedRegistry(cpu_, Place::Gpu(0), table_);
  ASSERT_TRUE(placed.ok());
  Executor exec(placed->get());
  Scope scope;
  const PlacementCounters start = GetPlacementCounters();
  for (int step = 0; step < 2; ++step) {
    ReleaseVarsToHost(&scope, {"x"});  // the host overwrites the feed
    Feed(&scope);
    PlacementCounters before = GetPlacementCounters();
    for (const OpDesc& op : Program()) {
      absl::Status s = exec.RunOp(op, &scope);
      ASSERT_TRUE(s.ok()) << s;
    }
    PlacementCounters after = GetPlacementCounters();
    // x and b go up; a (read by the CPU sigmoid) and c (read by check_host) come down.
    EXPECT_EQ(after.copies_to_device - before.copies_to_device, 2);
    EXPECT_EQ(after.copies_to_host - before.copies_to_host, 2);
    EXPECT_EQ(after.bytes_to_host - before.bytes_to_host, 2 * 12 * 4);
    EXPECT_EQ(after.ops_on_device - before.ops_on_device, 2);
    EXPECT_EQ(after.ops_on_host - before.ops_on_host, 3);
  }
  // The trainer's log line: the same counts per step (2 steps), bytes in KiB.
  EXPECT_EQ(PlacementPerStep(start, GetPlacementCounters(), 2),
            "per step: 2.0 ops on device kernels, 3.0 on CPU kernels; 2.0 copies to the device "
            "(0.1 KiB), 2.0 to the host (0.1 KiB)");
  EXPECT_TRUE(scope.FindVar("x")->Get<Tensor>().place().is_gpu());
  EXPECT_TRUE(scope.FindVar("a")->Get<Tensor>().place().is_cpu());
  EXPECT_TRUE(scope.FindVar("loss")->Get<Tensor>().place().is_cpu());
  ASSERT_TRUE(MoveScopeToHost(&scope).ok());
  for (const char* name : {"x", "a", "b", "c", "d", "loss"}) {
    const Tensor& got = scope.FindVar(name)->Get<Tensor>();
    const Tensor& want = ref.FindVar(name)->Get<Tensor>();
    ASSERT_TRUE(got.place().is_cpu()) << name;
    ASSERT_EQ(got.shape(), want.shape()) << name;
    for (int64_t i = 0; i < got.numel(); ++i) {
      EXPECT_EQ(got.data<float>()[i], want.data<float>()[i]) << name << "[" << i << "]";
    }
  }
}

TEST_F(PlacementTest, DeviceKernelDeclinesAndTheCpuKernelReportsBadInput) {
  auto placed = MakePlacedRegistry(cpu_, Place::Gpu(0), table_);
  ASSERT_TRUE(placed.ok());
  Executor exec(placed->get());
  Scope scope;
  Tensor* x = scope.Var("x")->GetMutable<Tensor>();
  x->Resize(INT64, {2});  // the fake relu takes float32 only; the CPU relu rejects int64
  absl::Status s = exec.RunOp(MakeOp("relu", {{"X", {"x"}}}, {{"Out", {"a"}}}), &scope);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("int64"), std::string::npos) << s;
  EXPECT_TRUE(scope.FindVar("x")->Get<Tensor>().place().is_cpu());
}

TEST_F(PlacementTest, TensorCopiesAcrossPlaces) {
  Tensor host(FLOAT32, {5});
  for (int i = 0; i < 5; ++i) host.data<float>()[i] = static_cast<float>(i);
  Tensor dev;
  dev.ResetPlace(Place::Gpu(0));
  const int copies = Backend()->copies;
  dev.CopyFrom(host);
  EXPECT_TRUE(dev.place().is_gpu());
  Tensor clone = dev.Clone();
  EXPECT_TRUE(clone.place().is_gpu());
  Tensor back;
  back.CopyFrom(clone);
  EXPECT_TRUE(back.place().is_cpu());
  EXPECT_EQ(Backend()->copies - copies, 3);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(back.data<float>()[i], static_cast<float>(i));
  dev.SetZero();
  back.CopyFrom(dev);
  for (int i = 0; i < 5; ++i) EXPECT_EQ(back.data<float>()[i], 0.0f);
  back.CopyFrom(host);
  dev.CopyFrom(back);
  EXPECT_EQ(dev.DebugString(), "float32[5]@gpu:0");
  TensorProto proto;
  TensorToProto(dev, &proto);  // from a host copy
  EXPECT_EQ(proto.data().size(), 5 * sizeof(float));
  Tensor restored;
  restored.ResetPlace(Place::Gpu(0));
  ASSERT_TRUE(TensorFromProto(proto, &restored).ok());
  EXPECT_TRUE(restored.place().is_cpu());
  for (int i = 0; i < 5; ++i) EXPECT_EQ(restored.data<float>()[i], static_cast<float>(i));
  dev.ResetPlace(Place::Cpu());  // contents dropped, shape kept
  EXPECT_TRUE(dev.place().is_cpu());
  EXPECT_EQ(dev.shape(), Shape{5});
}

// Device failures are the op's Status (the process goes on): out of memory while moving an
// input to the device fails the op with one line naming the device, the variable and the op,
// and leaves the input where it was.
TEST_F(PlacementTest, OutOfMemoryMovingAnInputFailsTheOp) {
  auto placed = MakePlacedRegistry(cpu_, Place::Gpu(0), table_);
  ASSERT_TRUE(placed.ok());
  Executor exec(placed->get());
  Scope scope;
  Feed(&scope);
  const OpDesc relu = MakeOp("relu", {{"X", {"x"}}}, {{"Out", {"a"}}});
  Backend()->allocations_left = 0;
  absl::Status s = exec.RunOp(relu, &scope);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_EQ(s.message(),
            "out of memory on gpu:0 allocating 48 bytes (injected), moving 'x' float32[3, 4] to "
            "gpu:0 (op #0 relu(X=x))");
  EXPECT_EQ(Backend()->failed_allocations, 1);
  ExpectFed(scope);
  Backend()->Disarm();  // memory again: the same op runs
  s = exec.RunOp(relu, &scope);
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_TRUE(scope.FindVar("a")->Get<Tensor>().place().is_gpu());
}

// PlacedOutput allocates the output on the device: out of memory there fails the op too.
TEST_F(PlacementTest, OutOfMemoryAllocatingAnOutputFailsTheOp) {
  auto placed = MakePlacedRegistry(cpu_, Place::Gpu(0), table_);
  ASSERT_TRUE(placed.ok());
  Executor exec(placed->get());
  Scope scope;
  Feed(&scope);
  const OpDesc relu = MakeOp("relu", {{"X", {"x"}}}, {{"Out", {"a"}}});
  Backend()->allocations_left = 1;  // x moves, a does not fit
  absl::Status s = exec.RunOp(relu, &scope);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_EQ(s.message(),
            "out of memory on gpu:0 allocating 48 bytes (injected), for output 'a' float32[3, 4] "
            "on gpu:0 (op #0 relu(X=x))");
  EXPECT_FALSE(scope.FindVar("a")->Get<Tensor>().initialized());
  Backend()->Disarm();
  s = exec.RunOp(relu, &scope);
  ASSERT_TRUE(s.ok()) << s;
  ASSERT_TRUE(MoveScopeToHost(&scope).ok());
  const Tensor& a = scope.FindVar("a")->Get<Tensor>();
  for (int i = 0; i < 12; ++i) {
    EXPECT_EQ(a.data<float>()[i], std::max(0.0f, static_cast<float>(i % 5) - 2.0f));
  }
}

// A failed copy to the device (the device runtime's error) fails the op with that error.
TEST_F(PlacementTest, FailedCopyToTheDeviceFailsTheOp) {
  auto placed = MakePlacedRegistry(cpu_, Place::Gpu(0), table_);
  ASSERT_TRUE(placed.ok());
  Executor exec(placed->get());
  Scope scope;
  Feed(&scope);
  Backend()->to_device_error = absl::InternalError(
      "gpu:0: copying 48 bytes from the host: cudaMemcpyAsync(host to device): "
      "cudaErrorLaunchFailure: unspecified launch failure");
  absl::Status s = exec.RunOp(MakeOp("relu", {{"X", {"x"}}}, {{"Out", {"a"}}}), &scope);
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal) << s;
  EXPECT_TRUE(Has(s,
                  "gpu:0: copying 48 bytes from the host: cudaMemcpyAsync(host to device): "
                  "cudaErrorLaunchFailure: unspecified launch failure, moving 'x' "
                  "float32[3, 4] to gpu:0 (op #0 relu(X=x))"))
      << s;
  ExpectFed(scope);
}

// The CPU fallback brings a placed registry's CPU kernel its inputs from the device: a failed
// copy there fails that op before its kernel runs; MoveVarsToHost and MoveScopeToHost (host
// code reading results) return the same error.
TEST_F(PlacementTest, FailedCopyToTheHostFailsTheCpuKernelsOp) {
  auto placed = MakePlacedRegistry(cpu_, Place::Gpu(0), table_);
  ASSERT_TRUE(placed.ok());
  Executor exec(placed->get());
  Scope scope;
  Feed(&scope);
  ASSERT_TRUE(exec.RunOp(MakeOp("relu", {{"X", {"x"}}}, {{"Out", {"a"}}}), &scope).ok());
  Backend()->to_host_error = IllegalAddress();
  absl::Status s = exec.RunOp(MakeOp("sigmoid", {{"X", {"a"}}}, {{"Out", {"b"}}}), &scope);
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal) << s;
  EXPECT_EQ(s.message(), absl::StrCat(IllegalAddress().message(),
                                      ", moving 'a' float32[3, 4]@gpu:0 to cpu (op #0 "
                                      "sigmoid(X=a))"));
  const Variable* b = scope.FindVar("b");  // the kernel did not run
  EXPECT_TRUE(b == nullptr || !b->Get<Tensor>().initialized());
  EXPECT_TRUE(scope.FindVar("a")->Get<Tensor>().place().is_gpu());
  s = MoveVarsToHost(&scope, {"a"});
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal) << s;
  EXPECT_TRUE(Has(s, "moving 'a' float32[3, 4]@gpu:0 to cpu")) << s;
  EXPECT_EQ(MoveScopeToHost(&scope).code(), absl::StatusCode::kInternal);
  EXPECT_EQ(MoveToPlace(scope.FindVar("a"), Place::Cpu()).code(), absl::StatusCode::kInternal);
  ReleaseVarsToHost(&scope, {"a"});  // reads nothing from the device: cannot fail
  EXPECT_TRUE(scope.FindVar("a")->Get<Tensor>().place().is_cpu());
  Backend()->Disarm();
  ASSERT_TRUE(exec.RunOp(MakeOp("relu", {{"X", {"x"}}}, {{"Out", {"a"}}}), &scope).ok());
  ASSERT_TRUE(exec.RunOp(MakeOp("sigmoid", {{"X", {"a"}}}, {{"Out", {"b"}}}), &scope).ok());
  EXPECT_TRUE(MoveVarsToHost(&scope, {"a", "b", "missing"}).ok());
  EXPECT_TRUE(scope.FindVar("a")->Get<Tensor>().place().is_cpu());
}

// Tensor's Try forms return the backend's errors and leave the tensor as it was.
TEST_F(PlacementTest, TensorTryFormsReturnDeviceFailures) {
  Tensor host(FLOAT32, {4});
  for (int i = 0; i < 4; ++i) host.data<float>()[i] = static_cast<float>(i);
  Tensor dev;
  ASSERT_TRUE(dev.TryResetPlace(Place::Gpu(0)).ok());  // uninitialized: nothing allocated
  Backend()->allocations_left = 0;
  EXPECT_EQ(dev.TryResize(FLOAT32, {1000}).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_FALSE(dev.initialized());
  EXPECT_EQ(dev.TryCopyFrom(host).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(host.TryResetPlace(Place::Gpu(0)).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(host.place().is_cpu());
  EXPECT_EQ(host.data<float>()[3], 3.0f);
  Variable var;
  *var.GetMutable<Tensor>() = host;
  EXPECT_EQ(ReleaseToPlace(&var, Place::Gpu(0)).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(MoveToPlace(&var, Place::Gpu(0)).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(var.Get<Tensor>().place().is_cpu());
  Backend()->Disarm();
  ASSERT_TRUE(dev.TryCopyFrom(host).ok());
  ASSERT_TRUE(dev.TrySetZero().ok());
  Backend()->to_host_error = IllegalAddress();
  Tensor back;
  EXPECT_EQ(back.TryCopyFrom(dev), IllegalAddress());
  Backend()->Disarm();
  ASSERT_TRUE(back.TryCopyFrom(dev).ok());
  EXPECT_EQ(back.data<float>()[3], 0.0f);
  // A GPU place without a device runtime: an error, not an abort.
  SetDeviceBackend(nullptr);
  Tensor orphan;
  ASSERT_TRUE(orphan.TryResetPlace(Place::Gpu(1)).ok());
  absl::Status s = orphan.TryResize(FLOAT32, {2});
  SetDeviceBackend(Backend());
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_TRUE(Has(s, "gpu:1")) << s;
}

// What is left: a Tensor method without a Status (here Resize, which a device kernel should
// leave to PlacedOutput or TryResize) ends the process on a device failure, with its message.
TEST(PlacementDeathTest, TensorMethodsWithoutAStatusAbortOnADeviceFailure) {
  Backend()->Disarm();
  Tensor dev;
  dev.ResetPlace(Place::Gpu(0));
  Backend()->allocations_left = 0;
  EXPECT_DEATH(dev.Resize(FLOAT32, {8}),
               "device failure under Tensor::Resize.*out of memory on gpu:0 allocating 32 bytes");
  Backend()->Disarm();
}

}  // namespace
}  // namespace tessera
