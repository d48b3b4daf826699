// CudaDevice on a real GPU: the caching allocator reuses blocks (no cudaMalloc after warm-up),
// staged host<->device copies round-trip, pinned buffers are recycled, Tensor moves between
// places through the registered backend, and running out of device memory is a Status.
#include <cstring>
#include <numeric>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/device/cuda/cuda_device.h"
#include "common/device/cuda/gpu_ops.h"
#include "common/device/cuda/gpu_test_main.h"
#include "common/framework/executor.h"
#include "common/framework/op_desc.h"
#include "common/ops/ops.h"
#include "common/framework/tensor.h"

namespace tessera {
namespace {

TEST(CudaDeviceTest, AllocatorReusesBlocksAcrossSteps) {
  auto dev = CudaDevice::Get(0);
  ASSERT_TRUE(dev.ok()) << dev.status();
  const std::vector<size_t> step = {128 * 784 * 4, 784 * 512 * 4, 128 * 512 * 4, 512 * 4, 40};
  int64_t misses_after_warmup = 0, peak_after_warmup = 0;
  for (int s = 0; s < 10; ++s) {
    std::vector<std::shared_ptr<char>> live;
    for (size_t n : step) {
      live.push_back((*dev)->Allocate(n));
      ASSERT_NE(live.back(), nullptr);
    }
    live.clear();
    if (s == 0) {
      misses_after_warmup = (*dev)->device_stats().misses;
      peak_after_warmup = (*dev)->device_stats().peak_bytes_in_use;
    }
  }
  EXPECT_EQ((*dev)->device_stats().misses, misses_after_warmup);
  EXPECT_EQ((*dev)->device_stats().peak_bytes_in_use, peak_after_warmup);
  EXPECT_GE((*dev)->device_stats().hits, static_cast<int64_t>(9 * step.size()));
}

TEST(CudaDeviceTest, StagedCopiesRoundTrip) {
  auto dev = CudaDevice::Get(0);
  ASSERT_TRUE(dev.ok()) << dev.status();
  std::vector<float> host(100000);
  std::iota(host.begin(), host.end(), 0.5f);
  std::shared_ptr<char> d = (*dev)->Allocate(host.size() * sizeof(float));
  ASSERT_TRUE((*dev)->CopyToDevice(d.get(), host.data(), host.size() * sizeof(float)).ok());
  std::vector<float> scratch = host;
  std::fill(host.begin(), host.end(), -1.0f);  // the source may be reused at once
  std::vector<float> back(host.size());
  ASSERT_TRUE((*dev)->CopyToHost(back.data(), d.get(), back.size() * sizeof(float)).ok());
  EXPECT_EQ(back, scratch);
  const int64_t pinned_misses = (*dev)->pinned_stats().misses;
  for (int i = 0; i < 5; ++i) {
    ASSERT_TRUE((*dev)->CopyToDevice(d.get(), scratch.data(), scratch.size() * 4).ok());
    ASSERT_TRUE((*dev)->Synchronize().ok());
  }
  EXPECT_EQ((*dev)->pinned_stats().misses, pinned_misses);  // staging buffers recycled
}

TEST(CudaDeviceTest, TensorMovesThroughTheBackend) {
  ASSERT_NE(GetDeviceBackend(), nullptr);
  ASSERT_TRUE(CheckPlaceAvailable(Place::Gpu(0)).ok());
  EXPECT_FALSE(CheckPlaceAvailable(Place::Gpu(CudaDeviceCount())).ok());
  Tensor host(FLOAT32, {3, 5});
  for (int i = 0; i < 15; ++i) host.data<float>()[i] = static_cast<float>(i * i);
  Tensor dev;
  dev.ResetPlace(Place::Gpu(0));
  dev.CopyFrom(host);
  Tensor dev2 = dev.Clone();
  EXPECT_TRUE(dev2.place().is_gpu());
  Tensor back;
  back.CopyFrom(dev2);
  for (int i = 0; i < 15; ++i) EXPECT_EQ(back.data<float>()[i], static_cast<float>(i * i));
  dev.SetZero();
  back.CopyFrom(dev);
  for (int i = 0; i < 15; ++i) EXPECT_EQ(back.data<float>()[i], 0.0f);
  EXPECT_NE(PlaceMemoryReport(Place::Gpu(0)).find("gpu:0 memory: in use"), std::string::npos)
      << PlaceMemoryReport(Place::Gpu(0));
  EXPECT_EQ(PlaceMemoryReport(Place::Cpu()), "");
}

// More bytes than the device has: ResourceExhausted naming gpu:0 and the size (never an
// abort) from the backend, CudaDevice::TryAllocate, Tensor::TryResize and a placed op whose
// output does not fit; the device stays usable afterwards.
TEST(CudaDeviceTest, OutOfMemoryIsAStatusNamingTheDevice) {
  auto dev = CudaDevice::Get(0);
  ASSERT_TRUE(dev.ok()) << dev.status();
  size_t free = 0, total = 0;
  ASSERT_EQ(cudaMemGetInfo(&free, &total), cudaSuccess);
  const size_t too_many = 2 * total;
  const std::string oom = absl::StrCat("out of memory on gpu:0 allocating ", too_many, " bytes");
  DeviceBackend* backend = GetDeviceBackend();
  ASSERT_NE(backend, nullptr);
  absl::StatusOr<std::shared_ptr<char>> p = backend->Allocate(Place::Gpu(0), too_many);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), absl::StatusCode::kResourceExhausted) << p.status();
  EXPECT_NE(p.status().message().find(oom), std::string::npos) << p.status();
  p = (*dev)->TryAllocate(too_many);
  EXPECT_EQ(p.status().code(), absl::StatusCode::kResourceExhausted) << p.status();
  EXPECT_NE(p.status().message().find(oom), std::string::npos) << p.status();

  const int64_t floats = static_cast<int64_t>(too_many / sizeof(float));
  Tensor t;
  ASSERT_TRUE(t.TryResetPlace(Place::Gpu(0)).ok());
  absl::Status s = t.TryResize(FLOAT32, {floats});
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_NE(s.message().find("out of memory on gpu:0"), std::string::npos) << s;
  EXPECT_FALSE(t.initialized());

  // fill_constant's GPU kernel allocates its output through PlacedOutput.
  OpRegistry cpu;
  ASSERT_TRUE(RegisterStandardOps(&cpu).ok());
  DeviceKernelTable kernels;
  ASSERT_TRUE(RegisterGpuKernels(&kernels).ok());
  auto placed = MakePlacedRegistry(cpu, Place::Gpu(0), kernels);
  ASSERT_TRUE(placed.ok()) << placed.status();
  Executor exec(placed->get());
  Scope scope;
  OpDesc fill = MakeOp("fill_constant", {}, {{"Out", {"f"}}});
  SetAttr(&fill, "shape", std::vector<int64_t>{floats});
  SetAttr(&fill, "value", 1.5f);
  s = exec.RunOp(fill, &scope);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_NE(s.message().find("out of memory on gpu:0"), std::string::npos) << s;
  EXPECT_NE(s.message().find("for output 'f'"), std::string::npos) << s;
  EXPECT_NE(s.message().find("fill_constant"), std::string::npos) << s;

  // Still usable: the same op with a shape that fits, read back on the host.
  OpDesc small = MakeOp("fill_constant", {}, {{"Out", {"f"}}});
  SetAttr(&small, "shape", std::vector<int64_t>{2, 3});
  SetAttr(&small, "value", 1.5f);
  s = exec.RunOp(small, &scope);
  ASSERT_TRUE(s.ok()) << s;
  ASSERT_TRUE(MoveVarsToHost(&scope, {"f"}).ok());
  const Tensor& f = scope.FindVar("f")->Get<Tensor>();
  ASSERT_TRUE(f.place().is_cpu());
  ASSERT_EQ(f.numel(), 6);
  for (int i = 0; i < 6; ++i) EXPECT_EQ(f.data<float>()[i], 1.5f);
}

}  // namespace
}  // namespace tessera

TESSERA_GPU_TEST_MAIN()
