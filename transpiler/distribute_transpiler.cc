#include "transpiler/distribute_transpiler.h"

#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/layers/optimizer.h"
#include "common/layers/program_builder.h"
#include "common/op_desc.h"
#include "common/ops/sharding.h"
#include "common/status.h"
#include "common/tensor.h"

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

absl::StatusOr<DistributeTranspiler> DistributeTranspiler::Transpile(
    const ProgramDesc& main, const ProgramDesc& startup, const TranspilerConfig& config) {
  if (config.pservers.empty()) return absl::InvalidArgumentError("no pserver endpoints given");
  std::set<std::string> unique(config.pservers.begin(), config.pservers.end());
  if (unique.size() != config.pservers.size()) {
    return absl::InvalidArgumentError(absl::StrCat("pserver endpoints repeat: ",
                                                   absl::StrJoin(config.pservers, ",")));
  }
  if (config.trainers < 1) {
    return absl::InvalidArgumentError(absl::StrCat("trainers=", config.trainers, " must be >= 1"));
  }
  if (config.trainer_id < 0 || config.trainer_id >= config.trainers) {
    return absl::InvalidArgumentError(absl::StrCat("trainer_id=", config.trainer_id,
                                                   " is outside [0, ", config.trainers, ")"));
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
  const BlockDesc& block = main.blocks(0);
  const int num_ps = static_cast<int>(config.pservers.size());

  // Optimize ops and their (param, grad) pairs.
  std::vector<OptimizeItem> items;
  std::vector<TableItem> tables;
  // Hybrid: the dense parameters' optimize ops stay on the trainer (their params and grads).
  std::set<std::string> local_params;
  std::vector<std::string> local_grads;
  ShardMethod shard_method;
  if (!ParseShardMethod(config.table_shard_method, &shard_method)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "table_shard_method '", config.table_shard_method, "' is not hash or mod"));
  }
  for (const auto& op : block.ops()) {
    if ((OpRoleOf(op) & kRoleOptimize) == 0 || StaysOnTrainer(op)) continue;
    auto rv = GetStringsAttr(op, kOpRoleVarAttr);
    if (rv.size() < 2) {
      return absl::InvalidArgumentError(absl::StrCat("optimize op ", OpSignature(op),
                                                     " has no op_role_var [param, grad]"));
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
        return absl::InvalidArgumentError(absl::StrCat(
            "distributed table ", item.param, " must be 2-D [dict_size, dim], is ",
            ShapeString(VarShape(block, item.param))));
      }
      tables.push_back({item.param, item.grad, item.lr, op, pv->shape(1)});
      continue;
    }
    if (config.hybrid) {
      local_params.insert(item.param);
      local_grads.push_back(item.grad);
      continue;
    }
    items.push_back(std::move(item));
  }
  if (items.empty() && tables.empty()) {
    return absl::InvalidArgumentError(
        config.hybrid ? "hybrid mode needs a distributed table (embedding is_distributed) for "
                        "the pservers; without one use --mode=collective"
                      : "the program has no optimize ops (build it with an optimizer's Minimize)");
  }
  // An optimize op the trainer runs itself: clipping, and in hybrid mode a dense parameter's.
  auto stays_on_trainer = [&](const OpDesc& op) {
    if (StaysOnTrainer(op)) return true;
    if (!config.hybrid) return false;
    if ((OpRoleOf(op) & kRoleLRSched) != 0) return true;  // dense optimizers read it
    auto rv = GetStringsAttr(op, kOpRoleVarAttr);
    return !rv.empty() && local_params.count(rv[0]) > 0;
  };

  // Learning-rate schedule ops (run on the pservers, once per step, before the optimizers).
  std::vector<OpDesc> lr_ops;
  for (const auto& op : block.ops()) {
    if ((OpRoleOf(op) & kRoleLRSched) != 0) lr_ops.push_back(op);
  }

  // Slice and place.
  DistributeTranspiler t;
  t.config_ = config;
  int counter = 0;
  for (auto& item : items) {
    Shape pshape = VarShape(block, item.param);
    item.param_blocks =
        SliceVariable(item.param, pshape, num_ps, config.slice_var_up, config.min_block_size);
    for (auto& b : item.param_blocks) {
      int ps;
      if (config.dispatcher) {
        ps = config.dispatcher(b.name, counter, num_ps);
        if (ps < 0 || ps >= num_ps) {
          return absl::InvalidArgumentError(absl::StrCat(
              "dispatcher placed ", b.name, " on pserver ", ps, " of ", num_ps));
        }
      } else if (config.split_method == SplitMethod::kHashName) {
        ps = static_cast<int>(StableHash(b.name) % static_cast<uint64_t>(num_ps));
      } else {
        ps = counter % num_ps;
      }
      ++counter;
      b.endpoint = config.pservers[ps];
      t.param_blocks_.push_back(b);
    }
    item.grad_blocks = BlocksFor(item.grad, pshape, pshape, item.param_blocks);
    for (const auto& slot : item.op.inputs()) {
      if (slot.parameter() == "Param" || slot.parameter() == "Grad" ||
          slot.parameter() == "LearningRate") {
        continue;
      }
      for (const auto& var : slot.arguments()) {
        item.state_blocks[var] = BlocksFor(var, VarShape(block, var), pshape, item.param_blocks);
      }
    }
  }

  // ---- Trainer program.
  t.trainer_ = main;
  BlockDesc* tb = t.trainer_.mutable_blocks(0);
  {
    google::protobuf::RepeatedPtrField<OpDesc> kept;
    for (const auto& op : tb->ops()) {
      if ((OpRoleOf(op) & (kRoleOptimize | kRoleLRSched)) == 0 || stays_on_trainer(op)) {
        *kept.Add() = op;
      }
    }
    tb->mutable_ops()->Swap(&kept);
  }
  if (config.hybrid) {
    // The mean of the trainers' dense gradients, before the first optimize op that stays
    // (clipping, when there is one, then sees the same gradients as on one machine).
    InsertGradientAllReduce(tb, local_grads, config.overlap_allreduce);
  }
  // Distributed tables: prefetch instead of lookup, a table-free sparse gradient.
  auto table_of = [&](const OpDesc& op) -> const TableItem* {
    std::string w = OpInput(op, "W");
    for (const auto& t : tables) {
      if (t.table == w) return &t;
    }
    return nullptr;
  };
  for (auto& op : *tb->mutable_ops()) {
    const TableItem* t = table_of(op);
    if (t == nullptr) continue;
    if (op.type() == "lookup_table") {
      OpDesc pf = MakeOp("prefetch", {{"Ids", OpInputs(op, "Ids")}}, {{"Out", OpOutputs(op, "Out")}});
      SetAttr(&pf, "table", t->table);
      SetAttr(&pf, "epmap", config.pservers);
      SetAttr(&pf, "shard_method", config.table_shard_method);
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
  // One prefetch op for all tables (their requests then travel together), at the first
  // prefetch's place — when every Ids it reads is already available there.
  {
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
    if (fusable) {
      std::vector<std::string> ids, outs, names;
      std::vector<int64_t> dims;
      for (int i : at) {
        const OpDesc& op = tb->ops(i);
        ids.push_back(OpInput(op, "Ids"));
        outs.push_back(OpOutput(op, "Out"));
        names.push_back(GetStringAttr(op, "table", ""));
        dims.push_back(GetIntAttr(op, "dim", 0));
      }
      OpDesc fused = MakeOp("prefetch", {{"Ids", ids}}, {{"Out", outs}});
      SetAttr(&fused, "tables", names);
      SetAttr(&fused, "dims", dims);
      SetAttr(&fused, "epmap", config.pservers);
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
  }
  std::vector<std::string> send_vars, send_eps, recv_vars, recv_eps;
  for (const auto& t : tables) {
    std::vector<std::string> shards;
    for (int k = 0; k < num_ps; ++k) {
      std::string name = absl::StrCat(t.grad, ".shard", k);
      VarDesc* v = DeclareVar(tb, name, {-1, t.dim}, FLOAT32);
      v->set_type(SELECTED_ROWS);
      shards.push_back(name);
      send_vars.push_back(name);
      send_eps.push_back(config.pservers[k]);
    }
    OpDesc split = MakeOp("split_by_shard", {{"X", {t.grad}}}, {{"Out", shards}});
    SetAttr(&split, "shard_method", config.table_shard_method);
    *tb->add_ops() = RoleOp(split, kRoleRPC | kRoleBackward);
  }
  for (const auto& item : items) {
    int n = static_cast<int>(item.grad_blocks.size());
    if (n > 1) {
      std::vector<std::string> outs;
      std::vector<int64_t> sections;
      for (const auto& b : item.grad_blocks) {
        outs.push_back(b.name);
        sections.push_back(b.num_rows);
        DeclareLike(tb, block, b, false);
      }
      OpDesc split = MakeOp(item.sparse_grad ? "split_selected_rows" : "split",
                            {{"X", {item.grad}}}, {{"Out", outs}});
      SetAttr(&split, item.sparse_grad ? "height_sections" : "sections", sections);
      SetAttr(&split, "axis", int64_t{0});
      *tb->add_ops() = RoleOp(split, kRoleRPC | kRoleBackward);
    }
    for (int i = 0; i < n; ++i) {
      send_vars.push_back(item.grad_blocks[i].name);
      send_eps.push_back(item.param_blocks[i].endpoint);
      recv_vars.push_back(item.param_blocks[i].name);
      recv_eps.push_back(item.param_blocks[i].endpoint);
      if (n > 1) DeclareLike(tb, block, item.param_blocks[i], false);
    }
  }
  OpDesc send = MakeOp("send", {{"X", send_vars}}, {});
  SetAttr(&send, "epmap", send_eps);
  SetAttr(&send, "sync_mode", config.sync_mode);
  // Sync: the barriers ride on the step's send and recv requests (one request each per pserver;
  // every pserver gets them, with or without variables).
  if (config.sync_mode) SetAttr(&send, "barrier_endpoints", config.pservers);
  *tb->add_ops() = RoleOp(send, kRoleRPC);
  OpDesc recv = MakeOp("recv", {}, {{"Out", recv_vars}});
  SetAttr(&recv, "epmap", recv_eps);
  if (config.sync_mode) SetAttr(&recv, "fetch_barrier_endpoints", config.pservers);
  *tb->add_ops() = RoleOp(recv, kRoleRPC);
  std::vector<OpDesc> concats;
  for (const auto& item : items) {
    if (item.param_blocks.size() < 2) continue;
    std::vector<std::string> ins;
    for (const auto& b : item.param_blocks) ins.push_back(b.name);
    OpDesc concat = MakeOp("concat", {{"X", ins}}, {{"Out", {item.param}}});
    SetAttr(&concat, "axis", int64_t{0});
    concats.push_back(RoleOp(concat, kRoleRPC));
  }
  for (const auto& c : concats) *tb->add_ops() = c;
  // Optimizer state and the learning rate live only on pservers.
  std::set<std::string> pserver_only;
  for (const auto& item : items) {
    for (const auto& [var, blocks] : item.state_blocks) pserver_only.insert(var);
    if (!item.lr.empty()) pserver_only.insert(item.lr);
  }
  for (const auto& op : lr_ops) {
    if (config.hybrid) break;  // the trainer's dense optimizers read the schedule too
    for (const auto& a : AllInputArgs(op)) pserver_only.insert(a);
    for (const auto& a : AllOutputArgs(op)) pserver_only.insert(a);
  }
  for (const auto& t : tables) {
    pserver_only.insert(t.table);
    if (!t.lr.empty() && !config.hybrid) pserver_only.insert(t.lr);
    for (const auto& slot : t.opt.inputs()) {  // the table's optimizer state
      if (slot.parameter() == "Param" || slot.parameter() == "Grad" ||
          slot.parameter() == "LearningRate") {
        continue;
      }
      for (const auto& var : slot.arguments()) pserver_only.insert(var);
    }
  }
  {
    google::protobuf::RepeatedPtrField<VarDesc> kept;
    for (const auto& v : tb->vars()) {
      if (pserver_only.count(v.name()) == 0) *kept.Add() = v;
    }
    tb->mutable_vars()->Swap(&kept);
  }

  // ---- Trainer startup: local init of what the trainer keeps, then pull every parameter so
  // all trainers start from the pservers' values.
  t.trainer_startup_ = startup;
  BlockDesc* tsb = t.trainer_startup_.mutable_blocks(0);
  {
    google::protobuf::RepeatedPtrField<OpDesc> kept;
    for (const auto& op : tsb->ops()) {
      bool needed = true;
      for (const auto& a : AllOutputArgs(op)) needed &= pserver_only.count(a) == 0;
      if (needed) *kept.Add() = op;
    }
    tsb->mutable_ops()->Swap(&kept);
    google::protobuf::RepeatedPtrField<VarDesc> kept_vars;
    for (const auto& v : tsb->vars()) {
      if (pserver_only.count(v.name()) == 0) *kept_vars.Add() = v;
    }
    tsb->mutable_vars()->Swap(&kept_vars);
  }
  for (const auto& item : items) {
    if (item.param_blocks.size() < 2) continue;
    for (const auto& b : item.param_blocks) DeclareLike(tsb, block, b, false);
  }
  // The initial pull precedes step 0: no barrier. (Hybrid: there is nothing to pull.)
  if (!config.hybrid || !recv_vars.empty()) {
    OpDesc srecv = MakeOp("recv", {}, {{"Out", recv_vars}});
    SetAttr(&srecv, "epmap", recv_eps);
    *tsb->add_ops() = RoleOp(srecv, kRoleRPC);
  }
  for (const auto& c : concats) *tsb->add_ops() = c;
  if (config.hybrid) {
    JoinTrainers(tsb, std::vector<std::string>(local_params.begin(), local_params.end()));
  }

  // ---- Pserver programs.
  for (int ps = 0; ps < num_ps; ++ps) {
    const std::string& ep = config.pservers[ps];
    ProgramDesc prog;
    prog.set_random_seed(main.random_seed());
    BlockDesc* b0 = prog.add_blocks();
    b0->set_idx(0);
    b0->set_parent_idx(-1);
    ProgramDesc sprog;
    sprog.set_random_seed(startup.random_seed());
    BlockDesc* s0 = sprog.add_blocks();
    s0->set_idx(0);
    s0->set_parent_idx(-1);

    std::vector<int64_t> optimize_blocks;
    std::vector<std::string> grad_to_block;
    int lr_block_id = -1;
    std::set<std::string> declared_lr;
    auto init = [&](const VarBlock& vb) -> absl::Status {
      OpDesc op;
      if (!InitOpFor(startup, vb, &op)) {
        return absl::InvalidArgumentError(
            absl::StrCat("startup program does not initialize ", vb.var));
      }
      DeclareLike(s0, block, vb, true);
      *s0->add_ops() = op;
      return absl::OkStatus();
    };
    for (const auto& item : items) {
      for (size_t i = 0; i < item.param_blocks.size(); ++i) {
        const VarBlock& pb = item.param_blocks[i];
        if (pb.endpoint != ep) continue;
        const VarBlock& gb = item.grad_blocks[i];
        DeclareLike(b0, block, pb, true);
        TS_RETURN_IF_ERROR(init(pb));
        DeclareLike(b0, block, gb, false);
        if (!item.lr.empty() && declared_lr.insert(item.lr).second) {
          VarBlock lr{item.lr, item.lr, 0, 0, 1, 0, VarShape(block, item.lr), ep};
          DeclareLike(b0, block, lr, true);
          TS_RETURN_IF_ERROR(init(lr));
        }

        BlockDesc* ob = prog.add_blocks();
        ob->set_idx(prog.blocks_size() - 1);
        ob->set_parent_idx(0);
        optimize_blocks.push_back(ob->idx());
        if (config.sync_mode) {
          std::vector<std::string> per_trainer;
          for (int k = 0; k < config.trainers; ++k) {
            VarBlock tgb = gb;
            tgb.name = TrainerGradName(gb.name, k);
            DeclareLike(b0, block, tgb, false);
            per_trainer.push_back(tgb.name);
          }
          *ob->add_ops() = RoleOp(MakeOp("sum", {{"X", per_trainer}}, {{"Out", {gb.name}}}),
                                  kRoleOptimize);
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
          DeclareLike(b0, block, sb, true);
          TS_RETURN_IF_ERROR(init(sb));
        }
        SetAttr(&opt, kOpRoleVarAttr, std::vector<std::string>{pb.name, gb.name});
        *ob->add_ops() = opt;
        grad_to_block.push_back(absl::StrCat(gb.name, ":", ob->idx()));
      }
    }
    for (const auto& t : tables) {
      OpDesc st = MakeOp("sparse_table", {}, {});
      SetAttr(&st, "table", t.table);
      SetAttr(&st, "grad", absl::StrCat(t.grad, ".shard", ps));
      SetAttr(&st, "dim", t.dim);
      SetAttr(&st, "shard", static_cast<int64_t>(ps));
      SetAttr(&st, "num_shards", static_cast<int64_t>(num_ps));
      SetAttr(&st, "shard_method", config.table_shard_method);
      SetAttr(&st, "optimizer", t.opt.type());
      for (const auto& a : t.opt.attrs()) {
        if (a.name() != kOpRoleAttr && a.name() != kOpRoleVarAttr) *st.add_attrs() = a;
      }
      SetAttr(&st, "learning_rate", t.lr);
      VarBlock whole{t.table, t.table, 0, 0, 1, t.dim, VarShape(block, t.table), ep};
      OpDesc init_op;
      if (!InitOpFor(startup, whole, &init_op)) {
        return absl::InvalidArgumentError(
            absl::StrCat("startup program does not initialize table ", t.table));
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
      if (!t.lr.empty() && declared_lr.insert(t.lr).second) {
        VarBlock lr{t.lr, t.lr, 0, 0, 1, 0, VarShape(block, t.lr), ep};
        DeclareLike(b0, block, lr, true);
        TS_RETURN_IF_ERROR(init(lr));
      }
      *b0->add_ops() = RoleOp(st, kRoleRPC);
    }
    if (!lr_ops.empty() && (!optimize_blocks.empty() || !tables.empty())) {
      BlockDesc* lb = prog.add_blocks();
      lb->set_idx(prog.blocks_size() - 1);
      lb->set_parent_idx(0);
      std::set<std::string> vars;
      for (OpDesc op : lr_ops) {
        // Sync: one step per step. Async: every trainer's push advances it by 1/N.
        SetAttr(&op, "step_increment",
                config.sync_mode ? 1.0f : 1.0f / static_cast<float>(config.trainers));
        *lb->add_ops() = op;
        for (const auto& a : AllInputArgs(op)) vars.insert(a);
        for (const auto& a : AllOutputArgs(op)) vars.insert(a);
      }
      for (const auto& v : vars) {
        if (FindVarDesc(*b0, v) != nullptr) continue;
        VarBlock vb{v, v, 0, 0, 1, 0, VarShape(block, v), ep};
        DeclareLike(b0, block, vb, true);
        TS_RETURN_IF_ERROR(init(vb));
      }
      lr_block_id = lb->idx();
    }
    OpDesc ls = MakeOp("listen_and_serv", {}, {});
    if (lr_block_id >= 0) SetAttr(&ls, "lr_decay_block_id", static_cast<int64_t>(lr_block_id));
    SetAttr(&ls, "endpoint", ep);
    SetAttr(&ls, "Fanin", static_cast<int64_t>(config.trainers));
    SetAttr(&ls, "sync_mode", config.sync_mode);
    SetAttr(&ls, "optimize_blocks", optimize_blocks);
    SetAttr(&ls, "grad_to_block_id", grad_to_block);
    *b0->add_ops() = RoleOp(ls, kRoleRPC);
    t.pserver_[ep] = std::move(prog);
    t.pserver_startup_[ep] = std::move(sprog);
  }
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
