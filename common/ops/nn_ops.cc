#include "common/ops/nn_ops.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "Eigen/Core"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/ops/kernel_util.h"
#include "common/ops/nn_geometry.h"

namespace tessera {

namespace {

using nn::CheckNchw;
using nn::ConvGeometry;
using nn::GetConvGeometry;
using nn::GetPoolGeometry;
using nn::PoolGeometry;

// A scratch buffer per thread and type, reused across runs (grows, never shrinks).
template <typename T>
T* Scratch(int which, size_t n) {
  thread_local std::vector<T> buffers[3];
  std::vector<T>& b = buffers[which];
  if (b.size() < n) b.resize(n);
  return b.data();
}

// ---------------------------------------------------------------------------------------------
// conv2d

// Samples per im2col chunk: the column buffer stays near 128K elements (512 KB of floats), so
// that the GEMM reads it from L2 right after Im2Col wrote it (LeNet's convolutions: 0.45 of the
// GEMM peak with whole-batch buffers of 4 MB, 0.6 with these; tests/bench/conv).
int64_t ChunkSamples(const ConvGeometry& g) {
  const int64_t per_sample = std::max<int64_t>(1, g.ckk() * g.p());
  return std::max<int64_t>(1, std::min<int64_t>(g.n, (int64_t{1} << 17) / per_sample));
}

// The output columns [lo, hi) of one output row whose input column ow sw - pw + j dw lies
// inside the image (width w).
inline void ValidColumns(const ConvGeometry& g, int64_t j, int64_t* lo, int64_t* hi) {
  const int64_t offset = j * g.dw - g.pw;  // input column of output column 0
  // ow sw + offset >= 0  and  ow sw + offset < w
  // (Clamped to [0, wo]: with padding wider than the image, a whole row may lie outside it.)
  *lo = std::min<int64_t>(g.wo, offset >= 0 ? 0 : (-offset + g.sw - 1) / g.sw);
  *hi = offset >= g.w ? 0 : std::min<int64_t>(g.wo, (g.w - offset + g.sw - 1) / g.sw);
  if (*hi < *lo) *hi = *lo;
}

// Im2Col copies short runs (an output row: a few to tens of values). GCC would turn those loops
// into memmove calls, which cost more than the copies at these lengths (and a function with its
// own optimize attribute is not inlined, so the attribute is on Im2Col itself).
#if defined(__GNUC__) && !defined(__clang__)
#define TESSERA_NO_MEMCPY_IDIOM __attribute__((optimize("no-tree-loop-distribute-patterns")))
#else
#define TESSERA_NO_MEMCPY_IDIOM
#endif

// col [ckk, count * P]: column (s, oh, ow) of row (c, i, j) is input sample first + s at
// (oh sh - ph + i dh, ow sw - pw + j dw), 0 outside the image.
template <typename T>
TESSERA_NO_MEMCPY_IDIOM void Im2Col(const ConvGeometry& g, const T* x, int64_t first, int64_t count,
                                    T* col) {
  const int64_t cols = count * g.p();
  for (int64_t c = 0; c < g.c; ++c) {
    for (int64_t i = 0; i < g.kh; ++i) {
      for (int64_t j = 0; j < g.kw; ++j) {
        T* row = col + ((c * g.kh + i) * g.kw + j) * cols;
        int64_t lo, hi;
        ValidColumns(g, j, &lo, &hi);
        const int64_t offset = j * g.dw - g.pw;
        for (int64_t s = 0; s < count; ++s) {
          const T* plane = x + ((first + s) * g.c + c) * g.h * g.w;
          T* out = row + s * g.p();
          for (int64_t oh = 0; oh < g.ho; ++oh) {
            const int64_t ih = oh * g.sh - g.ph + i * g.dh;
            T* o = out + oh * g.wo;
            if (ih < 0 || ih >= g.h) {
              std::fill(o, o + g.wo, T(0));
              continue;
            }
            // Valid columns read input columns offset + ow sw >= 0.
            const T* in = plane + ih * g.w;
            std::fill(o, o + lo, T(0));
            if (g.sw == 1) {
              for (int64_t ow = lo; ow < hi; ++ow) o[ow] = in[offset + ow];
            } else {
              for (int64_t ow = lo; ow < hi; ++ow) o[ow] = in[offset + ow * g.sw];
            }
            std::fill(o + hi, o + g.wo, T(0));
          }
        }
      }
    }
  }
}

// The adjoint of Im2Col: adds col's entries into dx.
template <typename T>
void Col2ImAdd(const ConvGeometry& g, const T* col, int64_t first, int64_t count, T* dx) {
  const int64_t cols = count * g.p();
  for (int64_t c = 0; c < g.c; ++c) {
    for (int64_t i = 0; i < g.kh; ++i) {
      for (int64_t j = 0; j < g.kw; ++j) {
        const T* row = col + ((c * g.kh + i) * g.kw + j) * cols;
        int64_t lo, hi;
        ValidColumns(g, j, &lo, &hi);
        const int64_t offset = j * g.dw - g.pw;
        for (int64_t s = 0; s < count; ++s) {
          T* plane = dx + ((first + s) * g.c + c) * g.h * g.w;
          const T* in = row + s * g.p();
          for (int64_t oh = 0; oh < g.ho; ++oh) {
            const int64_t ih = oh * g.sh - g.ph + i * g.dh;
            if (ih < 0 || ih >= g.h) continue;
            const T* o = in + oh * g.wo;
            T* d = plane + ih * g.w;
            if (g.sw == 1) {
              for (int64_t ow = lo; ow < hi; ++ow) d[offset + ow] += o[ow];
            } else {
              for (int64_t ow = lo; ow < hi; ++ow) d[offset + ow * g.sw] += o[ow];
            }
          }
        }
      }
    }
  }
}

absl::Status Conv2d(OpContext& ctx) {
  TS_ASSIGN_OR_RETURN(const Tensor* input, ctx.Input("Input"));
  TS_ASSIGN_OR_RETURN(const Tensor* filter, ctx.Input("Filter"));
  TS_ASSIGN_OR_RETURN(ConvGeometry g, GetConvGeometry(ctx, *input, *filter));
  TS_ASSIGN_OR_RETURN(Tensor * output, ctx.Output("Output"));
  if (output == input || output == filter) {
    return ctx.Error("Output must not be the same variable as Input or Filter");
  }
  output->Resize(input->dtype(), {g.n, g.m, g.ho, g.wo});
  return DispatchFloat(ctx, "Input", input->dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    const int64_t chunk = ChunkSamples(g);
    T* col = Scratch<T>(0, static_cast<size_t>(g.ckk() * chunk * g.p()));
    T* prod = Scratch<T>(1, static_cast<size_t>(g.m * chunk * g.p()));
    ConstEigenMatrix<T> w(filter->data<T>(), g.m, g.ckk());
    for (int64_t first = 0; first < g.n; first += chunk) {
      const int64_t count = std::min(chunk, g.n - first);
      const int64_t cols = count * g.p();
      Im2Col(g, input->data<T>(), first, count, col);
      EigenMatrix<T> out(prod, g.m, cols);
      out.noalias() = w * ConstEigenMatrix<T>(col, g.ckk(), cols);
      // [M, count * P] -> Output[first + s, m, :]
      for (int64_t s = 0; s < count; ++s) {
        for (int64_t m = 0; m < g.m; ++m) {
          std::copy_n(prod + m * cols + s * g.p(), g.p(),
                      output->data<T>() + ((first + s) * g.m + m) * g.p());
        }
      }
    }
    return absl::OkStatus();
  });
}

// conv2d_grad: Filter@GRAD = dOut · col^T, Input@GRAD = col2im(Filter^T · dOut) (each only when
// bound).
absl::Status Conv2dGrad(OpContext& ctx) {
  TS_ASSIGN_OR_RETURN(const Tensor* input, ctx.Input("Input"));
  TS_ASSIGN_OR_RETURN(const Tensor* filter, ctx.Input("Filter"));
  TS_ASSIGN_OR_RETURN(ConvGeometry g, GetConvGeometry(ctx, *input, *filter));
  TS_ASSIGN_OR_RETURN(const Tensor* dout,
                      GradInput(ctx, "Output@GRAD", input->dtype(), g.n * g.m * g.p()));
  Tensor* dx = nullptr;
  Tensor* dw = nullptr;
  if (ctx.HasOutput("Input@GRAD")) {
    TS_ASSIGN_OR_RETURN(dx, ctx.Output("Input@GRAD"));
    dx->Resize(input->dtype(), input->shape());
  }
  if (ctx.HasOutput("Filter@GRAD")) {
    TS_ASSIGN_OR_RETURN(dw, ctx.Output("Filter@GRAD"));
    dw->Resize(filter->dtype(), filter->shape());
  }
  for (const Tensor* t : {dx, dw}) {
    if (t != nullptr && (t == input || t == filter || t == dout)) {
      return ctx.Error("gradient outputs must not be the op's inputs");
    }
  }
  return DispatchFloat(ctx, "Input", input->dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    const int64_t chunk = ChunkSamples(g);
    T* col = Scratch<T>(0, static_cast<size_t>(g.ckk() * chunk * g.p()));
    T* grad = Scratch<T>(1, static_cast<size_t>(g.m * chunk * g.p()));
    ConstEigenMatrix<T> w(filter->data<T>(), g.m, g.ckk());
    if (dx != nullptr) dx->flat<T>().setZero();
    if (dw != nullptr) dw->flat<T>().setZero();
    for (int64_t first = 0; first < g.n; first += chunk) {
      const int64_t count = std::min(chunk, g.n - first);
      const int64_t cols = count * g.p();
      // Output@GRAD[first + s, m, :] -> [M, count * P]
      for (int64_t s = 0; s < count; ++s) {
        for (int64_t m = 0; m < g.m; ++m) {
          std::copy_n(dout->data<T>() + ((first + s) * g.m + m) * g.p(), g.p(),
                      grad + m * cols + s * g.p());
        }
      }
      ConstEigenMatrix<T> gm(grad, g.m, cols);
      if (dw != nullptr) {
        Im2Col(g, input->data<T>(), first, count, col);
        EigenMatrix<T> gw(dw->data<T>(), g.m, g.ckk());
        gw.noalias() += gm * ConstEigenMatrix<T>(col, g.ckk(), cols).transpose();
      }
      if (dx != nullptr) {
        EigenMatrix<T> gc(col, g.ckk(), cols);
        gc.noalias() = w.transpose() * gm;
        Col2ImAdd(g, col, first, count, dx->data<T>());
      }
    }
    return absl::OkStatus();
  });
}

// ---------------------------------------------------------------------------------------------
// pool2d

// Calls fn(out_index, h0, h1, w0, w1, plane_offset) for each output cell: its window clipped
// to the image.
template <typename Fn>
void ForEachWindow(const PoolGeometry& g, Fn&& fn) {
  for (int64_t nc = 0; nc < g.n * g.c; ++nc) {
    for (int64_t oh = 0; oh < g.ho; ++oh) {
      const int64_t h0 = std::max<int64_t>(oh * g.sh - g.ph, 0);
      const int64_t h1 = std::min<int64_t>(oh * g.sh - g.ph + g.kh, g.h);
      for (int64_t ow = 0; ow < g.wo; ++ow) {
        const int64_t w0 = std::max<int64_t>(ow * g.sw - g.pw, 0);
        const int64_t w1 = std::min<int64_t>(ow * g.sw - g.pw + g.kw, g.w);
        fn((nc * g.ho + oh) * g.wo + ow, h0, h1, w0, w1, nc * g.h * g.w);
      }
    }
  }
}

// The offset (within the plane) of the first maximum of a window.
template <typename T>
int64_t ArgMax(const PoolGeometry& g, const T* plane, int64_t h0, int64_t h1, int64_t w0,
               int64_t w1) {
  int64_t best = h0 * g.w + w0;
  for (int64_t ih = h0; ih < h1; ++ih) {
    for (int64_t iw = w0; iw < w1; ++iw) {
      if (plane[ih * g.w + iw] > plane[best]) best = ih * g.w + iw;
    }
  }
  return best;
}

template <typename T>
T AvgDivisor(const PoolGeometry& g, int64_t h0, int64_t h1, int64_t w0, int64_t w1) {
  return static_cast<T>(g.exclusive ? (h1 - h0) * (w1 - w0) : g.kh * g.kw);
}

absl::Status Pool2d(OpContext& ctx) {
  TS_ASSIGN_OR_RETURN(const Tensor* x, ctx.Input("X"));
  TS_ASSIGN_OR_RETURN(PoolGeometry g, GetPoolGeometry(ctx, *x));
  TS_ASSIGN_OR_RETURN(Tensor * out, ctx.Output("Out"));
  if (out == x) return ctx.Error("Out must not be the same variable as X");
  out->Resize(x->dtype(), {g.n, g.c, g.ho, g.wo});
  return DispatchFloat(ctx, "X", x->dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* in = x->data<T>();
    T* o = out->data<T>();
    ForEachWindow(g, [&](int64_t k, int64_t h0, int64_t h1, int64_t w0, int64_t w1, int64_t plane) {
      if (g.max) {
        o[k] = in[plane + ArgMax(g, in + plane, h0, h1, w0, w1)];
        return;
      }
      T sum = 0;
      for (int64_t ih = h0; ih < h1; ++ih) {
        for (int64_t iw = w0; iw < w1; ++iw) sum += in[plane + ih * g.w + iw];
      }
      o[k] = sum / AvgDivisor<T>(g, h0, h1, w0, w1);
    });
    return absl::OkStatus();
  });
}

// pool2d_grad: max sends each Out@GRAD to its window's first maximum in X; avg spreads it over
// the window (divided as in the forward).
absl::Status Pool2dGrad(OpContext& ctx) {
  if (!ctx.HasOutput("X@GRAD")) return absl::OkStatus();
  TS_ASSIGN_OR_RETURN(const Tensor* x, ctx.Input("X"));
  TS_ASSIGN_OR_RETURN(PoolGeometry g, GetPoolGeometry(ctx, *x));
  TS_ASSIGN_OR_RETURN(const Tensor* dout,
                      GradInput(ctx, "Out@GRAD", x->dtype(), g.n * g.c * g.ho * g.wo));
  TS_ASSIGN_OR_RETURN(Tensor * dx, ctx.Output("X@GRAD"));
  if (dx == x || dx == dout) return ctx.Error("X@GRAD must not be X or Out@GRAD");
  dx->Resize(x->dtype(), x->shape());
  return DispatchFloat(ctx, "X", x->dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T* in = x->data<T>();
    const T* go = dout->data<T>();
    T* gx = dx->data<T>();
    dx->flat<T>().setZero();
    ForEachWindow(g, [&](int64_t k, int64_t h0, int64_t h1, int64_t w0, int64_t w1, int64_t plane) {
      if (g.max) {
        gx[plane + ArgMax(g, in + plane, h0, h1, w0, w1)] += go[k];
        return;
      }
      const T share = go[k] / AvgDivisor<T>(g, h0, h1, w0, w1);
      for (int64_t ih = h0; ih < h1; ++ih) {
        for (int64_t iw = w0; iw < w1; ++iw) gx[plane + ih * g.w + iw] += share;
      }
    });
    return absl::OkStatus();
  });
}

// ---------------------------------------------------------------------------------------------
// flatten

absl::StatusOr<Shape> FlattenShape(const OpContext& ctx, const Shape& in) {
  const int64_t axis = ctx.IntAttr("axis", 1);
  if (axis < 0 || axis > static_cast<int64_t>(in.size())) {
    return ctx.Error(absl::StrCat("axis ", axis, " must be in [0, ", in.size(), "] for X '",
                                  ctx.InputName("X"), "' ", ShapeString(in)));
  }
  return Shape{NumElements(Shape(in.begin(), in.begin() + axis)),
               NumElements(Shape(in.begin() + axis, in.end()))};
}

absl::Status Flatten(OpContext& ctx) {
  TS_ASSIGN_OR_RETURN(const Tensor* x, ctx.Input("X"));
  TS_ASSIGN_OR_RETURN(Shape shape, FlattenShape(ctx, x->shape()));
  TS_ASSIGN_OR_RETURN(Tensor * out, ctx.Output("Out"));
  if (out == x) return ctx.Error("Out must not be the same variable as X");
  out->Resize(x->dtype(), std::move(shape));
  std::memcpy(out->raw_data(), x->raw_data(), x->nbytes());
  return absl::OkStatus();
}

absl::Status FlattenGrad(OpContext& ctx) {
  if (!ctx.HasOutput("X@GRAD")) return absl::OkStatus();
  TS_ASSIGN_OR_RETURN(const Tensor* x, ctx.Input("X"));
  TS_ASSIGN_OR_RETURN(const Tensor* dout, GradInput(ctx, "Out@GRAD", x->dtype(), x->numel()));
  TS_ASSIGN_OR_RETURN(Tensor * dx, ctx.Output("X@GRAD"));
  if (dx == x || dx == dout) return ctx.Error("X@GRAD must not be X or Out@GRAD");
  dx->Resize(x->dtype(), x->shape());
  std::memcpy(dx->raw_data(), dout->raw_data(), dout->nbytes());
  return absl::OkStatus();
}

// ---------------------------------------------------------------------------------------------
// batch_norm

struct NormDims {
  int64_t n, c, inner;  // X viewed as [n, c, inner]
  int64_t count() const { return n * inner; }
};

absl::StatusOr<NormDims> GetNormDims(const OpContext& ctx, const Tensor& x,
                                     std::initializer_list<const char*> per_channel) {
  if (x.rank() < 2) {
    return ctx.Error(absl::StrCat("X '", ctx.InputName("X"), "' ", ShapeString(x.shape()),
                                  " must have rank >= 2 ([N, C, ...])"));
  }
  NormDims d{x.dim(0), x.dim(1), x.numel() / std::max<int64_t>(1, x.dim(0) * x.dim(1))};
  if (x.dim(0) * x.dim(1) == 0) d.inner = 0;
  for (const char* slot : per_channel) {
    TS_ASSIGN_OR_RETURN(const Tensor* t, ctx.Input(slot));
    TS_RETURN_IF_ERROR(ctx.CheckDType(slot, *t, x.dtype()));
    if (t->numel() != d.c) {
      return ctx.Error(absl::StrCat(slot, " '", ctx.InputName(slot), "' ", ShapeString(t->shape()),
                                    " must hold ", d.c, " values, one per channel of X '",
                                    ctx.InputName("X"), "' ", ShapeString(x.shape())));
    }
  }
  return d;
}

absl::StatusOr<double> Epsilon(const OpContext& ctx) {
  const double eps = ctx.FloatAttr("epsilon", 1e-5f);
  if (!(eps > 0) || !std::isfinite(eps)) {
    return ctx.Error(absl::StrCat("epsilon ", eps, " must be a positive number"));
  }
  return eps;
}

bool UseGlobalStats(const OpContext& ctx) {
  return ctx.BoolAttr("is_test", false) || ctx.BoolAttr("use_global_stats", false);
}

absl::Status BatchNorm(OpContext& ctx) {
  TS_ASSIGN_OR_RETURN(const Tensor* x, ctx.Input("X"));
  TS_ASSIGN_OR_RETURN(NormDims d, GetNormDims(ctx, *x, {"Scale", "Bias", "Mean", "Variance"}));
  TS_ASSIGN_OR_RETURN(double eps, Epsilon(ctx));
  const double momentum = ctx.FloatAttr("momentum", 0.9f);
  if (!(momentum >= 0 && momentum <= 1)) {
    return ctx.Error(absl::StrCat("momentum ", momentum, " must be in [0, 1]"));
  }
  const bool global = UseGlobalStats(ctx);
  if (!global && d.count() == 0) return ctx.Error("training needs a non-empty batch");
  TS_ASSIGN_OR_RETURN(const Tensor* scale, ctx.Input("Scale"));
  TS_ASSIGN_OR_RETURN(const Tensor* bias, ctx.Input("Bias"));
  TS_ASSIGN_OR_RETURN(const Tensor* mean, ctx.Input("Mean"));
  TS_ASSIGN_OR_RETURN(const Tensor* var, ctx.Input("Variance"));
  TS_ASSIGN_OR_RETURN(Tensor * y, ctx.Output("Y"));
  if (y == x || y == scale || y == bias || y == mean || y == var) {
    return ctx.Error("Y must not be one of the op's inputs");
  }
  y->Resize(x->dtype(), x->shape());
  return DispatchFloat(ctx, "X", x->dtype(), [&](auto tag) -> absl::Status {
    using T = typename decltype(tag)::type;
    std::vector<T> mu(static_cast<size_t>(d.c)), inv_std(static_cast<size_t>(d.c));
    std::vector<T> batch_var(static_cast<size_t>(d.c));
    const T* in = x->data<T>();
    for (int64_t c = 0; c < d.c; ++c) {
      if (global) {
        mu[c] = mean->data<T>()[c];
        inv_std[c] = static_cast<T>(1.0 / std::sqrt(var->data<T>()[c] + eps));
        continue;
      }
      double sum = 0, sq = 0;
      for (int64_t i = 0; i < d.n; ++i) {
        const T* p = in + (i * d.c + c) * d.inner;
        for (int64_t k = 0; k < d.inner; ++k) sum += p[k];
      }
      const double m = sum / static_cast<double>(d.count());
      for (int64_t i = 0; i < d.n; ++i) {
        const T* p = in + (i * d.c + c) * d.inner;
        for (int64_t k = 0; k < d.inner; ++k) sq += (p[k] - m) * (p[k] - m);
      }
      mu[c] = static_cast<T>(m);
      batch_var[c] = static_cast<T>(sq / static_cast<double>(d.count()));
      inv_std[c] = static_cast<T>(1.0 / std::sqrt(sq / static_cast<double>(d.count()) + eps));
    }
    T* out = y->data<T>();
    for (int64_t i = 0; i < d.n; ++i) {
      for (int64_t c = 0; c < d.c; ++c) {
        const T a = scale->data<T>()[c] * inv_std[c];
        const T b = bias->data<T>()[c] - mu[c] * a;
        const int64_t off = (i * d.c + c) * d.inner;
        EigenVector<T>(out + off, d.inner) = ConstEigenVector<T>(in + off, d.inner) * a + b;
      }
    }
    if (global) return absl::OkStatus();
    // The batch statistics, and the running ones moved towards them.
    TS_ASSIGN_OR_RETURN(Tensor * saved_mean, ctx.Output("SavedMean"));
    TS_ASSIGN_OR_RETURN(Tensor * saved_var, ctx.Output("SavedVariance"));
    saved_mean->Resize(x->dtype(), {d.c});
    saved_var->Resize(x->dtype(), {d.c});
    std::copy(mu.begin(), mu.end(), saved_mean->data<T>());
    std::copy(inv_std.begin(), inv_std.end(), saved_var->data<T>());
    std::vector<T> run_mean(mean->data<T>(), mean->data<T>() + d.c);
    std::vector<T> run_var(var->data<T>(), var->data<T>() + d.c);
    TS_ASSIGN_OR_RETURN(Tensor * mean_out, ctx.Output("MeanOut"));
    TS_ASSIGN_OR_RETURN(Tensor * var_out, ctx.Output("VarianceOut"));
    mean_out->Resize(x->dtype(), mean->shape());
    var_out->Resize(x->dtype(), var->shape());
    const T mo = static_cast<T>(momentum);
    for (int64_t c = 0; c < d.c; ++c) {
      mean_out->data<T>()[c] = mo * run_mean[c] + (T(1) - mo) * mu[c];
      var_out->data<T>()[c] = mo * run_var[c] + (T(1) - mo) * batch_var[c];
    }
    return absl::OkStatus();
  });
}

// batch_norm_grad: with xhat = (x - mean) inv_std over the statistics the forward used,
// Bias@GRAD = sum dy, Scale@GRAD = sum dy xhat, and X@GRAD = scale inv_std dy with global
// statistics, or scale inv_std (dy - (Bias@GRAD + xhat Scale@GRAD) / m) with the batch's.
absl::Status BatchNormGrad(OpContext& ctx) {
  TS_ASSIGN_OR_RETURN(const Tensor* x, ctx.Input("X"));
  const bool global = UseGlobalStats(ctx);
  const char* mean_slot = global ? "Mean" : "SavedMean";
  const char* var_slot = global ? "Variance" : "SavedVariance";
  TS_ASSIGN_OR_RETURN(NormDims d, GetNormDims(ctx, *x, {"Scale", mean_slot, var_slot}));
  TS_ASSIGN_OR_RETURN(double eps, Epsilon(ctx));
  TS_ASSIGN_OR_RETURN(const Tensor* scale, ctx.Input("Scale"));
  TS_ASSIGN_OR_RETURN(const Tensor* mean, ctx.Input(mean_slot));
  TS_ASSIGN_OR_RETURN(const Tensor* var, ctx.Input(var_slot));
  TS_ASSIGN_OR_RETURN(const Tensor* dy, GradInput(ctx, "Y@GRAD", x->dtype(), x->numel()));
  Tensor* dx = nullptr;
  Tensor* dscale = nullptr;
  Tensor* dbias = nullptr;
  if (ctx.HasOutput("X@GRAD")) {
    TS_ASSIGN_OR_RETURN(dx, ctx.Output("X@GRAD"));
  }
  if (ctx.HasOutput("Scale@GRAD")) {
    TS_ASSIGN_OR_RETURN(dscale, ctx.Output("Scale@GRAD"));
  }
  if (ctx.HasOutput("Bias@GRAD")) {
    TS_ASSIGN_OR_RETURN(dbias, ctx.Output("Bias@GRAD"));
  }
  for (const Tensor* t : {dx, dscale, dbias}) {
    if (t != nullptr && (t == x || t == scale || t == mean || t == var || t == dy)) {
      return ctx.Error("gradient outputs must not be the op's inputs");
    }
  }
  return DispatchFloat(ctx, "X", x->dtype(), [&](auto tag) -> absl::Status {
    using T = typename decltype(tag)::type;
    const T* in = x->data<T>();
    const T* g = dy->data<T>();
    std::vector<T> sum_dy(static_cast<size_t>(d.c)), sum_dy_xhat(static_cast<size_t>(d.c));
    std::vector<T> inv_std(static_cast<size_t>(d.c));
    for (int64_t c = 0; c < d.c; ++c) {
      inv_std[c] =
          global ? static_cast<T>(1.0 / std::sqrt(var->data<T>()[c] + eps)) : var->data<T>()[c];
      double s = 0, sx = 0;
      for (int64_t i = 0; i < d.n; ++i) {
        const int64_t off = (i * d.c + c) * d.inner;
        for (int64_t k = 0; k < d.inner; ++k) {
          s += g[off + k];
          sx += g[off + k] * (in[off + k] - mean->data<T>()[c]) * inv_std[c];
        }
      }
      sum_dy[c] = static_cast<T>(s);
      sum_dy_xhat[c] = static_cast<T>(sx);
    }
    if (dbias != nullptr) {
      dbias->Resize(x->dtype(), scale->shape());
      std::copy(sum_dy.begin(), sum_dy.end(), dbias->data<T>());
    }
    if (dscale != nullptr) {
      dscale->Resize(x->dtype(), scale->shape());
      std::copy(sum_dy_xhat.begin(), sum_dy_xhat.end(), dscale->data<T>());
    }
    if (dx == nullptr) return absl::OkStatus();
    dx->Resize(x->dtype(), x->shape());
    const T m = static_cast<T>(std::max<int64_t>(1, d.count()));
    T* out = dx->data<T>();
    for (int64_t i = 0; i < d.n; ++i) {
      for (int64_t c = 0; c < d.c; ++c) {
        const T a = scale->data<T>()[c] * inv_std[c];
        const T mu = mean->data<T>()[c];
        const int64_t off = (i * d.c + c) * d.inner;
        for (int64_t k = 0; k < d.inner; ++k) {
          if (global) {
            out[off + k] = a * g[off + k];
          } else {
            const T xhat = (in[off + k] - mu) * inv_std[c];
            out[off + k] = a * (g[off + k] - (sum_dy[c] + xhat * sum_dy_xhat[c]) / m);
          }
        }
      }
    }
    return absl::OkStatus();
  });
}

std::vector<OpDesc> BatchNormGradMaker(const OpDesc& fwd) {
  OpDesc g = MakeOp("batch_norm_grad",
                    {{"X", OpInputs(fwd, "X")},
                     {"Scale", OpInputs(fwd, "Scale")},
                     {"Mean", OpInputs(fwd, "Mean")},
                     {"Variance", OpInputs(fwd, "Variance")},
                     {"SavedMean", OpOutputs(fwd, "SavedMean")},
                     {"SavedVariance", OpOutputs(fwd, "SavedVariance")},
                     {GradVarName("Y"), {GradVarName(OpOutput(fwd, "Y"))}}},
                    {{GradVarName("X"), {GradVarName(OpInput(fwd, "X"))}},
                     {GradVarName("Scale"), {GradVarName(OpInput(fwd, "Scale"))}},
                     {GradVarName("Bias"), {GradVarName(OpInput(fwd, "Bias"))}}});
  *g.mutable_attrs() = fwd.attrs();
  return {g};
}

// ---------------------------------------------------------------------------------------------
// accuracy

absl::Status Accuracy(OpContext& ctx) {
  TS_ASSIGN_OR_RETURN(const Tensor* x, ctx.Input("X"));
  TS_ASSIGN_OR_RETURN(const Tensor* label, ctx.Input("Label"));
  const int64_t k = ctx.IntAttr("k", 1);
  if (k < 1) return ctx.Error(absl::StrCat("k ", k, " must be >= 1"));
  if (x->rank() != 2) {
    return ctx.Error(absl::StrCat("X '", ctx.InputName("X"), "' ", ShapeString(x->shape()),
                                  " must be 2-D [N, C]"));
  }
  const int64_t n = x->dim(0), classes = x->dim(1);
  if (label->dtype() != INT64 && label->dtype() != INT32) {
    return ctx.Error(absl::StrCat("Label '", ctx.InputName("Label"), "' is ",
                                  DataTypeName(label->dtype()), "; class ids are int64 or int32"));
  }
  if (label->numel() != n) {
    return ctx.Error(absl::StrCat("Label '", ctx.InputName("Label"), "' ",
                                  ShapeString(label->shape()),
                                  " must hold one class id per row of X '", ctx.InputName("X"),
                                  "' ", ShapeString(x->shape())));
  }
  TS_ASSIGN_OR_RETURN(Tensor * accuracy, ctx.Output("Accuracy"));
  if (accuracy == x || accuracy == label) return ctx.Error("Accuracy must not be X or Label");
  int64_t correct = 0;
  TS_RETURN_IF_ERROR(DispatchFloat(ctx, "X", x->dtype(), [&](auto tag) -> absl::Status {
    using T = typename decltype(tag)::type;
    for (int64_t i = 0; i < n; ++i) {
      const int64_t l =
          label->dtype() == INT64 ? label->data<int64_t>()[i] : label->data<int32_t>()[i];
      if (l < 0 || l >= classes) {
        return ctx.Error(absl::StrCat("Label '", ctx.InputName("Label"), "' has value ", l,
                                      " at row ", i, ", outside [0, ", classes, ")"));
      }
      correct += TopKCorrect(x->data<T>() + i * classes, classes, l, k);
    }
    accuracy->Resize(x->dtype(), {1});
    accuracy->data<T>()[0] =
        n == 0 ? T(0) : static_cast<T>(static_cast<double>(correct) / static_cast<double>(n));
    return absl::OkStatus();
  }));
  for (const auto& [slot, value] :
       {std::make_pair("Correct", correct), std::make_pair("Total", n)}) {
    if (!ctx.HasOutput(slot)) continue;
    TS_ASSIGN_OR_RETURN(Tensor * t, ctx.Output(slot));
    t->Resize(INT64, {1});
    t->data<int64_t>()[0] = value;
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status RegisterNnOps(OpRegistry* r) {
  TS_RETURN_IF_ERROR(r->Register("conv2d", {Conv2d, DefaultGradMaker({"Input", "Filter"})}));
  TS_RETURN_IF_ERROR(r->Register("conv2d_grad", {Conv2dGrad, nullptr}));
  TS_RETURN_IF_ERROR(r->Register("pool2d", {Pool2d, DefaultGradMaker({"X"})}));
  TS_RETURN_IF_ERROR(r->Register("pool2d_grad", {Pool2dGrad, nullptr}));
  TS_RETURN_IF_ERROR(r->Register("flatten", {Flatten, DefaultGradMaker({"X"})}));
  TS_RETURN_IF_ERROR(r->Register("flatten_grad", {FlattenGrad, nullptr}));
  TS_RETURN_IF_ERROR(r->Register("batch_norm", {BatchNorm, BatchNormGradMaker}));
  TS_RETURN_IF_ERROR(r->Register("batch_norm_grad", {BatchNormGrad, nullptr}));
  TS_RETURN_IF_ERROR(r->Register("accuracy", {Accuracy, nullptr}));
  return absl::OkStatus();
}

}  // namespace tessera
