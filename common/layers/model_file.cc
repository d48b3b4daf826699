#include "common/layers/model_file.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/framework/executor.h"
#include "common/layers/optimizer.h"
#include "common/layers/program_builder.h"
#include "common/framework/op_desc.h"
#include "common/framework/program_io.h"
#include "common/framework/scope.h"
#include "common/base/status.h"
#include "common/framework/tensor.h"
#include "google/protobuf/text_format.h"

namespace tessera {

namespace {

// Batch size of the shape check's dry run (2, so that a batch dim cannot pass for a 1).
constexpr int64_t kDryRunBatch = 2;
// Most elements a variable may declare (2^40; beyond it shapes are typos or attacks).
constexpr int64_t kMaxElements = int64_t{1} << 40;
// The dry run is skipped when its tensors would take more than this.
constexpr int64_t kDryRunMaxBytes = int64_t{1} << 30;

// Elements of `shape` with the batch dim counted as kDryRunBatch; -1 if over kMaxElements.
int64_t BoundedElements(const VarDesc& v) {
  int64_t n = 1;
  for (int64_t d : v.shape()) {
    const int64_t dim = d == -1 ? kDryRunBatch : d;
    if (dim < 0) return -1;
    if (dim != 0 && n > kMaxElements / dim) return -1;
    n *= dim;
  }
  return n;
}

// One-line refusals that all start with the file's name.
class Refuser {
 public:
  explicit Refuser(absl::string_view source) : source_(source) {}
  template <typename... Args>
  absl::Status operator()(const Args&... args) const {
    return absl::InvalidArgumentError(absl::StrCat("model file ", source_, ": ", args...));
  }

 private:
  std::string source_;
};

Shape ShapeOfVar(const VarDesc& v) { return Shape(v.shape().begin(), v.shape().end()); }

std::string OpName(const OpDesc& op, int index) {
  return absl::StrCat("op ", index, " (", op.type(), ")");
}

bool IsEmbeddingLookup(const OpDesc& op) { return op.type() == "lookup_table"; }

// Shape with the batch dim (-1) replaced by kDryRunBatch.
Shape DryRunShape(const VarDesc& v) {
  Shape s(v.shape().begin(), v.shape().end());
  for (int64_t& d : s) {
    if (d == -1) d = kDryRunBatch;
  }
  return s;
}

absl::Status CheckFormatVersion(const ModelFile& model, const Refuser& refuse) {
  if (model.format_version() <= 0) {
    return refuse("format_version is ", model.format_version(), "; this build reads version ",
                  kModelFormatVersion, " (set format_version: ", kModelFormatVersion, ")");
  }
  if (model.format_version() > kModelFormatVersion) {
    return refuse("format_version ", model.format_version(), " is newer than this build reads (",
                  kModelFormatVersion, "); use the tessera release that wrote it");
  }
  return absl::OkStatus();
}

// One optimizer's own values; `what` names it in refusals ("optimizer", or "table_optimizers
// 'emb' optimizer"). A table's optimizer may leave learning_rate at 0 (the model's), and has no
// schedule or clipping of its own.
absl::Status CheckOptimizerValues(const OptimizerConfig& o, const std::string& what, bool table,
                                  const Refuser& refuse) {
  static const std::set<std::string> kTypes = {"sgd", "momentum", "adagrad", "adam"};
  if (kTypes.count(o.type()) == 0) {
    return refuse(what, " type '", o.type(), "' is unknown (sgd, momentum, adagrad or adam)");
  }
  if (!std::isfinite(o.learning_rate()) || !(o.learning_rate() > 0 || table) ||
      o.learning_rate() < 0) {
    return refuse(what, " learning_rate ", o.learning_rate(),
                  table ? " must be >= 0 and finite (0: the model's)"
                        : " must be positive and finite");
  }
  if (!(o.l2_decay() >= 0) || !std::isfinite(o.l2_decay())) {
    return refuse(what, " l2_decay ", o.l2_decay(), " must be >= 0");
  }
  if (!(o.clip_global_norm() >= 0) || !std::isfinite(o.clip_global_norm())) {
    return refuse(what, " clip_global_norm ", o.clip_global_norm(), " must be >= 0 and finite");
  }
  if (table && (o.decay_steps() != 0 || o.clip_global_norm() != 0)) {
    return refuse(what, " sets ", o.decay_steps() != 0 ? "decay_steps" : "clip_global_norm",
                  ": a table has no schedule or clipping of its own (the model's optimizer sets "
                  "them for every parameter)");
  }
  if (o.decay_steps() < 0) return refuse(what, " decay_steps ", o.decay_steps(), " < 0");
  if (o.decay_steps() > 0 && !(o.decay_rate() > 0 && std::isfinite(o.decay_rate()))) {
    return refuse(what, " decay_rate ", o.decay_rate(), " must be positive with decay_steps");
  }
  if (!(o.momentum() >= 0 && o.momentum() < 1)) {
    return refuse(what, " momentum ", o.momentum(), " must be in [0, 1)");
  }
  for (float beta : {o.beta1(), o.beta2()}) {
    if (!(beta >= 0 && beta < 1)) return refuse(what, " beta ", beta, " must be in [0, 1)");
  }
  if (!(o.epsilon() >= 0) || !std::isfinite(o.epsilon())) {
    return refuse(what, " epsilon ", o.epsilon(), " must be >= 0");
  }
  return absl::OkStatus();
}

// The model's optimizer, each table's, and that every distributed table's optimizer is one the
// pservers' tables implement.
absl::Status CheckOptimizers(const ModelFile& model, const Refuser& refuse) {
  const BlockDesc& forward = model.forward().blocks(0);
  TS_RETURN_IF_ERROR(CheckOptimizerValues(model.optimizer(), "optimizer", false, refuse));
  std::set<std::string> tables;  // the W of every embedding lookup
  for (const OpDesc& op : forward.ops()) {
    if (IsEmbeddingLookup(op)) tables.insert(OpInput(op, "W"));
  }
  std::map<std::string, std::string> type_of;  // table -> its own optimizer's type
  for (const TableOptimizer& t : model.table_optimizers()) {
    const std::string what = absl::StrCat("table_optimizers '", t.table(), "'");
    if (tables.count(t.table()) == 0) {
      return refuse(what, " names no embedding table (the W of a lookup_table op)");
    }
    if (!type_of.emplace(t.table(), t.optimizer().type()).second) {
      return refuse(what, " is given twice");
    }
    TS_RETURN_IF_ERROR(CheckOptimizerValues(t.optimizer(), what + " optimizer", true, refuse));
  }
  // Tables on the pservers are updated by SparseTable, which knows sgd, adagrad and adam.
  for (const VarDesc& v : forward.vars()) {
    if (!v.is_distributed()) continue;
    auto own = type_of.find(v.name());
    const std::string& type = own == type_of.end() ? model.optimizer().type() : own->second;
    if (type == "momentum") {
      return refuse("optimizer 'momentum' cannot update distributed table '", v.name(),
                    "' (distributed tables support sgd, adagrad and adam)");
    }
  }
  return absl::OkStatus();
}

// Ops known and forward-only; every variable declared, read only after it is written (or fed,
// or a parameter); parameters with positive dims and an initializer.
absl::Status CheckGraph(const ModelFile& model, const OpRegistry& registry,
                        const std::set<std::string>& fed, const Refuser& refuse) {
  const BlockDesc& block = model.forward().blocks(0);
  std::map<std::string, int> first_writer;  // var -> index of the first op writing it
  for (int i = 0; i < block.ops_size(); ++i) {
    for (const std::string& out : AllOutputArgs(block.ops(i))) first_writer.emplace(out, i);
  }
  std::set<std::string> available = fed;
  for (const VarDesc& v : block.vars()) {
    if (v.persistable()) available.insert(v.name());
  }
  for (int i = 0; i < block.ops_size(); ++i) {
    const OpDesc& op = block.ops(i);
    if (registry.Find(op.type()) == nullptr) {
      return refuse(OpName(op, i), ": unknown op type '", op.type(), "'");
    }
    const int64_t role = GetIntAttr(op, kOpRoleAttr, kRoleForward);
    if ((role & (kRoleBackward | kRoleOptimize | kRoleRPC | kRoleDist)) != 0) {
      return refuse(OpName(op, i), " has op_role ", role,
                    "; a model file holds forward ops only (backward and optimizer ops are added "
                    "when it is loaded)");
    }
    for (const std::string& in : AllInputArgs(op)) {
      if (in == kEmptyVarName) continue;
      if (FindVarDesc(block, in) == nullptr) {
        return refuse(OpName(op, i), " reads '", in, "', which the forward program does not declare");
      }
      if (available.count(in)) continue;
      auto w = first_writer.find(in);
      if (w == first_writer.end()) {
        return refuse(OpName(op, i), " reads '", in,
                      "', which no op writes and no feed binds (add a feed for it)");
      }
      return refuse("cycle: ", OpName(op, i), " reads '", in, "', which ",
                    OpName(block.ops(w->second), w->second), " writes later");
    }
    for (const std::string& out : AllOutputArgs(op)) {
      if (out == kEmptyVarName) continue;
      if (FindVarDesc(block, out) == nullptr) {
        return refuse(OpName(op, i), " writes '", out,
                      "', which the forward program does not declare");
      }
      if (fed.count(out)) return refuse(OpName(op, i), " writes feed '", out, "'");
      available.insert(out);
    }
  }
  std::set<std::string> initialized;
  if (model.startup().blocks_size() > 0) {
    const BlockDesc& startup = model.startup().blocks(0);
    for (int i = 0; i < startup.ops_size(); ++i) {
      const OpDesc& op = startup.ops(i);
      if (registry.Find(op.type()) == nullptr) {
        return refuse("startup ", OpName(op, i), ": unknown op type '", op.type(), "'");
      }
      for (const std::string& out : AllOutputArgs(op)) initialized.insert(out);
    }
  }
  for (const OpDesc& op : block.ops()) {
    if (!IsEmbeddingLookup(op)) continue;
    const VarDesc* w = FindVarDesc(block, OpInput(op, "W"));
    if (w == nullptr || w->shape_size() != 2) {
      return refuse("embedding '", OpInput(op, "W"), "' must be a [rows, dim] parameter");
    }
    if (w->shape(1) < 1) return refuse("embedding '", w->name(), "' has dim ", w->shape(1));
    if (w->shape(0) < 1) return refuse("embedding '", w->name(), "' has ", w->shape(0), " rows");
  }
  for (const VarDesc& v : block.vars()) {
    if (BoundedElements(v) < 0) {
      return refuse("variable '", v.name(), "' has shape ", ShapeString(ShapeOfVar(v)),
                    ": a dim below -1 (the batch), or more than 2^40 elements");
    }
    if (!v.persistable()) continue;
    for (int64_t d : v.shape()) {
      if (d < 1) {
        return refuse("parameter '", v.name(), "' has shape ", ShapeString(ShapeOfVar(v)),
                      "; every dim of a parameter must be >= 1");
      }
    }
    if (initialized.count(v.name()) == 0) {
      return refuse("parameter '", v.name(), "' has no initializer in the startup program");
    }
  }
  return absl::OkStatus();
}

absl::Status CheckFeeds(const ModelFile& model, std::set<std::string>* fed,
                        const Refuser& refuse) {
  const BlockDesc& block = model.forward().blocks(0);
  int dense = 0, labels = 0;
  std::set<int> slots, multi_slots;
  for (const FeedBinding& f : model.feeds()) {
    const VarDesc* v = FindVarDesc(block, f.var());
    if (v == nullptr) return refuse("feed '", f.var(), "' names no variable of the forward program");
    if (v->persistable()) return refuse("feed '", f.var(), "' is a parameter");
    if (!fed->insert(f.var()).second) return refuse("feed '", f.var(), "' is bound twice");
    const std::string shape = ShapeString(ShapeOfVar(*v));
    const bool batch_first = v->shape_size() >= 1 && v->shape(0) == -1;
    switch (f.source()) {
      case FeedBinding::DENSE:
        if (++dense > 1) return refuse("feed '", f.var(), "': a second DENSE feed (one holds all)");
        if (v->dtype() != FLOAT32 || v->shape_size() != 2 || !batch_first || v->shape(1) < 1) {
          return refuse("DENSE feed '", f.var(), "' is ", DataTypeName(v->dtype()), " ", shape,
                        "; it must be float32 [-1, num_dense]");
        }
        break;
      case FeedBinding::SLOT:
      case FeedBinding::MULTI_SLOT: {
        const bool multi = f.source() == FeedBinding::MULTI_SLOT;
        const char* slot_kind = multi ? "multi-hot slot " : "slot ";
        if (f.slot() < 0) return refuse("feed '", f.var(), "': ", slot_kind, f.slot(), " < 0");
        if (!(multi ? multi_slots : slots).insert(f.slot()).second) {
          return refuse("feed '", f.var(), "': ", slot_kind, f.slot(), " is bound twice");
        }
        if (f.id_modulo() < 0) {
          return refuse("feed '", f.var(), "': id_modulo ", f.id_modulo(), " < 0");
        }
        if (v->dtype() != INT64 || v->shape_size() != 2 || !batch_first || v->shape(1) != 1) {
          return refuse(multi ? "MULTI_SLOT" : "SLOT", " feed '", f.var(), "' is ",
                        DataTypeName(v->dtype()), " ", shape, "; it must be int64 [-1, 1]",
                        multi ? " (the ids of all examples)" : "");
        }
        break;
      }
      case FeedBinding::LABEL:
        if (++labels > 1) return refuse("feed '", f.var(), "': a second LABEL feed");
        if ((v->dtype() != FLOAT32 && v->dtype() != FLOAT64 && v->dtype() != INT64) ||
            v->shape_size() != 2 || !batch_first || v->shape(1) != 1) {
          return refuse("LABEL feed '", f.var(), "' is ", DataTypeName(v->dtype()), " ", shape,
                        "; it must be float32, float64 or int64 [-1, 1]");
        }
        break;
      default:
        return refuse("feed '", f.var(), "' has unknown source ", static_cast<int>(f.source()));
    }
  }
  if (labels == 0) return refuse("no LABEL feed");
  // The trainer feeds Example::sparse[i] (::multi[i]) to the i-th slot: slots must be 0..n-1.
  for (const auto& [kind, bound] :
       {std::make_pair("SLOT", &slots), std::make_pair("MULTI_SLOT", &multi_slots)}) {
    int expect = 0;
    for (int s : *bound) {
      if (s != expect) {
        return refuse(kind, " feeds must bind slots 0..", bound->size() - 1,
                      " with none missing; slot ", expect, " is not bound");
      }
      ++expect;
    }
  }
  return absl::OkStatus();
}

absl::Status CheckOutputs(const ModelFile& model, const Refuser& refuse) {
  const BlockDesc& block = model.forward().blocks(0);
  auto written = [&](const std::string& name) {
    for (const OpDesc& op : block.ops()) {
      for (const std::string& out : AllOutputArgs(op)) {
        if (out == name) return true;
      }
    }
    return false;
  };
  if (model.loss().empty()) return refuse("no loss variable");
  const VarDesc* loss = FindVarDesc(block, model.loss());
  if (loss == nullptr || !written(model.loss())) {
    return refuse("loss '", model.loss(), "' is not written by any forward op");
  }
  const Shape loss_shape = ShapeOfVar(*loss);
  if (loss->dtype() != FLOAT32 || loss_shape.size() > 1 || NumElements(loss_shape) != 1) {
    return refuse("loss '", model.loss(), "' is ", DataTypeName(loss->dtype()), " ",
                  ShapeString(loss_shape), "; it must be a float32 scalar [1] (take its mean)");
  }
  if (!model.prediction().empty()) {
    const VarDesc* p = FindVarDesc(block, model.prediction());
    if (p == nullptr || !written(model.prediction())) {
      return refuse("prediction '", model.prediction(), "' is not written by any forward op");
    }
  }
  for (const std::string& m : model.metrics()) {
    if (std::none_of(std::begin(kModelMetrics), std::end(kModelMetrics),
                     [&](const char* k) { return m == k; })) {
      return refuse("metric '", m, "' is unknown (auc, log_loss, accuracy or mse)");
    }
    if ((m == "auc" || m == "log_loss") && model.prediction().empty()) {
      return refuse("metric '", m, "' needs a prediction variable");
    }
  }
  return absl::OkStatus();
}

// Runs a batch of kDryRunBatch zero examples through the forward program with zero
// parameters (embedding tables with one row: every id fed is 0) and compares each variable's
// shape with its declaration.
absl::Status DryRun(const ModelFile& model, const OpRegistry& registry, const Refuser& refuse) {
  const BlockDesc& block = model.forward().blocks(0);
  std::set<std::string> tables;
  for (const OpDesc& op : block.ops()) {
    if (IsEmbeddingLookup(op)) tables.insert(OpInput(op, "W"));
  }
  int64_t bytes = 0;
  for (const VarDesc& v : block.vars()) {
    const int64_t n = tables.count(v.name()) && v.shape_size() == 2 ? v.shape(1) : BoundedElements(v);
    bytes += n * static_cast<int64_t>(SizeOf(v.dtype()));
    if (bytes > kDryRunMaxBytes) return absl::OkStatus();
  }
  Scope scope;
  auto zeros = [&](const VarDesc& v, Shape shape) {
    Tensor* t = scope.Var(v.name())->GetMutable<Tensor>();
    t->Resize(v.dtype(), std::move(shape));
    if (t->nbytes() > 0) std::memset(t->raw_data(), 0, t->nbytes());
  };
  std::set<std::string> inputs, sequences;
  for (const FeedBinding& f : model.feeds()) {
    inputs.insert(f.var());
    if (f.source() == FeedBinding::MULTI_SLOT) sequences.insert(f.var());
  }
  for (const VarDesc& v : block.vars()) {
    if (v.persistable()) {
      Shape s = ShapeOfVar(v);
      if (tables.count(v.name())) s[0] = 1;
      zeros(v, s);
    } else if (inputs.count(v.name())) {
      zeros(v, DryRunShape(v));
      // A multi-hot slot: one id per example.
      if (sequences.count(v.name())) {
        std::vector<int64_t> lod(kDryRunBatch + 1);
        for (int64_t i = 0; i <= kDryRunBatch; ++i) lod[i] = i;
        scope.Var(v.name())->GetMutable<Tensor>()->set_lod(std::move(lod));
      }
    }
  }
  Executor executor(&registry);
  for (int i = 0; i < block.ops_size(); ++i) {
    const OpDesc& op = block.ops(i);
    absl::Status s = executor.RunOp(op, &scope);
    if (!s.ok()) {
      return refuse("shape check (a batch of ", kDryRunBatch, " through the forward program): ",
                    OpName(op, i), ": ", s.message());
    }
    for (const std::string& out : AllOutputArgs(op)) {
      const VarDesc* v = FindVarDesc(block, out);
      const Variable* var = scope.FindVar(out);
      if (v == nullptr || var == nullptr || !var->Is<Tensor>() || v->shape_size() == 0) continue;
      const Tensor& t = var->Get<Tensor>();
      const Shape want = DryRunShape(*v);
      if (t.shape() != want) {
        return refuse("shape mismatch: '", out, "' is declared ", ShapeString(ShapeOfVar(*v)),
                      " but ", OpName(op, i), " makes it ", ShapeString(t.shape()),
                      " for a batch of ", kDryRunBatch);
      }
    }
  }
  return absl::OkStatus();
}

std::unique_ptr<Optimizer> MakeOptimizer(const OptimizerConfig& c) {
  OptimizerOptions o;
  o.learning_rate = c.learning_rate();
  o.l2_decay = c.l2_decay();
  o.decay_steps = c.decay_steps();
  o.decay_rate = c.decay_steps() > 0 ? c.decay_rate() : 1.0f;
  o.staircase = c.staircase();
  o.clip_global_norm = c.clip_global_norm();
  if (c.type() == "momentum") {
    return std::make_unique<Momentum>(o, c.has_momentum() ? c.momentum() : 0.9f, c.nesterov());
  }
  if (c.type() == "adam") {
    return std::make_unique<Adam>(o, c.has_beta1() ? c.beta1() : 0.9f,
                                  c.has_beta2() ? c.beta2() : 0.999f,
                                  c.has_epsilon() ? c.epsilon() : 1e-8f);
  }
  if (c.type() == "adagrad") {
    return std::make_unique<Adagrad>(o, c.has_epsilon() ? c.epsilon() : 1e-6f);
  }
  return std::make_unique<SGD>(o);
}

}  // namespace

absl::StatusOr<ModelFile> ParseModelText(absl::string_view text, absl::string_view source) {
  ModelFile model;
  TS_RETURN_IF_ERROR(ParseTextMessage(text, source, &model));
  TS_RETURN_IF_ERROR(CheckProgramStrings(model.forward(), source));
  TS_RETURN_IF_ERROR(CheckProgramStrings(model.startup(), source));
  return model;
}

absl::StatusOr<ModelFile> ReadModelFile(const std::string& path) {
  TS_ASSIGN_OR_RETURN(std::string text, ReadFileToString(path));
  return ParseModelText(text, path);
}

std::string ModelToText(const ModelFile& model) {
  std::string out;
  google::protobuf::TextFormat::PrintToString(model, &out);
  return out;
}

absl::Status WriteModelFile(const ModelFile& model, const std::string& path) {
  return WriteStringToFileAtomic(path, ModelToText(model));
}

ModelFile ApplyOverrides(ModelFile model, const ModelOverrides& overrides) {
  if (overrides.learning_rate > 0) {
    model.mutable_optimizer()->set_learning_rate(overrides.learning_rate);
  }
  if (overrides.single_machine && model.forward().blocks_size() > 0) {
    BlockDesc* block = model.mutable_forward()->mutable_blocks(0);
    std::map<std::string, int64_t> rows_of_ids;  // ids variable -> rows of its local table
    for (OpDesc& op : *block->mutable_ops()) {
      if (!IsEmbeddingLookup(op) || !GetBoolAttr(op, "is_distributed", false)) continue;
      SetAttr(&op, "is_distributed", false);
      for (VarDesc& v : *block->mutable_vars()) {
        if (v.name() != OpInput(op, "W")) continue;
        v.set_is_distributed(false);
        if (v.shape_size() == 2) rows_of_ids[OpInput(op, "Ids")] = v.shape(0);
      }
    }
    for (FeedBinding& f : *model.mutable_feeds()) {
      auto it = rows_of_ids.find(f.var());
      const bool slot = f.source() == FeedBinding::SLOT || f.source() == FeedBinding::MULTI_SLOT;
      if (slot && it != rows_of_ids.end() && f.id_modulo() == 0) {
        f.set_id_modulo(it->second);
      }
    }
    return model;
  }
  if (overrides.distributed_tables && model.forward().blocks_size() > 0) {
    BlockDesc* block = model.mutable_forward()->mutable_blocks(0);
    std::set<std::string> ids;
    for (OpDesc& op : *block->mutable_ops()) {
      if (!IsEmbeddingLookup(op)) continue;
      SetAttr(&op, "is_sparse", true);
      SetAttr(&op, "is_distributed", true);
      ids.insert(OpInput(op, "Ids"));
      for (VarDesc& v : *block->mutable_vars()) {
        if (v.name() != OpInput(op, "W")) continue;
        v.set_is_sparse(true);
        v.set_is_distributed(true);
      }
    }
    for (FeedBinding& f : *model.mutable_feeds()) {
      const bool slot = f.source() == FeedBinding::SLOT || f.source() == FeedBinding::MULTI_SLOT;
      if (slot && ids.count(f.var())) f.set_id_modulo(0);
    }
  }
  return model;
}

absl::Status CheckModelStructure(const ModelFile& model, const OpRegistry& registry,
                                 absl::string_view source) {
  const Refuser refuse(source);
  TS_RETURN_IF_ERROR(CheckFormatVersion(model, refuse));
  if (model.forward().blocks_size() != 1) {
    return refuse("the forward program has ", model.forward().blocks_size(),
                  " blocks; it must have exactly one");
  }
  if (model.startup().blocks_size() > 1) {
    return refuse("the startup program has ", model.startup().blocks_size(), " blocks (max 1)");
  }
  std::set<std::string> fed;
  TS_RETURN_IF_ERROR(CheckFeeds(model, &fed, refuse));
  TS_RETURN_IF_ERROR(CheckGraph(model, registry, fed, refuse));
  TS_RETURN_IF_ERROR(CheckOutputs(model, refuse));
  return CheckOptimizers(model, refuse);
}

absl::Status ValidateModel(const ModelFile& model, const OpRegistry& registry,
                           absl::string_view source) {
  TS_RETURN_IF_ERROR(CheckModelStructure(model, registry, source));
  return DryRun(model, registry, Refuser(source));
}

absl::StatusOr<ModelSpec> CompileModel(const ModelFile& model, const OpRegistry& registry,
                                       absl::string_view source) {
  TS_RETURN_IF_ERROR(ValidateModel(model, registry, source));
  ModelSpec spec;
  spec.main = model.forward();
  spec.startup = model.startup();
  ProgramBuilder b(&spec.main, &spec.startup);
  std::unique_ptr<Optimizer> optimizer = MakeOptimizer(model.optimizer());
  for (const TableOptimizer& t : model.table_optimizers()) {
    optimizer->SetParamOptimizer(t.table(), MakeOptimizer(t.optimizer()));
  }
  absl::Status minimized = optimizer->Minimize(b, registry, model.loss()).status();
  if (!minimized.ok()) {
    return absl::InvalidArgumentError(
        absl::StrCat("model file ", source, ": backward/optimizer: ", minimized.message()));
  }
  spec.loss = model.loss();
  spec.prediction = model.prediction();
  spec.metrics.assign(model.metrics().begin(), model.metrics().end());
  const BlockDesc& block = model.forward().blocks(0);
  std::map<int, SlotFeed> slots, multi_slots;
  for (const FeedBinding& f : model.feeds()) {
    const VarDesc* v = FindVarDesc(block, f.var());
    switch (f.source()) {
      case FeedBinding::DENSE:
        spec.feeds.dense = f.var();
        spec.feeds.num_dense = static_cast<int>(v->shape(1));
        break;
      case FeedBinding::SLOT:
        slots[f.slot()] = SlotFeed{f.var(), f.id_modulo()};
        break;
      case FeedBinding::MULTI_SLOT:
        multi_slots[f.slot()] = SlotFeed{f.var(), f.id_modulo()};
        break;
      default:
        spec.feeds.label = f.var();
        spec.feeds.label_dtype = v->dtype();
        break;
    }
  }
  for (auto& [index, slot] : slots) spec.feeds.slots.push_back(std::move(slot));
  for (auto& [index, slot] : multi_slots) spec.feeds.multi_slots.push_back(std::move(slot));
  return spec;
}

ModelFile MakeModelFile(ModelParts parts) {
  ModelFile model;
  model.set_format_version(kModelFormatVersion);
  *model.mutable_forward() = std::move(parts.forward);
  *model.mutable_startup() = std::move(parts.startup);
  const FeedSpec& f = parts.feeds;
  if (!f.dense.empty()) {
    FeedBinding* b = model.add_feeds();
    b->set_var(f.dense);
    b->set_source(FeedBinding::DENSE);
  }
  for (size_t s = 0; s < f.slots.size(); ++s) {
    FeedBinding* b = model.add_feeds();
    b->set_var(f.slots[s].name);
    b->set_source(FeedBinding::SLOT);
    b->set_slot(static_cast<int>(s));
    b->set_id_modulo(f.slots[s].dict_size);
  }
  for (size_t s = 0; s < f.multi_slots.size(); ++s) {
    FeedBinding* b = model.add_feeds();
    b->set_var(f.multi_slots[s].name);
    b->set_source(FeedBinding::MULTI_SLOT);
    b->set_slot(static_cast<int>(s));
    b->set_id_modulo(f.multi_slots[s].dict_size);
  }
  if (!f.label.empty()) {
    FeedBinding* b = model.add_feeds();
    b->set_var(f.label);
    b->set_source(FeedBinding::LABEL);
  }
  model.set_loss(std::move(parts.loss));
  model.set_prediction(std::move(parts.prediction));
  for (std::string& m : parts.metrics) model.add_metrics(std::move(m));
  *model.mutable_optimizer() = std::move(parts.optimizer);
  return model;
}

}  // namespace tessera
