// Scrapes MetricsServer over real loopback sockets.
#include "common/metrics/metrics_server.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <regex>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

int Connect(int port) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  ::inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// Reads until the server closes the connection (bounded by 10 s).
std::string ReadAll(int fd) {
  std::string out;
  char buf[4096];
  absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (absl::Now() < deadline) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 100) <= 0) continue;
    ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

// Sends `request` and returns the whole response ("" when the connection failed).
std::string Ask(int port, const std::string& request) {
  int fd = Connect(port);
  if (fd < 0) return "";
  (void)!::send(fd, request.data(), request.size(), MSG_NOSIGNAL);
  std::string response = ReadAll(fd);
  ::close(fd);
  return response;
}

std::string Scrape(int port) {
  return Ask(port, "GET /metrics HTTP/1.1\r\nHost: localhost\r\nAccept: text/plain\r\n\r\n");
}

// The value of series `series` (e.g. `steps_total{role="trainer"}`) in a scrape, or -1.
double ValueOf(const std::string& response, const std::string& series) {
  size_t body = response.find("\r\n\r\n");
  if (body == std::string::npos) return -1;
  std::string text = response.substr(body + 4);
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    std::string line = text.substr(pos, end - pos);
    pos = end == std::string::npos ? text.size() : end + 1;
    if (line.rfind(series + " ", 0) == 0) {
      double v;
      if (absl::SimpleAtod(line.substr(series.size() + 1), &v)) return v;
    }
  }
  return -1;
}

class MetricsServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    steps_ = registry_.GetCounter("tessera_steps_total", "Steps.", {{"role", "trainer"}}).value();
    loss_ = registry_.GetGauge("tessera_loss", "Loss.").value();
    MetricsServerOptions o;
    o.host = "127.0.0.1";
    o.io_timeout = absl::Milliseconds(500);
    o.max_request_bytes = 2048;
    server_ = std::make_unique<MetricsServer>(&registry_, o);
    ASSERT_TRUE(server_->Start().ok());
    ASSERT_GT(server_->port(), 0);
  }

  MetricsRegistry registry_;
  Counter* steps_;
  Gauge* loss_;
  std::unique_ptr<MetricsServer> server_;
};

TEST_F(MetricsServerTest, ScrapeSeesCountersMove) {
  std::string first = Scrape(server_->port());
  ASSERT_EQ(first.rfind("HTTP/1.1 200 OK\r\n", 0), 0u) << first;
  EXPECT_NE(first.find("Content-Type: text/plain; version=0.0.4"), std::string::npos) << first;
  EXPECT_NE(first.find("# TYPE tessera_steps_total counter\n"), std::string::npos) << first;
  EXPECT_EQ(ValueOf(first, "tessera_steps_total{role=\"trainer\"}"), 0) << first;

  // A worker thread updates the metrics while scrapes happen; values seen only go up.
  std::atomic<bool> done{false};
  std::thread worker([&] {
    for (int i = 1; i <= 200; ++i) {
      steps_->Increment();
      loss_->Set(1.0 / i);
      absl::SleepFor(absl::Microseconds(200));
    }
    done = true;
  });
  double last = 0;
  int scrapes = 1;
  while (!done) {
    double v = ValueOf(Scrape(server_->port()), "tessera_steps_total{role=\"trainer\"}");
    ASSERT_GE(v, last);
    last = v;
    ++scrapes;
  }
  worker.join();
  std::string final = Scrape(server_->port());
  ++scrapes;
  EXPECT_EQ(ValueOf(final, "tessera_steps_total{role=\"trainer\"}"), 200) << final;
  EXPECT_EQ(ValueOf(final, "tessera_loss"), 1.0 / 200) << final;
  // Content-Length matches the body.
  std::smatch m;
  ASSERT_TRUE(std::regex_search(final, m, std::regex("Content-Length: (\\d+)\r\n")));
  EXPECT_EQ(std::stoul(m[1]), final.size() - final.find("\r\n\r\n") - 4);
  EXPECT_EQ(server_->requests_served(), scrapes);
}

TEST_F(MetricsServerTest, OnlyGetMetrics) {
  EXPECT_EQ(Ask(server_->port(), "GET / HTTP/1.1\r\n\r\n").rfind("HTTP/1.1 404", 0), 0u);
  EXPECT_EQ(Ask(server_->port(), "GET /metricsx HTTP/1.1\r\n\r\n").rfind("HTTP/1.1 404", 0), 0u);
  std::string post = Ask(server_->port(), "POST /metrics HTTP/1.1\r\nContent-Length: 0\r\n\r\n");
  EXPECT_EQ(post.rfind("HTTP/1.1 405", 0), 0u) << post;
  EXPECT_NE(post.find("Allow: GET\r\n"), std::string::npos);
  EXPECT_EQ(Ask(server_->port(), "garbage\r\n\r\n").rfind("HTTP/1.1 400", 0), 0u);
  EXPECT_EQ(Ask(server_->port(), "GET /metrics?x=1 HTTP/1.0\r\n\r\n").rfind("HTTP/1.1 200", 0), 0u);
  EXPECT_EQ(server_->requests_served(), 1);
}

TEST_F(MetricsServerTest, OversizedRequestIsRefused) {
  std::string big = "GET /metrics HTTP/1.1\r\nX-Pad: " + std::string(4096, 'a') + "\r\n\r\n";
  EXPECT_EQ(Ask(server_->port(), big).rfind("HTTP/1.1 431", 0), 0u);
  EXPECT_EQ(Scrape(server_->port()).rfind("HTTP/1.1 200", 0), 0u);  // still serving
}

TEST_F(MetricsServerTest, SilentClientIsDroppedAndOthersServedAfterIt) {
  int idle = Connect(server_->port());  // connects and never sends anything
  ASSERT_GE(idle, 0);
  absl::Time start = absl::Now();
  std::string response = Scrape(server_->port());  // waits behind the idle one, at most io_timeout
  EXPECT_EQ(response.rfind("HTTP/1.1 200", 0), 0u);
  EXPECT_EQ(ReadAll(idle), "");  // the idle connection was closed without an answer
  ::close(idle);
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));  // bounded, not a speed assertion
}

// True once the server has closed `fd` (recv sees the end), false if it is still open after
// `within`.
bool ClosedByServer(int fd, absl::Duration within) {
  absl::Time deadline = absl::Now() + within;
  char buf[256];
  while (absl::Now() < deadline) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 50) <= 0) continue;
    ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) return true;
  }
  return false;
}

TEST(MetricsServerConcurrencyTest, IdleConnectionsDoNotDelayAScrape) {
  MetricsRegistry registry;
  ASSERT_TRUE(registry.GetCounter("tessera_steps_total", "Steps.").ok());
  MetricsServerOptions o;
  o.host = "127.0.0.1";
  o.io_timeout = absl::Seconds(60);  // one at a time, 16 idle clients would hold it 16 minutes
  MetricsServer server(&registry, o);
  ASSERT_TRUE(server.Start().ok());
  std::vector<int> idle;
  for (int i = 0; i < 16; ++i) {
    idle.push_back(Connect(server.port()));
    ASSERT_GE(idle.back(), 0);
  }
  // Half a request from some of them: still not an answer, still not in the way.
  for (int i = 0; i < 8; ++i) (void)!::send(idle[i], "GET /met", 8, MSG_NOSIGNAL);
  for (int k = 0; k < 3; ++k) {
    EXPECT_EQ(Scrape(server.port()).rfind("HTTP/1.1 200", 0), 0u) << "scrape " << k;
  }
  EXPECT_EQ(server.requests_served(), 3);
  // The idle ones are still open (their 60 s are not up), and one that finishes its request
  // now is answered.
  EXPECT_FALSE(ClosedByServer(idle[15], absl::Milliseconds(200)));
  const std::string rest = "rics HTTP/1.1\r\n\r\n";
  (void)!::send(idle[0], rest.data(), rest.size(), MSG_NOSIGNAL);
  EXPECT_EQ(ReadAll(idle[0]).rfind("HTTP/1.1 200", 0), 0u);
  for (int fd : idle) ::close(fd);
}

TEST(MetricsServerConcurrencyTest, BeyondMaxConnectionsTheOldestIsDropped) {
  MetricsRegistry registry;
  MetricsServerOptions o;
  o.host = "127.0.0.1";
  o.io_timeout = absl::Seconds(60);
  o.max_connections = 4;
  MetricsServer server(&registry, o);
  ASSERT_TRUE(server.Start().ok());
  std::vector<int> idle;
  for (int i = 0; i < 6; ++i) {
    idle.push_back(Connect(server.port()));
    ASSERT_GE(idle.back(), 0);
  }
  EXPECT_EQ(Scrape(server.port()).rfind("HTTP/1.1 200", 0), 0u);
  // 7 connections met a server that keeps 4: the 3 oldest were closed to make room.
  for (int i = 0; i < 3; ++i) EXPECT_TRUE(ClosedByServer(idle[i], absl::Seconds(10))) << i;
  for (int fd : idle) ::close(fd);
}

TEST_F(MetricsServerTest, ShutdownStopsServingAndIsIdempotent) {
  int port = server_->port();
  server_->Shutdown();
  server_->Shutdown();
  server_->Wait();
  server_.reset();
  EXPECT_EQ(Scrape(port), "");
}

TEST(MetricsServerStartTest, ErrorsNameTheAddress) {
  MetricsRegistry r;
  MetricsServerOptions o;
  o.host = "not-an-ip";
  MetricsServer bad_host(&r, o);
  absl::Status s = bad_host.Start();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("not-an-ip"), std::string::npos) << s;

  o.host = "127.0.0.1";
  MetricsServer first(&r, o);
  ASSERT_TRUE(first.Start().ok());
  EXPECT_EQ(first.Start().code(), absl::StatusCode::kFailedPrecondition);
  o.port = first.port();
  MetricsServer second(&r, o);
  s = second.Start();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(s.message().find(absl::StrCat("127.0.0.1:", first.port())), std::string::npos) << s;
}

}  // namespace
}  // namespace tessera
