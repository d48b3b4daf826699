// The gRPC transport end to end on loopback, against a small in-memory handler.
#include <map>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/generic/generic_stub.h"
#include "common/rpc/grpc/grpc_client.h"
#include "common/rpc/grpc/grpc_server.h"
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
    absl::MutexLock lock(&mu_);
    ++sends_;
    done(absl::OkStatus());
  }
  void HandleGet(const RequestMeta& meta, const std::string& name, GetDone done) override {
    absl::MutexLock lock(&mu_);
    auto it = vars_.find(name);
    if (it == vars_.end()) return done(absl::NotFoundError("no variable " + name));
    done(it->second);
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
  void HandleCheckpoint(const RequestMeta& meta, const std::string& dir,
                        DoneCallback done) override {
    done(absl::UnimplementedError("no checkpoints here"));
  }
  void HandleRegister(const RequestMeta&, const JobFields&, uint64_t, DoneCallback done) override {
    done(absl::UnimplementedError("no job handshake here"));
  }
  int sends() {
    absl::MutexLock lock(&mu_);
    return sends_;
  }

 private:
  absl::Mutex mu_;
  std::map<std::string, Variable> vars_;
  std::vector<DoneCallback> waiting_;
  int sends_ = 0;
};

class GrpcRpcTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server_ = std::make_unique<GrpcServer>(GrpcServerOptions{"127.0.0.1:0"}, &handler_);
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

// The standard gRPC health service answers SERVING for the PServer service.
TEST_F(GrpcRpcTest, HealthServiceSaysServing) {
  auto channel = grpc::CreateChannel(endpoint_, grpc::InsecureChannelCredentials());
  grpc::GenericStub stub(channel);
  // HealthCheckRequest{service: "tessera.PServer"} (field 1, length-delimited).
  std::string service = "tessera.PServer";
  std::string request = std::string("\x0a") + static_cast<char>(service.size()) + service;
  grpc::Slice slice(request);
  grpc::ByteBuffer req(&slice, 1), resp;
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  absl::Notification done;
  grpc::Status status;
  stub.UnaryCall(&ctx, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &req, &resp,
                 [&](grpc::Status s) {
                   status = s;
                   done.Notify();
                 });
  done.WaitForNotification();
  ASSERT_TRUE(status.ok()) << status.error_message();
  grpc::Slice out;
  ASSERT_TRUE(resp.DumpToSingleSlice(&out).ok());
  std::string bytes(reinterpret_cast<const char*>(out.begin()), out.size());
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

}  // namespace
}  // namespace tessera
