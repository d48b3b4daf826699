#include "common/ops/optimizer_ops.h"

#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/ops/kernel_util.h"
#include "common/ops/optimizer_rows.h"
#include "common/ops/optimizer_rules.h"
#include "common/ops/selected_rows_util.h"

namespace tessera {

namespace {

namespace rules = optimizer_rules;

// The kernels apply the rules of optimizer_rules.h to whole spans of Eigen arrays (vectorized;
// the same bits as the scalar rules, pinned by optimizer_rules_test).
template <typename T>
using Span = Eigen::Map<Eigen::Array<T, Eigen::Dynamic, 1>>;
template <typename T>
using ConstSpan = Eigen::Map<const Eigen::Array<T, Eigen::Dynamic, 1>>;

// The value of a one-element float32/float64 tensor bound to `slot` (LearningRate, Beta1Pow...).
absl::StatusOr<double> ReadScalar(const OpContext& ctx, absl::string_view slot) {
  TS_ASSIGN_OR_RETURN(const Tensor* t, ctx.Input(slot));
  if (t->numel() != 1 || (t->dtype() != FLOAT32 && t->dtype() != FLOAT64)) {
    return ctx.Error(absl::StrCat(slot, " '", ctx.InputName(slot), "' is ", t->DebugString(),
                                  "; expected a one-element float32/float64 tensor"));
  }
  return t->dtype() == FLOAT32 ? static_cast<double>(t->data<float>()[0]) : t->data<double>()[0];
}

// Writes `value` to the output `slot` (if bound) as a `dtype` tensor of `shape`.
absl::Status WriteScalar(OpContext& ctx, absl::string_view slot, DataType dtype, const Shape& shape,
                         double value) {
  if (!ctx.HasOutput(slot)) return absl::OkStatus();
  TS_ASSIGN_OR_RETURN(Tensor * out, ctx.Output(slot));
  out->Resize(dtype, shape);
  if (dtype == FLOAT32) {
    out->data<float>()[0] = static_cast<float>(value);
  } else {
    out->data<double>()[0] = value;
  }
  return absl::OkStatus();
}

// An optimizer state input (Velocity, Moment1, ...): dense, Param's dtype and shape.
absl::StatusOr<const Tensor*> StateInput(const OpContext& ctx, absl::string_view slot,
                                         const Tensor& param) {
  TS_ASSIGN_OR_RETURN(const Tensor* t, ctx.Input(slot));
  TS_RETURN_IF_ERROR(ctx.CheckDType(slot, *t, param.dtype()));
  TS_RETURN_IF_ERROR(CheckSameShape(ctx, slot, *t, "Param", param));
  return t;
}

// The output `out_slot` holding `in`'s values: `in` itself when both slots bind one variable
// (the usual in-place update), else a copy made into the output.
absl::StatusOr<Tensor*> InPlaceOutput(OpContext& ctx, const Tensor& in,
                                      absl::string_view out_slot) {
  TS_ASSIGN_OR_RETURN(Tensor * out, ctx.Output(out_slot));
  if (out != &in) out->CopyFrom(in);
  return out;
}

// A gradient ready to apply to Param: dense, or sparse with merged (sorted unique) rows.
template <typename T>
struct GradView {
  bool sparse = false;
  const T* dense = nullptr;  // Param.numel() values when dense
  SelectedRows merged;       // when sparse
  int64_t width = 0;         // elements per Param row
};

// Validates Grad against Param (dtype, size, row range) and merges duplicate sparse rows.
template <typename T>
absl::Status PrepareGrad(const OpContext& ctx, const Tensor& param, GradView<T>* view) {
  TS_ASSIGN_OR_RETURN(const Variable* gv, ctx.InputVar("Grad"));
  if (const Tensor* g = gv->GetIf<Tensor>()) {
    if (g->initialized() && g->dtype() == param.dtype() && g->numel() == param.numel()) {
      view->dense = g->data<T>();
      return absl::OkStatus();
    }
  }
  // Messages are built only for an error: the sparse path runs on every step too.
  auto gdesc = [&ctx] { return absl::StrCat("Grad '", ctx.InputName("Grad"), "'"); };
  auto pdesc = [&ctx, &param] {
    return absl::StrCat("Param '", ctx.InputName("Param"), "' ", param.DebugString());
  };
  if (const Tensor* g = gv->GetIf<Tensor>()) {
    return ctx.Error(absl::StrCat(gdesc(), " ", g->DebugString(), " does not match ", pdesc()));
  }
  const SelectedRows& sr = gv->Get<SelectedRows>();
  absl::Status valid = ValidateSelectedRows(sr);
  if (!valid.ok()) return ctx.Error(absl::StrCat(gdesc(), ": ", valid.message()));
  if (param.rank() < 1) {
    return ctx.Error(absl::StrCat(gdesc(), " is sparse but ", pdesc(), " has no rows"));
  }
  const int64_t height = param.dim(0);
  const int64_t width = height == 0 ? 0 : param.numel() / height;
  if (sr.value.initialized() &&
      (sr.value.dtype() != param.dtype() || (!sr.rows.empty() && RowWidth(sr) != width))) {
    return ctx.Error(absl::StrCat(gdesc(), " has sparse rows of ", sr.value.DebugString(),
                                  " that do not fit ", pdesc()));
  }
  for (size_t i = 0; i < sr.rows.size(); ++i) {
    if (sr.rows[i] < 0 || sr.rows[i] >= height) {
      return ctx.Error(absl::StrCat(gdesc(), " has row ", sr.rows[i], " (entry ", i,
                                    ") outside [0, ", height, ") of ", pdesc()));
    }
  }
  view->sparse = true;
  view->width = width;
  view->merged = MergeRows(sr);
  return absl::OkStatus();
}

// Calls fn(offset, g, n) for each contiguous run of Param elements the gradient touches:
// elements [offset, offset + n) of Param get gradient values g[0, n).
template <typename T, typename Fn>
void ForEachSpan(const GradView<T>& g, int64_t numel, Fn&& fn) {
  if (!g.sparse) {
    fn(int64_t{0}, g.dense, numel);
    return;
  }
  const T* v = g.merged.value.template data<T>();
  for (size_t i = 0; i < g.merged.rows.size(); ++i) {
    fn(g.merged.rows[i] * g.width, v + static_cast<int64_t>(i) * g.width, g.width);
  }
}

// sgd: ParamOut = Param - lr * (Grad + coeff * Param) (rules::SgdUpdate).
absl::Status Sgd(OpContext& ctx) {
  TS_ASSIGN_OR_RETURN(const Tensor* param_in, ctx.Input("Param"));
  TS_ASSIGN_OR_RETURN(double lr_d, ReadScalar(ctx, "LearningRate"));
  const double coeff_d = ctx.FloatAttr("regularization_coeff", 0.0f);
  return DispatchFloat(ctx, "Param", param_in->dtype(), [&](auto tag) -> absl::Status {
    using T = typename decltype(tag)::type;
    GradView<T> grad;
    TS_RETURN_IF_ERROR(PrepareGrad(ctx, *param_in, &grad));
    TS_ASSIGN_OR_RETURN(Tensor * param, InPlaceOutput(ctx, *param_in, "ParamOut"));
    const T lr = static_cast<T>(lr_d), c = static_cast<T>(coeff_d);
    T* p = param->data<T>();
    ForEachSpan(grad, param->numel(), [&](int64_t off, const T* g, int64_t n) {
      optimizer_rows::SgdRow(p + off, g, n, lr, c);
    });
    return absl::OkStatus();
  });
}

// momentum: v = mu * v + g; p -= lr * v, or with use_nesterov p -= lr * (g + mu * v)
// (rules::MomentumUpdate; g includes the L2 term).
absl::Status Momentum(OpContext& ctx) {
  TS_ASSIGN_OR_RETURN(const Tensor* param_in, ctx.Input("Param"));
  TS_ASSIGN_OR_RETURN(const Tensor* velocity_in, StateInput(ctx, "Velocity", *param_in));
  TS_ASSIGN_OR_RETURN(double lr_d, ReadScalar(ctx, "LearningRate"));
  const double coeff_d = ctx.FloatAttr("regularization_coeff", 0.0f);
  const double mu_d = ctx.FloatAttr("mu", 0.0f);
  const bool nesterov = ctx.BoolAttr("use_nesterov", false);
  return DispatchFloat(ctx, "Param", param_in->dtype(), [&](auto tag) -> absl::Status {
    using T = typename decltype(tag)::type;
    GradView<T> grad;
    TS_RETURN_IF_ERROR(PrepareGrad(ctx, *param_in, &grad));
    TS_ASSIGN_OR_RETURN(Tensor * param, InPlaceOutput(ctx, *param_in, "ParamOut"));
    TS_ASSIGN_OR_RETURN(Tensor * velocity, InPlaceOutput(ctx, *velocity_in, "VelocityOut"));
    const T lr = static_cast<T>(lr_d), c = static_cast<T>(coeff_d), mu = static_cast<T>(mu_d);
    T* p = param->data<T>();
    T* v = velocity->data<T>();
    ForEachSpan(grad, param->numel(), [&](int64_t off, const T* g, int64_t n) {
      optimizer_rows::MomentumRow(p + off, v + off, g, n, lr, mu, c, nesterov);
    });
    return absl::OkStatus();
  });
}

// adam: lr_t = lr * sqrt(1 - b2pow) / (1 - b1pow); m1 = b1 m1 + (1 - b1) g;
// m2 = b2 m2 + (1 - b2) g^2; p -= lr_t m1 / (sqrt(m2) + eps); then the pows advance
// (rules::AdamBiasCorrectedLr, rules::AdamUpdate).
absl::Status Adam(OpContext& ctx) {
  TS_ASSIGN_OR_RETURN(const Tensor* param_in, ctx.Input("Param"));
  TS_ASSIGN_OR_RETURN(const Tensor* m1_in, StateInput(ctx, "Moment1", *param_in));
  TS_ASSIGN_OR_RETURN(const Tensor* m2_in, StateInput(ctx, "Moment2", *param_in));
  TS_ASSIGN_OR_RETURN(double lr_d, ReadScalar(ctx, "LearningRate"));
  TS_ASSIGN_OR_RETURN(double b1pow, ReadScalar(ctx, "Beta1Pow"));
  TS_ASSIGN_OR_RETURN(double b2pow, ReadScalar(ctx, "Beta2Pow"));
  TS_ASSIGN_OR_RETURN(const Tensor* b1pow_t, ctx.Input("Beta1Pow"));
  TS_ASSIGN_OR_RETURN(const Tensor* b2pow_t, ctx.Input("Beta2Pow"));
  const DataType b1pow_type = b1pow_t->dtype(), b2pow_type = b2pow_t->dtype();
  const Shape b1pow_shape = b1pow_t->shape(), b2pow_shape = b2pow_t->shape();
  const double coeff_d = ctx.FloatAttr("regularization_coeff", 0.0f);
  const double beta1 = ctx.FloatAttr("beta1", 0.9f);
  const double beta2 = ctx.FloatAttr("beta2", 0.999f);
  const double eps_d = ctx.FloatAttr("epsilon", 1e-8f);
  if (b1pow == 1.0) {
    return ctx.Error(absl::StrCat("Beta1Pow '", ctx.InputName("Beta1Pow"),
                                  "' is 1; it must start at beta1 (< 1)"));
  }
  const double lr_t_d = rules::AdamBiasCorrectedLr(lr_d, b1pow, b2pow);
  TS_RETURN_IF_ERROR(DispatchFloat(ctx, "Param", param_in->dtype(), [&](auto tag) -> absl::Status {
    using T = typename decltype(tag)::type;
    GradView<T> grad;
    TS_RETURN_IF_ERROR(PrepareGrad(ctx, *param_in, &grad));
    TS_ASSIGN_OR_RETURN(Tensor * param, InPlaceOutput(ctx, *param_in, "ParamOut"));
    TS_ASSIGN_OR_RETURN(Tensor * m1, InPlaceOutput(ctx, *m1_in, "Moment1Out"));
    TS_ASSIGN_OR_RETURN(Tensor * m2, InPlaceOutput(ctx, *m2_in, "Moment2Out"));
    const T lr_t = static_cast<T>(lr_t_d), c = static_cast<T>(coeff_d);
    const T b1 = static_cast<T>(beta1), b2 = static_cast<T>(beta2), eps = static_cast<T>(eps_d);
    T* p = param->data<T>();
    T* m1p = m1->data<T>();
    T* m2p = m2->data<T>();
    ForEachSpan(grad, param->numel(), [&](int64_t off, const T* g, int64_t n) {
      optimizer_rows::AdamRow(p + off, m1p + off, m2p + off, g, n, lr_t, b1, b2, eps, c);
    });
    return absl::OkStatus();
  }));
  TS_RETURN_IF_ERROR(WriteScalar(ctx, "Beta1PowOut", b1pow_type, b1pow_shape, b1pow * beta1));
  return WriteScalar(ctx, "Beta2PowOut", b2pow_type, b2pow_shape, b2pow * beta2);
}

// adagrad: m += g^2; p -= lr * g / (sqrt(m) + eps) (rules::AdagradUpdate).
absl::Status Adagrad(OpContext& ctx) {
  TS_ASSIGN_OR_RETURN(const Tensor* param_in, ctx.Input("Param"));
  TS_ASSIGN_OR_RETURN(const Tensor* moment_in, StateInput(ctx, "Moment", *param_in));
  TS_ASSIGN_OR_RETURN(double lr_d, ReadScalar(ctx, "LearningRate"));
  const double coeff_d = ctx.FloatAttr("regularization_coeff", 0.0f);
  const double eps_d = ctx.FloatAttr("epsilon", 1e-6f);
  return DispatchFloat(ctx, "Param", param_in->dtype(), [&](auto tag) -> absl::Status {
    using T = typename decltype(tag)::type;
    GradView<T> grad;
    TS_RETURN_IF_ERROR(PrepareGrad(ctx, *param_in, &grad));
    TS_ASSIGN_OR_RETURN(Tensor * param, InPlaceOutput(ctx, *param_in, "ParamOut"));
    TS_ASSIGN_OR_RETURN(Tensor * moment, InPlaceOutput(ctx, *moment_in, "MomentOut"));
    const T lr = static_cast<T>(lr_d), c = static_cast<T>(coeff_d), eps = static_cast<T>(eps_d);
    T* p = param->data<T>();
    T* m = moment->data<T>();
    ForEachSpan(grad, param->numel(), [&](int64_t off, const T* g, int64_t n) {
      optimizer_rows::AdagradRow(p + off, m + off, g, n, lr, eps, c);
    });
    return absl::OkStatus();
  });
}

// Sum of squares of a float32/float64 tensor's values.
double SumOfSquares(const Tensor& t) {
  if (t.dtype() == FLOAT32) {
    return ConstSpan<float>(t.data<float>(), t.numel()).template cast<double>().square().sum();
  }
  return ConstSpan<double>(t.data<double>(), t.numel()).square().sum();
}

void ScaleInPlace(Tensor* t, double s) {
  if (t->dtype() == FLOAT32) {
    Span<float>(t->data<float>(), t->numel()) *= static_cast<float>(s);
  } else {
    Span<double>(t->data<double>(), t->numel()) *= s;
  }
}

// clip_by_global_norm: Out (X itself, in place) = X * max_norm / max(max_norm, N), where N is the
// L2 norm of every gradient of X together, dense and sparse (a sparse gradient's repeated rows
// summed first, as the update applies them).
absl::Status ClipByGlobalNorm(OpContext& ctx) {
  const float max_norm = ctx.FloatAttr("max_norm", 0.0f);
  if (!(max_norm > 0) || !std::isfinite(max_norm)) {
    return ctx.Error(absl::StrCat("max_norm ", max_norm, " must be positive and finite"));
  }
  const int n = static_cast<int>(OpInputs(ctx.op(), "X").size());
  double squares = 0;
  std::vector<Variable*> grads;
  for (int i = 0; i < n; ++i) {
    if (ctx.OutputName("Out", i) != ctx.InputName("X", i)) {
      return ctx.Error(absl::StrCat("Out ", i, " '", ctx.OutputName("Out", i),
                                    "' must be X ", i, " '", ctx.InputName("X", i),
                                    "' (clipping is in place)"));
    }
    TS_ASSIGN_OR_RETURN(Variable * g, ctx.OutputVar("Out", i));
    const std::string what = absl::StrCat("X '", ctx.InputName("X", i), "'");
    if (Tensor* t = g->GetIf<Tensor>()) {
      if (!t->initialized() || (t->dtype() != FLOAT32 && t->dtype() != FLOAT64)) {
        return ctx.Error(absl::StrCat(what, " is ", t->DebugString(),
                                      "; expected an initialized float32/float64 gradient"));
      }
      squares += SumOfSquares(*t);
    } else if (SelectedRows* sr = g->GetIf<SelectedRows>()) {
      absl::Status valid = ValidateSelectedRows(*sr);
      if (!valid.ok()) return ctx.Error(absl::StrCat(what, ": ", valid.message()));
      if (!sr->rows.empty()) squares += SumOfSquares(MergeRows(*sr).value);
    } else {
      return ctx.Error(absl::StrCat(what, " is not initialized"));
    }
    grads.push_back(g);
  }
  const double norm = std::sqrt(squares);
  if (!(norm > max_norm)) return absl::OkStatus();  // within the bound (or NaN: left to show)
  const double scale = max_norm / norm;
  for (Variable* g : grads) {
    if (Tensor* t = g->GetIf<Tensor>()) {
      ScaleInPlace(t, scale);
    } else {
      SelectedRows* sr = g->GetIf<SelectedRows>();
      if (sr->value.initialized()) ScaleInPlace(&sr->value, scale);
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status RegisterOptimizerOps(OpRegistry* r) {
  TS_RETURN_IF_ERROR(r->Register("sgd", {Sgd, nullptr}));
  TS_RETURN_IF_ERROR(r->Register("momentum", {Momentum, nullptr}));
  TS_RETURN_IF_ERROR(r->Register("adam", {Adam, nullptr}));
  TS_RETURN_IF_ERROR(r->Register("adagrad", {Adagrad, nullptr}));
  TS_RETURN_IF_ERROR(r->Register("clip_by_global_norm", {ClipByGlobalNorm, nullptr}));
  return absl::OkStatus();
}

}  // namespace tessera
