#include "trainer/communicator.h"

#include <deque>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "common/rpc/answering_client.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

// A client whose sends complete when the test says so (or at once, with `inline_done`).
class FakeClient : public AnsweringPServerClient {
 public:
  struct Call {
    std::string name;
    Variable var;  // a copy of what was sent
    DoneCallback done;
  };
  explicit FakeClient(std::string endpoint, bool inline_done = false)
      : AnsweringPServerClient(absl::UnimplementedError("fake"), std::move(endpoint)),
        inline_done_(inline_done) {}

  void SendVariableAsync(const RequestMeta&, const std::string& name, const Variable* var,
                         DoneCallback done) override {
    Call call{name, Variable(), std::move(done)};
    if (const SelectedRows* sr = var->GetIf<SelectedRows>()) {
      SelectedRows* c = call.var.GetMutable<SelectedRows>();
      c->rows = sr->rows;
      c->value.CopyFrom(sr->value);
    } else {
      call.var.GetMutable<Tensor>()->CopyFrom(var->Get<Tensor>());
    }
    if (inline_done_) {
      DoneCallback d = std::move(call.done);
      {
        absl::MutexLock lock(&mu_);
        sent_.push_back(std::move(call));
      }
      d(absl::OkStatus());
      return;
    }
    absl::MutexLock lock(&mu_);
    pending_.push_back(std::move(call));
  }

  // Records each batch's size; its variables then go as SendVariable calls (the default).
  void SendBatchAsync(const RequestMeta& meta, std::vector<SendItem> items, bool send_barrier,
                      StepReply* reply, DoneCallback done) override {
    {
      absl::MutexLock lock(&mu_);
      batch_sizes_.push_back(static_cast<int>(items.size()));
    }
    PServerClient::SendBatchAsync(meta, std::move(items), send_barrier, reply, std::move(done));
  }
  std::vector<int> batch_sizes() {
    absl::MutexLock lock(&mu_);
    return batch_sizes_;
  }

  // Waits (at most 10 s) until `n` sends are pending.
  bool AwaitPending(int n) {
    absl::MutexLock lock(&mu_);
    auto enough = [&]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return static_cast<int>(pending_.size()) >= n;
    };
    return mu_.AwaitWithTimeout(absl::Condition(&enough), absl::Seconds(10));
  }
  int pending() {
    absl::MutexLock lock(&mu_);
    return static_cast<int>(pending_.size());
  }
  // Completes the oldest pending send with `s` (the callback runs on this thread, unlocked).
  void CompleteOldest(absl::Status s) {
    Call call;
    {
      absl::MutexLock lock(&mu_);
      ASSERT_FALSE(pending_.empty());
      call = std::move(pending_.front());
      pending_.pop_front();
    }
    DoneCallback d = std::move(call.done);
    {
      absl::MutexLock lock(&mu_);
      sent_.push_back(std::move(call));
    }
    d(s);
  }
  std::vector<Call>& sent() { return sent_; }  // read once nothing is in flight

 private:
  const bool inline_done_;
  absl::Mutex mu_;
  std::deque<Call> pending_ ABSL_GUARDED_BY(mu_);
  std::vector<int> batch_sizes_ ABSL_GUARDED_BY(mu_);
  std::vector<Call> sent_;
};

Variable Rows(std::vector<int64_t> ids, float value) {
  Variable v;
  SelectedRows* sr = v.GetMutable<SelectedRows>();
  sr->rows = std::move(ids);
  sr->value.Resize(FLOAT32, {static_cast<int64_t>(sr->rows.size()), 2});
  for (int64_t i = 0; i < sr->value.numel(); ++i) sr->value.data<float>()[i] = value;
  return v;
}

Variable Dense(float value) {
  Variable v;
  Tensor* t = v.GetMutable<Tensor>();
  t->Resize(FLOAT32, {3});
  for (int i = 0; i < 3; ++i) t->data<float>()[i] = value;
  return v;
}

struct Fixture {
  explicit Fixture(bool inline_done = false)
      : pool([this, inline_done](const std::string& ep) {
          auto c = std::make_unique<FakeClient>(ep, inline_done);
          clients[ep] = c.get();
          return c;
        }) {
    rpc.job_id = "job";
    rpc.clients = &pool;
  }
  FakeClient* client(const std::string& ep) {
    pool.Get(ep);
    return clients[ep];
  }
  std::map<std::string, FakeClient*> clients;
  ClientPool pool;
  RpcContext rpc;
};

TEST(AsyncCommunicatorTest, SendsAtOnceThenMergesWhatQueuedWhileInFlight) {
  Fixture f;
  FakeClient* ps = f.client("ps0");
  AsyncCommunicator comm(&f.rpc, CommunicatorOptions{4, 8});
  ASSERT_TRUE(comm.Push("t@GRAD", "ps0", Rows({1, 2}, 1.0f)).ok());
  // Sent from Push itself: pending before anything else runs.
  EXPECT_EQ(ps->pending(), 1);
  ASSERT_TRUE(comm.Push("t@GRAD", "ps0", Rows({3}, 2.0f)).ok());
  ASSERT_TRUE(comm.Push("t@GRAD", "ps0", Rows({2, 4}, 3.0f)).ok());
  EXPECT_EQ(ps->pending(), 1) << "a second push of the variable started while one is in flight";
  ps->CompleteOldest(absl::OkStatus());
  ASSERT_TRUE(ps->AwaitPending(1));
  ps->CompleteOldest(absl::OkStatus());
  ASSERT_TRUE(comm.Flush().ok());
  ASSERT_EQ(ps->sent().size(), 2u);
  const SelectedRows& merged = ps->sent()[1].var.Get<SelectedRows>();
  EXPECT_EQ(merged.rows, (std::vector<int64_t>{3, 2, 4}));
  ASSERT_EQ(merged.value.numel(), 6);
  EXPECT_EQ(merged.value.data<float>()[1], 2.0f);
  EXPECT_EQ(merged.value.data<float>()[2], 3.0f);
  CommunicatorStats st = comm.stats();
  EXPECT_EQ(st.pushed, 3);
  EXPECT_EQ(st.sent, 2);
}

// A step's gradients go to each pserver as one push; what waits while it is in flight goes out
// as the next one.
TEST(AsyncCommunicatorTest, OnePushPerPserverCarriesEveryWaitingVariable) {
  Fixture f;
  FakeClient* ps0 = f.client("ps0");
  FakeClient* ps1 = f.client("ps1");
  AsyncCommunicator comm(&f.rpc, CommunicatorOptions{4, 8});
  Variable w = Dense(1), b = Dense(2), t = Rows({5}, 3.0f);
  ASSERT_TRUE(comm.PushAll({{"w", "ps0", &w}, {"t", "ps1", &t}, {"b", "ps0", &b}}).ok());
  EXPECT_EQ(ps0->batch_sizes(), (std::vector<int>{2}));
  EXPECT_EQ(ps1->batch_sizes(), (std::vector<int>{1}));
  Variable w2 = Dense(10), b2 = Dense(20);
  ASSERT_TRUE(comm.PushAll({{"w", "ps0", &w2}, {"b", "ps0", &b2}}).ok());
  EXPECT_EQ(ps0->batch_sizes(), (std::vector<int>{2})) << "a second push to ps0 while one is "
                                                          "in flight";
  ps0->CompleteOldest(absl::OkStatus());
  ps0->CompleteOldest(absl::OkStatus());  // the first push is done: the second starts
  ASSERT_TRUE(ps0->AwaitPending(2));
  EXPECT_EQ(ps0->batch_sizes(), (std::vector<int>{2, 2}));
  ps0->CompleteOldest(absl::OkStatus());
  ps0->CompleteOldest(absl::OkStatus());
  ps1->CompleteOldest(absl::OkStatus());
  ASSERT_TRUE(comm.Flush().ok());
  CommunicatorStats st = comm.stats();
  EXPECT_EQ(st.pushed, 5);
  EXPECT_EQ(st.sent, 5);
  ASSERT_EQ(ps0->sent().size(), 4u);
  const float want[] = {1, 2, 10, 20};
  const char* names[] = {"w", "b", "w", "b"};
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(ps0->sent()[i].name, names[i]);
    EXPECT_EQ(ps0->sent()[i].var.Get<Tensor>().data<float>()[0], want[i]);
  }
  // A variable pushed to another pserver than before is refused, naming both.
  absl::Status moved = comm.Push("w", "ps1", w);
  EXPECT_EQ(moved.code(), absl::StatusCode::kInvalidArgument) << moved;
  EXPECT_NE(moved.message().find("ps0"), std::string::npos) << moved;
}

TEST(AsyncCommunicatorTest, DenseGradientsQueuedTogetherAreSummedAndVariablesRunInParallel) {
  Fixture f;
  FakeClient* ps0 = f.client("ps0");
  FakeClient* ps1 = f.client("ps1");
  AsyncCommunicator comm(&f.rpc, CommunicatorOptions{2, 8});
  ASSERT_TRUE(comm.Push("w@GRAD", "ps0", Dense(1)).ok());
  ASSERT_TRUE(comm.Push("b@GRAD", "ps1", Dense(5)).ok());
  EXPECT_EQ(ps0->pending(), 1);
  EXPECT_EQ(ps1->pending(), 1);  // another variable does not wait
  for (float v : {2.0f, 4.0f, 8.0f}) ASSERT_TRUE(comm.Push("w@GRAD", "ps0", Dense(v)).ok());
  ps0->CompleteOldest(absl::OkStatus());  // next: 2 + 4 (max_merge 2), then 8
  ASSERT_TRUE(ps0->AwaitPending(1));
  ps0->CompleteOldest(absl::OkStatus());
  ASSERT_TRUE(ps0->AwaitPending(1));
  ps0->CompleteOldest(absl::OkStatus());
  ps1->CompleteOldest(absl::OkStatus());
  ASSERT_TRUE(comm.Flush().ok());
  ASSERT_EQ(ps0->sent().size(), 3u);
  EXPECT_EQ(ps0->sent()[0].var.Get<Tensor>().data<float>()[0], 1.0f);
  EXPECT_EQ(ps0->sent()[1].var.Get<Tensor>().data<float>()[2], 6.0f);
  EXPECT_EQ(ps0->sent()[2].var.Get<Tensor>().data<float>()[0], 8.0f);
}

TEST(AsyncCommunicatorTest, AFullQueueBlocksPushUntilASendCompletes) {
  Fixture f;
  FakeClient* ps = f.client("ps0");
  AsyncCommunicator comm(&f.rpc, CommunicatorOptions{1, 2});
  ASSERT_TRUE(comm.Push("g", "ps0", Dense(0)).ok());  // in flight
  ASSERT_TRUE(comm.Push("g", "ps0", Dense(1)).ok());  // queued
  ASSERT_TRUE(comm.Push("g", "ps0", Dense(2)).ok());  // queued: full
  absl::Notification pushed;
  std::thread pusher([&] {
    EXPECT_TRUE(comm.Push("g", "ps0", Dense(3)).ok());
    pushed.Notify();
  });
  EXPECT_FALSE(pushed.WaitForNotificationWithTimeout(absl::Milliseconds(200)))
      << "Push did not block on a full queue";
  ps->CompleteOldest(absl::OkStatus());  // frees a place: the next send takes one item
  EXPECT_TRUE(pushed.WaitForNotificationWithTimeout(absl::Seconds(10)));
  pusher.join();
  for (int i = 0; i < 3; ++i) {
    ASSERT_TRUE(ps->AwaitPending(1));
    ps->CompleteOldest(absl::OkStatus());
  }
  ASSERT_TRUE(comm.Flush().ok());
  ASSERT_EQ(ps->sent().size(), 4u);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(ps->sent()[i].var.Get<Tensor>().data<float>()[0], static_cast<float>(i));
  }
}

TEST(AsyncCommunicatorTest, AFailedSendIsStickyAndStopsTheQueue) {
  Fixture f;
  FakeClient* ps = f.client("ps0");
  AsyncCommunicator comm(&f.rpc, CommunicatorOptions{1, 4});
  ASSERT_TRUE(comm.Push("g", "ps0", Dense(0)).ok());
  ASSERT_TRUE(comm.Push("g", "ps0", Dense(1)).ok());
  ps->CompleteOldest(absl::UnavailableError("pserver ps0: connection refused"));
  absl::Status s = comm.Flush();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(s.message().find("ps0"), std::string::npos) << s;
  EXPECT_EQ(comm.Push("g", "ps0", Dense(2)).code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(ps->pending(), 0) << "a send started after a failure";
  EXPECT_EQ(comm.stats().sent, 0);
}

TEST(AsyncCommunicatorTest, ClientsThatCompleteInlineSendEverythingInOrder) {
  Fixture f(/*inline_done=*/true);
  FakeClient* ps = f.client("ps0");
  {
    AsyncCommunicator comm(&f.rpc, CommunicatorOptions{3, 4});
    for (int i = 0; i < 50; ++i) ASSERT_TRUE(comm.Push("g", "ps0", Rows({i}, 1.0f * i)).ok());
    ASSERT_TRUE(comm.Flush().ok());
    EXPECT_EQ(comm.stats().sent, 50);  // nothing was ever in flight while pushing
  }
  ASSERT_EQ(ps->sent().size(), 50u);
  for (int i = 0; i < 50; ++i) EXPECT_EQ(ps->sent()[i].var.Get<SelectedRows>().rows[0], i);
}

TEST(AsyncCommunicatorTest, DestructionWaitsForSendsInFlight) {
  Fixture f;
  FakeClient* ps = f.client("ps0");
  std::thread completer;
  {
    AsyncCommunicator comm(&f.rpc, CommunicatorOptions{4, 4});
    ASSERT_TRUE(comm.Push("g", "ps0", Dense(1)).ok());
    ASSERT_TRUE(comm.Push("g", "ps0", Dense(2)).ok());
    completer = std::thread([ps] {
      for (int i = 0; i < 2; ++i) {
        if (!ps->AwaitPending(1)) return;
        ps->CompleteOldest(absl::OkStatus());
      }
    });
  }  // flushes: both sends done before the communicator is gone
  completer.join();
  EXPECT_EQ(ps->sent().size(), 2u);
  EXPECT_EQ(ps->pending(), 0);
}

}  // namespace
}  // namespace tessera
