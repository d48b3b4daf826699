// ThreadPool: a fixed set of worker threads running scheduled closures in FIFO order.
// Thread-safe. Join (and the destructor) runs every closure already scheduled, then joins the
// workers.
#ifndef TESSERA_COMMON_BASE_THREAD_POOL_H_
#define TESSERA_COMMON_BASE_THREAD_POOL_H_

#include <deque>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace tessera {

class ThreadPool {
 public:
  explicit ThreadPool(int num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  void Schedule(std::function<void()> fn);
  // Runs every closure scheduled so far (and any they schedule) and joins the workers, while the
  // pool is still whole (its closures may use it). Closures scheduled afterwards never run.
  // Idempotent; not concurrently with itself.
  void Join();
  // Runs fn(0..n-1) on the pool (and the calling thread) and returns when all are done. It
  // never waits for a pool thread to become free, so the pool's own closures may call it.
  // max_helpers >= 0 caps the pool threads asked to help (a caller from outside the pool that
  // wants size() threads in all, itself included, passes size() - 1). `first` (may be empty)
  // runs on the calling thread once the helpers were asked, before it takes items: work of its
  // own that overlaps theirs.
  void ParallelFor(int n, const std::function<void(int)>& fn, int max_helpers = -1,
                   const std::function<void()>& first = nullptr);
  int size() const { return static_cast<int>(threads_.size()); }

 private:
  void Worker();

  absl::Mutex mu_;
  std::deque<std::function<void()>> queue_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

}  // namespace tessera

#endif  // TESSERA_COMMON_BASE_THREAD_POOL_H_
