#include "common/ops/math_ops.h"

#include <algorithm>
#include <string>
#include <type_traits>
#include <vector>

#include "Eigen/Core"
#include "absl/container/inlined_vector.h"
#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "common/ops/kernel_util.h"
#include "common/ops/small_gemm.h"

namespace tessera {

namespace {

// "X 'x' [4, 3]": a slot, its variable and its shape, for error messages.
std::string Describe(const OpContext& ctx, absl::string_view slot, const Tensor& t) {
  return absl::StrCat(slot, " '", ctx.InputName(slot), "' ", ShapeString(t.shape()));
}

absl::Status CheckSameDType(const OpContext& ctx, absl::string_view slot_a, const Tensor& a,
                            absl::string_view slot_b, const Tensor& b) {
  if (a.dtype() == b.dtype()) return absl::OkStatus();
  return ctx.Error(absl::StrCat(slot_a, " '", ctx.InputName(slot_a), "' is ",
                                DataTypeName(a.dtype()), " but ", slot_b, " '",
                                ctx.InputName(slot_b), "' is ", DataTypeName(b.dtype())));
}

// A gradient output of the same type and shape as `like`; never one of the op's inputs.
absl::StatusOr<Tensor*> GradOutput(OpContext& ctx, absl::string_view slot, const Tensor& like,
                                   std::initializer_list<const Tensor*> inputs) {
  TS_ASSIGN_OR_RETURN(Tensor * g, ctx.Output(slot));
  for (const Tensor* in : inputs) {
    if (g == in) {
      return ctx.Error(absl::StrCat("output ", slot, " '", ctx.OutputName(slot),
                                    "' must not be one of the op's inputs"));
    }
  }
  g->Resize(like.dtype(), like.shape());
  return g;
}

// c (+)= alpha * op(a) * op(b), op = transpose when ta/tb. `c` must not alias a or b.
template <typename T>
void Gemm(bool ta, bool tb, T alpha, const ConstEigenMatrix<T>& a, const ConstEigenMatrix<T>& b,
          bool accumulate, EigenMatrix<T>& c) {
  auto run = [&](const auto& lhs, const auto& rhs) {
    if (accumulate) {
      c.noalias() += alpha * lhs * rhs;
    } else {
      c.noalias() = alpha * lhs * rhs;
    }
  };
  if (!ta && !tb) {
    run(a, b);
  } else if (ta && !tb) {
    run(a.transpose(), b);
  } else if (!ta && tb) {
    run(a, b.transpose());
  } else {
    run(a.transpose(), b.transpose());
  }
}

// dst [rows, cols] = a [rows, 1] * b [1, cols]: a product with inner dimension 1 (the backward
// of a layer with one output, or a layer with one input), when Eigen would compute it with its
// GEMM or GEMV kernels (EIGEN_GEMM_TO_COEFFBASED_THRESHOLD): those add each product a[i] * b[j]
// to a zeroed destination, which this does too, for the same bits (a product of -0 is stored as
// +0), without zeroing the destination, packing the operands and sizing blocks first. Smaller
// products take Eigen's coefficient-based path, whose handling of -0 depends on alignment: they
// are left to Eigen.
bool IsOuterProduct(int64_t inner, int64_t rows, int64_t cols) {
  return inner == 1 && inner + rows + cols >= EIGEN_GEMM_TO_COEFFBASED_THRESHOLD;
}

template <typename T>
void OuterProduct(const T* a, const T* b, int64_t rows, int64_t cols, T* dst) {
  for (int64_t i = 0; i < rows; ++i) {
    const T ai = a[i];
    T* d = dst + i * cols;
    for (int64_t j = 0; j < cols; ++j) d[j] = ai * b[j] + T(0);
  }
}

// SmallGemm for float products it handles (the same bits as Eigen's; small_gemm.h); false for
// doubles and other shapes, which go to Eigen.
template <typename T>
bool SmallProduct(const T* a, int64_t a_row_stride, int64_t a_col_stride, const T* b, int64_t m,
                  int64_t k, int64_t n, T* c) {
  if constexpr (std::is_same_v<T, float>) {
    return SmallGemm(a, a_row_stride, a_col_stride, b, m, k, n, c);
  } else {
    return false;
  }
}

// ---------------------------------------------------------------------------------------------
// mul: Out = X (as a matrix of x_num_col_dims row dims) * Y (as a matrix of y_num_col_dims row
// dims). Out shape = X.dims[:x_num_col_dims] + Y.dims[y_num_col_dims:].

struct MulDims {
  int xn, yn;
  int64_t m, k, n;
};

absl::StatusOr<MulDims> GetMulDims(const OpContext& ctx, const Tensor& x, const Tensor& y) {
  MulDims d;
  d.xn = static_cast<int>(ctx.IntAttr("x_num_col_dims", 1));
  d.yn = static_cast<int>(ctx.IntAttr("y_num_col_dims", 1));
  if (d.xn < 1 || d.xn >= x.rank()) {
    return ctx.Error(absl::StrCat("x_num_col_dims ", d.xn, " must be in [1, ", x.rank(), ") for ",
                                  Describe(ctx, "X", x)));
  }
  if (d.yn < 1 || d.yn >= y.rank()) {
    return ctx.Error(absl::StrCat("y_num_col_dims ", d.yn, " must be in [1, ", y.rank(), ") for ",
                                  Describe(ctx, "Y", y)));
  }
  TS_RETURN_IF_ERROR(CheckSameDType(ctx, "X", x, "Y", y));
  auto [m, k] = x.MatrixDims(d.xn);
  auto [k2, n] = y.MatrixDims(d.yn);
  if (k != k2) {
    return ctx.Error(absl::StrCat(Describe(ctx, "X", x), " (matrix [", m, ", ", k, "]) and ",
                                  Describe(ctx, "Y", y), " (matrix [", k2, ", ", n,
                                  "]) disagree in the inner dimension"));
  }
  d.m = m;
  d.k = k;
  d.n = n;
  return d;
}

absl::Status Mul(OpContext& ctx) {
  TS_ASSIGN_OR_RETURN(const Tensor* x, ctx.Input("X"));
  TS_ASSIGN_OR_RETURN(const Tensor* y, ctx.Input("Y"));
  TS_ASSIGN_OR_RETURN(MulDims d, GetMulDims(ctx, *x, *y));
  TS_ASSIGN_OR_RETURN(Tensor * out, ctx.Output("Out"));
  if (out == x || out == y) return ctx.Error("Out must not be the same variable as X or Y");
  // X's leading dims, then Y's trailing ones (on the stack: Resize then allocates nothing when
  // Out has this shape already, as it does on every step after the first).
  absl::InlinedVector<int64_t, 8> shape(x->shape().begin(), x->shape().begin() + d.xn);
  shape.insert(shape.end(), y->shape().begin() + d.yn, y->shape().end());
  out->Resize(x->dtype(), shape);
  return DispatchFloat(ctx, "X", x->dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    if (IsOuterProduct(d.k, d.m, d.n)) {
      OuterProduct<T>(x->data<T>(), y->data<T>(), d.m, d.n, out->data<T>());
      return absl::OkStatus();
    }
    if (SmallProduct(x->data<T>(), d.k, 1, y->data<T>(), d.m, d.k, d.n, out->data<T>())) {
      return absl::OkStatus();
    }
    EigenMatrix<T> o(out->data<T>(), d.m, d.n);
    o.noalias() =
        ConstEigenMatrix<T>(x->data<T>(), d.m, d.k) * ConstEigenMatrix<T>(y->data<T>(), d.k, d.n);
    return absl::OkStatus();
  });
}

// mul_grad: X@GRAD = dOut * Y^T, Y@GRAD = X^T * dOut (each only when bound).
absl::Status MulGrad(OpContext& ctx) {
  TS_ASSIGN_OR_RETURN(const Tensor* x, ctx.Input("X"));
  TS_ASSIGN_OR_RETURN(const Tensor* y, ctx.Input("Y"));
  TS_ASSIGN_OR_RETURN(MulDims d, GetMulDims(ctx, *x, *y));
  TS_ASSIGN_OR_RETURN(const Tensor* dout, GradInput(ctx, "Out@GRAD", x->dtype(), d.m * d.n));
  Tensor* dx = nullptr;
  Tensor* dy = nullptr;
  if (ctx.HasOutput("X@GRAD")) {
    TS_ASSIGN_OR_RETURN(dx, GradOutput(ctx, "X@GRAD", *x, {x, y, dout}));
  }
  if (ctx.HasOutput("Y@GRAD")) {
    TS_ASSIGN_OR_RETURN(dy, GradOutput(ctx, "Y@GRAD", *y, {x, y, dout}));
  }
  return DispatchFloat(ctx, "X", x->dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    ConstEigenMatrix<T> g(dout->data<T>(), d.m, d.n);
    if (dx != nullptr) {
      if (IsOuterProduct(d.n, d.m, d.k)) {  // [m, 1] * [1, k]: Y has one column
        OuterProduct<T>(dout->data<T>(), y->data<T>(), d.m, d.k, dx->data<T>());
      } else {
        EigenMatrix<T> gx(dx->data<T>(), d.m, d.k);
        gx.noalias() = g * ConstEigenMatrix<T>(y->data<T>(), d.k, d.n).transpose();
      }
    }
    if (dy != nullptr) {
      if (IsOuterProduct(d.m, d.k, d.n)) {  // [k, 1] * [1, n]: X has one row
        OuterProduct<T>(x->data<T>(), dout->data<T>(), d.k, d.n, dy->data<T>());
      } else if (!SmallProduct(x->data<T>(), 1, d.k, dout->data<T>(), d.k, d.m, d.n,
                               dy->data<T>())) {  // X^T [k, m] * dOut [m, n]
        EigenMatrix<T> gy(dy->data<T>(), d.k, d.n);
        gy.noalias() = ConstEigenMatrix<T>(x->data<T>(), d.m, d.k).transpose() * g;
      }
    }
    return absl::OkStatus();
  });
}

// ---------------------------------------------------------------------------------------------
// matmul: Out = alpha * op(X) * op(Y) over the last two dims. Leading (batch) dims of X and Y
// must be equal, or one operand is 2-D and is reused for every batch.

struct MatmulDims {
  bool tx, ty;
  double alpha;
  int64_t batch;
  bool x_batched, y_batched;
  int64_t xr, xc, yr, yc;  // the stored matrix dims of one batch of X and Y
  int64_t m, k, n;
  Shape out_shape;
};

absl::StatusOr<MatmulDims> GetMatmulDims(const OpContext& ctx, const Tensor& x, const Tensor& y) {
  MatmulDims d;
  d.tx = ctx.BoolAttr("transpose_X", false);
  d.ty = ctx.BoolAttr("transpose_Y", false);
  d.alpha = ctx.FloatAttr("alpha", 1.0f);
  TS_RETURN_IF_ERROR(CheckSameDType(ctx, "X", x, "Y", y));
  if (x.rank() < 2 || y.rank() < 2) {
    return ctx.Error(absl::StrCat(Describe(ctx, "X", x), " and ", Describe(ctx, "Y", y),
                                  " must both have rank >= 2"));
  }
  Shape bx(x.shape().begin(), x.shape().end() - 2);
  Shape by(y.shape().begin(), y.shape().end() - 2);
  if (!bx.empty() && !by.empty() && bx != by) {
    return ctx.Error(absl::StrCat(Describe(ctx, "X", x), " and ", Describe(ctx, "Y", y),
                                  " have different batch dimensions"));
  }
  d.x_batched = !bx.empty();
  d.y_batched = !by.empty();
  d.out_shape = d.x_batched ? bx : by;
  d.batch = NumElements(d.out_shape);
  d.xr = x.dim(x.rank() - 2);
  d.xc = x.dim(x.rank() - 1);
  d.yr = y.dim(y.rank() - 2);
  d.yc = y.dim(y.rank() - 1);
  d.m = d.tx ? d.xc : d.xr;
  d.k = d.tx ? d.xr : d.xc;
  int64_t k2 = d.ty ? d.yc : d.yr;
  d.n = d.ty ? d.yr : d.yc;
  if (d.k != k2) {
    return ctx.Error(absl::StrCat(Describe(ctx, "X", x), " (transpose_X=", d.tx, ") and ",
                                  Describe(ctx, "Y", y), " (transpose_Y=", d.ty,
                                  ") disagree in the inner dimension: ", d.k, " vs ", k2));
  }
  d.out_shape.push_back(d.m);
  d.out_shape.push_back(d.n);
  return d;
}

absl::Status Matmul(OpContext& ctx) {
  TS_ASSIGN_OR_RETURN(const Tensor* x, ctx.Input("X"));
  TS_ASSIGN_OR_RETURN(const Tensor* y, ctx.Input("Y"));
  TS_ASSIGN_OR_RETURN(MatmulDims d, GetMatmulDims(ctx, *x, *y));
  TS_ASSIGN_OR_RETURN(Tensor * out, ctx.Output("Out"));
  if (out == x || out == y) return ctx.Error("Out must not be the same variable as X or Y");
  out->Resize(x->dtype(), d.out_shape);
  return DispatchFloat(ctx, "X", x->dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    const int64_t xs = d.x_batched ? d.xr * d.xc : 0, ys = d.y_batched ? d.yr * d.yc : 0;
    for (int64_t b = 0; b < d.batch; ++b) {
      ConstEigenMatrix<T> xm(x->data<T>() + b * xs, d.xr, d.xc);
      ConstEigenMatrix<T> ym(y->data<T>() + b * ys, d.yr, d.yc);
      EigenMatrix<T> om(out->data<T>() + b * d.m * d.n, d.m, d.n);
      Gemm<T>(d.tx, d.ty, static_cast<T>(d.alpha), xm, ym, /*accumulate=*/false, om);
    }
    return absl::OkStatus();
  });
}

// matmul_grad for every transpose combination. A 2-D operand broadcast over batches gets the
// sum of its per-batch gradients.
absl::Status MatmulGrad(OpContext& ctx) {
  TS_ASSIGN_OR_RETURN(const Tensor* x, ctx.Input("X"));
  TS_ASSIGN_OR_RETURN(const Tensor* y, ctx.Input("Y"));
  TS_ASSIGN_OR_RETURN(MatmulDims d, GetMatmulDims(ctx, *x, *y));
  TS_ASSIGN_OR_RETURN(const Tensor* dout,
                      GradInput(ctx, "Out@GRAD", x->dtype(), NumElements(d.out_shape)));
  Tensor* dx = nullptr;
  Tensor* dy = nullptr;
  if (ctx.HasOutput("X@GRAD")) {
    TS_ASSIGN_OR_RETURN(dx, GradOutput(ctx, "X@GRAD", *x, {x, y, dout}));
  }
  if (ctx.HasOutput("Y@GRAD")) {
    TS_ASSIGN_OR_RETURN(dy, GradOutput(ctx, "Y@GRAD", *y, {x, y, dout}));
  }
  return DispatchFloat(ctx, "X", x->dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    const T alpha = static_cast<T>(d.alpha);
    const int64_t xs = d.x_batched ? d.xr * d.xc : 0, ys = d.y_batched ? d.yr * d.yc : 0;
    for (int64_t b = 0; b < d.batch; ++b) {
      ConstEigenMatrix<T> xm(x->data<T>() + b * xs, d.xr, d.xc);
      ConstEigenMatrix<T> ym(y->data<T>() + b * ys, d.yr, d.yc);
      ConstEigenMatrix<T> g(dout->data<T>() + b * d.m * d.n, d.m, d.n);
      if (dx != nullptr) {
        // Out = X Y: dX = G Y^T;  X^T Y: dX = Y G^T;  X Y^T: dX = G Y;  X^T Y^T: dX = Y^T G^T.
        EigenMatrix<T> gx(dx->data<T>() + b * xs, d.xr, d.xc);
        bool acc = !d.x_batched && b > 0;
        if (!d.tx) {
          Gemm<T>(false, !d.ty, alpha, g, ym, acc, gx);
        } else {
          Gemm<T>(d.ty, true, alpha, ym, g, acc, gx);
        }
      }
      if (dy != nullptr) {
        // Out = X Y: dY = X^T G;  X^T Y: dY = X G;  X Y^T: dY = G^T X;  X^T Y^T: dY = G^T X^T.
        EigenMatrix<T> gy(dy->data<T>() + b * ys, d.yr, d.yc);
        bool acc = !d.y_batched && b > 0;
        if (!d.ty) {
          Gemm<T>(!d.tx, false, alpha, xm, g, acc, gy);
        } else {
          Gemm<T>(true, d.tx, alpha, g, xm, acc, gy);
        }
      }
    }
    return absl::OkStatus();
  });
}

// ---------------------------------------------------------------------------------------------
// elementwise_add/sub/mul with Fluid broadcasting: Y's shape (trailing 1s trimmed) equals
// X.dims[axis : axis + rank(Y)], so X is viewed as [pre, n, post] and Y as [n].

struct BcastDims {
  bool same;  // identical shapes: plain elementwise
  int64_t pre, n, post;
};

absl::StatusOr<BcastDims> GetBcastDims(const OpContext& ctx, const Tensor& x, const Tensor& y) {
  TS_RETURN_IF_ERROR(CheckSameDType(ctx, "X", x, "Y", y));
  BcastDims d{x.shape() == y.shape(), 1, x.numel(), 1};
  if (d.same) return d;
  int64_t axis = ctx.IntAttr("axis", -1);
  if (axis == -1) axis = x.rank() - y.rank();
  // Y's dims without trailing 1s (a view: no copy).
  absl::Span<const int64_t> ys = y.shape();
  while (!ys.empty() && ys.back() == 1) ys.remove_suffix(1);
  bool ok = axis >= 0 && y.rank() <= x.rank() && axis + static_cast<int64_t>(ys.size()) <= x.rank();
  for (size_t i = 0; ok && i < ys.size(); ++i) ok = x.dim(axis + i) == ys[i];
  if (!ok) {
    return ctx.Error(absl::StrCat(Describe(ctx, "Y", y), " cannot be broadcast to ",
                                  Describe(ctx, "X", x), " at axis ", ctx.IntAttr("axis", -1),
                                  ": Y's dims must equal a contiguous run of X's dims"));
  }
  d.pre = 1;
  for (int64_t i = 0; i < axis; ++i) d.pre *= x.dim(i);
  d.n = NumElements(ys);
  d.post = 1;
  for (int64_t i = axis + ys.size(); i < x.rank(); ++i) d.post *= x.dim(i);
  return d;
}

struct AddFn {
  template <typename A, typename B>
  auto operator()(const A& a, const B& b) const {
    return a + b;
  }
};
struct SubFn {
  template <typename A, typename B>
  auto operator()(const A& a, const B& b) const {
    return a - b;
  }
};
struct MulFn {
  template <typename A, typename B>
  auto operator()(const A& a, const B& b) const {
    return a * b;
  }
};

// Short rows (a bias of 1 to 128 values added to each example): an Eigen expression or a
// vectorized loop per row costs more to set up than the row takes to compute. Instead, kWidth
// columns at a time (a compile-time count, unrolled: their y values stay in registers), over all
// rows; the same operation on each element, so the same bits.
template <int kWidth, typename T, typename F>
inline void BroadcastColumns(const T* x, const T* y, T* out, int64_t rows, int64_t n, F f) {
  T yb[kWidth];
#pragma GCC unroll 64
  for (int j = 0; j < kWidth; ++j) yb[j] = y[j];
  for (int64_t i = 0; i < rows; ++i) {
    const T* xr = x + i * n;
    T v[kWidth];  // all of a row's values before any store: `out` may be `x`
#pragma GCC unroll 64
    for (int j = 0; j < kWidth; ++j) v[j] = f(xr[j], yb[j]);
#pragma GCC unroll 64
    for (int j = 0; j < kWidth; ++j) out[i * n + j] = v[j];
  }
}

// Column sums dy[j] = sum_i g[i, j] for kWidth columns, row after row (the order of the loop
// they replace, so the same bits), in registers instead of through dy on every row.
template <int kWidth, typename T>
inline void SumColumns(const T* g, int64_t rows, int64_t n, T* dy) {
  T acc[kWidth] = {};
  for (int64_t i = 0; i < rows; ++i) {
#pragma GCC unroll 64
    for (int j = 0; j < kWidth; ++j) acc[j] += g[i * n + j];
  }
#pragma GCC unroll 64
  for (int j = 0; j < kWidth; ++j) dy[j] = acc[j];
}

// The kernels above for one block of columns [j, j + kWidth) of a [rows, n] view.
template <typename T, typename F>
struct BroadcastBlock {
  const T* x;
  const T* y;
  T* out;
  int64_t rows, n;
  F f;
  template <int kWidth>
  void Run(int64_t j) const {
    BroadcastColumns<kWidth>(x + j, y + j, out + j, rows, n, f);
  }
};
template <typename T>
struct SumBlock {
  const T* g;
  int64_t rows, n;
  T* dy;
  template <int kWidth>
  void Run(int64_t j) const {
    SumColumns<kWidth>(g + j, rows, n, dy + j);
  }
};

// block.Run<width>(j) for the last `width` (< kMax + 1) columns, a compile-time width.
template <int kMax, typename Block>
void RunLastColumns(const Block& block, int64_t j, int64_t width) {
  if constexpr (kMax > 0) {
    if (width == kMax) {
      block.template Run<kMax>(j);
    } else {
      RunLastColumns<kMax - 1>(block, j, width);
    }
  }
}

// block.Run<width>(j) over columns [0, n): blocks 8 AVX registers wide, then one register wide,
// then the rest.
template <typename T, typename Block>
void ForColumnBlocks(int64_t n, const Block& block) {
  constexpr int kRegister = 32 / sizeof(T);  // values in one AVX register
  int64_t j = 0;
  for (; j + 8 * kRegister <= n; j += 8 * kRegister) block.template Run<8 * kRegister>(j);
  for (; j + kRegister <= n; j += kRegister) block.template Run<kRegister>(j);
  RunLastColumns<kRegister - 1>(block, j, n - j);
}

// out[i, j, k] = f(x[i, j, k], y[j]). `out` may alias `x` (elementwise, in order).
template <typename T, typename F>
void Broadcast(const BcastDims& d, const T* x, const T* y, T* out, F f) {
  if (d.same) {
    EigenVector<T>(out, d.n) = f(ConstEigenVector<T>(x, d.n), ConstEigenVector<T>(y, d.n));
  } else if (d.post == 1 && d.n <= 128) {
    ForColumnBlocks<T>(d.n, BroadcastBlock<T, F>{x, y, out, d.pre, d.n, f});
  } else if (d.post == 1) {
    // Plain loops, the inner one vectorized: the same operation on each element.
    for (int64_t i = 0; i < d.pre; ++i) {
      const T* xr = x + i * d.n;
      T* orow = out + i * d.n;
      for (int64_t j = 0; j < d.n; ++j) orow[j] = f(xr[j], y[j]);
    }
  } else {
    for (int64_t i = 0; i < d.pre; ++i) {
      for (int64_t j = 0; j < d.n; ++j) {
        int64_t off = (i * d.n + j) * d.post;
        EigenVector<T>(out + off, d.post) = f(ConstEigenVector<T>(x + off, d.post), y[j]);
      }
    }
  }
}

// dy[j] = scale * sum_{i,k} g[i, j, k] (* x[i, j, k] when x is given).
template <typename T>
void ReduceToY(const BcastDims& d, const T* g, const T* x, T scale, T* dy) {
  auto term = [&](int64_t off, int64_t len) {
    return x == nullptr
               ? ConstEigenVector<T>(g + off, len).sum()
               : (ConstEigenVector<T>(g + off, len) * ConstEigenVector<T>(x + off, len)).sum();
  };
  EigenVector<T> out(dy, d.n);
  if (d.same) {
    if (x == nullptr) {
      out = scale * ConstEigenVector<T>(g, d.n);
    } else {
      out = scale * ConstEigenVector<T>(g, d.n) * ConstEigenVector<T>(x, d.n);
    }
  } else if (d.post == 1 && x == nullptr) {
    // Column sums of a [pre, n] view, row after row as below (SumColumns), then the scale.
    ForColumnBlocks<T>(d.n, SumBlock<T>{g, d.pre, d.n, dy});
    if (scale != T(1)) out *= scale;
  } else if (d.post == 1) {
    out.setZero();
    for (int64_t i = 0; i < d.pre; ++i) {
      out += ConstEigenVector<T>(g + i * d.n, d.n) * ConstEigenVector<T>(x + i * d.n, d.n);
    }
    if (scale != T(1)) out *= scale;
  } else {
    for (int64_t j = 0; j < d.n; ++j) {
      T s = 0;
      for (int64_t i = 0; i < d.pre; ++i) s += term((i * d.n + j) * d.post, d.post);
      dy[j] = scale * s;
    }
  }
}

// The output of an elementwise op: X's type and shape. It may be X itself (in place) but not a
// broadcast Y.
absl::StatusOr<Tensor*> ElementwiseOutput(OpContext& ctx, absl::string_view slot, const Tensor& x,
                                          const Tensor* other, const BcastDims& d) {
  TS_ASSIGN_OR_RETURN(Tensor * out, ctx.Output(slot));
  if (out == &x) return out;
  if (out == other) {
    if (d.same) return out;
    return ctx.Error(absl::StrCat("output ", slot, " '", ctx.OutputName(slot),
                                  "' is a broadcast input; it must have X's shape"));
  }
  out->Resize(x.dtype(), x.shape());
  return out;
}

template <typename F>
KernelFn ElementwiseKernel() {
  return [](OpContext& ctx) -> absl::Status {
    TS_ASSIGN_OR_RETURN(const Tensor* x, ctx.Input("X"));
    TS_ASSIGN_OR_RETURN(const Tensor* y, ctx.Input("Y"));
    TS_ASSIGN_OR_RETURN(BcastDims d, GetBcastDims(ctx, *x, *y));
    TS_ASSIGN_OR_RETURN(Tensor * out, ElementwiseOutput(ctx, "Out", *x, y, d));
    return DispatchFloat(ctx, "X", x->dtype(), [&](auto tag) {
      using T = typename decltype(tag)::type;
      Broadcast<T>(d, x->data<T>(), y->data<T>(), out->data<T>(), F());
      return absl::OkStatus();
    });
  };
}

enum class ElementwiseKind { kAdd, kSub, kMul };

// Gradients of elementwise_{add,sub,mul}. add: dX = dOut, dY = reduce(dOut); sub: dY negated;
// mul: dX = dOut * Y (broadcast), dY = reduce(dOut * X).
template <ElementwiseKind kKind>
absl::Status ElementwiseGrad(OpContext& ctx) {
  TS_ASSIGN_OR_RETURN(const Tensor* x, ctx.Input("X"));
  TS_ASSIGN_OR_RETURN(const Tensor* y, ctx.Input("Y"));
  TS_ASSIGN_OR_RETURN(BcastDims d, GetBcastDims(ctx, *x, *y));
  TS_ASSIGN_OR_RETURN(const Tensor* dout, GradInput(ctx, "Out@GRAD", x->dtype(), x->numel()));
  const bool want_dx = ctx.HasOutput("X@GRAD"), want_dy = ctx.HasOutput("Y@GRAD");
  if (!want_dx && !want_dy) return absl::OkStatus();
  return DispatchFloat(ctx, "X", x->dtype(), [&](auto tag) -> absl::Status {
    using T = typename decltype(tag)::type;
    // dY first: for mul it reads X, and dX may be written in place of dOut.
    if (want_dy) {
      TS_ASSIGN_OR_RETURN(Tensor * dy, ctx.Output("Y@GRAD"));
      if (dy == x || dy == y || dy == dout) {
        return ctx.Error("Y@GRAD must not be one of the op's inputs");
      }
      dy->Resize(y->dtype(), y->shape());
      if (kKind == ElementwiseKind::kMul) {
        ReduceToY<T>(d, dout->data<T>(), x->data<T>(), T(1), dy->data<T>());
      } else {
        T scale = kKind == ElementwiseKind::kSub ? T(-1) : T(1);
        ReduceToY<T>(d, dout->data<T>(), nullptr, scale, dy->data<T>());
      }
    }
    if (want_dx) {
      TS_ASSIGN_OR_RETURN(Tensor * dx, ctx.Output("X@GRAD"));
      if (dx == x || dx == y) return ctx.Error("X@GRAD must not be X or Y");
      if (dx != dout) dx->Resize(x->dtype(), x->shape());
      if (kKind == ElementwiseKind::kMul) {
        Broadcast<T>(d, dout->data<T>(), y->data<T>(), dx->data<T>(), MulFn());
      } else if (dx != dout) {
        dx->flat<T>() = dout->flat<T>();
      }
    }
    return absl::OkStatus();
  });
}

// reduce_sum / reduce_mean (Fluid's): Out = sum (or mean) of X over the axes `dim` (negative
// counts from the end; every axis when `reduce_all`), which stay as size-1 axes with `keep_dim`.
// Reducing every axis without keep_dim gives [1].
struct ReducePlan {
  Shape out_shape;
  std::vector<bool> reduced;  // per axis of X
  int64_t count = 1;          // elements summed into each output element
};

absl::StatusOr<ReducePlan> PlanReduce(const OpContext& ctx, const Tensor& x) {
  ReducePlan plan;
  const int rank = x.rank();
  plan.reduced.assign(rank, ctx.BoolAttr("reduce_all", false));
  for (int64_t d : ctx.IntsAttr("dim")) {
    const int64_t axis = d < 0 ? d + rank : d;
    if (axis < 0 || axis >= rank) {
      return ctx.Error(absl::StrCat("dim ", d, " is out of range for X '", ctx.InputName("X"),
                                    "' ", ShapeString(x.shape())));
    }
    plan.reduced[axis] = true;
  }
  const bool keep = ctx.BoolAttr("keep_dim", false);
  for (int a = 0; a < rank; ++a) {
    if (plan.reduced[a]) {
      plan.count *= x.dim(a);
      if (keep) plan.out_shape.push_back(1);
    } else {
      plan.out_shape.push_back(x.dim(a));
    }
  }
  if (plan.out_shape.empty()) plan.out_shape = {1};
  return plan;
}

// For each element of X (row-major), the index of the output element it reduces into.
std::vector<int64_t> ReduceIndex(const Shape& x_shape, const std::vector<bool>& reduced) {
  const int rank = static_cast<int>(x_shape.size());
  std::vector<int64_t> out_stride(rank, 0);
  int64_t stride = 1;
  for (int a = rank - 1; a >= 0; --a) {
    if (reduced[a]) continue;
    out_stride[a] = stride;
    stride *= x_shape[a];
  }
  std::vector<int64_t> index(NumElements(x_shape));
  std::vector<int64_t> coord(rank, 0);
  for (int64_t i = 0; i < static_cast<int64_t>(index.size()); ++i) {
    int64_t o = 0;
    for (int a = 0; a < rank; ++a) o += coord[a] * out_stride[a];
    index[i] = o;
    for (int a = rank - 1; a >= 0; --a) {
      if (++coord[a] < x_shape[a]) break;
      coord[a] = 0;
    }
  }
  return index;
}

template <bool kMean>
absl::Status Reduce(OpContext& ctx) {
  TS_ASSIGN_OR_RETURN(const Tensor* x, ctx.Input("X"));
  TS_ASSIGN_OR_RETURN(ReducePlan plan, PlanReduce(ctx, *x));
  TS_ASSIGN_OR_RETURN(Tensor * out, ctx.Output("Out"));
  if (out == x) return ctx.Error("Out must not be X");
  const std::vector<int64_t> index = ReduceIndex(x->shape(), plan.reduced);
  return DispatchFloat(ctx, "X", x->dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    out->Resize(x->dtype(), plan.out_shape);
    T* o = out->data<T>();
    std::fill(o, o + out->numel(), T(0));
    const T* in = x->data<T>();
    for (size_t i = 0; i < index.size(); ++i) o[index[i]] += in[i];
    if (kMean && plan.count > 0) {
      for (int64_t i = 0; i < out->numel(); ++i) o[i] /= static_cast<T>(plan.count);
    }
    return absl::OkStatus();
  });
}

template <bool kMean>
absl::Status ReduceGrad(OpContext& ctx) {
  if (!ctx.HasOutput("X@GRAD")) return absl::OkStatus();
  TS_ASSIGN_OR_RETURN(const Tensor* x, ctx.Input("X"));
  TS_ASSIGN_OR_RETURN(ReducePlan plan, PlanReduce(ctx, *x));
  TS_ASSIGN_OR_RETURN(const Tensor* dout,
                      GradInput(ctx, "Out@GRAD", x->dtype(), NumElements(plan.out_shape)));
  TS_ASSIGN_OR_RETURN(Tensor * dx, ctx.Output("X@GRAD"));
  if (dx == x || dx == dout) return ctx.Error("X@GRAD must not be X or Out@GRAD");
  const std::vector<int64_t> index = ReduceIndex(x->shape(), plan.reduced);
  return DispatchFloat(ctx, "X", x->dtype(), [&](auto tag) {
    using T = typename decltype(tag)::type;
    dx->Resize(x->dtype(), x->shape());
    const T scale = kMean && plan.count > 0 ? T(1) / static_cast<T>(plan.count) : T(1);
    const T* g = dout->data<T>();
    T* d = dx->data<T>();
    for (size_t i = 0; i < index.size(); ++i) d[i] = g[index[i]] * scale;
    return absl::OkStatus();
  });
}

}  // namespace

absl::Status RegisterMathOps(OpRegistry* r) {
  TS_RETURN_IF_ERROR(r->Register("mul", {Mul, DefaultGradMaker({"X", "Y"})}));
  TS_RETURN_IF_ERROR(r->Register("reduce_sum", {Reduce<false>, DefaultGradMaker({"X"})}));
  TS_RETURN_IF_ERROR(r->Register("reduce_sum_grad", {ReduceGrad<false>, nullptr}));
  TS_RETURN_IF_ERROR(r->Register("reduce_mean", {Reduce<true>, DefaultGradMaker({"X"})}));
  TS_RETURN_IF_ERROR(r->Register("reduce_mean_grad", {ReduceGrad<true>, nullptr}));
  TS_RETURN_IF_ERROR(r->Register("mul_grad", {MulGrad, nullptr}));
  TS_RETURN_IF_ERROR(r->Register("matmul", {Matmul, DefaultGradMaker({"X", "Y"})}));
  TS_RETURN_IF_ERROR(r->Register("matmul_grad", {MatmulGrad, nullptr}));
  TS_RETURN_IF_ERROR(
      r->Register("elementwise_add", {ElementwiseKernel<AddFn>(), DefaultGradMaker({"X", "Y"})}));
  TS_RETURN_IF_ERROR(
      r->Register("elementwise_add_grad", {ElementwiseGrad<ElementwiseKind::kAdd>, nullptr}));
  TS_RETURN_IF_ERROR(
      r->Register("elementwise_sub", {ElementwiseKernel<SubFn>(), DefaultGradMaker({"X", "Y"})}));
  TS_RETURN_IF_ERROR(
      r->Register("elementwise_sub_grad", {ElementwiseGrad<ElementwiseKind::kSub>, nullptr}));
  TS_RETURN_IF_ERROR(
      r->Register("elementwise_mul", {ElementwiseKernel<MulFn>(), DefaultGradMaker({"X", "Y"})}));
  TS_RETURN_IF_ERROR(
      r->Register("elementwise_mul_grad", {ElementwiseGrad<ElementwiseKind::kMul>, nullptr}));
  return absl::OkStatus();
}

}  // namespace tessera
