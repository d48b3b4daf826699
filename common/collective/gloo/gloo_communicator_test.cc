// Every collective of the Gloo backend with ranks as threads of this process: rank counts 1-4,
// sizes 0, 1, odd and large, every element type and reduction, isend/irecv, groups, ordering of
// async operations, errors and timeouts.
#include "common/collective/gloo/gloo_communicator.h"

#include <signal.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/collective/context.h"
#include "common/collective/half.h"
#include "common/collective/test_util.h"
#include "gtest/gtest.h"

namespace tessera {
namespace collective {
namespace {

const std::vector<size_t> kSizes = {0, 1, 7, 1001, 262147};

// Small integers (exact in every type, fp16 included) that depend on rank and index.
double Value(int rank, size_t i, ElementType type) {
  const size_t period = type == ElementType::kFloat16 || type == ElementType::kUint8 ? 5 : 97;
  return static_cast<double>((rank + 1) * static_cast<int>(i % period + 1));
}

// A buffer of `count` elements of `type` holding doubles converted to the type.
struct Buffer {
  Buffer(ElementType t, size_t n) : type(t), count(n), bytes(n * ElementSize(t)) {}
  void Set(size_t i, double v) {
    switch (type) {
      case ElementType::kFloat16:
        reinterpret_cast<uint16_t*>(bytes.data())[i] = FloatToHalf(static_cast<float>(v));
        break;
      case ElementType::kFloat32:
        reinterpret_cast<float*>(bytes.data())[i] = static_cast<float>(v);
        break;
      case ElementType::kFloat64:
        reinterpret_cast<double*>(bytes.data())[i] = v;
        break;
      case ElementType::kInt32:
        reinterpret_cast<int32_t*>(bytes.data())[i] = static_cast<int32_t>(v);
        break;
      case ElementType::kInt64:
        reinterpret_cast<int64_t*>(bytes.data())[i] = static_cast<int64_t>(v);
        break;
      case ElementType::kUint8:
        bytes[i] = static_cast<uint8_t>(v);
        break;
    }
  }
  double Get(size_t i) const {
    switch (type) {
      case ElementType::kFloat16:
        return HalfToFloat(reinterpret_cast<const uint16_t*>(bytes.data())[i]);
      case ElementType::kFloat32:
        return reinterpret_cast<const float*>(bytes.data())[i];
      case ElementType::kFloat64:
        return reinterpret_cast<const double*>(bytes.data())[i];
      case ElementType::kInt32:
        return reinterpret_cast<const int32_t*>(bytes.data())[i];
      case ElementType::kInt64:
        return static_cast<double>(reinterpret_cast<const int64_t*>(bytes.data())[i]);
      case ElementType::kUint8:
        return bytes[i];
    }
    return 0;
  }
  void* data() { return bytes.empty() ? nullptr : bytes.data(); }

  ElementType type;
  size_t count;
  std::vector<uint8_t> bytes;
};

double Expected(ReduceOp op, int world, size_t i, ElementType type) {
  double sum = 0, mx = -1e300, mn = 1e300;
  for (int r = 0; r < world; ++r) {
    const double v = Value(r, i, type);
    sum += v;
    mx = std::max(mx, v);
    mn = std::min(mn, v);
  }
  switch (op) {
    case ReduceOp::kSum:
      return sum;
    case ReduceOp::kMax:
      return mx;
    case ReduceOp::kMin:
      return mn;
    case ReduceOp::kAvg:
      if (type == ElementType::kFloat16 || type == ElementType::kFloat32 ||
          type == ElementType::kFloat64) {
        return sum / world;
      }
      return std::floor(sum / world);
  }
  return 0;
}

// Checks all elements; stops at the first mismatch to keep failures readable.
void ExpectBuffer(const Buffer& b, const std::function<double(size_t)>& want,
                  const std::string& what) {
  const double tol = b.type == ElementType::kFloat16 ? 1e-2 : 1e-6;
  for (size_t i = 0; i < b.count; ++i) {
    const double w = want(i);
    if (std::fabs(b.Get(i) - w) > tol * std::max(1.0, std::fabs(w))) {
      ADD_FAILURE() << what << ": element " << i << " is " << b.Get(i) << ", want " << w;
      return;
    }
  }
}

class GlooCollectiveTest : public ::testing::TestWithParam<int> {};

TEST_P(GlooCollectiveTest, AllReduceEveryTypeOpAndSize) {
  const int world = GetParam();
  RunRanks(world, [&](Context& ctx) {
    Communicator* comm = ctx.world();
    const int rank = comm->rank();
    for (ElementType type : {ElementType::kFloat32, ElementType::kFloat64, ElementType::kInt32,
                             ElementType::kInt64, ElementType::kFloat16, ElementType::kUint8}) {
      for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax, ReduceOp::kMin}) {
        for (size_t n : kSizes) {
          if (type != ElementType::kFloat32 && n > 1001) continue;  // large: float32 only
          Buffer in(type, n), out(type, n);
          for (size_t i = 0; i < n; ++i) in.Set(i, Value(rank, i, type));
          const std::string what = absl::StrCat(ElementTypeName(type), " ", ReduceOpName(op),
                                                " n=", n, " world=", world, " rank=", rank);
          // Out of place, then in place.
          ASSERT_TRUE(comm->AllReduce(in.data(), out.data(), n, type, op).ok()) << what;
          ExpectBuffer(
              out, [&](size_t i) { return Expected(op, world, i, type); }, what);
          ASSERT_TRUE(comm->AllReduce(in.data(), in.data(), n, type, op).ok()) << what;
          ExpectBuffer(
              in, [&](size_t i) { return Expected(op, world, i, type); }, what + " in place");
        }
      }
    }
  });
}

TEST_P(GlooCollectiveTest, AllReduceAlgorithmsAgree) {
  const int world = GetParam();
  for (auto algorithm :
       {GlooOptions::AllReduceAlgorithm::kRing, GlooOptions::AllReduceAlgorithm::kBcube,
        GlooOptions::AllReduceAlgorithm::kHalvingDoubling}) {
    InitParams params = ThreadRankParams();
    params.gloo.all_reduce_algorithm = algorithm;
    params.gloo.ring_segment_bytes = 4096;  // many segments per chunk
    RunRanks(
        world,
        [&](Context& ctx) {
          Communicator* comm = ctx.world();
          for (size_t n : {size_t{1}, size_t{3}, size_t{1001}, size_t{1 << 18} + 5}) {
            for (ElementType type : {ElementType::kFloat32, ElementType::kFloat64}) {
              Buffer b(type, n);
              for (size_t i = 0; i < n; ++i) b.Set(i, Value(comm->rank(), i, type));
              for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax}) {
                Buffer work = b;
                ASSERT_TRUE(comm->AllReduce(work.data(), work.data(), n, type, op).ok());
                ExpectBuffer(
                    work, [&](size_t i) { return Expected(op, world, i, type); },
                    absl::StrCat("algorithm ", static_cast<int>(algorithm), " n=", n, " ",
                                 ReduceOpName(op)));
              }
            }
          }
        },
        params);
  }
}

TEST_P(GlooCollectiveTest, BroadcastFromEveryRoot) {
  const int world = GetParam();
  RunRanks(world, [&](Context& ctx) {
    Communicator* comm = ctx.world();
    for (int root = 0; root < world; ++root) {
      for (size_t n : kSizes) {
        for (ElementType type : {ElementType::kFloat32, ElementType::kInt64}) {
          Buffer b(type, n);
          for (size_t i = 0; i < n; ++i) b.Set(i, Value(comm->rank(), i, type));
          ASSERT_TRUE(comm->Broadcast(b.data(), n, type, root).ok());
          ExpectBuffer(
              b, [&](size_t i) { return Value(root, i, type); },
              absl::StrCat("broadcast root=", root, " n=", n));
        }
      }
    }
  });
}

TEST_P(GlooCollectiveTest, AllGather) {
  const int world = GetParam();
  RunRanks(world, [&](Context& ctx) {
    Communicator* comm = ctx.world();
    const int rank = comm->rank();
    for (size_t n : kSizes) {
      for (ElementType type : {ElementType::kFloat32, ElementType::kFloat64, ElementType::kUint8}) {
        Buffer in(type, n), out(type, n * world);
        for (size_t i = 0; i < n; ++i) in.Set(i, Value(rank, i, type));
        ASSERT_TRUE(comm->AllGather(in.data(), out.data(), n, type).ok());
        auto want = [&](size_t j) { return Value(static_cast<int>(j / n), j % n, type); };
        ExpectBuffer(out, want, absl::StrCat("all_gather n=", n));
        // In place: this rank's block already sits in the output.
        Buffer inplace(type, n * world);
        for (size_t i = 0; i < n; ++i) inplace.Set(rank * n + i, Value(rank, i, type));
        void* own = n == 0 ? nullptr : inplace.bytes.data() + rank * n * ElementSize(type);
        ASSERT_TRUE(comm->AllGather(own, inplace.data(), n, type).ok());
        ExpectBuffer(inplace, want, absl::StrCat("all_gather in place n=", n));
      }
    }
  });
}

TEST_P(GlooCollectiveTest, ReduceScatter) {
  const int world = GetParam();
  RunRanks(world, [&](Context& ctx) {
    Communicator* comm = ctx.world();
    const int rank = comm->rank();
    for (size_t n : kSizes) {
      for (ElementType type : {ElementType::kFloat32, ElementType::kInt32, ElementType::kFloat16}) {
        if (type != ElementType::kFloat32 && n > 1001) continue;
        for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax}) {
          Buffer in(type, n * world), out(type, n);
          for (size_t j = 0; j < n * world; ++j) in.Set(j, Value(rank, j, type));
          ASSERT_TRUE(comm->ReduceScatter(in.data(), out.data(), n, type, op).ok());
          ExpectBuffer(
              out, [&](size_t i) { return Expected(op, world, rank * n + i, type); },
              absl::StrCat("reduce_scatter ", ReduceOpName(op), " n=", n));
        }
      }
    }
  });
}

TEST_P(GlooCollectiveTest, BarrierWaitsForEveryRank) {
  const int world = GetParam();
  std::atomic<int> arrived{0};
  RunRanks(world, [&](Context& ctx) {
    for (int round = 1; round <= 3; ++round) {
      arrived.fetch_add(1);
      ASSERT_TRUE(ctx.world()->Barrier().ok());
      EXPECT_GE(arrived.load(), round * world);
      ASSERT_TRUE(ctx.world()->Barrier().ok());  // nobody starts the next round early
    }
  });
}

TEST_P(GlooCollectiveTest, SendRecvRingWithTags) {
  const int world = GetParam();
  if (world == 1) GTEST_SKIP() << "point-to-point needs two ranks";
  RunRanks(world, [&](Context& ctx) {
    Communicator* comm = ctx.world();
    const int rank = comm->rank();
    const int next = (rank + 1) % world;
    const int prev = (rank + world - 1) % world;
    for (size_t n : {size_t{1}, size_t{7}, size_t{262147}}) {
      // Two messages with different tags in flight; receives posted in the opposite order.
      std::vector<float> a(n), b(n), got_a(n, -1), got_b(n, -1);
      for (size_t i = 0; i < n; ++i) {
        a[i] = static_cast<float>(rank * 1000 + i % 100);
        b[i] = -a[i];
      }
      auto rb = comm->IRecv(got_b.data(), n, ElementType::kFloat32, prev, /*tag=*/2);
      auto ra = comm->IRecv(got_a.data(), n, ElementType::kFloat32, prev, /*tag=*/1);
      auto sa = comm->ISend(a.data(), n, ElementType::kFloat32, next, /*tag=*/1);
      auto sb = comm->ISend(b.data(), n, ElementType::kFloat32, next, /*tag=*/2);
      ASSERT_TRUE(ra->Wait().ok());
      ASSERT_TRUE(rb->Wait().ok());
      ASSERT_TRUE(sa->Wait().ok());
      ASSERT_TRUE(sb->Wait().ok());
      for (size_t i = 0; i < n; ++i) {
        ASSERT_EQ(got_a[i], static_cast<float>(prev * 1000 + i % 100)) << i;
        ASSERT_EQ(got_b[i], -got_a[i]) << i;
      }
    }
    // Blocking forms, and a zero-length message.
    int64_t token = rank;
    if (rank == 0) {
      ASSERT_TRUE(comm->Send(&token, 1, ElementType::kInt64, 1).ok());
      ASSERT_TRUE(comm->Recv(&token, 1, ElementType::kInt64, 1).ok());
      EXPECT_EQ(token, 101);
    } else if (rank == 1) {
      ASSERT_TRUE(comm->Recv(&token, 1, ElementType::kInt64, 0).ok());
      token += 101;
      ASSERT_TRUE(comm->Send(&token, 1, ElementType::kInt64, 0).ok());
    }
    EXPECT_TRUE(comm->ISend(nullptr, 0, ElementType::kInt64, next)->Wait().ok());
  });
}

TEST_P(GlooCollectiveTest, AsyncOperationsRunInIssueOrder) {
  const int world = GetParam();
  RunRanks(world, [&](Context& ctx) {
    Communicator* comm = ctx.world();
    const int rank = comm->rank();
    std::vector<std::vector<float>> bufs(4, std::vector<float>(10007));
    std::vector<std::unique_ptr<Request>> reqs;
    for (size_t k = 0; k < bufs.size(); ++k) {
      for (size_t i = 0; i < bufs[k].size(); ++i) bufs[k][i] = static_cast<float>(rank + k + i % 3);
      reqs.push_back(comm->AllReduceAsync(bufs[k].data(), bufs[k].data(), bufs[k].size(),
                                          ElementType::kFloat32, ReduceOp::kSum));
    }
    // A blocking collective issued after the async ones runs after them.
    std::vector<int64_t> b = {rank == 0 ? 42 : 0};
    ASSERT_TRUE(comm->Broadcast(absl::MakeSpan(b), 0).ok());
    EXPECT_EQ(b[0], 42);
    ASSERT_TRUE(WaitAll(reqs).ok());
    for (size_t k = 0; k < bufs.size(); ++k) {
      for (size_t i = 0; i < bufs[k].size(); ++i) {
        double want = 0;
        for (int r = 0; r < world; ++r) want += r + k + i % 3;
        ASSERT_EQ(bufs[k][i], want) << "buffer " << k << " element " << i;
      }
    }
    // A composite job runs its collectives inline, in order with the others.
    int64_t sum = rank;
    auto job = comm->Submit([&]() -> absl::Status {
      absl::Status s = comm->AllReduce(absl::MakeSpan(&sum, 1), ReduceOp::kSum);
      if (!s.ok()) return s;
      sum *= 2;
      return comm->Barrier();
    });
    ASSERT_TRUE(job->Wait().ok());
    EXPECT_EQ(sum, world * (world - 1));
  });
}

TEST_P(GlooCollectiveTest, GroupsOfSubsets) {
  const int world = GetParam();
  RunRanks(world, [&](Context& ctx) {
    const int rank = ctx.Rank();
    // Even ranks, then all ranks in reverse order (group rank i is world rank ranks[i]).
    std::vector<int> evens, reversed;
    for (int r = 0; r < world; r += 2) evens.push_back(r);
    for (int r = world - 1; r >= 0; --r) reversed.push_back(r);
    auto even_group = ctx.NewGroup(evens);
    ASSERT_TRUE(even_group.ok()) << even_group.status();
    if (rank % 2 == 1) {
      EXPECT_EQ(*even_group, nullptr);
    } else {
      Communicator* g = even_group->get();
      ASSERT_NE(g, nullptr);
      EXPECT_EQ(g->rank(), rank / 2);
      EXPECT_EQ(g->size(), static_cast<int>(evens.size()));
      std::vector<int64_t> x = {rank};
      ASSERT_TRUE(g->AllReduce(absl::MakeSpan(x), ReduceOp::kSum).ok());
      int64_t want = 0;
      for (int r : evens) want += r;
      EXPECT_EQ(x[0], want);
    }
    auto rev = ctx.NewGroup(reversed);
    ASSERT_TRUE(rev.ok()) << rev.status();
    Communicator* g = rev->get();
    ASSERT_NE(g, nullptr);
    EXPECT_EQ(g->rank(), world - 1 - rank);
    std::vector<int64_t> x(3, g->rank());
    ASSERT_TRUE(g->Broadcast(absl::MakeSpan(x), /*root=*/0).ok());  // world rank world-1
    EXPECT_EQ(x[2], 0);
    // A second group with the same members is a separate communicator.
    auto again = ctx.NewGroup(reversed);
    ASSERT_TRUE(again.ok()) << again.status();
    ASSERT_TRUE((*again)->Barrier().ok());
  });
}

TEST_P(GlooCollectiveTest, StatsCountPayloadBytes) {
  const int world = GetParam();
  RunRanks(world, [&](Context& ctx) {
    Communicator* comm = ctx.world();
    comm->ResetStats();
    std::vector<float> x(100, 1.0f), all(100 * world);
    ASSERT_TRUE(comm->AllReduce(absl::MakeSpan(x), ReduceOp::kSum).ok());
    ASSERT_TRUE(comm->AllReduce(absl::MakeSpan(x), ReduceOp::kSum).ok());
    ASSERT_TRUE(comm->Broadcast(absl::MakeSpan(x), 0).ok());
    ASSERT_TRUE(comm->AllGather(absl::MakeConstSpan(x), absl::MakeSpan(all)).ok());
    const CommStats s = comm->stats();
    EXPECT_EQ(s.of(OpKind::kAllReduce).calls, 2);
    EXPECT_EQ(s.of(OpKind::kAllReduce).bytes, 800);
    EXPECT_EQ(s.of(OpKind::kBroadcast).bytes, comm->rank() == 0 ? 400 : 0);
    EXPECT_EQ(s.of(OpKind::kAllGather).bytes, 400);
    EXPECT_EQ(s.bytes_sent(), 1200 + (comm->rank() == 0 ? 400 : 0));
  });
}

INSTANTIATE_TEST_SUITE_P(Ranks, GlooCollectiveTest, ::testing::Values(1, 2, 3, 4),
                         [](const auto& info) { return absl::StrCat("world", info.param); });

TEST(GlooCommunicatorTest, InvalidArgumentsSendNothing) {
  RunRanks(2, [&](Context& ctx) {
    Communicator* comm = ctx.world();
    float x = 1;
    EXPECT_TRUE(absl::IsInvalidArgument(comm->Broadcast(&x, 1, ElementType::kFloat32, 2)));
    EXPECT_TRUE(absl::IsInvalidArgument(comm->Broadcast(&x, 1, ElementType::kFloat32, -1)));
    EXPECT_TRUE(absl::IsInvalidArgument(
        comm->AllReduce(nullptr, nullptr, 3, ElementType::kFloat32, ReduceOp::kSum)));
    EXPECT_TRUE(
        absl::IsInvalidArgument(comm->ISend(&x, 1, ElementType::kFloat32, comm->rank())->Wait()));
    EXPECT_TRUE(absl::IsInvalidArgument(comm->IRecv(&x, 1, ElementType::kFloat32, 5)->Wait()));
    EXPECT_TRUE(absl::IsInvalidArgument(ctx.NewGroup({0, 0}).status()));
    EXPECT_TRUE(absl::IsInvalidArgument(ctx.NewGroup({0, 7}).status()));
    // Still usable.
    EXPECT_TRUE(comm->AllReduce(&x, &x, 1, ElementType::kFloat32, ReduceOp::kSum).ok());
    EXPECT_EQ(x, 2);
    EXPECT_TRUE(comm->health().ok());
  });
}

TEST(GlooCommunicatorTest, MissingPeerTimesOutAndBreaksCommunicator) {
  auto store = std::make_shared<HashStore>();
  InitParams params = ThreadRankParams();
  params.timeout = absl::Seconds(2);
  absl::Notification rank0_done;
  std::thread peer([&] {
    Context ctx;
    ASSERT_TRUE(ctx.InitWithStore(store, 1, 2, params).ok());
    // Rank 1 never joins the all-reduce; it stays connected until rank 0 gave up.
    rank0_done.WaitForNotificationWithTimeout(absl::Seconds(30));
  });
  Context ctx;
  ASSERT_TRUE(ctx.InitWithStore(store, 0, 2, params).ok());
  float x = 1;
  absl::Status s = ctx.world()->AllReduce(&x, &x, 1, ElementType::kFloat32, ReduceOp::kSum);
  EXPECT_TRUE(absl::IsDeadlineExceeded(s)) << s;
  absl::Status after = ctx.world()->Barrier();
  EXPECT_TRUE(absl::IsFailedPrecondition(after)) << after;
  EXPECT_FALSE(ctx.world()->health().ok());
  rank0_done.Notify();
  peer.join();
}

TEST(GlooCommunicatorTest, PeerLeavingIsAnErrorNotACrash) {
  auto store = std::make_shared<HashStore>();
  InitParams params = ThreadRankParams();
  params.timeout = absl::Seconds(20);
  std::thread peer([&] {
    Context ctx;
    ASSERT_TRUE(ctx.InitWithStore(store, 1, 2, params).ok());
    // Leaves without a word: its connections close while rank 0 is sending.
  });
  Context ctx;
  ASSERT_TRUE(ctx.InitWithStore(store, 0, 2, params).ok());
  peer.join();
  // Gloo's writes to a closed socket would raise SIGPIPE: the backend ignores it.
  struct sigaction action {};
  ASSERT_EQ(::sigaction(SIGPIPE, nullptr, &action), 0);
  EXPECT_EQ(action.sa_handler, SIG_IGN);
  std::vector<float> x(1 << 22, 1.0f);
  absl::Status s = ctx.world()->AllReduce(absl::MakeSpan(x), ReduceOp::kSum);
  EXPECT_TRUE(absl::IsUnavailable(s)) << s;
  EXPECT_TRUE(absl::IsFailedPrecondition(ctx.world()->Barrier()));
}

TEST(GlooCommunicatorTest, RendezvousTimesOutWhenARankIsMissing) {
  InitParams params = ThreadRankParams();
  params.timeout = absl::Milliseconds(500);
  Context ctx;
  absl::Status s = ctx.InitWithStore(std::make_shared<HashStore>(), 0, 2, params);
  EXPECT_FALSE(s.ok());
  EXPECT_FALSE(ctx.IsInitialized());
  EXPECT_EQ(ctx.Rank(), 0);
  EXPECT_EQ(ctx.WorldSize(), 1);
}

}  // namespace
}  // namespace collective
}  // namespace tessera
