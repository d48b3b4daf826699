#include "common/ops/random_ops.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/ops/counter_rng.h"
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

}  // namespace

absl::Status RegisterRandomOps(OpRegistry* r) {
  TS_RETURN_IF_ERROR(r->Register("uniform_random", {UniformRandom, nullptr}));
  TS_RETURN_IF_ERROR(r->Register("gaussian_random", {GaussianRandom, nullptr}));
  return absl::OkStatus();
}

}  // namespace tessera
