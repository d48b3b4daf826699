// The in-process parameter-server harness (trainers as threads, pservers as objects, in-process
// RPC) shared by tests that compare distributed training with a reference: a small model with a
// sliced dense layer and a sparse embedding, its deterministic batches, and a sync job running a
// range of steps on it.
#ifndef TESSERA_TESTS_INPROC_CLUSTER_H_
#define TESSERA_TESTS_INPROC_CLUSTER_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "common/framework/op_registry.h"
#include "common/framework/scope.h"
#include "common/framework/tensor.h"
#include "pserver/parameter_server.h"
#include "proto/program.pb.h"
#include "transpiler/distribute_transpiler.h"

namespace tessera {

constexpr int kInprocFeatures = 20;  // columns of "x"

struct InprocModelOptions {
  int vocab = 1000;  // rows of the embedding "emb"
  int emb_dim = 16;
  bool distributed_table = false;  // "emb" lives only on the pservers
  // > 0: a second table "wide" of this width, looked up with the same ids (distributed like
  // "emb"; the two form a table group with fuse_tables), its rows concatenated too.
  int wide_dim = 0;
  std::string optimizer = "sgd";   // "sgd", "adam" or "adagrad"
  float learning_rate = 0.01f;
  // An exponentially decaying learning rate: it runs in its own block on the pservers.
  int64_t decay_steps = 2;
  float decay_rate = 0.5f;
};

struct InprocModel {
  ProgramDesc main, startup;
  std::string loss;
};

// x [-1, 20] -> fc 512 relu "hidden" (10240 weights: sliced) -> concat with a sparse embedding
// "emb" of ids (SelectedRows gradient) -> fc 1 "out" -> mean square error, minimized by the
// options' optimizer.
InprocModel BuildInprocModel(const OpRegistry& registry, const InprocModelOptions& options);

// Rows [begin, end) of the global batch for `step` into "x", "ids" (in [0, id_range)) and "y".
void FeedInprocBatch(Scope* scope, int step, int begin, int end, int id_range);

struct InprocJobOptions {
  int trainers = 2;
  int pservers = 2;  // endpoints "ps0:0", "ps1:0", ...
  SplitMethod split = SplitMethod::kRoundRobin;
  bool slice = true;
  TablePlacement table_placement = TablePlacement::kRowWise;
  bool fuse_tables = false;
  int batch = 12;  // the global batch, split evenly among the trainers
  int first_step = 0;
  int last_step = 4;  // steps [first_step, last_step) run
  int id_range = 50;  // see FeedInprocBatch
  // A checkpoint directory every pserver restores before training ("": none).
  std::string restore_from;
  // Trainers send NotifyComplete after their last step and every pserver is waited for.
  bool notify_complete = true;
};

// A finished job: its pservers (with their scopes and op registry) are kept for inspection,
// checkpoints or prefetches.
struct InprocJob {
  std::unique_ptr<OpRegistry> registry;
  InprocModel model;
  std::vector<std::string> endpoints;
  TranspilerConfig config;
  std::vector<std::unique_ptr<Scope>> ps_scopes;
  std::vector<std::unique_ptr<ParameterServer>> servers;
};

// Runs a sync job; `on_trainer_done(k, model, scope)` runs on trainer k's thread after its last
// step (failures are reported through gtest).
std::unique_ptr<InprocJob> RunInprocJob(
    const InprocModelOptions& model_options, const InprocJobOptions& options,
    const std::function<void(int trainer, const InprocModel& model, const Scope& scope)>&
        on_trainer_done);

// The rows of distributed table `table` ([0, vocab) x dim) held by the job's pservers (ids
// sharded by hash, or the whole table on one with table-wise placement), prefetched at `step`;
// ids no pserver returned are absent.
std::map<int64_t, std::vector<float>> GatherTableRows(const InprocJob& job,
                                                      const std::string& table, int vocab,
                                                      int dim, int64_t step);

// max |got - want| / max(floor, |want|) over the elements of two float32 tensors of one shape.
double WorstRelativeError(const Tensor& got, const Tensor& want, double floor);

}  // namespace tessera

#endif  // TESSERA_TESTS_INPROC_CLUSTER_H_
