// The single-machine program a daemon starts from (a model file, a built-in example's model
// file, or program files) and its transpilation for this cluster. Shared by the pserver and trainer daemons and the
// tessera_transpile tool so that all of them derive exactly the same programs.
#ifndef TESSERA_CLUSTER_CLUSTER_PROGRAMS_H_
#define TESSERA_CLUSTER_CLUSTER_PROGRAMS_H_

#include "absl/status/statusor.h"
#include "common/config/cluster_config.h"
#include "common/framework/op_registry.h"
#include "transpiler/distribute_transpiler.h"
#include "common/framework/model_spec.h"

namespace tessera {

// The model: --model's file, else the built-in --example's, with --learning_rate (and, for the
// built-in ctr, --distributed_tables) applied, compiled (validated, backward and optimizer ops
// appended); main/startup then replaced by --program/--startup_program if given.
absl::StatusOr<ModelSpec> LoadModel(const ClusterConfig& config, const OpRegistry& registry);
TranspilerConfig TranspilerConfigFor(const ClusterConfig& config, int trainer_id);
absl::StatusOr<DistributeTranspiler> TranspileFor(const ClusterConfig& config,
                                                  const OpRegistry& registry, int trainer_id);

}  // namespace tessera

#endif  // TESSERA_CLUSTER_CLUSTER_PROGRAMS_H_
