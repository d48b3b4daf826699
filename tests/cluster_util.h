// Helpers for tests that run real daemons as subprocesses: start with logs, wait with a bound,
// and kill by pid. A ProcessGroup kills (SIGKILL) and reaps whatever is still running when it
// is destroyed, so a failing test leaves no process behind.
#ifndef TESSERA_TESTS_CLUSTER_UTIL_H_
#define TESSERA_TESTS_CLUSTER_UTIL_H_

#include <sys/types.h>

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace tessera {

class ProcessGroup {
 public:
  ProcessGroup() = default;
  ~ProcessGroup();
  ProcessGroup(const ProcessGroup&) = delete;
  ProcessGroup& operator=(const ProcessGroup&) = delete;

  // Starts argv[0] with stdout+stderr appended to `log_path`.
  absl::StatusOr<pid_t> Start(const std::vector<std::string>& argv, const std::string& log_path);
  // The raw wait status once `pid` exits, or DeadlineExceeded after `timeout`.
  absl::StatusOr<int> Wait(pid_t pid, absl::Duration timeout);
  void Kill(pid_t pid, int signal);
  // True while `pid` has not been reaped and exists.
  bool Running(pid_t pid);
  const std::vector<pid_t>& pids() const { return pids_; }

 private:
  std::vector<pid_t> pids_;
  std::map<pid_t, int> reaped_;
};

// Path of a data dependency: $TEST_SRCDIR/tessera/<relative>.
std::string RunfilePath(const std::string& relative);
// A fresh directory under $TEST_TMPDIR (or /tmp).
std::string MakeTempDir(const std::string& prefix);
std::string ReadFileOrEmpty(const std::string& path);
// `n` distinct free ports on 127.0.0.1 as "127.0.0.1:port" endpoints.
absl::StatusOr<std::vector<std::string>> FreeEndpoints(int n);
// Sum of the integer after `key` over every occurrence in `text` (counters in daemon logs, e.g.
// "grads_applied=").
int64_t SumAfter(const std::string& text, const std::string& key);
// Resident set size of a live process in KiB (VmRSS of /proc/<pid>/status).
absl::StatusOr<int64_t> ResidentKiB(pid_t pid);
// The whole HTTP/1.0 response (headers and body) of GET `path` from 127.0.0.1:`port`; "" when
// nothing listens there. Reads time out after 5 s.
std::string HttpGet(int port, const std::string& path);
// The value of the first sample of Prometheus metric `metric` (any labels) in a scrape, or -1.
double Sample(const std::string& text, const std::string& metric);

}  // namespace tessera

#endif  // TESSERA_TESTS_CLUSTER_UTIL_H_
