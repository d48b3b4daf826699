#include "common/device/cuda/gpu_ops.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "absl/strings/str_cat.h"
#include "common/device/cuda/cuda_device.h"
#include "common/device/cuda/gpu_kernels.h"
#include "common/framework/op_desc.h"
#include "common/ops/dropout_util.h"
#include "common/ops/nn_geometry.h"
#include "common/base/status.h"

namespace tessera {

namespace {

// Every kernel below checks what it needs from the tensors' metadata first (host-side, valid on
// any place) and returns false — before moving or writing anything — for what it does not
// cover; the CPU kernel then runs the op and reports bad input with its usual message.

#define TS_CUDA(expr, what) TS_RETURN_IF_ERROR(CudaError((expr), (what)))

bool IsBound(const std::string& name) { return !name.empty() && name != kEmptyVarName; }

bool F32(const Tensor* t) { return t != nullptr && t->initialized() && t->dtype() == FLOAT32; }
float* Data(Tensor* t) { return t->data<float>(); }
const float* Data(const Tensor* t) { return t->data<float>(); }

// The device of `place`, made current for this thread (kernel launches and cuBLAS calls go to
// the current device).
absl::StatusOr<CudaDevice*> ActiveDevice(const Place& place) {
  TS_ASSIGN_OR_RETURN(CudaDevice * dev, CudaDevice::Get(place.device));
  TS_RETURN_IF_ERROR(dev->Activate());
  return dev;
}

// The dense tensor bound to an input slot without moving it (nullptr when absent/not dense).
const Tensor* Peek(const OpContext& ctx, absl::string_view slot, int i = 0) {
  auto t = ctx.Input(slot, i);
  return t.ok() ? *t : nullptr;
}

// A one-element float input read on the host (moved there: LearningRate, Beta1Pow...).
absl::StatusOr<double> HostScalar(OpContext& ctx, absl::string_view slot) {
  TS_ASSIGN_OR_RETURN(const Tensor* t, PlacedInput(ctx, slot, Place::Cpu()));
  return t->dtype() == FLOAT32 ? static_cast<double>(t->data<float>()[0]) : t->data<double>()[0];
}

bool IsHostScalar(const OpContext& ctx, absl::string_view slot) {
  const Tensor* t = Peek(ctx, slot);
  return t != nullptr && t->numel() == 1 && (t->dtype() == FLOAT32 || t->dtype() == FLOAT64);
}

// C[m, n] = alpha op(A) op(B) + beta C for row-major matrices; A is stored with a_cols
// columns, B with b_cols (cuBLAS is column-major: it computes C^T = op(B)^T op(A)^T).
absl::Status Gemm(CudaDevice* d, bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha,
                  const float* a, int64_t a_cols, const float* b, int64_t b_cols, float beta,
                  float* c) {
  if (m == 0 || n == 0) return absl::OkStatus();
  const int64_t lim = int64_t{1} << 31;
  if (m >= lim || n >= lim || k >= lim) {
    return absl::InvalidArgumentError(absl::StrCat("matrix [", m, ", ", k, "] x [", k, ", ", n,
                                                   "] is too large for cublasSgemm"));
  }
  return CublasError(
      cublasSgemm(d->cublas(), tb ? CUBLAS_OP_T : CUBLAS_OP_N, ta ? CUBLAS_OP_T : CUBLAS_OP_N,
                  static_cast<int>(n), static_cast<int>(m), static_cast<int>(k), &alpha, b,
                  static_cast<int>(std::max<int64_t>(b_cols, 1)), a,
                  static_cast<int>(std::max<int64_t>(a_cols, 1)), &beta, c, static_cast<int>(n)),
      "cublasSgemm");
}

// ---------------------------------------------------------------------------------------------
// basic ops

absl::StatusOr<bool> FillConstant(OpContext& ctx, const Place& place) {
  auto dtype = static_cast<DataType>(ctx.IntAttr("dtype", FLOAT32));
  Shape shape = ctx.IntsAttr("shape");
  if (dtype != FLOAT32) return false;
  for (int64_t d : shape) {
    if (d < 0) return false;
  }
  TS_ASSIGN_OR_RETURN(CudaDevice * dev, ActiveDevice(place));
  TS_ASSIGN_OR_RETURN(Tensor * out, PlacedOutput(ctx, "Out", place, FLOAT32, shape));
  TS_CUDA(gpu::Fill(Data(out), out->numel(), ctx.FloatAttr("value", 0.0f), dev->stream()),
          "fill_constant");
  return true;
}

absl::StatusOr<bool> FillZerosLike(OpContext& ctx, const Place& place) {
  const Tensor* x = Peek(ctx, "X");  // only its type and shape are read: it is not moved
  if (x == nullptr) return false;
  const DataType dtype = x->dtype();
  const Shape shape = x->shape();
  TS_ASSIGN_OR_RETURN(Tensor * out, PlacedOutput(ctx, "Out", place, dtype, shape));
  TS_RETURN_IF_ERROR(out->TrySetZero());
  return true;
}

absl::StatusOr<bool> Assign(OpContext& ctx, const Place& place) {
  const Tensor* x = Peek(ctx, "X");
  if (x == nullptr) return false;  // SelectedRows: CPU
  TS_ASSIGN_OR_RETURN(x, PlacedInput(ctx, "X", place));
  TS_ASSIGN_OR_RETURN(Tensor * out, PlacedOutput(ctx, "Out", place));
  if (out != x) TS_RETURN_IF_ERROR(out->TryCopyFrom(*x));
  return true;
}

absl::StatusOr<bool> Scale(OpContext& ctx, const Place& place) {
  const Tensor* x = Peek(ctx, "X");
  if (!F32(x)) return false;
  TS_ASSIGN_OR_RETURN(CudaDevice * dev, ActiveDevice(place));
  TS_ASSIGN_OR_RETURN(x, PlacedInput(ctx, "X", place));
  TS_ASSIGN_OR_RETURN(Tensor * out, PlacedOutput(ctx, "Out", place));
  if (out != x) TS_RETURN_IF_ERROR(out->TryResize(FLOAT32, x->shape()));
  TS_CUDA(gpu::Scale(Data(x), Data(out), x->numel(), ctx.FloatAttr("scale", 1.0f),
                     ctx.FloatAttr("bias", 0.0f), ctx.BoolAttr("bias_after_scale", true),
                     dev->stream()),
          "scale");
  return true;
}

// Dense float32 inputs of one shape only.
absl::StatusOr<bool> Sum(OpContext& ctx, const Place& place) {
  const int n = static_cast<int>(OpInputs(ctx.op(), "X").size());
  if (n == 0) return false;
  const Tensor* first = Peek(ctx, "X", 0);
  if (!F32(first)) return false;
  for (int i = 1; i < n; ++i) {
    const Tensor* t = Peek(ctx, "X", i);
    if (!F32(t) || t->shape() != first->shape()) return false;
  }
  TS_ASSIGN_OR_RETURN(CudaDevice * dev, ActiveDevice(place));
  Tensor acc;
  TS_RETURN_IF_ERROR(acc.TryResetPlace(place));  // uninitialized: allocates nothing
  for (int i = 0; i < n; ++i) {
    TS_ASSIGN_OR_RETURN(const Tensor* t, PlacedInput(ctx, "X", place, i));
    if (i == 0) {
      TS_RETURN_IF_ERROR(acc.TryCopyFrom(*t));
    } else {
      TS_CUDA(gpu::AddTo(Data(t), Data(&acc), acc.numel(), dev->stream()), "sum");
    }
  }
  TS_ASSIGN_OR_RETURN(Variable * outv, ctx.OutputVar("Out"));
  *outv->GetMutable<Tensor>() = acc;
  return true;
}

// ---------------------------------------------------------------------------------------------
// mul / matmul

absl::StatusOr<bool> MulImpl(OpContext& ctx, const Place& place, bool grad) {
  const Tensor* x = Peek(ctx, "X");
  const Tensor* y = Peek(ctx, "Y");
  if (!F32(x) || !F32(y)) return false;
  const int xn = static_cast<int>(ctx.IntAttr("x_num_col_dims", 1));
  const int yn = static_cast<int>(ctx.IntAttr("y_num_col_dims", 1));
  if (xn < 1 || xn >= x->rank() || yn < 1 || yn >= y->rank()) return false;
  auto [m, k] = x->MatrixDims(xn);
  auto [k2, n] = y->MatrixDims(yn);
  if (k != k2) return false;
  TS_ASSIGN_OR_RETURN(CudaDevice * dev, ActiveDevice(place));
  if (!grad) {
    TS_ASSIGN_OR_RETURN(const Tensor* out0, ctx.Output("Out"));
    if (out0 == x || out0 == y) return false;
    TS_ASSIGN_OR_RETURN(x, PlacedInput(ctx, "X", place));
    TS_ASSIGN_OR_RETURN(y, PlacedInput(ctx, "Y", place));
    Shape shape(x->shape().begin(), x->shape().begin() + xn);
    shape.insert(shape.end(), y->shape().begin() + yn, y->shape().end());
    TS_ASSIGN_OR_RETURN(Tensor * out, PlacedOutput(ctx, "Out", place, FLOAT32, std::move(shape)));
    TS_RETURN_IF_ERROR(Gemm(dev, false, false, m, n, k, 1.0f, Data(x), k, Data(y), n, 0.0f,
                            Data(out)));
    return true;
  }
  const Tensor* dout = Peek(ctx, "Out@GRAD");
  if (!F32(dout) || dout->numel() != m * n) return false;
  const bool want_dx = ctx.HasOutput("X@GRAD"), want_dy = ctx.HasOutput("Y@GRAD");
  for (const char* slot : {"X@GRAD", "Y@GRAD"}) {
    if (!ctx.HasOutput(slot)) continue;
    TS_ASSIGN_OR_RETURN(const Tensor* g, ctx.Output(slot));
    if (g == x || g == y || g == dout) return false;
  }
  TS_ASSIGN_OR_RETURN(x, PlacedInput(ctx, "X", place));
  TS_ASSIGN_OR_RETURN(y, PlacedInput(ctx, "Y", place));
  TS_ASSIGN_OR_RETURN(dout, PlacedInput(ctx, "Out@GRAD", place));
  if (want_dx) {  // dX = dOut Y^T
    TS_ASSIGN_OR_RETURN(Tensor * dx, PlacedOutput(ctx, "X@GRAD", place, FLOAT32, x->shape()));
    TS_RETURN_IF_ERROR(Gemm(dev, false, true, m, k, n, 1.0f, Data(dout), n, Data(y), n, 0.0f,
                            Data(dx)));
  }
  if (want_dy) {  // dY = X^T dOut
    TS_ASSIGN_OR_RETURN(Tensor * dy, PlacedOutput(ctx, "Y@GRAD", place, FLOAT32, y->shape()));
    TS_RETURN_IF_ERROR(Gemm(dev, true, false, k, n, m, 1.0f, Data(x), k, Data(dout), n, 0.0f,
                            Data(dy)));
  }
  return true;
}

absl::StatusOr<bool> Mul(OpContext& ctx, const Place& place) { return MulImpl(ctx, place, false); }
absl::StatusOr<bool> MulGrad(OpContext& ctx, const Place& place) {
  return MulImpl(ctx, place, true);
}

// matmul on 2-D operands (batched matmul runs on the CPU).
absl::StatusOr<bool> MatmulImpl(OpContext& ctx, const Place& place, bool grad) {
  const Tensor* x = Peek(ctx, "X");
  const Tensor* y = Peek(ctx, "Y");
  if (!F32(x) || !F32(y) || x->rank() != 2 || y->rank() != 2) return false;
  const bool tx = ctx.BoolAttr("transpose_X", false), ty = ctx.BoolAttr("transpose_Y", false);
  const float alpha = ctx.FloatAttr("alpha", 1.0f);
  const int64_t xr = x->dim(0), xc = x->dim(1), yr = y->dim(0), yc = y->dim(1);
  const int64_t m = tx ? xc : xr, k = tx ? xr : xc, k2 = ty ? yc : yr, n = ty ? yr : yc;
  if (k != k2) return false;
  TS_ASSIGN_OR_RETURN(CudaDevice * dev, ActiveDevice(place));
  if (!grad) {
    TS_ASSIGN_OR_RETURN(const Tensor* out0, ctx.Output("Out"));
    if (out0 == x || out0 == y) return false;
    TS_ASSIGN_OR_RETURN(x, PlacedInput(ctx, "X", place));
    TS_ASSIGN_OR_RETURN(y, PlacedInput(ctx, "Y", place));
    TS_ASSIGN_OR_RETURN(Tensor * out, PlacedOutput(ctx, "Out", place, FLOAT32, {m, n}));
    TS_RETURN_IF_ERROR(Gemm(dev, tx, ty, m, n, k, alpha, Data(x), xc, Data(y), yc, 0.0f,
                            Data(out)));
    return true;
  }
  const Tensor* dout = Peek(ctx, "Out@GRAD");
  if (!F32(dout) || dout->numel() != m * n) return false;
  for (const char* slot : {"X@GRAD", "Y@GRAD"}) {
    if (!ctx.HasOutput(slot)) continue;
    TS_ASSIGN_OR_RETURN(const Tensor* g, ctx.Output(slot));
    if (g == x || g == y || g == dout) return false;
  }
  TS_ASSIGN_OR_RETURN(x, PlacedInput(ctx, "X", place));
  TS_ASSIGN_OR_RETURN(y, PlacedInput(ctx, "Y", place));
  TS_ASSIGN_OR_RETURN(dout, PlacedInput(ctx, "Out@GRAD", place));
  const float* g = Data(dout);
  if (ctx.HasOutput("X@GRAD")) {
    // X Y: dX = G Y^T;  X^T Y: dX = Y G^T;  X Y^T: dX = G Y;  X^T Y^T: dX = Y^T G^T.
    TS_ASSIGN_OR_RETURN(Tensor * dx, PlacedOutput(ctx, "X@GRAD", place, FLOAT32, x->shape()));
    if (!tx) {
      TS_RETURN_IF_ERROR(Gemm(dev, false, !ty, xr, xc, n, alpha, g, n, Data(y), yc, 0, Data(dx)));
    } else {
      TS_RETURN_IF_ERROR(Gemm(dev, ty, true, xr, xc, n, alpha, Data(y), yc, g, n, 0, Data(dx)));
    }
  }
  if (ctx.HasOutput("Y@GRAD")) {
    // X Y: dY = X^T G;  X^T Y: dY = X G;  X Y^T: dY = G^T X;  X^T Y^T: dY = G^T X^T.
    TS_ASSIGN_OR_RETURN(Tensor * dy, PlacedOutput(ctx, "Y@GRAD", place, FLOAT32, y->shape()));
    if (!ty) {
      TS_RETURN_IF_ERROR(Gemm(dev, !tx, false, yr, yc, m, alpha, Data(x), xc, g, n, 0, Data(dy)));
    } else {
      TS_RETURN_IF_ERROR(Gemm(dev, true, tx, yr, yc, m, alpha, g, n, Data(x), xc, 0, Data(dy)));
    }
  }
  return true;
}

absl::StatusOr<bool> Matmul(OpContext& ctx, const Place& place) {
  return MatmulImpl(ctx, place, false);
}
absl::StatusOr<bool> MatmulGrad(OpContext& ctx, const Place& place) {
  return MatmulImpl(ctx, place, true);
}

// ---------------------------------------------------------------------------------------------
// elementwise ops with Fluid broadcasting (Y = a contiguous run of X's dims at `axis`)

struct Bcast {
  bool same;
  int64_t pre, n, post;
};

bool GetBcast(const OpContext& ctx, const Tensor& x, const Tensor& y, Bcast* d) {
  *d = Bcast{x.shape() == y.shape(), 1, x.numel(), 1};
  if (d->same) return true;
  int64_t axis = ctx.IntAttr("axis", -1);
  if (axis == -1) axis = x.rank() - y.rank();
  Shape ys = y.shape();
  while (!ys.empty() && ys.back() == 1) ys.pop_back();
  bool ok = axis >= 0 && y.rank() <= x.rank() && axis + static_cast<int64_t>(ys.size()) <= x.rank();
  for (size_t i = 0; ok && i < ys.size(); ++i) ok = x.dim(axis + i) == ys[i];
  if (!ok) return false;
  d->pre = 1;
  for (int64_t i = 0; i < axis; ++i) d->pre *= x.dim(i);
  d->n = NumElements(ys);
  d->post = 1;
  for (int64_t i = axis + ys.size(); i < x.rank(); ++i) d->post *= x.dim(i);
  return true;
}

DeviceKernelFn ElementwiseKernel(gpu::Binary f) {
  return [f](OpContext& ctx, const Place& place) -> absl::StatusOr<bool> {
    const Tensor* x = Peek(ctx, "X");
    const Tensor* y = Peek(ctx, "Y");
    Bcast d;
    if (!F32(x) || !F32(y) || !GetBcast(ctx, *x, *y, &d)) return false;
    TS_ASSIGN_OR_RETURN(const Tensor* out0, ctx.Output("Out"));
    if (out0 == y && out0 != x && !d.same) return false;
    TS_ASSIGN_OR_RETURN(CudaDevice * dev, ActiveDevice(place));
    TS_ASSIGN_OR_RETURN(x, PlacedInput(ctx, "X", place));
    TS_ASSIGN_OR_RETURN(y, PlacedInput(ctx, "Y", place));
    TS_ASSIGN_OR_RETURN(Tensor * out, PlacedOutput(ctx, "Out", place));
    if (out != x && out != y) TS_RETURN_IF_ERROR(out->TryResize(FLOAT32, x->shape()));
    TS_CUDA(gpu::BinaryBroadcast(f, Data(x), Data(y), Data(out), d.pre, d.n, d.post, d.same,
                                 dev->stream()),
            "elementwise");
    return true;
  };
}

DeviceKernelFn ElementwiseGradKernel(gpu::Binary f) {
  return [f](OpContext& ctx, const Place& place) -> absl::StatusOr<bool> {
    const Tensor* x = Peek(ctx, "X");
    const Tensor* y = Peek(ctx, "Y");
    const Tensor* dout = Peek(ctx, "Out@GRAD");
    Bcast d;
    if (!F32(x) || !F32(y) || !F32(dout) || !GetBcast(ctx, *x, *y, &d) ||
        dout->numel() != x->numel()) {
      return false;
    }
    const bool want_dx = ctx.HasOutput("X@GRAD"), want_dy = ctx.HasOutput("Y@GRAD");
    if (!want_dx && !want_dy) return true;
    const Tensor* dx0 = nullptr;
    if (want_dy) {
      TS_ASSIGN_OR_RETURN(const Tensor* dy0, ctx.Output("Y@GRAD"));
      if (dy0 == x || dy0 == y || dy0 == dout) return false;
    }
    if (want_dx) {
      TS_ASSIGN_OR_RETURN(dx0, ctx.Output("X@GRAD"));
      if (dx0 == x || dx0 == y) return false;
    }
    TS_ASSIGN_OR_RETURN(CudaDevice * dev, ActiveDevice(place));
    TS_ASSIGN_OR_RETURN(x, PlacedInput(ctx, "X", place));
    TS_ASSIGN_OR_RETURN(y, PlacedInput(ctx, "Y", place));
    TS_ASSIGN_OR_RETURN(dout, PlacedInput(ctx, "Out@GRAD", place));
    if (want_dy) {  // first: dX may be written in place of dOut
      TS_ASSIGN_OR_RETURN(Tensor * dy, PlacedOutput(ctx, "Y@GRAD", place, FLOAT32, y->shape()));
      const float scale = f == gpu::Binary::kSub ? -1.0f : 1.0f;
      const float* xm = f == gpu::Binary::kMul ? Data(x) : nullptr;
      TS_CUDA(gpu::ReduceToY(Data(dout), xm, d.pre, d.n, d.post, scale, Data(dy), dev->stream()),
              "elementwise_grad");
    }
    if (want_dx) {
      TS_ASSIGN_OR_RETURN(Tensor * dx, PlacedOutput(ctx, "X@GRAD", place));
      if (dx != dout) TS_RETURN_IF_ERROR(dx->TryResize(FLOAT32, x->shape()));
      if (f == gpu::Binary::kMul) {
        TS_CUDA(gpu::BinaryBroadcast(gpu::Binary::kMul, Data(dout), Data(y), Data(dx), d.pre,
                                     d.n, d.post, d.same, dev->stream()),
                "elementwise_mul_grad");
      } else if (dx != dout) {
        TS_RETURN_IF_ERROR(dx->TryCopyFrom(*dout));
      }
    }
    return true;
  };
}

// ---------------------------------------------------------------------------------------------
// activations

DeviceKernelFn ActivationKernel(gpu::Activation f) {
  return [f](OpContext& ctx, const Place& place) -> absl::StatusOr<bool> {
    const Tensor* x = Peek(ctx, "X");
    if (!F32(x)) return false;
    TS_ASSIGN_OR_RETURN(CudaDevice * dev, ActiveDevice(place));
    TS_ASSIGN_OR_RETURN(x, PlacedInput(ctx, "X", place));
    TS_ASSIGN_OR_RETURN(Tensor * out, PlacedOutput(ctx, "Out", place));
    if (out != x) TS_RETURN_IF_ERROR(out->TryResize(FLOAT32, x->shape()));
    TS_CUDA(gpu::ActivationForward(f, Data(x), Data(out), x->numel(), dev->stream()),
            "activation");
    return true;
  };
}

DeviceKernelFn ActivationGradKernel(gpu::Activation f) {
  return [f](OpContext& ctx, const Place& place) -> absl::StatusOr<bool> {
    if (!ctx.HasOutput("X@GRAD")) return true;
    const Tensor* out = Peek(ctx, "Out");
    const Tensor* dout = Peek(ctx, "Out@GRAD");
    if (!F32(out) || !F32(dout) || dout->shape() != out->shape()) return false;
    TS_ASSIGN_OR_RETURN(CudaDevice * dev, ActiveDevice(place));
    TS_ASSIGN_OR_RETURN(out, PlacedInput(ctx, "Out", place));
    TS_ASSIGN_OR_RETURN(dout, PlacedInput(ctx, "Out@GRAD", place));
    TS_ASSIGN_OR_RETURN(Tensor * dx, PlacedOutput(ctx, "X@GRAD", place));
    if (dx != out && dx != dout) TS_RETURN_IF_ERROR(dx->TryResize(FLOAT32, out->shape()));
    TS_CUDA(gpu::ActivationGrad(f, Data(out), Data(dout), Data(dx), out->numel(), dev->stream()),
            "activation_grad");
    return true;
  };
}

// ---------------------------------------------------------------------------------------------
// losses and reductions

absl::StatusOr<bool> Mean(OpContext& ctx, const Place& place) {
  const Tensor* x = Peek(ctx, "X");
  if (!F32(x) || x->numel() == 0) return false;
  TS_ASSIGN_OR_RETURN(const Tensor* out0, ctx.Output("Out"));
  if (out0 == x) return false;
  TS_ASSIGN_OR_RETURN(CudaDevice * dev, ActiveDevice(place));
  TS_ASSIGN_OR_RETURN(x, PlacedInput(ctx, "X", place));
  TS_ASSIGN_OR_RETURN(Tensor * out, PlacedOutput(ctx, "Out", place, FLOAT32, {1}));
  TS_CUDA(gpu::SumAll(Data(x), x->numel(), 1.0f / static_cast<float>(x->numel()), Data(out),
                      dev->stream()),
          "mean");
  return true;
}

absl::StatusOr<bool> MeanGrad(OpContext& ctx, const Place& place) {
  if (!ctx.HasOutput("X@GRAD")) return true;
  const Tensor* x = Peek(ctx, "X");
  const Tensor* dout = Peek(ctx, "Out@GRAD");
  if (!F32(x) || !F32(dout) || dout->numel() != 1) return false;
  TS_ASSIGN_OR_RETURN(const Tensor* dx0, ctx.Output("X@GRAD"));
  if (dx0 == x || dx0 == dout) return false;
  TS_ASSIGN_OR_RETURN(CudaDevice * dev, ActiveDevice(place));
  TS_ASSIGN_OR_RETURN(dout, PlacedInput(ctx, "Out@GRAD", place));
  TS_ASSIGN_OR_RETURN(Tensor * dx, PlacedOutput(ctx, "X@GRAD", place, FLOAT32, x->shape()));
  const float scale = 1.0f / static_cast<float>(std::max<int64_t>(x->numel(), 1));
  TS_CUDA(gpu::FillFromScalar(Data(dout), scale, Data(dx), dx->numel(), dev->stream()),
          "mean_grad");
  return true;
}

absl::StatusOr<bool> SquareError(OpContext& ctx, const Place& place) {
  const Tensor* x = Peek(ctx, "X");
  const Tensor* y = Peek(ctx, "Y");
  if (!F32(x) || !F32(y) || x->shape() != y->shape()) return false;
  TS_ASSIGN_OR_RETURN(CudaDevice * dev, ActiveDevice(place));
  TS_ASSIGN_OR_RETURN(x, PlacedInput(ctx, "X", place));
  TS_ASSIGN_OR_RETURN(y, PlacedInput(ctx, "Y", place));
  TS_ASSIGN_OR_RETURN(Tensor * out, PlacedOutput(ctx, "Out", place));
  if (out != x && out != y) TS_RETURN_IF_ERROR(out->TryResize(FLOAT32, x->shape()));
  TS_CUDA(gpu::SquareError(Data(x), Data(y), Data(out), x->numel(), dev->stream()),
          "square_error");
  return true;
}

absl::StatusOr<bool> SquareErrorGrad(OpContext& ctx, const Place& place) {
  const bool want_dx = ctx.HasOutput("X@GRAD"), want_dy = ctx.HasOutput("Y@GRAD");
  if (!want_dx && !want_dy) return true;
  const Tensor* x = Peek(ctx, "X");
  const Tensor* y = Peek(ctx, "Y");
  const Tensor* dout = Peek(ctx, "Out@GRAD");
  if (!F32(x) || !F32(y) || !F32(dout) || x->shape() != y->shape() ||
      dout->numel() != x->numel()) {
    return false;
  }
  const Tensor* dx0 = nullptr;
  if (want_dx) {
    TS_ASSIGN_OR_RETURN(dx0, ctx.Output("X@GRAD"));
    if (dx0 == x || dx0 == y || dx0 == dout) return false;
  }
  if (want_dy) {
    TS_ASSIGN_OR_RETURN(const Tensor* dy0, ctx.Output("Y@GRAD"));
    if (dy0 == x || dy0 == y || dy0 == dout || dy0 == dx0) return false;
  }
  TS_ASSIGN_OR_RETURN(CudaDevice * dev, ActiveDevice(place));
  TS_ASSIGN_OR_RETURN(x, PlacedInput(ctx, "X", place));
  TS_ASSIGN_OR_RETURN(y, PlacedInput(ctx, "Y", place));
  TS_ASSIGN_OR_RETURN(dout, PlacedInput(ctx, "Out@GRAD", place));
  float* dxp = nullptr;
  float* dyp = nullptr;
  if (want_dx) {
    TS_ASSIGN_OR_RETURN(Tensor * dx, PlacedOutput(ctx, "X@GRAD", place, FLOAT32, x->shape()));
    dxp = Data(dx);
  }
  if (want_dy) {
    TS_ASSIGN_OR_RETURN(Tensor * dy, PlacedOutput(ctx, "Y@GRAD", place, FLOAT32, y->shape()));
    dyp = Data(dy);
  }
  TS_CUDA(gpu::SquareErrorGrad(Data(x), Data(y), Data(dout), dxp, dyp, x->numel(), dev->stream()),
          "square_error_grad");
  return true;
}

// normalize=true (a data-dependent count) runs on the CPU.
absl::StatusOr<bool> SigmoidCe(OpContext& ctx, const Place& place) {
  const Tensor* x = Peek(ctx, "X");
  const Tensor* z = Peek(ctx, "Label");
  if (!F32(x) || !F32(z) || x->shape() != z->shape() || ctx.BoolAttr("normalize", false)) {
    return false;
  }
  const float ignore = static_cast<float>(ctx.IntAttr("ignore_index", -100));
  TS_ASSIGN_OR_RETURN(CudaDevice * dev, ActiveDevice(place));
  TS_ASSIGN_OR_RETURN(x, PlacedInput(ctx, "X", place));
  TS_ASSIGN_OR_RETURN(z, PlacedInput(ctx, "Label", place));
  TS_ASSIGN_OR_RETURN(Tensor * out, PlacedOutput(ctx, "Out", place));
  if (out != x && out != z) TS_RETURN_IF_ERROR(out->TryResize(FLOAT32, x->shape()));
  TS_CUDA(gpu::SigmoidCrossEntropy(Data(x), Data(z), Data(out), x->numel(), ignore, 1.0f,
                                   dev->stream()),
          "sigmoid_cross_entropy_with_logits");
  return true;
}

absl::StatusOr<bool> SigmoidCeGrad(OpContext& ctx, const Place& place) {
  if (!ctx.HasOutput("X@GRAD")) return true;
  const Tensor* x = Peek(ctx, "X");
  const Tensor* z = Peek(ctx, "Label");
  const Tensor* dout = Peek(ctx, "Out@GRAD");
  if (!F32(x) || !F32(z) || !F32(dout) || x->shape() != z->shape() ||
      dout->numel() != x->numel() || ctx.BoolAttr("normalize", false)) {
    return false;
  }
  TS_ASSIGN_OR_RETURN(const Tensor* dx0, ctx.Output("X@GRAD"));
  if (dx0 == x || dx0 == z) return false;
  const float ignore = static_cast<float>(ctx.IntAttr("ignore_index", -100));
  TS_ASSIGN_OR_RETURN(CudaDevice * dev, ActiveDevice(place));
  TS_ASSIGN_OR_RETURN(x, PlacedInput(ctx, "X", place));
  TS_ASSIGN_OR_RETURN(z, PlacedInput(ctx, "Label", place));
  TS_ASSIGN_OR_RETURN(dout, PlacedInput(ctx, "Out@GRAD", place));
  TS_ASSIGN_OR_RETURN(Tensor * dx, PlacedOutput(ctx, "X@GRAD", place));
  if (dx != dout) TS_RETURN_IF_ERROR(dx->TryResize(FLOAT32, x->shape()));
  TS_CUDA(gpu::SigmoidCrossEntropyGrad(Data(x), Data(z), Data(dout), Data(dx), x->numel(), ignore,
                                       1.0f, dev->stream()),
          "sigmoid_cross_entropy_with_logits_grad");
  return true;
}

// Labels of softmax_with_cross_entropy: hard int64 ids are checked on the host (an id outside
// [0, C) declines, so the CPU kernel reports it) and uploaded; soft labels stay on the device.
struct SoftmaxLabels {
  std::shared_ptr<char> hard;  // device int64 [rows]
  const float* soft = nullptr;
};

absl::StatusOr<bool> CheckSoftmaxInputs(const OpContext& ctx, const Tensor* logits,
                                        const Tensor* label, bool soft, int64_t* rows,
                                        int64_t* classes) {
  if (!F32(logits) || label == nullptr || logits->rank() < 2) return false;
  *classes = logits->dim(logits->rank() - 1);
  if (*classes == 0) return false;
  *rows = logits->numel() / *classes;
  Shape want = logits->shape();
  if (soft) {
    if (label->dtype() != FLOAT32) return false;
  } else {
    if (label->dtype() != INT64) return false;
    want.back() = 1;
  }
  return label->shape() == want;
}

absl::StatusOr<bool> PrepareSoftmaxLabels(OpContext& ctx, const Place& place, CudaDevice* dev,
                                          bool soft, int64_t rows, int64_t classes,
                                          SoftmaxLabels* out) {
  const int64_t ignore = ctx.IntAttr("ignore_index", -100);
  if (soft) {
    TS_ASSIGN_OR_RETURN(const Tensor* z, PlacedInput(ctx, "Label", place));
    out->soft = Data(z);
    return true;
  }
  const Tensor* label = Peek(ctx, "Label");
  if (!label->place().is_cpu()) {
    TS_ASSIGN_OR_RETURN(label, PlacedInput(ctx, "Label", Place::Cpu()));
  }
  const int64_t* ids = label->data<int64_t>();
  for (int64_t i = 0; i < rows; ++i) {
    if (ids[i] != ignore && (ids[i] < 0 || ids[i] >= classes)) return false;
  }
  TS_ASSIGN_OR_RETURN(out->hard, dev->Upload(ids, sizeof(int64_t) * rows));
  return true;
}

absl::StatusOr<bool> SoftmaxCe(OpContext& ctx, const Place& place) {
  const bool soft = ctx.BoolAttr("soft_label", false);
  const Tensor* logits = Peek(ctx, "Logits");
  const Tensor* label = Peek(ctx, "Label");
  int64_t rows = 0, c = 0;
  TS_ASSIGN_OR_RETURN(bool ok, CheckSoftmaxInputs(ctx, logits, label, soft, &rows, &c));
  if (!ok) return false;
  TS_ASSIGN_OR_RETURN(const Tensor* sm0, ctx.Output("Softmax"));
  TS_ASSIGN_OR_RETURN(const Tensor* loss0, ctx.Output("Loss"));
  if (sm0 == logits || sm0 == label || loss0 == logits || loss0 == label || sm0 == loss0) {
    return false;
  }
  TS_ASSIGN_OR_RETURN(CudaDevice * dev, ActiveDevice(place));
  SoftmaxLabels labels;
  TS_ASSIGN_OR_RETURN(ok, PrepareSoftmaxLabels(ctx, place, dev, soft, rows, c, &labels));
  if (!ok) return false;
  TS_ASSIGN_OR_RETURN(logits, PlacedInput(ctx, "Logits", place));
  Shape loss_shape = logits->shape();
  loss_shape.back() = 1;
  TS_ASSIGN_OR_RETURN(Tensor * softmax,
                      PlacedOutput(ctx, "Softmax", place, FLOAT32, logits->shape()));
  TS_ASSIGN_OR_RETURN(Tensor * loss,
                      PlacedOutput(ctx, "Loss", place, FLOAT32, std::move(loss_shape)));
  TS_CUDA(gpu::SoftmaxCrossEntropy(Data(logits),
                                   reinterpret_cast<const int64_t*>(labels.hard.get()),
                                   labels.soft, rows, c, ctx.IntAttr("ignore_index", -100),
                                   Data(softmax), Data(loss), dev->stream()),
          "softmax_with_cross_entropy");
  return true;
}

absl::StatusOr<bool> SoftmaxCeGrad(OpContext& ctx, const Place& place) {
  if (!ctx.HasOutput("Logits@GRAD")) return true;
  const bool soft = ctx.BoolAttr("soft_label", false);
  const Tensor* softmax = Peek(ctx, "Softmax");
  const Tensor* label = Peek(ctx, "Label");
  const Tensor* dloss = Peek(ctx, "Loss@GRAD");
  int64_t rows = 0, c = 0;
  TS_ASSIGN_OR_RETURN(bool ok, CheckSoftmaxInputs(ctx, softmax, label, soft, &rows, &c));
  if (!ok || !F32(dloss) || dloss->numel() != rows) return false;
  TS_ASSIGN_OR_RETURN(const Tensor* dx0, ctx.Output("Logits@GRAD"));
  if (dx0 == label || dx0 == dloss) return false;
  TS_ASSIGN_OR_RETURN(CudaDevice * dev, ActiveDevice(place));
  SoftmaxLabels labels;
  TS_ASSIGN_OR_RETURN(ok, PrepareSoftmaxLabels(ctx, place, dev, soft, rows, c, &labels));
  if (!ok) return false;
  TS_ASSIGN_OR_RETURN(softmax, PlacedInput(ctx, "Softmax", place));
  TS_ASSIGN_OR_RETURN(dloss, PlacedInput(ctx, "Loss@GRAD", place));
  TS_ASSIGN_OR_RETURN(Tensor * dx, PlacedOutput(ctx, "Logits@GRAD", place));
  if (dx != softmax) TS_RETURN_IF_ERROR(dx->TryResize(FLOAT32, softmax->shape()));
  TS_CUDA(gpu::SoftmaxCrossEntropyGrad(Data(softmax),
                                       reinterpret_cast<const int64_t*>(labels.hard.get()),
                                       labels.soft, Data(dloss), rows, c,
                                       ctx.IntAttr("ignore_index", -100), Data(dx),
                                       dev->stream()),
          "softmax_with_cross_entropy_grad");
  return true;
}

// ---------------------------------------------------------------------------------------------
// embedding

constexpr int64_t kNoPadding = -1;

// Ids on the host (fed there), checked against [0, vocab); the gather index (-1 for padding).
absl::StatusOr<bool> LookupIndex(OpContext& ctx, const Tensor* w, std::vector<int64_t>* index,
                                 std::vector<int64_t>* host_ids) {
  const Tensor* ids = Peek(ctx, "Ids");
  if (ids == nullptr || ids->dtype() != INT64 || !F32(w) || w->rank() != 2) return false;
  if (!ids->place().is_cpu()) {
    TS_ASSIGN_OR_RETURN(ids, PlacedInput(ctx, "Ids", Place::Cpu()));
  }
  const int64_t padding = ctx.IntAttr("padding_idx", kNoPadding);
  const int64_t n = ids->numel(), vocab = w->dim(0);
  const int64_t* p = ids->data<int64_t>();
  index->resize(n);
  if (host_ids != nullptr) host_ids->assign(p, p + n);
  for (int64_t i = 0; i < n; ++i) {
    if (padding != kNoPadding && p[i] == padding) {
      (*index)[i] = -1;
    } else if (p[i] < 0 || p[i] >= vocab) {
      return false;
    } else {
      (*index)[i] = p[i];
    }
  }
  return true;
}

absl::StatusOr<bool> LookupTable(OpContext& ctx, const Place& place) {
  const Tensor* w = Peek(ctx, "W");
  const Tensor* ids = Peek(ctx, "Ids");
  std::vector<int64_t> index;
  TS_ASSIGN_OR_RETURN(bool ok, LookupIndex(ctx, w, &index, nullptr));
  if (!ok) return false;
  TS_ASSIGN_OR_RETURN(const Tensor* out0, ctx.Output("Out"));
  if (out0 == w || out0 == ids) return false;
  TS_ASSIGN_OR_RETURN(CudaDevice * dev, ActiveDevice(place));
  Shape shape = Peek(ctx, "Ids")->shape();
  if (shape.size() > 1 && shape.back() == 1) shape.pop_back();
  shape.push_back(w->dim(1));
  TS_ASSIGN_OR_RETURN(w, PlacedInput(ctx, "W", place));
  TS_ASSIGN_OR_RETURN(Tensor * out, PlacedOutput(ctx, "Out", place, FLOAT32, std::move(shape)));
  out->set_lod(ids->lod());
  if (index.empty()) return true;
  TS_ASSIGN_OR_RETURN(std::shared_ptr<char> dindex,
                      dev->Upload(index.data(), sizeof(int64_t) * index.size()));
  TS_CUDA(gpu::GatherRows(Data(w), reinterpret_cast<const int64_t*>(dindex.get()),
                          static_cast<int64_t>(index.size()), w->dim(1), Data(out),
                          dev->stream()),
          "lookup_table");
  return true;
}

// Dense: W@GRAD [V, D] zero plus scatter-added rows. Sparse: a SelectedRows whose rows (host)
// are the non-padding ids in batch order and whose value (device) gathers their gradient rows.
absl::StatusOr<bool> LookupTableGrad(OpContext& ctx, const Place& place) {
  if (!ctx.HasOutput("W@GRAD")) return true;
  const Tensor* w = Peek(ctx, "W");
  const Tensor* dout = Peek(ctx, "Out@GRAD");
  std::vector<int64_t> index, ids;
  TS_ASSIGN_OR_RETURN(bool ok, LookupIndex(ctx, w, &index, &ids));
  if (!ok) return false;
  const int64_t n = static_cast<int64_t>(index.size()), width = w->dim(1);
  if (!F32(dout) || dout->numel() != n * width) return false;
  TS_ASSIGN_OR_RETURN(CudaDevice * dev, ActiveDevice(place));
  TS_ASSIGN_OR_RETURN(dout, PlacedInput(ctx, "Out@GRAD", place));
  TS_ASSIGN_OR_RETURN(Variable * dw_var, ctx.OutputVar("W@GRAD"));
  if (ctx.BoolAttr("is_sparse", false)) {
    std::vector<int64_t> kept;  // positions of non-padding ids
    SelectedRows* sr = dw_var->GetMutable<SelectedRows>();
    sr->height = w->dim(0);
    sr->rows.clear();
    for (int64_t i = 0; i < n; ++i) {
      if (index[i] < 0) continue;
      kept.push_back(i);
      sr->rows.push_back(ids[i]);
    }
    TS_RETURN_IF_ERROR(sr->value.TryResetPlace(place));
    TS_RETURN_IF_ERROR(sr->value.TryResize(FLOAT32, {static_cast<int64_t>(kept.size()), width}));
    if (kept.empty()) return true;
    TS_ASSIGN_OR_RETURN(std::shared_ptr<char> dkept,
                        dev->Upload(kept.data(), sizeof(int64_t) * kept.size()));
    TS_CUDA(gpu::GatherRows(Data(dout), reinterpret_cast<const int64_t*>(dkept.get()),
                            static_cast<int64_t>(kept.size()), width, Data(&sr->value),
                            dev->stream()),
            "lookup_table_grad");
    return true;
  }
  Tensor* dw = dw_var->GetMutable<Tensor>();
  TS_RETURN_IF_ERROR(dw->TryResetPlace(place));
  TS_RETURN_IF_ERROR(dw->TryResize(FLOAT32, {w->dim(0), width}));
  TS_RETURN_IF_ERROR(dw->TrySetZero());
  if (n == 0) return true;
  TS_ASSIGN_OR_RETURN(std::shared_ptr<char> dindex,
                      dev->Upload(index.data(), sizeof(int64_t) * index.size()));
  TS_CUDA(gpu::ScatterAddRows(Data(dout), reinterpret_cast<const int64_t*>(dindex.get()), n,
                              width, Data(dw), dev->stream()),
          "lookup_table_grad");
  return true;
}

// ---------------------------------------------------------------------------------------------
// concat / split: strided device copies (cudaMemcpy2DAsync), any dtype


// Copies `outer` rows of `row` bytes from src (pitch src_pitch) to dst (pitch dst_pitch).
absl::Status Copy2D(CudaDevice* dev, char* dst, size_t dst_pitch, const char* src,
                    size_t src_pitch, size_t row, int64_t outer) {
  if (row == 0 || outer == 0) return absl::OkStatus();
  return CudaError(cudaMemcpy2DAsync(dst, dst_pitch, src, src_pitch, row,
                                     static_cast<size_t>(outer), cudaMemcpyDeviceToDevice,
                                     dev->stream()),
                   "cudaMemcpy2DAsync");
}

// The inputs X agree except along `axis` (normalized); false otherwise.
bool ConcatInputs(const OpContext& ctx, int64_t* axis, std::vector<const Tensor*>* xs) {
  const int n = static_cast<int>(OpInputs(ctx.op(), "X").size());
  for (int i = 0; i < n; ++i) {
    const Tensor* t = Peek(ctx, "X", i);
    if (t == nullptr) return false;
    xs->push_back(t);
  }
  if (xs->empty()) return false;
  const Tensor* x0 = (*xs)[0];
  if (*axis < 0) *axis += x0->rank();
  if (*axis < 0 || *axis >= x0->rank()) return false;
  for (const Tensor* x : *xs) {
    if (x->dtype() != x0->dtype() || x->rank() != x0->rank()) return false;
    for (int d = 0; d < x->rank(); ++d) {
      if (d != *axis && x->dim(d) != x0->dim(d)) return false;
    }
  }
  return true;
}

absl::StatusOr<bool> Concat(OpContext& ctx, const Place& place) {
  int64_t axis = ctx.IntAttr("axis", 0);
  std::vector<const Tensor*> xs;
  if (!ConcatInputs(ctx, &axis, &xs)) return false;
  TS_ASSIGN_OR_RETURN(const Tensor* out0, ctx.Output("Out"));
  for (const Tensor* x : xs) {
    if (x == out0) return false;
  }
  TS_ASSIGN_OR_RETURN(CudaDevice * dev, ActiveDevice(place));
  Shape shape = xs[0]->shape();
  shape[axis] = 0;
  for (const Tensor* x : xs) shape[axis] += x->dim(axis);
  for (size_t i = 0; i < xs.size(); ++i) {
    TS_ASSIGN_OR_RETURN(xs[i], PlacedInput(ctx, "X", place, static_cast<int>(i)));
  }
  TS_ASSIGN_OR_RETURN(Tensor * out, PlacedOutput(ctx, "Out", place, xs[0]->dtype(), shape));
  const size_t es = SizeOf(out->dtype());
  const int64_t outer = OuterElements(shape, axis), inner = InnerElements(shape, axis);
  const size_t out_row = static_cast<size_t>(shape[axis] * inner) * es;
  size_t offset = 0;
  for (const Tensor* x : xs) {
    const size_t row = static_cast<size_t>(x->dim(axis) * inner) * es;
    TS_RETURN_IF_ERROR(Copy2D(dev, static_cast<char*>(out->raw_data()) + offset, out_row,
                              static_cast<const char*>(x->raw_data()), row, row, outer));
    offset += row;
  }
  return true;
}

absl::StatusOr<bool> ConcatGrad(OpContext& ctx, const Place& place) {
  int64_t axis = ctx.IntAttr("axis", 0);
  std::vector<const Tensor*> xs;
  if (!ConcatInputs(ctx, &axis, &xs)) return false;
  const Tensor* dout = Peek(ctx, "Out@GRAD");
  if (dout == nullptr) return false;
  Shape want = xs[0]->shape();
  want[axis] = 0;
  for (const Tensor* x : xs) want[axis] += x->dim(axis);
  if (dout->shape() != want || dout->dtype() != xs[0]->dtype()) return false;
  const int n_out = static_cast<int>(OpOutputs(ctx.op(), "X@GRAD").size());
  std::vector<bool> bound(xs.size(), false);
  for (size_t i = 0; i < xs.size(); ++i) {
    if (static_cast<int>(i) >= n_out || !IsBound(ctx.OutputName("X@GRAD", i))) continue;
    TS_ASSIGN_OR_RETURN(const Tensor* g, ctx.Output("X@GRAD", i));
    if (g == dout) return false;
    for (const Tensor* x : xs) {
      if (g == x) return false;
    }
    bound[i] = true;
  }
  TS_ASSIGN_OR_RETURN(CudaDevice * dev, ActiveDevice(place));
  TS_ASSIGN_OR_RETURN(dout, PlacedInput(ctx, "Out@GRAD", place));
  const size_t es = SizeOf(dout->dtype());
  const int64_t outer = OuterElements(want, axis), inner = InnerElements(want, axis);
  const size_t in_row = static_cast<size_t>(want[axis] * inner) * es;
  size_t offset = 0;
  for (size_t i = 0; i < xs.size(); ++i) {
    const size_t row = static_cast<size_t>(xs[i]->dim(axis) * inner) * es;
    if (bound[i]) {
      const Shape shape = xs[i]->shape();
      TS_ASSIGN_OR_RETURN(Tensor * g, PlacedOutput(ctx, "X@GRAD", place, dout->dtype(), shape,
                                                   static_cast<int>(i)));
      TS_RETURN_IF_ERROR(Copy2D(dev, static_cast<char*>(g->raw_data()), row,
                                static_cast<const char*>(dout->raw_data()) + offset, in_row, row,
                                outer));
    }
    offset += row;
  }
  return true;
}

absl::StatusOr<bool> Split(OpContext& ctx, const Place& place) {
  const Tensor* x = Peek(ctx, "X");
  if (x == nullptr) return false;
  int64_t axis = ctx.IntAttr("axis", 0);
  if (axis < 0) axis += x->rank();
  if (axis < 0 || axis >= x->rank()) return false;
  const int64_t dim = x->dim(axis);
  const int n_out = static_cast<int>(OpOutputs(ctx.op(), "Out").size());
  if (n_out == 0) return false;
  std::vector<int64_t> sizes = ctx.IntsAttr("sections");
  const int64_t num = ctx.IntAttr("num", 0);
  if (!sizes.empty()) {
    if (static_cast<int>(sizes.size()) != n_out) return false;
    int infer = -1;
    int64_t known = 0;
    for (int i = 0; i < n_out; ++i) {
      if (sizes[i] == -1 && infer < 0) {
        infer = i;
      } else if (sizes[i] < 0) {
        return false;
      } else {
        known += sizes[i];
      }
    }
    if (infer >= 0 ? known > dim : known != dim) return false;
    if (infer >= 0) sizes[infer] = dim - known;
  } else {
    if (num < 0 || (num > 0 && num != n_out) || dim % n_out != 0) return false;
    sizes.assign(n_out, dim / n_out);
  }
  for (int i = 0; i < n_out; ++i) {
    if (!IsBound(ctx.OutputName("Out", i))) continue;
    TS_ASSIGN_OR_RETURN(const Tensor* o, ctx.Output("Out", i));
    if (o == x) return false;
  }
  TS_ASSIGN_OR_RETURN(CudaDevice * dev, ActiveDevice(place));
  TS_ASSIGN_OR_RETURN(x, PlacedInput(ctx, "X", place));
  const size_t es = SizeOf(x->dtype());
  const int64_t outer = OuterElements(x->shape(), axis), inner = InnerElements(x->shape(), axis);
  const size_t in_row = static_cast<size_t>(dim * inner) * es;
  size_t offset = 0;
  for (int i = 0; i < n_out; ++i) {
    const size_t row = static_cast<size_t>(sizes[i] * inner) * es;
    if (IsBound(ctx.OutputName("Out", i))) {
      Shape shape = x->shape();
      shape[axis] = sizes[i];
      TS_ASSIGN_OR_RETURN(Tensor * o, PlacedOutput(ctx, "Out", place, x->dtype(), shape, i));
      if (axis > 0) o->set_lod(x->lod());  // the same rows: X's sequences (as the CPU kernel)
      TS_RETURN_IF_ERROR(Copy2D(dev, static_cast<char*>(o->raw_data()), row,
                                static_cast<const char*>(x->raw_data()) + offset, in_row, row,
                                outer));
    }
    offset += row;
  }
  return true;
}

// ---------------------------------------------------------------------------------------------
// image ops (NCHW): conv2d, pool2d, flatten, batch_norm. The checks mirror common/ops/nn_ops.cc;
// what its kernels would reject declines.

// Device scratch memory for `floats` floats of an op's temporaries.
absl::StatusOr<std::shared_ptr<char>> Scratch(const OpContext& ctx, CudaDevice* dev,
                                              const Place& place, int64_t floats) {
  std::shared_ptr<char> p = dev->Allocate(sizeof(float) * static_cast<size_t>(floats));
  if (p == nullptr) {
    return absl::ResourceExhaustedError(absl::StrCat("out of memory on ", place.DebugString(),
                                                     " allocating ", sizeof(float) * floats,
                                                     " bytes of scratch for ", ctx.op().type()));
  }
  return p;
}

float* Floats(const std::shared_ptr<char>& p) { return reinterpret_cast<float*>(p.get()); }

struct ConvDims {
  gpu::ConvShape g;
  int64_t n = 0, m = 0;
  int64_t ckk() const { return g.c * g.kh * g.kw; }
  int64_t p() const { return g.ho * g.wo; }
};

// Input [N, C, H, W] and Filter [M, C, kh, kw], float32, with the geometry the CPU kernel
// accepts (nn::GetConvGeometry; C == 0 declines too).
bool GetConvDims(const OpContext& ctx, const Tensor* input, const Tensor* filter, ConvDims* d) {
  if (!F32(input) || !F32(filter)) return false;
  absl::StatusOr<nn::ConvGeometry> geometry = nn::GetConvGeometry(ctx, *input, *filter);
  if (!geometry.ok() || geometry->c == 0) return false;
  const nn::ConvGeometry& c = *geometry;
  d->n = c.n;
  d->m = c.m;
  d->g = gpu::ConvShape{c.c, c.h, c.w, c.kh, c.kw, c.sh, c.sw, c.ph, c.pw, c.dh, c.dw, c.ho, c.wo};
  return true;
}

// Samples per im2col chunk: the column buffer stays under 16M floats (64 MB).
int64_t ConvChunk(const ConvDims& d) {
  const int64_t per_sample = std::max<int64_t>(1, d.ckk() * d.p());
  return std::max<int64_t>(1, std::min<int64_t>(d.n, (int64_t{1} << 24) / per_sample));
}

// Output_n [M, P] = Filter [M, CKK] col_n [CKK, P] for each sample n, straight into NCHW.
absl::StatusOr<bool> Conv2d(OpContext& ctx, const Place& place) {
  const Tensor* input = Peek(ctx, "Input");
  const Tensor* filter = Peek(ctx, "Filter");
  ConvDims d;
  if (!GetConvDims(ctx, input, filter, &d)) return false;
  TS_ASSIGN_OR_RETURN(const Tensor* out0, ctx.Output("Output"));
  if (out0 == input || out0 == filter) return false;
  TS_ASSIGN_OR_RETURN(CudaDevice * dev, ActiveDevice(place));
  TS_ASSIGN_OR_RETURN(input, PlacedInput(ctx, "Input", place));
  TS_ASSIGN_OR_RETURN(filter, PlacedInput(ctx, "Filter", place));
  TS_ASSIGN_OR_RETURN(Tensor * out,
                      PlacedOutput(ctx, "Output", place, FLOAT32, {d.n, d.m, d.g.ho, d.g.wo}));
  if (out->numel() == 0) return true;
  const int64_t chunk = ConvChunk(d), ckk = d.ckk(), p = d.p();
  TS_ASSIGN_OR_RETURN(std::shared_ptr<char> col, Scratch(ctx, dev, place, chunk * ckk * p));
  for (int64_t first = 0; first < d.n; first += chunk) {
    const int64_t count = std::min(chunk, d.n - first);
    TS_CUDA(gpu::Im2Col(d.g, Data(input) + first * d.g.c * d.g.h * d.g.w, count, Floats(col),
                        dev->stream()),
            "conv2d im2col");
    for (int64_t s = 0; s < count; ++s) {
      TS_RETURN_IF_ERROR(Gemm(dev, false, false, d.m, p, ckk, 1.0f, Data(filter), ckk,
                              Floats(col) + s * ckk * p, p, 0.0f,
                              Data(out) + (first + s) * d.m * p));
    }
  }
  return true;
}

// Filter@GRAD = sum_n dOut_n col_n^T; Input@GRAD_n = col2im(Filter^T dOut_n) (each when bound).
absl::StatusOr<bool> Conv2dGrad(OpContext& ctx, const Place& place) {
  const bool want_dx = ctx.HasOutput("Input@GRAD"), want_dw = ctx.HasOutput("Filter@GRAD");
  if (!want_dx && !want_dw) return true;
  const Tensor* input = Peek(ctx, "Input");
  const Tensor* filter = Peek(ctx, "Filter");
  const Tensor* dout = Peek(ctx, "Output@GRAD");
  ConvDims d;
  if (!GetConvDims(ctx, input, filter, &d)) return false;
  const int64_t ckk = d.ckk(), p = d.p();
  if (!F32(dout) || dout->numel() != d.n * d.m * p) return false;
  const Tensor* dx0 = nullptr;
  if (want_dx) {
    TS_ASSIGN_OR_RETURN(dx0, ctx.Output("Input@GRAD"));
    if (dx0 == input || dx0 == filter || dx0 == dout) return false;
  }
  if (want_dw) {
    TS_ASSIGN_OR_RETURN(const Tensor* dw0, ctx.Output("Filter@GRAD"));
    if (dw0 == input || dw0 == filter || dw0 == dout || dw0 == dx0) return false;
  }
  TS_ASSIGN_OR_RETURN(CudaDevice * dev, ActiveDevice(place));
  TS_ASSIGN_OR_RETURN(input, PlacedInput(ctx, "Input", place));
  TS_ASSIGN_OR_RETURN(filter, PlacedInput(ctx, "Filter", place));
  TS_ASSIGN_OR_RETURN(dout, PlacedInput(ctx, "Output@GRAD", place));
  Tensor* dx = nullptr;
  Tensor* dw = nullptr;
  if (want_dx) {
    TS_ASSIGN_OR_RETURN(dx, PlacedOutput(ctx, "Input@GRAD", place, FLOAT32, input->shape()));
    TS_RETURN_IF_ERROR(dev->SetZero(dx->raw_data(), dx->nbytes()));
  }
  if (want_dw) {
    TS_ASSIGN_OR_RETURN(dw, PlacedOutput(ctx, "Filter@GRAD", place, FLOAT32, filter->shape()));
    TS_RETURN_IF_ERROR(dev->SetZero(dw->raw_data(), dw->nbytes()));
  }
  if (d.n == 0 || d.m == 0) return true;
  const int64_t chunk = ConvChunk(d), chw = d.g.c * d.g.h * d.g.w;
  TS_ASSIGN_OR_RETURN(std::shared_ptr<char> col, Scratch(ctx, dev, place, chunk * ckk * p));
  for (int64_t first = 0; first < d.n; first += chunk) {
    const int64_t count = std::min(chunk, d.n - first);
    const float* g = Data(dout) + first * d.m * p;
    if (dw != nullptr) {
      TS_CUDA(gpu::Im2Col(d.g, Data(input) + first * chw, count, Floats(col), dev->stream()),
              "conv2d_grad im2col");
      for (int64_t s = 0; s < count; ++s) {
        TS_RETURN_IF_ERROR(Gemm(dev, false, true, d.m, ckk, p, 1.0f, g + s * d.m * p, p,
                                Floats(col) + s * ckk * p, p, 1.0f, Data(dw)));
      }
    }
    if (dx != nullptr) {  // col is reused for the column gradient (stream-ordered)
      for (int64_t s = 0; s < count; ++s) {
        TS_RETURN_IF_ERROR(Gemm(dev, true, false, ckk, p, d.m, 1.0f, Data(filter), ckk,
                                g + s * d.m * p, p, 0.0f, Floats(col) + s * ckk * p));
      }
      TS_CUDA(gpu::Col2ImAdd(d.g, Floats(col), count, Data(dx) + first * chw, dev->stream()),
              "conv2d_grad col2im");
    }
  }
  return true;
}

// X [N, C, H, W] float32 with the geometry the CPU kernel accepts (nn::GetPoolGeometry).
bool GetPoolShape(const OpContext& ctx, const Tensor* x, gpu::PoolShape* g) {
  if (!F32(x)) return false;
  absl::StatusOr<nn::PoolGeometry> geometry = nn::GetPoolGeometry(ctx, *x);
  if (!geometry.ok()) return false;
  const nn::PoolGeometry& p = *geometry;
  *g = gpu::PoolShape{p.max, p.exclusive, p.n * p.c, p.h, p.w, p.kh, p.kw,
                      p.sh, p.sw, p.ph, p.pw, p.ho, p.wo};
  return true;
}

absl::StatusOr<bool> Pool2d(OpContext& ctx, const Place& place) {
  const Tensor* x = Peek(ctx, "X");
  gpu::PoolShape g;
  if (!GetPoolShape(ctx, x, &g)) return false;
  TS_ASSIGN_OR_RETURN(const Tensor* out0, ctx.Output("Out"));
  if (out0 == x) return false;
  TS_ASSIGN_OR_RETURN(CudaDevice * dev, ActiveDevice(place));
  TS_ASSIGN_OR_RETURN(x, PlacedInput(ctx, "X", place));
  TS_ASSIGN_OR_RETURN(Tensor * out,
                      PlacedOutput(ctx, "Out", place, FLOAT32, {x->dim(0), x->dim(1), g.ho, g.wo}));
  TS_CUDA(gpu::Pool2d(g, Data(x), Data(out), dev->stream()), "pool2d");
  return true;
}

// Avg reads only X's shape: X is not moved.
absl::StatusOr<bool> Pool2dGrad(OpContext& ctx, const Place& place) {
  if (!ctx.HasOutput("X@GRAD")) return true;
  const Tensor* x = Peek(ctx, "X");
  const Tensor* dout = Peek(ctx, "Out@GRAD");
  gpu::PoolShape g;
  if (!GetPoolShape(ctx, x, &g)) return false;
  if (!F32(dout) || dout->numel() != g.planes * g.ho * g.wo) return false;
  TS_ASSIGN_OR_RETURN(const Tensor* dx0, ctx.Output("X@GRAD"));
  if (dx0 == x || dx0 == dout) return false;
  const Shape shape = x->shape();
  TS_ASSIGN_OR_RETURN(CudaDevice * dev, ActiveDevice(place));
  const float* xp = nullptr;
  if (g.max) {
    TS_ASSIGN_OR_RETURN(x, PlacedInput(ctx, "X", place));
    xp = Data(x);
  }
  TS_ASSIGN_OR_RETURN(dout, PlacedInput(ctx, "Out@GRAD", place));
  TS_ASSIGN_OR_RETURN(Tensor * dx, PlacedOutput(ctx, "X@GRAD", place, FLOAT32, shape));
  TS_CUDA(gpu::Pool2dGrad(g, xp, Data(dout), Data(dx), dev->stream()), "pool2d_grad");
  return true;
}

// flatten: a device copy under the new shape, any dtype.
bool FlattenShape(const OpContext& ctx, const Shape& in, Shape* out) {
  const int64_t axis = ctx.IntAttr("axis", 1);
  if (axis < 0 || axis > static_cast<int64_t>(in.size())) return false;
  *out = {NumElements(Shape(in.begin(), in.begin() + axis)),
          NumElements(Shape(in.begin() + axis, in.end()))};
  return true;
}

absl::StatusOr<bool> Flatten(OpContext& ctx, const Place& place) {
  const Tensor* x = Peek(ctx, "X");
  Shape shape;
  if (x == nullptr || !FlattenShape(ctx, x->shape(), &shape)) return false;
  TS_ASSIGN_OR_RETURN(const Tensor* out0, ctx.Output("Out"));
  if (out0 == x) return false;
  TS_ASSIGN_OR_RETURN(CudaDevice * dev, ActiveDevice(place));
  TS_ASSIGN_OR_RETURN(x, PlacedInput(ctx, "X", place));
  TS_ASSIGN_OR_RETURN(Tensor * out, PlacedOutput(ctx, "Out", place, x->dtype(), std::move(shape)));
  TS_RETURN_IF_ERROR(dev->CopyOnDevice(out->raw_data(), x->raw_data(), x->nbytes()));
  return true;
}

// Reads only X's type and shape: X is not moved.
absl::StatusOr<bool> FlattenGrad(OpContext& ctx, const Place& place) {
  if (!ctx.HasOutput("X@GRAD")) return true;
  const Tensor* x = Peek(ctx, "X");
  const Tensor* dout = Peek(ctx, "Out@GRAD");
  if (x == nullptr || dout == nullptr || dout->dtype() != x->dtype() ||
      dout->numel() != x->numel()) {
    return false;
  }
  TS_ASSIGN_OR_RETURN(const Tensor* dx0, ctx.Output("X@GRAD"));
  if (dx0 == x || dx0 == dout) return false;
  const DataType dtype = x->dtype();
  const Shape shape = x->shape();
  TS_ASSIGN_OR_RETURN(CudaDevice * dev, ActiveDevice(place));
  TS_ASSIGN_OR_RETURN(dout, PlacedInput(ctx, "Out@GRAD", place));
  TS_ASSIGN_OR_RETURN(Tensor * dx, PlacedOutput(ctx, "X@GRAD", place, dtype, shape));
  TS_RETURN_IF_ERROR(dev->CopyOnDevice(dx->raw_data(), dout->raw_data(), dout->nbytes()));
  return true;
}

// X [N, C, ...] float32 viewed as [N, C, inner]; the per-channel slots float32 with C values.
bool GetNormShape(const OpContext& ctx, const Tensor* x,
                  std::initializer_list<const char*> per_channel, gpu::NormShape* d) {
  if (!F32(x) || x->rank() < 2) return false;
  d->n = x->dim(0);
  d->c = x->dim(1);
  d->inner = d->n * d->c == 0 ? 0 : x->numel() / (d->n * d->c);
  for (const char* slot : per_channel) {
    const Tensor* t = Peek(ctx, slot);
    if (!F32(t) || t->numel() != d->c) return false;
  }
  return true;
}

// epsilon as nn_ops reads it (a float attribute, used in double); false when not positive.
bool GetEpsilon(const OpContext& ctx, double* eps) {
  *eps = ctx.FloatAttr("epsilon", 1e-5f);
  return *eps > 0 && std::isfinite(*eps);
}

bool UseGlobalStats(const OpContext& ctx) {
  return ctx.BoolAttr("is_test", false) || ctx.BoolAttr("use_global_stats", false);
}

// Training also writes SavedMean, SavedVariance and the running MeanOut, VarianceOut (each
// either in place of Mean / Variance or a variable of its own).
absl::StatusOr<bool> BatchNorm(OpContext& ctx, const Place& place) {
  const Tensor* x = Peek(ctx, "X");
  gpu::NormShape d;
  double eps = 0;
  if (!GetNormShape(ctx, x, {"Scale", "Bias", "Mean", "Variance"}, &d) || !GetEpsilon(ctx, &eps)) {
    return false;
  }
  const double momentum = ctx.FloatAttr("momentum", 0.9f);
  if (!(momentum >= 0 && momentum <= 1)) return false;
  const bool global = UseGlobalStats(ctx);
  const std::vector<const Tensor*> ins = {x, Peek(ctx, "Scale"), Peek(ctx, "Bias"),
                                          Peek(ctx, "Mean"), Peek(ctx, "Variance")};
  auto is_input = [&](const Tensor* t) {
    return std::find(ins.begin(), ins.end(), t) != ins.end();
  };
  TS_ASSIGN_OR_RETURN(const Tensor* y0, ctx.Output("Y"));
  if (is_input(y0)) return false;
  if (!global) {
    if (d.n * d.inner == 0) return false;
    for (const char* slot : {"SavedMean", "SavedVariance", "MeanOut", "VarianceOut"}) {
      if (!ctx.HasOutput(slot)) return false;
    }
    TS_ASSIGN_OR_RETURN(const Tensor* sm0, ctx.Output("SavedMean"));
    TS_ASSIGN_OR_RETURN(const Tensor* sv0, ctx.Output("SavedVariance"));
    TS_ASSIGN_OR_RETURN(const Tensor* mo0, ctx.Output("MeanOut"));
    TS_ASSIGN_OR_RETURN(const Tensor* vo0, ctx.Output("VarianceOut"));
    if (is_input(sm0) || is_input(sv0) || (is_input(mo0) && mo0 != ins[3]) ||
        (is_input(vo0) && vo0 != ins[4])) {
      return false;
    }
    const std::vector<const Tensor*> outs = {y0, sm0, sv0, mo0, vo0};
    for (size_t i = 0; i < outs.size(); ++i) {
      for (size_t j = i + 1; j < outs.size(); ++j) {
        if (outs[i] == outs[j]) return false;
      }
    }
  }
  const Shape shape = x->shape();
  TS_ASSIGN_OR_RETURN(CudaDevice * dev, ActiveDevice(place));
  TS_ASSIGN_OR_RETURN(x, PlacedInput(ctx, "X", place));
  TS_ASSIGN_OR_RETURN(const Tensor* scale, PlacedInput(ctx, "Scale", place));
  TS_ASSIGN_OR_RETURN(const Tensor* bias, PlacedInput(ctx, "Bias", place));
  TS_ASSIGN_OR_RETURN(const Tensor* mean, PlacedInput(ctx, "Mean", place));
  TS_ASSIGN_OR_RETURN(const Tensor* var, PlacedInput(ctx, "Variance", place));
  TS_ASSIGN_OR_RETURN(Tensor * y, PlacedOutput(ctx, "Y", place, FLOAT32, shape));
  if (global) {
    TS_CUDA(gpu::BatchNormApply(d, Data(x), Data(scale), Data(bias), Data(mean), Data(var), false,
                                eps, Data(y), dev->stream()),
            "batch_norm");
    return true;
  }
  const Shape mean_shape = mean->shape(), var_shape = var->shape();
  TS_ASSIGN_OR_RETURN(Tensor * saved_mean, PlacedOutput(ctx, "SavedMean", place, FLOAT32, {d.c}));
  TS_ASSIGN_OR_RETURN(Tensor * saved_var,
                      PlacedOutput(ctx, "SavedVariance", place, FLOAT32, {d.c}));
  TS_ASSIGN_OR_RETURN(Tensor * mean_out, PlacedOutput(ctx, "MeanOut", place));
  TS_ASSIGN_OR_RETURN(Tensor * var_out, PlacedOutput(ctx, "VarianceOut", place));
  if (mean_out != mean) TS_RETURN_IF_ERROR(mean_out->TryResize(FLOAT32, mean_shape));
  if (var_out != var) TS_RETURN_IF_ERROR(var_out->TryResize(FLOAT32, var_shape));
  TS_CUDA(gpu::BatchNormStats(d, Data(x), eps, static_cast<float>(momentum), Data(mean), Data(var),
                              Data(saved_mean), Data(saved_var), Data(mean_out), Data(var_out),
                              dev->stream()),
          "batch_norm statistics");
  TS_CUDA(gpu::BatchNormApply(d, Data(x), Data(scale), Data(bias), Data(saved_mean),
                              Data(saved_var), true, eps, Data(y), dev->stream()),
          "batch_norm");
  return true;
}

// With global statistics (is_test / use_global_stats) Mean and Variance, else SavedMean and
// SavedVariance (1 / sqrt(var + eps)); each gradient output only when bound.
absl::StatusOr<bool> BatchNormGrad(OpContext& ctx, const Place& place) {
  const bool want_dx = ctx.HasOutput("X@GRAD"), want_dscale = ctx.HasOutput("Scale@GRAD"),
             want_dbias = ctx.HasOutput("Bias@GRAD");
  if (!want_dx && !want_dscale && !want_dbias) return true;
  const bool global = UseGlobalStats(ctx);
  const char* mean_slot = global ? "Mean" : "SavedMean";
  const char* var_slot = global ? "Variance" : "SavedVariance";
  const Tensor* x = Peek(ctx, "X");
  const Tensor* dy = Peek(ctx, "Y@GRAD");
  gpu::NormShape d;
  double eps = 0;
  if (!GetNormShape(ctx, x, {"Scale", mean_slot, var_slot}, &d) || !GetEpsilon(ctx, &eps) ||
      !F32(dy) || dy->numel() != x->numel()) {
    return false;
  }
  const std::vector<const Tensor*> ins = {x, Peek(ctx, "Scale"), Peek(ctx, mean_slot),
                                          Peek(ctx, var_slot), dy};
  std::vector<const Tensor*> outs;
  for (const char* slot : {"X@GRAD", "Scale@GRAD", "Bias@GRAD"}) {
    if (!ctx.HasOutput(slot)) continue;
    TS_ASSIGN_OR_RETURN(const Tensor* g, ctx.Output(slot));
    if (std::find(ins.begin(), ins.end(), g) != ins.end()) return false;
    if (std::find(outs.begin(), outs.end(), g) != outs.end()) return false;
    outs.push_back(g);
  }
  const Shape shape = x->shape(), scale_shape = ins[1]->shape();
  TS_ASSIGN_OR_RETURN(CudaDevice * dev, ActiveDevice(place));
  TS_ASSIGN_OR_RETURN(x, PlacedInput(ctx, "X", place));
  TS_ASSIGN_OR_RETURN(const Tensor* scale, PlacedInput(ctx, "Scale", place));
  TS_ASSIGN_OR_RETURN(const Tensor* mean, PlacedInput(ctx, mean_slot, place));
  TS_ASSIGN_OR_RETURN(const Tensor* var, PlacedInput(ctx, var_slot, place));
  TS_ASSIGN_OR_RETURN(dy, PlacedInput(ctx, "Y@GRAD", place));
  Tensor* dscale = nullptr;
  Tensor* dbias = nullptr;
  if (want_dscale) {
    TS_ASSIGN_OR_RETURN(dscale, PlacedOutput(ctx, "Scale@GRAD", place, FLOAT32, scale_shape));
  }
  if (want_dbias) {
    TS_ASSIGN_OR_RETURN(dbias, PlacedOutput(ctx, "Bias@GRAD", place, FLOAT32, scale_shape));
  }
  // The channel sums go to Bias@GRAD / Scale@GRAD, or to scratch when they are not bound.
  const float* sum_dy = nullptr;
  const float* sum_dy_xhat = nullptr;
  std::shared_ptr<char> sums;
  if (want_dscale || want_dbias || !global) {
    if (!want_dscale || !want_dbias) {
      TS_ASSIGN_OR_RETURN(sums, Scratch(ctx, dev, place, 2 * std::max<int64_t>(d.c, 1)));
    }
    float* s = want_dbias ? Data(dbias) : Floats(sums);
    float* sx = want_dscale ? Data(dscale) : Floats(sums) + d.c;
    TS_CUDA(gpu::BatchNormGradSums(d, Data(x), Data(dy), Data(mean), Data(var), !global, eps, s, sx,
                                   dev->stream()),
            "batch_norm_grad sums");
    if (!global) {
      sum_dy = s;
      sum_dy_xhat = sx;
    }
  }
  if (!want_dx) return true;
  TS_ASSIGN_OR_RETURN(Tensor * dx, PlacedOutput(ctx, "X@GRAD", place, FLOAT32, shape));
  TS_CUDA(gpu::BatchNormGradX(d, Data(x), Data(dy), Data(scale), Data(mean), Data(var), !global,
                              eps, sum_dy, sum_dy_xhat, Data(dx), dev->stream()),
          "batch_norm_grad");
  return true;
}

// ---------------------------------------------------------------------------------------------
// dropout and accuracy. dropout reads its attributes and computes its mask key with
// common/ops/dropout_util.h, as the CPU kernel does, and the device draws the mask with its copy
// of CounterUniform (gpu_kernels.cu): the masks are bit-identical to the CPU's.

// Training: Out and Mask; is_test: Out = X * scale only (no mask, the run count not advanced).
absl::StatusOr<bool> Dropout(OpContext& ctx, const Place& place) {
  absl::StatusOr<DropoutAttrs> attrs = ReadDropoutAttrs(ctx);
  if (!attrs.ok()) return false;  // the CPU kernel reports it
  const DropoutAttrs a = *attrs;
  const Tensor* x = Peek(ctx, "X");
  if (!F32(x)) return false;
  TS_ASSIGN_OR_RETURN(const Tensor* out0, ctx.Output("Out"));
  if (!a.is_test) {
    if (!ctx.HasOutput("Mask")) return false;
    TS_ASSIGN_OR_RETURN(const Tensor* mask0, ctx.Output("Mask"));
    if (mask0 == x || mask0 == out0) return false;
  }
  const float scale = static_cast<float>(DropoutScale(a));
  TS_ASSIGN_OR_RETURN(CudaDevice * dev, ActiveDevice(place));
  // The key mixes X's first bytes, read on the host: straight from X while it is still there,
  // otherwise copied back from the device (at most 64 bytes, but a synchronous copy on the
  // device stream: it waits for X's producer; one sync per training run of a dropout op whose X
  // is already on the device).
  std::array<unsigned char, kDropoutKeyBytes> lead{};
  const size_t lead_bytes = std::min(x->nbytes(), kDropoutKeyBytes);
  const bool lead_on_host = x->place().is_cpu();
  if (!a.is_test && lead_on_host && lead_bytes > 0) {
    std::memcpy(lead.data(), x->raw_data(), lead_bytes);
  }
  TS_ASSIGN_OR_RETURN(x, PlacedInput(ctx, "X", place));
  if (!a.is_test && !lead_on_host && lead_bytes > 0) {
    TS_RETURN_IF_ERROR(dev->CopyToHost(lead.data(), x->raw_data(), lead_bytes));
  }
  // Past every check: advance the run count (as the CPU kernel would) only now.
  const uint64_t key = a.is_test ? 0 : DropoutKey(ctx, lead.data(), lead_bytes);
  TS_ASSIGN_OR_RETURN(Tensor * out, PlacedOutput(ctx, "Out", place));
  if (out != x) {
    TS_RETURN_IF_ERROR(out->TryResize(FLOAT32, x->shape()));
    out->set_lod(x->lod());
  }
  float* maskp = nullptr;
  if (!a.is_test) {
    TS_ASSIGN_OR_RETURN(Tensor * mask, PlacedOutput(ctx, "Mask", place, FLOAT32, x->shape()));
    maskp = Data(mask);
  }
  TS_CUDA(gpu::Dropout(Data(x), x->numel(), key, a.p, scale, Data(out), maskp, dev->stream()),
          "dropout");
  return true;
}

// X@GRAD = Out@GRAD * Mask * scale (training), Out@GRAD * scale (is_test).
absl::StatusOr<bool> DropoutGrad(OpContext& ctx, const Place& place) {
  if (!ctx.HasOutput("X@GRAD")) return true;
  absl::StatusOr<DropoutAttrs> attrs = ReadDropoutAttrs(ctx);
  if (!attrs.ok()) return false;
  const DropoutAttrs a = *attrs;
  const Tensor* dout = Peek(ctx, "Out@GRAD");
  if (!F32(dout)) return false;
  const Tensor* mask = nullptr;
  if (!a.is_test) {
    mask = Peek(ctx, "Mask");
    if (!F32(mask) || mask->shape() != dout->shape()) return false;
  }
  const float scale = static_cast<float>(DropoutScale(a));
  TS_ASSIGN_OR_RETURN(CudaDevice * dev, ActiveDevice(place));
  TS_ASSIGN_OR_RETURN(dout, PlacedInput(ctx, "Out@GRAD", place));
  if (mask != nullptr) {
    TS_ASSIGN_OR_RETURN(mask, PlacedInput(ctx, "Mask", place));
  }
  TS_ASSIGN_OR_RETURN(Tensor * dx, PlacedOutput(ctx, "X@GRAD", place));
  if (dx != dout && dx != mask) TS_RETURN_IF_ERROR(dx->TryResize(FLOAT32, dout->shape()));
  TS_CUDA(gpu::DropoutGrad(Data(dout), mask == nullptr ? nullptr : Data(mask), dout->numel(),
                           scale, Data(dx), dev->stream()),
          "dropout_grad");
  return true;
}

// X [N, C] float32, Label int64 with N ids (int32 ids run on the CPU). The ids are checked on the
// host (moved there when needed; one outside [0, C) declines, so that the CPU kernel reports it)
// and uploaded; the rows are scored on the device and Accuracy, Correct and Total (the latter
// two when bound) are written there.
absl::StatusOr<bool> Accuracy(OpContext& ctx, const Place& place) {
  const Tensor* x = Peek(ctx, "X");
  const Tensor* label = Peek(ctx, "Label");
  const int64_t k = ctx.IntAttr("k", 1);
  if (!F32(x) || x->rank() != 2 || label == nullptr || label->dtype() != INT64 || k < 1 ||
      !ctx.HasOutput("Accuracy")) {
    return false;
  }
  const int64_t n = x->dim(0), classes = x->dim(1);
  if (label->numel() != n) return false;
  std::vector<const Tensor*> outs;
  for (const char* slot : {"Accuracy", "Correct", "Total"}) {
    if (!ctx.HasOutput(slot)) continue;
    TS_ASSIGN_OR_RETURN(const Tensor* t, ctx.Output(slot));
    if (t == x || t == label || std::find(outs.begin(), outs.end(), t) != outs.end()) {
      return false;
    }
    outs.push_back(t);
  }
  TS_ASSIGN_OR_RETURN(CudaDevice * dev, ActiveDevice(place));
  if (!label->place().is_cpu()) {
    TS_ASSIGN_OR_RETURN(label, PlacedInput(ctx, "Label", Place::Cpu()));
  }
  const int64_t* ids = label->data<int64_t>();
  for (int64_t i = 0; i < n; ++i) {
    if (ids[i] < 0 || ids[i] >= classes) return false;
  }
  std::shared_ptr<char> dids;
  if (n > 0) {
    TS_ASSIGN_OR_RETURN(dids, dev->Upload(ids, sizeof(int64_t) * n));
  }
  static_assert(sizeof(int32_t) == sizeof(float), "Scratch counts floats");
  TS_ASSIGN_OR_RETURN(std::shared_ptr<char> rows,
                      Scratch(ctx, dev, place, std::max<int64_t>(n, 1)));
  TS_ASSIGN_OR_RETURN(x, PlacedInput(ctx, "X", place));
  TS_ASSIGN_OR_RETURN(Tensor * accuracy, PlacedOutput(ctx, "Accuracy", place, FLOAT32, {1}));
  int64_t* counts[2] = {nullptr, nullptr};  // Correct, Total
  const char* count_slots[2] = {"Correct", "Total"};
  for (int i = 0; i < 2; ++i) {
    if (!ctx.HasOutput(count_slots[i])) continue;
    TS_ASSIGN_OR_RETURN(Tensor * t, PlacedOutput(ctx, count_slots[i], place, INT64, {1}));
    counts[i] = t->data<int64_t>();
  }
  TS_CUDA(gpu::Accuracy(Data(x), reinterpret_cast<const int64_t*>(dids.get()), n, classes, k,
                        reinterpret_cast<int32_t*>(rows.get()), Data(accuracy), counts[0],
                        counts[1], dev->stream()),
          "accuracy");
  return true;
}

// ---------------------------------------------------------------------------------------------
// optimizers: in place (ParamOut is Param, state outputs are their inputs), dense or sparse
// gradients. Sparse rows are merged as on the CPU: unique sorted rows (host), values summed on
// the device (atomic adds: the summation order of duplicate ids may differ from the CPU's).

struct GradOnDevice {
  const float* values = nullptr;   // n_rows * width (dense: all of Param)
  std::shared_ptr<char> merged;    // sparse: merged values
  std::shared_ptr<char> rows;      // sparse: device int64 unique rows
  int64_t n_rows = 0, width = 0;
  bool sparse = false;
};

// Checks Grad against Param (declining what the CPU kernel would reject) and puts it on the
// device, merged when sparse.
absl::StatusOr<bool> PrepareGrad(OpContext& ctx, const Place& place, CudaDevice* dev,
                                 const Tensor& param, GradOnDevice* g) {
  TS_ASSIGN_OR_RETURN(const Variable* gv, ctx.InputVar("Grad"));
  if (const Tensor* t = gv->GetIf<Tensor>()) {
    if (!F32(t) || t->numel() != param.numel()) return false;
    TS_ASSIGN_OR_RETURN(t, PlacedInput(ctx, "Grad", place));
    g->values = Data(t);
    g->n_rows = 1;
    g->width = param.numel();
    return true;
  }
  const SelectedRows& sr = gv->Get<SelectedRows>();
  if (param.rank() < 1 || param.dim(0) == 0) return false;
  const int64_t height = param.dim(0), width = param.numel() / height;
  const int64_t n = static_cast<int64_t>(sr.rows.size());
  if (n > 0 && (!F32(&sr.value) || sr.value.rank() < 1 || sr.value.dim(0) != n ||
                sr.value.numel() != n * width)) {
    return false;
  }
  std::map<int64_t, int64_t> slot;  // row -> merged index
  for (int64_t r : sr.rows) {
    if (r < 0 || r >= height) return false;
    slot.emplace(r, 0);
  }
  std::vector<int64_t> unique, target(n);
  for (auto& [r, i] : slot) {
    i = static_cast<int64_t>(unique.size());
    unique.push_back(r);
  }
  for (int64_t i = 0; i < n; ++i) target[i] = slot[sr.rows[i]];
  g->sparse = true;
  g->width = width;
  g->n_rows = static_cast<int64_t>(unique.size());
  if (n == 0) return true;
  TS_ASSIGN_OR_RETURN(const Variable* placed, PlacedInputVar(ctx, "Grad", place));
  const Tensor& value = placed->Get<SelectedRows>().value;
  const size_t merged_bytes = sizeof(float) * g->n_rows * width;
  g->merged = dev->Allocate(merged_bytes);
  if (g->merged == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat("out of memory on ", place.DebugString(), " merging sparse Grad '",
                     ctx.InputName("Grad"), "'"));
  }
  TS_RETURN_IF_ERROR(dev->SetZero(g->merged.get(), merged_bytes));
  TS_ASSIGN_OR_RETURN(std::shared_ptr<char> dtarget,
                      dev->Upload(target.data(), sizeof(int64_t) * n));
  TS_CUDA(gpu::ScatterAddRows(Data(&value), reinterpret_cast<const int64_t*>(dtarget.get()), n,
                              width, reinterpret_cast<float*>(g->merged.get()), dev->stream()),
          "merge sparse rows");
  TS_ASSIGN_OR_RETURN(g->rows, dev->Upload(unique.data(), sizeof(int64_t) * unique.size()));
  g->values = reinterpret_cast<const float*>(g->merged.get());
  return true;
}

// Param and the state slots: float32, in place, states shaped like Param.
bool OptimizerSlotsOk(const OpContext& ctx, const std::vector<std::pair<const char*, const char*>>&
                                                slots) {
  const Tensor* param = Peek(ctx, "Param");
  if (!F32(param)) return false;
  for (const auto& [in, out] : slots) {
    const Tensor* t = Peek(ctx, in);
    if (!F32(t) || t->shape() != param->shape()) return false;
    if (ctx.OutputName(out) != ctx.InputName(in)) return false;
  }
  return IsHostScalar(ctx, "LearningRate");
}

DeviceKernelFn OptimizerKernel(gpu::Optimizer kind) {
  return [kind](OpContext& ctx, const Place& place) -> absl::StatusOr<bool> {
    std::vector<std::pair<const char*, const char*>> slots = {{"Param", "ParamOut"}};
    if (kind == gpu::Optimizer::kMomentum) slots.push_back({"Velocity", "VelocityOut"});
    if (kind == gpu::Optimizer::kAdam) {
      slots.push_back({"Moment1", "Moment1Out"});
      slots.push_back({"Moment2", "Moment2Out"});
      if (!IsHostScalar(ctx, "Beta1Pow") || !IsHostScalar(ctx, "Beta2Pow")) return false;
    }
    if (kind == gpu::Optimizer::kAdagrad) slots.push_back({"Moment", "MomentOut"});
    if (!OptimizerSlotsOk(ctx, slots)) return false;
    gpu::OptimizerArgs a;
    a.kind = kind;
    a.coeff = ctx.FloatAttr("regularization_coeff", 0.0f);
    TS_ASSIGN_OR_RETURN(double lr, HostScalar(ctx, "LearningRate"));
    a.lr = static_cast<float>(lr);
    double b1pow = 0, b2pow = 0, beta1 = 0, beta2 = 0;
    if (kind == gpu::Optimizer::kMomentum) {
      a.mu = ctx.FloatAttr("mu", 0.0f);
      if (ctx.BoolAttr("use_nesterov", false)) a.kind = gpu::Optimizer::kNesterov;
    } else if (kind == gpu::Optimizer::kAdam) {
      TS_ASSIGN_OR_RETURN(b1pow, HostScalar(ctx, "Beta1Pow"));
      TS_ASSIGN_OR_RETURN(b2pow, HostScalar(ctx, "Beta2Pow"));
      if (b1pow == 1.0) return false;
      beta1 = ctx.FloatAttr("beta1", 0.9f);
      beta2 = ctx.FloatAttr("beta2", 0.999f);
      a.beta1 = static_cast<float>(beta1);
      a.beta2 = static_cast<float>(beta2);
      a.eps = ctx.FloatAttr("epsilon", 1e-8f);
      a.lr = static_cast<float>(lr * std::sqrt(1.0 - b2pow) / (1.0 - b1pow));
    } else if (kind == gpu::Optimizer::kAdagrad) {
      a.eps = ctx.FloatAttr("epsilon", 1e-6f);
    }
    TS_ASSIGN_OR_RETURN(CudaDevice * dev, ActiveDevice(place));
    const Tensor* param0 = Peek(ctx, "Param");
    GradOnDevice g;
    TS_ASSIGN_OR_RETURN(bool ok, PrepareGrad(ctx, place, dev, *param0, &g));
    if (!ok) return false;
    std::vector<float*> state;
    TS_ASSIGN_OR_RETURN(const Tensor* param, PlacedInput(ctx, "Param", place));
    for (size_t i = 1; i < slots.size(); ++i) {
      TS_ASSIGN_OR_RETURN(const Tensor* s, PlacedInput(ctx, slots[i].first, place));
      state.push_back(const_cast<float*>(Data(s)));
    }
    float* m1 = state.size() > 0 ? state[0] : nullptr;
    float* m2 = state.size() > 1 ? state[1] : nullptr;
    TS_CUDA(gpu::ApplyOptimizer(a, reinterpret_cast<const int64_t*>(g.rows.get()), g.n_rows,
                                g.width, g.values, const_cast<float*>(Data(param)), m1, m2,
                                dev->stream()),
            ctx.op().type());
    if (kind == gpu::Optimizer::kAdam) {  // the pows advance on the host
      for (const auto& [slot, value] : {std::make_pair("Beta1PowOut", b1pow * beta1),
                                        std::make_pair("Beta2PowOut", b2pow * beta2)}) {
        if (!ctx.HasOutput(slot)) continue;
        const char* in_slot = std::string(slot) == "Beta1PowOut" ? "Beta1Pow" : "Beta2Pow";
        const Tensor* in = Peek(ctx, in_slot);
        const DataType dtype = in->dtype();
        const Shape shape = in->shape();
        TS_ASSIGN_OR_RETURN(Tensor * out, PlacedOutput(ctx, slot, Place::Cpu(), dtype, shape));
        if (dtype == FLOAT32) {
          out->data<float>()[0] = static_cast<float>(value);
        } else {
          out->data<double>()[0] = value;
        }
      }
    }
    return true;
  };
}

}  // namespace

absl::Status RegisterGpuKernels(DeviceKernelTable* t) {
  TS_RETURN_IF_ERROR(t->Register("fill_constant", FillConstant));
  TS_RETURN_IF_ERROR(t->Register("fill_zeros_like", FillZerosLike));
  TS_RETURN_IF_ERROR(t->Register("assign", Assign));
  TS_RETURN_IF_ERROR(t->Register("scale", Scale));
  TS_RETURN_IF_ERROR(t->Register("sum", Sum));
  TS_RETURN_IF_ERROR(t->Register("mul", Mul));
  TS_RETURN_IF_ERROR(t->Register("mul_grad", MulGrad));
  TS_RETURN_IF_ERROR(t->Register("matmul", Matmul));
  TS_RETURN_IF_ERROR(t->Register("matmul_grad", MatmulGrad));
  TS_RETURN_IF_ERROR(t->Register("elementwise_add", ElementwiseKernel(gpu::Binary::kAdd)));
  TS_RETURN_IF_ERROR(t->Register("elementwise_sub", ElementwiseKernel(gpu::Binary::kSub)));
  TS_RETURN_IF_ERROR(t->Register("elementwise_mul", ElementwiseKernel(gpu::Binary::kMul)));
  TS_RETURN_IF_ERROR(
      t->Register("elementwise_add_grad", ElementwiseGradKernel(gpu::Binary::kAdd)));
  TS_RETURN_IF_ERROR(
      t->Register("elementwise_sub_grad", ElementwiseGradKernel(gpu::Binary::kSub)));
  TS_RETURN_IF_ERROR(
      t->Register("elementwise_mul_grad", ElementwiseGradKernel(gpu::Binary::kMul)));
  TS_RETURN_IF_ERROR(t->Register("relu", ActivationKernel(gpu::Activation::kRelu)));
  TS_RETURN_IF_ERROR(t->Register("sigmoid", ActivationKernel(gpu::Activation::kSigmoid)));
  TS_RETURN_IF_ERROR(t->Register("tanh", ActivationKernel(gpu::Activation::kTanh)));
  TS_RETURN_IF_ERROR(t->Register("relu_grad", ActivationGradKernel(gpu::Activation::kRelu)));
  TS_RETURN_IF_ERROR(
      t->Register("sigmoid_grad", ActivationGradKernel(gpu::Activation::kSigmoid)));
  TS_RETURN_IF_ERROR(t->Register("tanh_grad", ActivationGradKernel(gpu::Activation::kTanh)));
  TS_RETURN_IF_ERROR(t->Register("mean", Mean));
  TS_RETURN_IF_ERROR(t->Register("mean_grad", MeanGrad));
  TS_RETURN_IF_ERROR(t->Register("square_error", SquareError));
  TS_RETURN_IF_ERROR(t->Register("square_error_grad", SquareErrorGrad));
  TS_RETURN_IF_ERROR(t->Register("sigmoid_cross_entropy_with_logits", SigmoidCe));
  TS_RETURN_IF_ERROR(t->Register("sigmoid_cross_entropy_with_logits_grad", SigmoidCeGrad));
  TS_RETURN_IF_ERROR(t->Register("softmax_with_cross_entropy", SoftmaxCe));
  TS_RETURN_IF_ERROR(t->Register("softmax_with_cross_entropy_grad", SoftmaxCeGrad));
  TS_RETURN_IF_ERROR(t->Register("lookup_table", LookupTable));
  TS_RETURN_IF_ERROR(t->Register("lookup_table_grad", LookupTableGrad));
  TS_RETURN_IF_ERROR(t->Register("concat", Concat));
  TS_RETURN_IF_ERROR(t->Register("concat_grad", ConcatGrad));
  TS_RETURN_IF_ERROR(t->Register("split", Split));
  TS_RETURN_IF_ERROR(t->Register("conv2d", Conv2d));
  TS_RETURN_IF_ERROR(t->Register("conv2d_grad", Conv2dGrad));
  TS_RETURN_IF_ERROR(t->Register("pool2d", Pool2d));
  TS_RETURN_IF_ERROR(t->Register("pool2d_grad", Pool2dGrad));
  TS_RETURN_IF_ERROR(t->Register("flatten", Flatten));
  TS_RETURN_IF_ERROR(t->Register("flatten_grad", FlattenGrad));
  TS_RETURN_IF_ERROR(t->Register("batch_norm", BatchNorm));
  TS_RETURN_IF_ERROR(t->Register("batch_norm_grad", BatchNormGrad));
  TS_RETURN_IF_ERROR(t->Register("dropout", Dropout));
  TS_RETURN_IF_ERROR(t->Register("dropout_grad", DropoutGrad));
  TS_RETURN_IF_ERROR(t->Register("accuracy", Accuracy));
  TS_RETURN_IF_ERROR(t->Register("sgd", OptimizerKernel(gpu::Optimizer::kSgd)));
  TS_RETURN_IF_ERROR(t->Register("momentum", OptimizerKernel(gpu::Optimizer::kMomentum)));
  TS_RETURN_IF_ERROR(t->Register("adam", OptimizerKernel(gpu::Optimizer::kAdam)));
  TS_RETURN_IF_ERROR(t->Register("adagrad", OptimizerKernel(gpu::Optimizer::kAdagrad)));
  return absl::OkStatus();
}

namespace {
// Linking this library makes GPU memory available to Tensor before main(): the process-wide
// backend. The kernels go into their user's table (RegisterGpuKernels).
const bool kRegistered = [] {
  RegisterCudaBackend();
  return true;
}();
}  // namespace

}  // namespace tessera
