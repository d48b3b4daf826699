// Image and normalization ops (NCHW): conv2d, pool2d, flatten, batch_norm, and the accuracy
// metric op, each with its gradient (accuracy has none).
//
//   conv2d      Input [N, C, H, W], Filter [M, C, kh, kw] -> Output [N, M, Ho, Wo]; attrs
//               strides, paddings (symmetric, [ph, pw]), dilations (all default [1, 1]) and
//               groups (1 only). Ho = (H + 2 ph - (dh (kh - 1) + 1)) / sh + 1. im2col + GEMM.
//   pool2d      X [N, C, H, W] -> Out; attrs pooling_type ("max" | "avg"), ksize, strides,
//               paddings, global_pooling (whole H x W), exclusive (avg: divide by the window's
//               cells inside the image, default true; false divides by kh kw). Max ignores
//               padding; its gradient goes to the first maximum of each window.
//   flatten     X -> Out [prod(dims[0:axis]), prod(dims[axis:])], attr axis (default 1).
//   batch_norm  X [N, C, ...], Scale, Bias, Mean, Variance [C] -> Y, MeanOut, VarianceOut (the
//               running statistics, normally the same variables as Mean and Variance),
//               SavedMean, SavedVariance (the batch mean and 1 / sqrt(var + epsilon)). Training
//               normalizes with the batch's (biased) statistics and moves the running ones:
//               MeanOut = momentum Mean + (1 - momentum) batch_mean, likewise VarianceOut.
//               is_test (or use_global_stats) normalizes with Mean and Variance. Attrs epsilon
//               (1e-5), momentum (0.9).
//   accuracy    X [N, C] scores, Label [N, 1] int64/int32 class ids -> Accuracy [1] (X's dtype),
//               Correct [1] int64, Total [1] int64; attr k (default 1): a row is correct when
//               fewer than k classes score strictly higher than its label (TopKCorrect).
#ifndef TESSERA_COMMON_OPS_NN_OPS_H_
#define TESSERA_COMMON_OPS_NN_OPS_H_

#include <cstdint>

#include "common/framework/op_registry.h"

namespace tessera {

absl::Status RegisterNnOps(OpRegistry* registry);

// Whether class `label` of a row of `classes` scores is among its top k: fewer than k classes
// score strictly higher (ties count for the label). The accuracy op and the trainer's held-out
// accuracy use this one rule.
template <typename T>
bool TopKCorrect(const T* scores, int64_t classes, int64_t label, int64_t k) {
  const T s = scores[label];
  int64_t higher = 0;
  for (int64_t j = 0; j < classes && higher < k; ++j) higher += scores[j] > s;
  return higher < k;
}

}  // namespace tessera

#endif  // TESSERA_COMMON_OPS_NN_OPS_H_
