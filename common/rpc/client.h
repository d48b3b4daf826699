// PServerClient: how a trainer talks to one parameter server.
//
// Every call is asynchronous: `done` runs exactly once, on an RPC thread, after which the call
// no longer touches its arguments. The blocking helpers wait for `done`. Implementations are
// thread-safe; calls to one client may overlap (that is how sends to all pservers and chunks
// of one large tensor run in parallel). Errors: UNAVAILABLE for transport failures (after the
// client's own retries), DEADLINE_EXCEEDED past the call deadline, and the server's status
// otherwise; every message names the endpoint.
#ifndef TESSERA_COMMON_RPC_CLIENT_H_
#define TESSERA_COMMON_RPC_CLIENT_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/rpc/rpc.h"

namespace tessera {

class PServerClient {
 public:
  virtual ~PServerClient() = default;

  virtual const std::string& endpoint() const = 0;

  // Waits at most `timeout` until the pserver is reachable. UNAVAILABLE naming the endpoint and
  // the cause (no such host, connection refused, TLS handshake) otherwise. After success a call
  // no longer waits for a pserver that went away: it fails once its retries are spent.
  virtual absl::Status Connect(absl::Duration timeout) { return absl::OkStatus(); }

  // Sends `var` (dense tensor or SelectedRows) under `name`. `var` must stay unchanged until
  // `done` runs (its bytes may be sent without copying).
  virtual void SendVariableAsync(const RequestMeta& meta, const std::string& name,
                                 const Variable* var, DoneCallback done) = 0;
  // Fetches dense variable `name` into *out (reusing its buffer when the size matches).
  virtual void GetVariableAsync(const RequestMeta& meta, const std::string& name, Variable* out,
                                DoneCallback done) = 0;
  // Rows of distributed table `table` for `ids` into *out ([ids.size(), width]).
  virtual void PrefetchAsync(const RequestMeta& meta, const std::string& table,
                             const std::vector<int64_t>* ids, Tensor* out, DoneCallback done) = 0;
  virtual void BarrierAsync(const RequestMeta& meta, BarrierKind kind, DoneCallback done) = 0;
  // The SEND_BARRIER alone, its answer into `reply` (nullptr: ignored). The default is
  // BarrierAsync(SEND_BARRIER), which answers nothing.
  virtual void SendBarrierAsync(const RequestMeta& meta, StepReply* reply, DoneCallback done) {
    BarrierAsync(meta, SEND_BARRIER, std::move(done));
  }
  // Tells the pserver this trainer stopped with an error (BarrierKind ABORT), and why: `reason`
  // (printable, at most kMaxAbortReasonBytes; request_checks.h) reaches every process of the
  // job. The default sends the ABORT without its reason.
  virtual void AbortAsync(const RequestMeta& meta, const std::string& reason, DoneCallback done) {
    BarrierAsync(meta, ABORT, std::move(done));
  }
  // Asks the pserver to save its shard of checkpoint `dir` ("ckpt-<step>") under its own
  // --checkpoint_dir.
  virtual void CheckpointAsync(const RequestMeta& meta, const std::string& dir,
                               DoneCallback done) = 0;
  // The job handshake (proto RegisterRequest) of this trainer process (`nonce`). gRPC: also
  // FAILED_PRECONDITION when the pserver's wire protocol (RegisterResponse.protocol) is older
  // than kWireProtocol (common/rpc/grpc/codec.h).
  virtual void RegisterAsync(const RequestMeta& meta, const JobFields& fields, uint64_t nonce,
                             DoneCallback done) = 0;

  // Waits until the pserver applied the update of step meta.step (sync mode; proto
  // GetBatchRequest.after_update). The default fails UNIMPLEMENTED: a transport that can wait
  // overrides it (gRPC carries the wait in the batched requests instead).
  virtual void AwaitUpdateAsync(const RequestMeta& meta, DoneCallback done);

  // Batched forms: all of a step's traffic with this pserver in one request each (README "Wire
  // protocol"). `items` (and what they point to) must stay valid and unchanged until `done`.
  // SendBatchAsync sends every gradient, then (send_barrier) the SEND_BARRIER: `done` runs when
  // the barrier is released. GetBatchAsync fetches every parameter, then (fetch_barrier) the
  // FETCH_BARRIER. PrefetchBatchAsync looks up the ids of every table (each table at most once).
  // With `after_update`, gets and lookups are served once the pserver applied step meta.step:
  // a sync trainer sends them along with that step's gradients rather than after their reply.
  // The defaults compose the single calls above (one request each, after AwaitUpdateAsync);
  // transports override them. With send_barrier, the released barrier's answer goes to `reply`
  // (nullptr: ignored).
  virtual void SendBatchAsync(const RequestMeta& meta, std::vector<SendItem> items,
                              bool send_barrier, StepReply* reply, DoneCallback done);
  virtual void GetBatchAsync(const RequestMeta& meta, std::vector<GetItem> items,
                             bool fetch_barrier, bool after_update, DoneCallback done);
  virtual void PrefetchBatchAsync(const RequestMeta& meta, std::vector<PrefetchItem> items,
                                  bool after_update, DoneCallback done);
  // A step's send and receive together, and perhaps the next batch's lookups. Sync
  // (send_barrier): SendBatchAsync(items, send_barrier = true, reply), GetBatchAsync(gets,
  // fetch_barrier, after_update = true) and PrefetchBatchAsync(lookups, after_update = true).
  // Async (no send_barrier; items may be empty: a step's receive): SendBatchAsync(items,
  // send_barrier = false), then, once the pserver handled (async: applied) the gradients,
  // GetBatchAsync(gets, fetch_barrier, after_update = false) and PrefetchBatchAsync(lookups,
  // after_update = false). `done` runs once all are done. The default issues the calls
  // themselves; a transport may fold them into one request (gRPC: SendGetBatch, when the
  // gradients need no chunks).
  virtual void SendGetBatchAsync(const RequestMeta& meta, std::vector<SendItem> items,
                                 bool send_barrier, StepReply* reply, std::vector<GetItem> gets,
                                 bool fetch_barrier, std::vector<PrefetchItem> lookups,
                                 DoneCallback done);

  // Blocking forms.
  absl::Status SendVariable(const RequestMeta& meta, const std::string& name, const Variable& var);
  absl::Status Register(const RequestMeta& meta, const JobFields& fields, uint64_t nonce);
  absl::Status GetVariable(const RequestMeta& meta, const std::string& name, Variable* out);
  absl::Status Prefetch(const RequestMeta& meta, const std::string& table,
                        const std::vector<int64_t>& ids, Tensor* out);
  absl::Status Barrier(const RequestMeta& meta, BarrierKind kind);
  absl::Status Abort(const RequestMeta& meta, const std::string& reason);
  absl::Status Checkpoint(const RequestMeta& meta, const std::string& dir);
};

// Collects the statuses of several async calls; Wait() returns the first error (or OK) once
// `n` callbacks have run. Thread-safe; callbacks may outlive the group object.
class StatusGroup {
 public:
  explicit StatusGroup(int n);
  DoneCallback Callback();
  absl::Status Wait();

 private:
  struct State {
    absl::Mutex mu;
    int pending ABSL_GUARDED_BY(mu);
    absl::Status first_error ABSL_GUARDED_BY(mu);
  };
  std::shared_ptr<State> state_;
};

}  // namespace tessera

#endif  // TESSERA_COMMON_RPC_CLIENT_H_
