// GPU kernels for the standard ops (float32), as DeviceKernelFns for placement. The gpu_ops
// library is built only with --config=cuda; RegisterGpuKernels puts the kernels into a table the
// caller owns (a trainer's DevicePlan: trainer/device_setup.cc), and linking the library
// registers the CUDA DeviceBackend (process-wide, see common/framework/place.h) at static
// initialization.
//
// Covered, forward and gradient: mul, matmul (2-D), elementwise_add/sub/mul (Fluid broadcast),
// relu/sigmoid/tanh, mean, sum (dense), scale, assign, fill_constant, fill_zeros_like,
// square_error, sigmoid_cross_entropy_with_logits, softmax_with_cross_entropy, lookup_table
// (dense and sparse gradient), concat, split, conv2d (im2col + cuBLAS per sample), pool2d,
// flatten, batch_norm, dropout (masks bit-identical to the CPU kernel's), accuracy (no gradient;
// int64 labels), and the optimizers sgd, momentum, adam, adagrad (dense and sparse rows).
// Anything else — another dtype, batched matmul, a normalized sigmoid loss, sparse sum, int32
// accuracy labels — declines, and the CPU kernel runs it on host copies.
#ifndef TESSERA_COMMON_DEVICE_CUDA_GPU_OPS_H_
#define TESSERA_COMMON_DEVICE_CUDA_GPU_OPS_H_

#include "absl/status/status.h"
#include "common/device/placement.h"

namespace tessera {

// Adds every kernel below to `table`. AlreadyExists (naming the op type) when `table` has a
// kernel for one of them already.
absl::Status RegisterGpuKernels(DeviceKernelTable* table);

}  // namespace tessera

#endif  // TESSERA_COMMON_DEVICE_CUDA_GPU_OPS_H_
