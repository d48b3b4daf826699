#include "common/base/thread_pool.h"

#include <atomic>

#include "absl/synchronization/blocking_counter.h"

namespace tessera {

ThreadPool::ThreadPool(int num_threads) {
  for (int i = 0; i < std::max(1, num_threads); ++i) threads_.emplace_back([this] { Worker(); });
}

ThreadPool::~ThreadPool() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  for (auto& t : threads_) t.join();
}

void ThreadPool::Schedule(std::function<void()> fn) {
  absl::MutexLock lock(&mu_);
  queue_.push_back(std::move(fn));
}

void ThreadPool::Worker() {
  while (true) {
    std::function<void()> fn;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(
          +[](ThreadPool* p) ABSL_EXCLUSIVE_LOCKS_REQUIRED(p->mu_) {
            return p->stopping_ || !p->queue_.empty();
          },
          this));
      if (queue_.empty()) return;  // stopping and drained
      fn = std::move(queue_.front());
      queue_.pop_front();
    }
    fn();
  }
}

void ThreadPool::ParallelFor(int n, const std::function<void(int)>& fn) {
  if (n <= 0) return;
  if (n == 1) {
    fn(0);
    return;
  }
  std::atomic<int> next{0};
  int helpers = std::min(n - 1, size());
  absl::BlockingCounter done(helpers);
  auto drain = [&] {
    for (int i = next++; i < n; i = next++) fn(i);
  };
  for (int h = 0; h < helpers; ++h) {
    Schedule([&] {
      drain();
      done.DecrementCount();
    });
  }
  drain();
  done.Wait();
}

}  // namespace tessera
