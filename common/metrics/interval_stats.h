// The pserver's periodic stats line: rates over the last interval from two samples of
// cumulative counters, e.g.
//   pserver 0 (127.0.0.1:6170): 1234 req/s, in 56.7 MB/s, out 12.3 MB/s, 0 errors, 12.0 steps/s,
//   96.0 grads applied/s, barrier wait 3.2 ms avg over 24
// (MB = 10^6 bytes). Pure functions; thread-compatible.
#ifndef TESSERA_COMMON_METRICS_INTERVAL_STATS_H_
#define TESSERA_COMMON_METRICS_INTERVAL_STATS_H_

#include <cstdint>
#include <string>

#include "absl/time/time.h"

namespace tessera {

// Cumulative counters at time `at`.
struct ServerCounters {
  absl::Time at;
  int64_t requests = 0;
  int64_t errors = 0;
  int64_t bytes_in = 0;
  int64_t bytes_out = 0;
  int64_t steps = 0;
  int64_t grads_applied = 0;
  int64_t barrier_waits = 0;        // barrier requests released (or failed)
  double barrier_wait_seconds = 0;  // their total wait
};

// "<who>: R req/s, in X MB/s, out Y MB/s, E errors, S steps/s, G grads applied/s, barrier wait
// W ms avg over N" for the interval from `before` to `after` (the barrier part only when some
// barrier was released in it). An interval of zero or negative length gives rates of 0.
std::string FormatIntervalStats(const std::string& who, const ServerCounters& before,
                                const ServerCounters& after);

}  // namespace tessera

#endif  // TESSERA_COMMON_METRICS_INTERVAL_STATS_H_
