#include "trainer/lookup_riders.h"

#include <utility>

namespace tessera {

void LookupRiders::Expect() {
  std::vector<Ride> stale;
  {
    absl::MutexLock lock(&mu_);
    state_ = State::kExpected;
    stale = std::move(rides_);
    rides_.clear();
  }
  for (Ride& ride : stale) {
    ride.done(absl::InternalError("lookups left from an earlier step were never sent"));
  }
}

bool LookupRiders::Leave(std::vector<Ride> rides) {
  absl::MutexLock lock(&mu_);
  if (state_ != State::kExpected) return false;
  rides_ = std::move(rides);
  state_ = State::kLeft;
  return true;
}

void LookupRiders::Withdraw() {
  absl::MutexLock lock(&mu_);
  if (state_ == State::kExpected) state_ = State::kIdle;
}

std::vector<LookupRiders::Ride> LookupRiders::Take() {
  mu_.LockWhen(absl::Condition(
      +[](State* state) { return *state != State::kExpected; }, &state_));
  std::vector<Ride> rides;
  if (state_ == State::kLeft) rides = std::move(rides_);
  rides_.clear();
  state_ = State::kIdle;
  mu_.Unlock();
  return rides;
}

void LookupRiders::Release(const absl::Status& step) {
  std::vector<Ride> rides;
  {
    absl::MutexLock lock(&mu_);
    if (state_ == State::kLeft) rides = std::move(rides_);
    rides_.clear();
    state_ = State::kIdle;
  }
  for (Ride& ride : rides) {
    if (!step.ok()) {
      ride.done(step);
      continue;
    }
    ride.SendAlone();
  }
}

void LookupRiders::Ride::SendAlone() {
  client->PrefetchBatchAsync(meta, std::move(items), after_update, std::move(done));
}

}  // namespace tessera
