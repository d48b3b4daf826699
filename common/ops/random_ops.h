// uniform_random, gaussian_random (counter-based: element i of a seed is the same wherever it is
// computed), and dropout / dropout_grad (masks drawn the same way, a new one per run).
#ifndef TESSERA_COMMON_OPS_RANDOM_OPS_H_
#define TESSERA_COMMON_OPS_RANDOM_OPS_H_

#include "common/framework/op_registry.h"

namespace tessera {

absl::Status RegisterRandomOps(OpRegistry* registry);

}  // namespace tessera

#endif  // TESSERA_COMMON_OPS_RANDOM_OPS_H_
