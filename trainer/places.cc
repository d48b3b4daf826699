#include "trainer/places.h"

#include <algorithm>
#include <cstring>
#include <functional>
#include <set>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/data/sampler.h"
#include "common/framework/op_desc.h"
#include "common/base/status.h"

namespace tessera {

namespace {

// Forward, loss and backward ops (and their combinations) run per place; anything else
// (optimize, RPC, distributed, LR schedule) does not.
bool IsPlaceRole(int64_t role) { return (role & ~int64_t{kRoleBackward | kRoleLoss}) == 0; }

std::string RoleString(int64_t role) {
  if (role == kRoleForward) return "forward";
  std::vector<std::string> names;
  const std::pair<int64_t, const char*> kNames[] = {
      {kRoleBackward, "backward"}, {kRoleOptimize, "optimize"}, {kRoleRPC, "rpc"},
      {kRoleDist, "dist"},         {kRoleLRSched, "lr_sched"},  {kRoleLoss, "loss"}};
  std::string out;
  for (const auto& [bit, name] : kNames) {
    if ((role & bit) != 0) absl::StrAppend(&out, out.empty() ? "" : "|", name);
  }
  return out.empty() ? absl::StrCat(role) : out;
}

// A copy of `block` with only ops [begin, end) and the variables they use.
BlockDesc SubBlock(const BlockDesc& block, int begin, int end) {
  BlockDesc out;
  out.set_idx(0);
  out.set_parent_idx(-1);
  std::set<std::string> used;
  for (int i = begin; i < end; ++i) {
    *out.add_ops() = block.ops(i);
    for (const auto& a : AllInputArgs(block.ops(i))) used.insert(a);
    for (const auto& a : AllOutputArgs(block.ops(i))) used.insert(a);
  }
  for (const auto& v : block.vars()) {
    if (used.count(v.name()) > 0) *out.add_vars() = v;
  }
  return out;
}

std::string PlaceError(const std::string& name, size_t place, absl::string_view why) {
  return absl::StrCat("combining '", name, "' across places: place ", place, " ", why);
}

// acc (+)= w * in, accumulated in double so that the weights (n_p / n, rarely exact in float)
// add one rounding at most.
template <typename T>
void AddScaled(const Tensor& in, double w, bool first, std::vector<double>* acc) {
  const T* x = in.data<T>();
  const int64_t n = in.numel();
  if (first) acc->assign(static_cast<size_t>(n), 0.0);
  double* y = acc->data();
  for (int64_t i = 0; i < n; ++i) y[i] += w * static_cast<double>(x[i]);
}

template <typename T>
void CopyScaled(const Tensor& in, double w, int64_t offset, Tensor* out) {
  const T* x = in.data<T>();
  T* y = out->data<T>() + offset;
  for (int64_t i = 0; i < in.numel(); ++i) y[i] = static_cast<T>(w * static_cast<double>(x[i]));
}

bool IsFloat(DataType t) { return t == FLOAT32 || t == FLOAT64; }

// Row shape (dims after the first) of a tensor of rank >= 1.
Shape RowShape(const Tensor& t) { return Shape(t.shape().begin() + 1, t.shape().end()); }

}  // namespace

absl::StatusOr<PlacePrograms> SplitForPlaces(const ProgramDesc& main) {
  if (main.blocks_size() == 0) return absl::InvalidArgumentError("the program has no blocks");
  const BlockDesc& block = main.blocks(0);
  const int n = block.ops_size();
  int first_backward = -1;
  for (int i = 0; i < n && first_backward < 0; ++i) {
    const int64_t role = OpRoleOf(block.ops(i));
    if (IsPlaceRole(role) && (role & kRoleBackward) != 0) first_backward = i;
  }
  if (first_backward < 0) {
    return absl::InvalidArgumentError(
        "the program has no backward op (build it with an optimizer's Minimize), so there is no "
        "forward/backward part to run per place");
  }
  int boundary = n;
  for (int i = first_backward + 1; i < n; ++i) {
    if (!IsPlaceRole(OpRoleOf(block.ops(i)))) {
      boundary = i;
      break;
    }
  }
  for (int i = 0; i < n; ++i) {
    const OpDesc& op = block.ops(i);
    const int64_t role = OpRoleOf(op);
    if (i < boundary && !IsPlaceRole(role)) {
      return absl::InvalidArgumentError(
          absl::StrCat("op #", i, " ", OpSignature(op), " has role ", RoleString(role),
                       " but comes before the end of the backward pass (op #", boundary,
                       "); only forward, loss and backward ops can run per place"));
    }
    if (i >= boundary && IsPlaceRole(role)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "op #", i, " ", OpSignature(op), " has role ", RoleString(role), " but comes after op #",
          boundary, " ", block.ops(boundary).type(), " (role ",
          RoleString(OpRoleOf(block.ops(boundary))),
          ") that ends the backward pass; a program run on several places must be forward and "
          "backward ops, then the rest"));
    }
  }
  PlacePrograms out;
  out.boundary = boundary;
  out.place.set_random_seed(main.random_seed());
  *out.place.add_blocks() = SubBlock(block, 0, boundary);
  out.rest = main;
  *out.rest.mutable_blocks(0) = SubBlock(block, boundary, n);
  for (int b = 1; b < main.blocks_size(); ++b) *out.rest.mutable_blocks(b) = main.blocks(b);
  out.rest.mutable_blocks(0)->set_idx(block.idx());
  out.rest.mutable_blocks(0)->set_parent_idx(block.parent_idx());

  std::set<std::string> written;
  for (int i = 0; i < boundary; ++i) {
    const OpDesc& op = block.ops(i);
    for (const auto& a : AllOutputArgs(op)) {
      const VarDesc* v = FindVarDesc(block, a);
      if (v != nullptr && v->persistable()) {
        return absl::InvalidArgumentError(
            absl::StrCat("op #", i, " ", OpSignature(op), " writes persistable variable '", a,
                         "'; places share the parameters read-only, so it cannot run per place"));
      }
      if (written.insert(a).second) out.place_locals.push_back(a);
    }
  }
  std::set<std::string> rest_written, reduced;
  for (int i = boundary; i < n; ++i) {
    const OpDesc& op = block.ops(i);
    for (const auto& a : AllInputArgs(op)) {
      if (written.count(a) == 0 || rest_written.count(a) > 0 || reduced.count(a) > 0) continue;
      if (!IsGradVarName(a)) {
        return absl::InvalidArgumentError(absl::StrCat(
            "variable '", a, "' is computed per place and read after the backward pass by op #", i,
            " ", OpSignature(op), "; only gradients can be combined across places"));
      }
      reduced.insert(a);
      out.reduced.push_back(a);
    }
    for (const auto& a : AllOutputArgs(op)) rest_written.insert(a);
  }
  return out;
}

absl::Status CpuPlaceReducer::WeightedSum(const std::string& name,
                                          const std::vector<const Variable*>& values,
                                          const std::vector<double>& weights, Variable* out) {
  if (values.empty() || values.size() != weights.size()) {
    return absl::InvalidArgumentError(absl::StrCat("combining '", name,
                                                   "' across places: ", values.size(),
                                                   " values and ", weights.size(), " weights"));
  }
  for (size_t p = 0; p < values.size(); ++p) {
    if (values[p] == nullptr || !values[p]->IsInitialized()) {
      return absl::InvalidArgumentError(PlaceError(name, p, "did not compute it"));
    }
  }
  if (const SelectedRows* first = values[0]->GetIf<SelectedRows>()) {
    int64_t rows = 0;
    for (size_t p = 0; p < values.size(); ++p) {
      const SelectedRows* sr = values[p]->GetIf<SelectedRows>();
      if (sr == nullptr) {
        return absl::InvalidArgumentError(
            PlaceError(name, p, "has a dense tensor where place 0 has sparse rows"));
      }
      if (sr->height != first->height || !IsFloat(sr->value.dtype()) ||
          sr->value.dtype() != first->value.dtype() || sr->value.rank() < 1 ||
          RowShape(sr->value) != RowShape(first->value) ||
          sr->value.dim(0) != static_cast<int64_t>(sr->rows.size())) {
        return absl::InvalidArgumentError(
            PlaceError(name, p,
                       absl::StrCat("has rows of height ", sr->height, " and value ",
                                    sr->value.DebugString(), "; place 0 height ", first->height,
                                    " value ", first->value.DebugString())));
      }
      rows += sr->value.dim(0);
    }
    SelectedRows merged;
    merged.height = first->height;
    merged.rows.reserve(static_cast<size_t>(rows));
    Shape shape = first->value.shape();
    shape[0] = rows;
    merged.value = Tensor(first->value.dtype(), shape);
    int64_t offset = 0;
    for (size_t p = 0; p < values.size(); ++p) {
      const SelectedRows& sr = values[p]->Get<SelectedRows>();
      merged.rows.insert(merged.rows.end(), sr.rows.begin(), sr.rows.end());
      if (sr.value.dtype() == FLOAT32) {
        CopyScaled<float>(sr.value, weights[p], offset, &merged.value);
      } else {
        CopyScaled<double>(sr.value, weights[p], offset, &merged.value);
      }
      offset += sr.value.numel();
    }
    *out->GetMutable<SelectedRows>() = std::move(merged);
    return absl::OkStatus();
  }
  const Tensor& first = values[0]->Get<Tensor>();
  for (size_t p = 0; p < values.size(); ++p) {
    const Tensor* t = values[p]->GetIf<Tensor>();
    if (t == nullptr) {
      return absl::InvalidArgumentError(
          PlaceError(name, p, "has sparse rows where place 0 has a dense tensor"));
    }
    if (!t->initialized() || !IsFloat(t->dtype()) || t->dtype() != first.dtype() ||
        t->shape() != first.shape()) {
      return absl::InvalidArgumentError(
          PlaceError(name, p,
                     absl::StrCat("has ", t->DebugString(), " (place 0: ", first.DebugString(),
                                  "); need float tensors of one shape")));
    }
  }
  // A fresh buffer: the output must not alias a place's tensor (Tensor copies share buffers).
  Tensor sum(first.dtype(), first.shape());
  std::vector<double> acc;
  for (size_t p = 0; p < values.size(); ++p) {
    if (first.dtype() == FLOAT32) {
      AddScaled<float>(values[p]->Get<Tensor>(), weights[p], p == 0, &acc);
    } else {
      AddScaled<double>(values[p]->Get<Tensor>(), weights[p], p == 0, &acc);
    }
  }
  for (int64_t i = 0; i < sum.numel(); ++i) {
    if (first.dtype() == FLOAT32) {
      sum.data<float>()[i] = static_cast<float>(acc[static_cast<size_t>(i)]);
    } else {
      sum.data<double>()[i] = acc[static_cast<size_t>(i)];
    }
  }
  *out->GetMutable<Tensor>() = std::move(sum);
  return absl::OkStatus();
}

absl::Status CpuPlaceReducer::ConcatRows(const std::string& name,
                                         const std::vector<const Variable*>& values,
                                         Variable* out) {
  if (values.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("concatenating '", name, "': no places"));
  }
  const Tensor* first = values[0] == nullptr ? nullptr : values[0]->GetIf<Tensor>();
  int64_t rows = 0;
  for (size_t p = 0; p < values.size(); ++p) {
    const Tensor* t = values[p] == nullptr ? nullptr : values[p]->GetIf<Tensor>();
    if (t == nullptr || first == nullptr || !t->initialized() || t->rank() < 1 ||
        t->dtype() != first->dtype() || RowShape(*t) != RowShape(*first)) {
      return absl::InvalidArgumentError(
          absl::StrCat("concatenating '", name, "' across places: place ", p, " has ",
                       t == nullptr ? std::string("no dense tensor") : t->DebugString(),
                       first == nullptr ? std::string()
                                        : absl::StrCat(" (place 0: ", first->DebugString(), ")")));
    }
    rows += t->dim(0);
  }
  Shape shape = first->shape();
  shape[0] = rows;
  Tensor cat(first->dtype(), shape);
  size_t offset = 0;
  for (const Variable* v : values) {
    const Tensor& t = v->Get<Tensor>();
    std::memcpy(static_cast<char*>(cat.raw_data()) + offset, t.raw_data(), t.nbytes());
    offset += t.nbytes();
  }
  *out->GetMutable<Tensor>() = std::move(cat);
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<PlaceRunner>> PlaceRunner::Create(const Executor* executor,
                                                                 const ProgramDesc& main,
                                                                 PlaceRunnerOptions options,
                                                                 Scope* scope) {
  if (options.num_places < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("cpu_places must be >= 1, got ", options.num_places));
  }
  std::unique_ptr<PlaceRunner> r(new PlaceRunner(executor, std::move(options), scope));
  if (r->options_.reducer == nullptr) r->options_.reducer = std::make_shared<CpuPlaceReducer>();
  TS_ASSIGN_OR_RETURN(r->programs_, SplitForPlaces(main));
  TS_ASSIGN_OR_RETURN(r->place_block_, executor->Prepare(r->programs_.place, 0));
  TS_ASSIGN_OR_RETURN(r->rest_block_, executor->Prepare(r->programs_.rest, 0));
  const BlockDesc& place = r->programs_.place.blocks(0);
  const std::vector<const Executor*>& devices = r->options_.place_executors;
  if (!devices.empty()) {
    if (static_cast<int>(devices.size()) != r->options_.num_places) {
      return absl::InvalidArgumentError(absl::StrCat(devices.size(), " place executors for ",
                                                     r->options_.num_places, " places"));
    }
    for (const Executor* e : devices) {
      r->place_executors_.push_back(e);
      TS_ASSIGN_OR_RETURN(PreparedBlock b, e->Prepare(r->programs_.place, 0));
      r->place_blocks_.push_back(std::move(b));
    }
    // The parameters the place program reads (persistable and not written by it).
    const std::set<std::string> locals(r->programs_.place_locals.begin(),
                                       r->programs_.place_locals.end());
    std::set<std::string> read;
    for (const OpDesc& op : place.ops()) {
      for (const auto& in : AllInputArgs(op)) read.insert(in);
    }
    for (const VarDesc& v : place.vars()) {
      if (v.persistable() && read.count(v.name()) > 0 && locals.count(v.name()) == 0) {
        r->replicated_.push_back(v.name());
      }
    }
  } else {
    r->place_executors_.assign(static_cast<size_t>(r->options_.num_places), executor);
  }
  r->lookup_ops_ = r->options_.num_places > 1 ? LeadingLookupOps(place) : 0;
  if (r->lookup_ops_ > 0) {
    r->lookup_scope_ = scope->NewScope();
    for (int i = 0; i < r->lookup_ops_; ++i) {
      const std::vector<std::string> ids = OpInputs(place.ops(i), "Ids");
      const std::vector<std::string> rows = OpOutputs(place.ops(i), "Out");
      for (size_t e = 0; e < ids.size() && e < rows.size(); ++e) {
        r->lookup_args_.push_back({ids[e], rows[e]});
        // Local here, so that the concatenated ids and all rows never touch the trainer's.
        r->lookup_scope_->Var(ids[e]);
        r->lookup_scope_->Var(rows[e]);
      }
    }
  }
  for (int p = 0; p < r->options_.num_places; ++p) {
    Scope* s = scope->NewScope();
    // The place's own activations and gradients (lookups would otherwise find the trainer's),
    // and on a device its own copy of the parameters.
    for (const auto& name : r->programs_.place_locals) s->Var(name);
    for (const auto& name : r->replicated_) s->Var(name);
    r->place_scopes_.push_back(s);
  }
  return r;
}

absl::Status PlaceRunner::Replicate(Scope* place_scope) const {
  for (const std::string& name : replicated_) {
    const Variable* from = scope_->FindVar(name);
    const Tensor* t = from == nullptr ? nullptr : from->GetIf<Tensor>();
    if (t == nullptr || !t->initialized()) {
      return absl::FailedPreconditionError(
          absl::StrCat("parameter '", name, "' is not a tensor in the trainer's scope"));
    }
    // A fresh host copy (the place's kernels upload it); the old device copy is released.
    Tensor copy;
    copy.CopyFrom(*t);
    *place_scope->FindLocalVar(name)->GetMutable<Tensor>() = std::move(copy);
  }
  return absl::OkStatus();
}

PlaceRunner::~PlaceRunner() {
  for (Scope* s : place_scopes_) scope_->DeleteScope(s);
  if (lookup_scope_ != nullptr) scope_->DeleteScope(lookup_scope_);
}

int LeadingLookupOps(const BlockDesc& block) {
  const int n = block.ops_size();
  int head = 0;
  while (head < n && block.ops(head).type() == "prefetch") ++head;
  std::set<std::string> written;  // by the ops after the lookups
  for (int i = head; i < n; ++i) {
    for (const auto& out : AllOutputArgs(block.ops(i))) written.insert(out);
  }
  std::set<std::string> outputs;
  for (int i = 0; i < head; ++i) {
    for (const auto& in : AllInputArgs(block.ops(i))) {
      if (written.count(in) > 0 || outputs.count(in) > 0) return 0;  // computed, not fed
    }
    for (const auto& out : AllOutputArgs(block.ops(i))) {
      if (written.count(out) > 0 || !outputs.insert(out).second) return 0;
    }
  }
  return head;
}

absl::Status PlaceRunner::LookUpForPlaces(const std::vector<int>& active) {
  // Each distinct ids variable: the places' rows in order, into lookup_scope_.
  std::set<std::string> concatenated;
  for (const auto& [ids, rows] : lookup_args_) {
    if (!concatenated.insert(ids).second) continue;
    std::vector<const Variable*> values;
    for (int p : active) values.push_back(place_scopes_[static_cast<size_t>(p)]->FindVar(ids));
    TS_RETURN_IF_ERROR(
        options_.reducer->ConcatRows(ids, values, lookup_scope_->Var(ids)));
  }
  TS_RETURN_IF_ERROR(executor_->RunOps(place_block_, 0, lookup_ops_, lookup_scope_));
  // Each place's rows: its share of the looked-up rows, with its ids' sequences (LoD).
  for (const auto& [ids, rows] : lookup_args_) {
    const Tensor& all = lookup_scope_->FindVar(rows)->Get<Tensor>();
    const int64_t width = all.rank() == 2 ? all.dim(1) : 0;
    int64_t offset = 0;
    for (int p : active) {
      Scope* s = place_scopes_[static_cast<size_t>(p)];
      const Tensor& place_ids = s->FindVar(ids)->Get<Tensor>();
      const int64_t count = place_ids.numel();
      if (all.dtype() != FLOAT32 || width < 1 || offset + count > all.dim(0)) {
        return absl::InternalError(absl::StrCat("lookup of '", ids, "' for the places gave ",
                                                all.DebugString(), " for ", offset + count,
                                                " ids"));
      }
      Tensor* out = s->Var(rows)->GetMutable<Tensor>();
      out->Resize(FLOAT32, {count, width});
      out->set_lod(place_ids.lod());
      std::memcpy(out->data<float>(), all.data<float>() + offset * width,
                  sizeof(float) * static_cast<size_t>(count * width));
      offset += count;
    }
  }
  return absl::OkStatus();
}

absl::Status PlaceRunner::Step(int64_t batch_size, const FeedFn& feed) {
  if (batch_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("a step across places needs a batch of >= 1 examples, got ", batch_size));
  }
  const int k = options_.num_places;
  TS_ASSIGN_OR_RETURN(data::BatchSharder sharder, data::BatchSharder::Create(k, 0));
  std::vector<int> active;
  std::vector<data::ShardRange> ranges;
  for (int p = 0; p < k; ++p) {
    const data::ShardRange r = sharder.ShardOf(batch_size, p);
    if (r.size() == 0) continue;  // fewer examples than places: this place sits out
    active.push_back(p);
    ranges.push_back(r);
  }
  // fn(i) for every active place i, on threads of their own; the first error, naming its place.
  auto on_places = [&](const std::function<absl::Status(size_t, Scope*)>& fn) -> absl::Status {
    std::vector<absl::Status> status(active.size());
    auto run = [&](size_t i) {
      status[i] = fn(i, place_scopes_[static_cast<size_t>(active[i])]);
    };
    std::vector<std::thread> threads;
    for (size_t i = 1; i < active.size(); ++i) threads.emplace_back(run, i);
    run(0);
    for (auto& t : threads) t.join();
    for (size_t i = 0; i < active.size(); ++i) {
      if (!status[i].ok()) {
        return absl::Status(status[i].code(),
                            absl::StrCat("place ", active[i], ": ", status[i].message()));
      }
    }
    return absl::OkStatus();
  };
  if (lookup_ops_ > 0 && active.size() > 1) {
    // Feed every place, look up all their ids at once, then run the rest of the place program.
    TS_RETURN_IF_ERROR(on_places(
        [&](size_t i, Scope* s) { return feed(ranges[i].begin, ranges[i].size(), s); }));
    TS_RETURN_IF_ERROR(LookUpForPlaces(active));
    const BlockDesc& place = programs_.place.blocks(0);
    TS_RETURN_IF_ERROR(on_places([&](size_t i, Scope* s) {
      const size_t p = static_cast<size_t>(active[i]);
      const Executor* e = place_executors_[p];
      const PreparedBlock& block = place_blocks_.empty() ? place_block_ : place_blocks_[p];
      absl::Status st = Replicate(s);
      if (st.ok()) {
        e->CreateVariables(block, s);
        st = e->RunOps(block, lookup_ops_, place.ops_size(), s);
      }
      if (st.ok() && options_.after_place) st = options_.after_place(active[i], s);
      return st;
    }));
  } else {
    TS_RETURN_IF_ERROR(on_places([&](size_t i, Scope* s) {
      const size_t p = static_cast<size_t>(active[i]);
      absl::Status st = feed(ranges[i].begin, ranges[i].size(), s);
      if (st.ok()) st = Replicate(s);
      if (st.ok()) {
        st = place_executors_[p]->Run(place_blocks_.empty() ? place_block_ : place_blocks_[p], s);
      }
      if (st.ok() && options_.after_place) st = options_.after_place(active[i], s);
      return st;
    }));
  }

  std::vector<double> weights;
  for (const auto& r : ranges) {
    weights.push_back(static_cast<double>(r.size()) / static_cast<double>(batch_size));
  }
  auto values_of = [&](const std::string& name) {
    std::vector<const Variable*> values;
    for (int p : active) values.push_back(place_scopes_[static_cast<size_t>(p)]->FindVar(name));
    return values;
  };
  for (const auto& name : programs_.reduced) {
    TS_RETURN_IF_ERROR(
        options_.reducer->WeightedSum(name, values_of(name), weights, scope_->Var(name)));
  }
  if (!options_.loss.empty()) {
    TS_RETURN_IF_ERROR(options_.reducer->WeightedSum(options_.loss, values_of(options_.loss),
                                                     weights, scope_->Var(options_.loss)));
  }
  for (const auto& name : options_.concat) {
    std::vector<const Variable*> values = values_of(name);
    bool all = true;
    for (const Variable* v : values) all &= v != nullptr && v->IsInitialized();
    if (!all) continue;
    TS_RETURN_IF_ERROR(options_.reducer->ConcatRows(name, values, scope_->Var(name)));
  }
  return executor_->Run(rest_block_, scope_);
}

}  // namespace tessera
