#include "trainer/pending_requests.h"

#include "absl/strings/str_cat.h"

namespace tessera {

DoneCallback PendingRequests::Add() {
  {
    absl::MutexLock lock(&state_->mu);
    ++state_->pending;
  }
  return [state = state_, what = what_](absl::Status s) {
    absl::MutexLock lock(&state->mu);
    if (state->error.ok() && !s.ok()) {
      state->error = absl::Status(s.code(), absl::StrCat(what, ": ", s.message()));
    }
    --state->pending;
  };
}

absl::Status PendingRequests::Wait() {
  State& st = *state_;
  absl::MutexLock lock(&st.mu);
  st.mu.Await(absl::Condition(
      +[](State* s) ABSL_EXCLUSIVE_LOCKS_REQUIRED(s->mu) { return s->pending == 0; }, &st));
  return std::exchange(st.error, absl::OkStatus());
}

}  // namespace tessera
