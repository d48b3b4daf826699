#include "trainer/rpc_ops.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "common/base/status.h"
#include "common/ops/merge_plan.h"
#include "common/ops/sharding.h"
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
  for (const auto& ep : endpoints) {
    if (kind == SEND_BARRIER) {
      rpc->clients->Get(ep)->SendBarrierAsync(meta, &rpc->step_reply, group.Callback());
    } else {
      rpc->clients->Get(ep)->BarrierAsync(meta, kind, group.Callback());
    }
  }
  return group.Wait();
}

// The endpoints in first-use order, for per-pserver batches.
std::vector<std::string> Distinct(const std::vector<std::string>& endpoints) {
  std::vector<std::string> out;
  for (const std::string& ep : endpoints) {
    if (std::find(out.begin(), out.end(), ep) == out.end()) out.push_back(ep);
  }
  return out;
}

// The distinct ids of some Ids tensors, split by shard, and where each position's id went: the
// merge plan of all their ids in order (BuildMergePlan: an open-addressing table on the id, as
// split_by_shard's merge, no per-id allocation), then each distinct id's shard.
struct IdShards {
  std::vector<const Tensor*> inputs;
  std::vector<std::vector<int64_t>> shard_ids;  // per shard: distinct ids, first appearance first
  // Per input, per position: the shard and the index in shard_ids[shard] of its id.
  std::vector<std::vector<std::pair<int, int64_t>>> where;
  // The dedup of the inputs' ids; with one input, the merge plan of its table's gradient.
  std::shared_ptr<MergePlan> plan;

  void Build(int num_shards, ShardMethod method) {
    thread_local std::vector<int64_t> all;  // several inputs: their ids one after the other
    absl::Span<const int64_t> rows;
    if (inputs.size() == 1) {
      rows =
          absl::MakeConstSpan(inputs[0]->data<int64_t>(), static_cast<size_t>(inputs[0]->numel()));
    } else {
      all.clear();
      for (const Tensor* t : inputs)
        all.insert(all.end(), t->data<int64_t>(), t->data<int64_t>() + t->numel());
      rows = all;
    }
    plan = std::make_shared<MergePlan>();
    BuildMergePlan(rows, plan.get());
    shard_ids.assign(num_shards, {});
    thread_local std::vector<std::pair<int, int64_t>> at;  // per distinct id
    at.resize(plan->ids.size());
    for (size_t u = 0; u < plan->ids.size(); ++u) {
      const int k = ShardOf(plan->ids[u], num_shards, method);
      at[u] = {k, static_cast<int64_t>(shard_ids[k].size())};
      shard_ids[k].push_back(plan->ids[u]);
    }
    where.assign(inputs.size(), {});
    size_t i = 0;
    for (size_t e = 0; e < inputs.size(); ++e) {
      std::vector<std::pair<int, int64_t>>& w = where[e];
      w.resize(static_cast<size_t>(inputs[e]->numel()));
      for (std::pair<int, int64_t>& position : w) position = at[plan->slot_of[i++]];
    }
  }
};

// A distributed table of a prefetch op: its entries' Ids, shards and rows.
struct PrefetchTable {
  std::string name;
  int64_t dim = 0;
  int owner = -1;                // >= 0: epmap[owner] holds the whole table (one shard)
  std::vector<std::string> ids;  // the Ids variables of its entries, in order
  int group = -1;                // its IdShards
  std::vector<Tensor> rows;      // per shard

  int Shards(int n) const { return owner < 0 ? n : 1; }
  int PserverOf(int k) const { return owner < 0 ? k : owner; }
};

// What a prefetch op needs from its requests' start to the rows' arrival in its outputs (on the
// heap: with attr complete_later the replies' thread stores them after the op returned).
struct PrefetchState {
  std::vector<std::string> eps;
  std::vector<PrefetchTable> per;  // distinct tables
  std::vector<int> table_of, input_of;
  std::vector<const Tensor*> ids_of;
  std::vector<Tensor*> outs;
  std::vector<IdShards> groups;

  // Checks the rows of every shard and gathers them into the outputs in input order.
  absl::Status Store() const {
    const int n = static_cast<int>(eps.size());
    for (const PrefetchTable& p : per) {
      const IdShards& g = groups[p.group];
      for (int k = 0; k < p.Shards(n); ++k) {
        if (g.shard_ids[k].empty()) continue;
        const Tensor& r = p.rows[k];
        if (r.dtype() != FLOAT32 || r.rank() != 2 || r.dim(1) != p.dim ||
            r.dim(0) != static_cast<int64_t>(g.shard_ids[k].size())) {
          return absl::InvalidArgumentError(
              absl::StrCat("pserver ", eps[p.PserverOf(k)], " returned ", r.DebugString(), " for ",
                           g.shard_ids[k].size(), " ids of table ", p.name, " (dim ", p.dim, ")"));
        }
      }
    }
    for (size_t e = 0; e < outs.size(); ++e) {
      const PrefetchTable& p = per[table_of[e]];
      const std::vector<std::pair<int, int64_t>>& where = groups[p.group].where[input_of[e]];
      const int64_t dim = p.dim;
      Tensor* out = outs[e];
      const int64_t count = ids_of[e]->numel();
      out->Resize(FLOAT32, {count, dim});
      out->set_lod(ids_of[e]->lod());  // a multi-hot slot's sequences, as lookup_table keeps them
      float* o = out->data<float>();
      for (int64_t i = 0; i < count; ++i) {
        const auto& [k, index] = where[static_cast<size_t>(i)];
        std::memcpy(o + i * dim, p.rows[k].data<float>() + index * dim, sizeof(float) * dim);
      }
    }
    return absl::OkStatus();
  }
};

// prefetch: Ids[i] (int64, any values) -> Out[i] [N_i, dims[i]], the rows of distributed table
// tables[i] (single-table form: attrs table, dim). Per table (entries naming the same table
// share its lookups), duplicate ids are fetched once and split by shard (attr shard_method;
// shard k is served by epmap[k]), or, where attr owners[i] >= 0 (table-wise placement), all
// sent to epmap[owners[i]], which holds the whole table; tables fed by the same Ids (a slot's
// deep and wide tables) share that work. Each pserver gets one request for all tables, all
// pservers in flight together; rows are gathered back in input order. With attr
// complete_later (pipelined look-ahead, not riding on the send) the op returns once its
// requests are out, and the thread of the last reply stores the rows (RpcContext::
// deferred_lookups: the step waits for them there), so no thread wakes only to copy them.
absl::Status Prefetch(RpcContext* rpc, OpContext& ctx) {
  auto st = std::make_shared<PrefetchState>();
  st->eps = ctx.StringsAttr("epmap");
  const std::vector<std::string>& eps = st->eps;
  std::vector<std::string> tables = ctx.StringsAttr("tables");
  std::vector<int64_t> dims = ctx.IntsAttr("dims");
  std::vector<int64_t> owners = ctx.IntsAttr("owners");
  if (tables.empty()) {
    tables = {ctx.StringAttr("table")};
    dims = {ctx.IntAttr("dim", 0)};
  }
  const int num_entries = static_cast<int>(tables.size());
  if (owners.empty()) owners.assign(num_entries, -1);
  const std::vector<std::string> ids_names = OpInputs(ctx.op(), "Ids");
  if (static_cast<int>(ids_names.size()) != num_entries ||
      static_cast<int>(OpOutputs(ctx.op(), "Out").size()) != num_entries ||
      static_cast<int>(dims.size()) != num_entries ||
      static_cast<int>(owners.size()) != num_entries) {
    return ctx.Error(absl::StrCat("needs one Ids, Out, dim (and owner, if any) per table (",
                                  num_entries, " tables)"));
  }
  ShardMethod method;
  if (!ParseShardMethod(ctx.StringAttr("shard_method", "hash"), &method)) {
    return ctx.Error("shard_method is not hash or mod");
  }
  if (eps.empty()) return ctx.Error("needs epmap");
  const int n = static_cast<int>(eps.size());
  std::vector<PrefetchTable>& per = st->per;
  std::vector<int>& table_of = st->table_of;
  std::vector<int>& input_of = st->input_of;
  std::vector<const Tensor*>& ids_of = st->ids_of;
  table_of.resize(num_entries);
  input_of.resize(num_entries);
  ids_of.resize(num_entries);
  st->outs.resize(num_entries);
  for (int e = 0; e < num_entries; ++e) {
    if (dims[e] < 1) return ctx.Error(absl::StrCat("table ", tables[e], " has dim ", dims[e]));
    if (owners[e] < -1 || owners[e] >= n) {
      return ctx.Error(absl::StrCat("table ", tables[e], " has owner ", owners[e],
                                    ", not -1 or in [0, ", n, ")"));
    }
    const int owner = static_cast<int>(owners[e]);
    int t = 0;
    while (t < static_cast<int>(per.size()) && per[t].name != tables[e]) ++t;
    if (t == static_cast<int>(per.size())) {
      per.push_back({tables[e], dims[e], owner, {}, -1, {}});
      per.back().rows.resize(per.back().Shards(n));
    } else if (per[t].dim != dims[e] || per[t].owner != owner) {
      return ctx.Error(absl::StrCat("table ", tables[e], " has dims ", per[t].dim, " and ", dims[e],
                                    " or owners ", per[t].owner, " and ", owner));
    }
    table_of[e] = t;
    input_of[e] = static_cast<int>(per[t].ids.size());
    per[t].ids.push_back(ids_names[e]);
    TS_ASSIGN_OR_RETURN(ids_of[e], ctx.Input("Ids", e));
    TS_RETURN_IF_ERROR(ctx.CheckDType("Ids", *ids_of[e], INT64));
    TS_ASSIGN_OR_RETURN(st->outs[e], ctx.Output("Out", e));
  }
  // One IdShards per distinct list of Ids variables and shard count.
  std::vector<IdShards>& groups = st->groups;
  std::vector<std::pair<const std::vector<std::string>*, int>> group_keys;
  for (PrefetchTable& p : per) {
    size_t g = 0;
    while (g < group_keys.size() &&
           (*group_keys[g].first != p.ids || group_keys[g].second != p.Shards(n))) {
      ++g;
    }
    if (g == group_keys.size()) {
      group_keys.push_back({&p.ids, p.Shards(n)});
      groups.emplace_back();
    }
    p.group = static_cast<int>(g);
  }
  for (int e = 0; e < num_entries; ++e) {
    IdShards& g = groups[per[table_of[e]].group];
    if (static_cast<int>(g.inputs.size()) == input_of[e]) g.inputs.push_back(ids_of[e]);
  }
  for (size_t g = 0; g < groups.size(); ++g) {
    groups[g].Build(group_keys[g].second, method);
    // The gradient of a table looked up by one Ids tensor has a row per id in the same order:
    // split_by_shard merges it by this dedup instead of hashing the ids again.
    if (groups[g].inputs.size() == 1) OfferMergePlan(groups[g].plan);
  }
  // One request per pserver: the shards it serves (several shards may share an endpoint).
  std::vector<std::string> endpoints = Distinct(eps);
  std::vector<std::vector<PrefetchItem>> batches(endpoints.size());
  for (PrefetchTable& p : per) {
    const IdShards& g = groups[p.group];
    for (int k = 0; k < p.Shards(n); ++k) {
      if (g.shard_ids[k].empty()) continue;
      const std::string& ep = eps[p.PserverOf(k)];
      size_t e = std::find(endpoints.begin(), endpoints.end(), ep) - endpoints.begin();
      batches[e].push_back({p.name, &g.shard_ids[k], &p.rows[k]});
    }
  }
  // A table with two shards on one endpoint would appear twice in its request: send such
  // shards in a further request.
  std::vector<std::pair<size_t, std::vector<PrefetchItem>>> requests;
  for (size_t e = 0; e < batches.size(); ++e) {
    std::vector<std::vector<PrefetchItem>> rounds;
    for (PrefetchItem& item : batches[e]) {
      size_t r = 0;
      while (r < rounds.size() &&
             std::any_of(rounds[r].begin(), rounds[r].end(),
                         [&](const PrefetchItem& x) { return x.table == item.table; })) {
        ++r;
      }
      if (r == rounds.size()) rounds.emplace_back();
      rounds[r].push_back(item);
    }
    for (auto& round : rounds) requests.push_back({e, std::move(round)});
  }
  RequestMeta meta = rpc->Meta();
  const bool after_update = ctx.BoolAttr("after_update", false);
  const bool ride = ctx.BoolAttr("ride_on_step", false);
  if (ctx.BoolAttr("complete_later", false) && !ride && !requests.empty()) {
    // The last reply's thread stores the rows; the first error wins.
    DoneCallback stored = rpc->deferred_lookups.Add();
    std::vector<DoneCallback> replies = JoinThen(
        static_cast<int>(requests.size()), [st, stored] { stored(st->Store()); }, stored);
    for (size_t r = 0; r < requests.size(); ++r) {
      auto& [e, items] = requests[r];
      rpc->clients->Get(endpoints[e])
          ->PrefetchBatchAsync(meta, std::move(items), after_update, std::move(replies[r]));
    }
    return absl::OkStatus();
  }
  StatusGroup group(static_cast<int>(requests.size()));
  bool rode = false;
  if (ride) {
    // The step's send (sync) or receive (async) carries them where it expects them and each
    // pserver gets one request; otherwise it must not wait for them.
    std::vector<bool> seen(endpoints.size());
    bool one_each = true;
    std::vector<LookupRiders::Ride> rides;
    for (const auto& [e, items] : requests) {
      one_each &= !seen[e];
      seen[e] = true;
      rides.push_back(
          {rpc->clients->Get(endpoints[e]), meta, items, group.Callback(), after_update});
    }
    rode = one_each && rpc->lookup_riders.Leave(std::move(rides));
    if (!rode) rpc->lookup_riders.Withdraw();
  }
  if (!rode) {
    for (auto& [e, items] : requests) {
      rpc->clients->Get(endpoints[e])
          ->PrefetchBatchAsync(meta, std::move(items), after_update, group.Callback());
    }
  }
  TS_RETURN_IF_ERROR(group.Wait());
  return st->Store();
}

// One pserver's request of a send or recv: the indices of its variables, and whether it carries
// the barrier.
struct PserverPart {
  std::string endpoint;
  std::vector<size_t> vars;
  bool barrier = false;
};

// The requests for variables at `eps` (one endpoint per variable), pservers in first-use order;
// the pservers in `barrier` get the barrier, with no variables if they serve none.
std::vector<PserverPart> PartsByPserver(const std::vector<std::string>& eps,
                                        const std::vector<std::string>& barrier) {
  std::vector<std::string> all = eps;
  all.insert(all.end(), barrier.begin(), barrier.end());
  std::vector<PserverPart> parts;
  for (const std::string& ep : Distinct(all)) {
    PserverPart part{ep, {}, std::find(barrier.begin(), barrier.end(), ep) != barrier.end()};
    for (size_t i = 0; i < eps.size(); ++i) {
      if (eps[i] == ep) part.vars.push_back(i);
    }
    parts.push_back(std::move(part));
  }
  return parts;
}

// The lookups of the ride in `rides` for `client` at `step` that were left to be answered
// after the update (sync) or not (async), taken out of `rides`, with `done` made to answer the
// ride too; none when there is no such ride.
std::vector<PrefetchItem> TakeRide(std::vector<LookupRiders::Ride>* rides, PServerClient* client,
                                   int64_t step, bool after_update, DoneCallback* done) {
  auto ride = std::find_if(rides->begin(), rides->end(), [&](const LookupRiders::Ride& r) {
    return r.client == client && r.meta.step == step && r.after_update == after_update;
  });
  if (ride == rides->end()) return {};
  std::vector<PrefetchItem> lookups = std::move(ride->items);
  *done = [sent = std::move(*done), looked_up = std::move(ride->done)](absl::Status s) {
    looked_up(s);
    sent(s);
  };
  rides->erase(ride);
  return lookups;
}

// A send with the step's receive folded in (attr recv_folded, set by LocalTrainer's
// FoldReceive): outputs Out[j] from recv_epmap[j], with the fetch barrier to the pservers of
// fetch_barrier_endpoints (perhaps nothing to fetch: hybrid). Sync: every pserver involved must
// get the send barrier, and answers once it applied the step. Async (sync_mode false): every
// pserver received from must get gradients, and answers once it applied them (the trainer
// reads its own writes). One request per pserver (PServerClient::SendGetBatchAsync; a pserver
// with nothing to fetch and no fetch barrier, a SendBatch).
absl::Status SendAndReceive(RpcContext* rpc, OpContext& ctx, const std::vector<std::string>& vars,
                            const std::vector<const Variable*>& values,
                            const std::vector<std::string>& eps) {
  const std::vector<std::string> outs = OpOutputs(ctx.op(), "Out");
  const std::vector<std::string> out_eps = ctx.StringsAttr("recv_epmap");
  TS_RETURN_IF_ERROR(CheckParallel(ctx, outs, out_eps));
  const std::vector<std::string> barrier = ctx.StringsAttr("barrier_endpoints");
  const std::vector<std::string> fetch_barrier = ctx.StringsAttr("fetch_barrier_endpoints");
  const bool sync = ctx.BoolAttr("sync_mode", true);
  const std::vector<std::string>& reached = sync ? barrier : eps;
  for (const std::vector<std::string>* list : {&out_eps, &fetch_barrier}) {
    for (const std::string& ep : *list) {
      if (std::find(reached.begin(), reached.end(), ep) == reached.end()) {
        return ctx.Error(absl::StrCat("receives from pserver ", ep,
                                      sync ? ", which does not get this send's barrier"
                                           : ", which this send does not reach"));
      }
    }
  }
  std::vector<Variable*> received;
  for (size_t j = 0; j < outs.size(); ++j) {
    TS_ASSIGN_OR_RETURN(Variable * v, ctx.OutputVar("Out", static_cast<int>(j)));
    received.push_back(v);
  }
  std::vector<PserverPart> parts = PartsByPserver(eps, barrier);
  StatusGroup group(static_cast<int>(parts.size()));
  RequestMeta meta = rpc->Meta();
  // The next batch's lookups, where the look-ahead left them for this step's requests.
  std::vector<LookupRiders::Ride> rides = rpc->lookup_riders.Take();
  for (const PserverPart& part : parts) {
    std::vector<SendItem> items;
    for (size_t i : part.vars) items.push_back({vars[i], values[i]});
    std::vector<GetItem> gets;
    for (size_t j = 0; j < outs.size(); ++j) {
      if (out_eps[j] == part.endpoint) gets.push_back({outs[j], received[j]});
    }
    const bool fetch = std::find(fetch_barrier.begin(), fetch_barrier.end(), part.endpoint) !=
                       fetch_barrier.end();
    PServerClient* client = rpc->clients->Get(part.endpoint);
    std::vector<PrefetchItem> lookups;
    DoneCallback done = group.Callback();
    // Sync: only a request with the send barrier takes lookups (answered after the update, as
    // they must be); async: a request without it.
    if (part.barrier == sync) lookups = TakeRide(&rides, client, meta.step, sync, &done);
    if (!sync) {  // counted as the communicator counts its pushes
      done = [rpc, n = static_cast<int64_t>(items.size()), sent = std::move(done)](absl::Status s) {
        if (s.ok()) rpc->folded_pushes += n;
        sent(s);
      };
    }
    if (gets.empty() && !fetch && lookups.empty()) {
      client->SendBatchAsync(meta, std::move(items), part.barrier, &rpc->step_reply,
                             std::move(done));
    } else {
      client->SendGetBatchAsync(meta, std::move(items), part.barrier, &rpc->step_reply,
                                std::move(gets), fetch, std::move(lookups), std::move(done));
    }
  }
  for (LookupRiders::Ride& ride : rides) ride.SendAlone();  // pservers this send does not reach
  return group.Wait();
}

// send: X[i] to epmap[i], one request per pserver; with attr barrier_endpoints (sync), each of
// those pservers' requests also carries this trainer's send barrier (a pserver that gets no
// gradient gets a barrier-only request).
absl::Status Send(RpcContext* rpc, OpContext& ctx) {
  auto vars = OpInputs(ctx.op(), "X");
  auto eps = ctx.StringsAttr("epmap");
  TS_RETURN_IF_ERROR(CheckParallel(ctx, vars, eps));
  std::vector<const Variable*> values;
  for (size_t i = 0; i < vars.size(); ++i) {
    TS_ASSIGN_OR_RETURN(const Variable* v, ctx.InputVar("X", static_cast<int>(i)));
    values.push_back(v);
  }
  // Async, unless the receive is folded in (the step then waits for its push anyway).
  if (!ctx.BoolAttr("sync_mode", true) && rpc->communicator != nullptr &&
      !ctx.BoolAttr("recv_folded", false)) {
    std::vector<AsyncCommunicator::Gradient> grads;
    for (size_t i = 0; i < vars.size(); ++i) grads.push_back({vars[i], eps[i], values[i]});
    return rpc->communicator->PushAll(grads);
  }
  RequestMeta meta = rpc->Meta();
  if (ctx.BoolAttr("early", false)) {
    // Out without the barrier and not waited for (the gradients stay unchanged until the step's
    // send, which waits for these first).
    for (const PserverPart& part : PartsByPserver(eps, {})) {
      std::vector<SendItem> items;
      for (size_t i : part.vars) items.push_back({vars[i], values[i]});
      rpc->clients->Get(part.endpoint)
          ->SendBatchAsync(meta, std::move(items), /*send_barrier=*/false, &rpc->step_reply,
                           rpc->early_sends.Add());
    }
    return absl::OkStatus();
  }
  // The step's early sends must have been received before its barrier goes out.
  TS_RETURN_IF_ERROR(rpc->early_sends.Wait());
  if (ctx.BoolAttr("recv_folded", false)) return SendAndReceive(rpc, ctx, vars, values, eps);
  std::vector<PserverPart> parts = PartsByPserver(eps, ctx.StringsAttr("barrier_endpoints"));
  StatusGroup group(static_cast<int>(parts.size()));
  for (const PserverPart& part : parts) {
    std::vector<SendItem> items;
    for (size_t i : part.vars) items.push_back({vars[i], values[i]});
    rpc->clients->Get(part.endpoint)
        ->SendBatchAsync(meta, std::move(items), part.barrier, &rpc->step_reply, group.Callback());
  }
  return group.Wait();
}

// recv: Out[i] from epmap[i], one request per pserver; with attr fetch_barrier_endpoints
// (sync), those pservers' requests also carry this trainer's fetch barrier.
absl::Status Recv(RpcContext* rpc, OpContext& ctx) {
  auto vars = OpOutputs(ctx.op(), "Out");
  auto eps = ctx.StringsAttr("epmap");
  TS_RETURN_IF_ERROR(CheckParallel(ctx, vars, eps));
  std::vector<Variable*> outs;
  for (size_t i = 0; i < vars.size(); ++i) {
    TS_ASSIGN_OR_RETURN(Variable * v, ctx.OutputVar("Out", static_cast<int>(i)));
    outs.push_back(v);
  }
  // Async with read_own_writes: pull parameters only after this trainer's queued gradients were
  // applied (staleness comes only from the other trainers).
  if (rpc->communicator != nullptr && rpc->read_own_writes) {
    TS_RETURN_IF_ERROR(rpc->communicator->Flush());
  }
  std::vector<PserverPart> parts = PartsByPserver(eps, ctx.StringsAttr("fetch_barrier_endpoints"));
  StatusGroup group(static_cast<int>(parts.size()));
  RequestMeta meta = rpc->Meta();
  const bool after_update = ctx.BoolAttr("after_update", false);
  // Async, pipelined: the next batch's lookups, where the look-ahead left them for this receive.
  std::vector<LookupRiders::Ride> rides;
  if (ctx.BoolAttr("takes_lookups", false)) rides = rpc->lookup_riders.Take();
  for (const PserverPart& part : parts) {
    std::vector<GetItem> items;
    for (size_t i : part.vars) items.push_back({vars[i], outs[i]});
    PServerClient* client = rpc->clients->Get(part.endpoint);
    DoneCallback done = group.Callback();
    std::vector<PrefetchItem> lookups;
    if (!after_update) lookups = TakeRide(&rides, client, meta.step, false, &done);
    if (lookups.empty()) {
      client->GetBatchAsync(meta, std::move(items), part.barrier, after_update, std::move(done));
    } else {
      client->SendGetBatchAsync(meta, {}, /*send_barrier=*/false, nullptr, std::move(items),
                                part.barrier, std::move(lookups), std::move(done));
    }
  }
  for (LookupRiders::Ride& ride : rides) ride.SendAlone();  // pservers this receive does not reach
  return group.Wait();
}

}  // namespace

absl::Status RegisterRpcOps(OpRegistry* registry, RpcContext* rpc) {
  TS_RETURN_IF_ERROR(registry->Register(
      "prefetch", {[rpc](OpContext& ctx) { return Prefetch(rpc, ctx); }, nullptr}));
  TS_RETURN_IF_ERROR(
      registry->Register("send", {[rpc](OpContext& ctx) { return Send(rpc, ctx); }, nullptr}));
  TS_RETURN_IF_ERROR(
      registry->Register("recv", {[rpc](OpContext& ctx) { return Recv(rpc, ctx); }, nullptr}));
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

absl::StatusOr<EvalPartial> ReduceEvaluation(RpcContext* rpc, const std::string& pserver,
                                             int64_t round, const EvalPartial& partial,
                                             bool fetch) {
  const std::string name = absl::StrCat("@EVAL@.", round);
  PServerClient* client = rpc->clients->Get(pserver);
  Variable mine;
  *mine.GetMutable<Tensor>() = partial.ToTensor();
  absl::Status sent = client->SendVariable(rpc->Meta(), name, mine);
  if (!sent.ok()) {
    return absl::Status(sent.code(), absl::StrCat("sending evaluation partial ", round, " to ",
                                                  pserver, ": ", sent.message()));
  }
  if (!fetch) return partial;
  Variable sum;
  absl::Status got = client->GetVariable(rpc->Meta(), name, &sum);
  if (!got.ok()) {
    return absl::Status(got.code(), absl::StrCat("evaluation ", round, " from ", pserver, ": ",
                                                 got.message()));
  }
  if (!sum.Is<Tensor>()) {
    return absl::InternalError(absl::StrCat("evaluation ", round, " from ", pserver,
                                            " is not a tensor"));
  }
  return EvalPartial::FromTensor(sum.Get<Tensor>());
}

absl::Status NotifyComplete(RpcContext* rpc, const std::vector<std::string>& endpoints) {
  return Barrier(rpc, endpoints, COMPLETE);
}

}  // namespace tessera
