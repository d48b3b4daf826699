// The gRPC transport end to end on loopback, against a small in-memory handler.
#include <atomic>
#include <map>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "common/rpc/grpc/codec.h"
#include "common/rpc/grpc/grpc_client.h"
#include "common/rpc/grpc/grpc_server.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/generic/async_generic_service.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/server_builder.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

// Stores variables by name; a barrier of kind SEND_BARRIER completes when two trainers arrived.
class MemoryHandler : public RequestHandler {
 public:
  absl::Status Admit(const RequestMeta& meta) override {
    if (meta.job_id != "job") return absl::UnauthenticatedError("wrong job " + meta.job_id);
    return absl::OkStatus();
  }
  absl::StatusOr<Variable*> PrepareReceive(const RequestMeta& meta,
                                           const VariableHeader& h) override {
    absl::MutexLock lock(&mu_);
    if (h.name == "forbidden") return absl::InvalidArgumentError("unknown variable forbidden");
    Variable& v = vars_[h.name];
    if (h.type == SELECTED_ROWS) {
      SelectedRows* sr = v.GetMutable<SelectedRows>();
      sr->rows.resize(h.num_rows);
      sr->height = h.height;
      sr->value.Resize(h.dtype, h.dims);
    } else {
      Tensor* t = v.GetMutable<Tensor>();
      if (!t->initialized() || t->shape() != h.dims) t->Resize(h.dtype, h.dims);
    }
    return &v;
  }
  void HandleSend(const RequestMeta& meta, const VariableHeader& h, Variable* var,
                  DoneCallback done) override {
    {
      absl::MutexLock lock(&mu_);
      ++sends_;
    }
    done(absl::OkStatus());  // not under mu_: a batch's barrier may follow from this callback
  }
  void HandleGet(const RequestMeta& meta, const std::string& name, GetDone done) override {
    absl::StatusOr<Variable> got = absl::NotFoundError("no variable " + name);
    {
      absl::MutexLock lock(&mu_);
      auto it = vars_.find(name);
      if (it != vars_.end()) got = it->second;
    }
    done(std::move(got));  // not under mu_: the batch's fetch barrier may follow from it
  }
  void HandlePrefetch(const RequestMeta& meta, const std::string& table, std::vector<int64_t> ids,
                      PrefetchDone done) override {
    Tensor rows(FLOAT32, {static_cast<int64_t>(ids.size()), 2});
    for (size_t i = 0; i < ids.size(); ++i) {
      rows.data<float>()[2 * i] = static_cast<float>(ids[i] % 1000);
      rows.data<float>()[2 * i + 1] = -1;
    }
    done(rows);
  }
  void HandleBarrier(const RequestMeta& meta, BarrierKind kind, DoneCallback done) override {
    std::vector<DoneCallback> release;
    {
      absl::MutexLock lock(&mu_);
      waiting_.push_back(std::move(done));
      if (waiting_.size() < 2) return;
      release.swap(waiting_);
    }
    for (auto& d : release) d(absl::OkStatus());
  }
  // Requests with after_update wait here until ReleaseUpdate.
  void AwaitUpdate(const RequestMeta& meta, DoneCallback done) override {
    absl::MutexLock lock(&mu_);
    awaiting_.push_back(std::move(done));
  }
  int awaiting() {
    absl::MutexLock lock(&mu_);
    return static_cast<int>(awaiting_.size());
  }
  void ReleaseUpdate(absl::Status status) {
    std::vector<DoneCallback> release;
    {
      absl::MutexLock lock(&mu_);
      release.swap(awaiting_);
    }
    for (auto& d : release) d(status);
  }
  void HandleCheckpoint(const RequestMeta& meta, const std::string& dir,
                        DoneCallback done) override {
    done(absl::UnimplementedError("no checkpoints here"));
  }
  bool StepEndsEpoch(int64_t step) override { return ends_epoch.load(); }
  std::atomic<bool> ends_epoch{false};
  void HandleAbort(const RequestMeta& meta, const std::string& reason, DoneCallback done) override {
    {
      absl::MutexLock lock(&mu_);
      aborts_.push_back(absl::StrCat(meta.trainer_id, ": ", reason));
    }
    done(absl::OkStatus());
  }
  std::vector<std::string> aborts() {
    absl::MutexLock lock(&mu_);
    return aborts_;
  }
  void HandleRegister(const RequestMeta&, const JobFields&, uint64_t, DoneCallback done) override {
    done(absl::OkStatus());
  }
  int sends() {
    absl::MutexLock lock(&mu_);
    return sends_;
  }

 private:
  absl::Mutex mu_;
  std::map<std::string, Variable> vars_;
  std::vector<DoneCallback> waiting_;
  std::vector<DoneCallback> awaiting_;
  std::vector<std::string> aborts_;
  int sends_ = 0;
};

// Counts the server's finished calls by method.
class CountingObserver : public RpcObserver {
 public:
  void OnCall(const RpcCallInfo& call) override {
    absl::MutexLock lock(&mu_);
    ++calls_[call.method];
    last_request_bytes_[call.method] = call.bytes_received;
  }
  int calls(RpcMethod method) {
    absl::MutexLock lock(&mu_);
    return calls_[method];
  }
  int64_t last_request_bytes(RpcMethod method) {
    absl::MutexLock lock(&mu_);
    return last_request_bytes_[method];
  }

 private:
  absl::Mutex mu_;
  std::map<RpcMethod, int> calls_;
  std::map<RpcMethod, int64_t> last_request_bytes_;
};

// One unary call of `method` (a full path) with `request` as its bytes, bypassing every
// encoder; the response's bytes go to `response` when given.
grpc::Status RawCall(const std::string& endpoint, const std::string& method,
                     const std::string& request, std::string* response = nullptr) {
  auto channel = grpc::CreateChannel(endpoint, grpc::InsecureChannelCredentials());
  grpc::GenericStub stub(channel);
  grpc::Slice slice(request);
  grpc::ByteBuffer in(&slice, 1), out;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  absl::Notification done;
  grpc::Status status;
  stub.UnaryCall(&ctx, method, grpc::StubOptions(), &in, &out, [&](grpc::Status s) {
    status = s;
    done.Notify();
  });
  done.WaitForNotification();
  if (status.ok() && response != nullptr) {
    grpc::Slice flat;
    if (out.DumpToSingleSlice(&flat).ok()) {
      response->assign(reinterpret_cast<const char*>(flat.begin()), flat.size());
    }
  }
  return status;
}

// A [rows, cols] float tensor holding start, start + 1, ...
Variable Dense(int64_t rows, int64_t cols, float start) {
  Variable v;
  Tensor* t = v.GetMutable<Tensor>();
  t->Resize(FLOAT32, {rows, cols});
  for (int64_t i = 0; i < t->numel(); ++i) t->data<float>()[i] = start + static_cast<float>(i);
  return v;
}

class GrpcRpcTest : public ::testing::Test {
 protected:
  void SetUp() override {
    GrpcServerOptions options{"127.0.0.1:0"};
    options.observer = &observer_;
    server_ = std::make_unique<GrpcServer>(options, &handler_);
    ASSERT_TRUE(server_->Start().ok());
    endpoint_ = "127.0.0.1:" + std::to_string(server_->port());
  }
  void TearDown() override {
    server_->Shutdown();
    server_->Wait();
  }
  std::unique_ptr<GrpcPServerClient> Client(int64_t chunk_bytes = 4 << 20) {
    GrpcClientOptions o;
    o.chunk_bytes = chunk_bytes;
    o.deadline = absl::Seconds(20);
    return std::make_unique<GrpcPServerClient>(endpoint_, o);
  }
  MemoryHandler handler_;
  CountingObserver observer_;
  std::unique_ptr<GrpcServer> server_;
  std::string endpoint_;
  RequestMeta meta_{"job", 0, 1};
};

TEST_F(GrpcRpcTest, SendThenGetDense) {
  auto c = Client();
  Variable v;
  v.GetMutable<Tensor>()->Resize(FLOAT64, {10, 3});
  for (int i = 0; i < 30; ++i) v.GetMutable<Tensor>()->data<double>()[i] = i * 1.25;
  ASSERT_TRUE(c->SendVariable(meta_, "w", v).ok());
  Variable back;
  absl::Status s = c->GetVariable(meta_, "w", &back);
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(back.Get<Tensor>().shape(), (Shape{10, 3}));
  EXPECT_EQ(back.Get<Tensor>().data<double>()[29], 29 * 1.25);
}

TEST_F(GrpcRpcTest, LargeTensorTravelsInChunksBothWays) {
  auto c = Client(/*chunk_bytes=*/4096);
  Variable v;
  v.GetMutable<Tensor>()->Resize(FLOAT32, {1000, 37});  // 148000 bytes -> 37 chunks
  for (int i = 0; i < 37000; ++i) v.GetMutable<Tensor>()->data<float>()[i] = i;
  ASSERT_TRUE(c->SendVariable(meta_, "big", v).ok());
  EXPECT_EQ(handler_.sends(), 37);
  Variable back;
  back.GetMutable<Tensor>()->Resize(FLOAT32, {1000, 37});
  back.GetMutable<Tensor>()->SetZero();
  absl::Status s = c->GetVariable(meta_, "big", &back);
  ASSERT_TRUE(s.ok()) << s;
  for (int i = 0; i < 37000; i += 997) EXPECT_EQ(back.Get<Tensor>().data<float>()[i], i);
  EXPECT_EQ(back.Get<Tensor>().data<float>()[36999], 36999);
}

TEST_F(GrpcRpcTest, SparseSendAndPrefetch) {
  auto c = Client();
  Variable v;
  SelectedRows* sr = v.GetMutable<SelectedRows>();
  sr->rows = {INT64_MIN, 5};
  sr->value.Resize(FLOAT32, {2, 4});
  sr->value.SetZero();
  ASSERT_TRUE(c->SendVariable(meta_, "emb@GRAD", v).ok());
  Tensor rows;
  std::vector<int64_t> ids = {3, 1005, -7};
  ASSERT_TRUE(c->Prefetch(meta_, "emb", ids, &rows).ok());
  ASSERT_EQ(rows.shape(), (Shape{3, 2}));
  EXPECT_EQ(rows.data<float>()[2], 5.0f);
}

TEST_F(GrpcRpcTest, ErrorsCarryCodeAndEndpoint) {
  auto c = Client();
  Variable v;
  absl::Status s = c->GetVariable(meta_, "missing", &v);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_NE(s.message().find(endpoint_), std::string::npos) << s;
  v.GetMutable<Tensor>()->Resize(FLOAT32, {1});
  s = c->SendVariable(meta_, "forbidden", v);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  s = c->SendVariable({"other-job", 0, 0}, "w", v);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnauthenticated) << s;
  EXPECT_EQ(c->Checkpoint(meta_, "/tmp").code(), absl::StatusCode::kUnimplemented);
}

TEST_F(GrpcRpcTest, BarrierReleasesBothTrainers) {
  auto c0 = Client();
  auto c1 = Client();
  StatusGroup g(2);
  c0->BarrierAsync({"job", 0, 1}, SEND_BARRIER, g.Callback());
  c1->BarrierAsync({"job", 1, 1}, SEND_BARRIER, g.Callback());
  EXPECT_TRUE(g.Wait().ok());
}

// Two trainers' batches: every gradient arrives, each trainer's batch is one request, and neither
// returns before both reached the barrier it carries.
TEST_F(GrpcRpcTest, SendBatchCarriesTheBarrierInOneRequest) {
  auto c0 = Client();
  auto c1 = Client();
  Variable w = Dense(4, 3, 1), b = Dense(1, 3, 2), g;
  SelectedRows* sr = g.GetMutable<SelectedRows>();
  sr->rows = {9, -4};
  sr->value.Resize(FLOAT32, {2, 3});
  sr->value.SetZero();
  absl::Notification first_done;
  absl::Status first;
  c0->SendBatchAsync({"job", 0, 1}, {{"w", &w}, {"b", &b}, {"emb@GRAD", &g}}, true, nullptr,
                     [&](absl::Status s) {
                       first = s;
                       first_done.Notify();
                     });
  EXPECT_FALSE(first_done.WaitForNotificationWithTimeout(absl::Milliseconds(300)))
      << "the batch returned before the barrier was released";
  EXPECT_EQ(handler_.sends(), 3);  // the gradients are in before the barrier
  StatusGroup second(1);
  c1->SendBatchAsync({"job", 1, 1}, {}, true, nullptr, second.Callback());  // a barrier-only batch
  ASSERT_TRUE(second.Wait().ok());
  ASSERT_TRUE(first_done.WaitForNotificationWithTimeout(absl::Seconds(20)));
  ASSERT_TRUE(first.ok()) << first;
  EXPECT_EQ(observer_.calls(RpcMethod::kSendBatch), 2);
  EXPECT_EQ(observer_.calls(RpcMethod::kSend) + observer_.calls(RpcMethod::kBarrier), 0);
  Variable back;
  ASSERT_TRUE(c0->GetVariable(meta_, "w", &back).ok());
  EXPECT_EQ(back.Get<Tensor>().data<float>()[11], 12.0f);
}

// A tensor over chunk_bytes still travels in chunks, before the batch that carries the barrier.
TEST_F(GrpcRpcTest, SendBatchChunksLargeTensorsBeforeTheBarrier) {
  auto c0 = Client(/*chunk_bytes=*/256);
  auto c1 = Client();
  Variable big = Dense(40, 10, 0), small = Dense(2, 2, 5);  // 1600 bytes -> 7 chunks
  StatusGroup g(2);
  c0->SendBatchAsync({"job", 0, 1}, {{"big", &big}, {"small", &small}}, true, nullptr, g.Callback());
  c1->SendBatchAsync({"job", 1, 1}, {}, true, nullptr, g.Callback());
  ASSERT_TRUE(g.Wait().ok());
  EXPECT_EQ(observer_.calls(RpcMethod::kSend), 7);
  EXPECT_EQ(observer_.calls(RpcMethod::kSendBatch), 2);
  Variable back;
  ASSERT_TRUE(c1->GetVariable(meta_, "big", &back).ok());
  EXPECT_EQ(back.Get<Tensor>().data<float>()[399], 399.0f);
}

// One bad entry refuses the whole batch: nothing of it is handled.
TEST_F(GrpcRpcTest, SendBatchWithABadEntryStoresNothing) {
  auto c = Client();
  Variable w = Dense(2, 2, 1);
  StatusGroup g(1);
  c->SendBatchAsync(meta_, {{"w", &w}, {"forbidden", &w}}, false, nullptr, g.Callback());
  absl::Status s = g.Wait();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("forbidden"), std::string::npos) << s;
  EXPECT_EQ(handler_.sends(), 0);
}

TEST_F(GrpcRpcTest, GetBatchAndPrefetchBatchAnswerInOrder) {
  auto c = Client();
  Variable w = Dense(3, 2, 1), b = Dense(1, 2, 100);
  ASSERT_TRUE(c->SendVariable(meta_, "w", w).ok());
  ASSERT_TRUE(c->SendVariable(meta_, "b", b).ok());
  Variable out_b, out_w;
  StatusGroup g(1);
  c->GetBatchAsync(meta_, {{"b", &out_b}, {"w", &out_w}}, false, false, g.Callback());
  ASSERT_TRUE(g.Wait().ok());
  EXPECT_EQ(out_b.Get<Tensor>().data<float>()[1], 101.0f);
  EXPECT_EQ(out_w.Get<Tensor>().data<float>()[5], 6.0f);
  EXPECT_EQ(observer_.calls(RpcMethod::kGetBatch), 1);

  std::vector<int64_t> ids_a = {3, 1005}, ids_b = {-7};
  Tensor rows_a, rows_b;
  StatusGroup p(1);
  c->PrefetchBatchAsync(meta_, {{"emb_a", &ids_a, &rows_a}, {"emb_b", &ids_b, &rows_b}}, false,
                        p.Callback());
  ASSERT_TRUE(p.Wait().ok());
  ASSERT_EQ(rows_a.shape(), (Shape{2, 2}));
  ASSERT_EQ(rows_b.shape(), (Shape{1, 2}));
  EXPECT_EQ(rows_a.data<float>()[2], 5.0f);
  EXPECT_EQ(rows_b.data<float>()[0], -7.0f);
  EXPECT_EQ(observer_.calls(RpcMethod::kPrefetchBatch), 1);

  // An unknown parameter fails the whole get, naming it.
  StatusGroup bad(1);
  c->GetBatchAsync(meta_, {{"w", &out_w}, {"missing", &out_b}}, false, false, bad.Callback());
  absl::Status s = bad.Wait();
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound) << s;
  EXPECT_NE(s.message().find("missing"), std::string::npos) << s;
}

// after_update: the gets and lookups are sent at once and answered only once the handler's
// update is applied (with several get requests, an empty one carries the wait); a failed
// update answers them with its error.
TEST_F(GrpcRpcTest, AfterUpdateRequestsWaitForTheUpdate) {
  for (int64_t chunk : {int64_t{4} << 20, int64_t{16}}) {
    SCOPED_TRACE(absl::StrCat("chunk_bytes ", chunk));
    auto c = Client(chunk);
    Variable w = Dense(3, 2, 1), b = Dense(1, 2, 100);
    ASSERT_TRUE(c->SendVariable(meta_, "w", w).ok());
    ASSERT_TRUE(c->SendVariable(meta_, "b", b).ok());
    Variable out_b, out_w;
    out_w.GetMutable<Tensor>()->Resize(FLOAT32, {3, 2});  // 24 bytes known: over 16, a chunk
    std::vector<int64_t> ids = {3, 1005};
    Tensor rows;
    StatusGroup got(1), looked(1);
    c->GetBatchAsync(meta_, {{"b", &out_b}, {"w", &out_w}}, false, true, got.Callback());
    c->PrefetchBatchAsync(meta_, {{"emb", &ids, &rows}}, true, looked.Callback());
    for (int i = 0; i < 2000 && handler_.awaiting() < 2; ++i) absl::SleepFor(absl::Milliseconds(5));
    ASSERT_EQ(handler_.awaiting(), 2);
    // Nothing is answered before the update: change a parameter meanwhile.
    ASSERT_TRUE(c->SendVariable(meta_, "b", Dense(1, 2, 500)).ok());
    handler_.ReleaseUpdate(absl::OkStatus());
    ASSERT_TRUE(got.Wait().ok());
    ASSERT_TRUE(looked.Wait().ok());
    EXPECT_EQ(out_b.Get<Tensor>().data<float>()[1], 501.0f);
    EXPECT_EQ(out_w.Get<Tensor>().data<float>()[5], 6.0f);
    ASSERT_EQ(rows.shape(), (Shape{2, 2}));
    EXPECT_EQ(rows.data<float>()[2], 5.0f);

    StatusGroup failed(1);
    c->GetBatchAsync(meta_, {{"b", &out_b}}, false, true, failed.Callback());
    for (int i = 0; i < 2000 && handler_.awaiting() < 1; ++i) absl::SleepFor(absl::Milliseconds(5));
    handler_.ReleaseUpdate(absl::FailedPreconditionError("the step failed"));
    absl::Status s = failed.Wait();
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
    EXPECT_NE(s.message().find("the step failed"), std::string::npos) << s;
  }
}

// A sync step's send and receive in one request per trainer (SendGetBatch): the gradients and
// the send barrier, then, once the update is released, the parameters as it left them and the
// fetch barrier; the epoch's end comes with them, and trainer 0's next-batch lookups ride along.
// With a 16-byte chunk size, the same results: trainer 0's gradient needs chunks, so it sends a
// SendBatch (after the chunks), a GetBatch and a PrefetchBatch beside it; trainer 1's parameter
// needs chunks, so its SendGetBatch only waits for the update and answers its lookups, and the
// parameter follows in chunks, the fetch barrier on a last GetBatch (no request that only
// waits).
TEST_F(GrpcRpcTest, SendGetBatchFoldsAStepIntoOneRequest) {
  for (int64_t chunk : {int64_t{4} << 20, int64_t{16}}) {
    SCOPED_TRACE(absl::StrCat("chunk_bytes ", chunk));
    const bool folded = chunk > 1024;
    handler_.ends_epoch = folded;  // a SendBatch answers epoch_end as before
    auto c0 = Client(chunk), c1 = Client(chunk);
    Variable w = Dense(3, 2, 1), b = Dense(1, 2, 100);
    Variable out_w, out_b;
    out_w.GetMutable<Tensor>()->Resize(FLOAT32, {3, 2});  // 24 bytes known: over 16, a chunk
    StepReply reply0, reply1;
    StatusGroup sent(2);
    const int folded_before = observer_.calls(RpcMethod::kSendGetBatch);
    const int send_batches_before = observer_.calls(RpcMethod::kSendBatch);
    const int get_batches_before = observer_.calls(RpcMethod::kGetBatch);
    const int prefetches_before = observer_.calls(RpcMethod::kPrefetchBatch);
    const int sends_before = handler_.sends();
    std::vector<int64_t> ids = {3, 1005}, ids1 = {2042};
    Tensor rows, rows1;
    c0->SendGetBatchAsync({"job", 0, 1}, {{"w", &w}}, true, &reply0, {{"b", &out_b}}, true,
                          {{"emb", &ids, &rows}}, sent.Callback());
    c1->SendGetBatchAsync({"job", 1, 1}, {{"b", &b}}, true, &reply1, {{"w", &out_w}}, true,
                          {{"wide", &ids1, &rows1}}, sent.Callback());
    // All are held for the update once their barrier was released (the lookups too).
    for (int i = 0; i < 2000 && handler_.awaiting() < 4; ++i) absl::SleepFor(absl::Milliseconds(5));
    ASSERT_EQ(handler_.awaiting(), 4);
    if (folded) EXPECT_EQ(handler_.sends() - sends_before, 2);  // both gradients are in
    ASSERT_TRUE(c0->SendVariable(meta_, "b", Dense(1, 2, 500)).ok());  // "the update"
    handler_.ReleaseUpdate(absl::OkStatus());
    ASSERT_TRUE(sent.Wait().ok());
    EXPECT_EQ(out_b.Get<Tensor>().data<float>()[1], 501.0f);
    EXPECT_EQ(out_w.Get<Tensor>().data<float>()[5], 6.0f);
    ASSERT_EQ(rows.shape(), (Shape{2, 2}));
    EXPECT_EQ(rows.data<float>()[0], 3.0f);
    EXPECT_EQ(rows.data<float>()[2], 5.0f);
    ASSERT_EQ(rows1.shape(), (Shape{1, 2}));
    EXPECT_EQ(rows1.data<float>()[0], 42.0f);
    EXPECT_EQ(reply0.epoch_end.load(), folded);
    EXPECT_EQ(reply1.epoch_end.load(), folded);
    EXPECT_EQ(observer_.calls(RpcMethod::kSendGetBatch) - folded_before, folded ? 2 : 1);
    EXPECT_EQ(observer_.calls(RpcMethod::kSendBatch) - send_batches_before, folded ? 0 : 1);
    EXPECT_EQ(observer_.calls(RpcMethod::kGetBatch) - get_batches_before, folded ? 0 : 2);
    EXPECT_EQ(observer_.calls(RpcMethod::kPrefetchBatch) - prefetches_before, folded ? 0 : 1);
  }
}

// An async step in one request (SendGetBatchAsync without the send barrier: a SendGetBatch
// whose gets and lookups are served once its gradients were handled), answered without waiting
// for any update. With a 16-byte chunk size the parameters over it follow in a GetBatch once the
// request answered the lookups. A raw SendGetBatch without the barrier answers its gets after
// its gradient was stored.
TEST_F(GrpcRpcTest, SendGetBatchWithoutTheBarrierFoldsAnAsyncStepIntoOneRequest) {
  for (int64_t chunk : {int64_t{4} << 20, int64_t{16}}) {
    SCOPED_TRACE(absl::StrCat("chunk_bytes ", chunk));
    const bool folded = chunk > 1024;
    auto c = Client(chunk);
    ASSERT_TRUE(c->SendVariable(meta_, "w", Dense(3, 2, 1)).ok());
    ASSERT_TRUE(c->SendVariable(meta_, "b", Dense(1, 2, 100)).ok());
    Variable g = Dense(1, 2, 7);
    Variable out_w, out_b, out_g;
    out_w.GetMutable<Tensor>()->Resize(FLOAT32, {3, 2});  // 24 bytes known: over 16, a chunk
    std::vector<int64_t> ids = {3, 1005};
    Tensor rows;
    const int folded_before = observer_.calls(RpcMethod::kSendGetBatch);
    const int get_batches_before = observer_.calls(RpcMethod::kGetBatch);
    const int prefetches_before = observer_.calls(RpcMethod::kPrefetchBatch);
    const int sends_before = handler_.sends();
    StatusGroup got(1);
    c->SendGetBatchAsync(meta_, {{"g", &g}}, /*send_barrier=*/false, nullptr,
                         {{"b", &out_b}, {"w", &out_w}, {"g", &out_g}}, false,
                         {{"emb", &ids, &rows}}, got.Callback());
    ASSERT_TRUE(got.Wait().ok());
    EXPECT_EQ(handler_.awaiting(), 0);
    EXPECT_EQ(handler_.sends() - sends_before, 1);
    EXPECT_EQ(out_b.Get<Tensor>().data<float>()[1], 101.0f);
    EXPECT_EQ(out_w.Get<Tensor>().data<float>()[5], 6.0f);
    EXPECT_EQ(out_g.Get<Tensor>().data<float>()[1], 8.0f);
    ASSERT_EQ(rows.shape(), (Shape{2, 2}));
    EXPECT_EQ(rows.data<float>()[0], 3.0f);
    EXPECT_EQ(rows.data<float>()[2], 5.0f);
    EXPECT_EQ(observer_.calls(RpcMethod::kSendGetBatch) - folded_before, 1);
    EXPECT_EQ(observer_.calls(RpcMethod::kGetBatch) - get_batches_before, folded ? 0 : 1);
    EXPECT_EQ(observer_.calls(RpcMethod::kPrefetchBatch) - prefetches_before, 0);
  }
  VariableBatch req;
  *req.mutable_header() = ToHeader({"job", 0, 1});
  VariableMessage* v = req.add_vars();
  v->set_name("g");
  v->set_dtype(FLOAT32);
  v->add_dims(2);
  float values[2] = {7.0f, 8.0f};
  v->set_payload(std::string(reinterpret_cast<const char*>(values), sizeof(values)));
  req.add_get_names("g");
  std::string reply;
  grpc::Status s =
      RawCall(endpoint_, "/tessera.PServer/SendGetBatch", req.SerializeAsString(), &reply);
  ASSERT_TRUE(s.ok()) << s.error_message();
  VariableBatch answer;
  ASSERT_TRUE(answer.ParseFromString(reply));
  ASSERT_EQ(answer.vars_size(), 1);
  EXPECT_EQ(answer.vars(0).name(), "g");
  EXPECT_EQ(answer.vars(0).payload(), v->payload());
}

// A hostile SendGetBatch with bad lookups or with a bad name to fetch is refused before anything
// is stored.
TEST_F(GrpcRpcTest, SendGetBatchRefusesBadNames) {
  VariableBatch req;
  *req.mutable_header() = ToHeader({"job", 0, 1});
  VariableMessage* v = req.add_vars();
  v->set_name("w");
  v->set_dtype(FLOAT32);
  v->add_dims(2);
  v->set_payload(std::string(8, '\0'));
  req.add_get_names("b");
  auto call = [&](const VariableBatch& m) {
    return RawCall(endpoint_, "/tessera.PServer/SendGetBatch", m.SerializeAsString());
  };
  grpc::Status s;
  req.set_send_barrier(true);
  // Riding lookups are checked as a PrefetchBatch's tables: a table twice, ids that are not
  // whole int64s.
  const std::string one_id(8, '\0');
  for (const auto& [second_table, second_ids, needle] :
       {std::make_tuple("emb", one_id, "appears twice"),
        std::make_tuple("wide", std::string(5, '\0'), "not a multiple of 8")}) {
    VariableBatch bad = req;
    PrefetchBatchRequest::Table* t = bad.add_lookups();
    t->set_table("emb");
    t->set_ids(one_id);
    t = bad.add_lookups();
    t->set_table(second_table);
    t->set_ids(second_ids);
    s = call(bad);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << needle;
    EXPECT_NE(s.error_message().find(needle), std::string::npos) << s.error_message();
  }
  req.add_get_names("");
  s = call(req);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("variable name"), std::string::npos) << s.error_message();
  EXPECT_EQ(handler_.sends(), 0);
}

// A hostile prefetch naming one table twice is refused (its answer could not say which is which).
TEST_F(GrpcRpcTest, PrefetchBatchRefusesATableTwice) {
  auto c = Client();
  std::vector<int64_t> ids = {1};
  Tensor r1, r2;
  StatusGroup p(1);
  c->PrefetchBatchAsync(meta_, {{"emb", &ids, &r1}, {"emb", &ids, &r2}}, false, p.Callback());
  absl::Status s = p.Wait();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_NE(s.message().find("twice"), std::string::npos) << s;
}

// Tables fed by the same ids (one vector, as the prefetch op hands a slot's deep and wide
// tables) send them once; each table still gets its own rows.
TEST_F(GrpcRpcTest, PrefetchBatchSendsSharedIdsOnce) {
  auto c = Client();
  std::vector<int64_t> ids(500);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int64_t>(i) * 7 + 1;
  const std::vector<int64_t> copy = ids;
  int64_t shared_bytes = 0;
  for (bool shared : {true, false}) {
    Tensor deep, wide;
    StatusGroup p(1);
    c->PrefetchBatchAsync(meta_, {{"deep", &ids, &deep}, {"wide", shared ? &ids : &copy, &wide}},
                          false, p.Callback());
    ASSERT_TRUE(p.Wait().ok());
    for (const Tensor* rows : {&deep, &wide}) {
      ASSERT_EQ(rows->shape(), (Shape{500, 2}));
      for (size_t i = 0; i < ids.size(); ++i) {
        ASSERT_EQ(rows->data<float>()[2 * i], static_cast<float>(ids[i] % 1000)) << i;
      }
    }
    const int64_t bytes = observer_.last_request_bytes(RpcMethod::kPrefetchBatch);
    if (shared) {
      shared_bytes = bytes;
      EXPECT_LT(bytes, 500 * 8 + 200);
    } else {
      EXPECT_GE(bytes, 2 * 500 * 8);
      EXPECT_GT(bytes, shared_bytes + 500 * 8 - 16);
    }
  }
}

// A hostile ids_of_table (itself, a later table, or with ids of its own) is refused, naming it.
TEST_F(GrpcRpcTest, PrefetchBatchRefusesBadIdsReferences) {
  auto call = [&](const PrefetchBatchRequest& req) {
    return RawCall(endpoint_, "/tessera.PServer/PrefetchBatch", req.SerializeAsString());
  };
  PrefetchBatchRequest good;
  *good.mutable_header() = ToHeader(meta_);
  good.add_tables()->set_table("deep");
  good.mutable_tables(0)->set_ids(std::string(8, '\0'));
  good.add_tables()->set_table("wide");
  good.mutable_tables(1)->set_ids_of_table(1);
  EXPECT_TRUE(call(good).ok()) << call(good).error_message();
  for (int of : {2, 3, -1}) {
    PrefetchBatchRequest bad = good;
    bad.mutable_tables(1)->set_ids_of_table(of);
    grpc::Status s = call(bad);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << of;
    EXPECT_NE(s.error_message().find("ids_of_table " + std::to_string(of)), std::string::npos)
        << s.error_message();
  }
  PrefetchBatchRequest both = good;
  both.mutable_tables(1)->set_ids(std::string(8, '\0'));
  EXPECT_EQ(call(both).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
}

// An ABORT carries the trainer's reason to the handler; a reason that could forge log lines is
// refused before the handler sees it.
TEST_F(GrpcRpcTest, AbortCarriesItsReason) {
  auto c = Client();
  ASSERT_TRUE(c->Abort({"job", 1, 4}, "pserver 10.0.0.9:6170 GetBatch: connection refused").ok());
  EXPECT_EQ(handler_.aborts(),
            (std::vector<std::string>{"1: pserver 10.0.0.9:6170 GetBatch: connection refused"}));
  absl::Status forged = c->Abort({"job", 1, 4}, "x\ntrainer 0: fine");
  EXPECT_EQ(forged.code(), absl::StatusCode::kInvalidArgument) << forged;
  EXPECT_EQ(handler_.aborts().size(), 1u);
}

// The standard gRPC health service answers SERVING for the PServer service.
TEST_F(GrpcRpcTest, HealthServiceSaysServing) {
  // HealthCheckRequest{service: "tessera.PServer"} (field 1, length-delimited).
  std::string service = "tessera.PServer";
  std::string request = std::string("\x0a") + static_cast<char>(service.size()) + service;
  std::string bytes;
  grpc::Status status = RawCall(endpoint_, "/grpc.health.v1.Health/Check", request, &bytes);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(bytes, std::string("\x08\x01", 2));  // HealthCheckResponse{status: SERVING}
}

TEST(GrpcClientTest, UnreachablePserverFailsWithEndpointWithinDeadline) {
  GrpcClientOptions o;
  o.deadline = absl::Milliseconds(300);
  GrpcPServerClient c("127.0.0.1:1", o);
  Variable v;
  absl::Time start = absl::Now();
  absl::Status s = c.GetVariable({"job", 0, 0}, "w", &v);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("127.0.0.1:1"), std::string::npos) << s;
  EXPECT_LT(absl::Now() - start, absl::Seconds(10));
}

// Registration against the real server succeeds (it reports this build's protocol); a pserver
// that answers Register without a protocol (every release before the field) is refused with
// both versions named, before the trainer sends anything it would misread.
TEST_F(GrpcRpcTest, RegisterChecksThePserversWireProtocol) {
  auto c = Client();
  absl::Status s = c->Register(meta_, {{"lr", "0.1"}}, 7);
  EXPECT_TRUE(s.ok()) << s;
}

// Answers Register as a pserver of wire protocol `protocol` does (0: an empty answer, as before
// the field).
class OldRegisterService : public grpc::CallbackGenericService {
 public:
  explicit OldRegisterService(uint32_t protocol) : protocol_(protocol) {}
  grpc::ServerGenericBidiReactor* CreateReactor(grpc::GenericCallbackServerContext*) override {
    class Reactor : public grpc::ServerGenericBidiReactor {
     public:
      explicit Reactor(uint32_t protocol) : protocol_(protocol) { StartRead(&request_); }
      void OnReadDone(bool ok) override {
        if (!ok) return Finish(grpc::Status::OK);
        RegisterResponse answer;
        if (protocol_ > 0) answer.set_protocol(protocol_);
        reply_ = SerializeProto(answer);
        StartWriteAndFinish(&reply_, grpc::WriteOptions(), grpc::Status::OK);
      }
      void OnDone() override { delete this; }

     private:
      const uint32_t protocol_;
      grpc::ByteBuffer request_, reply_;
    };
    return new Reactor(protocol_);
  }

 private:
  const uint32_t protocol_;
};

// Releases before the field (0) and the one before this (lookups riding on a send, but no
// table-wise placement) are both refused, naming both versions.
class OlderPserverTest : public ::testing::TestWithParam<uint32_t> {};

TEST_P(OlderPserverTest, RegisterRefusesAPserverOlderThanTheTrainer) {
  OldRegisterService service(GetParam());
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterCallbackGenericService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  ASSERT_NE(server, nullptr);
  GrpcClientOptions o;
  o.deadline = absl::Seconds(20);
  const std::string ep = absl::StrCat("127.0.0.1:", port);
  GrpcPServerClient c(ep, o);
  absl::Status s = c.Register({"job", 0, 0}, {{"lr", "0.1"}}, 7);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find(ep), std::string::npos) << s;
  EXPECT_NE(s.message().find(absl::StrCat("speaks wire protocol ", GetParam(),
                                          ", older than this trainer's ", kWireProtocol)),
            std::string::npos)
      << s;
  server->Shutdown();
}

INSTANTIATE_TEST_SUITE_P(Releases, OlderPserverTest, ::testing::Values(0u, kWireProtocol - 1));

}  // namespace
}  // namespace tessera
