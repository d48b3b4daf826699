#include "common/metrics/interval_stats.h"

#include "gtest/gtest.h"

namespace tessera {
namespace {

TEST(IntervalStatsTest, RatesOverTheInterval) {
  ServerCounters a, b;
  a.at = absl::FromUnixSeconds(100);
  a.requests = 1000;
  a.bytes_in = 5'000'000;
  a.bytes_out = 1'000'000;
  a.steps = 7;
  a.grads_applied = 70;
  a.barrier_waits = 4;
  a.barrier_wait_seconds = 1.0;
  b = a;
  b.at = a.at + absl::Seconds(2);
  b.requests += 2468;
  b.bytes_in += 113'400'000;
  b.bytes_out += 24'600'000;
  b.errors = 3;
  b.steps += 24;
  b.grads_applied += 192;
  b.barrier_waits += 24;
  b.barrier_wait_seconds += 0.0768;
  EXPECT_EQ(FormatIntervalStats("pserver 0", a, b),
            "pserver 0: 1234 req/s, in 56.7 MB/s, out 12.3 MB/s, 3 errors, 12.0 steps/s, 96.0 "
            "grads applied/s, barrier wait 3.2 ms avg over 24");
}

TEST(IntervalStatsTest, IdleAndEmptyIntervals) {
  ServerCounters a;
  a.at = absl::FromUnixSeconds(5);
  ServerCounters b = a;
  b.at += absl::Seconds(10);
  // No barrier released: no barrier part.
  EXPECT_EQ(FormatIntervalStats("pserver 1", a, b),
            "pserver 1: 0 req/s, in 0.0 MB/s, out 0.0 MB/s, 0 errors, 0.0 steps/s, 0.0 grads "
            "applied/s");
  b.requests = 50;
  b.at = a.at;  // zero-length interval: rates 0, never a division by zero
  EXPECT_EQ(FormatIntervalStats("p", a, b),
            "p: 0 req/s, in 0.0 MB/s, out 0.0 MB/s, 0 errors, 0.0 steps/s, 0.0 grads applied/s");
}

}  // namespace
}  // namespace tessera
