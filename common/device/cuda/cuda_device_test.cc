// CudaDevice on a real GPU: the caching allocator reuses blocks (no cudaMalloc after warm-up),
// staged host<->device copies round-trip, pinned buffers are recycled, and Tensor moves
// between places through the registered backend.
#include <cstring>
#include <numeric>
#include <vector>

#include "common/device/cuda/cuda_device.h"
#include "common/device/cuda/gpu_ops.h"
#include "common/device/cuda/gpu_test_main.h"
#include "common/tensor.h"

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

}  // namespace
}  // namespace tessera

TESSERA_GPU_TEST_MAIN()
