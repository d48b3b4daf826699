// mul, matmul, elementwise_add/sub/mul (with broadcasting of Y along axis), reduce_sum/mean.
#ifndef TESSERA_COMMON_OPS_MATH_OPS_H_
#define TESSERA_COMMON_OPS_MATH_OPS_H_

#include "common/framework/op_registry.h"

namespace tessera {

absl::Status RegisterMathOps(OpRegistry* registry);

}  // namespace tessera

#endif  // TESSERA_COMMON_OPS_MATH_OPS_H_
