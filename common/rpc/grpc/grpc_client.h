// GrpcPServerClient: PServerClient over gRPC (generic stub + the codec in codec.h).
//
// Dense tensors larger than `chunk_bytes` travel as concurrent chunk calls (sends, and gets into
// a destination that already has the right size), which keeps several HTTP/2 frames in flight.
// Every call has a deadline; UNAVAILABLE is retried by gRPC's retry policy (service config) with
// exponential backoff up to `max_attempts`; with wait_for_ready, calls wait for a pserver that
// is still starting (until the deadline) instead of failing at once. Thread-safe.
#ifndef TESSERA_COMMON_RPC_GRPC_GRPC_CLIENT_H_
#define TESSERA_COMMON_RPC_GRPC_GRPC_CLIENT_H_

#include <atomic>
#include <memory>
#include <string>

#include "absl/time/time.h"
#include "common/rpc/client.h"
#include "common/rpc/grpc/credentials.h"
#include "common/rpc/rpc_observer.h"

namespace grpc {
class Channel;
template <class R, class W>
class TemplatedGenericStub;
class ByteBuffer;
}  // namespace grpc

namespace tessera {

struct GrpcClientOptions {
  int64_t chunk_bytes = int64_t{4} << 20;  // 0: never chunk
  absl::Duration deadline = absl::Seconds(120);
  int max_attempts = 5;  // per call, retrying UNAVAILABLE
  // Calls wait for the channel to connect (within `deadline`) until Connect() succeeded; after
  // it they fail fast (UNAVAILABLE once retries are spent) when the pserver goes away.
  bool wait_for_ready = true;
  // A connected pserver that stops answering (frozen, partitioned, its host gone) is dropped
  // when an HTTP/2 ping is not answered within `keepalive` of the last one sent; its calls then
  // fail instead of waiting for `deadline`. Zero: no pings.
  absl::Duration keepalive = absl::Seconds(5);
  // An ABORT or a HEARTBEAT is a courtesy to pservers that may be gone: it waits for no
  // connection and at most this long.
  absl::Duration abort_deadline = absl::Seconds(2);
  int64_t max_message_bytes = int64_t{1} << 30;
  // Mutual TLS and the job token sent with every call (see credentials.h).
  RpcSecurity security;
  // Told about every finished call (may be null); must outlive the client.
  RpcObserver* observer = nullptr;
};

class GrpcPServerClient : public PServerClient {
 public:
  GrpcPServerClient(std::string endpoint, GrpcClientOptions options);
  ~GrpcPServerClient() override;

  const std::string& endpoint() const override { return endpoint_; }
  absl::Status Connect(absl::Duration timeout) override;
  void SendVariableAsync(const RequestMeta& meta, const std::string& name, const Variable* var,
                         DoneCallback done) override;
  void GetVariableAsync(const RequestMeta& meta, const std::string& name, Variable* out,
                        DoneCallback done) override;
  void PrefetchAsync(const RequestMeta& meta, const std::string& table,
                     const std::vector<int64_t>* ids, Tensor* out, DoneCallback done) override;
  void BarrierAsync(const RequestMeta& meta, BarrierKind kind, DoneCallback done) override;
  void SendBarrierAsync(const RequestMeta& meta, StepReply* reply, DoneCallback done) override;
  void AbortAsync(const RequestMeta& meta, const std::string& reason, DoneCallback done) override;
  void CheckpointAsync(const RequestMeta& meta, const std::string& dir, DoneCallback done) override;
  void RegisterAsync(const RequestMeta& meta, const JobFields& fields, uint64_t nonce,
                     DoneCallback done) override;
  // One SendBatch / GetBatch / PrefetchBatch request each. Dense tensors over chunk_bytes still
  // travel as chunk calls, and batches are cut at chunk_bytes of payload; those parts go first,
  // and the barrier rides on the last request once they are done. A get with after_update
  // that needs several requests first waits for the update in an empty GetBatch.
  void SendBatchAsync(const RequestMeta& meta, std::vector<SendItem> items, bool send_barrier,
                      StepReply* reply, DoneCallback done) override;
  void GetBatchAsync(const RequestMeta& meta, std::vector<GetItem> items, bool fetch_barrier,
                     bool after_update, DoneCallback done) override;
  void PrefetchBatchAsync(const RequestMeta& meta, std::vector<PrefetchItem> items,
                          bool after_update, DoneCallback done) override;
  void SendGetBatchAsync(const RequestMeta& meta, std::vector<SendItem> items, bool send_barrier,
                         StepReply* reply, std::vector<GetItem> gets, bool fetch_barrier,
                         std::vector<PrefetchItem> lookups, DoneCallback done) override;

 private:
  using Stub = grpc::TemplatedGenericStub<grpc::ByteBuffer, grpc::ByteBuffer>;
  // Issues one unary call; `on_response` gets the decoded-status and the response buffer.
  // `courtesy` calls (ABORT, HEARTBEAT) wait for no connection and at most
  // options_.abort_deadline.
  void Call(const char* method, grpc::ByteBuffer request,
            std::function<absl::Status(const grpc::ByteBuffer&)> on_response, DoneCallback done,
            bool courtesy = false);
  // One SendGetBatch request: the gradients (one batch's worth), perhaps the send barrier, the
  // parameters to fetch (over a reply's worth: fetched by GetBatchAsync once it is answered)
  // and the lookups.
  void SendGetBatch(const RequestMeta& meta, std::vector<SendItem> items, bool send_barrier,
                    StepReply* reply, std::vector<GetItem> gets, bool fetch_barrier,
                    std::vector<PrefetchItem> lookups, DoneCallback done);

  std::string endpoint_;
  GrpcClientOptions options_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<Stub> stub_;
  std::atomic<bool> connected_{false};
};

// Creates the channel options shared by all clients (message limits, retry policy).
std::shared_ptr<grpc::Channel> NewPServerChannel(const std::string& endpoint,
                                                 const GrpcClientOptions& options);

}  // namespace tessera

#endif  // TESSERA_COMMON_RPC_GRPC_GRPC_CLIENT_H_
