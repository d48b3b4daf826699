#include "pserver/applier.h"

#include <algorithm>
#include <cstring>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/framework/op_desc.h"
#include "common/base/status.h"

namespace tessera {

namespace {

int TableShards(int requested) {
  if (requested > 0) return requested;
  const int threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  int shards = 4;
  while (shards < 2 * threads && shards < 64) shards *= 2;
  return shards;
}

// The initializer a sparse_table op describes (attrs init, init_min, ...), or InvalidArgument
// naming `table` and an initializer distributed tables do not support.
absl::StatusOr<SparseTableInitializer> TableInitializer(const OpDesc& op,
                                                        const std::string& table) {
  SparseTableInitializer i;
  const std::string init = GetStringAttr(op, "init", "uniform_random");
  if (init == "uniform_random") {
    i.kind = SparseTableInitializer::kUniform;
    i.min = GetFloatAttr(op, "init_min", -1.0);
    i.max = GetFloatAttr(op, "init_max", 1.0);
  } else if (init == "gaussian_random") {
    i.kind = SparseTableInitializer::kGaussian;
    i.mean = GetFloatAttr(op, "init_mean", 0.0);
    i.std = GetFloatAttr(op, "init_std", 1.0);
  } else if (init == "fill_constant") {
    i.kind = SparseTableInitializer::kConstant;
    i.value = GetFloatAttr(op, "init_value", 0.0);
  } else {
    return absl::InvalidArgumentError(absl::StrCat("table ", table, ": initializer '", init,
                                                   "' is not supported for distributed tables"));
  }
  i.seed = static_cast<uint64_t>(GetIntAttr(op, "init_seed", 0));
  return i;
}

int OptimizeThreads(int requested) {
  if (requested > 0) return requested;
  return static_cast<int>(std::max(2u, std::thread::hardware_concurrency()));
}

}  // namespace

absl::StatusOr<std::unique_ptr<Applier>> Applier::Create(const ProgramDesc& program,
                                                         const OpDesc& listen_and_serv,
                                                         int num_trainers, bool sync,
                                                         Scope* scope, const OpRegistry* registry,
                                                         ApplierOptions options) {
  std::unique_ptr<Applier> a(
      new Applier(program, num_trainers, sync, scope, registry, std::move(options)));
  TS_RETURN_IF_ERROR(a->Init(listen_and_serv));
  return a;
}

Applier::~Applier() { Stop(); }

absl::Status Applier::Init(const OpDesc& ls) {
  for (const auto& entry : GetStringsAttr(ls, "grad_to_block_id")) {
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
  const int64_t lr_block = GetIntAttr(ls, "lr_decay_block_id", -1);
  if (lr_block > 0) {
    if (lr_block >= program_.blocks_size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("listen_and_serv lr_decay_block_id ", lr_block, " does not exist"));
    }
    TS_ASSIGN_OR_RETURN(lr_block_, executor_.Prepare(program_, static_cast<int>(lr_block)));
    has_lr_block_ = true;
    lr_clock_grad_ = !blocks_.empty() ? blocks_[0].grad : (tables_.empty() ? "" : tables_[0].grad);
  }
  for (const auto& b : blocks_) CreateBlockVariables(program_.blocks(b.block_id), scope_);
  pool_ = std::make_unique<ThreadPool>(OptimizeThreads(options_.optimize_threads));
  return absl::OkStatus();
}

absl::Status Applier::InitTables() {
  // Consecutive sparse_table ops of one `group` (member tables: the same ids, one gradient) are
  // one SparseTable holding their columns side by side, in op order.
  const auto& ops = program_.blocks(0).ops();
  for (int i = 0; i < ops.size(); ++i) {
    const OpDesc& op = ops[i];
    if (op.type() != "sparse_table") continue;
    const std::string group = GetStringAttr(op, "group", "");
    int end = i + 1;
    while (!group.empty() && end < ops.size() && ops[end].type() == "sparse_table" &&
           GetStringAttr(ops[end], "group", "") == group) {
      ++end;
    }
    Table t;
    t.name = group.empty() ? GetStringAttr(op, "table", "") : group;
    t.grad = GetStringAttr(op, "grad", "");
    t.lr = GetStringAttr(op, "learning_rate", "");
    t.shard = static_cast<int>(GetIntAttr(op, "shard", 0));
    t.num_shards = static_cast<int>(GetIntAttr(op, "num_shards", 0));
    SparseTableOptions o;
    for (int m = i; m < end; ++m) {
      SparseTableMember member;
      member.name = GetStringAttr(ops[m], "table", "");
      member.dim = GetIntAttr(ops[m], "dim", 0);
      TS_ASSIGN_OR_RETURN(member.initializer, TableInitializer(ops[m], member.name));
      // A group's members share what the one table holding them applies to all.
      for (const char* attr : {"grad", "learning_rate", "optimizer"}) {
        if (GetStringAttr(ops[m], attr, "") != GetStringAttr(op, attr, "")) {
          return absl::InvalidArgumentError(
              absl::StrCat("table ", member.name, " of group ", group, " has another ", attr));
        }
      }
      for (const char* attr : {"shard", "num_shards"}) {
        if (GetIntAttr(ops[m], attr, 0) != GetIntAttr(op, attr, 0)) {
          return absl::InvalidArgumentError(
              absl::StrCat("table ", member.name, " of group ", group, " has another ", attr));
        }
      }
      t.members.push_back(member.name);
      t.dim += member.dim;
      o.members.push_back(std::move(member));
    }
    if (group.empty()) {
      o.initializer = o.members[0].initializer;
      o.members.clear();
    }
    o.dim = t.dim;
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
    // Two lookups per trainer: a lookup of the same ids again (the look-ahead's, after the
    // step's update) or an update by one trainer's gradient of its batch (a sync step with one
    // trainer, whose lookup of step s + 1 comes before the update of s; an async push) takes
    // the rows the lookup found.
    o.remember_lookups = std::min(64, 2 * num_trainers_);
    // Its share of the declared vocabulary (attr rows, of the whole table), as a sizing hint.
    for (int m = i; m < end; ++m) {
      const int64_t rows = GetIntAttr(ops[m], "rows", 0);
      const int64_t shards = std::max(1, t.num_shards);
      if (rows > 0) o.expected_rows = std::max(o.expected_rows, (rows + shards - 1) / shards);
    }
    auto table = SparseTable::Create(o);
    if (!table.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("distributed table ", t.name, ": ", table.status().message()));
    }
    t.table = std::move(*table);
    table_by_grad_[t.grad] = static_cast<int>(tables_.size());
    table_by_name_[t.name] = static_cast<int>(tables_.size());
    tables_.push_back(std::move(t));
    i = end - 1;
  }
  return absl::OkStatus();
}

std::vector<std::string> Applier::dense_gradients() const {
  std::vector<std::string> grads;
  for (const auto& b : blocks_) grads.push_back(b.grad);
  return grads;
}

std::map<std::string, std::pair<std::string, int64_t>> Applier::table_gradients() const {
  std::map<std::string, std::pair<std::string, int64_t>> grads;
  for (const auto& t : tables_) grads[t.grad] = {t.name, t.dim};
  return grads;
}

float Applier::LearningRate(const std::string& var) const {
  const Variable* v = scope_->FindVar(var);
  if (v == nullptr || !v->Is<Tensor>() || v->Get<Tensor>().numel() < 1) return 0.0f;
  const Tensor& t = v->Get<Tensor>();
  return t.dtype() == FLOAT64 ? static_cast<float>(t.data<double>()[0]) : t.data<float>()[0];
}

absl::Status Applier::ApplyTable(Table& t, const std::vector<const SelectedRows*>& grads,
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

absl::Status Applier::ApplyStep(
    int64_t step,
    const std::function<std::vector<const SelectedRows*>(const std::string& grad)>& table_grads,
    const TableHooks& hooks, const std::function<void()>& tables_done) {
  absl::Status lr_status = has_lr_block_ ? RunScheduleOnce(step) : absl::OkStatus();
  // Tables first: lookups of their updated rows can be answered while the blocks run.
  std::vector<std::vector<const SelectedRows*>> grads(tables_.size());
  for (size_t ti = 0; ti < tables_.size(); ++ti) grads[ti] = table_grads(tables_[ti].grad);
  std::vector<absl::Status> table_results(tables_.size());
  // As many threads as the pool has, the caller's included (a gRPC thread that completed the
  // barrier runs the optimize itself): more would share the cores and straggle.
  const int helpers = pool_->size() - 1;
  pool_->ParallelFor(
      static_cast<int>(tables_.size()),
      [&](int i) {
        // Every table takes an optimizer step each sync step (Adam's t), touched rows or not.
        table_results[i] = ApplyTable(tables_[i], grads[i], step + 1);
        if (hooks.after) hooks.after(tables_[i].name);
      },
      helpers);
  const bool tables_ok =
      lr_status.ok() && std::all_of(table_results.begin(), table_results.end(),
                                    [](const absl::Status& r) { return r.ok(); });
  // The blocks start on the pool while this thread runs tables_done (it answers the lookups),
  // then joins them.
  std::vector<absl::Status> results(blocks_.size());
  pool_->ParallelFor(
      static_cast<int>(blocks_.size()),
      [&](int i) { results[i] = ApplyBlockOnce(blocks_[i], step); }, helpers,
      tables_ok ? tables_done : nullptr);
  if (!lr_status.ok()) {
    return absl::InternalError(absl::StrCat("pserver ", options_.endpoint,
                                            " learning-rate schedule: ", lr_status.message()));
  }
  for (const auto& r : table_results) {
    if (!r.ok()) return r;
  }
  for (size_t i = 0; i < results.size(); ++i) {
    if (!results[i].ok()) {
      return absl::InternalError(absl::StrCat("pserver ", options_.endpoint, " optimizing ",
                                              blocks_[i].grad, ": ", results[i].message()));
    }
  }
  return absl::OkStatus();
}

absl::Status Applier::ApplyBlockOnce(OptimizeBlock& b, int64_t step, bool* ran) {
  absl::MutexLock lock(b.mu.get());
  if (b.applied_step < step) {
    b.applied_step = step;
    b.status = executor_.Run(b.prepared, scope_);
    if (ran != nullptr) *ran = true;
  }
  return b.status;
}

absl::Status Applier::RunScheduleOnce(int64_t step) {
  absl::MutexLock lock(&lr_mu_);
  if (lr_step_ < step) {
    lr_step_ = step;
    lr_status_ = executor_.Run(lr_block_, scope_);
  }
  return lr_status_;
}

bool Applier::ApplyEarly(const std::string& grad, int64_t step) {
  auto it = grad_to_block_.find(grad);
  if (it == grad_to_block_.end()) return false;
  // The block reads the step's learning rate. A failed schedule is the step's to report.
  if (has_lr_block_ && !RunScheduleOnce(step).ok()) return false;
  bool ran = false;
  const bool ok = ApplyBlockOnce(blocks_[it->second], step, &ran).ok();  // ApplyStep reports it
  return ran && ok;
}

absl::Status Applier::ApplyPush(const std::string& grad, Scope* trainer_scope) {
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
    const SelectedRows& g = trainer_scope->FindLocalVar(grad)->Get<SelectedRows>();
    absl::MutexLock lock(t.mu.get());  // orders Adam's steps; lookups run concurrently
    s = ApplyTable(t, {&g}, ++t.applies);
  } else {
    OptimizeBlock& b = blocks_[grad_to_block_.at(grad)];
    absl::MutexLock lock(b.mu.get());
    s = executor_.Run(b.prepared, trainer_scope);
  }
  if (!s.ok()) {
    return absl::InternalError(
        absl::StrCat("pserver ", options_.endpoint, " optimizing ", grad, ": ", s.message()));
  }
  return absl::OkStatus();
}

absl::StatusOr<Variable> Applier::Read(const std::string& name) const {
  const Variable* v = scope_->FindVar(name);
  if (v == nullptr || !v->Is<Tensor>() || !v->Get<Tensor>().initialized()) {
    return absl::NotFoundError(
        absl::StrCat("pserver ", options_.endpoint, " has no parameter '", name, "'"));
  }
  if (sync_) return *v;  // shares the buffer: nothing writes it until every trainer fetched
  Variable copy;
  auto it = param_to_block_.find(name);
  if (it != param_to_block_.end()) {
    absl::MutexLock lock(blocks_[it->second].mu.get());
    copy.GetMutable<Tensor>()->CopyFrom(v->Get<Tensor>());
  } else {
    copy.GetMutable<Tensor>()->CopyFrom(v->Get<Tensor>());
  }
  return copy;
}

absl::StatusOr<Tensor> Applier::Lookup(const std::string& table,
                                       const std::vector<int64_t>& ids) {
  Tensor rows;
  TS_RETURN_IF_ERROR(Lookup(table, ids, &rows));
  return rows;
}

absl::Status Applier::Lookup(const std::string& table, const std::vector<int64_t>& ids,
                             Tensor* rows) {
  auto it = table_by_name_.find(table);
  if (it == table_by_name_.end()) {
    return absl::InvalidArgumentError(
        absl::StrCat("pserver ", options_.endpoint, " serves no distributed table '", table, "'"));
  }
  Table& t = tables_[it->second];
  rows->Resize(FLOAT32, {static_cast<int64_t>(ids.size()), t.dim});
  absl::Status s = t.table->Lookup(ids, rows->data<float>());
  if (!s.ok()) {
    return absl::Status(s.code(), absl::StrCat("pserver ", options_.endpoint, " table ", table,
                                               ": ", s.message()));
  }
  return absl::OkStatus();
}

void Applier::CopyDense(const std::map<std::string, DenseSlice>& slices,
                        std::map<std::string, Tensor>* out) {
  // Async pushes update a block (parameter and optimizer state) under its mutex: hold them all
  // (in index order; updaters hold one at a time) while copying.
  absl::MutexLock lr_lock(&lr_mu_);
  std::vector<std::unique_ptr<absl::MutexLock>> locks;
  for (auto& b : blocks_) locks.push_back(std::make_unique<absl::MutexLock>(b.mu.get()));
  for (const auto& [name, slice] : slices) {
    const Variable* v = scope_->FindVar(name);
    if (v == nullptr || !v->Is<Tensor>() || !v->Get<Tensor>().initialized()) continue;
    (*out)[name].CopyFrom(v->Get<Tensor>());
  }
}

std::vector<PserverTableRef> Applier::TableRefs() {
  std::vector<PserverTableRef> refs;
  for (auto& t : tables_) {
    absl::MutexLock lock(t.mu.get());
    // A group's members each as the table of their own that checkpoints and exports name.
    for (size_t m = 0; m < t.members.size(); ++m) {
      refs.push_back({t.members[m], t.shard, t.table.get(), t.applies, t.num_shards,
                      t.members.size() > 1 ? static_cast<int>(m) : -1});
    }
  }
  return refs;
}

void Applier::RestoreTables(const std::map<std::string, int64_t>& applies, int64_t step) {
  {
    absl::MutexLock lock(&lr_mu_);
    lr_step_ = step - 1;
  }
  for (auto& b : blocks_) {
    absl::MutexLock lock(b.mu.get());
    b.applied_step = step - 1;
  }
  for (auto& t : tables_) {
    t.applies = 0;
    for (const std::string& member : t.members) {  // equal unless restored from another job
      auto it = applies.find(member);
      if (it != applies.end()) t.applies = std::max(t.applies, it->second);
    }
    t.table->AdvanceStep(step);
  }
}

absl::StatusOr<int64_t> Applier::ExportTables(const std::string& dir,
                                              const SparseTableExportOptions& options) {
  int64_t rows = 0;
  for (auto& t : tables_) {
    std::vector<std::string> paths;
    for (const std::string& member : t.members) {
      paths.push_back(absl::StrCat(dir, "/", member, ".shard", t.shard, ".tbl"));
    }
    auto n = t.table->ExportMembers(paths, options);
    if (!n.ok()) {
      return absl::Status(n.status().code(),
                          absl::StrCat("pserver ", options_.endpoint, " exporting table ", t.name,
                                       ": ", n.status().message()));
    }
    rows += *n;
  }
  return rows;
}

std::map<std::pair<std::string, int>, int64_t> Applier::TableRows(
    int64_t* refused, int64_t* updates_taking_lookups) const {
  std::map<std::pair<std::string, int>, int64_t> rows;
  for (const auto& t : tables_) {
    SparseTableStats st = t.table->Stats();
    for (const std::string& member : t.members) rows[{member, t.shard}] = st.rows;
    *refused += st.refused_rows;
    *updates_taking_lookups += st.updates_taking_lookups;
  }
  return rows;
}

}  // namespace tessera
