#include "trainer/heartbeat.h"

#include <utility>

namespace tessera {

Heartbeat::Heartbeat(std::vector<PServerClient*> pservers, RequestMeta meta,
                     absl::Duration interval)
    : pservers_(std::move(pservers)),
      meta_(std::move(meta)),
      interval_(interval),
      in_flight_(pservers_.size(), false) {
  thread_ = std::thread([this] { Run(); });
}

Heartbeat::~Heartbeat() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  thread_.join();
  absl::MutexLock lock(&mu_);
  auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    for (bool b : in_flight_) {
      if (b) return false;
    }
    return true;
  };
  mu_.Await(absl::Condition(&idle));
}

int64_t Heartbeat::answered() const {
  absl::MutexLock lock(&mu_);
  return answered_;
}

void Heartbeat::Run() {
  auto stop = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_; };
  while (true) {
    std::vector<size_t> due;
    {
      absl::MutexLock lock(&mu_);
      if (stopping_) return;
      for (size_t i = 0; i < pservers_.size(); ++i) {
        if (in_flight_[i]) continue;  // that pserver has not answered the last one yet
        in_flight_[i] = true;
        due.push_back(i);
      }
    }
    for (size_t i : due) {
      pservers_[i]->BarrierAsync(meta_, HEARTBEAT, [this, i](absl::Status s) {
        absl::MutexLock lock(&mu_);
        in_flight_[i] = false;
        if (s.ok()) ++answered_;
      });
    }
    absl::MutexLock lock(&mu_);
    mu_.AwaitWithTimeout(absl::Condition(&stop), interval_);
  }
}

}  // namespace tessera
