// Gradient synchronization over the Gloo backend with ranks as threads: scale, async Sync(),
// coalescing, the two reducers, compression (values and bytes sent), broadcast of parameters
// and partial synchronization.
#include "common/collective/reducer.h"

#include <cmath>
#include <vector>

#include "common/collective/test_util.h"
#include "gtest/gtest.h"

namespace tessera {
namespace collective {
namespace {

// A deterministic float32 tensor of `n` elements for rank `rank` (seed picks the pattern).
Tensor Grad(int rank, int64_t n, int seed = 0) {
  Tensor t(FLOAT32, {n});
  for (int64_t i = 0; i < n; ++i) {
    t.data<float>()[i] = std::sin(0.37f * (i + 1) * (seed + 1) + rank) * (1 + (i % 7) * rank);
  }
  return t;
}

Tensor GradF64(int rank, int64_t n) {
  Tensor t(FLOAT64, {n});
  for (int64_t i = 0; i < n; ++i) t.data<double>()[i] = 0.25 * rank + i * 0.5;
  return t;
}

// Element-wise sum over `world` ranks of Grad(r, n, seed).
std::vector<double> SumOfGrads(int world, int64_t n, int seed = 0) {
  std::vector<double> sum(n, 0.0);
  for (int r = 0; r < world; ++r) {
    Tensor g = Grad(r, n, seed);
    for (int64_t i = 0; i < n; ++i) sum[i] += g.data<float>()[i];
  }
  return sum;
}

void ExpectNear(const Tensor& t, const std::vector<double>& want, double scale, double rtol,
                const std::string& what) {
  ASSERT_EQ(t.numel(), static_cast<int64_t>(want.size())) << what;
  for (int64_t i = 0; i < t.numel(); ++i) {
    const double got = t.dtype() == FLOAT32 ? t.data<float>()[i] : t.data<double>()[i];
    const double w = want[i] * scale;
    ASSERT_NEAR(got, w, rtol * std::max(1.0, std::fabs(w))) << what << " element " << i;
  }
}

class ReducerTest : public ::testing::TestWithParam<int> {};

TEST_P(ReducerTest, AllReduceTensorScalesAndSyncs) {
  const int world = GetParam();
  RunRanks(world, [&](Context& ctx) {
    Communicator* comm = ctx.world();
    const int rank = ctx.Rank();
    for (int64_t n : {0, 1, 7, 100003}) {
      Tensor mean = Grad(rank, n);
      ASSERT_TRUE(AllReduce(comm, &mean).ok());
      ExpectNear(mean, SumOfGrads(world, n), 1.0 / world, 1e-5, absl::StrCat("mean n=", n));

      ReduceOptions half_sum;
      half_sum.scale = 0.5;
      Tensor scaled = Grad(rank, n);
      auto pending = AllReduceAsync(comm, &scaled, half_sum);
      ASSERT_TRUE(pending->Sync().ok());
      ExpectNear(scaled, SumOfGrads(world, n), 0.5, 1e-5, absl::StrCat("0.5*sum n=", n));
    }
    Tensor d = GradF64(rank, 33);
    ReduceOptions sum;
    sum.scale = 1.0;
    ASSERT_TRUE(AllReduce(comm, &d, sum).ok());
    for (int64_t i = 0; i < 33; ++i) {
      EXPECT_DOUBLE_EQ(d.data<double>()[i], 0.25 * world * (world - 1) / 2 + world * i * 0.5);
    }
  });
}

TEST_P(ReducerTest, AllReduceMultipleCoalescedOrNot) {
  const int world = GetParam();
  RunRanks(world, [&](Context& ctx) {
    Communicator* comm = ctx.world();
    const int rank = ctx.Rank();
    const std::vector<int64_t> sizes = {5, 1, 1000, 0, 77};
    for (bool coalesce : {true, false}) {
      std::vector<Tensor> grads;
      for (size_t k = 0; k < sizes.size(); ++k) grads.push_back(Grad(rank, sizes[k], k));
      grads.push_back(GradF64(rank, 9));
      std::vector<Tensor*> ptrs;
      for (Tensor& g : grads) ptrs.push_back(&g);
      comm->ResetStats();
      MultiReduceOptions options;
      options.coalesce = coalesce;
      ASSERT_TRUE(AllReduceMultiple(comm, ptrs, options).ok());
      for (size_t k = 0; k < sizes.size(); ++k) {
        ExpectNear(grads[k], SumOfGrads(world, sizes[k], k), 1.0 / world, 1e-5,
                   absl::StrCat("coalesce=", coalesce, " tensor ", k));
      }
      // One operation per dtype when coalesced, one per tensor otherwise.
      EXPECT_EQ(comm->stats().of(OpKind::kAllReduce).calls,
                coalesce ? 2 : static_cast<int64_t>(grads.size()));
    }
  });
}

TEST_P(ReducerTest, InlineAndCoalescingReducersMatchAllReduceMultiple) {
  const int world = GetParam();
  RunRanks(world, [&](Context& ctx) {
    Communicator* comm = ctx.world();
    const int rank = ctx.Rank();
    // 100-float (400-byte) gradients and one of 500 floats, bucket of 1000 bytes:
    // buckets [g0 g1] [g2 g3] [big] [g4].
    const std::vector<int64_t> sizes = {100, 100, 100, 100, 500, 100};
    for (int kind = 0; kind < 2; ++kind) {
      CoalescingReducerOptions options;
      options.bucket_bytes = 1000;
      std::unique_ptr<GradientReducer> reducer;
      CoalescingReducer* coalescing = nullptr;
      if (kind == 0) {
        reducer = std::make_unique<InlineReducer>(comm);
      } else {
        auto c = std::make_unique<CoalescingReducer>(comm, options);
        coalescing = c.get();
        reducer = std::move(c);
      }
      for (int step = 0; step < 2; ++step) {
        std::vector<Tensor> grads;
        for (size_t k = 0; k < sizes.size(); ++k) grads.push_back(Grad(rank, sizes[k], k + step));
        comm->ResetStats();
        for (Tensor& g : grads) ASSERT_TRUE(reducer->Add(&g).ok());
        ASSERT_TRUE(reducer->Finalize().ok());
        for (size_t k = 0; k < sizes.size(); ++k) {
          ExpectNear(
              grads[k], SumOfGrads(world, sizes[k], k + step), 1.0 / world, 1e-5,
              absl::StrCat(kind == 0 ? "inline" : "coalescing", " step ", step, " grad ", k));
        }
        EXPECT_EQ(comm->stats().of(OpKind::kAllReduce).calls, kind == 0 ? 6 : 4);
      }
      if (coalescing != nullptr) {
        EXPECT_EQ(coalescing->buckets_flushed(), 8);
      }
    }
  });
}

TEST_P(ReducerTest, Fp16HalvesTheBytesAndStaysClose) {
  const int world = GetParam();
  RunRanks(world, [&](Context& ctx) {
    Communicator* comm = ctx.world();
    const int64_t n = 4099;
    Tensor dense = Grad(ctx.Rank(), n);
    Tensor fp16 = Grad(ctx.Rank(), n);
    comm->ResetStats();
    ASSERT_TRUE(AllReduce(comm, &dense).ok());
    const int64_t dense_bytes = comm->stats().bytes_sent();
    comm->ResetStats();
    ReduceOptions options;
    options.compression.kind = Compression::kFp16;
    ASSERT_TRUE(AllReduce(comm, &fp16, options).ok());
    const int64_t fp16_bytes = comm->stats().bytes_sent();
    EXPECT_EQ(dense_bytes, n * 4);
    EXPECT_EQ(fp16_bytes, n * 2);
    // fp16 keeps ~3 significant digits; values here are below 10.
    ExpectNear(fp16, SumOfGrads(world, n), 1.0 / world, 5e-3, "fp16");
  });
}

// Mostly tiny values with a few rank-dependent spikes (for threshold sparsification).
Tensor SpikyGrad(int rank, int64_t n) {
  Tensor t(FLOAT32, {n});
  for (int64_t i = 0; i < n; ++i) {
    t.data<float>()[i] = 0.01f * std::sin(0.1f * i + rank) + (i % (40 + rank) == 0 ? 3.0f : 0.0f);
  }
  return t;
}

// The exact result of top-k / threshold sparsification: each rank's selected entries, summed.
std::vector<double> SparseExpectation(int world, int64_t n, const CompressionOptions& c,
                                      Tensor (*gen)(int, int64_t) = nullptr) {
  std::vector<double> sum(n, 0.0);
  for (int r = 0; r < world; ++r) {
    Tensor g = gen != nullptr ? gen(r, n) : Grad(r, n);
    const float* v = g.data<float>();
    std::vector<uint32_t> idx = c.kind == Compression::kTopK
                                    ? TopKIndices(v, n, TopKCount(n, c.topk_fraction))
                                    : ThresholdIndices(v, n, c.threshold);
    for (uint32_t i : idx) sum[i] += v[i];
  }
  return sum;
}

TEST_P(ReducerTest, TopKSendsFewerBytes) {
  const int world = GetParam();
  RunRanks(world, [&](Context& ctx) {
    Communicator* comm = ctx.world();
    const int64_t n = 10000;
    ReduceOptions options;
    options.scale = 1.0;
    options.compression.kind = Compression::kTopK;
    options.compression.topk_fraction = 0.05;
    Tensor g = Grad(ctx.Rank(), n);
    comm->ResetStats();
    ASSERT_TRUE(AllReduce(comm, &g, options).ok());
    const CommStats stats = comm->stats();
    EXPECT_EQ(stats.of(OpKind::kAllReduce).calls, 0);
    EXPECT_EQ(stats.of(OpKind::kAllGather).calls, 1);
    EXPECT_EQ(stats.bytes_sent(), 500 * 8);  // 5% of 10000 entries, 8 bytes each
    EXPECT_LT(stats.bytes_sent(), n * 4 / 5);
    ExpectNear(g, SparseExpectation(world, n, options.compression), 1.0, 1e-6, "topk");

    // A fraction too large to save bytes falls back to the dense all-reduce.
    options.compression.topk_fraction = 0.9;
    Tensor h = Grad(ctx.Rank(), n);
    comm->ResetStats();
    ASSERT_TRUE(AllReduce(comm, &h, options).ok());
    EXPECT_EQ(comm->stats().of(OpKind::kAllGather).calls, 0);
    ExpectNear(h, SumOfGrads(world, n), 1.0, 1e-5, "topk fallback");
  });
}

TEST_P(ReducerTest, ThresholdSendsFewerBytes) {
  const int world = GetParam();
  RunRanks(world, [&](Context& ctx) {
    Communicator* comm = ctx.world();
    const int64_t n = 10000;
    ReduceOptions options;
    options.compression.kind = Compression::kThreshold;
    options.compression.threshold = 0.5;
    Tensor g = SpikyGrad(ctx.Rank(), n);
    const size_t mine = ThresholdIndices(g.data<float>(), n, 0.5).size();
    size_t most = 0;
    for (int r = 0; r < world; ++r) {
      Tensor other = SpikyGrad(r, n);
      most = std::max(most, ThresholdIndices(other.data<float>(), n, 0.5).size());
    }
    ASSERT_GT(mine, 0u);
    ASSERT_LT(most * 8, static_cast<size_t>(n) * 4);  // the test data must be sparse enough
    comm->ResetStats();
    ASSERT_TRUE(AllReduce(comm, &g, options).ok());
    EXPECT_EQ(comm->stats().bytes_sent(), static_cast<int64_t>(8 + most * 8));
    ExpectNear(g, SparseExpectation(world, n, options.compression, &SpikyGrad), 1.0 / world, 1e-6,
               "threshold");
  });
}

// Error feedback: what top-k leaves out is sent in later calls. Every rank reduces the same
// gradient G each call, so the residuals agree across ranks and after T calls
// (sum of the results) + residual == T * G element-wise; without feedback the entries outside
// G's top k are never sent.
TEST_P(ReducerTest, TopKErrorFeedbackSendsWhatWasLeftOut) {
  const int world = GetParam();
  RunRanks(world, [&](Context& ctx) {
    Communicator* comm = ctx.world();
    const int64_t n = 200;
    const int steps = 40;
    const Tensor grad = Grad(0, n, 3);
    MultiReduceOptions options;
    options.compression.kind = Compression::kTopK;
    options.compression.topk_fraction = 0.05;
    ErrorFeedback feedback;
    std::vector<double> with(n, 0.0), without(n, 0.0);
    for (int t = 0; t < steps; ++t) {
      Tensor g = grad.Clone(), h = grad.Clone();
      options.error_feedback = &feedback;
      ASSERT_TRUE(AllReduceMultiple(comm, {&g}, options).ok());
      options.error_feedback = nullptr;
      ASSERT_TRUE(AllReduceMultiple(comm, {&h}, options).ok());
      for (int64_t i = 0; i < n; ++i) {
        with[i] += g.data<float>()[i];
        without[i] += h.data<float>()[i];
      }
    }
    ASSERT_EQ(feedback.residual_f32.size(), static_cast<size_t>(n));
    int sent_with = 0, sent_without = 0;
    for (int64_t i = 0; i < n; ++i) {
      const double want = steps * static_cast<double>(grad.data<float>()[i]);
      ASSERT_NEAR(with[i] + feedback.residual_f32[i], want, 1e-4 * std::max(1.0, std::fabs(want)))
          << "element " << i;
      sent_with += with[i] != 0;
      sent_without += without[i] != 0;
    }
    EXPECT_EQ(sent_without, 10);  // 5% of 200, the same entries every call
    EXPECT_GT(sent_with, 4 * sent_without);

    // A buffer of another size, or feedback without coalescing: InvalidArgument.
    Tensor other = Grad(0, n + 1);
    options.error_feedback = &feedback;
    absl::Status size = AllReduceMultiple(comm, {&other}, options);
    EXPECT_EQ(size.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(size.message().find("201 elements, the residual 200"), std::string::npos) << size;
    options.coalesce = false;
    EXPECT_EQ(AllReduceMultiple(comm, {&other}, options).code(),
              absl::StatusCode::kInvalidArgument);
  });
}

TEST_P(ReducerTest, BroadcastParametersFromRoot) {
  const int world = GetParam();
  RunRanks(world, [&](Context& ctx) {
    const int rank = ctx.Rank();
    const int root = world - 1;
    Tensor w = Grad(rank, 1001), b = GradF64(rank, 3);
    Tensor ids(INT64, {4});
    for (int i = 0; i < 4; ++i) ids.data<int64_t>()[i] = rank * 10 + i;
    ASSERT_TRUE(BroadcastParameters(ctx.world(), {&w, &b, &ids}, root).ok());
    Tensor w_root = Grad(root, 1001), b_root = GradF64(root, 3);
    for (int i = 0; i < 1001; ++i) ASSERT_EQ(w.data<float>()[i], w_root.data<float>()[i]);
    for (int i = 0; i < 3; ++i) ASSERT_EQ(b.data<double>()[i], b_root.data<double>()[i]);
    for (int i = 0; i < 4; ++i) ASSERT_EQ(ids.data<int64_t>()[i], root * 10 + i);
    // Different sizes on one rank: every rank gets InvalidArgument, nobody hangs.
    if (world > 1) {
      Tensor odd = Grad(rank, rank == 0 ? 5 : 6);
      absl::Status s = BroadcastParameters(ctx.world(), {&odd}, 0);
      EXPECT_TRUE(absl::IsInvalidArgument(s)) << s;
      EXPECT_TRUE(ctx.world()->health().ok());
    }
  });
}

TEST_P(ReducerTest, PartialSynchronizationRotatesChunks) {
  const int world = GetParam();
  RunRanks(world, [&](Context& ctx) {
    const int rank = ctx.Rank();
    const int chunks = 3;
    // 10 + 4 float32 elements (concatenation of 14: chunks [0,4) [4,9) [9,14)) and 5 float64.
    Tensor a(FLOAT32, {2, 5}), b(FLOAT32, {4}), c(FLOAT64, {5});
    auto fill = [&] {
      for (int i = 0; i < 10; ++i) a.data<float>()[i] = rank * 100 + i;
      for (int i = 0; i < 4; ++i) b.data<float>()[i] = rank * 100 + 10 + i;
      for (int i = 0; i < 5; ++i) c.data<double>()[i] = rank * 1000 + i;
    };
    fill();
    PartialSynchronizer sync(ctx.world(), chunks);
    ctx.world()->ResetStats();
    ASSERT_TRUE(sync.Step({&a, &b, &c}).ok());
    EXPECT_EQ(sync.step(), 1);
    const double mean_offset = 100.0 * (world - 1) / 2;
    for (int i = 0; i < 14; ++i) {
      const float v = i < 10 ? a.data<float>()[i] : b.data<float>()[i - 10];
      const double want = i < 4 ? mean_offset + i : rank * 100 + i;  // only chunk 0 averaged
      EXPECT_NEAR(v, want, 1e-4) << "element " << i;
    }
    EXPECT_NEAR(c.data<double>()[0], 1000.0 * (world - 1) / 2, 1e-9);  // float64 chunk 0 = [0, 1)
    EXPECT_EQ(c.data<double>()[1], rank * 1000 + 1);
    EXPECT_EQ(ctx.world()->stats().bytes_sent(), 4 * 4 + 1 * 8);
    ASSERT_TRUE(sync.Step({&a, &b, &c}).ok());
    ASSERT_TRUE(sync.Step({&a, &b, &c}).ok());
    for (int i = 0; i < 10; ++i) EXPECT_NEAR(a.data<float>()[i], mean_offset + i, 1e-4);
    for (int i = 0; i < 4; ++i) EXPECT_NEAR(b.data<float>()[i], mean_offset + 10 + i, 1e-4);
    for (int i = 0; i < 5; ++i) {
      EXPECT_NEAR(c.data<double>()[i], 1000.0 * (world - 1) / 2 + i, 1e-9);
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Ranks, ReducerTest, ::testing::Values(1, 2, 3, 4),
                         [](const auto& info) { return absl::StrCat("world", info.param); });

TEST(ReducerValidationTest, RejectsBadTensorsAndOptions) {
  RunRanks(1, [&](Context& ctx) {
    Tensor ints(INT32, {3});
    EXPECT_TRUE(absl::IsInvalidArgument(AllReduce(ctx.world(), &ints)));
    Tensor empty;
    EXPECT_TRUE(absl::IsInvalidArgument(AllReduce(ctx.world(), &empty)));
    Tensor g = Grad(0, 10);
    ReduceOptions bad;
    bad.compression.kind = Compression::kTopK;
    bad.compression.topk_fraction = 0;
    EXPECT_TRUE(absl::IsInvalidArgument(AllReduce(ctx.world(), &g, bad)));
    EXPECT_TRUE(absl::IsInvalidArgument(AllReduceAsync(ctx.world(), &ints)->Sync()));
    CoalescingReducer reducer(ctx.world());
    EXPECT_TRUE(absl::IsInvalidArgument(reducer.Add(&ints)));
    EXPECT_TRUE(absl::IsInvalidArgument(reducer.Finalize()));
    EXPECT_TRUE(reducer.Finalize().ok());  // the error was reported once; the next step is clean
  });
}

}  // namespace
}  // namespace collective
}  // namespace tessera
