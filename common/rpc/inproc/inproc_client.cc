#include "common/rpc/inproc/inproc_client.h"

#include <cstring>

#include "common/rpc/request_checks.h"

namespace tessera {

// The checks the gRPC server makes before its handler sees a request (request_checks.h), then
// the handler's own admission.
absl::Status InProcClient::Admit(const RequestMeta& meta, absl::string_view what,
                                 absl::string_view name) const {
  absl::Status s = CheckRequestMeta(meta);
  if (s.ok()) s = CheckRequestName(what, name);
  return s.ok() ? handler_->Admit(meta) : s;
}

void InProcClient::SendVariableAsync(const RequestMeta& meta, const std::string& name,
                                     const Variable* var, DoneCallback done) {
  absl::Status s = Admit(meta, "variable name", name);
  if (!s.ok()) return done(s);
  VariableHeader h;
  h.name = name;
  const Tensor* value;
  if (const SelectedRows* sr = var->GetIf<SelectedRows>()) {
    h.type = SELECTED_ROWS;
    h.height = sr->height;
    h.num_rows = static_cast<int64_t>(sr->rows.size());
    value = &sr->value;
  } else {
    value = &var->Get<Tensor>();
  }
  h.dtype = value->dtype();
  h.dims = value->shape();
  h.total_bytes = h.chunk_bytes = static_cast<int64_t>(value->nbytes());
  auto dest = handler_->PrepareReceive(meta, h);
  if (!dest.ok()) return done(dest.status());
  if (h.type == SELECTED_ROWS) {
    SelectedRows* out = (*dest)->GetMutable<SelectedRows>();
    out->rows = var->Get<SelectedRows>().rows;
    std::memcpy(out->value.raw_data(), value->raw_data(), value->nbytes());
  } else {
    std::memcpy((*dest)->GetMutable<Tensor>()->raw_data(), value->raw_data(), value->nbytes());
  }
  handler_->HandleSend(meta, h, *dest, std::move(done));
}

void InProcClient::GetVariableAsync(const RequestMeta& meta, const std::string& name,
                                    Variable* out, DoneCallback done) {
  absl::Status s = Admit(meta, "variable name", name);
  if (!s.ok()) return done(s);
  handler_->HandleGet(meta, name, [out, done = std::move(done)](absl::StatusOr<Variable> v) {
    if (!v.ok()) return done(v.status());
    out->GetMutable<Tensor>()->CopyFrom(v->Get<Tensor>());
    done(absl::OkStatus());
  });
}

void InProcClient::PrefetchAsync(const RequestMeta& meta, const std::string& table,
                                 const std::vector<int64_t>* ids, Tensor* out, DoneCallback done) {
  absl::Status s = Admit(meta, "table name", table);
  if (!s.ok()) return done(s);
  handler_->HandlePrefetch(meta, table, *ids,
                           [out, done = std::move(done)](absl::StatusOr<Tensor> rows) {
                             if (!rows.ok()) return done(rows.status());
                             out->CopyFrom(*rows);
                             done(absl::OkStatus());
                           });
}

void InProcClient::AwaitUpdateAsync(const RequestMeta& meta, DoneCallback done) {
  absl::Status s = CheckRequestMeta(meta);
  if (s.ok()) s = handler_->Admit(meta);
  if (!s.ok()) return done(s);
  handler_->AwaitUpdate(meta, std::move(done));
}

void InProcClient::BarrierAsync(const RequestMeta& meta, BarrierKind kind, DoneCallback done) {
  absl::Status s = CheckRequestMeta(meta);
  if (s.ok()) s = kind == HEARTBEAT ? handler_->AdmitHeartbeat(meta) : handler_->Admit(meta);
  if (!s.ok()) return done(s);
  handler_->HandleBarrier(meta, kind, std::move(done));
}

void InProcClient::SendBarrierAsync(const RequestMeta& meta, StepReply* reply,
                                    DoneCallback done) {
  BarrierAsync(meta, SEND_BARRIER, [this, step = meta.step, reply, done](absl::Status s) {
    if (s.ok() && reply != nullptr && handler_->StepEndsEpoch(step)) reply->epoch_end.store(true);
    done(s);
  });
}

void InProcClient::AbortAsync(const RequestMeta& meta, const std::string& reason,
                              DoneCallback done) {
  absl::Status s = CheckRequestMeta(meta);
  if (s.ok()) s = CheckAbortReason(reason);
  if (s.ok()) s = handler_->Admit(meta);
  if (!s.ok()) return done(s);
  handler_->HandleAbort(meta, reason, std::move(done));
}

void InProcClient::RegisterAsync(const RequestMeta& meta, const JobFields& fields,
                                 uint64_t nonce, DoneCallback done) {
  absl::Status s = CheckRequestMeta(meta);
  if (s.ok()) s = CheckJobFields(fields);
  if (s.ok()) s = handler_->Admit(meta);
  if (!s.ok()) return done(s);
  handler_->HandleRegister(meta, fields, nonce, std::move(done));
}

void InProcClient::CheckpointAsync(const RequestMeta& meta, const std::string& dir,
                                   DoneCallback done) {
  absl::Status s = Admit(meta, "checkpoint dir", dir);
  if (!s.ok()) return done(s);
  handler_->HandleCheckpoint(meta, dir, std::move(done));
}

}  // namespace tessera
