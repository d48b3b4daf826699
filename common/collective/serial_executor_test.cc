#include "common/collective/serial_executor.h"

#include <atomic>
#include <thread>
#include <vector>

#include "absl/synchronization/notification.h"
#include "gtest/gtest.h"

namespace tessera {
namespace collective {
namespace {

TEST(SerialExecutorTest, RunsInIssueOrderWithoutOverlap) {
  SerialExecutor executor;
  std::vector<int> order;
  std::atomic<int> running{0};
  absl::Notification release;
  auto op = [&](int id, bool block) {
    return [&, id, block]() -> absl::Status {
      EXPECT_EQ(running.fetch_add(1), 0) << "operations overlap";
      if (block) release.WaitForNotification();
      order.push_back(id);
      running.fetch_sub(1);
      return absl::OkStatus();
    };
  };
  auto r1 = executor.Submit(op(1, true));
  auto r2 = executor.Submit(op(2, false));
  std::thread blocking([&] { EXPECT_TRUE(executor.Run(op(3, false)).ok()); });
  release.Notify();
  blocking.join();
  EXPECT_TRUE(r1->Wait().ok());
  EXPECT_TRUE(r2->Wait().ok());
  EXPECT_EQ(order, (std::vector<int>{1, 2, 3}));
}

TEST(SerialExecutorTest, IdleRunIsInlineAndNestedRunsDoNotDeadlock) {
  SerialExecutor executor;
  const std::thread::id caller = std::this_thread::get_id();
  std::thread::id ran_on;
  absl::Status s = executor.Run([&]() -> absl::Status {
    ran_on = std::this_thread::get_id();
    return executor.Run([] { return absl::InternalError("inner"); });
  });
  EXPECT_EQ(ran_on, caller);
  EXPECT_EQ(s.message(), "inner");
  auto r = executor.Submit([&] { return executor.Run([] { return absl::OkStatus(); }); });
  EXPECT_TRUE(r->Wait().ok());
}

TEST(SerialExecutorTest, StopCancelsQueuedOperations) {
  SerialExecutor executor;
  absl::Notification started, release;
  auto first = executor.Submit([&] {
    started.Notify();
    release.WaitForNotification();
    return absl::OkStatus();
  });
  auto second = executor.Submit([] { return absl::OkStatus(); });
  started.WaitForNotification();
  std::thread stopper([&] { executor.Stop(); });
  absl::SleepFor(absl::Milliseconds(50));
  release.Notify();
  stopper.join();
  EXPECT_TRUE(first->Wait().ok());
  EXPECT_TRUE(absl::IsCancelled(second->Wait()));
  EXPECT_TRUE(absl::IsFailedPrecondition(executor.Run([] { return absl::OkStatus(); })));
  EXPECT_TRUE(absl::IsFailedPrecondition(executor.Submit([] { return absl::OkStatus(); })->Wait()));
}

}  // namespace
}  // namespace collective
}  // namespace tessera
