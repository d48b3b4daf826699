#include "trainer/rpc_ops.h"

#include <thread>

#include "gtest/gtest.h"

namespace tessera {
namespace {

// The step's send waits for its early sends (PendingRequests::Wait) and fails with their first
// error; the next step starts clean.
TEST(PendingRequestsTest, WaitReturnsOnceAllFinishedWithTheFirstErrorThenForgetsIt) {
  PendingRequests pending;
  EXPECT_TRUE(pending.Wait().ok());  // nothing in flight
  DoneCallback a = pending.Add();
  DoneCallback b = pending.Add();
  DoneCallback c = pending.Add();
  a(absl::OkStatus());
  std::thread late([&] {
    b(absl::UnavailableError("pserver 127.0.0.1:1 SendBatch: connection refused"));
    c(absl::DeadlineExceededError("pserver 127.0.0.1:2 SendBatch: deadline"));
  });
  absl::Status s = pending.Wait();
  late.join();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_NE(s.message().find("127.0.0.1:1"), absl::string_view::npos) << s;
  EXPECT_TRUE(pending.Wait().ok());  // reported once
}

TEST(PendingRequestsTest, WaitBlocksUntilTheLastOneFinished) {
  PendingRequests pending;
  DoneCallback a = pending.Add();
  std::atomic<bool> finished{false};
  std::thread late([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    finished = true;
    a(absl::OkStatus());
  });
  EXPECT_TRUE(pending.Wait().ok());
  EXPECT_TRUE(finished.load());
  late.join();
}

}  // namespace
}  // namespace tessera
