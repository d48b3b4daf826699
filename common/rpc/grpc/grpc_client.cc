#include "common/rpc/grpc/grpc_client.h"

#include <algorithm>
#include <atomic>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "absl/types/span.h"
#include "common/base/status.h"
#include "common/rpc/grpc/codec.h"
#include "common/rpc/grpc/credentials.h"
#include "common/rpc/grpc/grpc_util.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/support/channel_arguments.h"

namespace tessera {

namespace {

// Runs `done` once after `n` parts finished, with the first error.
class Join {
 public:
  Join(int n, DoneCallback done) : pending_(n), done_(std::move(done)) {}
  void Finish(absl::Status s) {
    {
      absl::MutexLock lock(&mu_);
      if (!s.ok() && first_.ok()) first_ = s;
      if (--pending_ > 0) return;
    }
    done_(first_);
    delete this;
  }

 private:
  absl::Mutex mu_;
  int pending_;
  absl::Status first_;
  DoneCallback done_;
};

// Tells `observer` about a finished call of wire method `method`.
void Report(RpcObserver* observer, const std::string& method, const absl::Status& status,
            absl::Time start, const grpc::ByteBuffer& request, const grpc::ByteBuffer& response) {
  RpcCallInfo call;
  if (!RpcMethodFromWireName(method, &call.method)) return;
  call.code = status.code();
  call.latency = absl::Now() - start;
  call.bytes_sent = static_cast<int64_t>(request.Length());
  call.bytes_received = static_cast<int64_t>(response.Length());
  observer->OnCall(call);
}

// A failed call on a channel that is not connected: TLS on one side only, or a certificate the
// other side refuses, look the same as a pserver that is down, so say what to check; on a
// channel that was connected (`was_connected`), the pserver went away.
absl::Status WithConnectionHint(const absl::Status& s, grpc::Channel& channel, bool tls,
                                bool was_connected) {
  if (s.code() != absl::StatusCode::kUnavailable &&
      s.code() != absl::StatusCode::kDeadlineExceeded) {
    return s;
  }
  if (absl::StrContains(s.message(), "keepalive")) {
    return absl::Status(s.code(), absl::StrCat(s.message(),
                                               " (the pserver stopped answering: frozen, "
                                               "overloaded or unreachable; see --keepalive_s)"));
  }
  grpc_connectivity_state state = channel.GetState(/*try_to_connect=*/false);
  if (state == GRPC_CHANNEL_READY || state == GRPC_CHANNEL_IDLE) return s;
  if (was_connected) {
    return absl::Status(s.code(), absl::StrCat(s.message(), " (connection lost: the pserver "
                                                            "stopped, or its host went away)"));
  }
  return absl::Status(
      s.code(),
      absl::StrCat(s.message(),
                   tls ? " (not connected; this client uses TLS: is the pserver up with TLS, a "
                         "certificate signed by --tls_ca that names this host, and the same CA "
                         "for clients?)"
                       : " (not connected: is the pserver up, and does it expect TLS "
                         "(--tls_cert/--tls_key/--tls_ca)?)"));
}

// Reads a released send barrier's answer (SendResponse or BarrierResponse) into `reply`.
template <typename Answer>
std::function<absl::Status(const grpc::ByteBuffer&)> StepAnswer(StepReply* reply) {
  if (reply == nullptr) return nullptr;
  return [reply](const grpc::ByteBuffer& response) {
    Answer answer;
    TS_RETURN_IF_ERROR(ParseProto(response, &answer));
    if (answer.epoch_end()) reply->epoch_end.store(true);
    return absl::OkStatus();
  };
}

}  // namespace

std::shared_ptr<grpc::Channel> NewPServerChannel(const std::string& endpoint,
                                                 const GrpcClientOptions& options) {
  grpc::ChannelArguments args;
  int max = static_cast<int>(std::min<int64_t>(options.max_message_bytes, INT32_MAX));
  args.SetMaxReceiveMessageSize(max);
  args.SetMaxSendMessageSize(max);
  args.SetInt(GRPC_ARG_ENABLE_RETRIES, 1);
  args.SetServiceConfigJSON(absl::StrFormat(
      R"({"methodConfig": [{"name": [{"service": "tessera.PServer"}],
          "retryPolicy": {"maxAttempts": %d, "initialBackoff": "0.1s", "maxBackoff": "2s",
                          "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"]}}]})",
      std::max(2, std::min(options.max_attempts, 5))));
  // Large tensors: bigger HTTP/2 windows keep the pipe full on loopback and LANs.
  args.SetInt(GRPC_ARG_HTTP2_BDP_PROBE, 1);
  if (options.keepalive > absl::ZeroDuration()) {
    // Pings on an idle connection too, with no limit on pings without data (the pserver permits
    // them: grpc_server.cc); an unanswered ping closes the connection and fails its calls.
    const int ms = static_cast<int>(
        std::min<int64_t>(absl::ToInt64Milliseconds(options.keepalive), INT32_MAX));
    args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, std::max(ms, 1));
    args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, std::max(ms, 1));
    args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
    args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  }
  return grpc::CreateCustomChannel(endpoint, MakeChannelCredentials(options.security), args);
}

GrpcPServerClient::GrpcPServerClient(std::string endpoint, GrpcClientOptions options)
    : endpoint_(std::move(endpoint)),
      options_(options),
      channel_(NewPServerChannel(endpoint_, options_)),
      stub_(std::make_unique<Stub>(channel_)) {}

GrpcPServerClient::~GrpcPServerClient() = default;

namespace {
// What a failed connection attempt says, for an operator: gRPC's last transport error, led by
// the cause in words.
std::string ConnectFailure(const std::string& endpoint, absl::string_view grpc_message,
                           bool tls) {
  auto has = [&](absl::string_view s) { return absl::StrContains(grpc_message, s); };
  std::string cause;
  if (has("DNS") || has("resolve") || has("Name or service not known") ||
      has("nodename nor servname")) {
    cause = absl::StrCat("cannot resolve the host of ", endpoint, " (DNS)");
  } else if (has("andshake") || has("SSL") || has("ssl") || has("ertificate") || has("TLS")) {
    cause = "TLS handshake failed (both sides need the same --tls_ca, and certificates that name "
            "their hosts)";
  } else if (has("onnection refused")) {
    cause = "connection refused: nothing listens there (is the pserver running?)";
  } else {
    cause = tls ? "no connection (this trainer uses TLS: does the pserver?)"
                : "no connection (is the pserver up, and does it expect TLS?)";
  }
  return absl::StrCat(cause, "; gRPC: ", grpc_message);
}
}  // namespace

absl::Status GrpcPServerClient::Connect(absl::Duration timeout) {
  const auto deadline =
      std::chrono::system_clock::now() + absl::ToChronoMilliseconds(timeout);
  if (channel_->WaitForConnected(deadline)) {
    connected_.store(true, std::memory_order_relaxed);
    return absl::OkStatus();
  }
  // Why not: one health check that does not wait for the channel returns gRPC's last error.
  grpc::ClientContext ctx;
  ctx.set_wait_for_ready(false);
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  grpc::Slice empty_message(std::string{});  // an empty HealthCheckRequest: any service
  grpc::ByteBuffer request(&empty_message, 1), response;
  grpc::Status status;
  absl::Notification finished;  // bounded by the call's deadline
  stub_->UnaryCall(&ctx, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &request, &response,
                   [&](grpc::Status s) {
                     status = std::move(s);
                     finished.Notify();
                   });
  finished.WaitForNotification();
  if (status.ok()) {  // it came up just now
    connected_.store(true, std::memory_order_relaxed);
    return absl::OkStatus();
  }
  return absl::UnavailableError(
      absl::StrCat("pserver ", endpoint_, " not reachable: ",
                   ConnectFailure(endpoint_, status.error_message(), options_.security.tls())));
}

void GrpcPServerClient::Call(const char* method, grpc::ByteBuffer request,
                             std::function<absl::Status(const grpc::ByteBuffer&)> on_response,
                             DoneCallback done, bool courtesy) {
  struct CallState {
    grpc::ClientContext ctx;
    grpc::ByteBuffer request;
    grpc::ByteBuffer response;
    absl::Time start;  // for the observer
  };
  auto* state = new CallState;
  if (options_.observer != nullptr) state->start = absl::Now();
  state->request = std::move(request);
  state->ctx.set_deadline(
      std::chrono::system_clock::now() +
      absl::ToChronoMilliseconds(courtesy ? std::min(options_.deadline, options_.abort_deadline)
                                          : options_.deadline));
  state->ctx.set_wait_for_ready(!courtesy && options_.wait_for_ready &&
                                !connected_.load(std::memory_order_relaxed));
  if (!options_.security.job_token.empty()) {
    state->ctx.AddMetadata(kJobTokenMetadataKey, options_.security.job_token);
  }
  std::string full = absl::StrCat("/tessera.PServer/", method);
  std::string ep = endpoint_;
  std::string method_name = method;
  RpcObserver* observer = options_.observer;
  // Raw: the client outlives its calls' callbacks; a shared_ptr here could make a callback
  // thread drop the channel's last reference, which gRPC does not allow.
  grpc::Channel* channel = channel_.get();
  const bool tls = options_.security.tls();
  const bool was_connected = connected_.load(std::memory_order_relaxed);
  stub_->UnaryCall(
      &state->ctx, full, grpc::StubOptions(), &state->request, &state->response,
      [state, ep, method_name, observer, channel, tls, was_connected,
       on_response = std::move(on_response), done = std::move(done)](grpc::Status s) {
        absl::Status st = FromGrpcStatus(s, ep, method_name);
        if (!st.ok()) st = WithConnectionHint(st, *channel, tls, was_connected);
        if (st.ok() && on_response) {
          st = on_response(state->response);
          if (!st.ok()) {
            st = absl::Status(st.code(),
                              absl::StrCat("pserver ", ep, " ", method_name, ": ", st.message()));
          }
        }
        if (observer != nullptr) {
          Report(observer, method_name, st, state->start, state->request, state->response);
        }
        delete state;
        done(st);
      });
}

void GrpcPServerClient::SendVariableAsync(const RequestMeta& meta, const std::string& name,
                                          const Variable* var, DoneCallback done) {
  const Tensor* dense = var->GetIf<Tensor>();
  int64_t total = dense == nullptr ? 0 : static_cast<int64_t>(dense->nbytes());
  int64_t chunk = options_.chunk_bytes;
  if (dense == nullptr || chunk <= 0 || total <= chunk) {
    Call("SendVariable", EncodeVariable(meta, name, *var), nullptr, std::move(done));
    return;
  }
  // Chunks are whole elements.
  int64_t elem = static_cast<int64_t>(SizeOf(dense->dtype()));
  chunk = std::max(elem, chunk / elem * elem);
  int n = static_cast<int>((total + chunk - 1) / chunk);
  auto* join = new Join(n, std::move(done));
  for (int i = 0; i < n; ++i) {
    int64_t off = i * chunk;
    Call("SendVariable", EncodeVariable(meta, name, *var, off, std::min(chunk, total - off)),
         nullptr, [join](absl::Status s) { join->Finish(s); });
  }
}

void GrpcPServerClient::GetVariableAsync(const RequestMeta& meta, const std::string& name,
                                         Variable* out, DoneCallback done) {
  GetRequest req;
  *req.mutable_header() = ToHeader(meta);
  req.set_name(name);
  const int64_t max_bytes = options_.max_message_bytes;
  Tensor* known = out->GetIf<Tensor>();
  int64_t total =
      (known != nullptr && known->initialized()) ? static_cast<int64_t>(known->nbytes()) : 0;
  int64_t chunk = options_.chunk_bytes;
  if (total == 0 || chunk <= 0 || total <= chunk) {
    Call(
        "GetVariable", SerializeProto(req),
        [out, max_bytes](const grpc::ByteBuffer& resp) -> absl::Status {
          auto decoded = DecodeVariable(resp, max_bytes);
          if (!decoded.ok()) return decoded.status();
          return DecodeVariableInto(*decoded, out);
        },
        std::move(done));
    return;
  }
  // The destination already has the variable's size: fetch concurrent chunks straight into it.
  int64_t elem = static_cast<int64_t>(SizeOf(known->dtype()));
  chunk = std::max(elem, chunk / elem * elem);
  int n = static_cast<int>((total + chunk - 1) / chunk);
  auto* join = new Join(n, std::move(done));
  for (int i = 0; i < n; ++i) {
    int64_t off = i * chunk;
    req.set_offset(off);
    req.set_length(std::min(chunk, total - off));
    Call(
        "GetVariable", SerializeProto(req),
        [known, max_bytes, off](const grpc::ByteBuffer& resp) -> absl::Status {
          auto decoded = DecodeVariable(resp, max_bytes);
          if (!decoded.ok()) return decoded.status();
          const VariableHeader& h = decoded->header();
          if (h.type != DENSE_TENSOR || h.dtype != known->dtype() || h.dims != known->shape() ||
              h.chunk_offset != off) {
            return absl::FailedPreconditionError(absl::StrCat(
                "variable ", h.name, " is ", DataTypeName(h.dtype), ShapeString(h.dims),
                " on the pserver but ", known->DebugString(), " here"));
          }
          decoded->CopyPayload(static_cast<char*>(known->raw_data()) + off);
          return absl::OkStatus();
        },
        [join](absl::Status s) { join->Finish(s); });
  }
}

void GrpcPServerClient::PrefetchAsync(const RequestMeta& meta, const std::string& table,
                                      const std::vector<int64_t>* ids, Tensor* out,
                                      DoneCallback done) {
  PrefetchRequest req;
  *req.mutable_header() = ToHeader(meta);
  req.set_table(table);
  req.set_ids(reinterpret_cast<const char*>(ids->data()), ids->size() * sizeof(int64_t));
  const int64_t max_bytes = options_.max_message_bytes;
  size_t n = ids->size();
  Call(
      "Prefetch", SerializeProto(req),
      [out, max_bytes, n](const grpc::ByteBuffer& resp) -> absl::Status {
        auto decoded = DecodeVariable(resp, max_bytes);
        if (!decoded.ok()) return decoded.status();
        const VariableHeader& h = decoded->header();
        if (h.type != DENSE_TENSOR || h.dims.empty() || h.dims[0] != static_cast<int64_t>(n)) {
          return absl::InternalError(
              absl::StrCat("prefetch returned ", ShapeString(h.dims), " for ", n, " ids"));
        }
        Variable v;
        *v.GetMutable<Tensor>() = *out;
        absl::Status s = DecodeVariableInto(*decoded, &v);
        *out = v.Get<Tensor>();
        return s;
      },
      std::move(done));
}

void GrpcPServerClient::BarrierAsync(const RequestMeta& meta, BarrierKind kind, DoneCallback done) {
  BarrierRequest req;
  *req.mutable_header() = ToHeader(meta);
  req.set_kind(kind);
  Call("Barrier", SerializeProto(req), nullptr, std::move(done),
       /*courtesy=*/kind == HEARTBEAT || kind == ABORT);
}

void GrpcPServerClient::SendBarrierAsync(const RequestMeta& meta, StepReply* reply,
                                         DoneCallback done) {
  BarrierRequest req;
  *req.mutable_header() = ToHeader(meta);
  req.set_kind(SEND_BARRIER);
  Call("Barrier", SerializeProto(req), StepAnswer<BarrierResponse>(reply), std::move(done));
}

void GrpcPServerClient::AbortAsync(const RequestMeta& meta, const std::string& reason,
                                   DoneCallback done) {
  BarrierRequest req;
  *req.mutable_header() = ToHeader(meta);
  req.set_kind(ABORT);
  req.set_reason(reason);
  Call("Barrier", SerializeProto(req), nullptr, std::move(done), /*courtesy=*/true);
}

void GrpcPServerClient::RegisterAsync(const RequestMeta& meta, const JobFields& fields,
                                      uint64_t nonce, DoneCallback done) {
  RegisterRequest req;
  *req.mutable_header() = ToHeader(meta);
  for (const auto& [name, value] : fields) {
    RegisterRequest::Field* f = req.add_fields();
    f->set_name(name);
    f->set_value(value);
  }
  req.set_nonce(nonce);
  // Call prefixes an error with "pserver <endpoint> Register: ".
  auto check = [](const grpc::ByteBuffer& response) -> absl::Status {
    RegisterResponse answer;
    TS_RETURN_IF_ERROR(ParseProto(response, &answer));
    if (answer.protocol() < kWireProtocol) {
      return absl::FailedPreconditionError(absl::StrCat(
          "it speaks wire protocol ", answer.protocol(), ", older than this trainer's ",
          kWireProtocol, ": run pservers of the same Tessera release as the trainers (or newer)"));
    }
    return absl::OkStatus();
  };
  Call("Register", SerializeProto(req), std::move(check), std::move(done));
}

void GrpcPServerClient::CheckpointAsync(const RequestMeta& meta, const std::string& dir,
                                        DoneCallback done) {
  CheckpointRequest req;
  *req.mutable_header() = ToHeader(meta);
  req.set_dir(dir);
  Call("Checkpoint", SerializeProto(req), nullptr, std::move(done));
}

namespace {

// Cuts `n` items of `bytes(i)` payload bytes into consecutive groups of at most `cap` bytes
// (an item larger than `cap` alone); returns the first index of each group.
template <typename Bytes>
std::vector<size_t> CutBatches(size_t n, int64_t cap, Bytes bytes) {
  std::vector<size_t> starts;
  int64_t used = 0;
  for (size_t i = 0; i < n; ++i) {
    int64_t b = bytes(i);
    if (starts.empty() || (cap > 0 && used + b > cap && used > 0)) {
      starts.push_back(i);
      used = 0;
    }
    used += b;
  }
  return starts;
}

// Starts the parts of a batched call: `singles` calls single(i, cb) (chunked tensors) and
// `batches` calls batch(b, barrier, cb). With a barrier (batches >= 1), the last batch carries
// it and starts only once every other part is done, so that the barrier follows them all;
// without one, everything is in flight at once. `done` gets the first error, or OK at the end.
void RunParts(size_t singles, size_t batches, bool barrier,
              const std::function<void(size_t, DoneCallback)>& single,
              std::function<void(size_t, bool, DoneCallback)> batch, DoneCallback done) {
  const size_t before = barrier ? batches - 1 : batches;
  auto last = [batch, before, barrier, done] {
    if (barrier) {
      batch(before, true, done);
    } else {
      done(absl::OkStatus());
    }
  };
  std::vector<DoneCallback> callbacks =
      JoinThen(static_cast<int>(singles + before), std::move(last), done);
  size_t c = 0;
  for (size_t i = 0; i < singles; ++i) single(i, std::move(callbacks[c++]));
  for (size_t b = 0; b < before; ++b) batch(b, false, std::move(callbacks[c++]));
}

// Stores the dense variables of a `method` reply (GetBatch, SendGetBatch), `vars`, into items
// [begin, end), which asked for them in that order.
absl::Status StoreFetched(const char* method, absl::Span<const DecodedVariable> vars,
                          const std::vector<GetItem>& items, size_t begin, size_t end) {
  if (vars.size() != end - begin) {
    return absl::InternalError(
        absl::StrCat(method, " returned ", vars.size(), " variables for ", end - begin, " names"));
  }
  for (size_t i = begin; i < end; ++i) {
    const DecodedVariable& d = vars[i - begin];
    if (d.header().name != items[i].name || d.header().type != DENSE_TENSOR) {
      return absl::InternalError(absl::StrCat(method, " returned '", d.header().name,
                                              "' where dense '", items[i].name,
                                              "' was asked for"));
    }
    TS_RETURN_IF_ERROR(DecodeVariableInto(d, items[i].out));
  }
  return absl::OkStatus();
}

// Stores the rows of a `method` reply (PrefetchBatch, SendGetBatch), `vars`, one tensor per
// table of `items` in order, into the items' outputs.
absl::Status StoreRows(const char* method, absl::Span<const DecodedVariable> vars,
                       const std::vector<PrefetchItem>& items) {
  if (vars.size() != items.size()) {
    return absl::InternalError(
        absl::StrCat(method, " returned ", vars.size(), " tables for ", items.size()));
  }
  for (size_t i = 0; i < items.size(); ++i) {
    const VariableHeader& h = vars[i].header();
    const size_t n = items[i].ids->size();
    if (h.name != items[i].table || h.type != DENSE_TENSOR || h.dims.empty() ||
        h.dims[0] != static_cast<int64_t>(n)) {
      return absl::InternalError(absl::StrCat(method, " returned ", h.name, ShapeString(h.dims),
                                              " for ", n, " ids of ", items[i].table));
    }
    Variable v;
    *v.GetMutable<Tensor>() = *items[i].out;
    TS_RETURN_IF_ERROR(DecodeVariableInto(vars[i], &v));
    *items[i].out = v.Get<Tensor>();
  }
  return absl::OkStatus();
}

int64_t PayloadBytes(const Variable& var) {
  if (const SelectedRows* sr = var.GetIf<SelectedRows>()) {
    return static_cast<int64_t>(sr->value.nbytes() + sr->rows.size() * sizeof(int64_t));
  }
  const Tensor* t = var.GetIf<Tensor>();
  return t == nullptr ? 0 : static_cast<int64_t>(t->nbytes());
}

}  // namespace

void GrpcPServerClient::SendBatchAsync(const RequestMeta& meta, std::vector<SendItem> items,
                                       bool send_barrier, StepReply* reply,
                                       DoneCallback done) {
  const int64_t chunk = options_.chunk_bytes;
  // Large dense tensors go as chunk calls; the rest in batches of at most `chunk` bytes.
  std::vector<SendItem> large, small;
  for (SendItem& item : items) {
    const Tensor* t = item.var->GetIf<Tensor>();
    bool chunked = t != nullptr && chunk > 0 && static_cast<int64_t>(t->nbytes()) > chunk;
    (chunked ? large : small).push_back(std::move(item));
  }
  std::vector<size_t> starts =
      CutBatches(small.size(), chunk, [&](size_t i) { return PayloadBytes(*small[i].var); });
  if (starts.empty() && send_barrier) starts.push_back(0);  // an empty batch carries the barrier
  auto batch = [this, meta, small = std::make_shared<std::vector<SendItem>>(std::move(small)),
                starts, reply](size_t b, bool barrier, DoneCallback cb) {
    size_t end = b + 1 < starts.size() ? starts[b + 1] : small->size();
    std::vector<SendItem> entries(small->begin() + starts[b], small->begin() + end);
    Call("SendBatch", EncodeBatch(meta, entries, barrier),
         barrier ? StepAnswer<SendResponse>(reply) : nullptr,
         [small, cb = std::move(cb)](absl::Status s) { cb(std::move(s)); });
  };
  RunParts(
      large.size(), starts.size(), send_barrier,
      [&](size_t i, DoneCallback cb) {
        SendVariableAsync(meta, large[i].name, large[i].var, std::move(cb));
      },
      batch, std::move(done));
}

void GrpcPServerClient::GetBatchAsync(const RequestMeta& meta, std::vector<GetItem> items,
                                      bool fetch_barrier, bool after_update, DoneCallback done) {
  const int64_t chunk = options_.chunk_bytes;
  // Destinations that already hold a large tensor are fetched in concurrent chunks; the rest in
  // batches of at most `chunk` bytes (as far as their current sizes tell).
  std::vector<GetItem> large, small;
  for (GetItem& item : items) {
    const Tensor* t = item.out->GetIf<Tensor>();
    int64_t known = t != nullptr && t->initialized() ? static_cast<int64_t>(t->nbytes()) : 0;
    (chunk > 0 && known > chunk ? large : small).push_back(std::move(item));
  }
  std::vector<size_t> starts =
      CutBatches(small.size(), chunk, [&](size_t i) { return PayloadBytes(*small[i].out); });
  if (starts.empty() && (fetch_barrier || after_update)) starts.push_back(0);
  if (after_update && (!large.empty() || starts.size() > 1)) {
    // Only one request can carry the wait: an empty one waits, the parts follow its answer.
    items = std::move(small);
    items.insert(items.end(), large.begin(), large.end());
    GetBatchRequest wait;
    *wait.mutable_header() = ToHeader(meta);
    wait.set_after_update(true);
    Call("GetBatch", SerializeProto(wait), nullptr,
         [this, meta, items = std::move(items), fetch_barrier, done](absl::Status s) mutable {
           if (!s.ok()) return done(s);
           GetBatchAsync(meta, std::move(items), fetch_barrier, /*after_update=*/false, done);
         });
    return;
  }
  const int64_t max_bytes = options_.max_message_bytes;
  auto batch = [this, meta, small = std::make_shared<std::vector<GetItem>>(std::move(small)),
                starts, max_bytes, after_update](size_t b, bool barrier, DoneCallback cb) {
    size_t begin = starts[b], end = b + 1 < starts.size() ? starts[b + 1] : small->size();
    GetBatchRequest req;
    *req.mutable_header() = ToHeader(meta);
    for (size_t i = begin; i < end; ++i) req.add_names((*small)[i].name);
    req.set_fetch_barrier(barrier);
    req.set_after_update(after_update);
    Call(
        "GetBatch", SerializeProto(req),
        [small, begin, end, max_bytes](const grpc::ByteBuffer& resp) -> absl::Status {
          TS_ASSIGN_OR_RETURN(DecodedBatch got, DecodeBatch(resp, max_bytes));
          return StoreFetched("GetBatch", got.vars, *small, begin, end);
        },
        std::move(cb));
  };
  // With after_update this is the one batch (and no chunk calls): it carries the wait.
  RunParts(
      large.size(), starts.size(), fetch_barrier,
      [&](size_t i, DoneCallback cb) {
        GetVariableAsync(meta, large[i].name, large[i].out, std::move(cb));
      },
      batch, std::move(done));
}

void GrpcPServerClient::PrefetchBatchAsync(const RequestMeta& meta, std::vector<PrefetchItem> items,
                                           bool after_update, DoneCallback done) {
  if (items.empty()) {
    done(absl::OkStatus());
    return;
  }
  const int64_t max_bytes = options_.max_message_bytes;
  grpc::ByteBuffer request = EncodePrefetchBatch(meta, items, after_update);  // before the move
  Call(
      "PrefetchBatch", std::move(request),
      [items = std::move(items), max_bytes](const grpc::ByteBuffer& resp) -> absl::Status {
        TS_ASSIGN_OR_RETURN(DecodedBatch got, DecodeBatch(resp, max_bytes));
        return StoreRows("PrefetchBatch", got.vars, items);
      },
      std::move(done));
}

void GrpcPServerClient::SendGetBatchAsync(const RequestMeta& meta, std::vector<SendItem> items,
                                          bool send_barrier, StepReply* reply,
                                          std::vector<GetItem> gets, bool fetch_barrier,
                                          std::vector<PrefetchItem> lookups, DoneCallback done) {
  // One request when the gradients fit one batch; gradients that need several go the unfolded
  // way.
  const int64_t chunk = options_.chunk_bytes;
  int64_t sent = 0;
  for (const SendItem& item : items) sent += PayloadBytes(*item.var);
  if (chunk > 0 && sent > chunk) {
    PServerClient::SendGetBatchAsync(meta, std::move(items), send_barrier, reply, std::move(gets),
                                     fetch_barrier, std::move(lookups), std::move(done));
    return;
  }
  SendGetBatch(meta, std::move(items), send_barrier, reply, std::move(gets), fetch_barrier,
               std::move(lookups), std::move(done));
}

void GrpcPServerClient::SendGetBatch(const RequestMeta& meta, std::vector<SendItem> items,
                                     bool send_barrier, StepReply* reply, std::vector<GetItem> gets,
                                     bool fetch_barrier, std::vector<PrefetchItem> lookups,
                                     DoneCallback done) {
  const int64_t chunk = options_.chunk_bytes;
  int64_t fetched = 0;  // as far as the destinations' sizes tell
  for (const GetItem& item : gets) {
    const Tensor* t = item.out->GetIf<Tensor>();
    fetched += t != nullptr && t->initialized() ? static_cast<int64_t>(t->nbytes()) : 0;
  }
  // Parameters over a reply's worth: the request only waits for the update (and answers the
  // lookups), then GetBatchAsync fetches them in its usual parts, the last with the fetch
  // barrier. (The lookups' rows are not counted: they share the reply as a PrefetchBatch's
  // rows fill theirs, under max_message_bytes.)
  const bool fetch_here = chunk <= 0 || fetched <= chunk;
  auto fetch = std::make_shared<std::vector<GetItem>>(std::move(gets));
  BatchExtras extras;
  if (fetch_here) {
    for (const GetItem& item : *fetch) extras.get_names.push_back(item.name);
    extras.fetch_barrier = fetch_barrier;
  }
  extras.lookups = std::move(lookups);
  grpc::ByteBuffer request = EncodeBatch(meta, items, send_barrier, extras);
  const int64_t max_bytes = options_.max_message_bytes;
  DoneCallback then = std::move(done);
  if (!fetch_here) {
    then = [this, meta, fetch, fetch_barrier, done = std::move(then)](absl::Status s) {
      if (!s.ok()) return done(s);
      GetBatchAsync(meta, std::move(*fetch), fetch_barrier, /*after_update=*/false, done);
    };
  }
  Call(
      "SendGetBatch", std::move(request),
      [items = std::move(items), fetch, fetch_here, lookups = std::move(extras.lookups), reply,
       max_bytes](const grpc::ByteBuffer& resp) -> absl::Status {
        TS_ASSIGN_OR_RETURN(DecodedBatch got, DecodeBatch(resp, max_bytes));
        const size_t gets = fetch_here ? fetch->size() : 0;
        if (got.vars.size() < gets) {
          return absl::InternalError(absl::StrCat("SendGetBatch returned ", got.vars.size(),
                                                  " variables for ", gets, " names"));
        }
        const absl::Span<const DecodedVariable> vars(got.vars);
        TS_RETURN_IF_ERROR(StoreFetched("SendGetBatch", vars.subspan(0, gets), *fetch, 0, gets));
        TS_RETURN_IF_ERROR(StoreRows("SendGetBatch", vars.subspan(gets), lookups));
        if (got.extras.epoch_end && reply != nullptr) reply->epoch_end.store(true);
        return absl::OkStatus();
      },
      std::move(then));
}

}  // namespace tessera
