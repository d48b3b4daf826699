// Launchers of the CUDA kernels behind the GPU ops (float32). Plain C++ over raw device
// pointers, so that only gpu_kernels.cu goes through nvcc; the op logic (checks, shapes,
// placement) is in gpu_ops.cc. Every launcher enqueues on `stream` and returns the launch
// status (cudaGetLastError). Sizes are element counts; n == 0 launches nothing.
#ifndef TESSERA_COMMON_DEVICE_CUDA_GPU_KERNELS_H_
#define TESSERA_COMMON_DEVICE_CUDA_GPU_KERNELS_H_

#include <cstdint>

#include <cuda_runtime_api.h>

namespace tessera {
namespace gpu {

enum class Binary { kAdd = 0, kSub = 1, kMul = 2 };
enum class Activation { kRelu = 0, kSigmoid = 1, kTanh = 2 };
enum class Optimizer { kSgd = 0, kMomentum = 1, kNesterov = 2, kAdam = 3, kAdagrad = 4 };

// out[i] = v.
cudaError_t Fill(float* out, int64_t n, float v, cudaStream_t s);
// out[i] = after ? x[i] * scale + bias : (x[i] + bias) * scale. out may be x.
cudaError_t Scale(const float* x, float* out, int64_t n, float scale, float bias, bool after,
                  cudaStream_t s);
// out[i] += x[i].
cudaError_t AddTo(const float* x, float* out, int64_t n, cudaStream_t s);
// out[i, j, k] = f(x[i, j, k], y[j]) over x viewed as [pre, n, post] (y has n elements; when
// same, y has pre * n * post elements and is read elementwise). out may be x.
cudaError_t BinaryBroadcast(Binary f, const float* x, const float* y, float* out, int64_t pre,
                            int64_t n, int64_t post, bool same, cudaStream_t s);
// dy[j] = scale * sum_{i,k} g[i, j, k] (* x[i, j, k] when x != nullptr).
cudaError_t ReduceToY(const float* g, const float* x, int64_t pre, int64_t n, int64_t post,
                      float scale, float* dy, cudaStream_t s);
cudaError_t ActivationForward(Activation f, const float* x, float* out, int64_t n,
                              cudaStream_t s);
// dx = dout * f'(x), written in terms of out = f(x). dx may alias out or dout.
cudaError_t ActivationGrad(Activation f, const float* out, const float* dout, float* dx,
                           int64_t n, cudaStream_t s);
// out[0] = scale * sum(x) (one block; deterministic).
cudaError_t SumAll(const float* x, int64_t n, float scale, float* out, cudaStream_t s);
// dx[i] = dout[0] * scale.
cudaError_t FillFromScalar(const float* dout, float scale, float* dx, int64_t n, cudaStream_t s);
// out = (x - y)^2.
cudaError_t SquareError(const float* x, const float* y, float* out, int64_t n, cudaStream_t s);
// g = 2 (x - y) dout; dx = g, dy = -g (either may be null).
cudaError_t SquareErrorGrad(const float* x, const float* y, const float* dout, float* dx,
                            float* dy, int64_t n, cudaStream_t s);
// out = max(x, 0) - x z + log1p(exp(-|x|)), 0 where z == ignore (scaled by `scale`).
cudaError_t SigmoidCrossEntropy(const float* x, const float* z, float* out, int64_t n,
                                float ignore, float scale, cudaStream_t s);
// dx = (sigmoid(x) - z) dout scale, 0 where z == ignore.
cudaError_t SigmoidCrossEntropyGrad(const float* x, const float* z, const float* dout, float* dx,
                                    int64_t n, float ignore, float scale, cudaStream_t s);
// Row-wise softmax of logits [rows, c] and its cross entropy with hard labels (int64 class ids,
// ignore_index gives loss 0) or soft labels ([rows, c] floats; hard_labels == nullptr).
cudaError_t SoftmaxCrossEntropy(const float* logits, const int64_t* hard_labels,
                                const float* soft_labels, int64_t rows, int64_t c,
                                int64_t ignore_index, float* softmax, float* loss,
                                cudaStream_t s);
// dx = (softmax - onehot) dloss (hard) or (softmax * sum(z) - z) dloss (soft). dx may be softmax.
cudaError_t SoftmaxCrossEntropyGrad(const float* softmax, const int64_t* hard_labels,
                                    const float* soft_labels, const float* dloss, int64_t rows,
                                    int64_t c, int64_t ignore_index, float* dx, cudaStream_t s);
// out[i, :] = src[index[i], :] (width floats per row); index[i] < 0 gives a zero row.
cudaError_t GatherRows(const float* src, const int64_t* index, int64_t n, int64_t width,
                       float* out, cudaStream_t s);
// dst[index[i], :] += src[i, :] (atomic; index[i] < 0 skipped).
cudaError_t ScatterAddRows(const float* src, const int64_t* index, int64_t n, int64_t width,
                           float* dst, cudaStream_t s);
// One optimizer update of the elements of `rows` (n_rows of `width`; rows == nullptr: dense,
// n_rows * width elements from offset 0). g holds n_rows * width gradient values.
// sgd: p -= lr (g + c p). momentum: v = mu v + g'; p -= lr v (nesterov: lr (g' + mu v)).
// adam (lr = lr_t): m1, m2 moments. adagrad: m += g'^2; p -= lr g' / (sqrt(m) + eps).
struct OptimizerArgs {
  Optimizer kind = Optimizer::kSgd;
  float lr = 0, coeff = 0, mu = 0, beta1 = 0, beta2 = 0, eps = 0;
};
cudaError_t ApplyOptimizer(const OptimizerArgs& a, const int64_t* rows, int64_t n_rows,
                           int64_t width, const float* g, float* p, float* m1, float* m2,
                           cudaStream_t s);

// conv2d over NCHW samples: input [c, h, w], filter [*, c, kh, kw], output [*, ho, wo]; strides
// (sh, sw), symmetric paddings (ph, pw), dilations (dh, dw).
struct ConvShape {
  int64_t c = 0, h = 0, w = 0, kh = 0, kw = 0;
  int64_t sh = 1, sw = 1, ph = 0, pw = 0, dh = 1, dw = 1;
  int64_t ho = 0, wo = 0;
};
// col = count matrices [c kh kw, ho wo] back to back, one per sample of x [count, c, h, w]:
// entry ((c, i, j), (oh, ow)) of sample s is x[s, c, oh sh - ph + i dh, ow sw - pw + j dw], 0
// outside the image.
cudaError_t Im2Col(const ConvShape& g, const float* x, int64_t count, float* col, cudaStream_t s);
// The adjoint of Im2Col: dx[s, c, ih, iw] += the col entries read from there (one thread per dx
// element, summed in (i, j) order; no atomics).
cudaError_t Col2ImAdd(const ConvShape& g, const float* col, int64_t count, float* dx,
                      cudaStream_t s);

// pool2d over planes [h, w] (planes = n c): the window of output (oh, ow) is rows
// [oh sh - ph, + kh) and columns [ow sw - pw, + kw) clipped to the image.
struct PoolShape {
  bool max = true;
  bool exclusive = true;  // avg: divide by the clipped window's cells (else by kh kw)
  int64_t planes = 0, h = 0, w = 0, kh = 0, kw = 0, sh = 1, sw = 1, ph = 0, pw = 0;
  int64_t ho = 0, wo = 0;
};
// out [planes, ho, wo] = the window's maximum or average.
cudaError_t Pool2d(const PoolShape& g, const float* x, float* out, cudaStream_t s);
// dx [planes, h, w] = the sum over the windows covering each cell, in row-major window order
// (one thread per dx element; no atomics): max adds dout to the window's first maximum
// (row-major; a value strictly greater replaces), avg adds dout / divisor. x may be null for avg.
cudaError_t Pool2dGrad(const PoolShape& g, const float* x, const float* dout, float* dx,
                       cudaStream_t s);

// batch_norm: X viewed as [n, c, inner]. Per-channel sums take one block per channel
// (deterministic tree reduction in double). Below Stats, `var` is the variance (inv_std =
// 1 / sqrt(var + eps), computed in double) or, when var_is_inv_std, that inv_std already.
struct NormShape {
  int64_t n = 0, c = 0, inner = 0;
};
// The batch mean and biased variance of each channel (two passes): saved_mean = batch mean,
// saved_inv_std = 1 / sqrt(batch var + eps); the running mean_out = momentum mean +
// (1 - momentum) batch mean, likewise var_out from var (mean_out may be mean and var_out var:
// each value is read before it is written).
cudaError_t BatchNormStats(const NormShape& d, const float* x, double eps, float momentum,
                           const float* mean, const float* var, float* saved_mean,
                           float* saved_inv_std, float* mean_out, float* var_out, cudaStream_t s);
// y = x a + b with a = scale inv_std, b = bias - mean a, per channel.
cudaError_t BatchNormApply(const NormShape& d, const float* x, const float* scale,
                           const float* bias, const float* mean, const float* var,
                           bool var_is_inv_std, double eps, float* y, cudaStream_t s);
// sum_dy[c] = sum dy, sum_dy_xhat[c] = sum dy (x - mean) inv_std over the channel.
cudaError_t BatchNormGradSums(const NormShape& d, const float* x, const float* dy,
                              const float* mean, const float* var, bool var_is_inv_std, double eps,
                              float* sum_dy, float* sum_dy_xhat, cudaStream_t s);
// dx = scale inv_std (dy - (sum_dy + xhat sum_dy_xhat) / (n inner)), or scale inv_std dy when
// sum_dy is null (global statistics).
cudaError_t BatchNormGradX(const NormShape& d, const float* x, const float* dy, const float* scale,
                           const float* mean, const float* var, bool var_is_inv_std, double eps,
                           const float* sum_dy, const float* sum_dy_xhat, float* dx,
                           cudaStream_t s);

// dropout. Training (mask != nullptr): element i is kept when CounterUniform(key, i) >= p (the
// rule of common/ops/dropout_util.h; gpu_kernels.cu holds a device copy of counter_rng.h's
// CounterUniform that must stay bit-identical to it): mask[i] = keep ? 1 : 0 and out[i] =
// keep ? x[i] * scale : 0. Inference (mask == nullptr): out[i] = x[i] * scale. out may be x
// (mask may not).
cudaError_t Dropout(const float* x, int64_t n, uint64_t key, double p, float scale, float* out,
                    float* mask, cudaStream_t s);
// dx[i] = dout[i] * mask[i] * scale (in that order, as the CPU kernel), or dout[i] * scale when
// mask is null. dx may be dout or mask.
cudaError_t DropoutGrad(const float* dout, const float* mask, int64_t n, float scale, float* dx,
                        cudaStream_t s);

// accuracy over scores x [n, c] and class ids labels [n] (in [0, c); the caller checks them, an
// id outside counts as wrong): row_correct[i] (n ints of scratch) = whether fewer than k classes
// of row i score strictly higher than its label (TopKCorrect of common/ops/nn_ops.h; one thread
// per row), then one block sums them (deterministic): accuracy[0] = float(double(sum) / n) (0
// when n == 0), and correct[0] = sum, total[0] = n where those are not null.
cudaError_t Accuracy(const float* x, const int64_t* labels, int64_t n, int64_t c, int64_t k,
                     int32_t* row_correct, float* accuracy, int64_t* correct, int64_t* total,
                     cudaStream_t s);

}  // namespace gpu
}  // namespace tessera

#endif  // TESSERA_COMMON_DEVICE_CUDA_GPU_KERNELS_H_
