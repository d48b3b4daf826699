// dropout's attributes and the key of its random draws, shared by the CPU kernel
// (common/ops/random_ops.cc) and the GPU kernel (common/device/cuda/gpu_ops.cc) so that both
// draw the same mask: in training, element k of X is kept when DropoutKeep(key, k, p), that is
// CounterUniform(key, k) >= p (common/ops/counter_rng.h), with key = DropoutKey(...) below.
//
// The key mixes the seed attribute, the op's run count on this scope (variable "<Mask>@runs",
// an int64 [1] host tensor kept by the scope, not by checkpoints, advanced by every training
// run) and the bits of X's first kDropoutKeyBytes bytes, so that consecutive steps, and the
// places of a multi-place trainer (each on its own part of the batch), get different masks
// reproducibly. A kernel passes those leading bytes as a host pointer (the GPU kernel copies
// them from the device first), so both kernels compute the key with this one function.
#ifndef TESSERA_COMMON_OPS_DROPOUT_UTIL_H_
#define TESSERA_COMMON_OPS_DROPOUT_UTIL_H_

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "common/framework/op_registry.h"
#include "common/ops/counter_rng.h"
#include "common/base/splitmix64.h"

namespace tessera {

struct DropoutAttrs {
  double p = 0.5;        // dropout_prob, in [0, 1)
  bool upscale = false;  // dropout_implementation "upscale_in_train" (else "downgrade_in_infer")
  bool is_test = false;  // inference: no mask, Out = X * scale
};

// The attributes, or the op's error for a bad dropout_prob or dropout_implementation.
inline absl::StatusOr<DropoutAttrs> ReadDropoutAttrs(const OpContext& ctx) {
  DropoutAttrs a;
  a.p = ctx.FloatAttr("dropout_prob", 0.5f);
  if (!(a.p >= 0 && a.p < 1)) {
    return ctx.Error(absl::StrCat("dropout_prob ", a.p, " must be in [0, 1)"));
  }
  const std::string impl = ctx.StringAttr("dropout_implementation", "downgrade_in_infer");
  if (impl != "downgrade_in_infer" && impl != "upscale_in_train") {
    return ctx.Error(absl::StrCat("dropout_implementation '", impl,
                                  "' must be downgrade_in_infer or upscale_in_train"));
  }
  a.upscale = impl == "upscale_in_train";
  a.is_test = ctx.BoolAttr("is_test", false);
  return a;
}

// The factor kept elements (training) or all elements (inference) are multiplied by.
inline double DropoutScale(const DropoutAttrs& a) {
  if (a.is_test) return a.upscale ? 1.0 : 1.0 - a.p;
  return a.upscale ? 1.0 / (1.0 - a.p) : 1.0;
}

// How many of X's leading bytes the key mixes in.
inline constexpr size_t kDropoutKeyBytes = 64;

// The key of this training run's draws: the seed attribute, the run count on this scope (read
// and advanced: call once per run, after every check that may decline or fail), and the first
// min(bytes, kDropoutKeyBytes) bytes at `lead` (host memory: X's first bytes; bytes is X's
// nbytes or more than kDropoutKeyBytes).
inline uint64_t DropoutKey(OpContext& ctx, const void* lead, size_t bytes) {
  const std::string runs_name = absl::StrCat(ctx.OutputName("Mask"), "@runs");
  Variable* runs = ctx.scope()->FindLocalVar(runs_name);
  if (runs == nullptr) {
    runs = ctx.scope()->Var(runs_name);
    Tensor* t = runs->GetMutable<Tensor>();
    t->Resize(INT64, {1});
    t->data<int64_t>()[0] = 0;
  }
  int64_t& run = runs->GetMutable<Tensor>()->data<int64_t>()[0];
  uint64_t key = SplitMix64Mix(static_cast<uint64_t>(ctx.IntAttr("seed", 0))) ^
                 SplitMix64Mix(static_cast<uint64_t>(run) + kSplitMix64Gamma);
  ++run;
  bytes = std::min(bytes, kDropoutKeyBytes);
  const unsigned char* data = static_cast<const unsigned char*>(lead);
  for (size_t i = 0; i < bytes; i += 8) {
    uint64_t word = 0;
    std::memcpy(&word, data + i, std::min<size_t>(8, bytes - i));
    key = SplitMix64Mix(key ^ word);
  }
  return key;
}

// Whether training keeps element k (the CPU rule; the GPU kernel's device copy of
// CounterUniform in common/device/cuda/gpu_kernels.cu must agree bit for bit).
inline bool DropoutKeep(uint64_t key, int64_t k, double p) {
  return CounterUniform(key, static_cast<uint64_t>(k)) >= p;
}

}  // namespace tessera

#endif  // TESSERA_COMMON_OPS_DROPOUT_UTIL_H_
