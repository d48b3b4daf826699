#include "common/base/thread_pool.h"

#include <atomic>
#include <set>
#include <thread>
#include <vector>

#include "absl/synchronization/blocking_counter.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

TEST(ThreadPoolTest, ParallelForRunsEveryItemOnce) {
  ThreadPool pool(3);
  for (int n : {0, 1, 2, 7, 1000}) {
    std::vector<std::atomic<int>> runs(static_cast<size_t>(n));
    pool.ParallelFor(n, [&](int i) { ++runs[static_cast<size_t>(i)]; });
    for (int i = 0; i < n; ++i) EXPECT_EQ(runs[static_cast<size_t>(i)].load(), 1) << n << " " << i;
  }
}

// max_helpers caps the pool threads that join the caller: none (every item on the caller's
// thread), or one (two threads at most), however many items and threads.
TEST(ThreadPoolTest, ParallelForTakesAtMostMaxHelpers) {
  ThreadPool pool(3);
  for (int max_helpers : {0, 1}) {
    absl::Mutex mu;
    std::set<std::thread::id> threads;
    std::atomic<int> items{0};
    pool.ParallelFor(
        64,
        [&](int) {
          {
            absl::MutexLock lock(&mu);
            threads.insert(std::this_thread::get_id());
          }
          ++items;
          absl::SleepFor(absl::Microseconds(200));  // time for every helper to start
        },
        max_helpers);
    EXPECT_EQ(items.load(), 64);
    EXPECT_LE(threads.size(), static_cast<size_t>(max_helpers + 1)) << max_helpers;
    if (max_helpers == 0) {
      EXPECT_EQ(threads.count(std::this_thread::get_id()), 1u);
    }
  }
}

// `first` runs once on the caller's thread while the helpers take items, however few: the
// helpers may take all of them (the caller then only waits), and every item still runs once.
TEST(ThreadPoolTest, ParallelForRunsFirstOnTheCallerBesideTheItems) {
  ThreadPool pool(2);
  for (int n : {0, 1, 2, 9}) {
    std::vector<std::atomic<int>> runs(static_cast<size_t>(n));
    std::atomic<int> firsts{0}, done_before_first_returned{0};
    std::thread::id first_on;
    pool.ParallelFor(
        n, [&](int i) { ++runs[static_cast<size_t>(i)]; }, 1,
        [&] {
          ++firsts;
          first_on = std::this_thread::get_id();
          // Give the helper time to take items before the caller can.
          const absl::Time deadline = absl::Now() + absl::Seconds(5);
          while (n > 0 && runs[0].load() == 0 && absl::Now() < deadline) {
            absl::SleepFor(absl::Microseconds(50));
          }
          if (n > 0) done_before_first_returned = runs[0].load();
        });
    EXPECT_EQ(firsts.load(), 1) << n;
    EXPECT_EQ(first_on, std::this_thread::get_id()) << n;
    if (n > 0) EXPECT_EQ(done_before_first_returned.load(), 1) << n;
    for (int i = 0; i < n; ++i) EXPECT_EQ(runs[static_cast<size_t>(i)].load(), 1) << n << " " << i;
  }
}

// Every pool thread inside a ParallelFor of its own at once (a pserver serving two trainers'
// lookups on its optimizer pool): none may wait for a helper that cannot start.
TEST(ThreadPoolTest, ParallelForOnEveryPoolThreadAtOnceFinishes) {
  constexpr int kThreads = 2;
  ThreadPool pool(kThreads);
  for (int round = 0; round < 50; ++round) {
    std::atomic<int> arrived{0}, items{0};
    absl::BlockingCounter done(kThreads);
    for (int t = 0; t < kThreads; ++t) {
      pool.Schedule([&] {
        // Both outer closures hold a pool thread before either asks for helpers.
        ++arrived;
        while (arrived.load() < kThreads) {
        }
        pool.ParallelFor(16, [&](int) { ++items; });
        done.DecrementCount();
      });
    }
    done.Wait();
    EXPECT_EQ(items.load(), kThreads * 16);
  }
}

// Join runs every closure scheduled before it, and those they schedule, with the pool still
// whole (a closure may use it); a second Join and the destructor do nothing more.
TEST(ThreadPoolTest, JoinRunsWhatWasScheduledWithThePoolWhole) {
  ThreadPool pool(2);
  std::atomic<int> items{0}, later{0};
  for (int i = 0; i < 8; ++i) {
    pool.Schedule([&] {
      pool.ParallelFor(4, [&](int) { ++items; });
      pool.Schedule([&] { ++later; });
    });
  }
  pool.Join();
  EXPECT_EQ(items.load(), 32);
  EXPECT_EQ(later.load(), 8);
  pool.Join();
}

}  // namespace
}  // namespace tessera
