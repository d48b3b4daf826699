#include "common/metrics/metrics.h"

#include <thread>

#include "gtest/gtest.h"

namespace tessera {
namespace {

TEST(MetricsTest, ExpositionOfEveryType) {
  MetricsRegistry r;
  Counter* sent = r.GetCounter("tessera_sent_total", "Blocks sent.", {{"peer", "a:1"}}).value();
  Counter* sent_b = r.GetCounter("tessera_sent_total", "ignored", {{"peer", "b:2"}}).value();
  Gauge* loss = r.GetGauge("tessera_loss", "Last loss.").value();
  Histogram* lat =
      r.GetHistogram("tessera_rpc_seconds", "RPC latency.", {0.1, 1}, {{"method", "send"}}).value();
  sent->Increment(3);
  sent_b->Increment();
  loss->Set(0.25);
  lat->Observe(0.05);
  lat->Observe(0.1);  // on a bound: that bucket
  lat->Observe(0.5);
  lat->Observe(7);
  EXPECT_EQ(r.Exposition(),
            "# HELP tessera_loss Last loss.\n"
            "# TYPE tessera_loss gauge\n"
            "tessera_loss 0.25\n"
            "# HELP tessera_rpc_seconds RPC latency.\n"
            "# TYPE tessera_rpc_seconds histogram\n"
            "tessera_rpc_seconds_bucket{method=\"send\",le=\"0.1\"} 2\n"
            "tessera_rpc_seconds_bucket{method=\"send\",le=\"1\"} 3\n"
            "tessera_rpc_seconds_bucket{method=\"send\",le=\"+Inf\"} 4\n"
            "tessera_rpc_seconds_sum{method=\"send\"} 7.65\n"
            "tessera_rpc_seconds_count{method=\"send\"} 4\n"
            "# HELP tessera_sent_total Blocks sent.\n"
            "# TYPE tessera_sent_total counter\n"
            "tessera_sent_total{peer=\"a:1\"} 3\n"
            "tessera_sent_total{peer=\"b:2\"} 1\n");
}

TEST(MetricsTest, SameNameAndLabelsGiveTheSameSeriesInAnyLabelOrder) {
  MetricsRegistry r;
  Counter* a = r.GetCounter("c", "", {{"x", "1"}, {"y", "2"}}).value();
  Counter* b = r.GetCounter("c", "", {{"y", "2"}, {"x", "1"}}).value();
  Counter* other = r.GetCounter("c", "", {{"x", "1"}, {"y", "3"}}).value();
  EXPECT_EQ(a, b);
  EXPECT_NE(a, other);
}

TEST(MetricsTest, CounterNeverGoesDownGaugeDoes) {
  MetricsRegistry r;
  Counter* c = r.GetCounter("c_total", "").value();
  c->Increment(2);
  c->Increment(-5);
  c->Increment(std::nan(""));
  EXPECT_EQ(c->Value(), 2);
  Gauge* g = r.GetGauge("g", "").value();
  g->Increment(2);
  g->Decrement(5);
  EXPECT_EQ(g->Value(), -3);
}

TEST(MetricsTest, RejectsBadNamesAndConflicts) {
  MetricsRegistry r;
  EXPECT_FALSE(r.GetCounter("1abc", "").ok());
  EXPECT_FALSE(r.GetCounter("a-b", "").ok());
  EXPECT_FALSE(r.GetCounter("ok", "", {{"__reserved", "x"}}).ok());
  EXPECT_FALSE(r.GetCounter("ok", "", {{"a:b", "x"}}).ok());
  EXPECT_FALSE(r.GetCounter("ok", "", {{"a", "x"}, {"a", "y"}}).ok());
  EXPECT_FALSE(r.GetHistogram("h", "", {1, 2}, {{"le", "1"}}).ok());
  EXPECT_FALSE(r.GetHistogram("h", "", {2, 1}).ok());
  EXPECT_FALSE(r.GetHistogram("h", "", {1, INFINITY}).ok());
  ASSERT_TRUE(r.GetCounter("x_total", "").ok());
  auto conflict = r.GetGauge("x_total", "");
  ASSERT_FALSE(conflict.ok());
  EXPECT_NE(conflict.status().message().find("x_total"), std::string::npos);
  ASSERT_TRUE(r.GetHistogram("h", "", {1, 2}).ok());
  EXPECT_FALSE(r.GetHistogram("h", "", {1, 3}).ok());
  EXPECT_TRUE(r.GetHistogram("h", "", {1, 2}, {{"a", "b"}}).ok());
  EXPECT_TRUE(r.GetCounter("ns:name_total", "").ok());
}

TEST(MetricsTest, EscapesLabelValuesAndHelp) {
  MetricsRegistry r;
  r.GetGauge("g", "line1\nback\\slash", {{"path", "a\"b\\c\nd"}}).value()->Set(-1.5);
  EXPECT_EQ(r.Exposition(),
            "# HELP g line1\\nback\\\\slash\n"
            "# TYPE g gauge\n"
            "g{path=\"a\\\"b\\\\c\\nd\"} -1.5\n");
}

TEST(MetricsTest, SpecialValues) {
  MetricsRegistry r;
  r.GetGauge("a", "").value()->Set(INFINITY);
  r.GetGauge("b", "").value()->Set(-INFINITY);
  r.GetGauge("c", "").value()->Set(std::nan(""));
  r.GetGauge("d", "").value()->Set(1e20);
  EXPECT_EQ(r.Exposition(),
            "# TYPE a gauge\na +Inf\n# TYPE b gauge\nb -Inf\n# TYPE c gauge\nc NaN\n"
            "# TYPE d gauge\nd 1e+20\n");
}

TEST(MetricsTest, ConcurrentUpdatesAreNotLost) {
  MetricsRegistry r;
  Histogram* h = r.GetHistogram("h", "", {0.5}).value();
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&r, h, t] {
      // Each thread also looks its series up, racing registry creation with updates.
      Counter* c = r.GetCounter("n_total", "", {{"shared", "yes"}}).value();
      Gauge* g = r.GetGauge("g", "").value();
      for (int i = 0; i < 10000; ++i) {
        c->Increment();
        g->Increment(0.5);
        h->Observe(t % 2);
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(r.GetCounter("n_total", "", {{"shared", "yes"}}).value()->Value(), 40000);
  EXPECT_EQ(r.GetGauge("g", "").value()->Value(), 20000);
  Histogram::Snapshot s = h->Get();
  EXPECT_EQ(s.count, 40000u);
  EXPECT_EQ(s.counts, (std::vector<uint64_t>{20000, 20000}));
  EXPECT_EQ(s.sum, 20000);
}

TEST(MetricsTest, SnapshotKeysMatchTheExposition) {
  MetricsRegistry r;
  r.GetCounter("c_total", "", {{"peer", "a"}}).value()->Increment(4);
  r.GetGauge("g", "").value()->Set(2);
  r.GetHistogram("h", "", {1}).value()->Observe(3);
  std::map<std::string, double> s = r.Snapshot();
  EXPECT_EQ(s, (std::map<std::string, double>{
                   {"c_total{peer=\"a\"}", 4}, {"g", 2}, {"h_count", 1}, {"h_sum", 3}}));
}

TEST(MetricsTest, ExponentialBuckets) {
  EXPECT_EQ(ExponentialBuckets(1, 2, 4), (std::vector<double>{1, 2, 4, 8}));
  EXPECT_TRUE(ExponentialBuckets(0, 2, 4).empty());
  EXPECT_TRUE(ExponentialBuckets(1, 1, 4).empty());
  EXPECT_TRUE(ExponentialBuckets(1, 2, 0).empty());
}


// A collector brings mirrored values up to date at every read, before anything is read.
TEST(MetricsRegistryTest, CollectorsRunBeforeEveryRead) {
  MetricsRegistry r;
  int source = 0;
  int runs = 0;
  Gauge* mirror = *r.GetGauge("mirror", "A mirrored value.");
  r.AddCollector([&] {
    ++runs;
    mirror->Set(source);
    auto late = r.GetCounter("added_by_collector", "Created at the first read.");
    if (late.ok()) (*late)->Increment();
  });
  source = 7;
  EXPECT_NE(r.Exposition().find("mirror 7"), std::string::npos) << r.Exposition();
  source = 9;
  std::map<std::string, double> snap = r.Snapshot();
  EXPECT_EQ(snap.at("mirror"), 9);
  EXPECT_EQ(snap.at("added_by_collector"), 2);  // two reads so far
  EXPECT_EQ(runs, 2);
}
}  // namespace
}  // namespace tessera
