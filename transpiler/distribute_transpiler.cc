#include "transpiler/distribute_transpiler.h"

#include <algorithm>
#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/status.h"
#include "common/framework/op_desc.h"
#include "common/framework/tensor.h"
#include "common/layers/optimizer.h"
#include "common/layers/program_builder.h"
#include "common/ops/sharding.h"

namespace tessera {

namespace {

// Inserts the trainers' all-reduce (mean) of `grads` into `tb` (collective and hybrid modes):
// one c_allreduce_mean right before the first optimize op. With `overlap`, a c_allreduce_start
// right after the op that last writes each gradient instead (its bucket is reduced while the
// rest of backward runs) and one c_allreduce_wait before the first optimize op; a gradient no
// op writes keeps the single c_allreduce_mean. The gradients become dense variables (the
// all-reduce makes sparse ones dense).
void InsertGradientAllReduce(BlockDesc* tb, const std::vector<std::string>& grads,
                             bool overlap) {
  if (grads.empty()) return;
  for (const auto& g : grads) {
    if (VarDesc* gv = FindMutableVarDesc(tb, g)) gv->set_type(DENSE_TENSOR);
  }
  auto is_optimize = [](const OpDesc& op) {
    return (OpRoleOf(op) & kRoleOptimize) != 0 && (OpRoleOf(op) & kRoleLRSched) == 0;
  };
  int first_optimize = tb->ops_size();
  for (int i = 0; i < tb->ops_size(); ++i) {
    if (is_optimize(tb->ops(i))) {
      first_optimize = i;
      break;
    }
  }
  std::map<int, std::vector<std::string>> starts;  // op index -> gradients it last writes
  if (overlap) {
    for (const std::string& g : grads) {
      int last = -1;
      for (int i = 0; i < first_optimize; ++i) {
        for (const auto& out : AllOutputArgs(tb->ops(i))) {
          if (out == g) last = i;
        }
      }
      if (last < 0) {
        overlap = false;
        break;
      }
      starts[last].push_back(g);
    }
  }
  auto op = [](const char* type, const std::vector<std::string>& vars) {
    OpDesc o = MakeOp(type, {{"X", vars}}, {{"Out", vars}});
    SetAttr(&o, kOpRoleAttr, int64_t{kRoleBackward | kRoleDist});
    return o;
  };
  google::protobuf::RepeatedPtrField<OpDesc> ops;
  for (int i = 0; i <= tb->ops_size(); ++i) {
    if (i == first_optimize) {
      *ops.Add() = op(overlap ? "c_allreduce_wait" : "c_allreduce_mean", grads);
    }
    if (i == tb->ops_size()) break;
    *ops.Add() = tb->ops(i);
    if (!overlap) continue;
    auto it = starts.find(i);
    if (it == starts.end()) continue;
    for (const std::string& g : it->second) *ops.Add() = op("c_allreduce_start", {g});
  }
  tb->mutable_ops()->Swap(&ops);
}

// Appends to a trainer startup block the trainers' rendezvous (c_comm_init) and the broadcast of
// trainer 0's values of `params` (c_broadcast; none when there are none).
void JoinTrainers(BlockDesc* startup, const std::vector<std::string>& params) {
  OpDesc comm = MakeOp("c_comm_init", {}, {});
  SetAttr(&comm, kOpRoleAttr, int64_t{kRoleDist});
  *startup->add_ops() = comm;
  if (params.empty()) return;
  OpDesc bcast = MakeOp("c_broadcast", {{"X", params}}, {{"Out", params}});
  SetAttr(&bcast, kOpRoleAttr, int64_t{kRoleDist});
  *startup->add_ops() = bcast;
}

// An optimize-role op that is no parameter's update: gradient clipping by global norm, which each
// trainer runs on its own gradients before they are pushed (the pservers hold blocks of the
// parameters, so none of them could compute the norm of all gradients).
bool StaysOnTrainer(const OpDesc& op) { return op.type() == kClipByGlobalNormOp; }

// One optimize op of the single-machine program and the slicing of everything it touches.
struct OptimizeItem {
  OpDesc op;
  std::string param, grad, lr;
  bool sparse_grad = false;
  std::vector<VarBlock> param_blocks, grad_blocks;
  // State variable -> its per-block names (sliced like the param, or copied per block).
  std::map<std::string, std::vector<VarBlock>> state_blocks;
};

// A distributed table and its optimize op.
struct TableItem {
  std::string table, grad, lr;
  OpDesc opt;
  int64_t dim = 0;
  // PlaceTables: the pserver holding the whole table (table-wise), or -1: its rows are split
  // over all pservers (row-wise).
  int owner = -1;

  // Its shards: one per pserver, or the one whole table.
  int Shards(int num_ps) const { return owner < 0 ? num_ps : 1; }
  // Which pserver holds shard k.
  int PserverOf(int k) const { return owner < 0 ? k : owner; }
  // The shard pserver `ps` holds, or -1 for none.
  int ShardOn(int ps) const { return owner < 0 ? ps : (owner == ps ? 0 : -1); }
  // The gradient rows sent for shard k.
  std::string GradShard(int k) const { return absl::StrCat(grad, ".shard", k); }

  // A group of tables held as one (FuseTables): each member's table, gradient, optimize op and
  // width, in column order; empty for a table of its own.
  struct Member {
    std::string table, grad;
    OpDesc opt;
    int64_t dim = 0;
  };
  std::vector<Member> members;
};

Shape VarShape(const BlockDesc& block, const std::string& name) {
  const VarDesc* v = FindVarDesc(block, name);
  return v == nullptr ? Shape{} : Shape(v->shape().begin(), v->shape().end());
}

std::string BlockName(const std::string& var, int index, int count) {
  return count == 1 ? var : absl::StrCat(var, ".block", index);
}

// `blocks` of `like` renamed for `var` (same rows), or whole copies of `var` when its shape
// differs from the parameter's (e.g. Adam's [1] beta powers: one per block).
std::vector<VarBlock> BlocksFor(const std::string& var, const Shape& var_shape,
                                const Shape& param_shape, const std::vector<VarBlock>& like) {
  std::vector<VarBlock> out = like;
  for (auto& b : out) {
    b.var = var;
    b.name = BlockName(var, b.index, static_cast<int>(like.size()));
    if (var_shape != param_shape) {
      b.shape = var_shape;
      b.begin_row = 0;
      b.num_rows = var_shape.empty() ? 1 : var_shape[0];
      b.row_width = 0;  // marks a whole copy: no row offset
    }
  }
  return out;
}

void DeclareLike(BlockDesc* dst, const BlockDesc& src, const VarBlock& b, bool persistable) {
  const VarDesc* orig = FindVarDesc(src, b.var);
  VarDesc* v = DeclareVar(dst, b.name, b.shape, orig != nullptr ? orig->dtype() : FLOAT32);
  if (orig != nullptr) v->set_type(orig->type());
  v->set_persistable(persistable);
}

OpDesc RoleOp(OpDesc op, int64_t role) {
  SetAttr(&op, kOpRoleAttr, role);
  return op;
}

// The startup op that initializes `b` (from the op that initialized b.var), or nullopt.
bool InitOpFor(const ProgramDesc& startup, const VarBlock& b, OpDesc* out) {
  for (const auto& op : startup.blocks(0).ops()) {
    bool writes = false;
    for (const auto& a : AllOutputArgs(op)) writes |= (a == b.var);
    if (!writes) continue;
    *out = op;
    RenameOpOutput(out, b.var, b.name);
    if (FindAttr(op, "shape") != nullptr) SetAttr(out, "shape", b.shape);
    if (b.row_width > 0 && (op.type() == "uniform_random" || op.type() == "gaussian_random")) {
      SetAttr(out, "offset", GetIntAttr(op, "offset", 0) + b.begin_row * b.row_width);
    }
    return true;
  }
  return false;
}

}  // namespace

absl::StatusOr<SplitMethod> ParseSplitMethod(const std::string& s) {
  if (s == "round_robin" || s == "RoundRobin") return SplitMethod::kRoundRobin;
  if (s == "hash_name" || s == "HashName") return SplitMethod::kHashName;
  return absl::InvalidArgumentError(
      absl::StrCat("split_method '", s, "' is not one of round_robin, hash_name"));
}

absl::StatusOr<TablePlacement> ParseTablePlacement(const std::string& s) {
  if (s == "row_wise") return TablePlacement::kRowWise;
  if (s == "table_wise") return TablePlacement::kTableWise;
  return absl::InvalidArgumentError(
      absl::StrCat("table_placement '", s, "' is not one of row_wise, table_wise"));
}

std::string TrainerGradName(const std::string& grad_block, int trainer_id) {
  return absl::StrCat(grad_block, ".trainer_", trainer_id);
}

std::vector<VarBlock> SliceVariable(const std::string& var, const std::vector<int64_t>& shape,
                                    int num_pservers, bool slice_var_up, int64_t min_block_size) {
  int64_t numel = NumElements(shape);
  int64_t dim0 = shape.empty() ? 1 : shape[0];
  int64_t width = dim0 == 0 ? 0 : numel / dim0;
  int64_t count = 1;
  if (slice_var_up && numel >= min_block_size && dim0 > 1) {
    count = std::min<int64_t>(num_pservers, numel / min_block_size);
    count = std::max<int64_t>(1, std::min(count, dim0));
  }
  int64_t rows_per_block = (dim0 + count - 1) / count;
  count = rows_per_block == 0 ? 1 : (dim0 + rows_per_block - 1) / rows_per_block;
  std::vector<VarBlock> blocks;
  for (int64_t i = 0; i < count; ++i) {
    VarBlock b;
    b.var = var;
    b.index = static_cast<int>(i);
    b.name = BlockName(var, b.index, static_cast<int>(count));
    b.begin_row = i * rows_per_block;
    b.num_rows = std::min(rows_per_block, dim0 - b.begin_row);
    b.row_width = width;
    b.shape = shape;
    if (!b.shape.empty()) b.shape[0] = b.num_rows;
    blocks.push_back(b);
  }
  return blocks;
}

namespace {

// ---- The passes of DistributeTranspiler::Transpile, in the order it runs them. Each reads the
// fields of TranspileState that earlier passes wrote and writes the ones under its own name.

// What the passes share: the inputs, then each pass's results.
struct TranspileState {
  TranspileState(const ProgramDesc& main, const ProgramDesc& startup,
                 const TranspilerConfig& config)
      : main(main),
        startup(startup),
        config(config),
        block(main.blocks(0)),
        num_ps(static_cast<int>(config.pservers.size())) {}

  const ProgramDesc& main;
  const ProgramDesc& startup;
  const TranspilerConfig& config;
  const BlockDesc& block;  // main's block 0
  const int num_ps;

  // CollectOptimizeOps (SliceParameters and PlaceBlocks fill in the items' blocks).
  std::vector<OptimizeItem> items;  // the dense parameters the pservers update
  std::vector<TableItem> tables;
  // Hybrid: the dense parameters whose optimize ops stay on the trainers, and their gradients.
  std::set<std::string> local_params;
  std::vector<std::string> local_grads;
  // Learning-rate schedule ops (run on the pservers, once per step, before the optimizers).
  std::vector<OpDesc> lr_ops;

  // PlaceBlocks: the parameter blocks in dispatch order, with their endpoints.
  std::vector<VarBlock> param_blocks;

  // RewriteTrainerProgram.
  ProgramDesc trainer;
  std::vector<std::string> recv_vars, recv_eps;  // the parameter blocks pulled, and from where
  std::vector<OpDesc> concats;                   // the sliced parameters put back together
  std::set<std::string> pserver_only;            // variables only the pservers hold

  // BuildTrainerStartup.
  ProgramDesc trainer_startup;

  // BuildPserverPrograms: endpoint -> program, endpoint -> startup program.
  std::map<std::string, ProgramDesc> pserver, pserver_startup;
};

// The endpoints of table t's shards, in shard order.
std::vector<std::string> TableEndpoints(const TranspileState& s, const TableItem& t) {
  std::vector<std::string> eps;
  for (int k = 0; k < t.Shards(s.num_ps); ++k) eps.push_back(s.config.pservers[t.PserverOf(k)]);
  return eps;
}

// The optimizer-state inputs of an optimize op (every input but Param, Grad and LearningRate),
// in slot order.
std::vector<std::string> OptimizerStateVars(const OpDesc& opt) {
  std::vector<std::string> vars;
  for (const auto& slot : opt.inputs()) {
    if (slot.parameter() == "Param" || slot.parameter() == "Grad" ||
        slot.parameter() == "LearningRate") {
      continue;
    }
    for (const auto& var : slot.arguments()) vars.push_back(var);
  }
  return vars;
}

// Removes the variables named in `names` from `b`, keeping the order of the others.
void DropVars(BlockDesc* b, const std::set<std::string>& names) {
  google::protobuf::RepeatedPtrField<VarDesc> kept;
  for (const auto& v : b->vars()) {
    if (names.count(v.name()) == 0) *kept.Add() = v;
  }
  b->mutable_vars()->Swap(&kept);
}

// Appends a block to `prog` (its index is its position) with parent `parent_idx`.
BlockDesc* AddBlock(ProgramDesc* prog, int parent_idx) {
  BlockDesc* b = prog->add_blocks();
  b->set_idx(prog->blocks_size() - 1);
  b->set_parent_idx(parent_idx);
  return b;
}

// Pass 0. Reads the config and the programs' block counts. Fails (InvalidArgument) on a bad
// config value or a program without a block 0; writes nothing.
absl::Status ValidateConfig(const ProgramDesc& main, const ProgramDesc& startup,
                            const TranspilerConfig& config) {
  if (config.pservers.empty()) return absl::InvalidArgumentError("no pserver endpoints given");
  std::set<std::string> unique(config.pservers.begin(), config.pservers.end());
  if (unique.size() != config.pservers.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("pserver endpoints repeat: ", absl::StrJoin(config.pservers, ",")));
  }
  if (config.trainers < 1) {
    return absl::InvalidArgumentError(absl::StrCat("trainers=", config.trainers, " must be >= 1"));
  }
  if (config.trainer_id < 0 || config.trainer_id >= config.trainers) {
    return absl::InvalidArgumentError(
        absl::StrCat("trainer_id=", config.trainer_id, " is outside [0, ", config.trainers, ")"));
  }
  if (config.min_block_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("min_block_size=", config.min_block_size, " must be >= 1"));
  }
  if (main.blocks_size() == 0 || startup.blocks_size() == 0) {
    return absl::InvalidArgumentError("main and startup programs need a block 0");
  }
  if (config.hybrid && !config.sync_mode) {
    return absl::InvalidArgumentError(
        "hybrid mode trains in sync mode (its dense gradients are all-reduced every step)");
  }
  ShardMethod shard_method;
  if (!ParseShardMethod(config.table_shard_method, &shard_method)) {
    return absl::InvalidArgumentError(
        absl::StrCat("table_shard_method '", config.table_shard_method, "' is not hash or mod"));
  }
  return absl::OkStatus();
}

// Pass 1. Reads the main block's ops and variables. Writes items (op, param, grad, lr,
// sparse_grad; no blocks yet), tables, local_params and local_grads (hybrid) and lr_ops. Fails
// on an optimize op without op_role_var, an undeclared parameter, a table that is not 2-D, or
// when no optimize op is left for the pservers.
absl::Status CollectOptimizeOps(TranspileState* s) {
  const BlockDesc& block = s->block;
  for (const auto& op : block.ops()) {
    if ((OpRoleOf(op) & kRoleOptimize) == 0 || StaysOnTrainer(op)) continue;
    auto rv = GetStringsAttr(op, kOpRoleVarAttr);
    if (rv.size() < 2) {
      return absl::InvalidArgumentError(
          absl::StrCat("optimize op ", OpSignature(op), " has no op_role_var [param, grad]"));
    }
    OptimizeItem item;
    item.op = op;
    item.param = rv[0];
    item.grad = rv[1];
    item.lr = OpInput(op, "LearningRate");
    const VarDesc* gv = FindVarDesc(block, item.grad);
    item.sparse_grad = gv != nullptr && gv->type() == SELECTED_ROWS;
    const VarDesc* pv = FindVarDesc(block, item.param);
    if (pv == nullptr) {
      return absl::InvalidArgumentError(absl::StrCat("parameter ", item.param, " is not declared"));
    }
    if (pv->is_distributed()) {
      if (pv->shape_size() != 2) {
        return absl::InvalidArgumentError(absl::StrCat("distributed table ", item.param,
                                                       " must be 2-D [dict_size, dim], is ",
                                                       ShapeString(VarShape(block, item.param))));
      }
      s->tables.push_back({item.param, item.grad, item.lr, op, pv->shape(1)});
      continue;
    }
    if (s->config.hybrid) {
      s->local_params.insert(item.param);
      s->local_grads.push_back(item.grad);
      continue;
    }
    s->items.push_back(std::move(item));
  }
  if (s->items.empty() && s->tables.empty()) {
    return absl::InvalidArgumentError(
        s->config.hybrid
            ? "hybrid mode needs a distributed table (embedding is_distributed) for "
              "the pservers; without one use --mode=collective"
            : "the program has no optimize ops (build it with an optimizer's Minimize)");
  }
  for (const auto& op : block.ops()) {
    if ((OpRoleOf(op) & kRoleLRSched) != 0) s->lr_ops.push_back(op);
  }
  return absl::OkStatus();
}

// Pass 1b. Reads the config, tables and the main block. Replaces the tables of each group
// (the header's rule, two or more tables) by one TableItem named "<a>+<b>..." with their summed
// width and `members`, at the first member's place.
void FuseTables(TranspileState* s) {
  if (!s->config.fuse_tables) return;
  const BlockDesc& block = s->block;
  // Per table: its lookups' and their gradients' Ids, and how many ops read its gradient.
  struct Use {
    std::vector<std::string> ids, grad_ids;
    int lookup_at = -1;  // the lookup's op index
    int grad_readers = 0;
  };
  std::vector<Use> uses(s->tables.size());
  for (int i = 0; i < block.ops_size(); ++i) {
    const OpDesc& op = block.ops(i);
    const std::string w = OpInput(op, "W");
    const std::vector<std::string> ins = AllInputArgs(op);
    for (size_t t = 0; t < s->tables.size(); ++t) {
      if (w == s->tables[t].table && op.type() == "lookup_table") {
        uses[t].ids.push_back(OpInput(op, "Ids"));
        uses[t].lookup_at = i;
      } else if (w == s->tables[t].table && op.type() == "lookup_table_grad") {
        uses[t].grad_ids.push_back(OpInput(op, "Ids"));
      }
      uses[t].grad_readers +=
          static_cast<int>(std::count(ins.begin(), ins.end(), s->tables[t].grad));
    }
  }
  // What members must share: the Ids, the optimizer with its attributes, the learning rate.
  auto key_of = [&](size_t t) -> std::string {
    const TableItem& item = s->tables[t];
    const Use& u = uses[t];
    if (u.ids.size() != 1 || u.grad_ids != u.ids || u.grad_readers != 1) return "";
    std::string key = absl::StrCat(u.ids[0], "|", item.opt.type(), "|", item.lr);
    std::vector<std::string> attrs;
    for (const auto& a : item.opt.attrs()) {
      if (a.name() != kOpRoleAttr && a.name() != kOpRoleVarAttr) {
        attrs.push_back(a.SerializeAsString());
      }
    }
    std::sort(attrs.begin(), attrs.end());
    for (const auto& a : attrs) absl::StrAppend(&key, "|", a.size(), ":", a);
    return key;
  };
  std::vector<std::string> keys(s->tables.size());
  for (size_t t = 0; t < s->tables.size(); ++t) keys[t] = key_of(t);
  std::vector<TableItem> fused;
  std::vector<bool> taken(s->tables.size(), false);
  for (size_t t = 0; t < s->tables.size(); ++t) {
    if (taken[t]) continue;
    std::vector<size_t> group = {t};
    for (size_t u = t + 1; u < s->tables.size() && !keys[t].empty(); ++u) {
      if (!taken[u] && keys[u] == keys[t]) group.push_back(u);
    }
    // The group is looked up at its first member's lookup: not if an op between the members'
    // lookups writes their ids.
    int first = block.ops_size(), last = -1;
    for (size_t u : group) {
      first = std::min(first, uses[u].lookup_at);
      last = std::max(last, uses[u].lookup_at);
    }
    for (int i = first + 1; group.size() > 1 && i < last; ++i) {
      for (const auto& out : AllOutputArgs(block.ops(i))) {
        if (out == uses[t].ids[0]) group.resize(1);
      }
    }
    if (group.size() < 2) {
      fused.push_back(s->tables[t]);
      continue;
    }
    TableItem g = s->tables[t];
    std::vector<std::string> names;
    g.dim = 0;
    for (size_t u : group) {
      const TableItem& m = s->tables[u];
      taken[u] = true;
      names.push_back(m.table);
      g.members.push_back({m.table, m.grad, m.opt, m.dim});
      g.dim += m.dim;
    }
    g.table = absl::StrJoin(names, "+");
    g.grad = g.table + "@GRAD";
    fused.push_back(std::move(g));
  }
  s->tables = std::move(fused);
}

// Pass 2. Reads items and the main block's shapes. Writes each item's param_blocks (rows of the
// parameter), grad_blocks (the same rows of the gradient) and state_blocks (the same rows, or
// whole copies for state shaped unlike the parameter); the endpoints are left empty.
void SliceParameters(TranspileState* s) {
  const TranspilerConfig& config = s->config;
  for (auto& item : s->items) {
    Shape pshape = VarShape(s->block, item.param);
    item.param_blocks =
        SliceVariable(item.param, pshape, s->num_ps, config.slice_var_up, config.min_block_size);
    item.grad_blocks = BlocksFor(item.grad, pshape, pshape, item.param_blocks);
    for (const auto& var : OptimizerStateVars(item.op)) {
      item.state_blocks[var] = BlocksFor(var, VarShape(s->block, var), pshape, item.param_blocks);
    }
  }
}

// Pass 3. Reads the items' blocks and the config's dispatcher or split method. Writes the
// endpoint of every parameter block (round robin: one counter across all blocks in parameter
// order; or a stable hash of the block name; or the dispatcher), the same endpoint on the
// gradient and state blocks of the same rows, and param_blocks. Fails when the dispatcher
// names no pserver.
absl::Status PlaceBlocks(TranspileState* s) {
  const TranspilerConfig& config = s->config;
  const int num_ps = s->num_ps;
  int counter = 0;
  for (auto& item : s->items) {
    for (size_t i = 0; i < item.param_blocks.size(); ++i) {
      VarBlock& b = item.param_blocks[i];
      int ps;
      if (config.dispatcher) {
        ps = config.dispatcher(b.name, counter, num_ps);
        if (ps < 0 || ps >= num_ps) {
          return absl::InvalidArgumentError(
              absl::StrCat("dispatcher placed ", b.name, " on pserver ", ps, " of ", num_ps));
        }
      } else if (config.split_method == SplitMethod::kHashName) {
        ps = static_cast<int>(StableHash(b.name) % static_cast<uint64_t>(num_ps));
      } else {
        ps = counter % num_ps;
      }
      ++counter;
      b.endpoint = config.pservers[ps];
      item.grad_blocks[i].endpoint = b.endpoint;
      for (auto& [var, blocks] : item.state_blocks) blocks[i].endpoint = b.endpoint;
      s->param_blocks.push_back(b);
    }
  }
  return absl::OkStatus();
}

// Pass 3b. Reads the tables and the main block's lookups. Table-wise placement: writes each
// table's owner (the header's rule: tables looked up with the same ids together, groups largest
// first on the pserver with the fewest columns so far). Row-wise: leaves every owner -1.
void PlaceTables(TranspileState* s) {
  if (s->config.table_placement != TablePlacement::kTableWise) return;
  // Each table's lookups' Ids, in program order: tables with the same list form a group.
  std::vector<std::vector<std::string>> ids_of(s->tables.size());
  for (const auto& op : s->block.ops()) {
    if (op.type() != "lookup_table") continue;
    const std::string w = OpInput(op, "W");
    for (size_t t = 0; t < s->tables.size(); ++t) {
      const TableItem& item = s->tables[t];
      // A group is looked up with its members' ids (once: they are the same).
      const bool reads = item.table == w || (!item.members.empty() && item.members[0].table == w);
      if (reads) ids_of[t].push_back(OpInput(op, "Ids"));
    }
  }
  struct Group {
    std::vector<size_t> tables;
    int64_t width = 0;
  };
  std::vector<Group> groups;
  std::vector<const std::vector<std::string>*> group_ids;
  for (size_t t = 0; t < s->tables.size(); ++t) {
    size_t g = 0;
    // A table nothing looks up is a group of its own.
    while (g < groups.size() && (ids_of[t].empty() || *group_ids[g] != ids_of[t])) ++g;
    if (g == groups.size()) {
      groups.emplace_back();
      group_ids.push_back(&ids_of[t]);
    }
    groups[g].tables.push_back(t);
    groups[g].width += s->tables[t].dim;
  }
  std::stable_sort(groups.begin(), groups.end(),
                   [](const Group& a, const Group& b) { return a.width > b.width; });
  std::vector<int64_t> load(static_cast<size_t>(s->num_ps), 0);
  for (const Group& g : groups) {
    const int ps = static_cast<int>(std::min_element(load.begin(), load.end()) - load.begin());
    load[static_cast<size_t>(ps)] += g.width;
    for (size_t t : g.tables) s->tables[t].owner = ps;
  }
}

// An optimize-role op the trainer runs itself: clipping, and in hybrid mode a dense parameter's
// optimize op and the learning-rate schedule (which those read).
bool RunsOnTrainer(const TranspileState& s, const OpDesc& op) {
  if (StaysOnTrainer(op)) return true;
  if (!s.config.hybrid) return false;
  if ((OpRoleOf(op) & kRoleLRSched) != 0) return true;  // dense optimizers read it
  auto rv = GetStringsAttr(op, kOpRoleVarAttr);
  return !rv.empty() && s.local_params.count(rv[0]) > 0;
}

// Trainer step 1. Reads local_params and local_grads (hybrid). Removes from `tb` the optimize
// and learning-rate ops the pservers run; in hybrid mode inserts the all-reduce of the dense
// gradients.
void RemovePserverOps(const TranspileState& s, BlockDesc* tb) {
  google::protobuf::RepeatedPtrField<OpDesc> kept;
  for (const auto& op : tb->ops()) {
    if ((OpRoleOf(op) & (kRoleOptimize | kRoleLRSched)) == 0 || RunsOnTrainer(s, op)) {
      *kept.Add() = op;
    }
  }
  tb->mutable_ops()->Swap(&kept);
  if (s.config.hybrid) {
    // The mean of the trainers' dense gradients, before the first optimize op that stays
    // (clipping, when there is one, then sees the same gradients as on one machine).
    InsertGradientAllReduce(tb, s.local_grads, s.config.overlap_allreduce);
  }
}

// Trainer step 1b. Reads tables. For each table group, replaces in `tb` its members' lookups by
// one lookup of the group (at the first member's) and a `split` by columns into the members'
// outputs, and their lookup_table_grads by a `concat` of the members' output gradients and one
// lookup_table_grad of the group (at the last member's); drops the members' gradients.
void FuseGroupLookups(const TranspileState& s, BlockDesc* tb) {
  std::set<std::string> dropped;
  for (const auto& t : s.tables) {
    if (t.members.empty()) continue;
    std::vector<int> lookups, grads;
    for (int i = 0; i < tb->ops_size(); ++i) {
      const OpDesc& op = tb->ops(i);
      const std::string w = OpInput(op, "W");
      for (const auto& m : t.members) {
        if (w != m.table) continue;
        if (op.type() == "lookup_table") lookups.push_back(i);
        if (op.type() == "lookup_table_grad") grads.push_back(i);
      }
    }
    const OpDesc& first = tb->ops(lookups.front());
    const std::string ids = OpInput(first, "Ids");
    std::vector<std::string> outs, out_grads;
    std::vector<int64_t> dims;
    for (const auto& m : t.members) {
      for (int i : lookups) {
        if (OpInput(tb->ops(i), "W") == m.table) outs.push_back(OpOutput(tb->ops(i), "Out"));
      }
      for (int i : grads) {
        if (OpInput(tb->ops(i), "W") == m.table) {
          out_grads.push_back(OpInput(tb->ops(i), GradVarName("Out")));
        }
      }
      dims.push_back(m.dim);
      dropped.insert(m.grad);
    }
    Shape shape = VarShape(*tb, outs[0]);
    if (shape.empty()) shape = {-1, t.dim};
    shape.back() = t.dim;
    const int64_t axis = static_cast<int64_t>(shape.size()) - 1;
    const std::string rows = t.table + ".rows";
    DeclareVar(tb, rows, shape, FLOAT32);
    DeclareVar(tb, GradVarName(rows), shape, FLOAT32);
    DeclareVar(tb, t.grad, {-1, t.dim}, FLOAT32)->set_type(SELECTED_ROWS);

    OpDesc lookup = first;
    lookup.clear_inputs();
    lookup.clear_outputs();
    SetOpInputs(&lookup, "W", {t.table});
    SetOpInputs(&lookup, "Ids", {ids});
    SetOpOutputs(&lookup, "Out", {rows});
    OpDesc split = MakeOp("split", {{"X", {rows}}}, {{"Out", outs}});
    SetAttr(&split, "axis", axis);
    SetAttr(&split, "sections", dims);
    SetAttr(&split, kOpRoleAttr, OpRoleOf(first));
    const OpDesc& last_grad = tb->ops(grads.back());
    OpDesc concat = MakeOp("concat", {{"X", out_grads}}, {{"Out", {GradVarName(rows)}}});
    SetAttr(&concat, "axis", axis);
    SetAttr(&concat, kOpRoleAttr, OpRoleOf(last_grad));
    OpDesc grad = last_grad;
    grad.clear_inputs();
    grad.clear_outputs();
    SetOpInputs(&grad, "W", {t.table});
    SetOpInputs(&grad, "Ids", {ids});
    SetOpInputs(&grad, GradVarName("Out"), {GradVarName(rows)});
    SetOpOutputs(&grad, GradVarName("W"), {t.grad});

    google::protobuf::RepeatedPtrField<OpDesc> kept;
    for (int i = 0; i < tb->ops_size(); ++i) {
      if (i == lookups.front()) {
        *kept.Add() = lookup;
        *kept.Add() = split;
      } else if (i == grads.back()) {
        *kept.Add() = concat;
        *kept.Add() = grad;
      } else if (std::find(lookups.begin(), lookups.end(), i) == lookups.end() &&
                 std::find(grads.begin(), grads.end(), i) == grads.end()) {
        *kept.Add() = tb->ops(i);
      }
    }
    tb->mutable_ops()->Swap(&kept);
  }
  DropVars(tb, dropped);
}

// Trainer step 2. Reads tables. Replaces in `tb` each lookup_table of a distributed table by a
// prefetch and each lookup_table_grad by a table-free lookup_sparse_grad.
void ReplaceTableLookups(const TranspileState& s, BlockDesc* tb) {
  auto table_of = [&](const OpDesc& op) -> const TableItem* {
    std::string w = OpInput(op, "W");
    for (const auto& t : s.tables) {
      if (t.table == w) return &t;
    }
    return nullptr;
  };
  for (auto& op : *tb->mutable_ops()) {
    const TableItem* t = table_of(op);
    if (t == nullptr) continue;
    if (op.type() == "lookup_table") {
      OpDesc pf =
          MakeOp("prefetch", {{"Ids", OpInputs(op, "Ids")}}, {{"Out", OpOutputs(op, "Out")}});
      SetAttr(&pf, "table", t->table);
      SetAttr(&pf, "epmap", TableEndpoints(s, *t));
      SetAttr(&pf, "shard_method", s.config.table_shard_method);
      SetAttr(&pf, "dim", t->dim);
      SetAttr(&pf, kOpRoleAttr, OpRoleOf(op));  // a forward op (evaluation keeps it)
      op = pf;
    } else if (op.type() == "lookup_table_grad") {
      OpDesc g = MakeOp("lookup_sparse_grad",
                        {{"Ids", OpInputs(op, "Ids")}, {"Out@GRAD", OpInputs(op, "Out@GRAD")}},
                        {{"W@GRAD", OpOutputs(op, "W@GRAD")}});
      SetAttr(&g, kOpRoleAttr, OpRoleOf(op));
      op = g;
    }
  }
}

// Trainer step 3. Reads the config and the tables' owners. Fuses the prefetch ops of `tb` into
// one for all tables (their requests then travel together), at the first prefetch's place — when
// every Ids it reads is already available there. Its epmap lists all pservers; with table-wise
// placement attr `owners` says, per entry, which one holds the whole table.
void FusePrefetches(const TranspileState& s, BlockDesc* tb) {
  const TranspilerConfig& config = s.config;
  std::vector<int> at;
  for (int i = 0; i < tb->ops_size(); ++i) {
    if (tb->ops(i).type() == "prefetch") at.push_back(i);
  }
  bool fusable = at.size() > 1;
  for (size_t j = 1; fusable && j < at.size(); ++j) {
    std::string ids = OpInput(tb->ops(at[j]), "Ids");
    for (int i = at[0]; i < at[j] && fusable; ++i) {
      for (const auto& out : AllOutputArgs(tb->ops(i))) fusable &= out != ids;
    }
  }
  if (!fusable) return;
  std::vector<std::string> ids, outs, names;
  std::vector<int64_t> dims, owners;
  for (int i : at) {
    const OpDesc& op = tb->ops(i);
    ids.push_back(OpInput(op, "Ids"));
    outs.push_back(OpOutput(op, "Out"));
    names.push_back(GetStringAttr(op, "table", ""));
    dims.push_back(GetIntAttr(op, "dim", 0));
    for (const auto& t : s.tables) {
      if (t.table == names.back()) owners.push_back(t.owner);
    }
  }
  OpDesc fused = MakeOp("prefetch", {{"Ids", ids}}, {{"Out", outs}});
  SetAttr(&fused, "tables", names);
  SetAttr(&fused, "dims", dims);
  SetAttr(&fused, "epmap", config.pservers);
  if (config.table_placement == TablePlacement::kTableWise) SetAttr(&fused, "owners", owners);
  SetAttr(&fused, "shard_method", config.table_shard_method);
  SetAttr(&fused, kOpRoleAttr, OpRoleOf(tb->ops(at[0])));
  google::protobuf::RepeatedPtrField<OpDesc> kept;
  for (int i = 0; i < tb->ops_size(); ++i) {
    if (i == at[0]) {
      *kept.Add() = fused;
    } else if (tb->ops(i).type() != "prefetch") {
      *kept.Add() = tb->ops(i);
    }
  }
  tb->mutable_ops()->Swap(&kept);
}

// Trainer step 4. Reads tables and the items' blocks. Appends to `tb` the split of each table
// gradient by shard and of each sliced gradient by rows (declaring the pieces and the
// parameter blocks); writes what the send carries (`send_vars` to `send_eps`) and recv_vars,
// recv_eps.
void AppendGradientSplits(TranspileState* s, BlockDesc* tb, std::vector<std::string>* send_vars,
                          std::vector<std::string>* send_eps) {
  for (const auto& t : s->tables) {
    std::vector<std::string> shards;
    for (int k = 0; k < t.Shards(s->num_ps); ++k) {
      std::string name = t.GradShard(k);
      VarDesc* v = DeclareVar(tb, name, {-1, t.dim}, FLOAT32);
      v->set_type(SELECTED_ROWS);
      shards.push_back(name);
      send_vars->push_back(name);
      send_eps->push_back(s->config.pservers[t.PserverOf(k)]);
    }
    OpDesc split = MakeOp("split_by_shard", {{"X", {t.grad}}}, {{"Out", shards}});
    SetAttr(&split, "shard_method", s->config.table_shard_method);
    *tb->add_ops() = RoleOp(split, kRoleRPC | kRoleBackward);
  }
  for (const auto& item : s->items) {
    int n = static_cast<int>(item.grad_blocks.size());
    if (n > 1) {
      std::vector<std::string> outs;
      std::vector<int64_t> sections;
      for (const auto& b : item.grad_blocks) {
        outs.push_back(b.name);
        sections.push_back(b.num_rows);
        DeclareLike(tb, s->block, b, false);
      }
      OpDesc split = MakeOp(item.sparse_grad ? "split_selected_rows" : "split",
                            {{"X", {item.grad}}}, {{"Out", outs}});
      SetAttr(&split, item.sparse_grad ? "height_sections" : "sections", sections);
      SetAttr(&split, "axis", int64_t{0});
      *tb->add_ops() = RoleOp(split, kRoleRPC | kRoleBackward);
    }
    for (int i = 0; i < n; ++i) {
      send_vars->push_back(item.grad_blocks[i].name);
      send_eps->push_back(item.param_blocks[i].endpoint);
      s->recv_vars.push_back(item.param_blocks[i].name);
      s->recv_eps.push_back(item.param_blocks[i].endpoint);
      if (n > 1) DeclareLike(tb, s->block, item.param_blocks[i], false);
    }
  }
}

// Trainer step 5. Reads recv_vars, recv_eps and the items' blocks. Appends to `tb` the send of
// `send_vars` (with the send barrier in sync mode), the recv (with the fetch barrier) and the
// concats of the sliced parameters; writes concats.
void AppendSendRecv(TranspileState* s, BlockDesc* tb, const std::vector<std::string>& send_vars,
                    const std::vector<std::string>& send_eps) {
  const TranspilerConfig& config = s->config;
  OpDesc send = MakeOp("send", {{"X", send_vars}}, {});
  SetAttr(&send, "epmap", send_eps);
  SetAttr(&send, "sync_mode", config.sync_mode);
  // Sync: the barriers ride on the step's send and recv requests (one request each per pserver;
  // every pserver gets them, with or without variables).
  if (config.sync_mode) SetAttr(&send, "barrier_endpoints", config.pservers);
  *tb->add_ops() = RoleOp(send, kRoleRPC);
  OpDesc recv = MakeOp("recv", {}, {{"Out", s->recv_vars}});
  SetAttr(&recv, "epmap", s->recv_eps);
  if (config.sync_mode) SetAttr(&recv, "fetch_barrier_endpoints", config.pservers);
  *tb->add_ops() = RoleOp(recv, kRoleRPC);
  for (const auto& item : s->items) {
    if (item.param_blocks.size() < 2) continue;
    std::vector<std::string> ins;
    for (const auto& b : item.param_blocks) ins.push_back(b.name);
    OpDesc concat = MakeOp("concat", {{"X", ins}}, {{"Out", {item.param}}});
    SetAttr(&concat, "axis", int64_t{0});
    s->concats.push_back(RoleOp(concat, kRoleRPC));
  }
  for (const auto& c : s->concats) *tb->add_ops() = c;
}

// Trainer step 6. Reads items, lr_ops and tables. Writes pserver_only (optimizer state, the
// learning rate and its schedule unless hybrid, the tables) and drops those variables from `tb`.
void DropPserverOnlyVars(TranspileState* s, BlockDesc* tb) {
  std::set<std::string>& pserver_only = s->pserver_only;
  for (const auto& item : s->items) {
    for (const auto& [var, blocks] : item.state_blocks) pserver_only.insert(var);
    if (!item.lr.empty()) pserver_only.insert(item.lr);
  }
  for (const auto& op : s->lr_ops) {
    if (s->config.hybrid) break;  // the trainer's dense optimizers read the schedule too
    for (const auto& a : AllInputArgs(op)) pserver_only.insert(a);
    for (const auto& a : AllOutputArgs(op)) pserver_only.insert(a);
  }
  for (const auto& t : s->tables) {
    pserver_only.insert(t.table);
    if (!t.lr.empty() && !s->config.hybrid) pserver_only.insert(t.lr);
    for (const auto& var : OptimizerStateVars(t.opt)) pserver_only.insert(var);  // its state
    for (const auto& m : t.members) {
      pserver_only.insert(m.table);
      for (const auto& var : OptimizerStateVars(m.opt)) pserver_only.insert(var);
    }
  }
  DropVars(tb, pserver_only);
}

// Pass 4. Reads main and everything passes 1-3 wrote. Writes trainer (main with the optimize
// ops moved to the pservers, lookups of distributed tables made prefetches, gradients split and
// sent, parameters received and put back together), recv_vars, recv_eps, concats, pserver_only.
void RewriteTrainerProgram(TranspileState* s) {
  s->trainer = s->main;
  BlockDesc* tb = s->trainer.mutable_blocks(0);
  RemovePserverOps(*s, tb);
  FuseGroupLookups(*s, tb);
  ReplaceTableLookups(*s, tb);
  FusePrefetches(*s, tb);
  std::vector<std::string> send_vars, send_eps;
  AppendGradientSplits(s, tb, &send_vars, &send_eps);
  AppendSendRecv(s, tb, send_vars, send_eps);
  DropPserverOnlyVars(s, tb);
}

// Pass 5. Reads startup, pserver_only, the items' blocks, recv_vars, recv_eps, concats and
// local_params (hybrid). Writes trainer_startup: local init of what the trainer keeps, then pull
// every parameter so all trainers start from the pservers' values (hybrid: and join the
// trainers).
void BuildTrainerStartup(TranspileState* s) {
  s->trainer_startup = s->startup;
  BlockDesc* tsb = s->trainer_startup.mutable_blocks(0);
  google::protobuf::RepeatedPtrField<OpDesc> kept;
  for (const auto& op : tsb->ops()) {
    bool needed = true;
    for (const auto& a : AllOutputArgs(op)) needed &= s->pserver_only.count(a) == 0;
    if (needed) *kept.Add() = op;
  }
  tsb->mutable_ops()->Swap(&kept);
  DropVars(tsb, s->pserver_only);
  for (const auto& item : s->items) {
    if (item.param_blocks.size() < 2) continue;
    for (const auto& b : item.param_blocks) DeclareLike(tsb, s->block, b, false);
  }
  // The initial pull precedes step 0: no barrier. (Hybrid: there is nothing to pull.)
  if (!s->config.hybrid || !s->recv_vars.empty()) {
    OpDesc srecv = MakeOp("recv", {}, {{"Out", s->recv_vars}});
    SetAttr(&srecv, "epmap", s->recv_eps);
    *tsb->add_ops() = RoleOp(srecv, kRoleRPC);
  }
  for (const auto& c : s->concats) *tsb->add_ops() = c;
  if (s->config.hybrid) {
    JoinTrainers(tsb, std::vector<std::string>(s->local_params.begin(), s->local_params.end()));
  }
}

// One pserver's program and startup program while BuildPserverPrograms builds them.
struct PserverBuild {
  int ps = 0;
  std::string ep;
  ProgramDesc prog, sprog;
  BlockDesc* b0 = nullptr;  // prog's block 0
  BlockDesc* s0 = nullptr;  // sprog's block 0
  std::vector<int64_t> optimize_blocks;
  std::vector<std::string> grad_to_block;  // "<grad block>:<optimize block id>"
  int lr_block_id = -1;
  std::set<std::string> declared_lr;
};

// Declares `vb` persistable in the pserver's block 0, and in its startup with the op that
// initializes it. Fails when the startup program does not initialize vb.var.
absl::Status DeclareOnPserver(const TranspileState& s, PserverBuild* p, const VarBlock& vb) {
  DeclareLike(p->b0, s.block, vb, true);
  OpDesc op;
  if (!InitOpFor(s.startup, vb, &op)) {
    return absl::InvalidArgumentError(absl::StrCat("startup program does not initialize ", vb.var));
  }
  DeclareLike(p->s0, s.block, vb, true);
  *p->s0->add_ops() = op;
  return absl::OkStatus();
}

// The whole (unsliced) variable `var` on the pserver.
VarBlock WholeVar(const TranspileState& s, const PserverBuild& p, const std::string& var) {
  return VarBlock{var, var, 0, 0, 1, 0, VarShape(s.block, var), p.ep};
}

// Declares the learning-rate variable `lr` on the pserver, unless it is empty or declared.
absl::Status DeclareLearningRate(const TranspileState& s, PserverBuild* p, const std::string& lr) {
  if (lr.empty() || !p->declared_lr.insert(lr).second) return absl::OkStatus();
  return DeclareOnPserver(s, p, WholeVar(s, *p, lr));
}

// Adds to the pserver the optimize block of row block `i` of `item`: the parameter block, the
// gradient block (one copy per trainer in sync mode, summed), the 1/N scale, and the optimize
// op on the block with its state.
absl::Status AddOptimizeBlock(const TranspileState& s, const OptimizeItem& item, size_t i,
                              PserverBuild* p) {
  const TranspilerConfig& config = s.config;
  const VarBlock& pb = item.param_blocks[i];
  const VarBlock& gb = item.grad_blocks[i];
  TS_RETURN_IF_ERROR(DeclareOnPserver(s, p, pb));
  DeclareLike(p->b0, s.block, gb, false);
  TS_RETURN_IF_ERROR(DeclareLearningRate(s, p, item.lr));

  BlockDesc* ob = AddBlock(&p->prog, 0);
  p->optimize_blocks.push_back(ob->idx());
  if (config.sync_mode) {
    std::vector<std::string> per_trainer;
    for (int k = 0; k < config.trainers; ++k) {
      VarBlock tgb = gb;
      tgb.name = TrainerGradName(gb.name, k);
      DeclareLike(p->b0, s.block, tgb, false);
      per_trainer.push_back(tgb.name);
    }
    *ob->add_ops() =
        RoleOp(MakeOp("sum", {{"X", per_trainer}}, {{"Out", {gb.name}}}), kRoleOptimize);
  }
  // Sync: the mean of the trainers' gradients. Async: each push counts 1/N, so one push
  // from every trainer moves the parameters as far as one sync step.
  OpDesc scale = MakeOp("scale", {{"X", {gb.name}}}, {{"Out", {gb.name}}});
  SetAttr(&scale, "scale", 1.0f / static_cast<float>(config.trainers));
  *ob->add_ops() = RoleOp(scale, kRoleOptimize);
  OpDesc opt = item.op;
  RenameOpInput(&opt, item.param, pb.name);
  RenameOpOutput(&opt, item.param, pb.name);
  RenameOpInput(&opt, item.grad, gb.name);
  for (const auto& [var, blocks] : item.state_blocks) {
    const VarBlock& sb = blocks[i];
    RenameOpInput(&opt, var, sb.name);
    RenameOpOutput(&opt, var, sb.name);
    TS_RETURN_IF_ERROR(DeclareOnPserver(s, p, sb));
  }
  SetAttr(&opt, kOpRoleVarAttr, std::vector<std::string>{pb.name, gb.name});
  *ob->add_ops() = opt;
  p->grad_to_block.push_back(absl::StrCat(gb.name, ":", ob->idx()));
  return absl::OkStatus();
}

// Adds to the pserver's block 0 one sparse_table op per table shard it holds, describing the
// shard (its index of num_shards: every id with ShardOf(id, num_shards) == shard; the
// initializer, optimizer and its attributes, learning rate), and declares the learning rate.
// Fails when the startup program does not initialize a table.
absl::Status AddSparseTables(const TranspileState& s, PserverBuild* p) {
  for (const auto& t : s.tables) {
    const int shard = t.ShardOn(p->ps);
    if (shard < 0) continue;
    // A group: one op per member (its table, width, optimizer and initializer), naming the group.
    std::vector<TableItem::Member> members = t.members;
    if (members.empty()) members.push_back({t.table, t.grad, t.opt, t.dim});
    for (const auto& m : members) {
      OpDesc st = MakeOp("sparse_table", {}, {});
      SetAttr(&st, "table", m.table);
      if (!t.members.empty()) SetAttr(&st, "group", t.table);
      SetAttr(&st, "grad", t.GradShard(shard));
      SetAttr(&st, "dim", m.dim);
      SetAttr(&st, "shard", static_cast<int64_t>(shard));
      SetAttr(&st, "num_shards", static_cast<int64_t>(t.Shards(s.num_ps)));
      SetAttr(&st, "shard_method", s.config.table_shard_method);
      SetAttr(&st, "optimizer", m.opt.type());
      for (const auto& a : m.opt.attrs()) {
        if (a.name() != kOpRoleAttr && a.name() != kOpRoleVarAttr) *st.add_attrs() = a;
      }
      SetAttr(&st, "learning_rate", t.lr);
      const Shape shape = VarShape(s.block, m.table);
      // The declared vocabulary, all shards together: the pserver sizes the table for its share.
      if (!shape.empty() && shape[0] > 0) SetAttr(&st, "rows", shape[0]);
      VarBlock whole{m.table, m.table, 0, 0, 1, m.dim, shape, p->ep};
      OpDesc init_op;
      if (!InitOpFor(s.startup, whole, &init_op)) {
        return absl::InvalidArgumentError(
            absl::StrCat("startup program does not initialize table ", m.table));
      }
      SetAttr(&st, "init", init_op.type());
      for (const auto& a : init_op.attrs()) {
        if (a.name() == "min" || a.name() == "max" || a.name() == "mean" || a.name() == "std" ||
            a.name() == "value" || a.name() == "seed") {
          OpDesc::Attr* copy = st.add_attrs();
          *copy = a;
          copy->set_name("init_" + a.name());
        }
      }
      *p->b0->add_ops() = RoleOp(st, kRoleRPC);
    }
    TS_RETURN_IF_ERROR(DeclareLearningRate(s, p, t.lr));
  }
  return absl::OkStatus();
}

// Adds to the pserver the learning-rate decay block (the schedule ops, stepped once per sync
// step or 1/N per async push) and declares the variables they use; only when there are
// schedule ops and the pserver has something to optimize. Writes lr_block_id.
absl::Status AddLrDecayBlock(const TranspileState& s, PserverBuild* p) {
  const bool holds_table = std::any_of(s.tables.begin(), s.tables.end(),
                                       [&](const TableItem& t) { return t.ShardOn(p->ps) >= 0; });
  if (s.lr_ops.empty() || (p->optimize_blocks.empty() && !holds_table)) {
    return absl::OkStatus();
  }
  BlockDesc* lb = AddBlock(&p->prog, 0);
  std::set<std::string> vars;
  for (OpDesc op : s.lr_ops) {
    // Sync: one step per step. Async: every trainer's push advances it by 1/N.
    SetAttr(&op, "step_increment",
            s.config.sync_mode ? 1.0f : 1.0f / static_cast<float>(s.config.trainers));
    *lb->add_ops() = op;
    for (const auto& a : AllInputArgs(op)) vars.insert(a);
    for (const auto& a : AllOutputArgs(op)) vars.insert(a);
  }
  for (const auto& v : vars) {
    if (FindVarDesc(*p->b0, v) != nullptr) continue;
    TS_RETURN_IF_ERROR(DeclareOnPserver(s, p, WholeVar(s, *p, v)));
  }
  p->lr_block_id = lb->idx();
  return absl::OkStatus();
}

// Adds to the pserver's block 0 the listen_and_serv op that describes the service.
void AddListenAndServ(const TranspileState& s, PserverBuild* p) {
  OpDesc ls = MakeOp("listen_and_serv", {}, {});
  if (p->lr_block_id >= 0) SetAttr(&ls, "lr_decay_block_id", static_cast<int64_t>(p->lr_block_id));
  SetAttr(&ls, "endpoint", p->ep);
  SetAttr(&ls, "Fanin", static_cast<int64_t>(s.config.trainers));
  SetAttr(&ls, "sync_mode", s.config.sync_mode);
  SetAttr(&ls, "optimize_blocks", p->optimize_blocks);
  SetAttr(&ls, "grad_to_block_id", p->grad_to_block);
  *p->b0->add_ops() = RoleOp(ls, kRoleRPC);
}

// Pass 6. Reads startup, the items' blocks, tables and lr_ops. Writes pserver and
// pserver_startup for every endpoint: block 0 holds the sparse_table ops and listen_and_serv,
// then one optimize block per parameter block placed there, then the lr decay block; the startup
// initializes each persistable variable as block 0 declares it (so both are built in one walk).
// Fails when the startup program does not initialize one of them.
absl::Status BuildPserverPrograms(TranspileState* s) {
  for (int ps = 0; ps < s->num_ps; ++ps) {
    PserverBuild p;
    p.ps = ps;
    p.ep = s->config.pservers[ps];
    p.prog.set_random_seed(s->main.random_seed());
    p.b0 = AddBlock(&p.prog, -1);
    p.sprog.set_random_seed(s->startup.random_seed());
    p.s0 = AddBlock(&p.sprog, -1);
    for (const auto& item : s->items) {
      for (size_t i = 0; i < item.param_blocks.size(); ++i) {
        if (item.param_blocks[i].endpoint != p.ep) continue;
        TS_RETURN_IF_ERROR(AddOptimizeBlock(*s, item, i, &p));
      }
    }
    TS_RETURN_IF_ERROR(AddSparseTables(*s, &p));
    TS_RETURN_IF_ERROR(AddLrDecayBlock(*s, &p));
    AddListenAndServ(*s, &p);
    s->pserver[p.ep] = std::move(p.prog);
    s->pserver_startup[p.ep] = std::move(p.sprog);
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<DistributeTranspiler> DistributeTranspiler::Transpile(
    const ProgramDesc& main, const ProgramDesc& startup, const TranspilerConfig& config) {
  TS_RETURN_IF_ERROR(ValidateConfig(main, startup, config));
  TranspileState s(main, startup, config);
  TS_RETURN_IF_ERROR(CollectOptimizeOps(&s));
  FuseTables(&s);
  DistributeTranspiler t;
  t.config_ = config;  // copied before PlaceBlocks calls the dispatcher, as it was given
  SliceParameters(&s);
  TS_RETURN_IF_ERROR(PlaceBlocks(&s));
  PlaceTables(&s);
  RewriteTrainerProgram(&s);
  BuildTrainerStartup(&s);
  TS_RETURN_IF_ERROR(BuildPserverPrograms(&s));
  t.trainer_ = std::move(s.trainer);
  t.trainer_startup_ = std::move(s.trainer_startup);
  t.pserver_ = std::move(s.pserver);
  t.pserver_startup_ = std::move(s.pserver_startup);
  t.param_blocks_ = std::move(s.param_blocks);
  return t;
}

absl::StatusOr<CollectivePrograms> TranspileCollective(const ProgramDesc& main,
                                                       const ProgramDesc& startup,
                                                       bool overlap_allreduce) {
  if (main.blocks_size() == 0 || startup.blocks_size() == 0) {
    return absl::InvalidArgumentError("main and startup programs need a block 0");
  }
  CollectivePrograms out{main, startup};
  BlockDesc* tb = out.trainer.mutable_blocks(0);
  std::vector<std::string> grads, params;
  bool has_optimize = false;
  for (const OpDesc& op : tb->ops()) {
    if ((OpRoleOf(op) & kRoleOptimize) == 0) continue;
    has_optimize = true;
    auto rv = GetStringsAttr(op, kOpRoleVarAttr);
    if (rv.size() < 2) continue;
    const VarDesc* pv = FindVarDesc(*tb, rv[0]);
    if (pv != nullptr && pv->is_distributed()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "table ", rv[0], " is distributed; collective mode has no pservers to hold it"));
    }
    params.push_back(rv[0]);
    grads.push_back(rv[1]);
  }
  if (!has_optimize) {
    return absl::InvalidArgumentError(
        "the program has no optimize ops (build it with an optimizer's Minimize)");
  }
  InsertGradientAllReduce(tb, grads, overlap_allreduce);
  JoinTrainers(out.trainer_startup.mutable_blocks(0), params);
  return out;
}

absl::StatusOr<ProgramDesc> DistributeTranspiler::GetPserverProgram(
    const std::string& endpoint) const {
  auto it = pserver_.find(endpoint);
  if (it == pserver_.end()) {
    return absl::NotFoundError(absl::StrCat("endpoint ", endpoint, " is not one of the pservers ",
                                            absl::StrJoin(config_.pservers, ",")));
  }
  return it->second;
}

absl::StatusOr<ProgramDesc> DistributeTranspiler::GetPserverStartupProgram(
    const std::string& endpoint) const {
  auto it = pserver_startup_.find(endpoint);
  if (it == pserver_startup_.end()) {
    return absl::NotFoundError(absl::StrCat("endpoint ", endpoint, " is not one of the pservers ",
                                            absl::StrJoin(config_.pservers, ",")));
  }
  return it->second;
}

}  // namespace tessera
