#include "serving/predictor.h"

#include <chrono>
#include <cstring>
#include <set>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "common/base/status.h"
#include "common/framework/op_desc.h"
#include "common/framework/params_io.h"
#include "common/framework/tensor.h"
#include "common/io/checkpoint_io.h"
#include "common/ops/ops.h"

namespace tessera {

namespace {

constexpr int64_t kNoPadding = -1;

// bundle_lookup: Out[i, :] = the row of Ids[i] in the table named by attr "table" (its initial
// values for an id the table does not hold; zeros where Ids[i] == padding_idx). Ids [N, 1] or
// [N] (generally [..., 1] or [...]) gives Out [N, dim] ([..., dim]); Out keeps the LoD of Ids.
absl::Status BundleLookup(const BundleTables& tables, OpContext& ctx) {
  const std::string name = ctx.StringAttr("table");
  auto it = tables.find(name);
  if (it == tables.end() || it->second == nullptr) {
    return ctx.Error(absl::StrCat("the bundle holds no table '", name, "'"));
  }
  const SparseTable& table = *it->second;
  TS_ASSIGN_OR_RETURN(const Tensor* ids, ctx.Input("Ids"));
  TS_RETURN_IF_ERROR(ctx.CheckDType("Ids", *ids, INT64));
  const int64_t dim = table.options().dim;
  Shape shape = ids->shape();
  if (shape.size() > 1 && shape.back() == 1) shape.pop_back();
  shape.push_back(dim);
  TS_ASSIGN_OR_RETURN(Tensor * out, ctx.Output("Out"));
  if (out == ids) return ctx.Error("Out must not be Ids");
  out->Resize(FLOAT32, std::move(shape));
  out->set_lod(ids->lod());
  const int64_t n = ids->numel();
  const int64_t* id = ids->data<int64_t>();
  float* o = out->data<float>();
  absl::Status s = table.LookupReadOnly(absl::Span<const int64_t>(id, static_cast<size_t>(n)), o);
  if (!s.ok()) return ctx.Error(absl::StrCat("table '", name, "': ", s.message()));
  const int64_t padding_idx = ctx.IntAttr("padding_idx", kNoPadding);
  if (padding_idx != kNoPadding) {
    for (int64_t i = 0; i < n; ++i) {
      if (id[i] == padding_idx) std::memset(o + i * dim, 0, sizeof(float) * dim);
    }
  }
  return absl::OkStatus();
}

bool IsDistributedLookup(const BlockDesc& block, const OpDesc& op) {
  if (op.type() != "lookup_table") return false;
  if (GetBoolAttr(op, "is_distributed", false)) return true;
  const VarDesc* w = FindVarDesc(block, OpInput(op, "W"));
  return w != nullptr && w->is_distributed();
}

// The variables that feed the model's examples.
std::set<std::string> FeedNames(const FeedSpec& feeds) {
  std::set<std::string> names;
  if (!feeds.dense.empty()) names.insert(feeds.dense);
  for (const SlotFeed& s : feeds.slots) names.insert(s.name);
  for (const SlotFeed& s : feeds.multi_slots) names.insert(s.name);
  if (!feeds.label.empty()) names.insert(feeds.label);
  return names;
}

// Declares the feeds that `block` does not use (the score ops may leave a feed unread), so that
// the trainer's feeder, which checks every feed's declaration, accepts the program.
void DeclareUnusedFeeds(const FeedSpec& feeds, BlockDesc* block) {
  auto declare = [&](const std::string& name, DataType dtype, int64_t width) {
    if (name.empty() || FindVarDesc(*block, name) != nullptr) return;
    VarDesc* v = block->add_vars();
    v->set_name(name);
    v->add_shape(-1);
    v->add_shape(width);
    v->set_dtype(dtype);
  };
  declare(feeds.dense, FLOAT32, feeds.num_dense);
  for (const SlotFeed& s : feeds.slots) declare(s.name, INT64, 1);
  for (const SlotFeed& s : feeds.multi_slots) declare(s.name, INT64, 1);
  declare(feeds.label, feeds.label_dtype, 1);
}

// InvalidArgument naming the first variable that an op of `program` reads before any op
// produces it, that is no feed and that `params` lacks.
absl::Status CheckInputs(const ProgramDesc& program, const FeedSpec& feeds,
                         const std::map<std::string, Tensor>& params,
                         const std::string& program_path, const std::string& params_path) {
  std::set<std::string> available = FeedNames(feeds);
  for (const OpDesc& op : program.blocks(0).ops()) {
    for (const std::string& in : AllInputArgs(op)) {
      if (in.empty() || in == kEmptyVarName || available.count(in) > 0 || params.count(in) > 0) {
        continue;
      }
      return absl::InvalidArgumentError(
          absl::StrCat(program_path, ": op ", op.type(), " reads variable '", in,
                       "', which no op before it produces, no feed provides and ", params_path,
                       " does not hold"));
    }
    for (const std::string& out : AllOutputArgs(op)) available.insert(out);
  }
  return absl::OkStatus();
}

}  // namespace

std::map<std::string, int64_t> RewriteDistributedLookups(ProgramDesc* program) {
  std::map<std::string, int64_t> tables;
  if (program->blocks_size() == 0) return tables;
  BlockDesc* block = program->mutable_blocks(0);
  for (OpDesc& op : *block->mutable_ops()) {
    if (!IsDistributedLookup(*block, op)) continue;
    const std::string w = OpInput(op, "W");
    int64_t dim = -1;
    const VarDesc* wd = FindVarDesc(*block, w);
    if (wd != nullptr && wd->shape_size() == 2 && wd->shape(1) > 0) dim = wd->shape(1);
    tables.emplace(w, dim);
    OpDesc lookup =
        MakeOp(kBundleLookupOp, {{"Ids", {OpInput(op, "Ids")}}}, {{"Out", {OpOutput(op, "Out")}}});
    *lookup.mutable_attrs() = op.attrs();  // padding_idx, the op role
    SetAttr(&lookup, "table", w);
    op = std::move(lookup);
  }
  // The tables' declarations go, unless another op still reads one (the input check then names
  // it: its rows are in no dense parameter).
  std::set<std::string> read;
  for (const OpDesc& op : block->ops()) {
    for (const std::string& in : AllInputArgs(op)) read.insert(in);
  }
  google::protobuf::RepeatedPtrField<VarDesc> kept;
  for (VarDesc& v : *block->mutable_vars()) {
    if (tables.count(v.name()) > 0 && read.count(v.name()) == 0) continue;
    *kept.Add() = std::move(v);
  }
  block->mutable_vars()->Swap(&kept);
  return tables;
}

absl::Status RegisterBundleLookup(const BundleTables* tables, OpRegistry* registry) {
  OpInfo info;
  info.kernel = [tables](OpContext& ctx) { return BundleLookup(*tables, ctx); };
  return registry->Register(kBundleLookupOp, std::move(info));
}

absl::StatusOr<std::unique_ptr<Predictor>> Predictor::Load(io::FileSystem* fs,
                                                           const std::string& bundle_path,
                                                           const PredictorOptions& options) {
  if (options.batch_size < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("batch size ", options.batch_size, " (0: the bundle's; else >= 1)"));
  }
  TS_ASSIGN_OR_RETURN(std::vector<io::BundleLink> chain, io::ResolveBundle(fs, bundle_path));
  if (chain.empty()) {
    return absl::NotFoundError(absl::StrCat("no complete export in ", bundle_path));
  }
  const io::BundleLink& newest = chain.back();
  std::unique_ptr<Predictor> p(new Predictor());
  p->meta_ = newest.meta;
  auto path_of = [&](const char* name) { return io::JoinPath(newest.dir, name); };
  auto read = [&](const char* name) -> absl::StatusOr<std::string> {
    const io::ManifestEntry* entry = newest.manifest.Find(name);
    if (entry == nullptr) {
      return absl::DataLossError(absl::StrCat(path_of(io::kManifestName), " lists no ", name));
    }
    return io::ReadVerified(fs, newest.dir, *entry);
  };
  const std::string spec_path = path_of(io::kModelSpecName);
  const std::string program_path = path_of(io::kScoreProgramName);
  const std::string params_path = path_of(io::kDenseParamsName);

  TS_ASSIGN_OR_RETURN(std::string spec_text, read(io::kModelSpecName));
  TS_ASSIGN_OR_RETURN(p->model_, io::ParseBundleModel(spec_text, spec_path));
  if (p->model_.prediction.empty() || p->model_.loss.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat(spec_path, " names no ", p->model_.loss.empty() ? "loss" : "prediction"));
  }
  p->batch_size_ = options.batch_size > 0 ? options.batch_size : p->model_.batch_size;
  if (p->batch_size_ < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(spec_path, ": batch_size ", p->model_.batch_size, " must be >= 1"));
  }

  TS_ASSIGN_OR_RETURN(std::string program_bytes, read(io::kScoreProgramName));
  if (!p->program_.ParseFromString(program_bytes) || p->program_.blocks_size() == 0) {
    return absl::DataLossError(absl::StrCat(program_path, " is not a program"));
  }
  TS_ASSIGN_OR_RETURN(std::string params_bytes, read(io::kDenseParamsName));
  TS_ASSIGN_OR_RETURN(auto params, ParseVariables(params_bytes, params_path));
  params_bytes.clear();

  BundleTablesOptions table_options;
  table_options.table_shards = options.table_shards;
  TS_ASSIGN_OR_RETURN(p->tables_, LoadBundleTables(fs, chain, table_options));

  // The distributed lookups read the loaded tables.
  for (const auto& [table, dim] : RewriteDistributedLookups(&p->program_)) {
    auto it = p->tables_.find(table);
    if (it == p->tables_.end()) {
      return absl::InvalidArgumentError(
          absl::StrCat(program_path, " looks up the distributed table '", table, "', which ",
                       newest.dir, "'s chain holds no table file of"));
    }
    if (dim > 0 && dim != it->second->options().dim) {
      return absl::InvalidArgumentError(
          absl::StrCat(program_path, " declares table '", table, "' with rows of ", dim,
                       " values, but its table files hold rows of ", it->second->options().dim));
    }
  }
  TS_RETURN_IF_ERROR(CheckInputs(p->program_, p->model_.feeds, params, program_path, params_path));
  const BlockDesc& block = p->program_.blocks(0);
  const VarDesc* prediction = FindVarDesc(block, p->model_.prediction);
  if (prediction != nullptr && prediction->shape_size() == 2 && prediction->shape(1) > 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        program_path, ": prediction '", p->model_.prediction, "' has ", prediction->shape(1),
        " scores per example; only models with one probability per example can be scored"));
  }
  DeclareUnusedFeeds(p->model_.feeds, p->program_.mutable_blocks(0));

  p->registry_ = NewStandardOpRegistry();
  TS_RETURN_IF_ERROR(RegisterBundleLookup(&p->tables_, p->registry_.get()));
  ModelSpec spec;
  spec.main = p->program_;
  BlockDesc* startup = spec.startup.add_blocks();  // nothing to initialize: dense.params has it
  startup->set_idx(0);
  startup->set_parent_idx(-1);
  spec.loss = p->model_.loss;
  spec.prediction = p->model_.prediction;
  spec.metrics = p->model_.metrics;
  spec.feeds = p->model_.feeds;
  LocalTrainerOptions trainer_options;
  trainer_options.batch_size = p->batch_size_;
  trainer_options.epochs = 0;
  trainer_options.log_every_steps = 0;
  trainer_options.shuffle = false;
  trainer_options.log = &p->trainer_log_;
  auto trainer = LocalTrainer::Create(p->registry_.get(), std::move(spec), trainer_options);
  if (!trainer.ok()) {
    return absl::Status(trainer.status().code(),
                        absl::StrCat(program_path, ": ", trainer.status().message()));
  }
  p->trainer_ = *std::move(trainer);
  Scope* scope = p->trainer_->scope();
  for (auto& [name, tensor] : params) *scope->Var(name)->GetMutable<Tensor>() = std::move(tensor);
  return p;
}

absl::StatusOr<PredictionStats> Predictor::Score(
    const data::Dataset& dataset,
    const std::function<void(const data::Example&, double)>& on_prediction) {
  const int64_t n = static_cast<int64_t>(dataset.examples.size());
  if (n == 0) return absl::InvalidArgumentError("no examples to score");
  int64_t predictions = 0;
  const auto start = std::chrono::steady_clock::now();
  auto partial = trainer_->EvaluatePartial(dataset, 0, n, [&](const data::Example& e, double p) {
    ++predictions;
    if (on_prediction) on_prediction(e, p);
  });
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (!partial.ok()) return partial.status();
  if (predictions != n) {
    return absl::InvalidArgumentError(absl::StrCat(
        "prediction '", model_.prediction, "' gave ", predictions, " probabilities for ", n,
        " examples; only models with one probability per example can be scored"));
  }
  PredictionStats stats;
  stats.eval = partial->Result();
  stats.seconds = seconds;
  stats.examples_per_sec = seconds > 0 ? static_cast<double>(n) / seconds : 0;
  return stats;
}

}  // namespace tessera
