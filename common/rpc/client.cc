#include "common/rpc/client.h"

namespace tessera {

StatusGroup::StatusGroup(int n) : state_(std::make_shared<State>()) {
  absl::MutexLock lock(&state_->mu);
  state_->pending = n;
}

DoneCallback StatusGroup::Callback() {
  return [state = state_](absl::Status s) {
    absl::MutexLock lock(&state->mu);
    if (!s.ok() && state->first_error.ok()) state->first_error = s;
    --state->pending;
  };
}

absl::Status StatusGroup::Wait() {
  absl::MutexLock lock(&state_->mu);
  state_->mu.Await(absl::Condition(
      +[](State* st) ABSL_NO_THREAD_SAFETY_ANALYSIS { return st->pending <= 0; }, state_.get()));
  return state_->first_error;
}

absl::Status PServerClient::SendVariable(const RequestMeta& meta, const std::string& name,
                                         const Variable& var) {
  StatusGroup g(1);
  SendVariableAsync(meta, name, &var, g.Callback());
  return g.Wait();
}

absl::Status PServerClient::GetVariable(const RequestMeta& meta, const std::string& name,
                                        Variable* out) {
  StatusGroup g(1);
  GetVariableAsync(meta, name, out, g.Callback());
  return g.Wait();
}

absl::Status PServerClient::Prefetch(const RequestMeta& meta, const std::string& table,
                                     const std::vector<int64_t>& ids, Tensor* out) {
  StatusGroup g(1);
  PrefetchAsync(meta, table, &ids, out, g.Callback());
  return g.Wait();
}

absl::Status PServerClient::Barrier(const RequestMeta& meta, BarrierKind kind) {
  StatusGroup g(1);
  BarrierAsync(meta, kind, g.Callback());
  return g.Wait();
}

absl::Status PServerClient::Register(const RequestMeta& meta, const JobFields& fields,
                                     uint64_t nonce) {
  StatusGroup g(1);
  RegisterAsync(meta, fields, nonce, g.Callback());
  return g.Wait();
}

absl::Status PServerClient::Checkpoint(const RequestMeta& meta, const std::string& dir) {
  StatusGroup g(1);
  CheckpointAsync(meta, dir, g.Callback());
  return g.Wait();
}

}  // namespace tessera
