#include "common/collective/request.h"

#include <utility>

namespace tessera {
namespace collective {
namespace {

class DoneRequest : public Request {
 public:
  explicit DoneRequest(absl::Status status) : status_(std::move(status)) {}
  absl::Status Wait() override { return status_; }

 private:
  const absl::Status status_;
};

class SharedStateRequest : public Request {
 public:
  SharedStateRequest(std::shared_ptr<RequestState> state, std::function<absl::Status()> then)
      : state_(std::move(state)), then_(std::move(then)) {}

  absl::Status Wait() override {
    absl::Status status = state_->Wait();
    absl::MutexLock lock(&mu_);
    if (!finished_) {
      finished_ = true;
      if (status.ok() && then_) status = then_();
      then_ = nullptr;
      result_ = status;
    }
    return result_;
  }

 private:
  std::shared_ptr<RequestState> state_;
  absl::Mutex mu_;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  std::function<absl::Status()> then_ ABSL_GUARDED_BY(mu_);
  absl::Status result_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

std::unique_ptr<Request> CompletedRequest(absl::Status status) {
  return std::make_unique<DoneRequest>(std::move(status));
}

void RequestState::Complete(absl::Status status) {
  absl::MutexLock lock(&mu_);
  if (done_) return;
  status_ = std::move(status);
  done_ = true;
}

absl::Status RequestState::Wait() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(&done_));
  return status_;
}

bool RequestState::done() {
  absl::MutexLock lock(&mu_);
  return done_;
}

std::unique_ptr<Request> StateRequest(std::shared_ptr<RequestState> state,
                                      std::function<absl::Status()> then) {
  return std::make_unique<SharedStateRequest>(std::move(state), std::move(then));
}

absl::Status WaitAll(std::vector<std::unique_ptr<Request>>& requests) {
  absl::Status first;
  for (auto& r : requests) {
    if (r == nullptr) continue;
    absl::Status s = r->Wait();
    if (first.ok() && !s.ok()) first = s;
  }
  return first;
}

}  // namespace collective
}  // namespace tessera
