#include "cluster/job_fields.h"

#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/layers/optimizer.h"
#include "common/layers/program_builder.h"
#include "common/framework/op_desc.h"
#include "common/framework/program_io.h"

namespace tessera {

namespace {

// The initial learning rate: the value of the startup op that fills the shared rate variable.
std::string LearningRate(const ModelSpec& model) {
  if (model.startup.blocks_size() == 0) return "none";
  for (const OpDesc& op : model.startup.blocks(0).ops()) {
    if (op.type() == "fill_constant" && OpOutput(op, "Out") == kLearningRateVar) {
      return absl::StrCat(GetFloatAttr(op, "value", 0.0));
    }
  }
  return "none";
}

}  // namespace

JobFields JobFieldsFor(const ClusterConfig& config, const ModelSpec& model) {
  const uint64_t model_hash =
      StableHash(absl::StrCat(ProgramToText(model.main), "\n#startup\n",
                              ProgramToText(model.startup)));
  JobFields fields = {
      {"trainers", absl::StrCat(config.trainers)},
      {"pservers", absl::StrJoin(config.pservers, ",")},
      {"mode", config.mode},
      {"sync_mode", config.sync_mode ? "true" : "false"},
      {"batch_size", absl::StrCat(config.batch_size)},
      {"epochs", absl::StrCat(config.epochs)},
      {"seed", absl::StrCat(config.seed)},
      {"learning_rate", LearningRate(model)},
      {"model", absl::StrCat(config.model.empty() ? config.example : "file", "#",
                             absl::Hex(model_hash, absl::kZeroPad16))},
      {"split_method", config.split_method},
      {"slice_var_up", config.slice_var_up ? "true" : "false"},
      {"min_block_size", absl::StrCat(config.min_block_size)},
      {"table_shard_method", config.table_shard_method},
      {"table_placement", config.table_placement},
      {"fuse_tables", config.fuse_tables ? "true" : "false"},
      {"heartbeat_s", absl::StrCat(config.heartbeat_s)},
  };
  if (config.reader != "memory") {  // the data order depends on these
    fields.push_back({"reader", config.reader});
    fields.push_back({"shuffle_buffer", absl::StrCat(config.shuffle_buffer)});
  }
  if (config.role == "trainer") {
    // Every trainer takes part in every evaluation round: they must agree on when. Pservers
    // lack these fields, so the trainers are compared with each other.
    fields.push_back({"eval_every_steps", absl::StrCat(config.eval_every_steps)});
    fields.push_back({"eval_every_epoch", config.eval_every_epoch ? "true" : "false"});
  }
  if (config.train_data.empty()) {
    fields.push_back({"example", config.example});
    fields.push_back({"num_examples", absl::StrCat(config.num_examples)});
  }
  return fields;
}

}  // namespace tessera
