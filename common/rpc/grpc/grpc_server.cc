#include "common/rpc/grpc/grpc_server.h"

#include "absl/strings/str_cat.h"
#include "common/rpc/grpc/codec.h"
#include "common/rpc/grpc/grpc_util.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/server.h"
#include "grpcpp/server_builder.h"
#include "proto/pserver.grpc.pb.h"

namespace tessera {

using RawService = PServer::WithRawCallbackMethod_SendVariable<
    PServer::WithRawCallbackMethod_GetVariable<PServer::WithRawCallbackMethod_Prefetch<
        PServer::WithRawCallbackMethod_Barrier<PServer::WithRawCallbackMethod_Checkpoint<
            PServer::Service>>>>>;

class GrpcServer::Service : public RawService {
 public:
  Service(RequestHandler* handler, int64_t max_bytes) : handler_(handler), max_bytes_(max_bytes) {}

  grpc::ServerUnaryReactor* SendVariable(grpc::CallbackServerContext* ctx,
                                         const grpc::ByteBuffer* request,
                                         grpc::ByteBuffer* response) override {
    grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
    auto decoded = DecodeVariable(*request, max_bytes_);
    if (!decoded.ok()) return Fail(reactor, decoded.status());
    absl::Status admit = handler_->Admit(decoded->meta());
    if (!admit.ok()) return Fail(reactor, admit);
    auto dest = handler_->PrepareReceive(decoded->meta(), decoded->header());
    if (!dest.ok()) return Fail(reactor, dest.status());
    Variable* var = *dest;
    const VariableHeader& h = decoded->header();
    if (h.type == SELECTED_ROWS) {
      SelectedRows* sr = var->GetIf<SelectedRows>();
      if (sr == nullptr || sr->value.nbytes() != static_cast<size_t>(h.chunk_bytes) ||
          sr->rows.size() != static_cast<size_t>(h.num_rows)) {
        return Fail(reactor, absl::InternalError("receive buffer does not fit " + h.name));
      }
      if (h.num_rows > 0) decoded->CopyRows(sr->rows.data());
      if (h.chunk_bytes > 0) decoded->CopyPayload(sr->value.raw_data());
    } else {
      Tensor* t = var->GetIf<Tensor>();
      if (t == nullptr || t->nbytes() != static_cast<size_t>(h.total_bytes)) {
        return Fail(reactor, absl::InternalError("receive buffer does not fit " + h.name));
      }
      if (h.chunk_bytes > 0) {
        decoded->CopyPayload(static_cast<char*>(t->raw_data()) + h.chunk_offset);
      }
    }
    *response = SerializeProto(SendResponse());
    handler_->HandleSend(decoded->meta(), h, var,
                         [reactor](absl::Status s) { reactor->Finish(ToGrpcStatus(s)); });
    return reactor;
  }

  grpc::ServerUnaryReactor* GetVariable(grpc::CallbackServerContext* ctx,
                                        const grpc::ByteBuffer* request,
                                        grpc::ByteBuffer* response) override {
    grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
    GetRequest req;
    absl::Status s = ParseProto(*request, &req);
    if (!s.ok()) return Fail(reactor, s);
    RequestMeta meta = FromHeader(req.header());
    s = handler_->Admit(meta);
    if (!s.ok()) return Fail(reactor, s);
    int64_t offset = req.offset(), length = req.length();
    std::string name = req.name();
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
      int64_t total = static_cast<int64_t>(t->nbytes());
      int64_t len = length == 0 ? total - offset : length;
      if (offset < 0 || len < 0 || offset + len > total) {
        reactor->Finish(ToGrpcStatus(absl::InvalidArgumentError(absl::StrCat(
            "byte range [", offset, ", +", len, ") is outside variable ", name, " of ", total,
            " bytes"))));
        return;
      }
      *response = EncodeVariable(meta, name, *var, offset, len);
      reactor->Finish(grpc::Status::OK);
    });
    return reactor;
  }

  grpc::ServerUnaryReactor* Prefetch(grpc::CallbackServerContext* ctx,
                                     const grpc::ByteBuffer* request,
                                     grpc::ByteBuffer* response) override {
    grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
    PrefetchRequest req;
    absl::Status s = ParseProto(*request, &req);
    if (!s.ok()) return Fail(reactor, s);
    RequestMeta meta = FromHeader(req.header());
    s = handler_->Admit(meta);
    if (!s.ok()) return Fail(reactor, s);
    if (req.ids().size() % sizeof(int64_t) != 0) {
      return Fail(reactor, absl::InvalidArgumentError(absl::StrCat(
                               "prefetch of ", req.table(), ": ids field has ", req.ids().size(),
                               " bytes, not a multiple of 8")));
    }
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
    grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
    BarrierRequest req;
    absl::Status s = ParseProto(*request, &req);
    if (!s.ok()) return Fail(reactor, s);
    RequestMeta meta = FromHeader(req.header());
    s = handler_->Admit(meta);
    if (!s.ok()) return Fail(reactor, s);
    *response = SerializeProto(BarrierResponse());
    handler_->HandleBarrier(meta, req.kind(),
                            [reactor](absl::Status st) { reactor->Finish(ToGrpcStatus(st)); });
    return reactor;
  }

  grpc::ServerUnaryReactor* Checkpoint(grpc::CallbackServerContext* ctx,
                                       const grpc::ByteBuffer* request,
                                       grpc::ByteBuffer* response) override {
    grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
    CheckpointRequest req;
    absl::Status s = ParseProto(*request, &req);
    if (!s.ok()) return Fail(reactor, s);
    RequestMeta meta = FromHeader(req.header());
    s = handler_->Admit(meta);
    if (!s.ok()) return Fail(reactor, s);
    *response = SerializeProto(CheckpointResponse());
    handler_->HandleCheckpoint(meta, req.dir(),
                               [reactor](absl::Status st) { reactor->Finish(ToGrpcStatus(st)); });
    return reactor;
  }

 private:
  static grpc::ServerUnaryReactor* Fail(grpc::ServerUnaryReactor* reactor, const absl::Status& s) {
    reactor->Finish(ToGrpcStatus(s));
    return reactor;
  }

  RequestHandler* handler_;
  int64_t max_bytes_;
};

GrpcServer::GrpcServer(GrpcServerOptions options, RequestHandler* handler)
    : options_(std::move(options)), handler_(handler) {}

GrpcServer::~GrpcServer() {
  if (server_ != nullptr) Shutdown();
}

absl::Status GrpcServer::Start() {
  grpc::EnableDefaultHealthCheckService(true);
  service_ = std::make_unique<Service>(handler_, options_.max_message_bytes);
  grpc::ServerBuilder builder;
  builder.AddListeningPort(options_.address, grpc::InsecureServerCredentials(), &port_);
  builder.RegisterService(service_.get());
  int max = static_cast<int>(std::min<int64_t>(options_.max_message_bytes, INT32_MAX));
  builder.SetMaxReceiveMessageSize(max);
  builder.SetMaxSendMessageSize(max);
  server_ = builder.BuildAndStart();
  if (server_ == nullptr || port_ == 0) {
    server_.reset();
    return absl::UnavailableError(
        absl::StrCat("cannot listen on ", options_.address, " (address in use or invalid)"));
  }
  if (auto* health = server_->GetHealthCheckService()) {
    health->SetServingStatus("tessera.PServer", true);
  }
  return absl::OkStatus();
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
