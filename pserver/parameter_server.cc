#include "pserver/parameter_server.h"

#include <algorithm>
#include <cstring>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/io/checkpoint_io.h"
#include "common/op_desc.h"
#include "common/status.h"
#include "pserver/checkpoint.h"
#include "transpiler/distribute_transpiler.h"

namespace tessera {

namespace {

const OpDesc* FindListenAndServ(const ProgramDesc& program) {
  if (program.blocks_size() == 0) return nullptr;
  for (const auto& op : program.blocks(0).ops()) {
    if (op.type() == "listen_and_serv") return &op;
  }
  return nullptr;
}

}  // namespace

absl::StatusOr<std::unique_ptr<ParameterServer>> ParameterServer::Create(
    const ProgramDesc& program, Scope* scope, const OpRegistry* registry,
    ParameterServerOptions options) {
  std::unique_ptr<ParameterServer> ps(
      new ParameterServer(program, scope, registry, std::move(options)));
  TS_RETURN_IF_ERROR(ps->Init());
  return ps;
}

ParameterServer::ParameterServer(const ProgramDesc& program, Scope* scope,
                                 const OpRegistry* registry, ParameterServerOptions options)
    : program_(program), scope_(scope), executor_(registry), options_(std::move(options)) {}

absl::Status ParameterServer::Init() {
  const OpDesc* ls = FindListenAndServ(program_);
  if (ls == nullptr) {
    return absl::InvalidArgumentError("pserver program has no listen_and_serv op in block 0");
  }
  num_trainers_ = static_cast<int>(GetIntAttr(*ls, "Fanin", 1));
  sync_ = GetBoolAttr(*ls, "sync_mode", true);
  if (num_trainers_ < 1) {
    return absl::InvalidArgumentError(absl::StrCat("listen_and_serv Fanin=", num_trainers_));
  }
  for (const auto& entry : GetStringsAttr(*ls, "grad_to_block_id")) {
    std::pair<std::string, std::string> kv = absl::StrSplit(entry, absl::MaxSplits(':', 1));
    int block_id;
    if (!absl::SimpleAtoi(kv.second, &block_id) || block_id <= 0 ||
        block_id >= program_.blocks_size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("listen_and_serv grad_to_block_id entry '", entry, "' is malformed"));
    }
    OptimizeBlock b;
    b.block_id = block_id;
    b.grad = kv.first;
    for (const auto& op : program_.blocks(block_id).ops()) {
      if ((OpRoleOf(op) & kRoleOptimize) == 0) continue;
      auto rv = GetStringsAttr(op, kOpRoleVarAttr);
      if (rv.size() >= 2) b.param = rv[0];
    }
    TS_ASSIGN_OR_RETURN(b.prepared, executor_.Prepare(program_, block_id));
    grad_to_block_[b.grad] = static_cast<int>(blocks_.size());
    param_to_block_[b.param] = static_cast<int>(blocks_.size());
    blocks_.push_back(std::move(b));
  }
  TS_RETURN_IF_ERROR(InitTables());
  int64_t lr_block = GetIntAttr(*ls, "lr_decay_block_id", -1);
  if (lr_block > 0) {
    if (lr_block >= program_.blocks_size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("listen_and_serv lr_decay_block_id ", lr_block, " does not exist"));
    }
    TS_ASSIGN_OR_RETURN(lr_block_, executor_.Prepare(program_, static_cast<int>(lr_block)));
    has_lr_block_ = true;
    lr_clock_grad_ = !blocks_.empty() ? blocks_[0].grad : (tables_.empty() ? "" : tables_[0].grad);
  }
  CreateBlockVariables(program_.blocks(0), scope_);
  for (const auto& b : blocks_) CreateBlockVariables(program_.blocks(b.block_id), scope_);
  for (int k = 0; k < num_trainers_; ++k) trainer_scopes_.push_back(scope_->NewScope());
  {
    absl::MutexLock lock(&mu_);
    barrier_ = SyncBarrier(num_trainers_);
  }
  pool_ = std::make_unique<ThreadPool>(std::max(1, options_.optimize_threads));
  checkpoint_pool_ = std::make_unique<ThreadPool>(1);
  watchdog_ = std::thread([this] { Watchdog(); });
  return absl::OkStatus();
}

ParameterServer::~ParameterServer() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (watchdog_.joinable()) watchdog_.join();
  checkpoint_pool_.reset();
  pool_.reset();
}

namespace {
int TableShards(int requested) {
  if (requested > 0) return requested;
  const int threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  int shards = 4;
  while (shards < 2 * threads && shards < 64) shards *= 2;
  return shards;
}
}  // namespace

absl::Status ParameterServer::InitTables() {
  for (const auto& op : program_.blocks(0).ops()) {
    if (op.type() != "sparse_table") continue;
    Table t;
    t.name = GetStringAttr(op, "table", "");
    t.grad = GetStringAttr(op, "grad", "");
    t.lr = GetStringAttr(op, "learning_rate", "");
    t.dim = GetIntAttr(op, "dim", 0);
    t.shard = static_cast<int>(GetIntAttr(op, "shard", 0));
    SparseTableOptions o;
    o.dim = t.dim;
    std::string init = GetStringAttr(op, "init", "uniform_random");
    if (init == "uniform_random") {
      o.initializer.kind = SparseTableInitializer::kUniform;
      o.initializer.min = GetFloatAttr(op, "init_min", -1.0);
      o.initializer.max = GetFloatAttr(op, "init_max", 1.0);
    } else if (init == "gaussian_random") {
      o.initializer.kind = SparseTableInitializer::kGaussian;
      o.initializer.mean = GetFloatAttr(op, "init_mean", 0.0);
      o.initializer.std = GetFloatAttr(op, "init_std", 1.0);
    } else if (init == "fill_constant") {
      o.initializer.kind = SparseTableInitializer::kConstant;
      o.initializer.value = GetFloatAttr(op, "init_value", 0.0);
    } else {
      return absl::InvalidArgumentError(absl::StrCat("table ", t.name, ": initializer '", init,
                                                     "' is not supported for distributed tables"));
    }
    o.initializer.seed = static_cast<uint64_t>(GetIntAttr(op, "init_seed", 0));
    o.optimizer = GetStringAttr(op, "optimizer", "sgd");
    o.l2 = GetFloatAttr(op, "regularization_coeff", 0.0);
    o.adagrad_epsilon = GetFloatAttr(op, "epsilon", 1e-6);
    o.adam_beta1 = GetFloatAttr(op, "beta1", 0.9);
    o.adam_beta2 = GetFloatAttr(op, "beta2", 0.999);
    o.adam_epsilon = GetFloatAttr(op, "epsilon", 1e-8);
    o.admission_threshold = options_.table_admission_threshold;
    o.evict_after_steps = options_.table_evict_after_steps;
    o.max_rows = options_.table_max_rows;
    o.num_shards = TableShards(options_.table_shards);
    auto table = SparseTable::Create(o);
    if (!table.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("distributed table ", t.name, ": ", table.status().message()));
    }
    t.table = std::move(*table);
    table_by_grad_[t.grad] = static_cast<int>(tables_.size());
    table_by_name_[t.name] = static_cast<int>(tables_.size());
    tables_.push_back(std::move(t));
  }
  return absl::OkStatus();
}

float ParameterServer::LearningRate(const std::string& var) const {
  const Variable* v = scope_->FindVar(var);
  if (v == nullptr || !v->Is<Tensor>() || v->Get<Tensor>().numel() < 1) return 0.0f;
  const Tensor& t = v->Get<Tensor>();
  return t.dtype() == FLOAT64 ? static_cast<float>(t.data<double>()[0]) : t.data<float>()[0];
}

absl::Status ParameterServer::ApplyTable(Table& t, const std::vector<const SelectedRows*>& grads,
                                         int64_t step) {
  const float scale = 1.0f / static_cast<float>(num_trainers_);
  // One gradient (async) is applied where it was received; several (sync: one per trainer)
  // are concatenated first, so that duplicates across trainers are summed in trainer order.
  absl::Span<const int64_t> ids;
  const float* values = nullptr;
  std::vector<int64_t> all_ids;
  std::vector<float> all_values;
  if (grads.size() == 1) {
    ids = grads[0]->rows;
    values = grads[0]->value.numel() > 0 ? grads[0]->value.data<float>() : nullptr;
  } else {
    size_t num_ids = 0, num_values = 0;
    for (const SelectedRows* g : grads) {
      num_ids += g->rows.size();
      num_values += static_cast<size_t>(g->value.numel());
    }
    all_ids.reserve(num_ids);
    all_values.resize(num_values);
    float* out = all_values.data();
    for (const SelectedRows* g : grads) {
      all_ids.insert(all_ids.end(), g->rows.begin(), g->rows.end());
      if (g->value.numel() > 0) {
        std::memcpy(out, g->value.data<float>(), g->value.nbytes());
        out += g->value.numel();
      }
    }
    ids = all_ids;
    values = all_values.data();
  }
  absl::Status s = t.table->ApplyGradients(ids, values, LearningRate(t.lr), step, scale);
  if (s.ok() && options_.table_evict_after_steps > 0) t.table->EvictStale();
  if (!s.ok()) {
    return absl::InternalError(
        absl::StrCat("pserver ", options_.endpoint, " table ", t.name, ": ", s.message()));
  }
  return absl::OkStatus();
}

absl::Status ParameterServer::AdmitHeartbeat(const RequestMeta& meta) {
  TS_RETURN_IF_ERROR(CheckJobAndTrainer(meta));
  absl::MutexLock lock(&mu_);
  if (last_beat_.empty()) last_beat_.assign(num_trainers_, absl::InfinitePast());
  last_beat_[meta.trainer_id] = absl::Now();
  return failure_;
}

absl::Status ParameterServer::Admit(const RequestMeta& meta) {
  TS_RETURN_IF_ERROR(CheckJobAndTrainer(meta));
  absl::MutexLock lock(&mu_);
  last_request_ = absl::Now();
  if (first_request_ == absl::InfinitePast()) first_request_ = last_request_;
  if (last_seen_.empty()) last_seen_.assign(num_trainers_, absl::InfinitePast());
  last_seen_[meta.trainer_id] = last_request_;
  return failure_;
}

absl::Status ParameterServer::CheckJobAndTrainer(const RequestMeta& meta) const {
  if (meta.job_id != options_.job_id) {
    return absl::UnauthenticatedError(absl::StrCat(
        "request of job '", meta.job_id, "' refused by pserver of job '", options_.job_id, "'"));
  }
  if (meta.trainer_id < 0 || meta.trainer_id >= num_trainers_) {
    return absl::InvalidArgumentError(
        absl::StrCat("trainer_id ", meta.trainer_id, " is outside [0, ", num_trainers_, ")"));
  }
  return absl::OkStatus();
}

absl::StatusOr<Variable*> ParameterServer::PrepareReceive(const RequestMeta& meta,
                                                          const VariableHeader& h) {
  auto table = table_by_grad_.find(h.name);
  if (table != table_by_grad_.end()) {
    const Table& t = tables_[table->second];
    if (h.type != SELECTED_ROWS || h.dtype != FLOAT32 || h.dims.size() != 2 || h.dims[1] != t.dim) {
      return absl::InvalidArgumentError(absl::StrCat(
          "gradient '", h.name, "' of table ", t.name, " must be float32 sparse rows of width ",
          t.dim, ", got ", DataTypeName(h.dtype), ShapeString(h.dims)));
    }
    absl::MutexLock lock(&mu_);
    if (sync_ && meta.step != barrier_.step()) {
      return absl::FailedPreconditionError(absl::StrCat("trainer ", meta.trainer_id, " sent '",
                                                        h.name, "' for step ", meta.step,
                                                        " but pserver is at step ",
                                                        barrier_.step()));
    }
    Scope* scope = sync_ ? scope_ : trainer_scopes_[meta.trainer_id];
    Variable* var = scope->Var(sync_ ? TrainerGradName(h.name, meta.trainer_id) : h.name);
    SelectedRows* sr = var->GetMutable<SelectedRows>();
    sr->rows.resize(h.num_rows);
    sr->height = h.height;
    sr->value.Resize(h.dtype, h.dims);
    if (sync_) table_grad_step_[{meta.trainer_id, h.name}] = meta.step;
    return var;
  }
  auto it = grad_to_block_.find(h.name);
  if (it == grad_to_block_.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat("pserver ", options_.endpoint, " has no gradient variable '", h.name, "'"));
  }
  const VarDesc* desc = FindVarDesc(program_.blocks(0), h.name);
  std::string target = sync_ ? TrainerGradName(h.name, meta.trainer_id) : h.name;
  Scope* scope = sync_ ? scope_ : trainer_scopes_[meta.trainer_id];
  if (desc != nullptr) {
    Shape want(desc->shape().begin(), desc->shape().end());
    bool sparse = h.type == SELECTED_ROWS;
    if ((desc->type() == SELECTED_ROWS) != sparse) {
      return absl::InvalidArgumentError(
          absl::StrCat("gradient '", h.name, "' must be ", sparse ? "dense" : "sparse"));
    }
    if (h.dtype != desc->dtype()) {
      return absl::InvalidArgumentError(absl::StrCat("gradient '", h.name, "' is ",
                                                     DataTypeName(h.dtype), ", expected ",
                                                     DataTypeName(desc->dtype())));
    }
    bool shape_ok = sparse ? (h.dims.size() == want.size() &&
                              std::equal(h.dims.begin() + 1, h.dims.end(), want.begin() + 1))
                           : h.dims == want;
    if (!shape_ok) {
      return absl::InvalidArgumentError(absl::StrCat("gradient '", h.name, "' has shape ",
                                                     ShapeString(h.dims), ", expected ",
                                                     ShapeString(want)));
    }
  }
  absl::MutexLock lock(&mu_);
  if (sync_ && meta.step != barrier_.step()) {
    return absl::FailedPreconditionError(absl::StrCat("trainer ", meta.trainer_id, " sent '",
                                                      h.name, "' for step ", meta.step,
                                                      " but pserver is at step ", barrier_.step()));
  }
  Variable* var = scope->Var(target);
  if (h.type == SELECTED_ROWS) {
    SelectedRows* sr = var->GetMutable<SelectedRows>();
    sr->rows.resize(h.num_rows);
    sr->height = h.height;
    sr->value.Resize(h.dtype, h.dims);
  } else {
    Tensor* t = var->GetMutable<Tensor>();
    if (!t->initialized() || t->dtype() != h.dtype || t->shape() != h.dims) {
      t->Resize(h.dtype, h.dims);
    }
  }
  return var;
}

void ParameterServer::HandleSend(const RequestMeta& meta, const VariableHeader& h, Variable* var,
                                 DoneCallback done) {
  // Row ids of a sparse gradient of a local (sliced) table must name rows of its block: refuse
  // bad ones here, as bad input and before anything counts them, rather than as an optimizer
  // failure (sync: one that fails the whole step). The received copy is emptied.
  if (SelectedRows* sr = var->GetIf<SelectedRows>();
      sr != nullptr && table_by_grad_.count(h.name) == 0) {
    const VarDesc* desc = FindVarDesc(program_.blocks(0), h.name);
    const int64_t height = desc != nullptr && desc->shape_size() > 0 ? desc->shape(0) : -1;
    for (size_t i = 0; height > 0 && i < sr->rows.size(); ++i) {
      if (sr->rows[i] >= 0 && sr->rows[i] < height) continue;
      absl::Status bad = absl::InvalidArgumentError(
          absl::StrCat("gradient '", h.name, "' has row ", sr->rows[i], " (entry ", i,
                       ") outside [0, ", height, ") on pserver ", options_.endpoint));
      Shape empty = h.dims;
      empty[0] = 0;
      sr->rows.clear();
      sr->value.Resize(h.dtype, empty);
      done(bad);
      return;
    }
  }
  bool complete;
  {
    absl::MutexLock lock(&mu_);
    ++stats_.sends;
    auto& got = bytes_[{meta.trainer_id, h.name}];
    got += h.chunk_bytes;
    complete = got >= h.total_bytes;
    if (complete) {
      got = 0;
      ++stats_.grads_received[meta.trainer_id];
    }
  }
  if (sync_ || !complete) {
    done(absl::OkStatus());
    return;
  }
  std::string grad = h.name;
  int trainer = meta.trainer_id;
  pool_->Schedule(
      [this, trainer, grad, done = std::move(done)] { AsyncApply(trainer, grad, done); });
}

void ParameterServer::AsyncApply(int trainer, const std::string& grad, DoneCallback done) {
  absl::Status s;
  if (has_lr_block_ && grad == lr_clock_grad_) {
    absl::MutexLock lock(&lr_mu_);
    s = executor_.Run(lr_block_, scope_);
  }
  auto table = table_by_grad_.find(grad);
  if (!s.ok()) {
    // the schedule failed: reported below
  } else if (table != table_by_grad_.end()) {
    Table& t = tables_[table->second];
    const SelectedRows& g = trainer_scopes_[trainer]->FindLocalVar(grad)->Get<SelectedRows>();
    absl::MutexLock lock(t.mu.get());  // orders Adam's steps; lookups run concurrently
    s = ApplyTable(t, {&g}, ++t.applies);
  } else {
    OptimizeBlock& b = blocks_[grad_to_block_.at(grad)];
    absl::MutexLock lock(b.mu.get());
    s = executor_.Run(b.prepared, trainer_scopes_[trainer]);
  }
  {
    absl::MutexLock lock(&mu_);
    if (s.ok()) ++stats_.grads_applied;
  }
  if (!s.ok()) {
    s = absl::InternalError(
        absl::StrCat("pserver ", options_.endpoint, " optimizing ", grad, ": ", s.message()));
  }
  done(s);
}

void ParameterServer::ServeGet(const std::string& name, const GetDone& done) {
  Variable* v = scope_->FindVar(name);
  if (v == nullptr || !v->Is<Tensor>() || !v->Get<Tensor>().initialized()) {
    done(absl::NotFoundError(
        absl::StrCat("pserver ", options_.endpoint, " has no parameter '", name, "'")));
    return;
  }
  if (sync_) {
    done(*v);  // shares the buffer: nothing writes it until every trainer fetched
    return;
  }
  Variable copy;
  auto it = param_to_block_.find(name);
  if (it != param_to_block_.end()) {
    absl::MutexLock lock(blocks_[it->second].mu.get());
    copy.GetMutable<Tensor>()->CopyFrom(v->Get<Tensor>());
  } else {
    copy.GetMutable<Tensor>()->CopyFrom(v->Get<Tensor>());
  }
  done(std::move(copy));
}

void ParameterServer::HandleGet(const RequestMeta& meta, const std::string& name, GetDone done) {
  {
    absl::MutexLock lock(&mu_);
    ++stats_.gets;
    if (sync_ && barrier_.optimizing()) {
      pending_gets_.push_back({name, std::move(done)});
      return;
    }
  }
  ServeGet(name, done);
}

void ParameterServer::HandlePrefetch(const RequestMeta& meta, const std::string& table,
                                     std::vector<int64_t> ids, PrefetchDone done) {
  auto it = table_by_name_.find(table);
  if (it == table_by_name_.end()) {
    done(absl::InvalidArgumentError(
        absl::StrCat("pserver ", options_.endpoint, " serves no distributed table '", table, "'")));
    return;
  }
  {
    absl::MutexLock lock(&mu_);
    ++stats_.prefetches;
  }
  Table& t = tables_[it->second];
  Tensor rows(FLOAT32, {static_cast<int64_t>(ids.size()), t.dim});
  absl::Status s = t.table->Lookup(ids, rows.data<float>());
  if (!s.ok()) {
    done(absl::Status(s.code(), absl::StrCat("pserver ", options_.endpoint, " table ", table, ": ",
                                             s.message())));
    return;
  }
  done(std::move(rows));
}

void ParameterServer::HandleCheckpoint(const RequestMeta& meta, const std::string& name,
                                       DoneCallback done) {
  // Least authority: a peer chooses only the step; the directory is this pserver's own.
  if (options_.checkpoint_dir.empty()) {
    done(absl::FailedPreconditionError(absl::StrCat(
        "pserver ", options_.endpoint, " refuses checkpoint ", name,
        ": it has no --checkpoint_dir (give the pservers the trainers' --checkpoint_dir)")));
    return;
  }
  if (io::CheckpointStep(name) < 0) {
    done(absl::InvalidArgumentError(
        absl::StrCat("pserver ", options_.endpoint, " refuses checkpoint '", name,
                     "': not a ckpt-<step> name under its --checkpoint_dir")));
    return;
  }
  const std::string dir = io::JoinPath(options_.checkpoint_dir, name);
  // Saving blocks (file I/O, waiting for an optimization): off the RPC threads.
  checkpoint_pool_->Schedule([this, dir, done = std::move(done)] {
    absl::Status s = SaveCheckpoint(dir);
    if (!s.ok()) {
      s = absl::Status(s.code(), absl::StrCat("pserver ", options_.endpoint, " checkpoint to ", dir,
                                              ": ", s.message()));
    }
    done(s);
  });
}

absl::Status ParameterServer::SaveCheckpoint(const std::string& dir) {
  io::FileSystem* fs = options_.fs != nullptr ? options_.fs : io::PosixFileSystem::Default();
  PserverShardToSave shard;
  shard.index = options_.pserver_index;
  shard.num_pservers = options_.num_pservers;
  shard.slices = DenseSlices(program_, options_.param_blocks);
  {
    absl::MutexLock lock(&mu_);
    auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return (!barrier_.optimizing() && !checkpointing_) || !failure_.ok();
    };
    mu_.Await(absl::Condition(&idle));
    if (!failure_.ok()) return failure_;
    checkpointing_ = true;
    barrier_.Pause();
    shard.step = barrier_.step();
  }
  {
    // Async pushes update a block (parameter and optimizer state) under its mutex: hold them
    // all (in index order; updaters hold one at a time) while copying.
    absl::MutexLock lr_lock(&lr_mu_);
    std::vector<std::unique_ptr<absl::MutexLock>> locks;
    for (auto& b : blocks_) locks.push_back(std::make_unique<absl::MutexLock>(b.mu.get()));
    for (const auto& [name, slice] : shard.slices) {
      const Variable* v = scope_->FindVar(name);
      if (v == nullptr || !v->Is<Tensor>() || !v->Get<Tensor>().initialized()) continue;
      shard.dense[name].CopyFrom(v->Get<Tensor>());
    }
  }
  for (auto& t : tables_) {
    absl::MutexLock lock(t.mu.get());
    shard.tables.push_back({t.name, t.shard, t.table.get(), t.applies});
  }
  absl::Status s = SavePserverShard(fs, dir, shard);
  std::vector<SyncBarrier::Reply> replies;
  {
    absl::MutexLock lock(&mu_);
    checkpointing_ = false;
    // Barrier waits do not count the save; a send barrier may have completed meanwhile.
    replies = Act(barrier_.Resume(absl::Now()));
  }
  for (SyncBarrier::Reply& r : replies) r.done(r.status);
  return s;
}

absl::Status ParameterServer::RestoreCheckpoint(const std::string& dir) {
  io::FileSystem* fs = options_.fs != nullptr ? options_.fs : io::PosixFileSystem::Default();
  PserverRestoreTarget target;
  target.index = options_.pserver_index;
  target.num_pservers = options_.num_pservers;
  target.scope = scope_;
  target.slices = DenseSlices(program_, options_.param_blocks);
  target.table_shard_method = options_.table_shard_method;
  for (auto& t : tables_) target.tables.push_back({t.name, t.shard, t.table.get(), 0});
  TS_ASSIGN_OR_RETURN(PserverRestored restored, RestorePserverShard(fs, dir, target));
  for (auto& t : tables_) {
    t.applies = restored.table_applies[t.name];
    t.table->AdvanceStep(restored.step);
  }
  absl::MutexLock lock(&mu_);
  barrier_.SetStep(restored.step);
  return absl::OkStatus();
}

void ParameterServer::HandleAbort(const RequestMeta& meta, const std::string& reason,
                                  DoneCallback done) {
  // Every other process learns the cause from this, on one line of a readable length (the
  // trainer's own log has it in full).
  constexpr size_t kShownReasonBytes = 200;
  std::string shown = reason;
  if (shown.size() > kShownReasonBytes) {
    shown.resize(kShownReasonBytes - 3);
    shown += "...";
  }
  Fail(absl::AbortedError(
      reason.empty()
          ? absl::StrCat("trainer ", meta.trainer_id,
                         " stopped with an error (its log says why), so pserver ",
                         options_.endpoint, " stops the job")
          : absl::StrCat("trainer ", meta.trainer_id, " stopped with an error, so pserver ",
                         options_.endpoint, " stops the job: ", shown)));
  done(absl::OkStatus());
}

void ParameterServer::HandleBarrier(const RequestMeta& meta, BarrierKind kind, DoneCallback done) {
  if (kind == ABORT) return HandleAbort(meta, "", std::move(done));
  // AdmitHeartbeat noted the time, and answered a failed job with its failure already.
  if (kind == HEARTBEAT) return done(absl::OkStatus());
  std::vector<SyncBarrier::Reply> replies;
  absl::Status abort;
  {
    absl::MutexLock lock(&mu_);
    if (!failure_.ok()) {
      replies.push_back({std::move(done), failure_});
    } else if (kind != SEND_BARRIER && kind != FETCH_BARRIER && kind != COMPLETE) {
      replies.push_back({std::move(done), absl::InvalidArgumentError(absl::StrCat(
                                              "unknown barrier kind ", static_cast<int>(kind)))});
    } else if (kind == COMPLETE) {
      replies = Act(barrier_.Leave(meta.trainer_id, /*completed=*/sync_));
      replies.push_back({std::move(done), absl::OkStatus()});
      if (barrier_.finished()) finished_ = true;
    } else if (!sync_) {  // async: barriers are no-ops
      replies.push_back({std::move(done), absl::OkStatus()});
    } else {
      if (options_.on_barrier_wait) {
        done = [on_wait = &options_.on_barrier_wait, kind, arrival = absl::Now(),
                inner = std::move(done)](absl::Status s) {
          (*on_wait)(kind, absl::Now() - arrival);
          inner(std::move(s));
        };
      }
      if (kind == SEND_BARRIER && meta.last_batch) barrier_.MarkLastBatch(meta.step);
      SyncBarrier::Actions actions = barrier_.Arrive(
          meta.trainer_id, meta.step,
          kind == SEND_BARRIER ? SyncBarrier::Kind::kSend : SyncBarrier::Kind::kFetch,
          std::move(done), absl::Now(), absl::StrCat("pserver ", options_.endpoint));
      abort = actions.fail_job;
      replies = Act(std::move(actions));
    }
  }
  if (!abort.ok()) Fail(abort);
  for (SyncBarrier::Reply& r : replies) r.done(r.status);
}

bool ParameterServer::StepEndsEpoch(int64_t step) {
  absl::MutexLock lock(&mu_);
  return sync_ && barrier_.EndsEpoch(step);
}

void ParameterServer::HandleRegister(const RequestMeta& meta, const JobFields& fields,
                                     uint64_t nonce, DoneCallback done) {
  const std::string me = absl::StrCat("pserver ", options_.endpoint);
  const int k = meta.trainer_id;
  absl::Status mismatch;
  {
    absl::MutexLock lock(&mu_);
    if (!failure_.ok()) return done(failure_);
    auto seen = registered_.find(k);
    if (seen != registered_.end() && seen->second != nonce && sync_) {
      mismatch = absl::FailedPreconditionError(absl::StrCat(
          "job mismatch: trainer ", k, " registered with ", me,
          " twice, from two processes (two trainers started with --trainer_id=", k,
          "? or a trainer restarted without a checkpoint: a sync job cannot take one back)"));
    }
    registered_[k] = nonce;
    std::map<std::string, std::string> sent(fields.begin(), fields.end());
    for (const auto& [name, want] : options_.job_fields) {
      if (!mismatch.ok()) break;
      auto got = sent.find(name);
      if (got == sent.end()) {
        mismatch = absl::FailedPreconditionError(
            absl::StrCat("job mismatch: trainer ", k, " sent no '", name, "' but ", me, " has ",
                         name, "=", want, " (is it an older tessera?)"));
      } else if (got->second != want) {
        mismatch = absl::FailedPreconditionError(absl::StrCat(
            "job mismatch: trainer ", k, " has ", name, "=", got->second, " but ", me, " has ",
            name, "=", want, " (start every process of a job with the same model and flags)"));
      }
      if (got != sent.end()) sent.erase(got);
    }
    for (const auto& [name, value] : sent) {  // fields only trainers know
      if (!mismatch.ok()) break;
      auto first = trainer_fields_.emplace(name, std::make_pair(value, k)).first;
      if (first->second.first != value) {
        mismatch = absl::FailedPreconditionError(absl::StrCat(
            "job mismatch: trainer ", k, " has ", name, "=", value, " but trainer ",
            first->second.second, " has ", name, "=", first->second.first,
            " (the same data, batch size and epochs on every trainer?)"));
      }
    }
  }
  if (!mismatch.ok()) {
    Fail(mismatch);  // every other waiting trainer gets it too: the job cannot go on
    return done(mismatch);
  }
  done(absl::OkStatus());
}

std::vector<SyncBarrier::Reply> ParameterServer::Act(SyncBarrier::Actions actions) {
  if (actions.start_optimize) pool_->Schedule([this] { RunSyncOptimize(); });
  if (actions.step_advanced) ++stats_.steps;
  return std::move(actions.replies);
}

void ParameterServer::RunSyncOptimize() {
  absl::Status lr_status = has_lr_block_ ? executor_.Run(lr_block_, scope_) : absl::OkStatus();
  std::vector<absl::Status> results(blocks_.size());
  pool_->ParallelFor(static_cast<int>(blocks_.size()),
                     [&](int i) { results[i] = executor_.Run(blocks_[i].prepared, scope_); });
  int64_t step;
  std::vector<std::vector<const SelectedRows*>> table_grads(tables_.size());
  {
    absl::MutexLock lock(&mu_);
    step = barrier_.step();
    for (size_t ti = 0; ti < tables_.size(); ++ti) {
      for (int k = 0; k < num_trainers_; ++k) {
        auto at = table_grad_step_.find({k, tables_[ti].grad});
        if (at == table_grad_step_.end() || at->second != step) continue;
        const Variable* v = scope_->FindVar(TrainerGradName(tables_[ti].grad, k));
        if (v != nullptr && v->Is<SelectedRows>())
          table_grads[ti].push_back(&v->Get<SelectedRows>());
      }
    }
  }
  std::vector<absl::Status> table_results(tables_.size());
  pool_->ParallelFor(static_cast<int>(tables_.size()), [&](int i) {
    // Every table takes an optimizer step each sync step (Adam's t), touched rows or not.
    table_results[i] = ApplyTable(tables_[i], table_grads[i], step + 1);
  });
  absl::Status s;
  if (!lr_status.ok()) {
    s = absl::InternalError(absl::StrCat("pserver ", options_.endpoint,
                                         " learning-rate schedule: ", lr_status.message()));
  }
  for (const auto& r : table_results) {
    if (!r.ok() && s.ok()) s = r;
  }
  for (size_t i = 0; i < results.size() && s.ok(); ++i) {
    if (!results[i].ok()) {
      s = absl::InternalError(absl::StrCat("pserver ", options_.endpoint, " optimizing ",
                                           blocks_[i].grad, ": ", results[i].message()));
    }
  }
  std::vector<SyncBarrier::Reply> replies;
  std::vector<PendingGet> gets;
  {
    absl::MutexLock lock(&mu_);
    if (s.ok()) stats_.grads_applied += static_cast<int64_t>(blocks_.size() + tables_.size());
    gets.swap(pending_gets_);
    if (!s.ok() && failure_.ok()) failure_ = s;
    // The send barrier's waiters get `s`; a fetch barrier may complete now too (its other
    // trainers completed meanwhile).
    replies = Act(barrier_.OptimizeDone(s));
  }
  for (SyncBarrier::Reply& r : replies) r.done(r.status);
  for (auto& g : gets) ServeGet(g.name, g.done);
}

void ParameterServer::Fail(absl::Status reason) {
  std::vector<SyncBarrier::Reply> replies;
  std::vector<PendingGet> gets;
  {
    absl::MutexLock lock(&mu_);
    if (failure_.ok()) failure_ = reason;
    replies = barrier_.FailAll(reason).replies;
    gets.swap(pending_gets_);
  }
  for (SyncBarrier::Reply& r : replies) r.done(r.status);
  for (auto& g : gets) g.done(reason);
}

void ParameterServer::Watchdog() {
  while (true) {
    absl::Status timeout;
    {
      absl::MutexLock lock(&mu_);
      auto stop = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_; };
      mu_.AwaitWithTimeout(absl::Condition(&stop), absl::Milliseconds(100));
      if (stopping_) return;
      if (!failure_.ok()) continue;
      // Each trainer on its own: async silence, and in both modes heartbeats that stopped
      // (before the check of silence from everyone, so that trainers dropped after the others
      // completed let the server finish).
      if ((!sync_ || options_.heartbeat_timeout > absl::ZeroDuration()) && !finished_ &&
          first_request_ != absl::InfinitePast()) {
        timeout = CheckSilentTrainers();
      }
      // Nobody ever came.
      if (options_.startup_timeout > absl::ZeroDuration() &&
          first_request_ == absl::InfinitePast() &&
          absl::Now() - created_ > options_.startup_timeout) {
        timeout = absl::DeadlineExceededError(absl::StrCat(
            "pserver ", options_.endpoint, ": no trainer reached it within --startup_timeout_s=",
            absl::ToDoubleSeconds(options_.startup_timeout),
            " (are the trainers running, with this endpoint in their --pservers and the same "
            "TLS settings and job token?)"));
      }
      // Silence from everyone (nobody waits at a barrier, which names the missing instead).
      if (timeout.ok() && !finished_ && !barrier_.finished() &&
          last_request_ != absl::InfinitePast() &&
          absl::Now() - last_request_ > options_.barrier_timeout && !barrier_.optimizing() &&
          barrier_.idle()) {
        timeout = absl::DeadlineExceededError(absl::StrCat(
            "pserver ", options_.endpoint, ": no request from any trainer for ",
            absl::FormatDuration(options_.barrier_timeout), "; trainers ",
            barrier_.MissingFromAll(), " presumed dead (check their logs, then restart the job)"));
      }
      if (timeout.ok()) {
        timeout = barrier_.CheckTimeout(absl::Now(), options_.barrier_timeout,
                                        absl::StrCat("pserver ", options_.endpoint));
      }
    }
    if (!timeout.ok()) Fail(timeout);
  }
}

absl::Status ParameterServer::CheckSilentTrainers() {
  const absl::Time now = absl::Now();
  // `silent`: async trainers that sent no request (heartbeats are none) for barrier_timeout;
  // `lost`: in both modes, trainers that sent heartbeats and then nothing, not even a request,
  // for heartbeat_timeout.
  std::vector<int> lost, silent;
  for (int k : barrier_.active()) {
    // A trainer that never called counts from the first request of any trainer.
    const absl::Time seen = std::max(last_seen_[k], first_request_);
    const absl::Time beat = last_beat_.empty() ? absl::InfinitePast() : last_beat_[k];
    if (!sync_ && now - seen > options_.barrier_timeout) {
      silent.push_back(k);
    } else if (options_.heartbeat_timeout > absl::ZeroDuration() &&
               beat != absl::InfinitePast() &&
               now - std::max(seen, beat) > options_.heartbeat_timeout) {
      lost.push_back(k);
    }
  }
  if (lost.empty() && silent.empty()) return absl::OkStatus();
  // Dropping everyone when no trainer completed would end a job that trained nobody's data
  // to the end: that is a failure whatever the option says.
  const bool nobody_completed = barrier_.active().size() + stats_.trainers_dropped.size() ==
                                static_cast<size_t>(num_trainers_);
  const bool all_silent = lost.size() + silent.size() == barrier_.active().size();
  if (sync_ || !options_.async_drop_silent_trainers || (all_silent && nobody_completed)) {
    std::vector<std::string> parts;
    if (!lost.empty()) {
      parts.push_back(absl::StrCat(
          "trainers [", absl::StrJoin(lost, ", "), "] sent no heartbeat for ",
          absl::FormatDuration(options_.heartbeat_timeout),
          " (the process died, froze or lost its network: see its log and host)"));
    }
    if (!silent.empty()) {
      parts.push_back(absl::StrCat("trainers [", absl::StrJoin(silent, ", "),
                                   "] sent nothing for ",
                                   absl::FormatDuration(options_.barrier_timeout)));
    }
    return absl::DeadlineExceededError(absl::StrCat(
        "pserver ", options_.endpoint, ": ", absl::StrJoin(parts, "; "),
        sync_ ? " (a sync job cannot go on without it)"
        : all_silent && nobody_completed
            ? " and no trainer completed (all dead or stuck)"
            : " (dead or stuck; --async_drop_silent_trainers lets the others go on)"));
  }
  silent.insert(silent.end(), lost.begin(), lost.end());
  for (int k : silent) {
    // Async: no barrier waits, so leaving asks nothing of us.
    (void)barrier_.Leave(k);
    stats_.trainers_dropped.push_back(k);
  }
  if (barrier_.finished()) finished_ = true;
  return absl::OkStatus();
}

absl::Status ParameterServer::Wait() {
  absl::MutexLock lock(&mu_);
  auto done = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return finished_ || !failure_.ok(); };
  mu_.Await(absl::Condition(&done));
  return failure_;
}

absl::StatusOr<int64_t> ParameterServer::ExportTables(const std::string& dir,
                                                      const TableExportOptions& options) {
  int64_t rows = 0;
  for (auto& t : tables_) {
    SparseTableExportOptions eo;
    eo.only_changed = options.only_changed;
    eo.with_optimizer_state = options.with_optimizer_state;
    std::string path = absl::StrCat(dir, "/", t.name, ".shard", t.shard, ".tbl");
    auto n = t.table->Export(path, eo);
    if (!n.ok()) {
      return absl::Status(n.status().code(),
                          absl::StrCat("pserver ", options_.endpoint, " exporting ", path, ": ",
                                       n.status().message()));
    }
    rows += *n;
  }
  return rows;
}

ParameterServerStats ParameterServer::stats() const {
  ParameterServerStats out;
  {
    absl::MutexLock lock(&mu_);
    out = stats_;
  }
  for (const auto& t : tables_) {
    SparseTableStats st = t.table->Stats();
    const int64_t rows = st.rows;
    out.table_rows += rows;
    out.table_refused_rows += st.refused_rows;
    out.table_shard_rows[{t.name, t.shard}] = rows;
  }
  return out;
}

}  // namespace tessera
