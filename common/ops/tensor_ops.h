// concat, split, reshape, cast.
#ifndef TESSERA_COMMON_OPS_TENSOR_OPS_H_
#define TESSERA_COMMON_OPS_TENSOR_OPS_H_

#include "common/framework/op_registry.h"

namespace tessera {

absl::Status RegisterTensorOps(OpRegistry* registry);

}  // namespace tessera

#endif  // TESSERA_COMMON_OPS_TENSOR_OPS_H_
