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

std::string HttpGet(int port, const std::string& path) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  ::inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
  timeval tv{5, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd);
    return "";
  }
  std::string req = absl::StrCat("GET ", path, " HTTP/1.0\r\nHost: localhost\r\n\r\n");
  (void)!::write(fd, req.data(), req.size());
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = ::read(fd, buf, sizeof(buf))) > 0) out.append(buf, static_cast<size_t>(n));
  ::close(fd);
  return out;
}

// The value of the first sample of `metric` (any labels), or -1.
double Sample(const std::string& text, const std::string& metric) {
  size_t pos = 0;
  while ((pos = text.find(metric, pos)) != std::string::npos) {
    bool line_start = pos == 0 || text[pos - 1] == '\n';
    size_t end = pos + metric.size();
    if (line_start && (text[end] == '{' || text[end] == ' ')) {
      size_t space = text.find(' ', text[end] == '{' ? text.find('}', end) : end);
      return std::strtod(text.c_str() + space + 1, nullptr);
    }
    pos = end;
  }
  return -1;
}

TEST(MetricsScrapeTest, PserverAndTrainerCountersMove) {
  std::string dir = MakeTempDir("metrics");
  auto eps = FreeEndpoints(3);
  ASSERT_TRUE(eps.ok());
  auto port_of = [](const std::string& ep) { return std::stoi(ep.substr(ep.rfind(':') + 1)); };
  int ps_metrics = port_of((*eps)[1]), tr_metrics = port_of((*eps)[2]);
  std::vector<std::string> common = {"--pservers=" + (*eps)[0], "--trainers=1",
                                     "--example=mlp_regression", "--epochs=100000",
                                     "--num_examples=256", "--batch_size=32",
                                     "--barrier_timeout_s=10"};
  ProcessGroup group;
  std::vector<std::string> ps = {RunfilePath("pserver/tessera_pserver"),
                                 "--current_endpoint=" + (*eps)[0],
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
    ASSERT_LT(absl::Now(), deadline) << ReadFileOrEmpty(dir + "/trainer.log")
                                     << ReadFileOrEmpty(dir + "/pserver.log");
    absl::SleepFor(absl::Milliseconds(100));
  }
  EXPECT_NE(ps_text.find("# TYPE tessera_pserver_grads_applied_total counter"), std::string::npos)
      << ps_text;
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
  for (pid_t pid : group.pids()) group.Kill(pid, SIGKILL);
}

}  // namespace
}  // namespace tessera
