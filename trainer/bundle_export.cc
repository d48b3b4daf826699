#include "trainer/bundle_export.h"

#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/base/status.h"
#include "common/framework/op_desc.h"
#include "common/framework/params_io.h"
#include "common/io/bundle.h"
#include "trainer/local_trainer.h"

namespace tessera {

namespace {

std::vector<std::string> DenseInputs(const ProgramDesc& program) {
  const BlockDesc& block = program.blocks(0);
  std::set<std::string> produced, out;
  for (const OpDesc& op : block.ops()) {
    for (const std::string& in : AllInputArgs(op)) {
      if (produced.count(in) > 0) continue;
      const VarDesc* v = FindVarDesc(block, in);
      if (v != nullptr && v->persistable() && !v->is_distributed()) out.insert(in);
    }
    for (const std::string& o : AllOutputArgs(op)) produced.insert(o);
  }
  return {out.begin(), out.end()};
}

bool HasDistributedTable(const ProgramDesc& program) {
  for (const VarDesc& v : program.blocks(0).vars()) {
    if (v.is_distributed()) return true;
  }
  return false;
}

absl::StatusOr<std::string> Serialized(const ProgramDesc& program) {
  std::string bytes;
  if (!program.SerializeToString(&bytes)) return absl::InternalError("cannot serialize a program");
  return bytes;
}

}  // namespace

absl::StatusOr<BundleModelFiles> MakeBundleModelFiles(const ModelSpec& model,
                                                      io::BundleModel how) {
  if (model.prediction.empty()) {
    return absl::InvalidArgumentError("the model names no prediction to serve");
  }
  TS_ASSIGN_OR_RETURN(ProgramDesc predict, ForwardProgram(model.main, {model.prediction}));
  TS_ASSIGN_OR_RETURN(ProgramDesc score,
                      ForwardProgram(model.main, {model.loss, model.prediction}));
  how.prediction = model.prediction;
  how.loss = model.loss;
  how.metrics = model.metrics;
  how.feeds = model.feeds;
  BundleModelFiles out;
  TS_ASSIGN_OR_RETURN(out.files[io::kModelSpecName], io::SerializeBundleModel(how));
  TS_ASSIGN_OR_RETURN(out.files[io::kPredictProgramName], Serialized(predict));
  TS_ASSIGN_OR_RETURN(out.files[io::kScoreProgramName], Serialized(score));
  out.dense = DenseInputs(score);
  out.has_distributed_table = HasDistributedTable(score);
  return out;
}

absl::StatusOr<std::unique_ptr<BundleExporter>> BundleExporter::Create(
    const ClusterConfig& config, const ModelSpec& model, io::FileSystem* fs,
    std::vector<PServerClient*> pservers, std::ostream* log) {
  io::BundleModel how;
  how.batch_size = config.batch_size;
  how.data_format = config.data_format;
  how.float_dense = config.float_dense;
  how.csv_columns = config.csv_columns;
  auto files = MakeBundleModelFiles(model, how);
  if (!files.ok()) {
    return absl::Status(files.status().code(), absl::StrCat("--export_dir=", config.export_dir,
                                                           ": ", files.status().message()));
  }
  std::unique_ptr<BundleExporter> e(new BundleExporter(
      config, fs, files->has_distributed_table ? std::move(pservers) : std::vector<PServerClient*>(),
      log));
  e->model_files_ = *std::move(files);
  return e;
}

absl::Status BundleExporter::Write(const RequestMeta& meta, int64_t step, bool delta,
                                   const Scope& scope) {
  TS_ASSIGN_OR_RETURN(std::string dir, io::BeginExport(fs_, config_.export_dir, step));
  // The pservers' tables at this step boundary, all at once (each writes under its own
  // --export_dir; with a shared file system that is this directory).
  StatusGroup group(static_cast<int>(pservers_.size()));
  for (PServerClient* pserver : pservers_) {
    pserver->CheckpointAsync(meta, io::ExportRequestName(step, delta), group.Callback());
  }
  TS_RETURN_IF_ERROR(group.Wait());
  std::map<std::string, std::string> files = model_files_.files;
  TS_ASSIGN_OR_RETURN(files[io::kDenseParamsName], SerializeVariables(scope, model_files_.dense));
  std::vector<std::string> manifests;
  const int num_ps = static_cast<int>(pservers_.size());
  for (int i = 0; i < num_ps; ++i) manifests.push_back(io::PserverFilePrefix(i, num_ps) + ".MANIFEST");
  io::BundleMeta bm;
  bm.step = step;
  bm.delta = delta;
  bm.prev = delta ? last_step_ : -1;
  bm.base = delta ? base_step_ : step;
  bm.num_pservers = num_ps;
  bm.table_shard_method = config_.table_shard_method;
  TS_RETURN_IF_ERROR(io::CommitExport(fs_, dir, bm, files, manifests));
  return io::FinishExport(fs_, config_.export_dir, step, static_cast<int>(config_.export_keep));
}

absl::Status BundleExporter::Export(const RequestMeta& meta, int64_t step, const Scope& scope) {
  if (step == last_step_) return absl::OkStatus();  // exported at this step already
  const bool delta = !need_full_ && config_.export_full_every > 1 &&
                     since_full_ % config_.export_full_every != 0;
  absl::Status s = Write(meta, step, delta, scope);
  if (!s.ok()) {
    need_full_ = true;
    absl::Status cleaned = io::AbandonExport(fs_, config_.export_dir, step);
    if (!cleaned.ok()) {
      *log_ << "trainer 0: could not remove the partial export of step " << step << ": "
            << cleaned.message() << std::endl;
    }
    return absl::Status(s.code(), absl::StrCat("export of step ", step, " in --export_dir=",
                                               config_.export_dir, ": ", s.message()));
  }
  if (!delta) {
    base_step_ = step;
    since_full_ = 0;
  }
  ++since_full_;
  need_full_ = false;
  last_step_ = step;
  *log_ << "trainer 0: " << (delta ? "delta" : "full") << " export "
        << io::JoinPath(config_.export_dir, io::ExportDirName(step)) << " committed" << std::endl;
  return absl::OkStatus();
}

}  // namespace tessera
