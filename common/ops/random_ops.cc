#include "common/ops/random_ops.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/ops/counter_rng.h"
#include "common/ops/dropout_util.h"
#include "common/ops/kernel_util.h"

namespace tessera {

namespace {

// Resizes Out to attrs shape and dtype (float32/float64); reads attrs seed and offset.
absl::Status PrepareOutput(OpContext& ctx, Tensor** out, uint64_t* seed, uint64_t* offset) {
  Shape shape = ctx.IntsAttr("shape");
  for (int64_t d : shape) {
    if (d < 0) {
      return ctx.Error(absl::StrCat("shape attribute ", ShapeString(shape), " is negative"));
    }
  }
  const int64_t dtype = ctx.IntAttr("dtype", FLOAT32);
  if (dtype != FLOAT32 && dtype != FLOAT64) {
    return ctx.Error(absl::StrCat("dtype ", dtype, " of Out '", ctx.OutputName("Out"),
                                  "' must be float32 (0) or float64 (1)"));
  }
  TS_ASSIGN_OR_RETURN(*out, ctx.Output("Out"));
  (*out)->Resize(static_cast<DataType>(dtype), std::move(shape));
  *seed = static_cast<uint64_t>(ctx.IntAttr("seed", 0));
  *offset = static_cast<uint64_t>(ctx.IntAttr("offset", 0));
  return absl::OkStatus();
}

// uniform_random: Out[k] = min + (max - min) * CounterUniform(seed, offset + k), in [min, max).
absl::Status UniformRandom(OpContext& ctx) {
  const double min = ctx.FloatAttr("min", -1.0f);
  const double max = ctx.FloatAttr("max", 1.0f);
  if (!(min <= max) || !std::isfinite(min) || !std::isfinite(max)) {
    return ctx.Error(
        absl::StrCat("attributes min ", min, " and max ", max, " must be finite with min <= max"));
  }
  Tensor* out;
  uint64_t seed, offset;
  TS_RETURN_IF_ERROR(PrepareOutput(ctx, &out, &seed, &offset));
  return DispatchFloat(ctx, "Out", out->dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    FillCounterUniform<T>(seed, offset, min, max, out->data<T>(), out->numel());
    return absl::OkStatus();
  });
}

// gaussian_random: Out[k] = mean + std * CounterGaussian(seed, offset + k).
absl::Status GaussianRandom(OpContext& ctx) {
  const double mean = ctx.FloatAttr("mean", 0.0f);
  const double stddev = ctx.FloatAttr("std", 1.0f);
  if (!(stddev >= 0) || !std::isfinite(stddev) || !std::isfinite(mean)) {
    return ctx.Error(absl::StrCat("attributes mean ", mean, " and std ", stddev,
                                  " must be finite with std >= 0"));
  }
  Tensor* out;
  uint64_t seed, offset;
  TS_RETURN_IF_ERROR(PrepareOutput(ctx, &out, &seed, &offset));
  return DispatchFloat(ctx, "Out", out->dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    FillCounterGaussian<T>(seed, offset, mean, stddev, out->data<T>(), out->numel());
    return absl::OkStatus();
  });
}

// dropout (training, is_test false): Mask = 1 where a uniform draw is >= dropout_prob, else 0;
// Out = X * Mask ("downgrade_in_infer", the default) or X * Mask / (1 - p)
// ("upscale_in_train"). Inference (is_test, which the trainer's evaluation program sets): Out =
// X * (1 - p), or X. The draws are counter-based on (seed, run, element): `run` counts this op's
// runs on this scope (variable "<Mask>@runs", kept by the scope, not by checkpoints) and is
// mixed with the bits of X's first elements, so that consecutive steps, and the places of a
// multi-place trainer (each on its own part of the batch), get different masks reproducibly.
// The attributes, the key and the keep rule are in common/ops/dropout_util.h, shared with the
// GPU kernel (common/device/cuda/gpu_ops.cc), which draws the same masks.
absl::Status Dropout(OpContext& ctx) {
  TS_ASSIGN_OR_RETURN(DropoutAttrs a, ReadDropoutAttrs(ctx));
  TS_ASSIGN_OR_RETURN(const Tensor* x, ctx.Input("X"));
  TS_ASSIGN_OR_RETURN(Tensor * out, ctx.Output("Out"));
  out->Resize(x->dtype(), x->shape());
  out->set_lod(x->lod());
  const double scale = DropoutScale(a);
  if (a.is_test) {
    return DispatchFloat(ctx, "X", x->dtype(), [&](auto tag) {
      using T = typename decltype(tag)::type;
      out->flat<T>() = x->flat<T>() * static_cast<T>(scale);
      return absl::OkStatus();
    });
  }
  if (!ctx.HasOutput("Mask")) return ctx.Error("needs output Mask in training (is_test false)");
  TS_ASSIGN_OR_RETURN(Tensor * mask, ctx.Output("Mask"));
  mask->Resize(x->dtype(), x->shape());
  const uint64_t key = DropoutKey(ctx, x->raw_data(), std::min(x->nbytes(), kDropoutKeyBytes));
  return DispatchFloat(ctx, "X", x->dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* in = x->data<T>();
    T* o = out->data<T>();
    T* m = mask->data<T>();
    const T kept = static_cast<T>(scale);
    for (int64_t k = 0; k < x->numel(); ++k) {
      const bool keep = DropoutKeep(key, k, a.p);
      m[k] = keep ? T(1) : T(0);
      o[k] = keep ? in[k] * kept : T(0);
    }
    return absl::OkStatus();
  });
}

// dropout_grad: X@GRAD = Out@GRAD * Mask * scale (training), Out@GRAD * scale (is_test).
absl::Status DropoutGrad(OpContext& ctx) {
  TS_ASSIGN_OR_RETURN(DropoutAttrs a, ReadDropoutAttrs(ctx));
  TS_ASSIGN_OR_RETURN(const Tensor* dout, ctx.Input(GradVarName("Out")));
  TS_ASSIGN_OR_RETURN(Tensor * dx, ctx.Output(GradVarName("X")));
  dx->Resize(dout->dtype(), dout->shape());
  const double scale = DropoutScale(a);
  const Tensor* mask = nullptr;
  if (!a.is_test) {
    TS_ASSIGN_OR_RETURN(mask, ctx.Input("Mask"));
    if (mask->shape() != dout->shape() || mask->dtype() != dout->dtype()) {
      return ctx.Error(absl::StrCat("Mask ", mask->DebugString(), " does not match Out@GRAD ",
                                    dout->DebugString()));
    }
  }
  return DispatchFloat(ctx, GradVarName("Out"), dout->dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (mask == nullptr) {
      dx->flat<T>() = dout->flat<T>() * static_cast<T>(scale);
    } else {
      dx->flat<T>() = dout->flat<T>() * mask->flat<T>() * static_cast<T>(scale);
    }
    return absl::OkStatus();
  });
}

}  // namespace

absl::Status RegisterRandomOps(OpRegistry* r) {
  TS_RETURN_IF_ERROR(r->Register("uniform_random", {UniformRandom, nullptr}));
  TS_RETURN_IF_ERROR(r->Register("gaussian_random", {GaussianRandom, nullptr}));
  TS_RETURN_IF_ERROR(r->Register("dropout", {Dropout, DefaultGradMaker({"X"})}));
  TS_RETURN_IF_ERROR(r->Register("dropout_grad", {DropoutGrad, nullptr}));
  return absl::OkStatus();
}

}  // namespace tessera
