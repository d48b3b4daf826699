#include "common/device/placement.h"

#include <cmath>
#include <cstdlib>
#include <cstring>

#include "common/device/caching_allocator.h"
#include "common/executor.h"
#include "common/ops/ops.h"
#include "common/status.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

// A "GPU" whose memory is host memory from a caching allocator: placement's bookkeeping runs
// for real (places, copies, fallbacks) and kernels written in host code can check it.
class FakeGpuBackend : public DeviceBackend {
 public:
  FakeGpuBackend()
      : alloc_([](size_t n) { return std::malloc(n); }, [](void* p) { std::free(p); }) {}
  std::shared_ptr<char> Allocate(const Place& place, size_t bytes) override {
    EXPECT_TRUE(place.is_gpu());
    return alloc_.AllocateShared(bytes);
  }
  void Copy(void* dst, const Place& dst_place, const void* src, const Place& src_place,
            size_t bytes) override {
    EXPECT_TRUE(dst_place.is_gpu() || src_place.is_gpu());
    ++copies;
    std::memcpy(dst, src, bytes);
  }
  void SetZero(const Place& place, void* p, size_t bytes) override { std::memset(p, 0, bytes); }
  CachingAllocator alloc_;
  int copies = 0;
};

FakeGpuBackend* Backend() {
  static auto* b = [] {
    auto* fake = new FakeGpuBackend();
    SetDeviceBackend(fake);
    return fake;
  }();
  return b;
}

// relu on the fake GPU: fails unless placement put X there; float32 only (else: CPU kernel).
absl::StatusOr<bool> FakeGpuRelu(OpContext& ctx, const Place& place) {
  TS_ASSIGN_OR_RETURN(const Tensor* x, ctx.Input("X"));
  if (x->dtype() != FLOAT32) return false;
  TS_ASSIGN_OR_RETURN(x, PlacedInput(ctx, "X", place));
  if (x->place() != place) return absl::InternalError("X not moved to the device");
  TS_ASSIGN_OR_RETURN(Tensor * out, PlacedOutput(ctx, "Out", place));
  if (out != x) out->Resize(x->dtype(), x->shape());
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
    Backend();
    ASSERT_TRUE(RegisterStandardOps(&cpu_).ok());
    ASSERT_TRUE(cpu_.Register("check_host", {CheckHost, nullptr}).ok());
    ASSERT_TRUE(table_.Register("relu", FakeGpuRelu).ok());
  }
  void Feed(Scope* scope) {
    Tensor* x = scope->Var("x")->GetMutable<Tensor>();
    x->Resize(FLOAT32, {3, 4});
    for (int i = 0; i < 12; ++i) x->data<float>()[i] = static_cast<float>(i % 5) - 2.0f;
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
  EXPECT_TRUE(scope.FindVar("x")->Get<Tensor>().place().is_gpu());
  EXPECT_TRUE(scope.FindVar("a")->Get<Tensor>().place().is_cpu());
  EXPECT_TRUE(scope.FindVar("loss")->Get<Tensor>().place().is_cpu());
  MoveScopeToHost(&scope);
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

}  // namespace
}  // namespace tessera
