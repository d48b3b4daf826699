// The job handshake's fields (README "How training runs"): everything about a job that all of its
// processes must agree on, as (name, value) strings a trainer sends to every pserver before step
// 0 (PServerClient::RegisterAsync) and a pserver compares with its own (ParameterServer). Both
// daemons derive them from their own flags and compiled model with the same function, so the
// two sides of a mismatch are named in the same words, e.g. "learning_rate=0.002".
#ifndef TESSERA_CLUSTER_JOB_FIELDS_H_
#define TESSERA_CLUSTER_JOB_FIELDS_H_

#include <cstdint>

#include "common/config/cluster_config.h"
#include "common/framework/model_spec.h"
#include "common/rpc/rpc.h"

namespace tessera {

// Fields both daemons know: trainers, pservers (in order), mode, sync_mode, batch_size, epochs,
// seed, learning_rate (the compiled model's, after --learning_rate), model (a hash of the
// compiled single-machine programs: the model file or example, its optimizer and schedule),
// split_method, slice_var_up, min_block_size, table_shard_method, table_placement, fuse_tables, and
// the synthetic data's example and num_examples (without --train_data).
JobFields JobFieldsFor(const ClusterConfig& config, const ModelSpec& model);

// The field only trainers know, added to a trainer's fields: its steps per epoch.
inline constexpr char kStepsPerEpochField[] = "steps_per_epoch";

}  // namespace tessera

#endif  // TESSERA_CLUSTER_JOB_FIELDS_H_
