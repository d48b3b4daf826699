#include "common/rpc/client.h"

#include "absl/strings/str_cat.h"

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

void PServerClient::SendBatchAsync(const RequestMeta& meta, std::vector<SendItem> items,
                                   bool send_barrier, StepReply* reply, DoneCallback done) {
  auto shared = std::make_shared<std::vector<SendItem>>(std::move(items));
  auto then = [this, meta, send_barrier, reply, shared, done] {
    if (send_barrier) {
      SendBarrierAsync(meta, reply, done);
    } else {
      done(absl::OkStatus());
    }
  };
  std::vector<DoneCallback> callbacks = JoinThen(static_cast<int>(shared->size()), then, done);
  RequestMeta each = meta;  // as a SendBatch's entries are seen
  each.barrier_follows = send_barrier;
  for (size_t i = 0; i < shared->size(); ++i) {
    SendVariableAsync(each, (*shared)[i].name, (*shared)[i].var, std::move(callbacks[i]));
  }
}

void PServerClient::SendGetBatchAsync(const RequestMeta& meta, std::vector<SendItem> items,
                                      bool send_barrier, StepReply* reply,
                                      std::vector<GetItem> gets, bool fetch_barrier,
                                      std::vector<PrefetchItem> lookups, DoneCallback done) {
  const bool lookup = !lookups.empty();
  if (!send_barrier) {
    // The parameters and rows once the gradients were handled.
    auto fetch = [this, meta, gets = std::move(gets), fetch_barrier, lookups = std::move(lookups),
                  lookup, done](absl::Status sent) mutable {
      if (!sent.ok()) return done(sent);
      std::vector<DoneCallback> all = JoinThen(
          lookup ? 2 : 1, [done] { done(absl::OkStatus()); }, done);
      GetBatchAsync(meta, std::move(gets), fetch_barrier, /*after_update=*/false,
                    std::move(all[0]));
      if (lookup) PrefetchBatchAsync(meta, std::move(lookups), /*after_update=*/false, all[1]);
    };
    SendBatchAsync(meta, std::move(items), /*send_barrier=*/false, reply, std::move(fetch));
    return;
  }
  std::vector<DoneCallback> all = JoinThen(
      lookup ? 3 : 2, [done] { done(absl::OkStatus()); }, done);
  SendBatchAsync(meta, std::move(items), /*send_barrier=*/true, reply, std::move(all[0]));
  GetBatchAsync(meta, std::move(gets), fetch_barrier, /*after_update=*/true, std::move(all[1]));
  if (lookup) PrefetchBatchAsync(meta, std::move(lookups), /*after_update=*/true, all[2]);
}

void PServerClient::AwaitUpdateAsync(const RequestMeta& meta, DoneCallback done) {
  done(absl::UnimplementedError(
      absl::StrCat("the client of pserver ", endpoint(), " cannot wait for a step's update")));
}

void PServerClient::GetBatchAsync(const RequestMeta& meta, std::vector<GetItem> items,
                                  bool fetch_barrier, bool after_update, DoneCallback done) {
  if (after_update) {
    return AwaitUpdateAsync(
        meta, [this, meta, items = std::move(items), fetch_barrier, done](absl::Status s) mutable {
          if (!s.ok()) return done(s);
          GetBatchAsync(meta, std::move(items), fetch_barrier, /*after_update=*/false, done);
        });
  }
  auto shared = std::make_shared<std::vector<GetItem>>(std::move(items));
  auto then = [this, meta, fetch_barrier, shared, done] {
    if (fetch_barrier) {
      BarrierAsync(meta, FETCH_BARRIER, done);
    } else {
      done(absl::OkStatus());
    }
  };
  std::vector<DoneCallback> callbacks = JoinThen(static_cast<int>(shared->size()), then, done);
  for (size_t i = 0; i < shared->size(); ++i) {
    GetVariableAsync(meta, (*shared)[i].name, (*shared)[i].out, std::move(callbacks[i]));
  }
}

void PServerClient::PrefetchBatchAsync(const RequestMeta& meta, std::vector<PrefetchItem> items,
                                       bool after_update, DoneCallback done) {
  if (after_update) {
    return AwaitUpdateAsync(meta,
                            [this, meta, items = std::move(items), done](absl::Status s) mutable {
                              if (!s.ok()) return done(s);
                              PrefetchBatchAsync(meta, std::move(items), false, done);
                            });
  }
  auto shared = std::make_shared<std::vector<PrefetchItem>>(std::move(items));
  std::vector<DoneCallback> callbacks = JoinThen(
      static_cast<int>(shared->size()), [done] { done(absl::OkStatus()); }, done);
  for (size_t i = 0; i < shared->size(); ++i) {
    const PrefetchItem& item = (*shared)[i];
    PrefetchAsync(meta, item.table, item.ids, item.out, std::move(callbacks[i]));
  }
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

absl::Status PServerClient::Abort(const RequestMeta& meta, const std::string& reason) {
  StatusGroup g(1);
  AbortAsync(meta, reason, g.Callback());
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
