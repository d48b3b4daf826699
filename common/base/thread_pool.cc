#include "common/base/thread_pool.h"

#include <algorithm>
#include <atomic>
#include <memory>

namespace tessera {

ThreadPool::ThreadPool(int num_threads) {
  for (int i = 0; i < std::max(1, num_threads); ++i) threads_.emplace_back([this] { Worker(); });
}

ThreadPool::~ThreadPool() { Join(); }

void ThreadPool::Join() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  for (auto& t : threads_) {
    if (t.joinable()) t.join();
  }
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

void ThreadPool::ParallelFor(int n, const std::function<void(int)>& fn, int max_helpers,
                             const std::function<void()>& first) {
  if (n <= 0) {
    if (first) first();
    return;
  }
  if (n == 1 && !first) {
    fn(0);
    return;
  }
  // The caller waits for the items, not for its helpers: a helper that starts after the caller
  // took every item finds none left and touches only this shared state. So ParallelFor may run
  // on the pool's own threads, several at once, without waiting for a thread that is waiting.
  struct State {
    explicit State(int n, const std::function<void(int)>* fn) : n(n), fn(fn) {}
    const int n;
    const std::function<void(int)>* fn;  // valid until every item is done
    std::atomic<int> next{0};
    absl::Mutex mu;
    int done ABSL_GUARDED_BY(mu) = 0;
  };
  auto state = std::make_shared<State>(n, &fn);
  auto drain = [](State& st) {
    int ran = 0;
    for (int i = st.next++; i < st.n; i = st.next++) {
      (*st.fn)(i);
      ++ran;
    }
    if (ran > 0) {
      absl::MutexLock lock(&st.mu);
      st.done += ran;
    }
  };
  // Every item may go to a helper while the caller runs `first`.
  int helpers = std::min(first ? n : n - 1, size());
  if (max_helpers >= 0) helpers = std::min(helpers, max_helpers);
  for (int h = 0; h < helpers; ++h) Schedule([state, drain] { drain(*state); });
  if (first) first();
  drain(*state);
  absl::MutexLock lock(&state->mu);
  state->mu.Await(absl::Condition(
      +[](State* st) ABSL_EXCLUSIVE_LOCKS_REQUIRED(st->mu) { return st->done == st->n; },
      state.get()));
}

}  // namespace tessera
