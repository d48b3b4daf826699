#include "common/rpc/rpc_metrics.h"

#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace tessera {
namespace {

RpcCallInfo Call(RpcMethod method, absl::StatusCode code, double seconds, int64_t in, int64_t out) {
  RpcCallInfo c;
  c.method = method;
  c.code = code;
  c.latency = absl::Seconds(seconds);
  c.bytes_received = in;
  c.bytes_sent = out;
  return c;
}

TEST(RpcMetricsTest, RecordsLatencyCountsErrorsAndBytesPerMethod) {
  MetricsRegistry registry;
  auto m = RpcMetrics::Create(&registry, RpcSide::kServer, {{"endpoint", "h:1"}});
  ASSERT_TRUE(m.ok()) << m.status();
  (*m)->OnCall(Call(RpcMethod::kSend, absl::StatusCode::kOk, 0.0002, 1000, 10));
  (*m)->OnCall(Call(RpcMethod::kSend, absl::StatusCode::kOk, 0.003, 500, 10));
  (*m)->OnCall(Call(RpcMethod::kBarrier, absl::StatusCode::kDeadlineExceeded, 12, 40, 0));
  auto snap = registry.Snapshot();
  const std::string send = "endpoint=\"h:1\",method=\"Send\",side=\"server\"";
  const std::string barrier = "endpoint=\"h:1\",method=\"Barrier\",side=\"server\"";
  EXPECT_EQ(snap["tessera_rpc_latency_seconds_count{" + send + "}"], 2);
  EXPECT_DOUBLE_EQ(snap["tessera_rpc_latency_seconds_sum{" + send + "}"], 0.0032);
  EXPECT_EQ(snap["tessera_rpc_received_bytes_total{" + send + "}"], 1500);
  EXPECT_EQ(snap["tessera_rpc_sent_bytes_total{" + send + "}"], 20);
  EXPECT_EQ(snap["tessera_rpc_requests_total{code=\"OK\"," + send + "}"], 2);
  EXPECT_EQ(snap.count("tessera_rpc_errors_total{code=\"OK\"," + send + "}"), 0u);
  EXPECT_EQ(snap["tessera_rpc_requests_total{code=\"DEADLINE_EXCEEDED\"," + barrier + "}"], 1);
  EXPECT_EQ(snap["tessera_rpc_errors_total{code=\"DEADLINE_EXCEEDED\"," + barrier + "}"], 1);
  // Every method is exposed from the start, so a scrape sees Get at 0.
  EXPECT_EQ(snap["tessera_rpc_requests_total{code=\"OK\",endpoint=\"h:1\",method=\"Get\","
                 "side=\"server\"}"],
            0);
  std::string text = registry.Exposition();
  // 12 s is past the last bound (10 s): only the +Inf bucket counts it.
  EXPECT_NE(text.find("tessera_rpc_latency_seconds_bucket{" + barrier + ",le=\"10\"} 0\n"),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("tessera_rpc_latency_seconds_bucket{" + barrier + ",le=\"+Inf\"} 1\n"),
            std::string::npos);
  EXPECT_NE(text.find("tessera_rpc_latency_seconds_bucket{" + send + ",le=\"0.00025\"} 1\n"),
            std::string::npos);
  RpcTotals t = (*m)->Totals();
  EXPECT_EQ(t.requests, 3);
  EXPECT_EQ(t.errors, 1);
  EXPECT_EQ(t.bytes_received, 1540);
  EXPECT_EQ(t.bytes_sent, 20);
}

TEST(RpcMetricsTest, ServerAndClientShareARegistry) {
  MetricsRegistry registry;
  auto server = RpcMetrics::Create(&registry, RpcSide::kServer);
  auto client = RpcMetrics::Create(&registry, RpcSide::kClient);
  ASSERT_TRUE(server.ok() && client.ok());
  (*client)->OnCall(Call(RpcMethod::kGet, absl::StatusCode::kOk, 0.001, 64, 8));
  auto snap = registry.Snapshot();
  EXPECT_EQ(snap["tessera_rpc_received_bytes_total{method=\"Get\",side=\"client\"}"], 64);
  EXPECT_EQ(snap["tessera_rpc_received_bytes_total{method=\"Get\",side=\"server\"}"], 0);
  EXPECT_EQ((*server)->Totals().requests, 0);
}

TEST(RpcMetricsTest, RejectsReservedLabel) {
  MetricsRegistry registry;
  auto m = RpcMetrics::Create(&registry, RpcSide::kServer, {{"method", "x"}});
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("'method'"), std::string::npos) << m.status();
}

TEST(RpcMetricsTest, ConcurrentCallsAllCounted) {
  MetricsRegistry registry;
  auto m = RpcMetrics::Create(&registry, RpcSide::kClient);
  ASSERT_TRUE(m.ok());
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 1000; ++i) {
        (*m)->OnCall(Call(RpcMethod::kPrefetch,
                          i % 2 ? absl::StatusCode::kOk : absl::StatusCode::kUnavailable, 1e-4,
                          t + 1, 1));
      }
    });
  }
  for (auto& th : threads) th.join();
  auto snap = registry.Snapshot();
  EXPECT_EQ(snap["tessera_rpc_requests_total{code=\"UNAVAILABLE\",method=\"Prefetch\","
                 "side=\"client\"}"],
            2000);
  EXPECT_EQ(snap["tessera_rpc_received_bytes_total{method=\"Prefetch\",side=\"client\"}"], 10000);
  EXPECT_EQ((*m)->Totals().errors, 2000);
}

}  // namespace
}  // namespace tessera
