#include "common/ops/embedding_ops.h"

#include "common/ops/kernel_util.h"

namespace tessera {

absl::Status RegisterEmbeddingOps(OpRegistry* registry) { return absl::OkStatus(); }

}  // namespace tessera
