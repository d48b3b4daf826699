#include "common/ops/dist_ops.h"

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/ops/kernel_util.h"
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

// Sums `src`'s rows with the same id into `dst` (one row per distinct id, in order of first
// appearance; duplicates added in their order of appearance, the same sums as MergeRows).
// `slot_of[i]` is the output row of input row i; `first[i]` whether it is that id's first.
template <typename T>
void MergeInOrder(const T* src, int64_t width, const std::vector<int32_t>& slot_of,
                  const std::vector<uint8_t>& first, T* dst) {
  for (size_t i = 0; i < slot_of.size(); ++i) {
    const T* row = src + static_cast<int64_t>(i) * width;
    T* acc = dst + static_cast<int64_t>(slot_of[i]) * width;
    if (first[i]) {
      std::copy_n(row, width, acc);
    } else {
      for (int64_t j = 0; j < width; ++j) acc[j] += row[j];
    }
  }
}

// The merge plan of `rows`: their distinct ids in order of first appearance (`ids`), for each
// row the index of its id there (`slot_of`) and whether it is the first (`first`); `table` is
// the open-addressing scratch.
void BuildMergePlan(const std::vector<int64_t>& rows, std::vector<int32_t>* table,
                    std::vector<int32_t>* slot_of, std::vector<uint8_t>* first,
                    std::vector<int64_t>* ids) {
  const size_t n = rows.size();
  const IdHashSlots slots(n);
  table->assign(slots.capacity, -1);
  slot_of->resize(n);
  first->resize(n);
  ids->clear();
  ids->reserve(n);
  for (size_t i = 0; i < n; ++i) {
    const int64_t id = rows[i];
    size_t h = slots.Home(id);
    for (;;) {
      const int32_t u = (*table)[h];
      if (u < 0) {
        (*table)[h] = static_cast<int32_t>(ids->size());
        (*slot_of)[i] = static_cast<int32_t>(ids->size());
        (*first)[i] = 1;
        ids->push_back(id);
        break;
      }
      if ((*ids)[u] == id) {
        (*slot_of)[i] = u;
        (*first)[i] = 0;
        break;
      }
      h = (h + 1) & slots.mask();
    }
  }
}

// X's rows merged by id into `out` (whose buffers are reused; not X) without sorting: an
// open-addressing hash of the ids (a sort of 4096 (id, position) pairs was several percent of
// an async trainer's step). Rows come out in order of first appearance; every consumer of
// split_by_shard (send -> the pserver's table, which dedupes by hash; the async communicator,
// which concatenates) is indifferent to row order. Scratch is per thread and kept; so is the
// previous call's plan, which a call with the same ids reuses (the gradients of tables fed by
// the same ids, e.g. a slot's deep and wide tables, are split one after the other).
void MergeByHash(const SelectedRows& x, SelectedRows* out) {
  const size_t n = x.rows.size();
  thread_local std::vector<int32_t> table, slot_of;  // table: index into out->rows, -1 = empty
  thread_local std::vector<uint8_t> first;
  thread_local std::vector<int64_t> planned_rows, planned_ids;  // the plan's input and output
  std::vector<int64_t>& ids = out->rows;
  if (n > 0 && planned_rows.size() == n &&
      std::memcmp(planned_rows.data(), x.rows.data(), n * sizeof(int64_t)) == 0) {
    ids = planned_ids;  // slot_of and first are still this plan's
  } else {
    BuildMergePlan(x.rows, &table, &slot_of, &first, &ids);
    planned_rows = x.rows;
    planned_ids = ids;
  }
  out->height = x.height;
  if (!x.value.initialized()) {  // no rows at all
    out->value = Tensor();
    return;
  }
  Shape shape = x.value.shape();
  shape[0] = static_cast<int64_t>(ids.size());
  out->value.Resize(x.value.dtype(), shape);
  const int64_t width = RowWidth(x);
  if (x.value.dtype() == FLOAT32) {
    MergeInOrder<float>(x.value.data<float>(), width, slot_of, first, out->value.data<float>());
  } else {
    MergeInOrder<double>(x.value.data<double>(), width, slot_of, first,
                         out->value.data<double>());
  }
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
  size_t row_bytes = static_cast<size_t>(width) * SizeOf(dtype);
  Variable* first_out = nullptr;
  if (n == 1) {
    TS_ASSIGN_OR_RETURN(first_out, ctx.OutputVar("Out", 0));
  }
  if (first_out != nullptr && first_out != xv) {
    // One pserver: the merged rows are the output, merged straight into its buffers.
    SelectedRows* out = first_out->GetMutable<SelectedRows>();
    MergeByHash(*x, out);
    if (!out->value.initialized()) out->value.Resize(dtype, {0, width});
    return absl::OkStatus();
  }
  thread_local SelectedRows merged;  // its buffers are kept between steps
  merged.rows.clear();
  if (!x->rows.empty()) MergeByHash(*x, &merged);
  std::vector<std::vector<size_t>> picks(n);
  for (size_t i = 0; i < merged.rows.size(); ++i) {
    picks[ShardOf(merged.rows[i], n, method)].push_back(i);
  }
  for (int k = 0; k < n; ++k) {
    TS_ASSIGN_OR_RETURN(Variable * ov, ctx.OutputVar("Out", k));
    SelectedRows* out = ov->GetMutable<SelectedRows>();
    out->height = x->height;
    out->rows.clear();
    out->value.Resize(dtype, {static_cast<int64_t>(picks[k].size()), width});
    char* dst = static_cast<char*>(out->value.raw_data());
    for (size_t j = 0; j < picks[k].size(); ++j) {
      out->rows.push_back(merged.rows[picks[k][j]]);
      std::memcpy(dst + j * row_bytes,
                  static_cast<const char*>(merged.value.raw_data()) + picks[k][j] * row_bytes,
                  row_bytes);
    }
  }
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
