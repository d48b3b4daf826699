// A rendezvous key-value store over plain TCP: TcpStoreServer runs in rank 0's process (on the
// endpoint every rank is given), TcpStore is the client every rank (rank 0 too) uses.
//
// Wire format (both directions little-endian, one request at a time per connection):
//   request  = u8 cmd, u32 key_len, key, then for SET: u32 value_len, value;
//                                          for GET: u64 timeout_ms
//   response = SET: u8 0;  GET: u8 status (0 found, 1 timed out), u32 value_len, value
// A GET waits on the server until the key is set or its timeout passes, so clients never poll.
//
// Job token: a server started with a token requires AUTH (u8 3, u32 token_len, token; answered
// u8 0 accepted / 1 refused) as the first request of every connection and compares the token in
// constant time; a wrong token, or any other first request (answered u8 2), closes the
// connection. A client given a token sends AUTH right after connecting. The store is not
// encrypted: the token keeps other jobs and stray clients out; run it on a trusted network.
#ifndef TESSERA_COMMON_COLLECTIVE_TCP_STORE_H_
#define TESSERA_COMMON_COLLECTIVE_TCP_STORE_H_

#include <atomic>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/collective/store.h"

namespace tessera {
namespace collective {

// Splits "host:port" ("[v6]:port" too); InvalidArgument naming the endpoint otherwise.
absl::Status ParseEndpoint(const std::string& endpoint, std::string* host, int* port);

// Serves a HashStore over TCP. Start() binds and returns once the server accepts connections;
// Shutdown() (or the destructor) closes every connection and joins the threads. One thread per
// client connection (clients are the ranks of one job). Thread-safe.
class TcpStoreServer {
 public:
  // Listens on `endpoint` ("host:port"; port 0 picks a free port, see endpoint()), on that
  // host's address only (an empty host: every interface). Non-empty `job_token`: clients must
  // present it (see above). Unavailable naming the endpoint when it cannot bind.
  static absl::StatusOr<std::unique_ptr<TcpStoreServer>> Start(const std::string& endpoint,
                                                               const std::string& job_token = "");
  ~TcpStoreServer();
  TcpStoreServer(const TcpStoreServer&) = delete;
  TcpStoreServer& operator=(const TcpStoreServer&) = delete;

  // "host:port" with the port actually bound.
  const std::string& endpoint() const { return endpoint_; }
  int port() const { return port_; }
  // Connections closed for a missing or wrong job token.
  int64_t refused_connections() const { return refused_.load(); }
  void Shutdown();

 private:
  TcpStoreServer(int listen_fd, std::string endpoint, int port);
  void AcceptLoop();
  void Serve(int fd);

  const int listen_fd_;
  const std::string endpoint_;
  const int port_;
  std::string job_token_;  // set before the accept thread starts, then read-only
  std::atomic<int64_t> refused_{0};
  std::thread accept_thread_;

  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::map<std::string, std::string> values_ ABSL_GUARDED_BY(mu_);
  std::vector<int> fds_ ABSL_GUARDED_BY(mu_);
  std::vector<std::thread> threads_ ABSL_GUARDED_BY(mu_);
};

// Client of a TcpStoreServer. Thread-safe (requests are serialized on one connection).
class TcpStore : public Store {
 public:
  // Connects to `endpoint`, retrying until `timeout` (the server may start after the client),
  // and presents `job_token` when it is not empty. DeadlineExceeded naming the endpoint when no
  // connection succeeds in time; Unauthenticated when the server refuses the token.
  static absl::StatusOr<std::unique_ptr<TcpStore>> Connect(const std::string& endpoint,
                                                           absl::Duration timeout,
                                                           const std::string& job_token = "");
  ~TcpStore() override;

  absl::Status Set(const std::string& key, const std::string& value) override;
  absl::StatusOr<std::string> Get(const std::string& key, absl::Duration timeout) override;
  std::string DebugName() const override { return "tcp store " + endpoint_; }

 private:
  TcpStore(int fd, std::string endpoint) : fd_(fd), endpoint_(std::move(endpoint)) {}
  absl::Status Broken(const std::string& what) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status Unauthenticated() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  absl::Mutex mu_;
  int fd_ ABSL_GUARDED_BY(mu_);
  const std::string endpoint_;
};

}  // namespace collective
}  // namespace tessera

#endif  // TESSERA_COMMON_COLLECTIVE_TCP_STORE_H_
