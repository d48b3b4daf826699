// Context: accessors before and after Init, each init method with ranks as threads (TCP with
// rank 0's store server, FILE_SYSTEM with a fresh directory), device ids, and bad parameters.
// (MPI needs mpirun: tests/collective_cluster_test.cc.)
#include "common/collective/context.h"

#include <unistd.h>

#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/collective/test_util.h"
#include "gtest/gtest.h"

namespace tessera {
namespace collective {
namespace {

std::string FreshDir(const std::string& name) {
  static int counter = 0;
  const char* base = std::getenv("TEST_TMPDIR");
  return absl::StrCat(base != nullptr ? base : "/tmp", "/", name, "_", ::getpid(), "_", counter++);
}

TEST(ContextTest, UninitializedAccessors) {
  Context ctx;
  EXPECT_FALSE(ctx.IsInitialized());
  EXPECT_EQ(ctx.Backend(), BackendType::kNone);
  EXPECT_EQ(ctx.Rank(), 0);
  EXPECT_EQ(ctx.WorldSize(), 1);
  EXPECT_EQ(ctx.DeviceId(), 0);
  EXPECT_EQ(ctx.world(), nullptr);
  EXPECT_TRUE(absl::IsFailedPrecondition(ctx.NewGroup({0}).status()));
  EXPECT_TRUE(ctx.Shutdown().ok());
}

// Every rank joins with `method`, then checks accessors and runs a few collectives.
void JoinAndCheck(InitMethod method, int world, const InitParams& params) {
  std::vector<std::thread> threads;
  for (int r = 0; r < world; ++r) {
    threads.emplace_back([&, r] {
      Context ctx;
      absl::Status s = ctx.Init(method, r, world, params);
      ASSERT_TRUE(s.ok()) << InitMethodName(method) << " rank " << r << ": " << s;
      EXPECT_TRUE(ctx.IsInitialized());
      EXPECT_EQ(ctx.Backend(), BackendType::kGloo);
      EXPECT_EQ(ctx.Rank(), r);
      EXPECT_EQ(ctx.WorldSize(), world);
      EXPECT_EQ(ctx.DeviceId(), r % params.max_devices_per_node);
      EXPECT_TRUE(absl::IsFailedPrecondition(ctx.Init(method, r, world, params)));
      std::vector<double> x = {1.0 * r, 2.0};
      ASSERT_TRUE(ctx.world()->AllReduce(absl::MakeSpan(x), ReduceOp::kSum).ok());
      EXPECT_EQ(x[0], world * (world - 1) / 2.0);
      EXPECT_EQ(x[1], 2.0 * world);
      auto group = ctx.NewGroup({0});
      ASSERT_TRUE(group.ok()) << group.status();
      EXPECT_EQ(*group == nullptr, r != 0);
      EXPECT_TRUE(ctx.Shutdown().ok());
      EXPECT_FALSE(ctx.IsInitialized());
      EXPECT_EQ(ctx.WorldSize(), 1);
    });
  }
  for (auto& t : threads) t.join();
}

class ContextInitTest : public ::testing::TestWithParam<int> {};

TEST_P(ContextInitTest, Tcp) {
  auto endpoint = FreeLoopbackEndpoint();
  ASSERT_TRUE(endpoint.ok());
  InitParams params;
  params.endpoint = *endpoint;
  params.timeout = absl::Seconds(30);
  params.max_devices_per_node = 2;
  JoinAndCheck(InitMethod::kTcp, GetParam(), params);
}

TEST_P(ContextInitTest, FileSystem) {
  InitParams params;
  params.path = FreshDir("rendezvous");
  params.timeout = absl::Seconds(30);
  params.gloo.hostname = "127.0.0.1";
  JoinAndCheck(InitMethod::kFileSystem, GetParam(), params);
}

INSTANTIATE_TEST_SUITE_P(Ranks, ContextInitTest, ::testing::Values(1, 2, 3, 4),
                         [](const auto& info) { return absl::StrCat("world", info.param); });

TEST(ContextTest, JobIdSeparatesContextsSharingAStore) {
  auto store = std::make_shared<HashStore>();
  std::vector<std::thread> threads;
  for (int job = 0; job < 2; ++job) {
    for (int r = 0; r < 2; ++r) {
      threads.emplace_back([&, job, r] {
        InitParams params = ThreadRankParams();
        params.job_id = absl::StrCat("job", job);
        Context ctx;
        ASSERT_TRUE(ctx.InitWithStore(store, r, 2, params).ok());
        int64_t x = job * 10 + 1;
        ASSERT_TRUE(ctx.world()->AllReduce(absl::MakeSpan(&x, 1), ReduceOp::kSum).ok());
        EXPECT_EQ(x, 2 * (job * 10 + 1));
      });
    }
  }
  for (auto& t : threads) t.join();
}

TEST(ContextTest, BadParameters) {
  Context ctx;
  InitParams params;
  EXPECT_TRUE(absl::IsInvalidArgument(ctx.Init(InitMethod::kTcp, 0, 0, params)));
  EXPECT_TRUE(absl::IsInvalidArgument(ctx.Init(InitMethod::kTcp, 2, 2, params)));
  EXPECT_TRUE(absl::IsInvalidArgument(ctx.Init(InitMethod::kTcp, -1, 2, params)));
  params.endpoint = "no-port";
  absl::Status s = ctx.Init(InitMethod::kTcp, 0, 1, params);
  EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
  EXPECT_NE(s.message().find("no-port"), std::string::npos);
  params.endpoint = "127.0.0.1:0";
  EXPECT_TRUE(absl::IsInvalidArgument(ctx.Init(InitMethod::kTcp, 0, 1, params)));
  params = InitParams();
  EXPECT_TRUE(absl::IsInvalidArgument(ctx.Init(InitMethod::kFileSystem, 0, 1, params)));
  params = ThreadRankParams();
  params.max_devices_per_node = 0;
  EXPECT_TRUE(
      absl::IsInvalidArgument(ctx.InitWithStore(std::make_shared<HashStore>(), 0, 1, params)));
  params = ThreadRankParams();
  params.backend = BackendType::kNone;
  EXPECT_TRUE(
      absl::IsInvalidArgument(ctx.InitWithStore(std::make_shared<HashStore>(), 0, 1, params)));
  EXPECT_FALSE(ctx.IsInitialized());
  // A TCP rank whose rank 0 never starts gives up after the timeout, naming the endpoint.
  auto endpoint = FreeLoopbackEndpoint();
  ASSERT_TRUE(endpoint.ok());
  params = InitParams();
  params.endpoint = *endpoint;
  params.timeout = absl::Milliseconds(300);
  s = ctx.Init(InitMethod::kTcp, 1, 2, params);
  EXPECT_TRUE(absl::IsDeadlineExceeded(s)) << s;
  EXPECT_NE(s.message().find(*endpoint), std::string::npos);
}

#ifndef TESSERA_WITH_NCCL
TEST(ContextTest, NcclNeedsACudaBuild) {
  Context ctx;
  InitParams params = ThreadRankParams();
  params.backend = BackendType::kNccl;
  absl::Status s = ctx.InitWithStore(std::make_shared<HashStore>(), 0, 1, params);
  EXPECT_TRUE(absl::IsUnimplemented(s)) << s;
}
#endif

TEST(ContextTest, DeviceIdFromLocalRank) {
  InitParams params = ThreadRankParams();
  params.max_devices_per_node = 4;
  params.local_rank = 6;
  Context ctx;
  ASSERT_TRUE(ctx.InitWithStore(std::make_shared<HashStore>(), 0, 1, params).ok());
  EXPECT_EQ(ctx.LocalRank(), 6);
  EXPECT_EQ(ctx.DeviceId(), 2);
  // A trainer names its GPU (--devices): that one, whatever its local rank.
  params.device_id = 3;
  Context named;
  ASSERT_TRUE(named.InitWithStore(std::make_shared<HashStore>(), 0, 1, params).ok());
  EXPECT_EQ(named.DeviceId(), 3);
}

TEST(ContextTest, ParseNames) {
  EXPECT_EQ(*ParseBackend("gloo"), BackendType::kGloo);
  EXPECT_EQ(*ParseBackend("nccl"), BackendType::kNccl);
  EXPECT_FALSE(ParseBackend("mpi").ok());
  EXPECT_EQ(*ParseInitMethod("tcp"), InitMethod::kTcp);
  EXPECT_EQ(*ParseInitMethod("file_system"), InitMethod::kFileSystem);
  EXPECT_EQ(*ParseInitMethod("mpi"), InitMethod::kMpi);
  EXPECT_FALSE(ParseInitMethod("nfs").ok());
}

}  // namespace
}  // namespace collective
}  // namespace tessera
