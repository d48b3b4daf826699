// relu, sigmoid, tanh.
#ifndef TESSERA_COMMON_OPS_ACTIVATION_OPS_H_
#define TESSERA_COMMON_OPS_ACTIVATION_OPS_H_

#include "common/framework/op_registry.h"

namespace tessera {

absl::Status RegisterActivationOps(OpRegistry* registry);

}  // namespace tessera

#endif  // TESSERA_COMMON_OPS_ACTIVATION_OPS_H_
