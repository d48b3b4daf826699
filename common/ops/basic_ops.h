// fill_constant, fill_zeros_like, assign, scale, sum.
#ifndef TESSERA_COMMON_OPS_BASIC_OPS_H_
#define TESSERA_COMMON_OPS_BASIC_OPS_H_

#include "common/framework/op_registry.h"

namespace tessera {

absl::Status RegisterBasicOps(OpRegistry* registry);

}  // namespace tessera

#endif  // TESSERA_COMMON_OPS_BASIC_OPS_H_
