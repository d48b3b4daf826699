// Ops the distribute transpiler emits that need no RPC: split_selected_rows.
#ifndef TESSERA_COMMON_OPS_DIST_OPS_H_
#define TESSERA_COMMON_OPS_DIST_OPS_H_

#include "common/framework/op_registry.h"

namespace tessera {

absl::Status RegisterDistOps(OpRegistry* registry);

}  // namespace tessera

#endif  // TESSERA_COMMON_OPS_DIST_OPS_H_
