// Ops on batches of sequences (a tensor's level-1 LoD, Tensor::lod()): sequence_pool, which
// pools each sequence of a multi-hot slot's embeddings into one row.
#ifndef TESSERA_COMMON_OPS_SEQUENCE_OPS_H_
#define TESSERA_COMMON_OPS_SEQUENCE_OPS_H_

#include "common/framework/op_registry.h"

namespace tessera {

absl::Status RegisterSequenceOps(OpRegistry* registry);

}  // namespace tessera

#endif  // TESSERA_COMMON_OPS_SEQUENCE_OPS_H_
