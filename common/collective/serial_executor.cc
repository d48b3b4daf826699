#include "common/collective/serial_executor.h"

#include <utility>

namespace tessera {
namespace collective {
namespace {

// The executor whose operation the current thread is running (nested Run() calls run inline).
thread_local const SerialExecutor* current_executor = nullptr;

class ScopedCurrent {
 public:
  explicit ScopedCurrent(const SerialExecutor* e) : prev_(current_executor) {
    current_executor = e;
  }
  ~ScopedCurrent() { current_executor = prev_; }

 private:
  const SerialExecutor* prev_;
};

}  // namespace

SerialExecutor::~SerialExecutor() { Stop(); }

std::shared_ptr<RequestState> SerialExecutor::EnqueueLocked(Op op) {
  auto state = std::make_shared<RequestState>();
  queue_.push_back(Job{std::move(op), state});
  if (!worker_started_) {
    worker_started_ = true;
    worker_ = std::thread([this] { WorkerLoop(); });
  }
  return state;
}

absl::Status SerialExecutor::Run(Op op) {
  if (current_executor == this) return op();
  std::shared_ptr<RequestState> state;
  {
    absl::MutexLock lock(&mu_);
    if (stopped_) return absl::FailedPreconditionError("communicator was shut down");
    if (!busy_ && queue_.empty()) {
      busy_ = true;
    } else {
      state = EnqueueLocked(std::move(op));
    }
  }
  if (state != nullptr) return state->Wait();
  absl::Status status;
  {
    ScopedCurrent current(this);
    status = op();
  }
  absl::MutexLock lock(&mu_);
  busy_ = false;
  return status;
}

std::unique_ptr<Request> SerialExecutor::Submit(Op op) {
  absl::MutexLock lock(&mu_);
  if (stopped_)
    return CompletedRequest(absl::FailedPreconditionError("communicator was shut down"));
  return StateRequest(EnqueueLocked(std::move(op)));
}

void SerialExecutor::WorkerLoop() {
  ScopedCurrent current(this);
  while (true) {
    Job job;
    {
      absl::MutexLock lock(&mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stopped_ || (!busy_ && !queue_.empty());
      };
      mu_.Await(absl::Condition(&ready));
      if (stopped_) return;
      job = std::move(queue_.front());
      queue_.pop_front();
      busy_ = true;
    }
    absl::Status status = job.op();
    {
      absl::MutexLock lock(&mu_);
      busy_ = false;
    }
    job.state->Complete(std::move(status));
  }
}

void SerialExecutor::Stop() {
  std::deque<Job> cancelled;
  {
    absl::MutexLock lock(&mu_);
    stopped_ = true;
    cancelled.swap(queue_);
    auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !busy_; };
    mu_.Await(absl::Condition(&idle));
  }
  for (Job& job : cancelled) {
    job.state->Complete(absl::CancelledError("communicator shut down before the operation ran"));
  }
  if (worker_.joinable()) worker_.join();
}

}  // namespace collective
}  // namespace tessera
