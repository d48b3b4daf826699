#include "common/metrics/metrics_csv.h"

#include <cstdlib>
#include <fstream>
#include <sstream>

#include "gtest/gtest.h"

namespace tessera {
namespace {

std::string TempPath(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  std::string path = std::string(dir != nullptr ? dir : "/tmp") + "/" + name;
  std::remove(path.c_str());
  return path;
}

std::string Read(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TEST(MetricsCsvTest, HeaderOnceThenRowsAppended) {
  std::string path = TempPath("a.csv");
  {
    auto w = MetricsCsvWriter::Open(path, {"step", "loss", "samples_per_s"});
    ASSERT_TRUE(w.ok()) << w.status();
    ASSERT_TRUE((*w)->Append({{"step", 20}, {"loss", 0.5}, {"samples_per_s", 12345}}).ok());
    ASSERT_TRUE((*w)->Append({{"loss", 0.25}, {"step", 40}}).ok());  // any order, one missing
    EXPECT_EQ(Read(path), "step,loss,samples_per_s\n20,0.5,12345\n40,0.25,\n");  // flushed
  }
  // Reopening with the same columns appends below; other columns are refused.
  auto again = MetricsCsvWriter::Open(path, {"step", "loss", "samples_per_s"});
  ASSERT_TRUE(again.ok()) << again.status();
  ASSERT_TRUE((*again)->Append({{"step", 60}}).ok());
  EXPECT_EQ(Read(path), "step,loss,samples_per_s\n20,0.5,12345\n40,0.25,\n60,,\n");
  auto other = MetricsCsvWriter::Open(path, {"step", "loss"});
  ASSERT_FALSE(other.ok());
  EXPECT_EQ(other.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(other.status().message().find(path), std::string::npos);
}

TEST(MetricsCsvTest, BadColumnsAndValues) {
  std::string path = TempPath("b.csv");
  EXPECT_FALSE(MetricsCsvWriter::Open(path, {}).ok());
  EXPECT_FALSE(MetricsCsvWriter::Open(path, {"a", "a"}).ok());
  EXPECT_FALSE(MetricsCsvWriter::Open(path, {"a", ""}).ok());
  EXPECT_FALSE(MetricsCsvWriter::Open(path, {"a\nb"}).ok());
  auto w = MetricsCsvWriter::Open(path, {"a", "b"});
  ASSERT_TRUE(w.ok());
  absl::Status s = (*w)->Append({{"a", 1}, {"c", 2}});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("'c'"), std::string::npos) << s;
  EXPECT_FALSE((*w)->Append({{"a", 1}, {"a", 2}}).ok());
  EXPECT_EQ(Read(path), "a,b\n");  // nothing written by the bad rows
}

TEST(MetricsCsvTest, UnwritablePathIsNamed) {
  auto w = MetricsCsvWriter::Open("/nonexistent-dir/x.csv", {"a"});
  ASSERT_FALSE(w.ok());
  EXPECT_EQ(w.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(w.status().message().find("/nonexistent-dir/x.csv"), std::string::npos);
}

TEST(MetricsCsvTest, SnapshotRowsFromARegistry) {
  std::string path = TempPath("c.csv");
  MetricsRegistry r;
  Counter* steps = r.GetCounter("steps_total", "").value();
  Gauge* peer = r.GetGauge("queue", "", {{"peer", "a:1"}}).value();
  auto w = MetricsCsvWriter::Open(path, {"steps_total", "queue{peer=\"a:1\"}", "later"});
  ASSERT_TRUE(w.ok()) << w.status();
  steps->Increment(3);
  peer->Set(1.5);
  ASSERT_TRUE((*w)->AppendSnapshot(r).ok());
  steps->Increment(2);
  r.GetGauge("later", "").value()->Set(7);
  ASSERT_TRUE((*w)->AppendSnapshot(r).ok());
  EXPECT_EQ(Read(path), "steps_total,\"queue{peer=\"\"a:1\"\"}\",later\n3,1.5,\n5,1.5,7\n");
  // The quoted header reads back as the same columns.
  EXPECT_TRUE(MetricsCsvWriter::Open(path, {"steps_total", "queue{peer=\"a:1\"}", "later"}).ok());
}

}  // namespace
}  // namespace tessera
