#include "trainer/rpc_ops.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "common/framework/executor.h"
#include "common/framework/op_desc.h"
#include "common/rpc/answering_client.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

// The step's send waits for its early sends (PendingRequests::Wait) and fails with their first
// error; the next step starts clean.
TEST(PendingRequestsTest, WaitReturnsOnceAllFinishedWithTheFirstErrorThenForgetsIt) {
  PendingRequests pending("early send");
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
  EXPECT_NE(s.message().find("early send: pserver 127.0.0.1:1"), absl::string_view::npos) << s;
  EXPECT_TRUE(pending.Wait().ok());  // reported once
}

TEST(PendingRequestsTest, ACallbackMayOutliveIt) {
  DoneCallback late;
  {
    PendingRequests pending("early send");
    late = pending.Add();
  }
  late(absl::OkStatus());  // no use after free (ASan/valgrind would tell)
}

// Records the SendBatch calls it gets; holds the barrier-less ones' callbacks until Release,
// answers the others at once.
class HoldingClient : public AnsweringPServerClient {
 public:
  HoldingClient() : AnsweringPServerClient(absl::UnimplementedError("fake pserver"), "ps0") {}
  void SendBatchAsync(const RequestMeta&, std::vector<SendItem> items, bool send_barrier,
                      StepReply*, DoneCallback done) override {
    std::string call = send_barrier ? "barrier:" : "early:";
    for (const SendItem& item : items) call += item.name + ",";
    {
      absl::MutexLock lock(&mu);
      calls.push_back(call);
      if (!send_barrier) {
        held.push_back(std::move(done));
        return;
      }
    }
    done(absl::OkStatus());
  }
  void Release(absl::Status s) {
    std::vector<DoneCallback> out;
    {
      absl::MutexLock lock(&mu);
      out.swap(held);
    }
    for (DoneCallback& d : out) d(s);
  }
  int Held() {
    absl::MutexLock lock(&mu);
    return static_cast<int>(held.size());
  }
  std::vector<std::string> Calls() {
    absl::MutexLock lock(&mu);
    return calls;
  }

 private:
  absl::Mutex mu;
  std::vector<std::string> calls ABSL_GUARDED_BY(mu);
  std::vector<DoneCallback> held ABSL_GUARDED_BY(mu);
};

// The RPC ops with one fake pserver, "ps0", of type Client (owned by the client pool), and a
// program and a scope to run them in.
template <typename Client>
class OneFakePserverTest : public ::testing::Test {
 protected:
  void SetUp() override {
    rpc_.clients = &pool_;
    ASSERT_TRUE(RegisterRpcOps(&registry_, &rpc_).ok());
  }

  Client* client_ = new Client;
  ClientPool pool_{[this](const std::string&) { return std::unique_ptr<PServerClient>(client_); }};
  RpcContext rpc_;
  OpRegistry registry_;
  ProgramDesc program_;
  Scope scope_;
};

// A step's program with an early send of g1 (as LocalTrainer's send_early_bytes makes it) and
// the step's send of g2 with the barrier, run on another thread.
class EarlySendTest : public OneFakePserverTest<HoldingClient> {
 protected:
  void SetUp() override {
    OneFakePserverTest::SetUp();
    if (HasFatalFailure()) return;
    BlockDesc* block = program_.add_blocks();
    OpDesc early = MakeOp("send", {{"X", {"g1"}}}, {});
    SetAttr(&early, "epmap", std::vector<std::string>{"ps0"});
    SetAttr(&early, "early", true);
    OpDesc step = MakeOp("send", {{"X", {"g2"}}}, {});
    SetAttr(&step, "epmap", std::vector<std::string>{"ps0"});
    SetAttr(&step, "barrier_endpoints", std::vector<std::string>{"ps0"});
    *block->add_ops() = early;
    *block->add_ops() = step;
    for (const char* g : {"g1", "g2"}) scope_.Var(g)->GetMutable<Tensor>()->Resize(FLOAT32, {2});
  }
};

TEST_F(EarlySendTest, TheStepsBarrierGoesOutOnlyOnceTheEarlySendWasReceived) {
  absl::Status result = absl::UnknownError("not run");
  std::thread step([&] { result = Executor(&registry_).Run(program_, 0, &scope_); });
  while (client_->Held() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_EQ(client_->Calls(), std::vector<std::string>{"early:g1,"});  // the barrier waits
  client_->Release(absl::OkStatus());
  step.join();
  EXPECT_TRUE(result.ok()) << result;
  EXPECT_EQ(client_->Calls(), (std::vector<std::string>{"early:g1,", "barrier:g2,"}));
}

TEST_F(EarlySendTest, AFailedEarlySendFailsTheStepsSendWhichSendsNothing) {
  absl::Status result;
  std::thread step([&] { result = Executor(&registry_).Run(program_, 0, &scope_); });
  while (client_->Held() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  client_->Release(absl::UnavailableError("pserver ps0 SendBatch: connection refused"));
  step.join();
  EXPECT_EQ(result.code(), absl::StatusCode::kUnavailable) << result;
  EXPECT_NE(result.message().find("early send: pserver ps0"), absl::string_view::npos) << result;
  EXPECT_EQ(client_->Calls(), std::vector<std::string>{"early:g1,"});
}

// Holds each PrefetchBatch until Answer, which fills every item's rows (row of id x: x, 10x)
// or fails them.
class HeldLookupsClient : public AnsweringPServerClient {
 public:
  HeldLookupsClient() : AnsweringPServerClient(absl::UnimplementedError("fake pserver"), "ps0") {}
  void PrefetchBatchAsync(const RequestMeta&, std::vector<PrefetchItem> items, bool,
                          DoneCallback done) override {
    absl::MutexLock lock(&mu_);
    held_.push_back({std::move(items), std::move(done)});
  }
  int Held() {
    absl::MutexLock lock(&mu_);
    return static_cast<int>(held_.size());
  }
  // `width` floats per row (a wrong one: a malformed reply).
  void Answer(absl::Status s, int64_t width = 2) {
    std::vector<std::pair<std::vector<PrefetchItem>, DoneCallback>> out;
    {
      absl::MutexLock lock(&mu_);
      out.swap(held_);
    }
    for (auto& [items, done] : out) {
      for (PrefetchItem& item : items) {
        const int64_t n = static_cast<int64_t>(item.ids->size());
        item.out->Resize(FLOAT32, {n, width});
        for (int64_t i = 0; i < n * width; ++i) {
          const float id = static_cast<float>((*item.ids)[i / width]);
          item.out->data<float>()[i] = i % width == 0 ? id : 10 * id;
        }
      }
      done(s);
    }
  }

 private:
  absl::Mutex mu_;
  std::vector<std::pair<std::vector<PrefetchItem>, DoneCallback>> held_ ABSL_GUARDED_BY(mu_);
};

// A pipelined step's look-ahead lookups (attr complete_later): the op returns once its request is
// out, and the reply's thread stores the rows (RpcContext::deferred_lookups).
class DeferredLookupsTest : public OneFakePserverTest<HeldLookupsClient> {
 protected:
  void SetUp() override {
    OneFakePserverTest::SetUp();
    if (HasFatalFailure()) return;
    OpDesc op = MakeOp("prefetch", {{"Ids", {"ids"}}}, {{"Out", {"rows"}}});
    SetAttr(&op, "epmap", std::vector<std::string>{"ps0"});
    SetAttr(&op, "tables", std::vector<std::string>{"emb"});
    SetAttr(&op, "dims", std::vector<int64_t>{2});
    SetAttr(&op, "after_update", true);
    SetAttr(&op, "complete_later", true);
    *program_.add_blocks()->add_ops() = op;
    Tensor* ids = scope_.Var("ids")->GetMutable<Tensor>();
    ids->Resize(INT64, {4, 1});
    const int64_t values[] = {5, 7, 5, 9};
    std::copy(values, values + 4, ids->data<int64_t>());
  }
};

TEST_F(DeferredLookupsTest, TheOpReturnsAtOnceAndTheRowsArriveByTheReply) {
  ASSERT_TRUE(Executor(&registry_).Run(program_, 0, &scope_).ok());
  EXPECT_EQ(client_->Held(), 1);  // returned with its request still unanswered
  std::thread reply([&] { client_->Answer(absl::OkStatus()); });
  absl::Status stored = rpc_.deferred_lookups.Wait();
  reply.join();
  ASSERT_TRUE(stored.ok()) << stored;
  const Tensor& rows = scope_.FindVar("rows")->Get<Tensor>();
  ASSERT_EQ(rows.shape(), (Shape{4, 2}));
  EXPECT_EQ(std::vector<float>(rows.data<float>(), rows.data<float>() + 8),
            (std::vector<float>{5, 50, 7, 70, 5, 50, 9, 90}));  // duplicates fetched once
}

TEST_F(DeferredLookupsTest, AFailedOrMalformedReplyIsTheWaitsError) {
  ASSERT_TRUE(Executor(&registry_).Run(program_, 0, &scope_).ok());
  client_->Answer(absl::UnavailableError("pserver ps0 PrefetchBatch: connection refused"));
  absl::Status failed = rpc_.deferred_lookups.Wait();
  EXPECT_EQ(failed.code(), absl::StatusCode::kUnavailable) << failed;
  EXPECT_NE(failed.message().find("lookups: pserver ps0"), absl::string_view::npos) << failed;
  EXPECT_TRUE(rpc_.deferred_lookups.Wait().ok());  // reported once

  ASSERT_TRUE(Executor(&registry_).Run(program_, 0, &scope_).ok());
  client_->Answer(absl::OkStatus(), /*width=*/3);  // the table has dim 2
  absl::Status malformed = rpc_.deferred_lookups.Wait();
  EXPECT_EQ(malformed.code(), absl::StatusCode::kInvalidArgument) << malformed;
  EXPECT_NE(malformed.message().find("pserver ps0 returned"), absl::string_view::npos) << malformed;
  EXPECT_NE(malformed.message().find("table emb (dim 2)"), absl::string_view::npos) << malformed;
}

}  // namespace
}  // namespace tessera
