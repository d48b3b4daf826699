// CUDA kernels for the GPU ops (float32). See gpu_kernels.h for the contracts. Grid-stride
// loops with one launch configuration (256 threads, at most 4096 blocks), except the reductions
// (SumAll and the accuracy sum: one block; batch_norm statistics: one block per channel).
#include "common/device/cuda/gpu_kernels.h"

#include <cuda_runtime.h>

#include "common/ops/optimizer_rules.h"

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

// The rules of common/ops/optimizer_rules.h, one element per iteration (nvcc fuses their
// multiply-adds: results match the CPU kernels within rounding, not bit for bit).
__global__ void OptimizerKernel(OptimizerArgs a, const int64_t* rows, int64_t n_rows,
                                int64_t width, const float* g, float* p, float* m1, float* m2) {
  namespace rules = optimizer_rules;
  TS_GRID_LOOP(i, n_rows * width) {
    const int64_t off = rows == nullptr ? i : rows[i / width] * width + i % width;
    switch (a.kind) {
      case Optimizer::kSgd:
        rules::SgdUpdate(p[off], g[i], a.lr, a.coeff);
        break;
      case Optimizer::kMomentum:
        rules::MomentumUpdate(p[off], m1[off], g[i], a.lr, a.mu, a.coeff, false);
        break;
      case Optimizer::kNesterov:
        rules::MomentumUpdate(p[off], m1[off], g[i], a.lr, a.mu, a.coeff, true);
        break;
      case Optimizer::kAdam:
        rules::AdamUpdate(p[off], m1[off], m2[off], g[i], a.lr, a.beta1, a.beta2, a.eps, a.coeff);
        break;
      case Optimizer::kAdagrad:
        rules::AdagradUpdate(p[off], m1[off], g[i], a.lr, a.eps, a.coeff);
        break;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// conv2d

__global__ void Im2ColKernel(ConvShape g, const float* x, int64_t total, float* col) {
  const int64_t p = g.ho * g.wo, rows = g.c * g.kh * g.kw;
  TS_GRID_LOOP(t, total) {
    const int64_t q = t % p, r = (t / p) % rows, s = t / (p * rows);
    const int64_t j = r % g.kw, i = (r / g.kw) % g.kh, c = r / (g.kw * g.kh);
    const int64_t ih = (q / g.wo) * g.sh - g.ph + i * g.dh;
    const int64_t iw = (q % g.wo) * g.sw - g.pw + j * g.dw;
    col[t] = ih >= 0 && ih < g.h && iw >= 0 && iw < g.w ? x[((s * g.c + c) * g.h + ih) * g.w + iw]
                                                        : 0.0f;
  }
}

// One thread per dx element: for each (i, j) at most one output cell (oh, ow) reads it.
__global__ void Col2ImAddKernel(ConvShape g, const float* col, int64_t total, float* dx) {
  const int64_t p = g.ho * g.wo, kk = g.kh * g.kw;
  TS_GRID_LOOP(t, total) {
    const int64_t iw = t % g.w, ih = (t / g.w) % g.h;
    const int64_t c = (t / (g.w * g.h)) % g.c, s = t / (g.w * g.h * g.c);
    const float* rows = col + (s * g.c + c) * kk * p;
    float sum = 0;
    for (int64_t i = 0; i < g.kh; ++i) {
      const int64_t hs = ih + g.ph - i * g.dh;  // oh sh
      if (hs < 0) break;
      if (hs % g.sh != 0 || hs / g.sh >= g.ho) continue;
      for (int64_t j = 0; j < g.kw; ++j) {
        const int64_t ws = iw + g.pw - j * g.dw;  // ow sw
        if (ws < 0) break;
        if (ws % g.sw != 0 || ws / g.sw >= g.wo) continue;
        sum += rows[(i * g.kw + j) * p + (hs / g.sh) * g.wo + ws / g.sw];
      }
    }
    dx[t] += sum;
  }
}

// ---------------------------------------------------------------------------------------------
// pool2d

struct Window {
  int64_t h0, h1, w0, w1;
};

__device__ Window PoolWindow(const PoolShape& g, int64_t oh, int64_t ow) {
  const int64_t hs = oh * g.sh - g.ph, ws = ow * g.sw - g.pw;
  return Window{hs > 0 ? hs : 0, hs + g.kh < g.h ? hs + g.kh : g.h, ws > 0 ? ws : 0,
                ws + g.kw < g.w ? ws + g.kw : g.w};
}

// The offset in `plane` of the window's first maximum (as the CPU kernel's ArgMax).
__device__ int64_t PoolArgMax(const PoolShape& g, const float* plane, const Window& b) {
  int64_t best = b.h0 * g.w + b.w0;
  float v = plane[best];
  for (int64_t ih = b.h0; ih < b.h1; ++ih) {
    for (int64_t iw = b.w0; iw < b.w1; ++iw) {
      if (plane[ih * g.w + iw] > v) {
        best = ih * g.w + iw;
        v = plane[best];
      }
    }
  }
  return best;
}

__device__ float PoolDivisor(const PoolShape& g, const Window& b) {
  return static_cast<float>(g.exclusive ? (b.h1 - b.h0) * (b.w1 - b.w0) : g.kh * g.kw);
}

__global__ void PoolKernel(PoolShape g, const float* x, int64_t total, float* out) {
  TS_GRID_LOOP(k, total) {
    const int64_t ow = k % g.wo, oh = (k / g.wo) % g.ho, plane = k / (g.wo * g.ho);
    const float* in = x + plane * g.h * g.w;
    const Window b = PoolWindow(g, oh, ow);
    if (g.max) {
      out[k] = in[PoolArgMax(g, in, b)];
      continue;
    }
    float sum = 0;
    for (int64_t ih = b.h0; ih < b.h1; ++ih) {
      for (int64_t iw = b.w0; iw < b.w1; ++iw) sum += in[ih * g.w + iw];
    }
    out[k] = sum / PoolDivisor(g, b);
  }
}

// One thread per dx element; the windows covering (ih, iw) are oh in
// [ceil((ih + ph - kh + 1) / sh), (ih + ph) / sh], likewise ow.
__global__ void PoolGradKernel(PoolShape g, const float* x, const float* dout, int64_t total,
                               float* dx) {
  TS_GRID_LOOP(t, total) {
    const int64_t iw = t % g.w, ih = (t / g.w) % g.h, plane = t / (g.w * g.h);
    const float* in = g.max ? x + plane * g.h * g.w : nullptr;
    const float* go = dout + plane * g.ho * g.wo;
    const int64_t hl = ih + g.ph - g.kh + 1, wl = iw + g.pw - g.kw + 1;
    const int64_t oh0 = hl > 0 ? (hl + g.sh - 1) / g.sh : 0;
    const int64_t ow0 = wl > 0 ? (wl + g.sw - 1) / g.sw : 0;
    const int64_t oh1 = min((ih + g.ph) / g.sh + 1, g.ho);
    const int64_t ow1 = min((iw + g.pw) / g.sw + 1, g.wo);
    float acc = 0;
    for (int64_t oh = oh0; oh < oh1; ++oh) {
      for (int64_t ow = ow0; ow < ow1; ++ow) {
        const Window b = PoolWindow(g, oh, ow);
        if (!g.max) {
          acc += go[oh * g.wo + ow] / PoolDivisor(g, b);
        } else if (PoolArgMax(g, in, b) == ih * g.w + iw) {
          acc += go[oh * g.wo + ow];
        }
      }
    }
    dx[t] = acc;
  }
}

// ---------------------------------------------------------------------------------------------
// batch_norm

// The sum of every thread's v (blockDim.x == kThreads), returned to all threads.
__device__ double BlockSum(double v, double* partial) {
  partial[threadIdx.x] = v;
  __syncthreads();
  for (int w = blockDim.x / 2; w > 0; w /= 2) {
    if (threadIdx.x < w) partial[threadIdx.x] += partial[threadIdx.x + w];
    __syncthreads();
  }
  const double total = partial[0];
  __syncthreads();  // partial is reused by the next call
  return total;
}

// The offset of element j (of n inner) of channel c.
__device__ int64_t ChannelOffset(const NormShape& d, int64_t c, int64_t j) {
  const int64_t i = j / d.inner;
  return (i * d.c + c) * d.inner + (j - i * d.inner);
}

__device__ float InvStd(const float* var, int64_t c, bool var_is_inv_std, double eps) {
  return var_is_inv_std ? var[c]
                        : static_cast<float>(1.0 / sqrt(static_cast<double>(var[c]) + eps));
}

// One block per channel; two passes (mean, then squared deviations) as on the CPU.
__global__ void BatchNormStatsKernel(NormShape d, const float* x, double eps, float momentum,
                                     const float* mean, const float* var, float* saved_mean,
                                     float* saved_inv_std, float* mean_out, float* var_out) {
  __shared__ double partial[kThreads];
  const int64_t c = blockIdx.x, count = d.n * d.inner;
  double s = 0;
  for (int64_t j = threadIdx.x; j < count; j += blockDim.x) s += x[ChannelOffset(d, c, j)];
  const double m = BlockSum(s, partial) / static_cast<double>(count);
  double sq = 0;
  for (int64_t j = threadIdx.x; j < count; j += blockDim.x) {
    const double v = x[ChannelOffset(d, c, j)] - m;
    sq += v * v;
  }
  const double bv = BlockSum(sq, partial) / static_cast<double>(count);
  if (threadIdx.x != 0) return;
  const float mu = static_cast<float>(m), run_mean = mean[c], run_var = var[c];
  saved_mean[c] = mu;
  saved_inv_std[c] = static_cast<float>(1.0 / sqrt(bv + eps));
  mean_out[c] = momentum * run_mean + (1.0f - momentum) * mu;
  var_out[c] = momentum * run_var + (1.0f - momentum) * static_cast<float>(bv);
}

__global__ void BatchNormApplyKernel(NormShape d, const float* x, const float* scale,
                                     const float* bias, const float* mean, const float* var,
                                     bool var_is_inv_std, double eps, int64_t total, float* y) {
  TS_GRID_LOOP(t, total) {
    const int64_t c = (t / d.inner) % d.c;
    const float a = scale[c] * InvStd(var, c, var_is_inv_std, eps);
    const float b = bias[c] - mean[c] * a;
    y[t] = x[t] * a + b;
  }
}

__global__ void BatchNormGradSumsKernel(NormShape d, const float* x, const float* dy,
                                        const float* mean, const float* var, bool var_is_inv_std,
                                        double eps, float* sum_dy, float* sum_dy_xhat) {
  __shared__ double partial[kThreads];
  const int64_t c = blockIdx.x, count = d.n * d.inner;
  const float inv = InvStd(var, c, var_is_inv_std, eps), mu = mean[c];
  double s = 0, sx = 0;
  for (int64_t j = threadIdx.x; j < count; j += blockDim.x) {
    const int64_t o = ChannelOffset(d, c, j);
    const float g = dy[o];
    s += g;
    sx += g * (x[o] - mu) * inv;
  }
  s = BlockSum(s, partial);
  sx = BlockSum(sx, partial);
  if (threadIdx.x != 0) return;
  sum_dy[c] = static_cast<float>(s);
  sum_dy_xhat[c] = static_cast<float>(sx);
}

__global__ void BatchNormGradXKernel(NormShape d, const float* x, const float* dy,
                                     const float* scale, const float* mean, const float* var,
                                     bool var_is_inv_std, double eps, const float* sum_dy,
                                     const float* sum_dy_xhat, int64_t total, float* dx) {
  const float m = static_cast<float>(d.n * d.inner > 1 ? d.n * d.inner : 1);
  TS_GRID_LOOP(t, total) {
    const int64_t c = (t / d.inner) % d.c;
    const float inv = InvStd(var, c, var_is_inv_std, eps), a = scale[c] * inv;
    if (sum_dy == nullptr) {
      dx[t] = a * dy[t];
    } else {
      const float xhat = (x[t] - mean[c]) * inv;
      dx[t] = a * (dy[t] - (sum_dy[c] + xhat * sum_dy_xhat[c]) / m);
    }
  }
}

// ---------------------------------------------------------------------------------------------
// dropout

// Counter-based uniforms: copies of SplitMix64Mix (common/base/splitmix64.h) and of CounterUniform
// with its helpers StreamKey, Bits and ToUnit (common/ops/counter_rng.h), callable on the device
// (and on the host, for checks). They MUST stay equal to those, bit for bit: the GPU dropout
// mask must be the one the CPU kernel draws (gpu_ops_test compares the two masks bit for bit).
// Integer arithmetic wraps mod 2^64 as on the host; the conversion of the top 53 bits to double
// and the scaling by 2^-53 are exact on both.
constexpr uint64_t kRngGolden = 0x9e3779b97f4a7c15ULL;  // kSplitMix64Gamma

__host__ __device__ inline uint64_t RngMix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

__host__ __device__ inline uint64_t RngStreamKey(uint64_t seed, uint64_t stream) {
  return RngMix64(seed * kRngGolden + stream * 0xd1b54a32d192ed03ULL + 0x632be59bd9b4e019ULL);
}

__host__ __device__ inline uint64_t RngBits(uint64_t key, uint64_t index) {
  return RngMix64(key + (index + 1) * kRngGolden);
}

__host__ __device__ inline double RngToUnit(uint64_t bits) {
  return static_cast<double>(bits >> 11) * 0x1.0p-53;
}

// CounterUniform(seed, index).
__host__ __device__ inline double RngCounterUniform(uint64_t seed, uint64_t index) {
  return RngToUnit(RngBits(RngStreamKey(seed, 0), index));
}

__global__ void DropoutKernel(const float* x, int64_t n, uint64_t key, double p, float scale,
                              float* out, float* mask) {
  TS_GRID_LOOP(i, n) {
    const float v = x[i];  // out may be x
    if (mask == nullptr) {
      out[i] = v * scale;
      continue;
    }
    const bool keep = RngCounterUniform(key, static_cast<uint64_t>(i)) >= p;  // DropoutKeep
    mask[i] = keep ? 1.0f : 0.0f;
    out[i] = keep ? v * scale : 0.0f;
  }
}

__global__ void DropoutGradKernel(const float* dout, const float* mask, int64_t n, float scale,
                                  float* dx) {
  TS_GRID_LOOP(i, n) dx[i] = mask == nullptr ? dout[i] * scale : (dout[i] * mask[i]) * scale;
}

// ---------------------------------------------------------------------------------------------
// accuracy

// One thread per row: TopKCorrect (common/ops/nn_ops.h), the same comparisons in the same order.
__global__ void TopKCorrectKernel(const float* x, const int64_t* labels, int64_t n, int64_t c,
                                  int64_t k, int32_t* row_correct) {
  TS_GRID_LOOP(r, n) {
    const int64_t label = labels[r];
    if (label < 0 || label >= c) {
      row_correct[r] = 0;
      continue;
    }
    const float* scores = x + r * c;
    const float s = scores[label];
    int64_t higher = 0;
    for (int64_t j = 0; j < c && higher < k; ++j) higher += scores[j] > s;
    row_correct[r] = higher < k ? 1 : 0;
  }
}

// One block: the number of correct rows (an integer sum: exact in any order).
__global__ void AccuracySumKernel(const int32_t* row_correct, int64_t n, float* accuracy,
                                  int64_t* correct, int64_t* total) {
  __shared__ long long partial[kThreads];
  long long s = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) s += row_correct[i];
  partial[threadIdx.x] = s;
  __syncthreads();
  for (int w = blockDim.x / 2; w > 0; w /= 2) {
    if (threadIdx.x < w) partial[threadIdx.x] += partial[threadIdx.x + w];
    __syncthreads();
  }
  if (threadIdx.x != 0) return;
  const int64_t sum = static_cast<int64_t>(partial[0]);
  accuracy[0] =
      n == 0 ? 0.0f : static_cast<float>(static_cast<double>(sum) / static_cast<double>(n));
  if (correct != nullptr) correct[0] = sum;
  if (total != nullptr) total[0] = n;
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

cudaError_t Im2Col(const ConvShape& g, const float* x, int64_t count, float* col, cudaStream_t s) {
  const int64_t total = count * g.c * g.kh * g.kw * g.ho * g.wo;
  TS_LAUNCH(total, Im2ColKernel, g, x, total, col);
}
cudaError_t Col2ImAdd(const ConvShape& g, const float* col, int64_t count, float* dx,
                      cudaStream_t s) {
  const int64_t total = count * g.c * g.h * g.w;
  TS_LAUNCH(total, Col2ImAddKernel, g, col, total, dx);
}
cudaError_t Pool2d(const PoolShape& g, const float* x, float* out, cudaStream_t s) {
  const int64_t total = g.planes * g.ho * g.wo;
  TS_LAUNCH(total, PoolKernel, g, x, total, out);
}
cudaError_t Pool2dGrad(const PoolShape& g, const float* x, const float* dout, float* dx,
                       cudaStream_t s) {
  const int64_t total = g.planes * g.h * g.w;
  TS_LAUNCH(total, PoolGradKernel, g, x, dout, total, dx);
}
cudaError_t BatchNormStats(const NormShape& d, const float* x, double eps, float momentum,
                           const float* mean, const float* var, float* saved_mean,
                           float* saved_inv_std, float* mean_out, float* var_out, cudaStream_t s) {
  if (d.c > 0) {
    BatchNormStatsKernel<<<static_cast<unsigned>(d.c), kThreads, 0, s>>>(
        d, x, eps, momentum, mean, var, saved_mean, saved_inv_std, mean_out, var_out);
  }
  return cudaGetLastError();
}
cudaError_t BatchNormApply(const NormShape& d, const float* x, const float* scale,
                           const float* bias, const float* mean, const float* var,
                           bool var_is_inv_std, double eps, float* y, cudaStream_t s) {
  const int64_t total = d.n * d.c * d.inner;
  TS_LAUNCH(total, BatchNormApplyKernel, d, x, scale, bias, mean, var, var_is_inv_std, eps, total,
            y);
}
cudaError_t BatchNormGradSums(const NormShape& d, const float* x, const float* dy,
                              const float* mean, const float* var, bool var_is_inv_std, double eps,
                              float* sum_dy, float* sum_dy_xhat, cudaStream_t s) {
  if (d.c > 0) {
    BatchNormGradSumsKernel<<<static_cast<unsigned>(d.c), kThreads, 0, s>>>(
        d, x, dy, mean, var, var_is_inv_std, eps, sum_dy, sum_dy_xhat);
  }
  return cudaGetLastError();
}
cudaError_t BatchNormGradX(const NormShape& d, const float* x, const float* dy, const float* scale,
                           const float* mean, const float* var, bool var_is_inv_std, double eps,
                           const float* sum_dy, const float* sum_dy_xhat, float* dx,
                           cudaStream_t s) {
  const int64_t total = d.n * d.c * d.inner;
  TS_LAUNCH(total, BatchNormGradXKernel, d, x, dy, scale, mean, var, var_is_inv_std, eps, sum_dy,
            sum_dy_xhat, total, dx);
}

cudaError_t Dropout(const float* x, int64_t n, uint64_t key, double p, float scale, float* out,
                    float* mask, cudaStream_t s) {
  TS_LAUNCH(n, DropoutKernel, x, n, key, p, scale, out, mask);
}
cudaError_t DropoutGrad(const float* dout, const float* mask, int64_t n, float scale, float* dx,
                        cudaStream_t s) {
  TS_LAUNCH(n, DropoutGradKernel, dout, mask, n, scale, dx);
}
cudaError_t Accuracy(const float* x, const int64_t* labels, int64_t n, int64_t c, int64_t k,
                     int32_t* row_correct, float* accuracy, int64_t* correct, int64_t* total,
                     cudaStream_t s) {
  if (n > 0) {
    TopKCorrectKernel<<<Blocks(n), kThreads, 0, s>>>(x, labels, n, c, k, row_correct);
    const cudaError_t e = cudaGetLastError();
    if (e != cudaSuccess) return e;
  }
  AccuracySumKernel<<<1, kThreads, 0, s>>>(row_correct, n, accuracy, correct, total);
  return cudaGetLastError();
}

}  // namespace gpu
}  // namespace tessera
