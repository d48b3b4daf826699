// SyncBarrier: the sync-mode step protocol of one pserver, as a state machine with no I/O, no
// thread and no clock of its own. Per step s:
//
//   every active trainer arrives at the SEND barrier of s  -> the step's optimize starts (once);
//   the optimize finishes                                  -> the send barrier's waiters return;
//   every active trainer arrives at the FETCH barrier of s -> its waiters return, step s + 1.
//
// Requests that want step s's update (AwaitUpdate: a trainer's fetches sent together with its
// gradients) wait until the optimize finished, and are then answered with the send barrier.
//
// A trainer that completes (COMPLETE) or is dropped leaves `active` and stops counting; a
// barrier then completes without it. Arrivals are idempotent per trainer. Each event returns
// what the caller must do (start the optimize; answer waiters); the ParameterServer calls it
// under its mutex and runs the callbacks. Not thread-safe.
#ifndef TESSERA_PSERVER_SYNC_BARRIER_H_
#define TESSERA_PSERVER_SYNC_BARRIER_H_

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/rpc/rpc.h"

namespace tessera {

class SyncBarrier {
 public:
  enum class Kind { kSend, kFetch };

  // A waiter to answer, and its answer.
  struct Reply {
    DoneCallback done;
    absl::Status status;
  };
  // What an event asks of the caller.
  struct Actions {
    bool start_optimize = false;  // run the step's optimize, then call OptimizeDone
    bool step_advanced = false;   // the fetch barrier completed: a new step began
    // Not OK: the job cannot go on (trainers disagree on its length); fail it with this.
    absl::Status fail_job;
    std::vector<Reply> replies;   // answer each (outside the caller's lock if it can)
    // AwaitUpdate's waiters, released by a finished optimize: they go on to serve fetches and
    // lookups, so the caller may answer them on several threads.
    std::vector<Reply> updated;

    void Answer() {
      for (std::vector<Reply>* list : {&replies, &updated}) {
        for (Reply& r : *list) r.done(r.status);
        list->clear();
      }
    }
  };

  // Trainers 0..num_trainers-1 are active at step `step`.
  explicit SyncBarrier(int num_trainers, int64_t step = 0);

  int64_t step() const { return step_; }
  const std::set<int>& active() const { return active_; }
  bool optimizing() const { return optimizing_; }
  bool finished() const { return active_.empty(); }
  // Nobody waits at either barrier, nor for an update.
  bool idle() const {
    return send_.waiting.empty() && fetch_.waiting.empty() && update_.waiting.empty();
  }
  // Whether the update (optimize) of `step` has been applied: every step before the current
  // one's, and the current one's once its optimize finished well.
  bool Applied(int64_t step) const { return step < step_ || (step == step_ && applied_); }

  // Trainer `trainer` reached barrier `kind` of `step`. A wrong step, or a fetch before the
  // send barrier's optimize finished, is answered at once with FAILED_PRECONDITION naming both
  // steps (`who` prefixes the message, e.g. "pserver host:port"). Otherwise `done` waits.
  Actions Arrive(int trainer, int64_t step, Kind kind, DoneCallback done, absl::Time now,
                 const std::string& who);
  // Trainer `trainer` wants the parameters as they are after the update of `step`: answered at
  // once (OK, in `replies`) when Applied(step); refused with FAILED_PRECONDITION naming both
  // steps for a step after the current one; otherwise `done` waits for the current step's
  // optimize and gets its status (in OptimizeDone's `updated`).
  Actions AwaitUpdate(int trainer, int64_t step, DoneCallback done, absl::Time now,
                      const std::string& who);
  // The trainer finished training (COMPLETE; `completed`) or was dropped: it no longer counts.
  // Once a trainer completed at step c, a barrier of step c or later is refused and fails the
  // job: a trainer with more steps than another would train on without it.
  Actions Leave(int trainer, bool completed = false);
  // The optimize started by an earlier Arrive/Leave/Resume finished with `status`: the send
  // barrier's waiters get it.
  Actions OptimizeDone(absl::Status status);
  // While paused (a checkpoint being written) no optimize starts and no barrier times out;
  // Resume starts a due optimize, and a waiting send barrier's wait counts from `now`.
  void Pause() { paused_ = true; }
  Actions Resume(absl::Time now);
  // Streamed data: trainer(s) sent the send barrier of `step` (the current one) saying it is
  // their last batch, so the epoch ends after `step` for every trainer; EndsEpoch(step) tells
  // (asked when the send barrier is released). Steps before the current one are ignored.
  void MarkLastBatch(int64_t step) {
    if (step == step_) last_batch_step_ = step;
  }
  bool EndsEpoch(int64_t step) const { return last_batch_step_ == step; }
  // Restores the step of a checkpoint (nobody may be waiting).
  void SetStep(int64_t step) {
    step_ = step;
    applied_ = false;
  }

  // Every waiter, answered with `status` (the server failed); the barriers are emptied.
  Actions FailAll(absl::Status status);
  // DEADLINE_EXCEEDED naming the barrier, the step and the missing trainers when a barrier (or
  // the wait for an update, which needs the send barrier) has had a waiter for longer than
  // `timeout` (and no optimize or pause holds it); else OK.
  absl::Status CheckTimeout(absl::Time now, absl::Duration timeout, const std::string& who) const;
  // "[1, 2]": the active trainers that have not arrived at `kind` (all active ones for none).
  std::string Missing(Kind kind) const;
  std::string MissingFromAll() const;

 private:
  struct Barrier {
    std::set<int> arrived;
    std::vector<DoneCallback> waiting;
    absl::Time first_arrival;
  };
  bool Complete(const Barrier& b) const;
  // Starts the optimize or advances the step when a barrier is complete.
  Actions Advance();

  int64_t step_;
  std::set<int> active_;
  Barrier send_, fetch_;
  Barrier update_;  // AwaitUpdate's waiters (`arrived`: the trainers waiting)
  bool optimizing_ = false;
  bool applied_ = false;  // the current step's optimize finished well
  bool paused_ = false;
  // The step at which the first trainer completed, and which (-1: none yet).
  int64_t completed_at_ = -1;
  int completed_by_ = -1;
  int64_t last_batch_step_ = -1;  // MarkLastBatch's step (-1: none)
};

}  // namespace tessera

#endif  // TESSERA_PSERVER_SYNC_BARRIER_H_
