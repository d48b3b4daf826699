// Scrapes /metrics (Prometheus text format) from a running pserver and trainer and checks that
// their counters move while training runs.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "tests/cluster_util.h"

namespace tessera {
namespace {

// The value of the series written exactly as `series` (name and sorted labels), or -1.
double Series(const std::string& text, const std::string& series) {
  std::string key = "\n" + series + " ";
  size_t pos = ("\n" + text).find(key);
  if (pos == std::string::npos) return -1;
  return std::strtod(text.c_str() + pos + key.size() - 1, nullptr);
}

// `name`{labels} with the labels given in sorted order, e.g. Labeled("m", "a=\"x\",b=\"y\"").
std::string Labeled(const std::string& name, const std::string& labels) {
  return absl::StrCat(name, "{", labels, "}");
}

TEST(MetricsScrapeTest, PserverAndTrainerCountersMove) {
  std::string dir = MakeTempDir("metrics");
  auto eps = FreeEndpoints(3);
  ASSERT_TRUE(eps.ok());
  auto port_of = [](const std::string& ep) { return std::stoi(ep.substr(ep.rfind(':') + 1)); };
  int ps_metrics = port_of((*eps)[1]), tr_metrics = port_of((*eps)[2]);
  std::vector<std::string> common = {
      "--pservers=" + (*eps)[0], "--trainers=1",    "--example=mlp_regression", "--epochs=100000",
      "--num_examples=256",      "--batch_size=32", "--barrier_timeout_s=10"};
  ProcessGroup group;
  std::vector<std::string> ps = {RunfilePath("pserver/tessera_pserver"),
                                 "--current_endpoint=" + (*eps)[0], "--stats_interval_s=0.5",
                                 absl::StrCat("--metrics_port=", ps_metrics)};
  ps.insert(ps.end(), common.begin(), common.end());
  std::vector<std::string> tr = {RunfilePath("trainer/tessera_trainer"), "--trainer_id=0",
                                 absl::StrCat("--metrics_port=", tr_metrics)};
  tr.insert(tr.end(), common.begin(), common.end());
  ASSERT_TRUE(group.Start(ps, dir + "/pserver.log").ok());
  ASSERT_TRUE(group.Start(tr, dir + "/trainer.log").ok());

  // Wait (bounded) until both serve metrics with training under way.
  absl::Time deadline = absl::Now() + absl::Seconds(60);
  std::string ps_text, tr_text;
  while (true) {
    ps_text = HttpGet(ps_metrics, "/metrics");
    tr_text = HttpGet(tr_metrics, "/metrics");
    if (Sample(ps_text, "tessera_pserver_grads_applied_total") > 0 &&
        Sample(tr_text, "tessera_trainer_steps_total") > 0) {
      break;
    }
    ASSERT_LT(absl::Now(), deadline)
        << ReadFileOrEmpty(dir + "/trainer.log") << ReadFileOrEmpty(dir + "/pserver.log");
    absl::SleepFor(absl::Milliseconds(100));
  }
  EXPECT_NE(ps_text.find("# TYPE tessera_pserver_grads_applied_total counter"), std::string::npos)
      << ps_text;
  // This job has no distributed table: no lookup, none fused (parameter_server_test counts them).
  EXPECT_EQ(Sample(ps_text, "tessera_pserver_fused_prefetches_total"), 0) << ps_text;
  EXPECT_EQ(Sample(ps_text, "tessera_pserver_lookups_ahead_total"), 0) << ps_text;
  EXPECT_EQ(Sample(ps_text, "tessera_pserver_table_updates_reusing_lookups_total"), 0) << ps_text;
  // Nor does any gradient arrive ahead of its step's barrier (no --send_early_kb, no tensor over
  // the chunk size): the pserver applies none early.
  EXPECT_EQ(Sample(ps_text, "tessera_pserver_early_applies_total"), 0) << ps_text;
  double ps_before = Sample(ps_text, "tessera_pserver_grads_applied_total");
  double tr_before = Sample(tr_text, "tessera_trainer_steps_total");
  double samples_before = Sample(tr_text, "tessera_trainer_samples_total");
  // The counters keep moving.
  deadline = absl::Now() + absl::Seconds(30);
  while (Sample(HttpGet(tr_metrics, "/metrics"), "tessera_trainer_steps_total") <= tr_before ||
         Sample(HttpGet(ps_metrics, "/metrics"), "tessera_pserver_grads_applied_total") <=
             ps_before) {
    ASSERT_LT(absl::Now(), deadline);
    absl::SleepFor(absl::Milliseconds(100));
  }
  EXPECT_GT(Sample(HttpGet(tr_metrics, "/metrics"), "tessera_trainer_samples_total"),
            samples_before);
  EXPECT_GE(Sample(HttpGet(tr_metrics, "/metrics"), "tessera_trainer_loss"), 0.0);

  // RPC metrics per method on both sides, bytes each way, barrier waits: present and moving.
  const std::string ep = "endpoint=\"" + (*eps)[0] + "\",";
  auto server = [&](const char* method) {
    return ep + "method=\"" + method + "\",side=\"server\"";
  };
  auto client = [&](const char* method) {
    return absl::StrCat("method=\"", method, "\",side=\"client\",trainer_id=\"0\"");
  };
  // Counters whose value must grow between two scrapes, and where they are scraped.
  struct Moving {
    int port;
    std::string series;
  };
  std::vector<Moving> moving;
  // A sync step's request: one SendGetBatch per pserver (the gradients with the send barrier,
  // the parameters with the fetch barrier).
  for (const char* method : {"SendGetBatch"}) {
    moving.push_back({ps_metrics, Labeled("tessera_rpc_latency_seconds_count", server(method))});
    moving.push_back(
        {ps_metrics, Labeled("tessera_rpc_requests_total", "code=\"OK\"," + server(method))});
    moving.push_back({tr_metrics, Labeled("tessera_rpc_latency_seconds_count", client(method))});
    moving.push_back(
        {tr_metrics, Labeled("tessera_rpc_requests_total", "code=\"OK\"," + client(method))});
  }
  moving.push_back(
      {ps_metrics, Labeled("tessera_rpc_received_bytes_total", server("SendGetBatch"))});
  moving.push_back({ps_metrics, Labeled("tessera_rpc_sent_bytes_total", server("SendGetBatch"))});
  moving.push_back({tr_metrics, Labeled("tessera_rpc_sent_bytes_total", client("SendGetBatch"))});
  moving.push_back(
      {tr_metrics, Labeled("tessera_rpc_received_bytes_total", client("SendGetBatch"))});
  for (const char* kind : {"send", "fetch"}) {
    moving.push_back({ps_metrics, Labeled("tessera_pserver_barrier_wait_seconds_count",
                                          ep + "kind=\"" + kind + "\"")});
    moving.push_back({tr_metrics, Labeled("tessera_trainer_barrier_wait_seconds_count",
                                          absl::StrCat("kind=\"", kind, "\",trainer_id=\"0\""))});
  }
  ps_text = HttpGet(ps_metrics, "/metrics");
  tr_text = HttpGet(tr_metrics, "/metrics");
  std::vector<double> first;
  for (const Moving& m : moving) {
    first.push_back(Series(m.port == ps_metrics ? ps_text : tr_text, m.series));
    EXPECT_GT(first.back(), 0) << m.series << "\n" << (m.port == ps_metrics ? ps_text : tr_text);
  }
  // A histogram's +Inf bucket counts every observation.
  double send_count =
      Series(ps_text, Labeled("tessera_rpc_latency_seconds_count", server("SendGetBatch")));
  EXPECT_EQ(Series(ps_text, Labeled("tessera_rpc_latency_seconds_bucket",
                                    server("SendGetBatch") + ",le=\"+Inf\"")),
            send_count);
  EXPECT_NE(ps_text.find("# TYPE tessera_rpc_latency_seconds histogram"), std::string::npos);
  // No call failed while training ran.
  EXPECT_EQ(ps_text.find("tessera_rpc_errors_total{"), std::string::npos) << ps_text;
  EXPECT_EQ(tr_text.find("tessera_rpc_errors_total{"), std::string::npos) << tr_text;
  deadline = absl::Now() + absl::Seconds(30);
  for (size_t i = 0; i < moving.size(); ++i) {
    while (Series(HttpGet(moving[i].port, "/metrics"), moving[i].series) <= first[i]) {
      ASSERT_LT(absl::Now(), deadline) << moving[i].series << " stays at " << first[i];
      absl::SleepFor(absl::Milliseconds(100));
    }
  }

  // The pserver's stats line (--stats_interval_s=0.5) reports the traffic.
  deadline = absl::Now() + absl::Seconds(30);
  std::string line_start = "pserver 0 (" + (*eps)[0] + "): ";
  while (true) {
    std::string log = ReadFileOrEmpty(dir + "/pserver.log");
    size_t at = log.find(line_start);
    // A line with requests moving: not " 0 req/s".
    bool found = false;
    for (; at != std::string::npos; at = log.find(line_start, at + 1)) {
      std::string line = log.substr(at, log.find('\n', at) - at);
      if (line.find(" req/s, in ") != std::string::npos &&
          line.find(": 0 req/s") == std::string::npos &&
          line.find(" MB/s, out ") != std::string::npos &&
          line.find("barrier wait ") != std::string::npos) {
        found = true;
      }
    }
    if (found) break;
    ASSERT_LT(absl::Now(), deadline) << log;
    absl::SleepFor(absl::Milliseconds(100));
  }
  for (pid_t pid : group.pids()) group.Kill(pid, SIGKILL);
}

}  // namespace
}  // namespace tessera
