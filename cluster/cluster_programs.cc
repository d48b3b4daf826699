#include "cluster/cluster_programs.h"

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "cluster/builtin_models.h"
#include "common/layers/model_file.h"
#include "common/framework/op_desc.h"
#include "common/framework/program_io.h"
#include "common/base/status.h"

namespace tessera {

namespace {

// A transpiled trainer or pserver program (tessera_transpile's output) cannot be transpiled
// again: it has RPC or collective ops, and its optimizer ops went to the pservers.
absl::Status CheckSingleMachineProgram(const ProgramDesc& program, const std::string& path) {
  for (const BlockDesc& block : program.blocks()) {
    for (int i = 0; i < block.ops_size(); ++i) {
      const OpDesc& op = block.ops(i);
      if ((OpRoleOf(op) & (kRoleRPC | kRoleDist)) != 0 || absl::StartsWith(op.type(), "c_")) {
        return absl::InvalidArgumentError(absl::StrCat(
            "--program ", path, " is a transpiled trainer or pserver program (op ", i, " is ",
            op.type(), "); --program takes a single-machine program (tessera_program --out), "
            "--model a model file"));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<ModelSpec> LoadModel(const ClusterConfig& config, const OpRegistry& registry) {
  ModelFile file;
  std::string source = config.model;
  ModelOverrides overrides;
  overrides.learning_rate = config.learning_rate;
  if (!config.model.empty()) {
    TS_ASSIGN_OR_RETURN(file, ReadModelFile(config.model));
  } else {
    TS_ASSIGN_OR_RETURN(file, BuiltinModelFile(config.example));
    source = absl::StrCat("built-in ", config.example);
    overrides.distributed_tables = config.example == "ctr" && config.distributed_tables;
  }
  TS_ASSIGN_OR_RETURN(ModelSpec model,
                      CompileModel(ApplyOverrides(std::move(file), overrides), registry, source));
  if (!config.program.empty()) {
    TS_ASSIGN_OR_RETURN(model.main, ReadProgramFile(config.program));
    TS_RETURN_IF_ERROR(CheckSingleMachineProgram(model.main, config.program));
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
  t.table_placement = config.table_placement == "table_wise" ? TablePlacement::kTableWise
                                                             : TablePlacement::kRowWise;
  t.fuse_tables = config.fuse_tables;
  t.hybrid = config.mode == "hybrid";
  return t;
}

absl::StatusOr<DistributeTranspiler> TranspileFor(const ClusterConfig& config,
                                                  const OpRegistry& registry, int trainer_id) {
  TS_ASSIGN_OR_RETURN(ModelSpec model, LoadModel(config, registry));
  return DistributeTranspiler::Transpile(model.main, model.startup,
                                         TranspilerConfigFor(config, trainer_id));
}

}  // namespace tessera
