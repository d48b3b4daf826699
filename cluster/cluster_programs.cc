#include "cluster/cluster_programs.h"

#include "common/program_io.h"
#include "common/status.h"

namespace tessera {

examples::ExampleOptions ExampleOptionsFor(const ClusterConfig& config) {
  examples::ExampleOptions o;
  o.name = config.example;
  o.learning_rate = config.learning_rate;
  o.vocab_per_slot = config.vocab_per_slot;
  o.distributed_tables = config.distributed_tables;
  o.seed = config.seed;
  o.num_examples = config.num_examples;
  o.num_test_examples = config.num_test_examples;
  o.train_data = config.train_data;
  o.max_line_bytes = config.max_line_bytes;
  o.test_data = config.test_data;
  return o;
}

absl::StatusOr<ModelSpec> LoadModel(const ClusterConfig& config, const OpRegistry& registry) {
  TS_ASSIGN_OR_RETURN(ModelSpec model,
                      examples::BuildExampleModel(registry, ExampleOptionsFor(config)));
  if (!config.program.empty()) {
    TS_ASSIGN_OR_RETURN(model.main, ReadProgramFile(config.program));
    TS_ASSIGN_OR_RETURN(model.startup, ReadProgramFile(config.startup_program));
  }
  return model;
}

TranspilerConfig TranspilerConfigFor(const ClusterConfig& config, int trainer_id) {
  TranspilerConfig t;
  t.trainer_id = trainer_id;
  t.pservers = config.pservers;
  t.trainers = config.trainers;
  t.sync_mode = config.sync_mode;
  t.split_method =
      config.split_method == "hash_name" ? SplitMethod::kHashName : SplitMethod::kRoundRobin;
  t.slice_var_up = config.slice_var_up;
  t.min_block_size = config.min_block_size;
  t.table_shard_method = config.table_shard_method;
  return t;
}

absl::StatusOr<DistributeTranspiler> TranspileFor(const ClusterConfig& config,
                                                  const OpRegistry& registry, int trainer_id) {
  TS_ASSIGN_OR_RETURN(ModelSpec model, LoadModel(config, registry));
  return DistributeTranspiler::Transpile(model.main, model.startup,
                                         TranspilerConfigFor(config, trainer_id));
}

}  // namespace tessera
