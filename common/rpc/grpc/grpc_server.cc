#include "common/rpc/grpc/grpc_server.h"

#include <atomic>
#include <cstring>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/rpc/grpc/codec.h"
#include "common/rpc/grpc/credentials.h"
#include "common/rpc/grpc/grpc_util.h"
#include "common/rpc/request_checks.h"
#include "common/base/status.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "proto/pserver.grpc.pb.h"

namespace tessera {

using RawService =
    PServer::WithRawCallbackMethod_SendVariable<PServer::WithRawCallbackMethod_GetVariable<
        PServer::WithRawCallbackMethod_Prefetch<PServer::WithRawCallbackMethod_Barrier<
            PServer::WithRawCallbackMethod_Checkpoint<PServer::WithRawCallbackMethod_Register<
                PServer::WithRawCallbackMethod_SendBatch<PServer::WithRawCallbackMethod_GetBatch<
                    PServer::WithRawCallbackMethod_PrefetchBatch<
                        PServer::WithRawCallbackMethod_SendGetBatch<PServer::Service>>>>>>>>>>;

namespace {

// A unary reactor that reports its call to an RpcObserver (if any) when the handler finishes it.
// Finish() hides, not overrides, ServerUnaryReactor::Finish (which is not virtual): the
// handlers below call it through an ObservedReactor*. Deletes itself when gRPC is done.
class ObservedReactor : public grpc::ServerUnaryReactor {
 public:
  ObservedReactor(RpcObserver* observer, RpcMethod method, const grpc::ByteBuffer* request,
                  const grpc::ByteBuffer* response)
      : observer_(observer), method_(method), request_(request), response_(response) {
    if (observer_ != nullptr) start_ = absl::Now();
  }
  void Finish(grpc::Status status) {
    if (observer_ != nullptr) {
      RpcCallInfo call;
      call.method = method_;
      call.code = static_cast<absl::StatusCode>(status.error_code());
      call.latency = absl::Now() - start_;
      call.bytes_received = static_cast<int64_t>(request_->Length());
      call.bytes_sent = status.ok() ? static_cast<int64_t>(response_->Length()) : 0;
      observer_->OnCall(call);
    }
    grpc::ServerUnaryReactor::Finish(std::move(status));
  }
  void OnDone() override { delete this; }

 private:
  RpcObserver* const observer_;
  const RpcMethod method_;
  const grpc::ByteBuffer* const request_;
  const grpc::ByteBuffer* const response_;
  absl::Time start_;
};

// The queries of a PrefetchBatch's tables (or a SendGetBatch's lookups), checked: printable
// names, each table at most once, whole int64 ids, ids_of_table naming an earlier table.
absl::Status LookupQueries(
    const google::protobuf::RepeatedPtrField<PrefetchBatchRequest::Table>& tables,
    std::vector<RequestHandler::PrefetchQuery>* queries) {
  absl::flat_hash_set<std::string> seen;
  for (int i = 0; i < tables.size(); ++i) {
    const PrefetchBatchRequest::Table& t = tables.Get(i);
    TS_RETURN_IF_ERROR(CheckRequestName("table name", t.table()));
    TS_RETURN_IF_ERROR(CheckPrefetchIds(t.table(), t.ids().size()));
    if (!seen.insert(t.table()).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("table ", t.table(), " appears twice in one prefetch"));
    }
    TS_RETURN_IF_ERROR(CheckIdsOfTable(t.table(), i, t.ids_of_table(), t.ids().size()));
  }
  queries->assign(tables.size(), {});
  for (int i = 0; i < tables.size(); ++i) {
    const PrefetchBatchRequest::Table& t = tables.Get(i);
    RequestHandler::PrefetchQuery& q = (*queries)[i];
    q.table = t.table();
    if (t.ids_of_table() != 0) {
      q.ids = (*queries)[t.ids_of_table() - 1].ids;
      continue;
    }
    const std::string& bytes = t.ids();
    q.ids.resize(bytes.size() / sizeof(int64_t));
    if (!q.ids.empty()) std::memcpy(q.ids.data(), bytes.data(), bytes.size());
  }
  return absl::OkStatus();
}

}  // namespace

class GrpcServer::Service : public RawService {
 public:
  Service(RequestHandler* handler, int64_t max_bytes, std::string job_token)
      : handler_(handler), max_bytes_(max_bytes), job_token_(std::move(job_token)) {}

  int64_t unauthenticated() const { return unauthenticated_.load(); }
  // Set before the server starts; nullptr: calls are not reported.
  void set_observer(RpcObserver* observer) { observer_ = observer; }

  grpc::ServerUnaryReactor* SendVariable(grpc::CallbackServerContext* ctx,
                                         const grpc::ByteBuffer* request,
                                         grpc::ByteBuffer* response) override {
    ObservedReactor* reactor = NewReactor(RpcMethod::kSend, request, response);
    absl::Status auth = CheckToken(ctx);
    if (!auth.ok()) return Fail(reactor, auth);
    auto decoded = DecodeVariable(*request, max_bytes_);
    if (!decoded.ok()) return Fail(reactor, decoded.status());
    absl::Status admit = Admit(decoded->meta());
    if (!admit.ok()) return Fail(reactor, admit);
    auto dest = handler_->PrepareReceive(decoded->meta(), decoded->header());
    if (!dest.ok()) return Fail(reactor, dest.status());
    Variable* var = *dest;
    absl::Status copied = CopyReceived(*decoded, var);
    if (!copied.ok()) return Fail(reactor, copied);
    *response = SerializeProto(SendResponse());
    handler_->HandleSend(decoded->meta(), decoded->header(), var,
                         [reactor](absl::Status s) { reactor->Finish(ToGrpcStatus(s)); });
    return reactor;
  }

  // Every gradient of the batch, then (send_barrier) the send barrier; the reply comes when the
  // barrier is released.
  grpc::ServerUnaryReactor* SendBatch(grpc::CallbackServerContext* ctx,
                                      const grpc::ByteBuffer* request,
                                      grpc::ByteBuffer* response) override {
    ObservedReactor* reactor = NewReactor(RpcMethod::kSendBatch, request, response);
    return ReceiveBatch(ctx, *request, reactor, nullptr,
                        [this, response](const RequestMeta& meta, const DecodedBatch& batch,
                                         DoneCallback finish) {
                          *response = SerializeProto(SendResponse());
                          if (batch.send_barrier) {
                            SendBarrier<SendResponse>(meta, response, std::move(finish));
                          } else {
                            finish(absl::OkStatus());
                          }
                        });
  }

  // A sync step's send with its recv folded in: every gradient and the send barrier as a
  // SendBatch, then, once the step is applied, the named parameters and (fetch_barrier) the
  // fetch barrier as a GetBatch with after_update. The next batch's lookups may ride along:
  // handed to the handler before the barrier (so that the step's optimize looks them up as it
  // applies the tables), answered as a PrefetchBatch with after_update. One reply: the
  // parameters, the lookups' rows, and epoch_end.
  // Without the send barrier (an async step: its push with its receive folded in, or the
  // receive alone, perhaps with the next batch's lookups), once its gradients (if any) are
  // handled: the lookups as a PrefetchBatch and the parameters as a GetBatch, neither with
  // after_update; the same reply.
  grpc::ServerUnaryReactor* SendGetBatch(grpc::CallbackServerContext* ctx,
                                         const grpc::ByteBuffer* request,
                                         grpc::ByteBuffer* response) override {
    ObservedReactor* reactor = NewReactor(RpcMethod::kSendGetBatch, request, response);
    auto queries = std::make_shared<std::vector<RequestHandler::PrefetchQuery>>();
    auto check = [queries](const DecodedBatch& batch) {
      for (const std::string& name : batch.extras.get_names) {
        TS_RETURN_IF_ERROR(CheckRequestName("variable name", name));
      }
      return LookupQueries(batch.lookups, queries.get());
    };
    return ReceiveBatch(
        ctx, *request, reactor, check,
        [this, response, queries](const RequestMeta& meta, const DecodedBatch& batch,
                                  DoneCallback finish) {
          struct Step {
            std::vector<std::string> names;
            bool fetch_barrier = false;
            bool epoch_end = false;
            Tail rows;  // the lookups': table, rows
          };
          auto step = std::make_shared<Step>();
          step->names = batch.extras.get_names;
          step->fetch_barrier = batch.extras.fetch_barrier;
          step->rows = TablesOf(*queries);
          // The reply once the update is applied and the lookups are answered.
          std::vector<DoneCallback> ready = JoinThen(
              queries->empty() ? 1 : 2,
              [this, meta, step, response, finish] {
                ServeGets(meta, step->names, step->fetch_barrier, step->epoch_end, &step->rows,
                          response, [step, finish](absl::Status s) { finish(s); });
              },
              finish);
          if (!queries->empty()) {
            handler_->HandlePrefetchBatch(
                meta, std::move(*queries), /*after_update=*/batch.send_barrier,
                [step, cb = std::move(ready[1])](std::vector<absl::StatusOr<Tensor>> rows) {
                  cb(FillRows(std::move(rows), &step->rows));
                });
          }
          if (!batch.send_barrier) return ready[0](absl::OkStatus());
          handler_->HandleBarrier(meta, SEND_BARRIER,
                                  [this, meta, step, cb = std::move(ready[0])](absl::Status st) {
                                    if (!st.ok()) return cb(st);
                                    step->epoch_end = handler_->StepEndsEpoch(meta.step);
                                    AfterUpdate(
                                        true, meta, [cb] { cb(absl::OkStatus()); }, cb);
                                  });
        });
  }

  // Every named parameter (whole dense tensors, in order), then (fetch_barrier) the fetch
  // barrier; the reply comes when the barrier is released.
  grpc::ServerUnaryReactor* GetBatch(grpc::CallbackServerContext* ctx,
                                     const grpc::ByteBuffer* request,
                                     grpc::ByteBuffer* response) override {
    ObservedReactor* reactor = NewReactor(RpcMethod::kGetBatch, request, response);
    GetBatchRequest req;
    RequestMeta meta;
    absl::Status s = Begin(ctx, *request, &req, &meta);
    if (!s.ok()) return Fail(reactor, s);
    for (const std::string& name : req.names()) {
      s = CheckRequestName("variable name", name);
      if (!s.ok()) return Fail(reactor, s);
    }
    auto names = std::make_shared<std::vector<std::string>>(req.names().begin(), req.names().end());
    DoneCallback finish = [reactor](absl::Status st) { reactor->Finish(ToGrpcStatus(st)); };
    const bool barrier = req.fetch_barrier();
    // Everything from the first get on runs after the update where one is awaited (a request
    // with no names too: it only waits).
    AfterUpdate(
        req.after_update(), meta,
        [this, meta, names, barrier, response, finish] {
          ServeGets(meta, *names, barrier, /*epoch_end=*/false, nullptr, response, finish);
        },
        finish);
    return reactor;
  }

  // The rows of every table's ids, one tensor per table in order (with after_update, once the
  // handler applied the request's step).
  grpc::ServerUnaryReactor* PrefetchBatch(grpc::CallbackServerContext* ctx,
                                          const grpc::ByteBuffer* request,
                                          grpc::ByteBuffer* response) override {
    ObservedReactor* reactor = NewReactor(RpcMethod::kPrefetchBatch, request, response);
    PrefetchBatchRequest req;
    RequestMeta meta;
    absl::Status s = Begin(ctx, *request, &req, &meta);
    if (!s.ok()) return Fail(reactor, s);
    std::vector<RequestHandler::PrefetchQuery> queries;
    s = LookupQueries(req.tables(), &queries);
    if (!s.ok()) return Fail(reactor, s);
    DoneCallback finish = [reactor](absl::Status st) { reactor->Finish(ToGrpcStatus(st)); };
    auto tail = std::make_shared<Tail>(TablesOf(queries));
    handler_->HandlePrefetchBatch(
        meta, std::move(queries), req.after_update(),
        [meta, tail, response, finish](std::vector<absl::StatusOr<Tensor>> rows) {
          absl::Status filled = FillRows(std::move(rows), tail.get());
          if (!filled.ok()) return finish(filled);
          std::vector<SendItem> entries;
          for (const auto& [table, value] : *tail) entries.push_back({table, &value});
          *response = EncodeBatch(meta, entries, /*send_barrier=*/false);
          finish(absl::OkStatus());
        });
    return reactor;
  }

  grpc::ServerUnaryReactor* GetVariable(grpc::CallbackServerContext* ctx,
                                        const grpc::ByteBuffer* request,
                                        grpc::ByteBuffer* response) override {
    ObservedReactor* reactor = NewReactor(RpcMethod::kGet, request, response);
    GetRequest req;
    RequestMeta meta;
    absl::Status s = Begin(ctx, *request, &req, &meta);
    if (!s.ok()) return Fail(reactor, s);
    int64_t offset = req.offset(), length = req.length();
    std::string name = req.name();
    s = CheckRequestName("variable name", name);
    if (!s.ok()) return Fail(reactor, s);
    handler_->HandleGet(meta, name, [=](absl::StatusOr<Variable> var) {
      if (!var.ok()) {
        reactor->Finish(ToGrpcStatus(var.status()));
        return;
      }
      const Tensor* t = var->GetIf<Tensor>();
      if (t == nullptr) {
        reactor->Finish(ToGrpcStatus(
            absl::InvalidArgumentError(absl::StrCat("variable ", name, " is not dense"))));
        return;
      }
      auto range = ResolveByteRange(name, offset, length, static_cast<int64_t>(t->nbytes()));
      if (!range.ok()) {
        reactor->Finish(ToGrpcStatus(range.status()));
        return;
      }
      *response = EncodeVariable(meta, name, *var, range->offset, range->length);
      reactor->Finish(grpc::Status::OK);
    });
    return reactor;
  }

  grpc::ServerUnaryReactor* Prefetch(grpc::CallbackServerContext* ctx,
                                     const grpc::ByteBuffer* request,
                                     grpc::ByteBuffer* response) override {
    ObservedReactor* reactor = NewReactor(RpcMethod::kPrefetch, request, response);
    PrefetchRequest req;
    RequestMeta meta;
    absl::Status s = Begin(ctx, *request, &req, &meta);
    if (!s.ok()) return Fail(reactor, s);
    s = CheckRequestName("table name", req.table());
    if (s.ok()) s = CheckPrefetchIds(req.table(), req.ids().size());
    if (!s.ok()) return Fail(reactor, s);
    std::vector<int64_t> ids(req.ids().size() / sizeof(int64_t));
    if (!ids.empty()) std::memcpy(ids.data(), req.ids().data(), req.ids().size());
    std::string table = req.table();
    handler_->HandlePrefetch(meta, table, std::move(ids), [=](absl::StatusOr<Tensor> rows) {
      if (!rows.ok()) {
        reactor->Finish(ToGrpcStatus(rows.status()));
        return;
      }
      Variable v;
      *v.GetMutable<Tensor>() = *rows;
      *response = EncodeVariable(meta, table, v);
      reactor->Finish(grpc::Status::OK);
    });
    return reactor;
  }

  grpc::ServerUnaryReactor* Barrier(grpc::CallbackServerContext* ctx,
                                    const grpc::ByteBuffer* request,
                                    grpc::ByteBuffer* response) override {
    ObservedReactor* reactor = NewReactor(RpcMethod::kBarrier, request, response);
    BarrierRequest req;
    RequestMeta meta;
    absl::Status s = Begin(ctx, *request, &req, &meta);
    if (!s.ok()) return Fail(reactor, s);
    *response = SerializeProto(BarrierResponse());
    DoneCallback finish = [reactor](absl::Status st) { reactor->Finish(ToGrpcStatus(st)); };
    if (req.kind() == ABORT) {
      s = CheckAbortReason(req.reason());
      if (!s.ok()) return Fail(reactor, s);
      handler_->HandleAbort(meta, req.reason(), std::move(finish));
    } else if (req.kind() == SEND_BARRIER) {
      SendBarrier<BarrierResponse>(meta, response, std::move(finish));
    } else {
      handler_->HandleBarrier(meta, req.kind(), std::move(finish));
    }
    return reactor;
  }

  grpc::ServerUnaryReactor* Checkpoint(grpc::CallbackServerContext* ctx,
                                       const grpc::ByteBuffer* request,
                                       grpc::ByteBuffer* response) override {
    ObservedReactor* reactor = NewReactor(RpcMethod::kCheckpoint, request, response);
    CheckpointRequest req;
    RequestMeta meta;
    absl::Status s = Begin(ctx, *request, &req, &meta);
    if (!s.ok()) return Fail(reactor, s);
    s = CheckRequestName("checkpoint dir", req.dir());
    if (!s.ok()) return Fail(reactor, s);
    *response = SerializeProto(CheckpointResponse());
    handler_->HandleCheckpoint(meta, req.dir(),
                               [reactor](absl::Status st) { reactor->Finish(ToGrpcStatus(st)); });
    return reactor;
  }

  grpc::ServerUnaryReactor* Register(grpc::CallbackServerContext* ctx,
                                     const grpc::ByteBuffer* request,
                                     grpc::ByteBuffer* response) override {
    ObservedReactor* reactor = NewReactor(RpcMethod::kRegister, request, response);
    RegisterRequest req;
    RequestMeta meta;
    absl::Status s = Begin(ctx, *request, &req, &meta);
    if (!s.ok()) return Fail(reactor, s);
    JobFields fields;
    for (const RegisterRequest::Field& f : req.fields()) fields.push_back({f.name(), f.value()});
    s = CheckJobFields(fields);
    if (!s.ok()) return Fail(reactor, s);
    RegisterResponse answer;
    answer.set_protocol(kWireProtocol);
    *response = SerializeProto(answer);
    handler_->HandleRegister(meta, fields, req.nonce(),
                             [reactor](absl::Status st) { reactor->Finish(ToGrpcStatus(st)); });
    return reactor;
  }

 private:
  // The start of SendBatch and SendGetBatch: decodes the batch, checks it (`check`, nullable,
  // before anything is stored), prepares every destination (a bad entry refuses the whole batch
  // and stores nothing), stores the bytes and hands each gradient to the handler; once all are
  // handled, `then` continues (and finishes the call).
  using BatchThen = std::function<void(const RequestMeta&, const DecodedBatch&, DoneCallback)>;
  using BatchCheck = std::function<absl::Status(const DecodedBatch&)>;
  grpc::ServerUnaryReactor* ReceiveBatch(grpc::CallbackServerContext* ctx,
                                         const grpc::ByteBuffer& request,
                                         ObservedReactor* reactor, const BatchCheck& check,
                                         BatchThen then) {
    absl::Status auth = CheckToken(ctx);
    if (!auth.ok()) return Fail(reactor, auth);
    auto decoded = DecodeBatch(request, max_bytes_);
    if (!decoded.ok()) return Fail(reactor, decoded.status());
    auto batch = std::make_shared<DecodedBatch>(*std::move(decoded));
    RequestMeta meta = batch->meta;
    meta.barrier_follows = batch->send_barrier;
    absl::Status admit = Admit(meta);
    if (!admit.ok()) return Fail(reactor, admit);
    if (check) {
      absl::Status checked = check(*batch);
      if (!checked.ok()) return Fail(reactor, checked);
    }
    std::vector<Variable*> dests;
    for (const DecodedVariable& d : batch->vars) {
      auto dest = handler_->PrepareReceive(meta, d.header());
      if (!dest.ok()) return Fail(reactor, dest.status());
      dests.push_back(*dest);
    }
    for (size_t i = 0; i < dests.size(); ++i) {
      absl::Status copied = CopyReceived(batch->vars[i], dests[i]);
      if (!copied.ok()) return Fail(reactor, copied);
    }
    DoneCallback finish = [reactor](absl::Status s) { reactor->Finish(ToGrpcStatus(s)); };
    std::vector<DoneCallback> callbacks = JoinThen(
        static_cast<int>(dests.size()),
        [meta, batch, then = std::move(then), finish] { then(meta, *batch, finish); }, finish);
    for (size_t i = 0; i < dests.size(); ++i) {
      handler_->HandleSend(meta, batch->vars[i].header(), dests[i], std::move(callbacks[i]));
    }
    return reactor;
  }
  // Entries a reply carries after its parameters (a SendGetBatch's lookups: table, rows), or all
  // of a PrefetchBatch's.
  using Tail = std::vector<std::pair<std::string, Variable>>;
  // The lookups' tables in order, their rows still empty.
  static Tail TablesOf(const std::vector<RequestHandler::PrefetchQuery>& queries) {
    Tail tail;
    for (const RequestHandler::PrefetchQuery& q : queries) tail.push_back({q.table, {}});
    return tail;
  }
  // The handler's answer to the lookups of `tail` (one result per table, in order) into its
  // rows; the first failed result otherwise.
  static absl::Status FillRows(std::vector<absl::StatusOr<Tensor>> rows, Tail* tail) {
    if (rows.size() != tail->size()) {
      return absl::InternalError(
          absl::StrCat("the handler answered ", rows.size(), " lookups for ", tail->size()));
    }
    for (size_t i = 0; i < rows.size(); ++i) {
      if (!rows[i].ok()) return rows[i].status();
      *(*tail)[i].second.GetMutable<Tensor>() = *std::move(rows[i]);
    }
    return absl::OkStatus();
  }
  // Gets every named parameter (whole dense tensors) into `response` (a VariableBatch in that
  // order, then the entries of `tail` (may be null; must outlive `finish`), with epoch_end), then
  // (fetch_barrier) the fetch barrier, then `finish`.
  void ServeGets(const RequestMeta& meta, const std::vector<std::string>& names, bool fetch_barrier,
                 bool epoch_end, const Tail* tail, grpc::ByteBuffer* response,
                 DoneCallback finish) {
    struct Gathered {
      std::vector<std::string> names;
      std::vector<Variable> values;
    };
    auto got = std::make_shared<Gathered>();
    got->names = names;
    got->values.resize(names.size());
    std::vector<DoneCallback> callbacks = JoinThen(
        static_cast<int>(got->names.size()),
        [this, meta, got, fetch_barrier, epoch_end, tail, response, finish] {
          std::vector<SendItem> entries;
          for (size_t i = 0; i < got->names.size(); ++i) {
            entries.push_back({got->names[i], &got->values[i]});
          }
          if (tail != nullptr) {
            for (const auto& [name, value] : *tail) entries.push_back({name, &value});
          }
          BatchExtras extras;
          extras.epoch_end = epoch_end;
          *response = EncodeBatch(meta, entries, /*send_barrier=*/false, extras);
          if (fetch_barrier) {
            handler_->HandleBarrier(meta, FETCH_BARRIER, finish);
          } else {
            finish(absl::OkStatus());
          }
        },
        finish);
    for (size_t i = 0; i < got->names.size(); ++i) {
      handler_->HandleGet(meta, got->names[i],
                          [got, i, cb = std::move(callbacks[i])](absl::StatusOr<Variable> var) {
                            if (!var.ok()) return cb(var.status());
                            if (!var->Is<Tensor>()) {
                              return cb(absl::InvalidArgumentError(
                                  absl::StrCat("variable ", got->names[i], " is not dense")));
                            }
                            got->values[i] = *std::move(var);
                            cb(absl::OkStatus());
                          });
    }
  }
  // The send barrier of meta's trainer; once it is released, `response` holds its answer (an
  // `Answer`: SendResponse or BarrierResponse, whose epoch_end tells whether the step ends the
  // epoch, sync mode with streamed data), then `finish` runs.
  template <typename Answer>
  void SendBarrier(const RequestMeta& meta, grpc::ByteBuffer* response, DoneCallback finish) {
    handler_->HandleBarrier(meta, SEND_BARRIER, [this, meta, response, finish](absl::Status st) {
      if (st.ok()) {
        Answer answer;
        answer.set_epoch_end(handler_->StepEndsEpoch(meta.step));
        *response = SerializeProto(answer);
      }
      finish(st);
    });
  }

  // Runs `serve` now, or (`after_update`) once the handler has applied step meta.step; a
  // failure of that wait goes to `finish` instead.
  void AfterUpdate(bool after_update, const RequestMeta& meta, std::function<void()> serve,
                   DoneCallback finish) {
    if (!after_update) return serve();
    handler_->AwaitUpdate(meta,
                          [serve = std::move(serve), finish = std::move(finish)](absl::Status st) {
                            if (!st.ok()) return finish(st);
                            serve();
                          });
  }

  // Stores the bytes of a received message (a whole variable or a chunk) in `var`, which
  // PrepareReceive returned for its header.
  static absl::Status CopyReceived(const DecodedVariable& decoded, Variable* var) {
    const VariableHeader& h = decoded.header();
    if (h.type == SELECTED_ROWS) {
      SelectedRows* sr = var->GetIf<SelectedRows>();
      if (sr == nullptr || sr->value.nbytes() != static_cast<size_t>(h.chunk_bytes) ||
          sr->rows.size() != static_cast<size_t>(h.num_rows)) {
        return absl::InternalError("receive buffer does not fit " + h.name);
      }
      if (h.num_rows > 0) decoded.CopyRows(sr->rows.data());
      if (h.chunk_bytes > 0) decoded.CopyPayload(sr->value.raw_data());
      return absl::OkStatus();
    }
    Tensor* t = var->GetIf<Tensor>();
    if (t == nullptr || t->nbytes() != static_cast<size_t>(h.total_bytes)) {
      return absl::InternalError("receive buffer does not fit " + h.name);
    }
    if (h.chunk_bytes > 0) {
      decoded.CopyPayload(static_cast<char*>(t->raw_data()) + h.chunk_offset);
    }
    return absl::OkStatus();
  }

  // The start of every handler of a small request: the job token (before anything is decoded),
  // the request parsed, its header checked and admitted.
  template <typename Request>
  absl::Status Begin(grpc::CallbackServerContext* ctx, const grpc::ByteBuffer& request,
                     Request* req, RequestMeta* meta) {
    TS_RETURN_IF_ERROR(CheckToken(ctx));
    TS_RETURN_IF_ERROR(ParseProto(request, req));
    *meta = FromHeader(req->header());
    return Admit(*meta, IsHeartbeat(*req));
  }
  template <typename Request>
  static bool IsHeartbeat(const Request&) {
    return false;
  }
  static bool IsHeartbeat(const BarrierRequest& req) { return req.kind() == HEARTBEAT; }

  // The job id is echoed in the handler's refusals: checked before it sees it.
  absl::Status Admit(const RequestMeta& meta, bool heartbeat = false) {
    absl::Status checked = CheckRequestMeta(meta);
    if (!checked.ok()) return checked;
    return heartbeat ? handler_->AdmitHeartbeat(meta) : handler_->Admit(meta);
  }

  ObservedReactor* NewReactor(RpcMethod method, const grpc::ByteBuffer* request,
                              const grpc::ByteBuffer* response) {
    return new ObservedReactor(observer_, method, request, response);
  }

  static grpc::ServerUnaryReactor* Fail(ObservedReactor* reactor, const absl::Status& s) {
    reactor->Finish(ToGrpcStatus(s));
    return reactor;
  }

  // The job token check, first thing for every request (nothing is decoded before it).
  // UNAUTHENTICATED never echoes the presented or the expected token.
  absl::Status CheckToken(grpc::CallbackServerContext* ctx) {
    if (job_token_.empty()) return absl::OkStatus();
    const auto& metadata = ctx->client_metadata();
    auto it = metadata.find(kJobTokenMetadataKey);
    if (it != metadata.end() &&
        JobTokenMatches(job_token_, absl::string_view(it->second.data(), it->second.size()))) {
      return absl::OkStatus();
    }
    unauthenticated_.fetch_add(1, std::memory_order_relaxed);
    return absl::UnauthenticatedError(
        absl::StrCat("refused: the request carries ",
                     it == metadata.end() ? "no job token" : "a wrong job token",
                     " (give every daemon of the job the same --job_token or --job_token_file)"));
  }

  RequestHandler* handler_;
  int64_t max_bytes_;
  RpcObserver* observer_ = nullptr;
  const std::string job_token_;
  std::atomic<int64_t> unauthenticated_{0};
};

GrpcServer::GrpcServer(GrpcServerOptions options, RequestHandler* handler)
    : options_(std::move(options)), handler_(handler) {}

GrpcServer::~GrpcServer() {
  if (server_ != nullptr) Shutdown();
}

absl::Status GrpcServer::Start() {
  grpc::EnableDefaultHealthCheckService(true);
  service_ =
      std::make_unique<Service>(handler_, options_.max_message_bytes, options_.security.job_token);
  service_->set_observer(options_.observer);
  grpc::ServerBuilder builder;
  // gRPC binds with SO_REUSEPORT by default: a second pserver on the same port would start and
  // take half of the connections. Without it, a port in use fails Start().
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  // Trainers ping every few seconds, with or without calls, to notice a pserver that stopped
  // answering (grpc_client.h `keepalive`); gRPC's defaults would answer that with GOAWAY.
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 500);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 0);
  builder.AddListeningPort(options_.address, MakeServerCredentials(options_.security), &port_);
  builder.RegisterService(service_.get());
  int max = static_cast<int>(std::min<int64_t>(options_.max_message_bytes, INT32_MAX));
  builder.SetMaxReceiveMessageSize(max);
  builder.SetMaxSendMessageSize(max);
  server_ = builder.BuildAndStart();
  if (server_ == nullptr || port_ == 0) {
    server_.reset();
    return absl::UnavailableError(absl::StrCat(
        "cannot listen on ", options_.address,
        options_.security.tls() ? " (address in use or invalid, or the --tls_cert/--tls_key/"
                                  "--tls_ca contents are not a matching PEM certificate, key "
                                  "and CA)"
                                : " (address in use or invalid)"));
  }
  if (auto* health = server_->GetHealthCheckService()) {
    health->SetServingStatus("tessera.PServer", true);
  }
  return absl::OkStatus();
}

int64_t GrpcServer::unauthenticated_requests() const {
  return service_ == nullptr ? 0 : service_->unauthenticated();
}

void GrpcServer::Shutdown() {
  if (server_ == nullptr) return;
  server_->Shutdown(std::chrono::system_clock::now() +
                    absl::ToChronoMilliseconds(options_.shutdown_grace));
}

void GrpcServer::Wait() {
  if (server_ != nullptr) server_->Wait();
}

}  // namespace tessera
