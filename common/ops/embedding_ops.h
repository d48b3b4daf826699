// lookup_table with dense or sparse (SelectedRows) gradient.
#ifndef TESSERA_COMMON_OPS_EMBEDDING_OPS_H_
#define TESSERA_COMMON_OPS_EMBEDDING_OPS_H_

#include "common/framework/op_registry.h"

namespace tessera {

absl::Status RegisterEmbeddingOps(OpRegistry* registry);

}  // namespace tessera

#endif  // TESSERA_COMMON_OPS_EMBEDDING_OPS_H_
