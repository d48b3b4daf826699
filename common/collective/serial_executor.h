// SerialExecutor: runs a communicator's operations one at a time, in the order they were issued.
//
// Collectives on one communicator must run in the same order on every rank and never overlap,
// yet callers want both blocking calls and background ones (AllReduceAsync). Run() executes a
// blocking operation on the calling thread when nothing is queued (no thread hop), otherwise it
// waits for its turn on the worker thread; Submit() queues an operation for the worker. An
// operation that itself calls Run() (a composite job: compress, all-gather, decompress) runs the
// inner call inline. Thread-safe.
#ifndef TESSERA_COMMON_COLLECTIVE_SERIAL_EXECUTOR_H_
#define TESSERA_COMMON_COLLECTIVE_SERIAL_EXECUTOR_H_

#include <deque>
#include <functional>
#include <memory>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "common/collective/request.h"

namespace tessera {
namespace collective {

class SerialExecutor {
 public:
  using Op = std::function<absl::Status()>;

  SerialExecutor() = default;
  ~SerialExecutor();
  SerialExecutor(const SerialExecutor&) = delete;
  SerialExecutor& operator=(const SerialExecutor&) = delete;

  // Runs `op` after every operation issued before it and returns its status. FailedPrecondition
  // after Stop().
  absl::Status Run(Op op);
  // Queues `op`; the request finishes with its status (CANCELLED if Stop() comes first).
  std::unique_ptr<Request> Submit(Op op);
  // Cancels queued operations, waits for the running one and joins the worker. Idempotent.
  void Stop();

 private:
  struct Job {
    Op op;
    std::shared_ptr<RequestState> state;
  };
  std::shared_ptr<RequestState> EnqueueLocked(Op op) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void WorkerLoop();

  absl::Mutex mu_;
  std::deque<Job> queue_ ABSL_GUARDED_BY(mu_);
  bool busy_ ABSL_GUARDED_BY(mu_) = false;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;
  bool worker_started_ ABSL_GUARDED_BY(mu_) = false;
  std::thread worker_;
};

}  // namespace collective
}  // namespace tessera

#endif  // TESSERA_COMMON_COLLECTIVE_SERIAL_EXECUTOR_H_
