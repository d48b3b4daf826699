// RpcObserver on both ends of the gRPC transport: every call is reported once per side with its
// method, status code, latency and message bytes, and both sides agree on the bytes.
#include <map>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "common/rpc/grpc/grpc_client.h"
#include "common/rpc/grpc/grpc_server.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

class Recorder : public RpcObserver {
 public:
  void OnCall(const RpcCallInfo& call) override {
    absl::MutexLock lock(&mu_);
    calls_.push_back(call);
  }
  std::vector<RpcCallInfo> calls() {
    absl::MutexLock lock(&mu_);
    return calls_;
  }

 private:
  absl::Mutex mu_;
  std::vector<RpcCallInfo> calls_;
};

// Accepts sends; gets fail NOT_FOUND; barriers answer after 50 ms; checkpoints UNIMPLEMENTED.
class Handler : public RequestHandler {
 public:
  absl::Status Admit(const RequestMeta&) override { return absl::OkStatus(); }
  absl::StatusOr<Variable*> PrepareReceive(const RequestMeta&, const VariableHeader& h) override {
    absl::MutexLock lock(&mu_);
    Tensor* t = var_.GetMutable<Tensor>();
    if (!t->initialized() || t->shape() != h.dims) t->Resize(h.dtype, h.dims);
    return &var_;
  }
  void HandleSend(const RequestMeta&, const VariableHeader&, Variable*,
                  DoneCallback done) override {
    done(absl::OkStatus());
  }
  void HandleGet(const RequestMeta&, const std::string& name, GetDone done) override {
    done(absl::NotFoundError("no variable " + name));
  }
  void HandlePrefetch(const RequestMeta&, const std::string&, std::vector<int64_t> ids,
                      PrefetchDone done) override {
    done(Tensor(FLOAT32, {static_cast<int64_t>(ids.size()), 4}));
  }
  void HandleBarrier(const RequestMeta&, BarrierKind, DoneCallback done) override {
    std::thread([done = std::move(done)] {
      absl::SleepFor(absl::Milliseconds(50));
      done(absl::OkStatus());
    }).detach();
  }
  void HandleCheckpoint(const RequestMeta&, const std::string&, DoneCallback done) override {
    done(absl::UnimplementedError("no checkpoints here"));
  }
  void HandleRegister(const RequestMeta&, const JobFields&, uint64_t, DoneCallback done) override {
    done(absl::UnimplementedError("no job handshake here"));
  }

 private:
  absl::Mutex mu_;
  Variable var_;
};

// The single call of `method` in `calls`.
RpcCallInfo Only(const std::vector<RpcCallInfo>& calls, RpcMethod method) {
  int n = 0;
  RpcCallInfo found;
  for (const auto& c : calls) {
    if (c.method == method) {
      found = c;
      ++n;
    }
  }
  EXPECT_EQ(n, 1) << RpcMethodLabel(method);
  return found;
}

TEST(GrpcObserverTest, BothSidesReportEveryCall) {
  Handler handler;
  Recorder server_calls, client_calls;
  GrpcServerOptions so;
  so.observer = &server_calls;
  GrpcServer server(so, &handler);
  ASSERT_TRUE(server.Start().ok());
  GrpcClientOptions co;
  co.observer = &client_calls;
  co.deadline = absl::Seconds(10);
  GrpcPServerClient client(absl::StrCat("127.0.0.1:", server.port()), co);
  RequestMeta meta{"job", 0, 0};

  Variable x;
  x.GetMutable<Tensor>()->Resize(FLOAT32, {1000});
  ASSERT_TRUE(client.SendVariable(meta, "x", x).ok());
  Variable out;
  absl::Status get = client.GetVariable(meta, "missing", &out);
  EXPECT_EQ(get.code(), absl::StatusCode::kNotFound);
  Tensor rows;
  ASSERT_TRUE(client.Prefetch(meta, "t", {1, 2, 3}, &rows).ok());
  ASSERT_TRUE(client.Barrier(meta, SEND_BARRIER).ok());
  EXPECT_EQ(client.Checkpoint(meta, "/tmp/x").code(), absl::StatusCode::kUnimplemented);
  server.Shutdown();
  server.Wait();

  std::vector<RpcCallInfo> s = server_calls.calls(), c = client_calls.calls();
  ASSERT_EQ(s.size(), 5u);
  ASSERT_EQ(c.size(), 5u);
  RpcCallInfo s_send = Only(s, RpcMethod::kSend), c_send = Only(c, RpcMethod::kSend);
  EXPECT_EQ(s_send.code, absl::StatusCode::kOk);
  EXPECT_GE(s_send.bytes_received, 4000);  // 1000 floats and a header
  EXPECT_EQ(c_send.bytes_sent, s_send.bytes_received);
  EXPECT_EQ(c_send.bytes_received, s_send.bytes_sent);
  RpcCallInfo s_get = Only(s, RpcMethod::kGet), c_get = Only(c, RpcMethod::kGet);
  EXPECT_EQ(s_get.code, absl::StatusCode::kNotFound);
  EXPECT_EQ(c_get.code, absl::StatusCode::kNotFound);
  EXPECT_EQ(s_get.bytes_sent, 0);
  EXPECT_EQ(c_get.bytes_sent, s_get.bytes_received);
  RpcCallInfo s_pre = Only(s, RpcMethod::kPrefetch), c_pre = Only(c, RpcMethod::kPrefetch);
  EXPECT_GE(s_pre.bytes_sent, 3 * 4 * 4);  // 3 rows of 4 floats
  EXPECT_EQ(c_pre.bytes_received, s_pre.bytes_sent);
  RpcCallInfo s_bar = Only(s, RpcMethod::kBarrier), c_bar = Only(c, RpcMethod::kBarrier);
  EXPECT_GE(s_bar.latency, absl::Milliseconds(50));
  EXPECT_GE(c_bar.latency, s_bar.latency);
  EXPECT_EQ(Only(s, RpcMethod::kCheckpoint).code, absl::StatusCode::kUnimplemented);
  EXPECT_EQ(Only(c, RpcMethod::kCheckpoint).code, absl::StatusCode::kUnimplemented);
  for (const auto& call : c) EXPECT_GE(call.latency, absl::ZeroDuration());
}

TEST(GrpcObserverTest, ChunkedSendsAreOneCallPerChunk) {
  Handler handler;
  Recorder server_calls, client_calls;
  GrpcServerOptions so;
  so.observer = &server_calls;
  GrpcServer server(so, &handler);
  ASSERT_TRUE(server.Start().ok());
  GrpcClientOptions co;
  co.observer = &client_calls;
  co.chunk_bytes = 1024;
  GrpcPServerClient client(absl::StrCat("127.0.0.1:", server.port()), co);
  Variable x;
  x.GetMutable<Tensor>()->Resize(FLOAT32, {1000});  // 4000 bytes: 4 chunks
  ASSERT_TRUE(client.SendVariable(RequestMeta{"job", 0, 0}, "x", x).ok());
  server.Shutdown();
  server.Wait();
  std::vector<RpcCallInfo> s = server_calls.calls(), c = client_calls.calls();
  ASSERT_EQ(s.size(), 4u);
  ASSERT_EQ(c.size(), 4u);
  int64_t server_in = 0, client_out = 0;
  for (const auto& call : s) server_in += call.bytes_received;
  for (const auto& call : c) client_out += call.bytes_sent;
  EXPECT_EQ(server_in, client_out);
  EXPECT_GE(server_in, 4000);
}

}  // namespace
}  // namespace tessera
