#include "common/metrics/interval_stats.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace tessera {

std::string FormatIntervalStats(const std::string& who, const ServerCounters& before,
                                const ServerCounters& after) {
  double seconds = absl::ToDoubleSeconds(after.at - before.at);
  auto rate = [seconds](double delta) { return seconds > 0 ? delta / seconds : 0.0; };
  std::string out = absl::StrFormat(
      "%s: %.0f req/s, in %.1f MB/s, out %.1f MB/s, %d errors, %.1f steps/s, %.1f grads applied/s",
      who, rate(static_cast<double>(after.requests - before.requests)),
      rate(static_cast<double>(after.bytes_in - before.bytes_in)) / 1e6,
      rate(static_cast<double>(after.bytes_out - before.bytes_out)) / 1e6,
      after.errors - before.errors, rate(static_cast<double>(after.steps - before.steps)),
      rate(static_cast<double>(after.grads_applied - before.grads_applied)));
  int64_t waits = after.barrier_waits - before.barrier_waits;
  if (waits > 0) {
    double avg_ms = (after.barrier_wait_seconds - before.barrier_wait_seconds) /
                    static_cast<double>(waits) * 1e3;
    absl::StrAppendFormat(&out, ", barrier wait %.1f ms avg over %d", avg_ms, waits);
  }
  return out;
}

}  // namespace tessera
