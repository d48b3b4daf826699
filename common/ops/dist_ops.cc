#include "common/ops/dist_ops.h"

#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/ops/kernel_util.h"
#include "common/ops/selected_rows_util.h"

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
    return ctx.Error(absl::StrCat("height_sections [", absl::StrJoin(sections, ", "),
                                  "] sum to ", total, ", X has height ", x->height));
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
    int k = static_cast<int>(std::upper_bound(starts.begin(), starts.end(), r) - starts.begin()) - 1;
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

}  // namespace

absl::Status RegisterDistOps(OpRegistry* r) {
  TS_RETURN_IF_ERROR(r->Register("split_selected_rows", {SplitSelectedRows, nullptr}));
  return absl::OkStatus();
}

}  // namespace tessera
