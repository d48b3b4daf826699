#include "pserver/sync_barrier.h"

#include <iterator>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace tessera {

SyncBarrier::SyncBarrier(int num_trainers, int64_t step) : step_(step) {
  for (int k = 0; k < num_trainers; ++k) active_.insert(k);
}

bool SyncBarrier::Complete(const Barrier& b) const {
  if (b.waiting.empty()) return false;
  for (int k : active_) {
    if (b.arrived.count(k) == 0) return false;
  }
  return true;
}

SyncBarrier::Actions SyncBarrier::Advance() {
  Actions a;
  if (!optimizing_ && !paused_ && Complete(send_)) {
    optimizing_ = true;
    a.start_optimize = true;
    return a;
  }
  // The fetch barrier waits for the send barrier's waiters to be answered (they are once the
  // optimize finished), so that no trainer can be at step s + 1 before all left step s's send.
  if (!optimizing_ && send_.waiting.empty() && Complete(fetch_)) {
    for (DoneCallback& d : fetch_.waiting) a.replies.push_back({std::move(d), absl::OkStatus()});
    fetch_ = Barrier();
    ++step_;
    applied_ = false;
    a.step_advanced = true;
  }
  return a;
}

SyncBarrier::Actions SyncBarrier::Arrive(int trainer, int64_t step, Kind kind, DoneCallback done,
                                         absl::Time now, const std::string& who) {
  absl::Status refused;
  if (completed_by_ >= 0 && step >= completed_at_) {
    refused = absl::FailedPreconditionError(absl::StrCat(
        "trainer ", trainer, " is at step ", step, " but trainer ", completed_by_,
        " completed at step ", completed_at_, ": the trainers disagree on how many steps this job "
        "has (their data, --batch_size or --epochs)"));
    Actions a;
    a.fail_job = refused;
    a.replies.push_back({std::move(done), std::move(refused)});
    return a;
  }
  if (step != step_) {
    refused = absl::FailedPreconditionError(absl::StrCat(
        "trainer ", trainer, " is at step ", step, " but ", who, " is at step ", step_));
  } else if (kind == Kind::kFetch && optimizing_) {
    refused = absl::FailedPreconditionError(
        absl::StrCat("trainer ", trainer, " reached the fetch barrier of step ", step_,
                     " before the send barrier completed"));
  }
  if (!refused.ok()) {
    Actions a;
    a.replies.push_back({std::move(done), std::move(refused)});
    return a;
  }
  Barrier& b = kind == Kind::kSend ? send_ : fetch_;
  if (b.arrived.empty() && b.waiting.empty()) b.first_arrival = now;
  b.arrived.insert(trainer);
  b.waiting.push_back(std::move(done));
  return Advance();
}

SyncBarrier::Actions SyncBarrier::AwaitUpdate(int trainer, int64_t step, DoneCallback done,
                                              absl::Time now, const std::string& who) {
  Actions a;
  if (Applied(step)) {
    a.replies.push_back({std::move(done), absl::OkStatus()});
  } else if (step > step_) {
    a.replies.push_back({std::move(done), absl::FailedPreconditionError(absl::StrCat(
                                              "trainer ", trainer, " awaits the update of step ",
                                              step, " but ", who, " is at step ", step_))});
  } else {
    if (update_.waiting.empty()) update_.first_arrival = now;
    update_.arrived.insert(trainer);
    update_.waiting.push_back(std::move(done));
  }
  return a;
}

SyncBarrier::Actions SyncBarrier::Leave(int trainer, bool completed) {
  if (completed && completed_by_ < 0 && active_.count(trainer) > 0) {
    completed_at_ = step_;
    completed_by_ = trainer;
  }
  active_.erase(trainer);
  return Advance();
}

SyncBarrier::Actions SyncBarrier::OptimizeDone(absl::Status status) {
  optimizing_ = false;
  applied_ = status.ok();
  std::vector<Reply> sends;
  for (DoneCallback& d : send_.waiting) sends.push_back({std::move(d), status});
  send_ = Barrier();
  std::vector<Reply> updated;
  for (DoneCallback& d : update_.waiting) updated.push_back({std::move(d), status});
  update_ = Barrier();
  // A fetch barrier may be complete already (its other trainers completed meanwhile).
  Actions a = Advance();
  a.replies.insert(a.replies.begin(), std::make_move_iterator(sends.begin()),
                   std::make_move_iterator(sends.end()));
  a.updated = std::move(updated);
  return a;
}

SyncBarrier::Actions SyncBarrier::Resume(absl::Time now) {
  paused_ = false;
  if (!send_.waiting.empty()) send_.first_arrival = now;
  return Advance();
}

SyncBarrier::Actions SyncBarrier::FailAll(absl::Status status) {
  Actions a;
  for (Barrier* b : {&send_, &fetch_, &update_}) {
    for (DoneCallback& d : b->waiting) a.replies.push_back({std::move(d), status});
    *b = Barrier();
  }
  return a;
}

std::string SyncBarrier::Missing(Kind kind) const {
  const Barrier& b = kind == Kind::kSend ? send_ : fetch_;
  std::vector<int> missing;
  for (int k : active_) {
    if (b.arrived.count(k) == 0) missing.push_back(k);
  }
  return absl::StrCat("[", absl::StrJoin(missing, ", "), "]");
}

std::string SyncBarrier::MissingFromAll() const {
  return absl::StrCat("[", absl::StrJoin(active_, ", "), "]");
}

absl::Status SyncBarrier::CheckTimeout(absl::Time now, absl::Duration timeout,
                                       const std::string& who) const {
  if (optimizing_ || paused_) return absl::OkStatus();
  for (Kind kind : {Kind::kSend, Kind::kFetch}) {
    const Barrier& b = kind == Kind::kSend ? send_ : fetch_;
    if (b.waiting.empty() || now - b.first_arrival <= timeout) continue;
    return absl::DeadlineExceededError(absl::StrCat(
        who, ": ", kind == Kind::kSend ? "send" : "fetch", " barrier of step ", step_,
        " timed out after ", absl::FormatDuration(timeout), ": trainers ", Missing(kind),
        " did not arrive (dead or stuck; check their logs, then restart the job)"));
  }
  if (!update_.waiting.empty() && now - update_.first_arrival > timeout) {
    return absl::DeadlineExceededError(absl::StrCat(
        who, ": trainers ", absl::StrJoin(update_.arrived, ", "), " waited ",
        absl::FormatDuration(timeout), " for the update of step ", step_, ": trainers ",
        Missing(Kind::kSend),
        " did not send their gradients (dead or stuck; check their logs, then restart the job)"));
  }
  return absl::OkStatus();
}

}  // namespace tessera
