#include "trainer/heartbeat.h"

#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/rpc/answering_client.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

// Records the barriers it gets; holds their callbacks while `hold` is set.
class FakePserver : public AnsweringPServerClient {
 public:
  FakePserver() : AnsweringPServerClient(absl::OkStatus()) {}
  void BarrierAsync(const RequestMeta& meta, BarrierKind kind, DoneCallback done) override {
    {
      absl::MutexLock lock(&mu_);
      kinds_.push_back(kind);
      trainer_ids_.push_back(meta.trainer_id);
      if (hold_) {
        held_.push_back(std::move(done));
        return;
      }
    }
    done(absl::OkStatus());
  }

  void Hold() {
    absl::MutexLock lock(&mu_);
    hold_ = true;
  }
  // Answers the held heartbeats (with an error: a failed one does not stop the beating).
  void Release() {
    std::vector<DoneCallback> held;
    {
      absl::MutexLock lock(&mu_);
      hold_ = false;
      held.swap(held_);
    }
    for (auto& d : held) d(absl::UnavailableError("gone"));
  }
  size_t count() {
    absl::MutexLock lock(&mu_);
    return kinds_.size();
  }
  std::vector<BarrierKind> kinds() {
    absl::MutexLock lock(&mu_);
    return kinds_;
  }
  std::vector<int> trainer_ids() {
    absl::MutexLock lock(&mu_);
    return trainer_ids_;
  }

 private:
  absl::Mutex mu_;
  bool hold_ = false;
  std::vector<DoneCallback> held_;
  std::vector<BarrierKind> kinds_;
  std::vector<int> trainer_ids_;
};

// Waits (bounded) until `pred` holds.
template <typename Pred>
bool Eventually(Pred pred) {
  const absl::Time deadline = absl::Now() + absl::Seconds(10);
  while (absl::Now() < deadline) {
    if (pred()) return true;
    absl::SleepFor(absl::Milliseconds(2));
  }
  return pred();
}

TEST(HeartbeatTest, BeatsEveryPserverWithItsTrainerId) {
  FakePserver a, b;
  RequestMeta meta;
  meta.trainer_id = 3;
  {
    Heartbeat beat({&a, &b}, meta, absl::Milliseconds(5));
    ASSERT_TRUE(Eventually([&] { return a.count() >= 3 && b.count() >= 3; }));
    EXPECT_TRUE(Eventually([&] { return beat.answered() >= 6; }));
  }
  const size_t after = a.count();
  absl::SleepFor(absl::Milliseconds(30));
  EXPECT_EQ(a.count(), after);  // stopped with the object
  for (BarrierKind k : a.kinds()) EXPECT_EQ(k, HEARTBEAT);
  for (int id : b.trainer_ids()) EXPECT_EQ(id, 3);
}

TEST(HeartbeatTest, AtMostOneInFlightPerPserverAndFailuresDoNotStopIt) {
  FakePserver slow, quick;
  slow.Hold();
  std::unique_ptr<Heartbeat> beat =
      std::make_unique<Heartbeat>(std::vector<PServerClient*>{&slow, &quick}, RequestMeta{},
                                  absl::Milliseconds(2));
  ASSERT_TRUE(Eventually([&] { return quick.count() >= 10; }));
  EXPECT_EQ(slow.count(), 1u);  // its first is still unanswered
  slow.Release();               // answered with an error: the next ones come all the same
  EXPECT_TRUE(Eventually([&] { return slow.count() >= 3; }));
  beat.reset();  // returns: nothing is held any more
}

TEST(HeartbeatTest, DestructorWaitsForTheHeartbeatInFlight) {
  FakePserver slow;
  slow.Hold();
  auto beat = std::make_unique<Heartbeat>(std::vector<PServerClient*>{&slow}, RequestMeta{},
                                          absl::Milliseconds(1));
  ASSERT_TRUE(Eventually([&] { return slow.count() == 1; }));
  absl::Notification destroyed;
  std::thread destroyer([&] {
    beat.reset();
    destroyed.Notify();
  });
  EXPECT_FALSE(destroyed.WaitForNotificationWithTimeout(absl::Milliseconds(50)));
  slow.Release();
  EXPECT_TRUE(destroyed.WaitForNotificationWithTimeout(absl::Seconds(10)));
  destroyer.join();
}

}  // namespace
}  // namespace tessera
