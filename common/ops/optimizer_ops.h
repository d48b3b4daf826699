// sgd, momentum, adam, adagrad; dense and sparse (SelectedRows) gradients.
#ifndef TESSERA_COMMON_OPS_OPTIMIZER_OPS_H_
#define TESSERA_COMMON_OPS_OPTIMIZER_OPS_H_

#include "common/framework/op_registry.h"

namespace tessera {

absl::Status RegisterOptimizerOps(OpRegistry* registry);

}  // namespace tessera

#endif  // TESSERA_COMMON_OPS_OPTIMIZER_OPS_H_
