// The geometry of the NCHW image ops (conv2d, pool2d), read from an op's inputs and attributes
// with the checks and one-line errors of their CPU kernels (common/ops/nn_ops.cc). The GPU
// kernels (common/device/cuda/gpu_ops.cc) read it with the same functions and leave the ops
// whose geometry is an error to the CPU kernels, which report it.
#ifndef TESSERA_COMMON_OPS_NN_GEOMETRY_H_
#define TESSERA_COMMON_OPS_NN_GEOMETRY_H_

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/framework/op_registry.h"
#include "common/ops/kernel_util.h"

namespace tessera {
namespace nn {

// A pair attribute ([h, w]) with a default for both; an attribute of one value counts for both.
inline absl::StatusOr<std::array<int64_t, 2>> PairAttr(const OpContext& ctx, absl::string_view name,
                                                       int64_t dflt, int64_t min) {
  std::vector<int64_t> v = ctx.IntsAttr(name);
  if (v.empty()) v = {dflt, dflt};
  if (v.size() == 1) v.push_back(v[0]);
  if (v.size() != 2 || v[0] < min || v[1] < min) {
    return ctx.Error(absl::StrCat("attribute ", name, " [", absl::StrJoin(v, ", "),
                                  "] must be two values >= ", min));
  }
  return std::array<int64_t, 2>{v[0], v[1]};
}

inline absl::Status CheckNchw(const OpContext& ctx, absl::string_view slot, const Tensor& x) {
  if (x.rank() == 4) return absl::OkStatus();
  return ctx.Error(absl::StrCat(slot, " '", ctx.InputName(slot), "' ", ShapeString(x.shape()),
                                " must be 4-D [N, C, H, W]"));
}

// conv2d: Input [n, c, h, w], Filter [m, c, kh, kw], attrs strides, paddings, dilations (groups
// 1) -> Output [n, m, ho, wo].
struct ConvGeometry {
  int64_t n, c, h, w;  // input
  int64_t m, kh, kw;   // filter
  int64_t sh, sw, ph, pw, dh, dw;
  int64_t ho, wo;  // output
  int64_t ckk() const { return c * kh * kw; }
  int64_t p() const { return ho * wo; }
};

inline absl::StatusOr<ConvGeometry> GetConvGeometry(const OpContext& ctx, const Tensor& input,
                                                    const Tensor& filter) {
  TS_RETURN_IF_ERROR(CheckNchw(ctx, "Input", input));
  TS_RETURN_IF_ERROR(CheckNchw(ctx, "Filter", filter));
  TS_RETURN_IF_ERROR(ctx.CheckDType("Filter", filter, input.dtype()));
  if (ctx.IntAttr("groups", 1) != 1) {
    return ctx.Error(absl::StrCat("groups ", ctx.IntAttr("groups", 1), " is not supported (1)"));
  }
  TS_ASSIGN_OR_RETURN(auto strides, PairAttr(ctx, "strides", 1, 1));
  TS_ASSIGN_OR_RETURN(auto paddings, PairAttr(ctx, "paddings", 0, 0));
  TS_ASSIGN_OR_RETURN(auto dilations, PairAttr(ctx, "dilations", 1, 1));
  ConvGeometry g{input.dim(0),
                 input.dim(1),
                 input.dim(2),
                 input.dim(3),
                 filter.dim(0),
                 filter.dim(2),
                 filter.dim(3),
                 strides[0],
                 strides[1],
                 paddings[0],
                 paddings[1],
                 dilations[0],
                 dilations[1],
                 0,
                 0};
  if (filter.dim(1) != g.c) {
    return ctx.Error(absl::StrCat("Filter '", ctx.InputName("Filter"), "' ",
                                  ShapeString(filter.shape()), " does not fit Input '",
                                  ctx.InputName("Input"), "' ", ShapeString(input.shape()),
                                  ": its dim 1 must be the input's channels ", g.c));
  }
  const int64_t eh = g.dh * (g.kh - 1) + 1, ew = g.dw * (g.kw - 1) + 1;
  if (g.h + 2 * g.ph < eh || g.w + 2 * g.pw < ew || g.kh < 1 || g.kw < 1) {
    return ctx.Error(
        absl::StrCat("Filter '", ctx.InputName("Filter"), "' ", ShapeString(filter.shape()),
                     " (dilated ", eh, "x", ew, ") is larger than Input '", ctx.InputName("Input"),
                     "' ", ShapeString(input.shape()), " padded by [", g.ph, ", ", g.pw, "]"));
  }
  g.ho = (g.h + 2 * g.ph - eh) / g.sh + 1;
  g.wo = (g.w + 2 * g.pw - ew) / g.sw + 1;
  return g;
}

// pool2d: X [n, c, h, w], attrs pooling_type, exclusive, global_pooling, ksize, strides,
// paddings -> Out [n, c, ho, wo].
struct PoolGeometry {
  bool max;
  bool exclusive;
  int64_t n, c, h, w;
  int64_t kh, kw, sh, sw, ph, pw;
  int64_t ho, wo;
};

inline absl::StatusOr<PoolGeometry> GetPoolGeometry(const OpContext& ctx, const Tensor& x) {
  TS_RETURN_IF_ERROR(CheckNchw(ctx, "X", x));
  const std::string type = ctx.StringAttr("pooling_type", "max");
  if (type != "max" && type != "avg") {
    return ctx.Error(absl::StrCat("pooling_type '", type, "' must be max or avg"));
  }
  PoolGeometry g{};
  g.max = type == "max";
  g.exclusive = ctx.BoolAttr("exclusive", true);
  g.n = x.dim(0);
  g.c = x.dim(1);
  g.h = x.dim(2);
  g.w = x.dim(3);
  if (ctx.BoolAttr("global_pooling", false)) {
    g.kh = g.h;
    g.kw = g.w;
    g.sh = g.sw = 1;
    g.ph = g.pw = 0;
  } else {
    TS_ASSIGN_OR_RETURN(auto ksize, PairAttr(ctx, "ksize", 2, 1));
    TS_ASSIGN_OR_RETURN(auto strides, PairAttr(ctx, "strides", 1, 1));
    TS_ASSIGN_OR_RETURN(auto paddings, PairAttr(ctx, "paddings", 0, 0));
    g.kh = ksize[0];
    g.kw = ksize[1];
    g.sh = strides[0];
    g.sw = strides[1];
    g.ph = paddings[0];
    g.pw = paddings[1];
  }
  if (g.ph >= g.kh || g.pw >= g.kw) {
    return ctx.Error(absl::StrCat("paddings [", g.ph, ", ", g.pw, "] must be smaller than ksize [",
                                  g.kh, ", ", g.kw, "]"));
  }
  if (g.h + 2 * g.ph < g.kh || g.w + 2 * g.pw < g.kw || g.h == 0 || g.w == 0) {
    return ctx.Error(absl::StrCat("window ", g.kh, "x", g.kw, " is larger than X '",
                                  ctx.InputName("X"), "' ", ShapeString(x.shape()), " padded by [",
                                  g.ph, ", ", g.pw, "]"));
  }
  g.ho = (g.h + 2 * g.ph - g.kh) / g.sh + 1;
  g.wo = (g.w + 2 * g.pw - g.kw) / g.sw + 1;
  return g;
}

}  // namespace nn
}  // namespace tessera

#endif  // TESSERA_COMMON_OPS_NN_GEOMETRY_H_
