#include "trainer/lookup_riders.h"

#include <atomic>
#include <thread>

#include "absl/synchronization/notification.h"
#include "common/rpc/answering_client.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

// Records the PrefetchBatchAsync calls it gets (Release sends rides by themselves) and answers
// them at once.
class RecordingClient : public AnsweringPServerClient {
 public:
  RecordingClient() : AnsweringPServerClient(absl::UnimplementedError("fake pserver"), "ps0") {}
  void PrefetchBatchAsync(const RequestMeta& meta, std::vector<PrefetchItem> items,
                          bool after_update, DoneCallback done) override {
    ++calls;
    tables += static_cast<int>(items.size());
    last_step = meta.step;
    last_after_update = after_update;
    done(absl::OkStatus());
  }

  std::atomic<int> calls{0}, tables{0};
  int64_t last_step = -1;
  bool last_after_update = false;
};

LookupRiders::Ride RideOf(PServerClient* client, int64_t step, std::atomic<int>* answered) {
  static const std::vector<int64_t> kIds = {1, 2};
  static Tensor out;
  LookupRiders::Ride ride;
  ride.client = client;
  ride.meta.step = step;
  ride.items = {{"emb", &kIds, &out}, {"wide", &kIds, &out}};
  ride.done = [answered](absl::Status s) {
    if (s.ok() && answered != nullptr) ++*answered;
  };
  return ride;
}

TEST(LookupRidersTest, TakeWithoutExpectReturnsNothingAtOnce) {
  LookupRiders riders;
  EXPECT_TRUE(riders.Take().empty());
  RecordingClient client;
  std::atomic<int> answered{0};
  std::vector<LookupRiders::Ride> rides = {RideOf(&client, 3, &answered)};
  EXPECT_FALSE(riders.Leave(rides));  // nothing expected: the caller sends them itself
  EXPECT_EQ(client.calls, 0);
  EXPECT_EQ(answered, 0);
}

TEST(LookupRidersTest, TheSendWaitsForTheLookupsAndTakesThem) {
  LookupRiders riders;
  RecordingClient client;
  std::atomic<int> answered{0};
  riders.Expect();
  std::atomic<bool> taken{false};
  std::vector<LookupRiders::Ride> got;
  std::thread send([&] {
    got = riders.Take();
    taken = true;
  });
  // The send blocks until the look-ahead leaves its lookups.
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_FALSE(taken);
  EXPECT_TRUE(riders.Leave({RideOf(&client, 7, &answered)}));
  send.join();
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].client, &client);
  EXPECT_EQ(got[0].meta.step, 7);
  EXPECT_EQ(got[0].items.size(), 2u);
  got[0].done(absl::OkStatus());
  EXPECT_EQ(answered, 1);
  // Taken: Release sends nothing, and a second Leave is refused.
  riders.Release(absl::OkStatus());
  EXPECT_EQ(client.calls, 0);
  EXPECT_FALSE(riders.Leave({RideOf(&client, 7, &answered)}));
}

TEST(LookupRidersTest, AWithdrawnLookupLetsTheSendGoWithoutIt) {
  LookupRiders riders;
  riders.Expect();
  std::thread lookahead([&] { riders.Withdraw(); });
  EXPECT_TRUE(riders.Take().empty());
  lookahead.join();
  // Withdraw when nothing is expected changes nothing.
  riders.Withdraw();
  EXPECT_TRUE(riders.Take().empty());
}

TEST(LookupRidersTest, ReleaseSendsLookupsTheSendDidNotTake) {
  LookupRiders riders;
  RecordingClient client;
  std::atomic<int> answered{0};
  riders.Expect();
  EXPECT_TRUE(riders.Leave({RideOf(&client, 4, &answered)}));
  riders.Release(absl::OkStatus());  // a send that did not reach this pserver
  EXPECT_EQ(client.calls, 1);
  EXPECT_EQ(client.tables, 2);
  EXPECT_EQ(client.last_step, 4);
  EXPECT_TRUE(client.last_after_update);
  EXPECT_EQ(answered, 1);
  // Released while still expected (the send failed first): a late Leave is refused, so the
  // look-ahead sends its lookups itself.
  riders.Expect();
  riders.Release(absl::OkStatus());
  EXPECT_FALSE(riders.Leave({RideOf(&client, 5, &answered)}));
  EXPECT_TRUE(riders.Take().empty());
}

// A step that failed before its send: the lookups left for it get its error (the pservers,
// never sent the step, could not answer them); none goes out.
TEST(LookupRidersTest, AFailedStepAnswersItsLookupsWithItsError) {
  LookupRiders riders;
  RecordingClient client;
  absl::Status got;
  riders.Expect();
  LookupRiders::Ride ride = RideOf(&client, 4, nullptr);
  ride.done = [&got](absl::Status s) { got = s; };
  EXPECT_TRUE(riders.Leave({std::move(ride)}));
  riders.Release(absl::InternalError("op mul failed"));
  EXPECT_EQ(got.code(), absl::StatusCode::kInternal);
  EXPECT_EQ(got.message(), "op mul failed");
  EXPECT_EQ(client.calls, 0);
  // Lookups never released are answered (with an error) by the next Expect, not dropped.
  riders.Expect();
  ride = RideOf(&client, 5, nullptr);
  ride.done = [&got](absl::Status s) { got = s; };
  EXPECT_TRUE(riders.Leave({std::move(ride)}));
  got = absl::OkStatus();
  riders.Expect();
  EXPECT_EQ(got.code(), absl::StatusCode::kInternal);
  EXPECT_NE(got.message().find("never sent"), std::string::npos) << got;
  riders.Withdraw();
  EXPECT_EQ(client.calls, 0);
}

}  // namespace
}  // namespace tessera
