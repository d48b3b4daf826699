#include "common/ops/optimizer_ops.h"

#include "common/ops/kernel_util.h"

namespace tessera {

absl::Status RegisterOptimizerOps(OpRegistry* registry) { return absl::OkStatus(); }

}  // namespace tessera
