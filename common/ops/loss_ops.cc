#include "common/ops/loss_ops.h"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "Eigen/Core"
#include "absl/strings/str_cat.h"
#include "common/ops/kernel_util.h"

namespace tessera {

namespace {

// ---------------------------------------------------------------------------------------------
// softmax_with_cross_entropy: Logits [..., C] -> Softmax [..., C], Loss [..., 1].
// Hard labels (soft_label=false): Label [..., 1] int64/int32 class ids; a row whose label equals
// ignore_index (default -100) has loss 0 and gradient 0. Soft labels: Label [..., C] float,
// Loss = -sum_j Label_j * log(Softmax_j).

struct SoftmaxDims {
  int64_t rows, classes;
};

absl::StatusOr<SoftmaxDims> CheckSoftmaxLabel(const OpContext& ctx, const Tensor& logits,
                                              absl::string_view logits_slot, const Tensor& label,
                                              bool soft) {
  if (logits.rank() < 2) {
    return ctx.Error(absl::StrCat(logits_slot, " '", ctx.InputName(logits_slot), "' ",
                                  ShapeString(logits.shape()), " must have rank >= 2 ([N, C])"));
  }
  SoftmaxDims d;
  d.classes = logits.dim(logits.rank() - 1);
  d.rows = logits.numel() / std::max<int64_t>(1, d.classes);
  if (d.classes == 0) d.rows = NumElements(Shape(logits.shape().begin(), logits.shape().end() - 1));
  Shape want = logits.shape();
  if (soft) {
    if (label.dtype() != logits.dtype()) {
      return ctx.Error(absl::StrCat(
          "soft Label '", ctx.InputName("Label"), "' is ", DataTypeName(label.dtype()), " but ",
          logits_slot, " '", ctx.InputName(logits_slot), "' is ", DataTypeName(logits.dtype())));
    }
  } else {
    if (label.dtype() != INT64 && label.dtype() != INT32) {
      return ctx.Error(absl::StrCat("Label '", ctx.InputName("Label"), "' is ",
                                    DataTypeName(label.dtype()),
                                    "; hard labels must be int64 or int32 (set soft_label for "
                                    "probabilities)"));
    }
    want.back() = 1;
  }
  if (label.shape() != want) {
    return ctx.Error(absl::StrCat("Label '", ctx.InputName("Label"), "' ",
                                  ShapeString(label.shape()), " does not fit ", logits_slot, " '",
                                  ctx.InputName(logits_slot), "' ", ShapeString(logits.shape()),
                                  "; expected ", ShapeString(want)));
  }
  return d;
}

// Class id of row i (hard labels).
inline int64_t LabelAt(const Tensor& label, int64_t i) {
  return label.dtype() == INT64 ? label.data<int64_t>()[i]
                                : static_cast<int64_t>(label.data<int32_t>()[i]);
}

absl::Status LabelOutOfRange(const OpContext& ctx, int64_t value, int64_t row, int64_t classes) {
  return ctx.Error(absl::StrCat("Label '", ctx.InputName("Label"), "' has value ", value,
                                " at row ", row, ", outside [0, ", classes, ")"));
}

absl::Status SoftmaxWithCrossEntropy(OpContext& ctx) {
  TS_ASSIGN_OR_RETURN(const Tensor* logits, ctx.Input("Logits"));
  TS_ASSIGN_OR_RETURN(const Tensor* label, ctx.Input("Label"));
  const bool soft = ctx.BoolAttr("soft_label", false);
  const int64_t ignore_index = ctx.IntAttr("ignore_index", -100);
  TS_ASSIGN_OR_RETURN(SoftmaxDims d, CheckSoftmaxLabel(ctx, *logits, "Logits", *label, soft));
  TS_ASSIGN_OR_RETURN(Tensor * softmax, ctx.Output("Softmax"));
  TS_ASSIGN_OR_RETURN(Tensor * loss, ctx.Output("Loss"));
  if (softmax == logits || softmax == label || loss == logits || loss == label || softmax == loss) {
    return ctx.Error("Softmax and Loss must be distinct variables, not inputs");
  }
  softmax->Resize(logits->dtype(), logits->shape());
  Shape loss_shape = logits->shape();
  loss_shape.back() = 1;
  loss->Resize(logits->dtype(), std::move(loss_shape));
  return DispatchFloat(ctx, "Logits", logits->dtype(), [&](auto tag) -> absl::Status {
    using T = typename decltype(tag)::type;
    const int64_t c = d.classes;
    T* l = loss->data<T>();
    for (int64_t i = 0; i < d.rows; ++i) {
      ConstEigenVector<T> x(logits->data<T>() + i * c, c);
      EigenVector<T> s(softmax->data<T>() + i * c, c);
      if (c == 0) {
        l[i] = 0;
        continue;
      }
      const T mx = x.maxCoeff();
      s = (x - mx).exp();
      const T sum = s.sum();
      s *= T(1) / sum;
      const T log_sum = std::log(sum);  // loss_j = log_sum - (x_j - mx)
      if (soft) {
        ConstEigenVector<T> z(label->data<T>() + i * c, c);
        l[i] = (z * (log_sum - (x - mx))).sum();
      } else {
        int64_t k = LabelAt(*label, i);
        if (k == ignore_index) {
          l[i] = 0;
        } else if (k < 0 || k >= c) {
          return LabelOutOfRange(ctx, k, i, c);
        } else {
          l[i] = log_sum - (x[k] - mx);
        }
      }
    }
    return absl::OkStatus();
  });
}

// Logits@GRAD = (Softmax * sum(Label) - Label) * Loss@GRAD per row for soft labels (the exact
// gradient; equals Softmax - Label when each label row sums to 1), and
// (Softmax - onehot(Label)) * Loss@GRAD for hard labels (0 for ignored rows).
absl::Status SoftmaxWithCrossEntropyGrad(OpContext& ctx) {
  if (!ctx.HasOutput("Logits@GRAD")) return absl::OkStatus();
  TS_ASSIGN_OR_RETURN(const Tensor* softmax, ctx.Input("Softmax"));
  TS_ASSIGN_OR_RETURN(const Tensor* label, ctx.Input("Label"));
  const bool soft = ctx.BoolAttr("soft_label", false);
  const int64_t ignore_index = ctx.IntAttr("ignore_index", -100);
  TS_ASSIGN_OR_RETURN(SoftmaxDims d, CheckSoftmaxLabel(ctx, *softmax, "Softmax", *label, soft));
  TS_ASSIGN_OR_RETURN(const Tensor* dloss, GradInput(ctx, "Loss@GRAD", softmax->dtype(), d.rows));
  TS_ASSIGN_OR_RETURN(Tensor * dx, ctx.Output("Logits@GRAD"));
  if (dx == label || dx == dloss) return ctx.Error("Logits@GRAD must not be Label or Loss@GRAD");
  if (dx != softmax) dx->Resize(softmax->dtype(), softmax->shape());  // may reuse Softmax
  return DispatchFloat(ctx, "Softmax", softmax->dtype(), [&](auto tag) -> absl::Status {
    using T = typename decltype(tag)::type;
    const int64_t c = d.classes;
    const T* g = dloss->data<T>();
    for (int64_t i = 0; i < d.rows; ++i) {
      ConstEigenVector<T> s(softmax->data<T>() + i * c, c);
      EigenVector<T> o(dx->data<T>() + i * c, c);
      if (soft) {
        ConstEigenVector<T> z(label->data<T>() + i * c, c);
        o = (s * z.sum() - z) * g[i];
        continue;
      }
      int64_t k = LabelAt(*label, i);
      if (k == ignore_index) {
        o.setZero();
      } else if (k < 0 || k >= c) {
        return LabelOutOfRange(ctx, k, i, c);
      } else {
        o = s * g[i];
        o[k] -= g[i];
      }
    }
    return absl::OkStatus();
  });
}

std::vector<OpDesc> SoftmaxWithCrossEntropyGradMaker(const OpDesc& fwd) {
  OpDesc g = MakeOp("softmax_with_cross_entropy_grad",
                    {{"Softmax", OpOutputs(fwd, "Softmax")},
                     {"Label", OpInputs(fwd, "Label")},
                     {GradVarName("Loss"), {GradVarName(OpOutput(fwd, "Loss"))}}},
                    {{GradVarName("Logits"), {GradVarName(OpInput(fwd, "Logits"))}}});
  *g.mutable_attrs() = fwd.attrs();
  return {g};
}

// ---------------------------------------------------------------------------------------------
// sigmoid_cross_entropy_with_logits: X logits, Label z (same shape, in [0, 1]) ->
// Out = max(x, 0) - x * z + log(1 + exp(-|x|)). Elements whose label equals ignore_index
// (default -100) give 0; with normalize=true Out is divided by the number of other elements.

template <typename T>
T SigmoidCeScale(const T* z, int64_t n, bool normalize, int64_t ignore_index) {
  if (!normalize) return T(1);
  int64_t count = 0;
  for (int64_t i = 0; i < n; ++i) count += z[i] != static_cast<T>(ignore_index);
  return T(1) / static_cast<T>(std::max<int64_t>(count, 1));
}

absl::Status SigmoidCrossEntropyWithLogits(OpContext& ctx) {
  TS_ASSIGN_OR_RETURN(const Tensor* x, ctx.Input("X"));
  TS_ASSIGN_OR_RETURN(const Tensor* label, ctx.Input("Label"));
  TS_RETURN_IF_ERROR(CheckSameShape(ctx, "X", *x, "Label", *label));
  TS_RETURN_IF_ERROR(ctx.CheckDType("Label", *label, x->dtype()));
  const int64_t ignore_index = ctx.IntAttr("ignore_index", -100);
  const bool normalize = ctx.BoolAttr("normalize", false);
  TS_ASSIGN_OR_RETURN(Tensor * out, ctx.Output("Out"));
  if (out != x && out != label) out->Resize(x->dtype(), x->shape());
  return DispatchFloat(ctx, "X", x->dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    const int64_t n = x->numel();
    const T* xp = x->data<T>();
    const T* zp = label->data<T>();
    T* op = out->data<T>();
    const T scale = SigmoidCeScale(zp, n, normalize, ignore_index);
    const T ignored = static_cast<T>(ignore_index);
    for (int64_t i = 0; i < n; ++i) {
      const T v = xp[i], z = zp[i];
      T loss = std::max(v, T(0)) - v * z + std::log1p(std::exp(-std::abs(v)));
      op[i] = z == ignored ? T(0) : loss * scale;
    }
    return absl::OkStatus();
  });
}

// X@GRAD = (sigmoid(x) - z) * Out@GRAD (0 where ignored; scaled as the forward).
absl::Status SigmoidCrossEntropyWithLogitsGrad(OpContext& ctx) {
  if (!ctx.HasOutput("X@GRAD")) return absl::OkStatus();
  TS_ASSIGN_OR_RETURN(const Tensor* x, ctx.Input("X"));
  TS_ASSIGN_OR_RETURN(const Tensor* label, ctx.Input("Label"));
  TS_RETURN_IF_ERROR(CheckSameShape(ctx, "X", *x, "Label", *label));
  TS_RETURN_IF_ERROR(ctx.CheckDType("Label", *label, x->dtype()));
  TS_ASSIGN_OR_RETURN(const Tensor* dout, GradInput(ctx, "Out@GRAD", x->dtype(), x->numel()));
  const int64_t ignore_index = ctx.IntAttr("ignore_index", -100);
  const bool normalize = ctx.BoolAttr("normalize", false);
  TS_ASSIGN_OR_RETURN(Tensor * dx, ctx.Output("X@GRAD"));
  if (dx == x || dx == label) return ctx.Error("X@GRAD must not be X or Label");
  if (dx != dout) dx->Resize(x->dtype(), x->shape());
  return DispatchFloat(ctx, "X", x->dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    const int64_t n = x->numel();
    const T* xp = x->data<T>();
    const T* zp = label->data<T>();
    const T* gp = dout->data<T>();
    T* dp = dx->data<T>();
    const T scale = SigmoidCeScale(zp, n, normalize, ignore_index);
    const T ignored = static_cast<T>(ignore_index);
    for (int64_t i = 0; i < n; ++i) {
      const T sig = T(1) / (T(1) + std::exp(-xp[i]));
      dp[i] = zp[i] == ignored ? T(0) : (sig - zp[i]) * gp[i] * scale;
    }
    return absl::OkStatus();
  });
}

// ---------------------------------------------------------------------------------------------
// square_error: Out = (X - Y)^2 elementwise. Grads: dX = 2 (X - Y) dOut, dY = -dX.

absl::Status SquareError(OpContext& ctx) {
  TS_ASSIGN_OR_RETURN(const Tensor* x, ctx.Input("X"));
  TS_ASSIGN_OR_RETURN(const Tensor* y, ctx.Input("Y"));
  TS_RETURN_IF_ERROR(CheckSameShape(ctx, "X", *x, "Y", *y));
  TS_RETURN_IF_ERROR(ctx.CheckDType("Y", *y, x->dtype()));
  TS_ASSIGN_OR_RETURN(Tensor * out, ctx.Output("Out"));
  if (out != x && out != y) out->Resize(x->dtype(), x->shape());
  return DispatchFloat(ctx, "X", x->dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    out->flat<T>() = (x->flat<T>() - y->flat<T>()).square();
    return absl::OkStatus();
  });
}

absl::Status SquareErrorGrad(OpContext& ctx) {
  const bool want_dx = ctx.HasOutput("X@GRAD"), want_dy = ctx.HasOutput("Y@GRAD");
  if (!want_dx && !want_dy) return absl::OkStatus();
  TS_ASSIGN_OR_RETURN(const Tensor* x, ctx.Input("X"));
  TS_ASSIGN_OR_RETURN(const Tensor* y, ctx.Input("Y"));
  TS_RETURN_IF_ERROR(CheckSameShape(ctx, "X", *x, "Y", *y));
  TS_RETURN_IF_ERROR(ctx.CheckDType("Y", *y, x->dtype()));
  TS_ASSIGN_OR_RETURN(const Tensor* dout, GradInput(ctx, "Out@GRAD", x->dtype(), x->numel()));
  Tensor* dx = nullptr;
  Tensor* dy = nullptr;
  if (want_dx) {
    TS_ASSIGN_OR_RETURN(dx, ctx.Output("X@GRAD"));
    if (dx == x || dx == y || dx == dout) return ctx.Error("X@GRAD must not be an input");
    dx->Resize(x->dtype(), x->shape());
  }
  if (want_dy) {
    TS_ASSIGN_OR_RETURN(dy, ctx.Output("Y@GRAD"));
    if (dy == x || dy == y || dy == dout || dy == dx) {
      return ctx.Error("Y@GRAD must not be an input or X@GRAD");
    }
    dy->Resize(y->dtype(), y->shape());
  }
  return DispatchFloat(ctx, "X", x->dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    auto g = T(2) * (x->flat<T>() - y->flat<T>()) * dout->flat<T>();
    if (dx != nullptr) dx->flat<T>() = g;
    if (dy != nullptr) dy->flat<T>() = -g;
    return absl::OkStatus();
  });
}

// ---------------------------------------------------------------------------------------------
// mean: Out [1] = mean of all elements of X. Grad: X@GRAD = Out@GRAD / numel everywhere.

absl::Status Mean(OpContext& ctx) {
  TS_ASSIGN_OR_RETURN(const Tensor* x, ctx.Input("X"));
  if (x->numel() == 0) {
    return ctx.Error(absl::StrCat("X '", ctx.InputName("X"), "' ", ShapeString(x->shape()),
                                  " is empty; its mean is undefined"));
  }
  TS_ASSIGN_OR_RETURN(Tensor * out, ctx.Output("Out"));
  if (out == x) return ctx.Error("Out must not be X");
  return DispatchFloat(ctx, "X", x->dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    T m = x->flat<T>().mean();
    out->Resize(x->dtype(), {1});
    out->data<T>()[0] = m;
    return absl::OkStatus();
  });
}

absl::Status MeanGrad(OpContext& ctx) {
  if (!ctx.HasOutput("X@GRAD")) return absl::OkStatus();
  TS_ASSIGN_OR_RETURN(const Tensor* x, ctx.Input("X"));
  TS_ASSIGN_OR_RETURN(const Tensor* dout, GradInput(ctx, "Out@GRAD", x->dtype(), 1));
  TS_ASSIGN_OR_RETURN(Tensor * dx, ctx.Output("X@GRAD"));
  if (dx == x || dx == dout) return ctx.Error("X@GRAD must not be X or Out@GRAD");
  dx->Resize(x->dtype(), x->shape());
  return DispatchFloat(ctx, "X", x->dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T v = dout->data<T>()[0] / static_cast<T>(std::max<int64_t>(x->numel(), 1));
    dx->flat<T>().setConstant(v);
    return absl::OkStatus();
  });
}

}  // namespace

absl::Status RegisterLossOps(OpRegistry* r) {
  TS_RETURN_IF_ERROR(r->Register("softmax_with_cross_entropy",
                                 {SoftmaxWithCrossEntropy, SoftmaxWithCrossEntropyGradMaker}));
  TS_RETURN_IF_ERROR(
      r->Register("softmax_with_cross_entropy_grad", {SoftmaxWithCrossEntropyGrad, nullptr}));
  TS_RETURN_IF_ERROR(r->Register("sigmoid_cross_entropy_with_logits",
                                 {SigmoidCrossEntropyWithLogits, DefaultGradMaker({"X"})}));
  TS_RETURN_IF_ERROR(r->Register("sigmoid_cross_entropy_with_logits_grad",
                                 {SigmoidCrossEntropyWithLogitsGrad, nullptr}));
  TS_RETURN_IF_ERROR(r->Register("square_error", {SquareError, DefaultGradMaker({"X", "Y"})}));
  TS_RETURN_IF_ERROR(r->Register("square_error_grad", {SquareErrorGrad, nullptr}));
  TS_RETURN_IF_ERROR(r->Register("mean", {Mean, DefaultGradMaker({"X"})}));
  TS_RETURN_IF_ERROR(r->Register("mean_grad", {MeanGrad, nullptr}));
  return absl::OkStatus();
}

}  // namespace tessera
