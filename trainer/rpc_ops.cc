#include "trainer/rpc_ops.h"

#include "absl/strings/str_cat.h"
#include <cstring>

#include "absl/container/flat_hash_map.h"
#include "common/ops/sharding.h"
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

// prefetch: Ids[i] (int64, any values) -> Out[i] [N_i, dims[i]], the rows of distributed table
// tables[i] (single-table form: attrs table, dim). Per table, duplicate ids are fetched once and
// split by shard (attr shard_method; shard k is served by epmap[k]); the requests of all tables
// to all pservers are in flight together; rows are gathered back in input order.
absl::Status Prefetch(RpcContext* rpc, OpContext& ctx) {
  auto eps = ctx.StringsAttr("epmap");
  std::vector<std::string> tables = ctx.StringsAttr("tables");
  std::vector<int64_t> dims = ctx.IntsAttr("dims");
  if (tables.empty()) {
    tables = {ctx.StringAttr("table")};
    dims = {ctx.IntAttr("dim", 0)};
  }
  const int num_tables = static_cast<int>(tables.size());
  if (static_cast<int>(OpInputs(ctx.op(), "Ids").size()) != num_tables ||
      static_cast<int>(OpOutputs(ctx.op(), "Out").size()) != num_tables ||
      static_cast<int>(dims.size()) != num_tables) {
    return ctx.Error(absl::StrCat("needs one Ids, Out and dim per table (", num_tables,
                                  " tables)"));
  }
  ShardMethod method;
  if (!ParseShardMethod(ctx.StringAttr("shard_method", "hash"), &method)) {
    return ctx.Error("shard_method is not hash or mod");
  }
  if (eps.empty()) return ctx.Error("needs epmap");
  const int n = static_cast<int>(eps.size());
  struct PerTable {
    const Tensor* ids;
    absl::flat_hash_map<int64_t, std::pair<int, int64_t>> where;  // id -> (shard, index)
    std::vector<std::vector<int64_t>> shard_ids;
    std::vector<Tensor> rows;
  };
  std::vector<PerTable> per(num_tables);
  int calls = 0;
  for (int t = 0; t < num_tables; ++t) {
    PerTable& p = per[t];
    if (dims[t] < 1) return ctx.Error(absl::StrCat("table ", tables[t], " has dim ", dims[t]));
    TS_ASSIGN_OR_RETURN(p.ids, ctx.Input("Ids", t));
    TS_RETURN_IF_ERROR(ctx.CheckDType("Ids", *p.ids, INT64));
    p.shard_ids.resize(n);
    p.rows.resize(n);
    const int64_t* id = p.ids->data<int64_t>();
    p.where.reserve(static_cast<size_t>(p.ids->numel()));
    for (int64_t i = 0; i < p.ids->numel(); ++i) {
      auto [it, inserted] = p.where.try_emplace(id[i]);
      if (inserted) {
        int k = ShardOf(id[i], n, method);
        it->second = {k, static_cast<int64_t>(p.shard_ids[k].size())};
        p.shard_ids[k].push_back(id[i]);
      }
    }
    for (int k = 0; k < n; ++k) calls += p.shard_ids[k].empty() ? 0 : 1;
  }
  StatusGroup group(calls);
  RequestMeta meta = rpc->Meta();
  for (int t = 0; t < num_tables; ++t) {
    for (int k = 0; k < n; ++k) {
      if (per[t].shard_ids[k].empty()) continue;
      rpc->clients->Get(eps[k])->PrefetchAsync(meta, tables[t], &per[t].shard_ids[k],
                                               &per[t].rows[k], group.Callback());
    }
  }
  TS_RETURN_IF_ERROR(group.Wait());
  for (int t = 0; t < num_tables; ++t) {
    PerTable& p = per[t];
    const int64_t dim = dims[t];
    for (int k = 0; k < n; ++k) {
      if (p.shard_ids[k].empty()) continue;
      const Tensor& r = p.rows[k];
      if (r.dtype() != FLOAT32 || r.rank() != 2 || r.dim(1) != dim ||
          r.dim(0) != static_cast<int64_t>(p.shard_ids[k].size())) {
        return ctx.Error(absl::StrCat("pserver ", eps[k], " returned ", r.DebugString(), " for ",
                                      p.shard_ids[k].size(), " ids of table ", tables[t],
                                      " (dim ", dim, ")"));
      }
    }
    TS_ASSIGN_OR_RETURN(Tensor * out, ctx.Output("Out", t));
    const int64_t count = p.ids->numel();
    out->Resize(FLOAT32, {count, dim});
    out->set_lod(p.ids->lod());  // a multi-hot slot's sequences, as lookup_table keeps them
    float* o = out->data<float>();
    const int64_t* id = p.ids->data<int64_t>();
    for (int64_t i = 0; i < count; ++i) {
      const auto& [k, index] = p.where[id[i]];
      std::memcpy(o + i * dim, p.rows[k].data<float>() + index * dim, sizeof(float) * dim);
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status RegisterRpcOps(OpRegistry* registry, RpcContext* rpc) {
  TS_RETURN_IF_ERROR(registry->Register(
      "prefetch", {[rpc](OpContext& ctx) { return Prefetch(rpc, ctx); }, nullptr}));
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
