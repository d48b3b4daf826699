// RequestHandler: what a pserver implements to serve the wire protocol. The transport
// (common/rpc/grpc/grpc_server.h, or the in-process client) decodes requests and calls it.
//
// Handlers never block an RPC thread: each method finishes by calling `done` (now, or later
// from any thread, e.g. when a barrier completes). Implementations must be thread-safe.
#ifndef TESSERA_COMMON_RPC_SERVER_H_
#define TESSERA_COMMON_RPC_SERVER_H_

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "common/rpc/rpc.h"

namespace tessera {

class RequestHandler {
 public:
  virtual ~RequestHandler() = default;

  // Checks the request's job id (and anything else common to all requests). A failed status is
  // returned to the caller as is (e.g. UNAUTHENTICATED for another job's request).
  virtual absl::Status Admit(const RequestMeta& meta) = 0;
  // Admit for a HEARTBEAT barrier, which tells that the trainer is alive but is no work: a
  // handler that watches for trainers that stopped working tells the two apart.
  virtual absl::Status AdmitHeartbeat(const RequestMeta& meta) { return Admit(meta); }

  // Where the bytes of an incoming variable go: the handler returns the destination variable,
  // already holding a tensor (or SelectedRows value) of header.dtype/dims. Chunks of one
  // variable arrive concurrently and must get the same destination. Errors (unknown variable,
  // wrong shape) are INVALID_ARGUMENT and leave everything stored unchanged.
  virtual absl::StatusOr<Variable*> PrepareReceive(const RequestMeta& meta,
                                                   const VariableHeader& header) = 0;
  // The bytes of one message (a whole variable or a chunk) are in place.
  virtual void HandleSend(const RequestMeta& meta, const VariableHeader& header, Variable* var,
                          DoneCallback done) = 0;

  // Produces the value of dense variable `name`. The returned Variable may share its buffer
  // with the server's (no copy) only while the server guarantees nobody writes it until the
  // response is sent.
  using GetDone = std::function<void(absl::StatusOr<Variable>)>;
  virtual void HandleGet(const RequestMeta& meta, const std::string& name, GetDone done) = 0;

  using PrefetchDone = std::function<void(absl::StatusOr<Tensor>)>;
  virtual void HandlePrefetch(const RequestMeta& meta, const std::string& table,
                              std::vector<int64_t> ids, PrefetchDone done) = 0;
  // The rows of several tables' ids (a PrefetchBatch, each table at most once): `done` gets one
  // result per query, in order. With `after_update` they are the rows as the update of step
  // meta.step left them (AwaitUpdate; a failed wait is every query's result). The default waits
  // with AwaitUpdate, then asks HandlePrefetch for each query in turn; a handler with threads to
  // spare looks them up side by side, or as it applies the update.
  struct PrefetchQuery {
    std::string table;
    std::vector<int64_t> ids;
  };
  using PrefetchBatchDone = std::function<void(std::vector<absl::StatusOr<Tensor>>)>;
  virtual void HandlePrefetchBatch(const RequestMeta& meta, std::vector<PrefetchQuery> queries,
                                   bool after_update, PrefetchBatchDone done) {
    if (after_update) {
      auto held = std::make_shared<std::vector<PrefetchQuery>>(std::move(queries));
      AwaitUpdate(meta, [this, meta, held, done](absl::Status s) {
        if (!s.ok()) return done(std::vector<absl::StatusOr<Tensor>>(held->size(), s));
        HandlePrefetchBatch(meta, std::move(*held), false, done);
      });
      return;
    }
    struct Results {
      std::vector<absl::StatusOr<Tensor>> rows;
      std::atomic<size_t> left;
    };
    auto results = std::make_shared<Results>();
    results->rows.resize(queries.size());
    results->left = queries.size();
    if (queries.empty()) return done({});
    for (size_t i = 0; i < queries.size(); ++i) {
      HandlePrefetch(meta, queries[i].table, std::move(queries[i].ids),
                     [results, i, done](absl::StatusOr<Tensor> rows) {
                       results->rows[i] = std::move(rows);
                       if (--results->left == 0) done(std::move(results->rows));
                     });
    }
  }

  virtual void HandleBarrier(const RequestMeta& meta, BarrierKind kind, DoneCallback done) = 0;
  // A GetBatch or PrefetchBatch with after_update: `done` runs once the parameters are as the
  // update of step meta.step left them (sync mode), and the request is then served; a failure
  // answers the request. The default (no step protocol) runs `done` at once.
  virtual void AwaitUpdate(const RequestMeta& meta, DoneCallback done) { done(absl::OkStatus()); }
  // Asked once the send barrier of `step` was released: whether a trainer sent it with
  // RequestMeta::last_batch, so that every trainer ends the epoch after this step (sync mode,
  // streamed data; the answer travels in SendResponse / BarrierResponse).
  virtual bool StepEndsEpoch(int64_t step) { return false; }
  // An ABORT with the trainer's reason (already checked: printable and bounded). The default
  // handles it as HandleBarrier(ABORT).
  virtual void HandleAbort(const RequestMeta& meta, const std::string& reason, DoneCallback done) {
    HandleBarrier(meta, ABORT, std::move(done));
  }
  virtual void HandleCheckpoint(const RequestMeta& meta, const std::string& dir,
                                DoneCallback done) = 0;
  // The job handshake of trainer meta.trainer_id (process `nonce`): a mismatch of `fields` with
  // the job's is FAILED_PRECONDITION naming the field and both values.
  virtual void HandleRegister(const RequestMeta& meta, const JobFields& fields, uint64_t nonce,
                              DoneCallback done) = 0;
};

}  // namespace tessera

#endif  // TESSERA_COMMON_RPC_SERVER_H_
