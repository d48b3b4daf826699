#include "trainer/rpc_ops.h"

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "trainer/communicator.h"

namespace tessera {

PServerClient* ClientPool::Get(const std::string& endpoint) {
  absl::MutexLock lock(&mu_);
  auto& c = clients_[endpoint];
  if (c == nullptr) c = factory_(endpoint);
  return c.get();
}

namespace {

absl::Status CheckParallel(const OpContext& ctx, const std::vector<std::string>& vars,
                           const std::vector<std::string>& eps) {
  if (vars.size() != eps.size()) {
    return ctx.Error(absl::StrCat("has ", vars.size(), " variables but ", eps.size(),
                                  " endpoints in epmap"));
  }
  return absl::OkStatus();
}

absl::Status Barrier(RpcContext* rpc, const std::vector<std::string>& endpoints, BarrierKind kind) {
  StatusGroup group(static_cast<int>(endpoints.size()));
  RequestMeta meta = rpc->Meta();
  for (const auto& ep : endpoints) rpc->clients->Get(ep)->BarrierAsync(meta, kind, group.Callback());
  return group.Wait();
}

}  // namespace

absl::Status RegisterRpcOps(OpRegistry* registry, RpcContext* rpc) {
  TS_RETURN_IF_ERROR(registry->Register(
      "send", {[rpc](OpContext& ctx) -> absl::Status {
                 auto vars = OpInputs(ctx.op(), "X");
                 auto eps = ctx.StringsAttr("epmap");
                 TS_RETURN_IF_ERROR(CheckParallel(ctx, vars, eps));
                 std::vector<const Variable*> values;
                 for (size_t i = 0; i < vars.size(); ++i) {
                   TS_ASSIGN_OR_RETURN(const Variable* v, ctx.InputVar("X", static_cast<int>(i)));
                   values.push_back(v);
                 }
                 if (!ctx.BoolAttr("sync_mode", true) && rpc->communicator != nullptr) {
                   for (size_t i = 0; i < vars.size(); ++i) {
                     TS_RETURN_IF_ERROR(rpc->communicator->Push(vars[i], eps[i], *values[i]));
                   }
                   return absl::OkStatus();
                 }
                 StatusGroup group(static_cast<int>(vars.size()));
                 RequestMeta meta = rpc->Meta();
                 for (size_t i = 0; i < vars.size(); ++i) {
                   rpc->clients->Get(eps[i])->SendVariableAsync(meta, vars[i], values[i],
                                                                group.Callback());
                 }
                 return group.Wait();
               },
               nullptr}));
  TS_RETURN_IF_ERROR(registry->Register(
      "recv", {[rpc](OpContext& ctx) -> absl::Status {
                 auto vars = OpOutputs(ctx.op(), "Out");
                 auto eps = ctx.StringsAttr("epmap");
                 TS_RETURN_IF_ERROR(CheckParallel(ctx, vars, eps));
                 std::vector<Variable*> outs;
                 for (size_t i = 0; i < vars.size(); ++i) {
                   TS_ASSIGN_OR_RETURN(Variable * v, ctx.OutputVar("Out", static_cast<int>(i)));
                   outs.push_back(v);
                 }
                 // Async with read_own_writes: pull parameters only after this trainer's queued
                 // gradients were applied (staleness comes only from the other trainers).
                 if (rpc->communicator != nullptr && rpc->read_own_writes) {
                   TS_RETURN_IF_ERROR(rpc->communicator->Flush());
                 }
                 StatusGroup group(static_cast<int>(vars.size()));
                 RequestMeta meta = rpc->Meta();
                 for (size_t i = 0; i < vars.size(); ++i) {
                   rpc->clients->Get(eps[i])->GetVariableAsync(meta, vars[i], outs[i],
                                                               group.Callback());
                 }
                 return group.Wait();
               },
               nullptr}));
  TS_RETURN_IF_ERROR(registry->Register(
      "send_barrier", {[rpc](OpContext& ctx) {
                         return Barrier(rpc, ctx.StringsAttr("endpoints"), SEND_BARRIER);
                       },
                       nullptr}));
  TS_RETURN_IF_ERROR(registry->Register(
      "fetch_barrier", {[rpc](OpContext& ctx) {
                          return Barrier(rpc, ctx.StringsAttr("endpoints"), FETCH_BARRIER);
                        },
                        nullptr}));
  return absl::OkStatus();
}

absl::Status NotifyComplete(RpcContext* rpc, const std::vector<std::string>& endpoints) {
  return Barrier(rpc, endpoints, COMPLETE);
}

}  // namespace tessera
