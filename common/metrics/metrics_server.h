// MetricsServer: a minimal HTTP/1.x server for Prometheus scrapes. It answers `GET /metrics`
// with the registry's text exposition (200, Content-Type text/plain; version=0.0.4) and nothing
// else (404 for other paths, 405 for other methods, 400 for malformed or oversized requests).
//
// It is deliberately small and bounded: plain POSIX sockets and one thread that polls every open
// connection at once (up to `max_connections`; beyond that the oldest is dropped), so idle or
// slow clients never delay a scrape. Each connection has `io_timeout` to send its request (of
// at most `max_request_bytes`) and take its answer, then it is closed: a hostile client holds
// at most one slot for that long and cannot grow memory. Every response closes the connection.
//
// Lifecycle: construct, Start() (binds and listens; fails with a message naming host:port),
// then Shutdown() and Wait() (the destructor does both). Thread-safe: Shutdown() may be called
// from any thread; port() and requests_served() at any time after Start().
#ifndef TESSERA_COMMON_METRICS_METRICS_SERVER_H_
#define TESSERA_COMMON_METRICS_METRICS_SERVER_H_

#include <atomic>
#include <cstdint>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/metrics/metrics.h"

namespace tessera {

struct MetricsServerOptions {
  // IPv4 address (or host name, bound to its first IPv4 address) to listen on; "0.0.0.0":
  // every interface, "127.0.0.1": this machine only.
  std::string host = "0.0.0.0";
  int port = 0;  // 0 = any free port (see MetricsServer::port())
  size_t max_request_bytes = 8192;
  absl::Duration io_timeout = absl::Seconds(5);  // per connection: request in, answer out
  int max_connections = 64;                      // open at once (>= 1)
};

class MetricsServer {
 public:
  // `registry` must outlive the server.
  MetricsServer(const MetricsRegistry* registry, MetricsServerOptions options);
  ~MetricsServer();
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  // Binds host:port, listens and starts the serving thread. Unavailable / InvalidArgument name
  // the address; FailedPrecondition if already started.
  absl::Status Start();
  // Stops accepting and closes every open connection. Idempotent.
  void Shutdown();
  // Blocks until the serving thread has exited (returns at once if never started).
  void Wait();

  // The bound port (the chosen one when options.port was 0); 0 before Start().
  int port() const { return port_.load(); }
  // Number of requests answered with 200.
  int64_t requests_served() const { return served_.load(); }

 private:
  struct Connection;
  void Loop();
  // Reads what `c` has sent; once its request is complete (or bad), sets its response.
  void OnReadable(Connection* c);
  std::string Answer(const std::string& request);

  const MetricsRegistry* registry_;
  const MetricsServerOptions options_;
  int listen_fd_ = -1;
  int wake_fds_[2] = {-1, -1};  // a pipe: Shutdown() writes to wake the poll()
  std::atomic<int> port_{0};
  std::atomic<int64_t> served_{0};
  std::atomic<bool> stopping_{false};
  std::thread thread_;
};

}  // namespace tessera

#endif  // TESSERA_COMMON_METRICS_METRICS_SERVER_H_
