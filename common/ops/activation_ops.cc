#include "common/ops/activation_ops.h"

#include "Eigen/Core"
#include "absl/strings/str_cat.h"
#include "common/ops/kernel_util.h"

namespace tessera {

namespace {

// Out = f(X), elementwise. Out may be X itself (in place).
struct ReluFn {
  template <typename A>
  auto operator()(const A& x) const {
    return x.cwiseMax(typename A::Scalar(0));
  }
};
struct SigmoidFn {
  template <typename A>
  auto operator()(const A& x) const {
    return x.logistic();
  }
};
struct TanhFn {
  template <typename A>
  auto operator()(const A& x) const {
    return x.tanh();
  }
};

// dX = dOut * f'(x), written in terms of Out = f(x).
struct ReluGradFn {
  template <typename A, typename B>
  auto operator()(const A& out, const B& dout) const {
    using T = typename A::Scalar;
    return (out > T(0)).select(dout, T(0));
  }
};
struct SigmoidGradFn {
  template <typename A, typename B>
  auto operator()(const A& out, const B& dout) const {
    using T = typename A::Scalar;
    return dout * out * (T(1) - out);
  }
};
struct TanhGradFn {
  template <typename A, typename B>
  auto operator()(const A& out, const B& dout) const {
    using T = typename A::Scalar;
    return dout * (T(1) - out.square());
  }
};

template <typename F>
absl::Status ActivationForward(OpContext& ctx) {
  TS_ASSIGN_OR_RETURN(const Tensor* x, ctx.Input("X"));
  TS_ASSIGN_OR_RETURN(Tensor * out, ctx.Output("Out"));
  if (out != x) out->Resize(x->dtype(), x->shape());
  return DispatchFloat(ctx, "X", x->dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    out->flat<T>() = F()(x->flat<T>());
    return absl::OkStatus();
  });
}

// Inputs Out and Out@GRAD (X is not read); output X@GRAD, which may be Out@GRAD (in place).
template <typename F>
absl::Status ActivationGrad(OpContext& ctx) {
  if (!ctx.HasOutput("X@GRAD")) return absl::OkStatus();
  TS_ASSIGN_OR_RETURN(const Tensor* out, ctx.Input("Out"));
  TS_ASSIGN_OR_RETURN(const Tensor* dout, ctx.Input("Out@GRAD"));
  if (dout->dtype() != out->dtype() || dout->shape() != out->shape()) {
    return ctx.Error(absl::StrCat("Out@GRAD '", ctx.InputName("Out@GRAD"), "' is ",
                                  dout->DebugString(), " but Out '", ctx.InputName("Out"), "' is ",
                                  out->DebugString()));
  }
  TS_ASSIGN_OR_RETURN(Tensor * dx, ctx.Output("X@GRAD"));
  if (dx != out && dx != dout) dx->Resize(out->dtype(), out->shape());
  return DispatchFloat(ctx, "Out", out->dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    dx->flat<T>() = F()(out->flat<T>(), dout->flat<T>());
    return absl::OkStatus();
  });
}

}  // namespace

absl::Status RegisterActivationOps(OpRegistry* r) {
  TS_RETURN_IF_ERROR(r->Register("relu", {ActivationForward<ReluFn>, DefaultGradMaker({"X"})}));
  TS_RETURN_IF_ERROR(r->Register("relu_grad", {ActivationGrad<ReluGradFn>, nullptr}));
  TS_RETURN_IF_ERROR(
      r->Register("sigmoid", {ActivationForward<SigmoidFn>, DefaultGradMaker({"X"})}));
  TS_RETURN_IF_ERROR(r->Register("sigmoid_grad", {ActivationGrad<SigmoidGradFn>, nullptr}));
  TS_RETURN_IF_ERROR(r->Register("tanh", {ActivationForward<TanhFn>, DefaultGradMaker({"X"})}));
  TS_RETURN_IF_ERROR(r->Register("tanh_grad", {ActivationGrad<TanhGradFn>, nullptr}));
  return absl::OkStatus();
}

}  // namespace tessera
