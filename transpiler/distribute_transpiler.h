// DistributeTranspiler: splits a single-machine program (forward + backward + optimize ops) into
// a trainer program and one pserver program per endpoint (Fluid's DistributeTranspiler).
//
// Slicing: a parameter (and its gradient and optimizer state) of at least min_block_size
// elements is cut along dim 0 into min(#pservers, numel / min_block_size) blocks of whole rows;
// smaller ones stay whole. A variable with a single block keeps its name; blocks are named
// "<var>.block<i>". Blocks are placed by round robin (one counter across all parameter blocks,
// in parameter order), by a stable hash of the block name, or by a user dispatcher; a gradient
// block always goes where its parameter block goes.
//
// Hybrid mode (TranspilerConfig::hybrid): the same for the distributed tables only; the other
// parameters stay on the trainers and are all-reduced among them.
//
// Trainer program: forward + backward, then split -> send -> recv -> concat; in sync mode the
// send carries the send barrier (attr barrier_endpoints) and the recv the fetch barrier (attr
// fetch_barrier_endpoints), so each pserver gets one request for each. Pserver program: block 0
// holds one listen_and_serv op whose attributes describe the service (endpoint, Fanin, sync_mode,
// optimize_blocks, grad_to_block_id); each optimize block sums the trainers' gradients, scales by
// 1/N (sync) and runs the optimizer on its slice. Pserver startup initializes each slice so that it
// equals the same rows of the single-machine initialization (counter-based random ops, `offset`
// attribute). Distributed tables (embedding with is_distributed): the table never exists on a
// trainer. Its lookup_table becomes `prefetch` (dedupe ids, one request per pserver for all tables,
// rows gathered back in input order), its lookup_table_grad becomes `lookup_sparse_grad`
// (SelectedRows of the ids), and the gradient is split by owning shard (`split_by_shard`,
// duplicates merged) and sent. Each pserver's program gets one `sparse_table` op per table shard
// it holds in block 0 (initializer, optimizer and hyper-parameters, learning-rate variable).
//
// Table placement (TranspilerConfig::table_placement). Row-wise (the default): every table is
// split by id over all pservers (shard k of #pservers on pserver k), so a table may outgrow any
// one machine. Table-wise: each table lives whole on one pserver (one shard of one), so that a
// pserver serves a trainer step's lookups and updates of fewer tables; tables looked up with the
// same ids (a slot's deep and wide tables) go together, and the groups are placed largest first
// (by the sum of their tables' widths) on the pserver holding the fewest columns so far (ties:
// the lowest index). For many moderate tables; a table that needs several machines wants
// row-wise.
// Table groups (TranspilerConfig::fuse_tables). Tables that are always looked up and updated
// together, with the same ids (a slot's deep and wide tables), are held as one pserver table of
// their summed width, named "<a>+<b>": one lookup of the group's rows feeds a `split` (by columns)
// into each table's output, the tables' output gradients are concatenated by columns into the
// group's, and the group's gradient rows travel as one. Tables group when each has exactly one
// lookup_table and one lookup_table_grad, all with the same Ids variable, the same optimizer
// (type and attributes) and learning rate, and nothing but its optimize op reads its gradient.
// The pserver program describes each member by its own `sparse_table` op (its initializer;
// attribute `group` names the group), so checkpoints and serving exports stay one file per table
// and a member's values and updates are exactly those of the table held alone.
// The transpiler is pure: the same inputs give byte-identical outputs.
#ifndef TESSERA_TRANSPILER_DISTRIBUTE_TRANSPILER_H_
#define TESSERA_TRANSPILER_DISTRIBUTE_TRANSPILER_H_

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/program.pb.h"

namespace tessera {

enum class SplitMethod { kRoundRobin, kHashName };

// Parses "round_robin" / "hash_name".
absl::StatusOr<SplitMethod> ParseSplitMethod(const std::string& s);

enum class TablePlacement { kRowWise, kTableWise };

// Parses "row_wise" / "table_wise".
absl::StatusOr<TablePlacement> ParseTablePlacement(const std::string& s);

struct TranspilerConfig {
  int trainer_id = 0;
  std::vector<std::string> pservers;  // endpoints host:port
  int trainers = 1;
  bool sync_mode = true;
  SplitMethod split_method = SplitMethod::kRoundRobin;
  // If set, overrides split_method: (block name, block index in dispatch order, #pservers) ->
  // pserver index.
  std::function<int(const std::string&, int, int)> dispatcher;
  bool slice_var_up = true;
  int64_t min_block_size = 8192;
  // Row-wise distributed tables: which pserver owns an id ("hash" of the id, or "mod": id mod
  // #pservers).
  std::string table_shard_method = "hash";
  // Distributed tables: split by id over all pservers, or each whole on one (class comment).
  TablePlacement table_placement = TablePlacement::kRowWise;
  // Distributed tables looked up with the same ids held as one table (class comment).
  bool fuse_tables = false;
  // Hybrid mode (PERSIA / HugeCTR style): only the distributed tables go to the pservers. Every
  // other parameter stays on the trainers with its optimizer (and the learning-rate schedule):
  // the trainer program all-reduces (mean) those gradients right before the optimizer ops
  // (c_allreduce_mean, as in collective mode), and its startup joins the trainers' job
  // (c_comm_init) and takes trainer 0's initial values (c_broadcast). Needs sync_mode and at
  // least one distributed table.
  bool hybrid = false;
  // Hybrid: overlap the all-reduce with backward (as TranspileCollective's overlap_allreduce).
  bool overlap_allreduce = false;
};

// One slice of a variable.
struct VarBlock {
  std::string var;   // original variable
  std::string name;  // block variable name (== var when unsliced)
  int index = 0;     // block index within the variable
  int64_t begin_row = 0;
  int64_t num_rows = 0;
  int64_t row_width = 1;  // elements per row
  std::vector<int64_t> shape;  // block shape
  std::string endpoint;
};

// Row blocks of a variable of `shape` (see the class comment).
std::vector<VarBlock> SliceVariable(const std::string& var, const std::vector<int64_t>& shape,
                                    int num_pservers, bool slice_var_up, int64_t min_block_size);

class DistributeTranspiler {
 public:
  // Fails (InvalidArgument) on a bad config or a program without optimize ops.
  static absl::StatusOr<DistributeTranspiler> Transpile(const ProgramDesc& main,
                                                        const ProgramDesc& startup,
                                                        const TranspilerConfig& config);

  const ProgramDesc& trainer_program() const { return trainer_; }
  const ProgramDesc& trainer_startup_program() const { return trainer_startup_; }
  // NotFound for an endpoint that is not one of the config's pservers.
  absl::StatusOr<ProgramDesc> GetPserverProgram(const std::string& endpoint) const;
  absl::StatusOr<ProgramDesc> GetPserverStartupProgram(const std::string& endpoint) const;

  // Parameter blocks in dispatch order (with their endpoints).
  const std::vector<VarBlock>& param_blocks() const { return param_blocks_; }

 private:
  DistributeTranspiler() = default;

  TranspilerConfig config_;
  ProgramDesc trainer_, trainer_startup_;
  std::map<std::string, ProgramDesc> pserver_, pserver_startup_;
  std::vector<VarBlock> param_blocks_;
};

// Collective mode (no pservers): the trainer program all-reduces (mean) every gradient right
// before the optimizer ops (c_allreduce_mean; sparse gradients are made dense), and the trainer
// startup joins the job (c_comm_init) and takes trainer 0's initial parameters (c_broadcast).
// With overlap_allreduce (DDP's bucketed reducer), each gradient is handed to the trainer's
// coalescing reducer (c_allreduce_start) right after the op that last writes it, so that its
// bucket is reduced while backward goes on, and c_allreduce_wait before the optimizer ops
// waits for all of them; the result is the same mean.
struct CollectivePrograms {
  ProgramDesc trainer, trainer_startup;
};
absl::StatusOr<CollectivePrograms> TranspileCollective(const ProgramDesc& main,
                                                       const ProgramDesc& startup,
                                                       bool overlap_allreduce = false);

// Name of trainer k's copy of a gradient block on the pserver ("w@GRAD.block0.trainer_1").
std::string TrainerGradName(const std::string& grad_block, int trainer_id);

}  // namespace tessera

#endif  // TESSERA_TRANSPILER_DISTRIBUTE_TRANSPILER_H_
