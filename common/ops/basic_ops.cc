#include "common/ops/basic_ops.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "common/ops/kernel_util.h"

namespace tessera {

namespace {

// fill_constant: Out = value, with attrs shape (ints), value (float), dtype (int, DataType).
absl::Status FillConstant(OpContext& ctx) {
  TS_ASSIGN_OR_RETURN(Tensor * out, ctx.Output("Out"));
  auto shape = ctx.IntsAttr("shape");
  for (int64_t d : shape) {
    if (d < 0) return ctx.Error(absl::StrCat("shape attribute ", ShapeString(shape), " is negative"));
  }
  auto dtype = static_cast<DataType>(ctx.IntAttr("dtype", FLOAT32));
  if (SizeOf(dtype) == 0) return ctx.Error(absl::StrCat("unknown dtype ", dtype));
  double value = ctx.FloatAttr("value", 0.0f);
  out->Resize(dtype, shape);
  return DispatchNumeric(ctx, "Out", dtype, [&](auto tag) {
    using T = typename decltype(tag)::type;
    out->flat<T>().setConstant(static_cast<T>(value));
    return absl::OkStatus();
  });
}

// fill_zeros_like: Out = zeros with X's type and shape.
absl::Status FillZerosLike(OpContext& ctx) {
  TS_ASSIGN_OR_RETURN(const Tensor* x, ctx.Input("X"));
  TS_ASSIGN_OR_RETURN(Tensor * out, ctx.Output("Out"));
  out->Resize(x->dtype(), x->shape());
  out->SetZero();
  return absl::OkStatus();
}

// assign: Out = copy of X (dense or SelectedRows).
absl::Status Assign(OpContext& ctx) {
  TS_ASSIGN_OR_RETURN(const Variable* x, ctx.InputVar("X"));
  TS_ASSIGN_OR_RETURN(Variable * out, ctx.OutputVar("Out"));
  if (x == out) return absl::OkStatus();
  if (const auto* rows = x->GetIf<SelectedRows>()) {
    SelectedRows* o = out->GetMutable<SelectedRows>();
    o->rows = rows->rows;
    o->height = rows->height;
    o->value.CopyFrom(rows->value);
  } else {
    out->GetMutable<Tensor>()->CopyFrom(x->Get<Tensor>());
  }
  return absl::OkStatus();
}

// scale: Out = scale * X + bias (bias_after_scale) or scale * (X + bias).
absl::Status Scale(OpContext& ctx) {
  TS_ASSIGN_OR_RETURN(const Variable* xv, ctx.InputVar("X"));
  TS_ASSIGN_OR_RETURN(Variable * outv, ctx.OutputVar("Out"));
  float scale = ctx.FloatAttr("scale", 1.0f);
  float bias = ctx.FloatAttr("bias", 0.0f);
  bool after = ctx.BoolAttr("bias_after_scale", true);
  const Tensor* x;
  Tensor* out;
  if (const auto* rows = xv->GetIf<SelectedRows>()) {  // scales the values of sparse rows
    if (xv != outv) {
      SelectedRows* o = outv->GetMutable<SelectedRows>();
      o->rows = rows->rows;
      o->height = rows->height;
    }
    x = &rows->value;
    out = &outv->GetMutable<SelectedRows>()->value;
  } else {
    x = &xv->Get<Tensor>();
    out = outv->GetMutable<Tensor>();
  }
  if (out != x) out->Resize(x->dtype(), x->shape());
  return DispatchFloat(ctx, "X", x->dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    auto o = out->flat<T>();
    auto in = x->flat<T>();
    if (after) {
      o = in * static_cast<T>(scale) + static_cast<T>(bias);
    } else {
      o = (in + static_cast<T>(bias)) * static_cast<T>(scale);
    }
    return absl::OkStatus();
  });
}

// Appends the rows of `in` to `out` (same row width and dtype).
absl::Status AppendRows(const OpContext& ctx, const SelectedRows& in, SelectedRows* out) {
  if (out->value.initialized() && !out->rows.empty()) {
    const Tensor& a = out->value;
    if (a.dtype() != in.value.dtype() || a.numel() / std::max<int64_t>(1, a.dim(0)) !=
                                             in.value.numel() / std::max<int64_t>(1, in.value.dim(0))) {
      return ctx.Error(absl::StrCat("sparse inputs disagree: ", a.DebugString(), " vs ",
                                    in.value.DebugString()));
    }
  }
  Tensor merged;
  Shape shape = in.value.shape();
  shape[0] = static_cast<int64_t>(out->rows.size() + in.rows.size());
  merged.Resize(in.value.dtype(), shape);
  size_t old_bytes = out->rows.empty() ? 0 : out->value.nbytes();
  if (old_bytes > 0) std::memcpy(merged.raw_data(), out->value.raw_data(), old_bytes);
  std::memcpy(static_cast<char*>(merged.raw_data()) + old_bytes, in.value.raw_data(),
              in.value.nbytes());
  out->value = merged;
  out->rows.insert(out->rows.end(), in.rows.begin(), in.rows.end());
  out->height = std::max(out->height, in.height);
  return absl::OkStatus();
}

// Adds sparse rows into a dense tensor: dense[rows[i]] += value[i].
template <typename T>
absl::Status AddRowsToDense(const OpContext& ctx, const SelectedRows& sr, Tensor* dense) {
  int64_t width = dense->numel() / std::max<int64_t>(1, dense->dim(0));
  if (sr.value.dtype() != dense->dtype() ||
      sr.value.numel() != static_cast<int64_t>(sr.rows.size()) * width) {
    return ctx.Error(absl::StrCat("sparse input ", sr.value.DebugString(),
                                  " does not fit dense sum ", dense->DebugString()));
  }
  T* d = dense->data<T>();
  const T* v = sr.value.data<T>();
  for (size_t i = 0; i < sr.rows.size(); ++i) {
    int64_t r = sr.rows[i];
    if (r < 0 || r >= dense->dim(0)) {
      return ctx.Error(absl::StrCat("sparse row ", r, " is outside [0, ", dense->dim(0), ")"));
    }
    for (int64_t j = 0; j < width; ++j) d[r * width + j] += v[i * width + j];
  }
  return absl::OkStatus();
}

// sum: Out = sum of X[i]. All-sparse inputs give a sparse output (rows concatenated, not
// merged); otherwise dense inputs are added and sparse ones scattered in.
absl::Status Sum(OpContext& ctx) {
  int n = static_cast<int>(OpInputs(ctx.op(), "X").size());
  if (n == 0) return ctx.Error("needs at least one input X");
  std::vector<const Variable*> ins;
  bool all_sparse = true;
  const Tensor* first_dense = nullptr;
  for (int i = 0; i < n; ++i) {
    TS_ASSIGN_OR_RETURN(const Variable* v, ctx.InputVar("X", i));
    ins.push_back(v);
    if (const Tensor* t = v->GetIf<Tensor>()) {
      all_sparse = false;
      if (first_dense == nullptr) first_dense = t;
    }
  }
  TS_ASSIGN_OR_RETURN(Variable * outv, ctx.OutputVar("Out"));
  if (all_sparse) {
    SelectedRows result;
    for (const Variable* v : ins) TS_RETURN_IF_ERROR(AppendRows(ctx, v->Get<SelectedRows>(), &result));
    *outv->GetMutable<SelectedRows>() = std::move(result);
    return absl::OkStatus();
  }
  // Summed into Out's own buffer (no allocation per step: a pserver sums every dense gradient's
  // trainer copies) when nothing else holds it, it is no input, and nothing can fail once it is
  // written (dense float inputs, checked first); else into a new buffer, Out untouched on error.
  for (int i = 0; i < n; ++i) {
    const Tensor* t = ins[i]->GetIf<Tensor>();
    if (t != nullptr &&
        (t->shape() != first_dense->shape() || t->dtype() != first_dense->dtype())) {
      return ctx.Error(absl::StrCat("X[", i, "] '", ctx.InputName("X", i), "' is ",
                                    t->DebugString(), " but X[0]-like inputs are ",
                                    first_dense->DebugString()));
    }
  }
  const DataType dtype = first_dense->dtype();
  bool in_place = dtype == FLOAT32 || dtype == FLOAT64;
  for (const Variable* v : ins) in_place = in_place && v != outv && v->Is<Tensor>();
  Tensor fresh;
  Tensor* out = in_place ? outv->GetMutable<Tensor>() : nullptr;
  in_place = in_place && !out->buffer_shared();
  Tensor& acc = in_place ? *out : fresh;
  acc.Resize(first_dense->dtype(), first_dense->shape());
  acc.SetZero();
  return DispatchFloat(ctx, "X", acc.dtype(), [&](auto tag) -> absl::Status {
    using T = typename decltype(tag)::type;
    for (int i = 0; i < n; ++i) {
      if (const Tensor* t = ins[i]->GetIf<Tensor>()) {
        acc.flat<T>() += t->flat<T>();
      } else {
        TS_RETURN_IF_ERROR(AddRowsToDense<T>(ctx, ins[i]->Get<SelectedRows>(), &acc));
      }
    }
    if (!in_place) *outv->GetMutable<Tensor>() = std::move(fresh);
    return absl::OkStatus();
  });
}

// lr_exponential_decay: Out = learning_rate * decay_rate^(Step / decay_steps) (the exponent
// floored when staircase), then StepOut = Step + step_increment (default 1). Step, Out: [1].
absl::Status LrExponentialDecay(OpContext& ctx) {
  TS_ASSIGN_OR_RETURN(const Tensor* step, ctx.Input("Step"));
  TS_RETURN_IF_ERROR(ctx.CheckDType("Step", *step, FLOAT32));
  if (step->numel() != 1) return ctx.Error(absl::StrCat("Step must have 1 element, is ", step->DebugString()));
  const int64_t decay_steps = ctx.IntAttr("decay_steps", 1);
  if (decay_steps < 1) return ctx.Error(absl::StrCat("decay_steps ", decay_steps, " must be >= 1"));
  const double t = step->data<float>()[0];
  double exponent = t / static_cast<double>(decay_steps);
  if (ctx.BoolAttr("staircase", false)) exponent = std::floor(exponent + 1e-9);
  const double lr = ctx.FloatAttr("learning_rate", 0.01f) *
                    std::pow(static_cast<double>(ctx.FloatAttr("decay_rate", 1.0f)), exponent);
  TS_ASSIGN_OR_RETURN(Tensor * out, ctx.Output("Out"));
  out->Resize(FLOAT32, {1});
  out->data<float>()[0] = static_cast<float>(lr);
  TS_ASSIGN_OR_RETURN(Tensor * step_out, ctx.Output("StepOut"));
  float next = static_cast<float>(t + ctx.FloatAttr("step_increment", 1.0f));
  step_out->Resize(FLOAT32, {1});
  step_out->data<float>()[0] = next;
  return absl::OkStatus();
}

std::vector<OpDesc> ScaleGrad(const OpDesc& fwd) {
  OpDesc g = MakeOp("scale", {{"X", {GradVarName(OpOutput(fwd, "Out"))}}},
                    {{"Out", {GradVarName(OpInput(fwd, "X"))}}});
  SetAttr(&g, "scale", static_cast<float>(GetFloatAttr(fwd, "scale", 1.0)));
  return {g};
}

std::vector<OpDesc> SumGrad(const OpDesc& fwd) {
  std::vector<OpDesc> out;
  std::string dout = GradVarName(OpOutput(fwd, "Out"));
  for (const auto& x : OpInputs(fwd, "X")) {
    out.push_back(MakeOp("assign", {{"X", {dout}}}, {{"Out", {GradVarName(x)}}}));
  }
  return out;
}

std::vector<OpDesc> AssignGrad(const OpDesc& fwd) {
  return {MakeOp("assign", {{"X", {GradVarName(OpOutput(fwd, "Out"))}}},
                 {{"Out", {GradVarName(OpInput(fwd, "X"))}}})};
}

}  // namespace

absl::Status RegisterBasicOps(OpRegistry* r) {
  TS_RETURN_IF_ERROR(r->Register("fill_constant", {FillConstant, nullptr}));
  TS_RETURN_IF_ERROR(r->Register("fill_zeros_like", {FillZerosLike, nullptr}));
  TS_RETURN_IF_ERROR(r->Register("assign", {Assign, AssignGrad}));
  TS_RETURN_IF_ERROR(r->Register("scale", {Scale, ScaleGrad}));
  TS_RETURN_IF_ERROR(r->Register("sum", {Sum, SumGrad}));
  TS_RETURN_IF_ERROR(r->Register("lr_exponential_decay", {LrExponentialDecay, nullptr}));
  return absl::OkStatus();
}

}  // namespace tessera
