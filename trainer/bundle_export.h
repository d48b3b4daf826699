// Trainer 0's side of inference bundles (common/io/bundle.h, README "Serving").
//
// At the end of training, and every --export_every_steps steps, trainer 0 writes
// <export_dir>/export-<step>: the single-machine model's forward program pruned to the
// prediction (and a copy with the loss, for data with labels), the dense parameters its scope
// holds, how data is fed, and (when the model has distributed tables) every pserver's table
// files, which the pservers write under their own --export_dir when asked (all at once, at a
// step boundary). Every --export_full_every-th export holds every row; the others hold the rows
// changed and the ids evicted since the previous export. It commits the export's MANIFEST last
// and keeps the newest --export_keep exports with the chains they need. A failed export removes
// its partial directory and makes the next export a full one (some pservers may have moved
// their delta cut), so a chain never has a hole.
#ifndef TESSERA_TRAINER_BUNDLE_EXPORT_H_
#define TESSERA_TRAINER_BUNDLE_EXPORT_H_

#include <cstdint>
#include <map>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/config/cluster_config.h"
#include "common/framework/model_spec.h"
#include "common/framework/scope.h"
#include "common/io/bundle.h"
#include "common/io/file_system.h"
#include "common/rpc/client.h"
#include "proto/program.pb.h"

namespace tessera {

// What every export of a model holds besides its parameter values and table rows.
struct BundleModelFiles {
  // model.spec, predict.program and score.program, by file name.
  std::map<std::string, std::string> files;
  // The persistable variables the score program reads before any op writes them, except
  // distributed tables (their rows are on the pservers): what dense.params holds.
  std::vector<std::string> dense;
  bool has_distributed_table = false;  // the pservers hold some of the model's rows
};

// The files of `model` (before transpiling); `how` gives how its data is read (batch_size,
// data_format, float_dense, csv_columns), the rest of model.spec comes from `model`.
// InvalidArgument when the model names no prediction or a name is not a model.spec token.
absl::StatusOr<BundleModelFiles> MakeBundleModelFiles(const ModelSpec& model,
                                                      io::BundleModel how);

class BundleExporter {
 public:
  // `model` is the single-machine model (before transpiling); `pservers[i]` is config.pservers[i]'s
  // client (empty without pservers). InvalidArgument naming --export_dir when the model names no
  // prediction. All pointers must outlive the exporter.
  static absl::StatusOr<std::unique_ptr<BundleExporter>> Create(
      const ClusterConfig& config, const ModelSpec& model, io::FileSystem* fs,
      std::vector<PServerClient*> pservers, std::ostream* log);

  // Exports the state at `step`: the dense parameters from `scope` (trainer 0's, after the
  // step's parameters arrived) and the pservers' tables. Errors name the step and --export_dir.
  absl::Status Export(const RequestMeta& meta, int64_t step, const Scope& scope);
  // The step of the last committed export (-1: none).
  int64_t last_step() const { return last_step_; }

 private:
  BundleExporter(const ClusterConfig& config, io::FileSystem* fs,
                 std::vector<PServerClient*> pservers, std::ostream* log)
      : config_(config), fs_(fs), pservers_(std::move(pservers)), log_(log) {}
  absl::Status Write(const RequestMeta& meta, int64_t step, bool delta, const Scope& scope);

  const ClusterConfig& config_;
  io::FileSystem* fs_;
  std::vector<PServerClient*> pservers_;  // empty: the model has no distributed tables
  std::ostream* log_;
  BundleModelFiles model_files_;
  int64_t last_step_ = -1;
  int64_t base_step_ = -1;      // the current chain's full export
  int64_t since_full_ = 0;      // exports since it
  bool need_full_ = true;       // the first export, and the one after a failure
};

}  // namespace tessera

#endif  // TESSERA_TRAINER_BUNDLE_EXPORT_H_
