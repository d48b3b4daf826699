#include "common/ops/embedding_ops.h"

#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/ops/kernel_util.h"

namespace tessera {

namespace {

constexpr int64_t kNoPadding = -1;

// The checked inputs of lookup_table and its gradient.
struct LookupArgs {
  const Tensor* w = nullptr;
  const Tensor* ids = nullptr;
  int64_t vocab = 0;  // W.dim(0)
  int64_t width = 0;  // W.dim(1)
  int64_t padding_idx = kNoPadding;
};

absl::StatusOr<LookupArgs> GetLookupArgs(const OpContext& ctx) {
  LookupArgs a;
  TS_ASSIGN_OR_RETURN(a.w, ctx.Input("W"));
  TS_ASSIGN_OR_RETURN(a.ids, ctx.Input("Ids"));
  if (a.w->rank() != 2) {
    return ctx.Error(absl::StrCat("W '", ctx.InputName("W"), "' is ", a.w->DebugString(),
                                  "; expected a [vocabulary, width] table"));
  }
  TS_RETURN_IF_ERROR(ctx.CheckDType("Ids", *a.ids, INT64));
  a.vocab = a.w->dim(0);
  a.width = a.w->dim(1);
  a.padding_idx = ctx.IntAttr("padding_idx", kNoPadding);
  return a;
}

// Error for the id at position i that is outside [0, V).
absl::Status BadId(const OpContext& ctx, const LookupArgs& a, int64_t i, int64_t id) {
  return ctx.Error(absl::StrCat("Ids '", ctx.InputName("Ids"), "' ", ShapeString(a.ids->shape()),
                                " holds id ", id, " at position ", i, ", outside [0, ", a.vocab,
                                ") of W '", ctx.InputName("W"), "' ", ShapeString(a.w->shape())));
}

// lookup_table: Out[i, :] = W[Ids[i], :], zeros where Ids[i] == padding_idx. Ids [N, 1] or [N]
// (generally [..., 1] or [...]) gives Out [N, D] ([..., D]); Out keeps the sequences (LoD) of
// Ids.
absl::Status LookupTable(OpContext& ctx) {
  TS_ASSIGN_OR_RETURN(LookupArgs a, GetLookupArgs(ctx));
  Shape shape = a.ids->shape();
  if (shape.size() > 1 && shape.back() == 1) shape.pop_back();
  shape.push_back(a.width);
  TS_ASSIGN_OR_RETURN(Tensor * out, ctx.Output("Out"));
  if (out == a.w || out == a.ids) return ctx.Error("Out must not be W or Ids");
  out->Resize(a.w->dtype(), std::move(shape));
  out->set_lod(a.ids->lod());
  return DispatchFloat(ctx, "W", a.w->dtype(), [&](auto tag) -> absl::Status {
    using T = typename decltype(tag)::type;
    const int64_t n = a.ids->numel();
    const int64_t* ids = a.ids->data<int64_t>();
    const T* w = a.w->data<T>();
    T* o = out->data<T>();
    const size_t row_bytes = sizeof(T) * a.width;
    for (int64_t i = 0; i < n; ++i) {
      const int64_t id = ids[i];
      T* dst = o + i * a.width;
      if (id == a.padding_idx && a.padding_idx != kNoPadding) {
        std::memset(dst, 0, row_bytes);
      } else if (id < 0 || id >= a.vocab) {
        return BadId(ctx, a, i, id);
      } else {
        std::memcpy(dst, w + id * a.width, row_bytes);
      }
    }
    return absl::OkStatus();
  });
}

// lookup_table_grad: W@GRAD from Out@GRAD. is_sparse: a SelectedRows with one row per
// non-padding id in batch order (duplicates kept), height V; otherwise a dense [V, D] tensor,
// zero except the scatter-added rows. Padding ids get no gradient.
absl::Status LookupTableGrad(OpContext& ctx) {
  const std::string dout_slot = GradVarName("Out");
  const std::string dw_slot = GradVarName("W");
  if (!ctx.HasOutput(dw_slot)) return absl::OkStatus();
  TS_ASSIGN_OR_RETURN(LookupArgs a, GetLookupArgs(ctx));
  TS_ASSIGN_OR_RETURN(const Tensor* dout, ctx.Input(dout_slot));
  const int64_t n = a.ids->numel();
  if (dout->dtype() != a.w->dtype() || dout->numel() != n * a.width) {
    return ctx.Error(absl::StrCat(dout_slot, " '", ctx.InputName(dout_slot), "' is ",
                                  dout->DebugString(), " but Ids '", ctx.InputName("Ids"), "' ",
                                  ShapeString(a.ids->shape()), " and W '", ctx.InputName("W"), "' ",
                                  a.w->DebugString(), " need ", n, " rows of ", a.width, " ",
                                  DataTypeName(a.w->dtype()), " values"));
  }
  TS_ASSIGN_OR_RETURN(Variable * dw_var, ctx.OutputVar(dw_slot));
  const bool is_sparse = ctx.BoolAttr("is_sparse", false);
  const int64_t* ids = a.ids->data<int64_t>();
  auto is_padding = [&](int64_t id) { return a.padding_idx != kNoPadding && id == a.padding_idx; };
  for (int64_t i = 0; i < n; ++i) {
    if (!is_padding(ids[i]) && (ids[i] < 0 || ids[i] >= a.vocab)) return BadId(ctx, a, i, ids[i]);
  }
  return DispatchFloat(ctx, "W", a.w->dtype(), [&](auto tag) -> absl::Status {
    using T = typename decltype(tag)::type;
    const T* g = dout->data<T>();
    const int64_t width = a.width;
    if (is_sparse) {
      SelectedRows* sr = dw_var->GetMutable<SelectedRows>();
      sr->height = a.vocab;
      sr->rows.clear();
      sr->rows.reserve(n);
      for (int64_t i = 0; i < n; ++i) {
        if (!is_padding(ids[i])) sr->rows.push_back(ids[i]);
      }
      const int64_t kept = static_cast<int64_t>(sr->rows.size());
      sr->value.Resize(a.w->dtype(), {kept, width});
      T* v = sr->value.data<T>();
      if (kept == n) {
        if (n * width > 0) std::memcpy(v, g, sizeof(T) * n * width);
      } else {
        for (int64_t i = 0, k = 0; i < n; ++i) {
          if (is_padding(ids[i])) continue;
          std::memcpy(v + k * width, g + i * width, sizeof(T) * width);
          ++k;
        }
      }
      return absl::OkStatus();
    }
    Tensor* dw = dw_var->GetMutable<Tensor>();
    dw->Resize(a.w->dtype(), {a.vocab, width});
    dw->SetZero();
    T* d = dw->data<T>();
    for (int64_t i = 0; i < n; ++i) {
      if (is_padding(ids[i])) continue;
      T* dst = d + ids[i] * width;
      const T* src = g + i * width;
      for (int64_t j = 0; j < width; ++j) dst[j] += src[j];
    }
    return absl::OkStatus();
  });
}

std::vector<OpDesc> LookupTableGradMaker(const OpDesc& fwd) {
  OpDesc g = MakeOp("lookup_table_grad",
                    {{"W", {OpInput(fwd, "W")}},
                     {"Ids", {OpInput(fwd, "Ids")}},
                     {GradVarName("Out"), {GradVarName(OpOutput(fwd, "Out"))}}},
                    {{GradVarName("W"), {GradVarName(OpInput(fwd, "W"))}}});
  *g.mutable_attrs() = fwd.attrs();
  return {g};
}

}  // namespace

absl::Status RegisterEmbeddingOps(OpRegistry* r) {
  TS_RETURN_IF_ERROR(r->Register("lookup_table", {LookupTable, LookupTableGradMaker}));
  TS_RETURN_IF_ERROR(r->Register("lookup_table_grad", {LookupTableGrad, nullptr}));
  return absl::OkStatus();
}

}  // namespace tessera
