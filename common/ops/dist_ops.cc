#include "common/ops/dist_ops.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/ops/kernel_util.h"
#include "common/ops/merge_plan.h"
#include "common/ops/selected_rows_util.h"
#include "common/ops/sharding.h"

namespace tessera {

namespace {

// split_selected_rows: X (SelectedRows of height H) -> Out[i] holding the rows that fall in
// [start_i, start_i + height_sections[i]), with ids made relative to start_i and height
// height_sections[i]. The sections must sum to H.
absl::Status SplitSelectedRows(OpContext& ctx) {
  TS_ASSIGN_OR_RETURN(const Variable* xv, ctx.InputVar("X"));
  const SelectedRows* x = xv->GetIf<SelectedRows>();
  if (x == nullptr) {
    return ctx.Error(absl::StrCat("X '", ctx.InputName("X"), "' is not a SelectedRows"));
  }
  TS_RETURN_IF_ERROR(ValidateSelectedRows(*x));
  auto sections = ctx.IntsAttr("height_sections");
  int n = static_cast<int>(OpOutputs(ctx.op(), "Out").size());
  if (static_cast<int>(sections.size()) != n) {
    return ctx.Error(absl::StrCat("height_sections [", absl::StrJoin(sections, ", "), "] has ",
                                  sections.size(), " entries for ", n, " outputs"));
  }
  int64_t total = 0;
  std::vector<int64_t> starts;
  for (int64_t s : sections) {
    starts.push_back(total);
    total += s;
  }
  if (x->height != 0 && total != x->height) {
    return ctx.Error(absl::StrCat("height_sections [", absl::StrJoin(sections, ", "), "] sum to ",
                                  total, ", X has height ", x->height));
  }
  int64_t width = RowWidth(*x);
  size_t elem = x->value.initialized() ? SizeOf(x->value.dtype()) : 4;
  // Which output each row goes to.
  std::vector<std::vector<size_t>> picks(n);
  for (size_t i = 0; i < x->rows.size(); ++i) {
    int64_t r = x->rows[i];
    if (r < 0 || r >= total) {
      return ctx.Error(absl::StrCat("row ", r, " of X is outside [0, ", total, ")"));
    }
    int k =
        static_cast<int>(std::upper_bound(starts.begin(), starts.end(), r) - starts.begin()) - 1;
    picks[k].push_back(i);
  }
  for (int k = 0; k < n; ++k) {
    if (!ctx.HasOutput("Out") || OpOutputs(ctx.op(), "Out")[k] == kEmptyVarName) continue;
    TS_ASSIGN_OR_RETURN(Variable * ov, ctx.OutputVar("Out", k));
    SelectedRows* out = ov->GetMutable<SelectedRows>();
    out->height = sections[k];
    out->rows.clear();
    Shape shape = x->value.initialized() ? x->value.shape() : Shape{0, width};
    shape[0] = static_cast<int64_t>(picks[k].size());
    out->value.Resize(x->value.initialized() ? x->value.dtype() : FLOAT32, shape);
    char* dst = static_cast<char*>(out->value.raw_data());
    const char* src = static_cast<const char*>(x->value.raw_data());
    size_t row_bytes = static_cast<size_t>(width) * elem;
    for (size_t j = 0; j < picks[k].size(); ++j) {
      out->rows.push_back(x->rows[picks[k][j]] - starts[k]);
      std::memcpy(dst + j * row_bytes, src + picks[k][j] * row_bytes, row_bytes);
    }
  }
  return absl::OkStatus();
}

// lookup_sparse_grad: the gradient of a distributed table lookup, which needs no table:
// Ids [N] or [N, 1] int64 and Out@GRAD [N, D] -> W@GRAD SelectedRows (rows = ids in batch
// order, height 0: ids are any int64).
absl::Status LookupSparseGrad(OpContext& ctx) {
  TS_ASSIGN_OR_RETURN(const Tensor* ids, ctx.Input("Ids"));
  TS_ASSIGN_OR_RETURN(const Tensor* dout, ctx.Input("Out@GRAD"));
  TS_RETURN_IF_ERROR(ctx.CheckDType("Ids", *ids, INT64));
  if (dout->rank() < 1 || dout->dim(0) != ids->numel()) {
    return ctx.Error(
        absl::StrCat("Out@GRAD ", dout->DebugString(), " does not match ", ids->numel(), " ids"));
  }
  if (!ctx.HasOutput("W@GRAD")) return absl::OkStatus();
  TS_ASSIGN_OR_RETURN(Variable * out, ctx.OutputVar("W@GRAD"));
  SelectedRows* sr = out->GetMutable<SelectedRows>();
  sr->height = 0;
  sr->rows.assign(ids->data<int64_t>(), ids->data<int64_t>() + ids->numel());
  sr->value.CopyFrom(*dout);
  return absl::OkStatus();
}

// Sums X's rows with the same id into their output rows (by `plan`, X's merge plan): an id's
// first row is copied, the later ones added in their order of appearance (the same sums as
// MergeRows). `row_of(u)` is where distinct id u's row goes (of X's dtype, `width` elements).
template <typename T, typename RowOf>
void MergeInOrder(const T* src, int64_t width, const MergePlan& plan, const RowOf& row_of) {
  for (size_t i = 0; i < plan.slot_of.size(); ++i) {
    const T* row = src + static_cast<int64_t>(i) * width;
    T* acc = static_cast<T*>(row_of(plan.slot_of[i]));
    if (plan.first[i]) {
      std::copy_n(row, width, acc);
    } else {
      for (int64_t j = 0; j < width; ++j) acc[j] += row[j];
    }
  }
}
// MergeInOrder on X's values, float32 or float64.
template <typename RowOf>
void MergeValues(const SelectedRows& x, int64_t width, const MergePlan& plan, const RowOf& row_of) {
  if (x.value.dtype() == FLOAT32) {
    MergeInOrder<float>(x.value.data<float>(), width, plan, row_of);
  } else {
    MergeInOrder<double>(x.value.data<double>(), width, plan, row_of);
  }
}

// X's rows merged by id into `out` (whose buffers are reused; not X) without sorting: an
// open-addressing hash of the ids (a sort of 4096 (id, position) pairs was several percent of
// an async trainer's step). Rows come out in order of first appearance; every consumer of
// split_by_shard (send -> the pserver's table, which dedupes by hash; the async communicator,
// which concatenates) is indifferent to row order.
void MergeByHash(const SelectedRows& x, SelectedRows* out) {
  const MergePlan& plan = PlanMerge(x.rows);
  out->rows = plan.ids;
  out->height = x.height;
  if (!x.value.initialized()) {  // no rows at all
    out->value = Tensor();
    return;
  }
  Shape shape = x.value.shape();
  shape[0] = static_cast<int64_t>(plan.ids.size());
  out->value.Resize(x.value.dtype(), shape);
  const int64_t width = RowWidth(x);
  char* dst = static_cast<char*>(out->value.raw_data());
  const size_t row_bytes = static_cast<size_t>(width) * SizeOf(x.value.dtype());
  MergeValues(x, width, plan,
              [&](int32_t u) -> void* { return dst + static_cast<size_t>(u) * row_bytes; });
}

// split_by_shard: X (SelectedRows of a distributed table) -> Out[k] the rows whose id belongs to
// shard k (attrs num_shards = #outputs, shard_method "hash"|"mod"), duplicate ids merged (sum,
// in order of appearance), ids kept as they are, rows in order of first appearance.
absl::Status SplitByShard(OpContext& ctx) {
  TS_ASSIGN_OR_RETURN(const Variable* xv, ctx.InputVar("X"));
  const SelectedRows* x = xv->GetIf<SelectedRows>();
  if (x == nullptr) {
    return ctx.Error(absl::StrCat("X '", ctx.InputName("X"), "' is not a SelectedRows"));
  }
  ShardMethod method;
  std::string method_name = ctx.StringAttr("shard_method", "hash");
  if (!ParseShardMethod(method_name, &method)) {
    return ctx.Error(absl::StrCat("shard_method '", method_name, "' is not hash or mod"));
  }
  int n = static_cast<int>(OpOutputs(ctx.op(), "Out").size());
  if (n < 1) return ctx.Error("needs at least one output");
  if (!x->rows.empty()) TS_RETURN_IF_ERROR(ValidateSelectedRows(*x));
  int64_t width = 1;  // elements per row: the value's dims after the first
  if (x->value.initialized()) {
    for (int d = 1; d < x->value.rank(); ++d) width *= x->value.dim(d);
  }
  DataType dtype = x->value.initialized() ? x->value.dtype() : FLOAT32;
  std::vector<Variable*> out_vars(n);
  bool in_place = false;
  for (int k = 0; k < n; ++k) {
    TS_ASSIGN_OR_RETURN(out_vars[k], ctx.OutputVar("Out", k));
    in_place |= out_vars[k] == xv;
  }
  if (in_place) {
    // An output is X itself: merge from a deep copy of X (resizing that output would resize X,
    // and Tensor assignment would share X's buffer). No transpiled program does this.
    thread_local SelectedRows copy;
    copy.height = x->height;
    copy.rows = x->rows;
    if (x->value.initialized()) {
      copy.value.CopyFrom(x->value);
    } else {
      copy.value = Tensor();
    }
    x = &copy;
  }
  if (n == 1) {
    // One pserver: the merged rows are the output, merged straight into its buffers.
    SelectedRows* out = out_vars[0]->GetMutable<SelectedRows>();
    MergeByHash(*x, out);
    if (!out->value.initialized()) out->value.Resize(dtype, {0, width});
    return absl::OkStatus();
  }
  // Each distinct id's shard and place there, then the rows merged straight into the outputs.
  const MergePlan* plan = x->rows.empty() ? nullptr : &PlanMerge(x->rows);
  const size_t distinct = plan == nullptr ? 0 : plan->ids.size();
  thread_local std::vector<int> shard_of;
  thread_local std::vector<int64_t> index;
  shard_of.resize(distinct);
  index.resize(distinct);
  std::vector<int64_t> count(n, 0);
  for (size_t u = 0; u < distinct; ++u) {
    shard_of[u] = ShardOf(plan->ids[u], n, method);
    index[u] = count[shard_of[u]]++;
  }
  std::vector<SelectedRows*> outs(n);
  for (int k = 0; k < n; ++k) {
    outs[k] = out_vars[k]->GetMutable<SelectedRows>();
    outs[k]->height = x->height;
    outs[k]->rows.resize(static_cast<size_t>(count[k]));
    outs[k]->value.Resize(dtype, {count[k], width});
  }
  for (size_t u = 0; u < distinct; ++u) outs[shard_of[u]]->rows[index[u]] = plan->ids[u];
  if (distinct == 0 || !x->value.initialized()) return absl::OkStatus();
  std::vector<char*> base(n);
  for (int k = 0; k < n; ++k) base[k] = static_cast<char*>(outs[k]->value.raw_data());
  const size_t row_bytes = static_cast<size_t>(width) * SizeOf(dtype);
  MergeValues(*x, width, *plan, [&](int32_t u) -> void* {
    return base[static_cast<size_t>(shard_of[u])] + static_cast<size_t>(index[u]) * row_bytes;
  });
  return absl::OkStatus();
}

}  // namespace

absl::Status RegisterDistOps(OpRegistry* r) {
  TS_RETURN_IF_ERROR(r->Register("split_selected_rows", {SplitSelectedRows, nullptr}));
  TS_RETURN_IF_ERROR(r->Register("lookup_sparse_grad", {LookupSparseGrad, nullptr}));
  TS_RETURN_IF_ERROR(r->Register("split_by_shard", {SplitByShard, nullptr}));
  return absl::OkStatus();
}

}  // namespace tessera
