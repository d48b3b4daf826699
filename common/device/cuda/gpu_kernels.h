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

}  // namespace gpu
}  // namespace tessera

#endif  // TESSERA_COMMON_DEVICE_CUDA_GPU_KERNELS_H_
