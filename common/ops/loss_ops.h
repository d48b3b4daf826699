// softmax_with_cross_entropy, square_error, mean.
#ifndef TESSERA_COMMON_OPS_LOSS_OPS_H_
#define TESSERA_COMMON_OPS_LOSS_OPS_H_

#include "common/framework/op_registry.h"

namespace tessera {

absl::Status RegisterLossOps(OpRegistry* registry);

}  // namespace tessera

#endif  // TESSERA_COMMON_OPS_LOSS_OPS_H_
