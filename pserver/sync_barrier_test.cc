#include "pserver/sync_barrier.h"

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace tessera {
namespace {

using Kind = SyncBarrier::Kind;
const absl::Time kT0 = absl::FromUnixSeconds(1000);

// One trainer's view of a step: what it has done and what it was answered.
struct Trainer {
  enum Phase { kToSend, kAtSend, kToFetch, kAtFetch, kDone, kLeft };
  Phase phase = kToSend;
  std::vector<absl::Status> answers;
};

// Drives a SyncBarrier and checks the protocol's invariants after every event.
class Harness {
 public:
  explicit Harness(int n) : barrier_(n), trainers_(n) {}

  // Trainer k does its next thing: send barrier, fetch barrier, or (leave = true, instead of
  // its next barrier) COMPLETE.
  void Act(int k, bool leave = false) {
    Trainer& t = trainers_[k];
    if (leave) {
      t.phase = Trainer::kLeft;
      Handle(barrier_.Leave(k));
      return;
    }
    const Kind kind = t.phase == Trainer::kToSend ? Kind::kSend : Kind::kFetch;
    t.phase = kind == Kind::kSend ? Trainer::kAtSend : Trainer::kAtFetch;
    Handle(barrier_.Arrive(k, step_, kind, Reply(k, kind), kT0, "pserver p"));
  }
  void FinishOptimize(absl::Status s = absl::OkStatus()) {
    ASSERT_TRUE(optimize_running_);
    optimize_running_ = false;
    Handle(barrier_.OptimizeDone(s));
  }

  bool optimize_running() const { return optimize_running_; }
  int optimizes() const { return optimizes_; }
  int steps() const { return steps_; }
  const Trainer& trainer(int k) const { return trainers_[k]; }
  SyncBarrier& barrier() { return barrier_; }

 private:
  DoneCallback Reply(int k, Kind kind) {
    return [this, k, kind](absl::Status s) {
      Trainer& t = trainers_[k];
      t.answers.push_back(s);
      if (!s.ok()) return;
      if (kind == Kind::kSend) {
        // A send barrier returns only after the step's optimize finished.
        EXPECT_FALSE(optimize_running_) << "trainer " << k << " left the send barrier early";
        EXPECT_EQ(optimizes_, steps_ + 1) << "trainer " << k;
        t.phase = Trainer::kToFetch;
      } else {
        t.phase = Trainer::kDone;
      }
    };
  }
  void Handle(SyncBarrier::Actions a) {
    if (a.start_optimize) {
      EXPECT_FALSE(optimize_running_) << "a second optimize while one runs";
      // Every trainer still active has arrived at the send barrier.
      for (int k : barrier_.active()) {
        EXPECT_EQ(trainers_[k].phase, Trainer::kAtSend) << "optimize before trainer " << k;
      }
      optimize_running_ = true;
      ++optimizes_;
    }
    if (a.step_advanced) {
      for (int k : barrier_.active()) {
        EXPECT_EQ(trainers_[k].phase, Trainer::kAtFetch) << "step ended before trainer " << k;
      }
      ++steps_;
    }
    a.Answer();
  }

  SyncBarrier barrier_;
  std::vector<Trainer> trainers_;
  int64_t step_ = 0;
  bool optimize_running_ = false;
  int optimizes_ = 0;
  int steps_ = 0;
};

// Every interleaving of one step of 3 trainers: each sends, then fetches (once its send
// barrier returned) — or, for `leaver`, completes instead of its send (or, with `at_fetch`,
// instead of its fetch; -1: nobody leaves) — with the optimize finishing at any point after it
// started. Depth-first over all orders of the possible events; at the end exactly one optimize
// ran, the step advanced once and every barrier call was answered OK exactly once.
void ExploreAll(int leaver, bool at_fetch, const std::vector<int>& events, int* runs) {
  constexpr int kTrainers = 3;
  // Replay `events` on a fresh harness (event kTrainers = the optimize finishes).
  Harness h(kTrainers);
  for (int e : events) {
    if (e == kTrainers) {
      h.FinishOptimize();
    } else {
      const Trainer::Phase leave_phase = at_fetch ? Trainer::kToFetch : Trainer::kToSend;
      h.Act(e, e == leaver && h.trainer(e).phase == leave_phase);
    }
  }
  std::vector<int> next;
  for (int k = 0; k < kTrainers; ++k) {
    const Trainer::Phase p = h.trainer(k).phase;
    if (p == Trainer::kToSend || p == Trainer::kToFetch) next.push_back(k);
  }
  if (h.optimize_running()) next.push_back(kTrainers);
  if (next.empty()) {
    ++*runs;
    EXPECT_EQ(h.optimizes(), 1);
    EXPECT_EQ(h.steps(), 1);
    EXPECT_EQ(h.barrier().step(), 1);
    EXPECT_TRUE(h.barrier().idle());
    for (int k = 0; k < kTrainers; ++k) {
      const Trainer& t = h.trainer(k);
      if (k == leaver) {
        EXPECT_EQ(t.phase, Trainer::kLeft);
        ASSERT_EQ(t.answers.size(), at_fetch ? 1u : 0u);  // its send barrier, if it sent
        if (at_fetch) EXPECT_TRUE(t.answers[0].ok()) << t.answers[0];
        continue;
      }
      EXPECT_EQ(t.phase, Trainer::kDone) << "trainer " << k << " is stuck";
      ASSERT_EQ(t.answers.size(), 2u) << "trainer " << k;
      for (const absl::Status& s : t.answers) EXPECT_TRUE(s.ok()) << s;
    }
    return;
  }
  for (int e : next) {
    std::vector<int> longer = events;
    longer.push_back(e);
    ExploreAll(leaver, at_fetch, longer, runs);
    if (::testing::Test::HasFailure()) return;
  }
}

TEST(SyncBarrierTest, EveryInterleavingOfThreeTrainersRunsOneOptimizeAndOneStep) {
  int runs = 0;
  ExploreAll(-1, false, {}, &runs);
  // 3 sends in any order (3! = 6), the optimize, then fetches in any order (6).
  EXPECT_EQ(runs, 36);
}

TEST(SyncBarrierTest, EveryInterleavingWithATrainerThatCompletesInstead) {
  for (int leaver = 0; leaver < 3; ++leaver) {
    int runs = 0;
    // Instead of its send: it leaves among the 2 others' sends (3! = 6), then the optimize and
    // 2 fetches (2).
    ExploreAll(leaver, false, {}, &runs);
    EXPECT_EQ(runs, 12) << "leaver " << leaver;
    // Instead of its fetch: 3 sends (6), the optimize, then it leaves among 2 fetches (6).
    runs = 0;
    ExploreAll(leaver, true, {}, &runs);
    EXPECT_EQ(runs, 36) << "leaver " << leaver;
  }
}

TEST(SyncBarrierTest, WrongStepAndEarlyFetchAreRefusedAtOnce) {
  SyncBarrier b(2);
  std::vector<absl::Status> got;
  auto record = [&](absl::Status s) { got.push_back(s); };
  b.Arrive(0, 3, Kind::kSend, record, kT0, "pserver p").Answer();
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(got[0].message(), "trainer 0 is at step 3 but pserver p is at step 0");

  b.Arrive(0, 0, Kind::kSend, record, kT0, "pserver p").Answer();
  SyncBarrier::Actions a = b.Arrive(1, 0, Kind::kSend, record, kT0, "pserver p");
  ASSERT_TRUE(a.start_optimize);
  b.Arrive(1, 0, Kind::kFetch, record, kT0, "pserver p").Answer();
  ASSERT_EQ(got.size(), 2u);
  EXPECT_NE(got[1].message().find("before the send barrier completed"), absl::string_view::npos);
}

// Streamed data: a trainer's last batch at step s ends the epoch after s for everyone; a mark
// for another step than the current one is ignored.
TEST(SyncBarrierTest, ALastBatchEndsTheEpochAfterItsStepOnly) {
  SyncBarrier b(2);
  auto ignore = [](absl::Status) {};
  b.MarkLastBatch(5);  // not the current step
  EXPECT_FALSE(b.EndsEpoch(5));
  b.Arrive(0, 0, Kind::kSend, ignore, kT0, "p").Answer();
  EXPECT_FALSE(b.EndsEpoch(0));
  b.MarkLastBatch(0);
  b.Arrive(1, 0, Kind::kSend, ignore, kT0, "p").Answer();
  b.OptimizeDone(absl::OkStatus()).Answer();
  EXPECT_TRUE(b.EndsEpoch(0));
  b.Arrive(0, 0, Kind::kFetch, ignore, kT0, "p").Answer();
  b.Arrive(1, 0, Kind::kFetch, ignore, kT0, "p").Answer();
  ASSERT_EQ(b.step(), 1);
  EXPECT_FALSE(b.EndsEpoch(1));
  EXPECT_TRUE(b.EndsEpoch(0));  // a late question about step 0 still gets its answer
}

// Requests out of protocol (a process reusing a trainer id, a trainer skipping its send) must
// not end a step while a send of it still waits.
TEST(SyncBarrierTest, NoStepEndsWhileASendWaits) {
  SyncBarrier b(2);
  int answered = 0;
  auto count = [&](absl::Status) { ++answered; };
  b.Arrive(0, 0, Kind::kSend, count, kT0, "p").Answer();
  b.Arrive(1, 0, Kind::kFetch, count, kT0, "p").Answer();
  SyncBarrier::Actions a = b.Arrive(0, 0, Kind::kFetch, count, kT0, "p");
  EXPECT_FALSE(a.step_advanced);
  EXPECT_FALSE(a.start_optimize);
  a.Answer();
  EXPECT_EQ(answered, 0);
  EXPECT_EQ(b.step(), 0);
}

// Trainer 0 completes after step 0; trainer 1 (more data, or more epochs) arrives at step 1:
// refused, and the job fails, instead of trainer 1 training on alone.
TEST(SyncBarrierTest, NoTrainerGoesPastTheStepAnotherCompletedAt) {
  SyncBarrier b(2);
  std::vector<absl::Status> got;
  auto record = [&](absl::Status s) { got.push_back(s); };
  for (Kind kind : {Kind::kSend, Kind::kFetch}) {
    b.Arrive(0, 0, kind, record, kT0, "p").Answer();
    SyncBarrier::Actions a = b.Arrive(1, 0, kind, record, kT0, "p");
    if (a.start_optimize) a = b.OptimizeDone(absl::OkStatus());
    a.Answer();
  }
  ASSERT_EQ(b.step(), 1);
  EXPECT_TRUE(b.Leave(0, /*completed=*/true).fail_job.ok());  // completing is fine
  SyncBarrier::Actions late = b.Arrive(1, 1, Kind::kSend, record, kT0, "p");
  EXPECT_FALSE(late.fail_job.ok());
  EXPECT_NE(late.fail_job.message().find("trainer 1 is at step 1 but trainer 0 completed at step 1"),
            absl::string_view::npos)
      << late.fail_job;
  late.Answer();
  EXPECT_FALSE(got.back().ok());
  // A dropped trainer (async) is no completion.
  SyncBarrier d(2);
  d.Leave(0).Answer();
  EXPECT_TRUE(d.Arrive(1, 0, Kind::kSend, record, kT0, "p").fail_job.ok());
}

TEST(SyncBarrierTest, AFailedOptimizeAnswersTheSendersWithItsError) {
  SyncBarrier b(2);
  std::vector<absl::Status> got;
  auto record = [&](absl::Status s) { got.push_back(s); };
  b.Arrive(0, 0, Kind::kSend, record, kT0, "p").Answer();
  ASSERT_TRUE(b.Arrive(1, 0, Kind::kSend, record, kT0, "p").start_optimize);
  b.OptimizeDone(absl::InternalError("optimizing w@GRAD: nan")).Answer();
  ASSERT_EQ(got.size(), 2u);
  for (const absl::Status& s : got) EXPECT_EQ(s.message(), "optimizing w@GRAD: nan");
}

TEST(SyncBarrierTest, TimeoutNamesTheMissingTrainersAndFailAllAnswersEveryone) {
  SyncBarrier b(3);
  std::vector<absl::Status> got;
  auto record = [&](absl::Status s) { got.push_back(s); };
  b.Arrive(1, 0, Kind::kSend, record, kT0, "p").Answer();
  EXPECT_TRUE(b.CheckTimeout(kT0 + absl::Seconds(59), absl::Seconds(60), "pserver p").ok());
  absl::Status late = b.CheckTimeout(kT0 + absl::Seconds(61), absl::Seconds(60), "pserver p");
  EXPECT_EQ(late.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(late.message().find("pserver p: send barrier of step 0 timed out after 1m"),
            absl::string_view::npos)
      << late;
  EXPECT_NE(late.message().find("trainers [0, 2] did not arrive"), absl::string_view::npos);
  EXPECT_EQ(b.Missing(Kind::kFetch), "[0, 1, 2]");
  b.FailAll(late).Answer();
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0], late);
  EXPECT_TRUE(b.idle());
}

// A trainer's fetches sent along with its gradients (after_update) wait for the step's
// optimize, whichever order they arrive in, and are answered once it finished: in `updated`,
// after the send barrier's own replies. Steps already applied are answered at once; a step
// ahead of the pserver's is refused.
TEST(SyncBarrierTest, AwaitUpdateWaitsForTheStepsOptimize) {
  SyncBarrier b(2);
  std::vector<std::string> order;
  auto tag = [&](std::string name) {
    return [&order, name](absl::Status s) { order.push_back(name + (s.ok() ? "" : ":failed")); };
  };
  // Trainer 0's lookups of the next batch come before its gradients.
  SyncBarrier::Actions a = b.AwaitUpdate(0, 0, tag("update0"), kT0, "p");
  EXPECT_TRUE(a.replies.empty() && a.updated.empty());
  EXPECT_FALSE(b.idle());
  EXPECT_FALSE(b.Applied(0));
  b.Arrive(0, 0, Kind::kSend, tag("send0"), kT0, "p").Answer();
  b.AwaitUpdate(0, 0, tag("update0b"), kT0, "p").Answer();
  a = b.Arrive(1, 0, Kind::kSend, tag("send1"), kT0, "p");
  ASSERT_TRUE(a.start_optimize);
  a.Answer();
  b.AwaitUpdate(1, 0, tag("update1"), kT0, "p").Answer();  // during the optimize
  EXPECT_TRUE(order.empty());
  a = b.OptimizeDone(absl::OkStatus());
  EXPECT_EQ(a.replies.size(), 2u);
  EXPECT_EQ(a.updated.size(), 3u);
  a.Answer();
  EXPECT_EQ(order, (std::vector<std::string>{"send0", "send1", "update0", "update0b", "update1"}));
  EXPECT_TRUE(b.Applied(0));
  EXPECT_FALSE(b.Applied(1));
  // Applied already: at once. The next step: refused, naming both steps.
  order.clear();
  a = b.AwaitUpdate(1, 0, tag("late"), kT0, "p");
  EXPECT_EQ(a.replies.size(), 1u);
  a.Answer();
  std::vector<absl::Status> got;
  b.AwaitUpdate(
       1, 1, [&](absl::Status s) { got.push_back(s); }, kT0, "pserver p")
      .Answer();
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(got[0].message(), "trainer 1 awaits the update of step 1 but pserver p is at step 0");
  // The step advances: its update is no longer the current one's, and step 1's is not applied.
  b.Arrive(0, 0, Kind::kFetch, tag("fetch0"), kT0, "p").Answer();
  a = b.Arrive(1, 0, Kind::kFetch, tag("fetch1"), kT0, "p");
  EXPECT_TRUE(a.step_advanced);
  a.Answer();
  EXPECT_EQ(order, (std::vector<std::string>{"late", "fetch0", "fetch1"}));
  EXPECT_TRUE(b.Applied(0));
  EXPECT_FALSE(b.Applied(1));
  EXPECT_TRUE(b.idle());
}

// A failed optimize fails the waiters for its update; a job failure fails them too; waiting
// for an update that a missing trainer's gradients hold back times out naming that trainer.
TEST(SyncBarrierTest, UpdateWaitersFailWithTheStepAndTimeOut) {
  SyncBarrier b(2);
  std::vector<absl::Status> got;
  auto record = [&](absl::Status s) { got.push_back(s); };
  b.AwaitUpdate(0, 0, record, kT0, "p").Answer();
  b.Arrive(0, 0, Kind::kSend, record, kT0, "p").Answer();
  ASSERT_TRUE(b.Arrive(1, 0, Kind::kSend, record, kT0, "p").start_optimize);
  b.OptimizeDone(absl::InternalError("optimizing w@GRAD: nan")).Answer();
  ASSERT_EQ(got.size(), 3u);
  for (const absl::Status& s : got) EXPECT_EQ(s.message(), "optimizing w@GRAD: nan");
  EXPECT_FALSE(b.Applied(0));

  SyncBarrier c(3);
  got.clear();
  c.AwaitUpdate(2, 0, record, kT0, "p").Answer();
  c.Arrive(2, 0, Kind::kSend, record, kT0 + absl::Seconds(30), "p").Answer();
  absl::Status late = c.CheckTimeout(kT0 + absl::Seconds(61), absl::Seconds(60), "pserver p");
  EXPECT_EQ(late.code(), absl::StatusCode::kDeadlineExceeded);
  EXPECT_NE(late.message().find("for the update of step 0: trainers [0, 1] did not send"),
            absl::string_view::npos)
      << late;
  c.FailAll(late).Answer();
  ASSERT_EQ(got.size(), 2u);
  for (const absl::Status& s : got) EXPECT_EQ(s, late);
  EXPECT_TRUE(c.idle());
}

TEST(SyncBarrierTest, ADroppedTrainerNoLongerHoldsTheBarrier) {
  SyncBarrier b(3);
  std::vector<absl::Status> got;
  auto record = [&](absl::Status s) { got.push_back(s); };
  b.Arrive(0, 0, Kind::kSend, record, kT0, "p").Answer();
  b.Arrive(2, 0, Kind::kSend, record, kT0, "p").Answer();
  EXPECT_EQ(b.Missing(Kind::kSend), "[1]");
  SyncBarrier::Actions a = b.Leave(1);  // dropped (silent) or completed
  EXPECT_TRUE(a.start_optimize);
  EXPECT_EQ(b.active(), (std::set<int>{0, 2}));
  EXPECT_TRUE(b.CheckTimeout(kT0 + absl::Hours(1), absl::Seconds(60), "p").ok())
      << "an optimize in progress is not a stuck barrier";
  b.OptimizeDone(absl::OkStatus()).Answer();
  EXPECT_EQ(got.size(), 2u);
  b.Leave(0).Answer();
  b.Leave(2).Answer();
  EXPECT_TRUE(b.finished());
}

TEST(SyncBarrierTest, APausedBarrierStartsItsOptimizeOnResume) {
  SyncBarrier b(1);
  b.Pause();
  SyncBarrier::Actions a = b.Arrive(0, 0, Kind::kSend, [](absl::Status) {}, kT0, "p");
  EXPECT_FALSE(a.start_optimize);
  EXPECT_TRUE(b.CheckTimeout(kT0 + absl::Hours(1), absl::Seconds(1), "p").ok())
      << "a checkpoint in progress is not a stuck barrier";
  EXPECT_TRUE(b.Resume(kT0 + absl::Hours(1)).start_optimize);
}

}  // namespace
}  // namespace tessera
