// CUDA kernels for the GPU ops (float32). See gpu_kernels.h for the contracts. Grid-stride
// loops throughout; one launch configuration (256 threads, at most 4096 blocks).
#include "common/device/cuda/gpu_kernels.h"

#include <cuda_runtime.h>

namespace tessera {
namespace gpu {

namespace {

constexpr int kThreads = 256;

int Blocks(int64_t n) {
  int64_t b = (n + kThreads - 1) / kThreads;
  if (b < 1) b = 1;
  if (b > 4096) b = 4096;
  return static_cast<int>(b);
}

#define TS_GRID_LOOP(i, n)                                                          \
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < (n); \
       i += static_cast<int64_t>(blockDim.x) * gridDim.x)

__global__ void FillKernel(float* out, int64_t n, float v) {
  TS_GRID_LOOP(i, n) out[i] = v;
}

__global__ void ScaleKernel(const float* x, float* out, int64_t n, float scale, float bias,
                            bool after) {
  TS_GRID_LOOP(i, n) out[i] = after ? x[i] * scale + bias : (x[i] + bias) * scale;
}

__global__ void AddToKernel(const float* x, float* out, int64_t n) {
  TS_GRID_LOOP(i, n) out[i] += x[i];
}

__device__ float ApplyBinary(int f, float a, float b) {
  return f == 0 ? a + b : (f == 1 ? a - b : a * b);
}

__global__ void BinaryKernel(int f, const float* x, const float* y, float* out, int64_t total,
                             int64_t n, int64_t post, bool same) {
  TS_GRID_LOOP(i, total) {
    float yv = same ? y[i] : y[(i / post) % n];
    out[i] = ApplyBinary(f, x[i], yv);
  }
}

// One thread per output element j.
__global__ void ReduceToYKernel(const float* g, const float* x, int64_t pre, int64_t n,
                                int64_t post, float scale, float* dy) {
  TS_GRID_LOOP(j, n) {
    float s = 0;
    for (int64_t i = 0; i < pre; ++i) {
      const int64_t base = (i * n + j) * post;
      for (int64_t k = 0; k < post; ++k) s += x == nullptr ? g[base + k] : g[base + k] * x[base + k];
    }
    dy[j] = scale * s;
  }
}

__global__ void ActivationKernel(int f, const float* x, float* out, int64_t n) {
  TS_GRID_LOOP(i, n) {
    const float v = x[i];
    out[i] = f == 0 ? fmaxf(v, 0.0f) : (f == 1 ? 1.0f / (1.0f + expf(-v)) : tanhf(v));
  }
}

__global__ void ActivationGradKernel(int f, const float* out, const float* dout, float* dx,
                                     int64_t n) {
  TS_GRID_LOOP(i, n) {
    const float o = out[i], g = dout[i];
    dx[i] = f == 0 ? (o > 0.0f ? g : 0.0f) : (f == 1 ? g * o * (1.0f - o) : g * (1.0f - o * o));
  }
}

__global__ void SumAllKernel(const float* x, int64_t n, float scale, float* out) {
  __shared__ double partial[kThreads];
  double s = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) s += x[i];
  partial[threadIdx.x] = s;
  __syncthreads();
  for (int w = blockDim.x / 2; w > 0; w /= 2) {
    if (threadIdx.x < w) partial[threadIdx.x] += partial[threadIdx.x + w];
    __syncthreads();
  }
  if (threadIdx.x == 0) out[0] = static_cast<float>(partial[0] * scale);
}

__global__ void FillFromScalarKernel(const float* dout, float scale, float* dx, int64_t n) {
  const float v = dout[0] * scale;
  TS_GRID_LOOP(i, n) dx[i] = v;
}

__global__ void SquareErrorKernel(const float* x, const float* y, float* out, int64_t n) {
  TS_GRID_LOOP(i, n) {
    const float d = x[i] - y[i];
    out[i] = d * d;
  }
}

__global__ void SquareErrorGradKernel(const float* x, const float* y, const float* dout,
                                      float* dx, float* dy, int64_t n) {
  TS_GRID_LOOP(i, n) {
    const float g = 2.0f * (x[i] - y[i]) * dout[i];
    if (dx != nullptr) dx[i] = g;
    if (dy != nullptr) dy[i] = -g;
  }
}

__global__ void SigmoidCeKernel(const float* x, const float* z, float* out, int64_t n,
                                float ignore, float scale) {
  TS_GRID_LOOP(i, n) {
    const float v = x[i], t = z[i];
    const float loss = fmaxf(v, 0.0f) - v * t + log1pf(expf(-fabsf(v)));
    out[i] = t == ignore ? 0.0f : loss * scale;
  }
}

__global__ void SigmoidCeGradKernel(const float* x, const float* z, const float* dout, float* dx,
                                    int64_t n, float ignore, float scale) {
  TS_GRID_LOOP(i, n) {
    const float sig = 1.0f / (1.0f + expf(-x[i]));
    dx[i] = z[i] == ignore ? 0.0f : (sig - z[i]) * dout[i] * scale;
  }
}

// One thread per row (the examples' class counts are small).
__global__ void SoftmaxCeKernel(const float* logits, const int64_t* hard, const float* soft,
                                int64_t rows, int64_t c, int64_t ignore_index, float* softmax,
                                float* loss) {
  TS_GRID_LOOP(r, rows) {
    const float* x = logits + r * c;
    float* sm = softmax + r * c;
    if (c == 0) {
      loss[r] = 0;
      continue;
    }
    float mx = x[0];
    for (int64_t j = 1; j < c; ++j) mx = fmaxf(mx, x[j]);
    float sum = 0;
    for (int64_t j = 0; j < c; ++j) {
      sm[j] = expf(x[j] - mx);
      sum += sm[j];
    }
    const float inv = 1.0f / sum, log_sum = logf(sum);
    for (int64_t j = 0; j < c; ++j) sm[j] *= inv;
    if (soft != nullptr) {
      const float* z = soft + r * c;
      float l = 0;
      for (int64_t j = 0; j < c; ++j) l += z[j] * (log_sum - (x[j] - mx));
      loss[r] = l;
    } else {
      const int64_t k = hard[r];
      loss[r] = (k == ignore_index || k < 0 || k >= c) ? 0.0f : log_sum - (x[k] - mx);
    }
  }
}

__global__ void SoftmaxCeGradKernel(const float* softmax, const int64_t* hard, const float* soft,
                                    const float* dloss, int64_t rows, int64_t c,
                                    int64_t ignore_index, float* dx) {
  TS_GRID_LOOP(i, rows * c) {
    const int64_t r = i / c, j = i % c;
    const float g = dloss[r];
    if (soft != nullptr) {
      const float* z = soft + r * c;
      float zs = 0;
      for (int64_t t = 0; t < c; ++t) zs += z[t];
      dx[i] = (softmax[i] * zs - z[j]) * g;
    } else {
      const int64_t k = hard[r];
      if (k == ignore_index || k < 0 || k >= c) {
        dx[i] = 0;
      } else {
        dx[i] = softmax[i] * g - (j == k ? g : 0.0f);
      }
    }
  }
}

__global__ void GatherRowsKernel(const float* src, const int64_t* index, int64_t n, int64_t width,
                                 float* out) {
  TS_GRID_LOOP(i, n * width) {
    const int64_t r = i / width, j = i % width;
    const int64_t from = index[r];
    out[i] = from < 0 ? 0.0f : src[from * width + j];
  }
}

__global__ void ScatterAddRowsKernel(const float* src, const int64_t* index, int64_t n,
                                     int64_t width, float* dst) {
  TS_GRID_LOOP(i, n * width) {
    const int64_t r = i / width, j = i % width;
    const int64_t to = index[r];
    if (to >= 0) atomicAdd(dst + to * width + j, src[i]);
  }
}

__global__ void OptimizerKernel(OptimizerArgs a, const int64_t* rows, int64_t n_rows,
                                int64_t width, const float* g, float* p, float* m1, float* m2) {
  TS_GRID_LOOP(i, n_rows * width) {
    const int64_t off = rows == nullptr ? i : rows[i / width] * width + i % width;
    const float gr = g[i] + a.coeff * p[off];
    switch (a.kind) {
      case Optimizer::kSgd:
        p[off] -= a.lr * gr;
        break;
      case Optimizer::kMomentum:
        m1[off] = a.mu * m1[off] + gr;
        p[off] -= a.lr * m1[off];
        break;
      case Optimizer::kNesterov:
        m1[off] = a.mu * m1[off] + gr;
        p[off] -= a.lr * (gr + a.mu * m1[off]);
        break;
      case Optimizer::kAdam:
        m1[off] = a.beta1 * m1[off] + (1.0f - a.beta1) * gr;
        m2[off] = a.beta2 * m2[off] + (1.0f - a.beta2) * gr * gr;
        p[off] -= a.lr * m1[off] / (sqrtf(m2[off]) + a.eps);
        break;
      case Optimizer::kAdagrad:
        m1[off] += gr * gr;
        p[off] -= a.lr * gr / (sqrtf(m1[off]) + a.eps);
        break;
    }
  }
}

}  // namespace

#define TS_LAUNCH(n, kernel, ...)                               \
  do {                                                          \
    if ((n) > 0) kernel<<<Blocks(n), kThreads, 0, s>>>(__VA_ARGS__); \
    return cudaGetLastError();                                  \
  } while (0)

cudaError_t Fill(float* out, int64_t n, float v, cudaStream_t s) {
  TS_LAUNCH(n, FillKernel, out, n, v);
}
cudaError_t Scale(const float* x, float* out, int64_t n, float scale, float bias, bool after,
                  cudaStream_t s) {
  TS_LAUNCH(n, ScaleKernel, x, out, n, scale, bias, after);
}
cudaError_t AddTo(const float* x, float* out, int64_t n, cudaStream_t s) {
  TS_LAUNCH(n, AddToKernel, x, out, n);
}
cudaError_t BinaryBroadcast(Binary f, const float* x, const float* y, float* out, int64_t pre,
                            int64_t n, int64_t post, bool same, cudaStream_t s) {
  const int64_t total = pre * n * post;
  TS_LAUNCH(total, BinaryKernel, static_cast<int>(f), x, y, out, total, n, post, same);
}
cudaError_t ReduceToY(const float* g, const float* x, int64_t pre, int64_t n, int64_t post,
                      float scale, float* dy, cudaStream_t s) {
  TS_LAUNCH(n, ReduceToYKernel, g, x, pre, n, post, scale, dy);
}
cudaError_t ActivationForward(Activation f, const float* x, float* out, int64_t n,
                              cudaStream_t s) {
  TS_LAUNCH(n, ActivationKernel, static_cast<int>(f), x, out, n);
}
cudaError_t ActivationGrad(Activation f, const float* out, const float* dout, float* dx,
                           int64_t n, cudaStream_t s) {
  TS_LAUNCH(n, ActivationGradKernel, static_cast<int>(f), out, dout, dx, n);
}
cudaError_t SumAll(const float* x, int64_t n, float scale, float* out, cudaStream_t s) {
  SumAllKernel<<<1, kThreads, 0, s>>>(x, n, scale, out);
  return cudaGetLastError();
}
cudaError_t FillFromScalar(const float* dout, float scale, float* dx, int64_t n, cudaStream_t s) {
  TS_LAUNCH(n, FillFromScalarKernel, dout, scale, dx, n);
}
cudaError_t SquareError(const float* x, const float* y, float* out, int64_t n, cudaStream_t s) {
  TS_LAUNCH(n, SquareErrorKernel, x, y, out, n);
}
cudaError_t SquareErrorGrad(const float* x, const float* y, const float* dout, float* dx,
                            float* dy, int64_t n, cudaStream_t s) {
  TS_LAUNCH(n, SquareErrorGradKernel, x, y, dout, dx, dy, n);
}
cudaError_t SigmoidCrossEntropy(const float* x, const float* z, float* out, int64_t n,
                                float ignore, float scale, cudaStream_t s) {
  TS_LAUNCH(n, SigmoidCeKernel, x, z, out, n, ignore, scale);
}
cudaError_t SigmoidCrossEntropyGrad(const float* x, const float* z, const float* dout, float* dx,
                                    int64_t n, float ignore, float scale, cudaStream_t s) {
  TS_LAUNCH(n, SigmoidCeGradKernel, x, z, dout, dx, n, ignore, scale);
}
cudaError_t SoftmaxCrossEntropy(const float* logits, const int64_t* hard_labels,
                                const float* soft_labels, int64_t rows, int64_t c,
                                int64_t ignore_index, float* softmax, float* loss,
                                cudaStream_t s) {
  TS_LAUNCH(rows, SoftmaxCeKernel, logits, hard_labels, soft_labels, rows, c, ignore_index,
            softmax, loss);
}
cudaError_t SoftmaxCrossEntropyGrad(const float* softmax, const int64_t* hard_labels,
                                    const float* soft_labels, const float* dloss, int64_t rows,
                                    int64_t c, int64_t ignore_index, float* dx, cudaStream_t s) {
  TS_LAUNCH(rows * c, SoftmaxCeGradKernel, softmax, hard_labels, soft_labels, dloss, rows, c,
            ignore_index, dx);
}
cudaError_t GatherRows(const float* src, const int64_t* index, int64_t n, int64_t width,
                       float* out, cudaStream_t s) {
  TS_LAUNCH(n * width, GatherRowsKernel, src, index, n, width, out);
}
cudaError_t ScatterAddRows(const float* src, const int64_t* index, int64_t n, int64_t width,
                           float* dst, cudaStream_t s) {
  TS_LAUNCH(n * width, ScatterAddRowsKernel, src, index, n, width, dst);
}
cudaError_t ApplyOptimizer(const OptimizerArgs& a, const int64_t* rows, int64_t n_rows,
                           int64_t width, const float* g, float* p, float* m1, float* m2,
                           cudaStream_t s) {
  TS_LAUNCH(n_rows * width, OptimizerKernel, a, rows, n_rows, width, g, p, m1, m2);
}

}  // namespace gpu
}  // namespace tessera
