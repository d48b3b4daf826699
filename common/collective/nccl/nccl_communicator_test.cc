// The NCCL backend on this machine's GPU(s): one rank per device as threads (a single GPU gives
// world size 1, which still runs every operation through NCCL and the host staging path).
// Skips when CUDA reports no device.
#include "common/collective/nccl/nccl_communicator.h"

#include <cuda_runtime.h>

#include <thread>
#include <vector>

#include "common/collective/context.h"
#include "common/collective/reducer.h"
#include "gtest/gtest.h"

namespace tessera {
namespace collective {
namespace {

int DeviceCount() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) return 0;
  return n;
}

TEST(NcclCommunicatorTest, EveryOperationOnHostAndDeviceBuffers) {
  const int world = DeviceCount();
  if (world == 0) GTEST_SKIP() << "no CUDA device";
  auto store = std::make_shared<HashStore>();
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      InitParams params;
      params.backend = BackendType::kNccl;
      params.timeout = absl::Seconds(60);
      // Rank r on GPU r, named as a trainer names its --devices ordinal (every rank's local
      // rank 0 would otherwise put all of them on GPU 0).
      params.local_rank = 0;
      params.device_id = r;
      Context ctx;
      absl::Status s = ctx.InitWithStore(store, r, world, params);
      ASSERT_TRUE(s.ok()) << s;
      EXPECT_EQ(ctx.Backend(), BackendType::kNccl);
      EXPECT_EQ(ctx.DeviceId(), r);
      Communicator* comm = ctx.world();
      for (size_t n : {size_t{1}, size_t{7}, size_t{1} << 20}) {
        // Host memory (staged).
        std::vector<float> x(n, static_cast<float>(r + 1)), all(n * world);
        ASSERT_TRUE(comm->AllReduce(absl::MakeSpan(x), ReduceOp::kSum).ok());
        EXPECT_EQ(x[n - 1], world * (world + 1) / 2.0f);
        ASSERT_TRUE(comm->AllReduce(absl::MakeSpan(x), ReduceOp::kAvg).ok());
        EXPECT_EQ(x[0], world * (world + 1) / 2.0f);
        ASSERT_TRUE(comm->AllGather(x.data(), all.data(), n, ElementType::kFloat32).ok());
        EXPECT_EQ(all[n * world - 1], x[n - 1]);
        std::vector<float> part(n);
        ASSERT_TRUE(
            comm->ReduceScatter(all.data(), part.data(), n, ElementType::kFloat32, ReduceOp::kMax)
                .ok());
        EXPECT_EQ(part[0], x[0]);
        std::vector<int64_t> b(n, r);
        ASSERT_TRUE(comm->Broadcast(absl::MakeSpan(b), world - 1).ok());
        EXPECT_EQ(b[n / 2], world - 1);
        // Device memory (direct).
        float* d = nullptr;
        ASSERT_EQ(cudaMalloc(&d, n * sizeof(float)), cudaSuccess);
        std::vector<float> ones(n, 1.0f);
        ASSERT_EQ(cudaMemcpy(d, ones.data(), n * sizeof(float), cudaMemcpyHostToDevice),
                  cudaSuccess);
        ASSERT_TRUE(comm->AllReduce(d, d, n, ElementType::kFloat32, ReduceOp::kSum).ok());
        ASSERT_EQ(cudaMemcpy(ones.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost),
                  cudaSuccess);
        EXPECT_EQ(ones[n - 1], static_cast<float>(world));
        cudaFree(d);
      }
      ASSERT_TRUE(comm->Barrier().ok());
      // The tensor helpers work on host tensors through the NCCL backend.
      Tensor g(FLOAT32, {100});
      for (int i = 0; i < 100; ++i) g.data<float>()[i] = r + i;
      ASSERT_TRUE(AllReduce(comm, &g).ok());
      EXPECT_NEAR(g.data<float>()[10], (world - 1) / 2.0f + 10, 1e-5);
      EXPECT_TRUE(ctx.Shutdown().ok());
    });
  }
  for (auto& t : threads) t.join();
}

}  // namespace
}  // namespace collective
}  // namespace tessera
