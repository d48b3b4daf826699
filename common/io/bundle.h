// Inference bundles (README "Serving"): what a job exports for prediction and serving, and how a
// chain of exports (a full base, then deltas) is found and checked.
//
//   <root>/export-<step, 10 digits>/  one export; complete iff its MANIFEST exists
//     MANIFEST                        written last by trainer 0 (the commit point): meta step,
//                                     kind (full|delta), prev (a delta: the step of the export it
//                                     applies on), base (the step of its chain's full export),
//                                     num_pservers, table_shard_method; files: the trainer's
//                                     files below and every pserver's manifest
//     model.spec                      text (BundleModel): prediction, loss, metrics, feeds, how
//                                     the training data was read, the batch size
//     predict.program                 ProgramDesc (binary): the forward ops that compute the
//                                     prediction (no label, loss, backward or optimizer op)
//     score.program                   the same ops plus those of the loss (data with labels)
//     dense.params                    the dense parameters the programs read (params_io)
//     pserver-<i>-of-<P>.<table>.tbl  pserver i's rows of a distributed table: all of them
//                                     (full), or those changed since the previous export and
//                                     the ids evicted since (delta, tombstones): SparseTable
//                                     export files, values only (pserver/sparse_table.h)
//     pserver-<i>-of-<P>.MANIFEST     pserver i's files; its meta describes each table
//                                     (pserver/bundle_tables.h)
//   <root>/LATEST                     "export-<step>" of the newest committed export (a hint)
//
// A delta is loaded by applying its chain in order: the base, then every delta up to it. A
// chain with a gap (a prev that is missing or incomplete) is refused, naming the missing export.
#ifndef TESSERA_COMMON_IO_BUNDLE_H_
#define TESSERA_COMMON_IO_BUNDLE_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/framework/model_spec.h"
#include "common/io/checkpoint_io.h"
#include "common/io/file_system.h"

namespace tessera {
namespace io {

inline constexpr char kModelSpecName[] = "model.spec";
inline constexpr char kPredictProgramName[] = "predict.program";
inline constexpr char kScoreProgramName[] = "score.program";
inline constexpr char kDenseParamsName[] = "dense.params";

// "export-0000000042".
std::string ExportDirName(int64_t step);
// The step of an "export-<step>" name; -1 if `name` is not one.
int64_t ExportStep(const std::string& name);

// What trainer 0 sends a pserver (as the dir of a Checkpoint request) to have it write its part
// of a serving export under its own --export_dir: "export-<step>:full" or "export-<step>:delta".
// The peer chooses only the step and the kind.
std::string ExportRequestName(int64_t step, bool delta);
// False if `name` is not such a request.
bool ParseExportRequestName(const std::string& name, int64_t* step, bool* delta);

// pserver-<i>-of-<P>.<table>.tbl
std::string BundleTableFileName(int pserver, int num_pservers, const std::string& table);

// What an export's MANIFEST says about it.
struct BundleMeta {
  int64_t step = 0;
  bool delta = false;
  int64_t prev = -1;  // delta: the step of the export it applies on; full: -1
  int64_t base = 0;   // the step of the chain's full export (a full export: its own step)
  int num_pservers = 0;                      // 0: no distributed tables (collective mode)
  std::string table_shard_method = "hash";  // how ids were placed on the pservers
};

// Writes meta into a manifest and reads it back. Errors name `path` and the key.
void PutBundleMeta(const BundleMeta& meta, Manifest* manifest);
absl::StatusOr<BundleMeta> GetBundleMeta(const Manifest& manifest, const std::string& path);

// How a bundle's data is fed and scored: the model's outputs and feeds, and the options of the
// training data it was read with, so that tessera_predict reads new data the same way.
struct BundleModel {
  std::string prediction;
  std::string loss;
  std::vector<std::string> metrics;
  FeedSpec feeds;
  int64_t batch_size = 256;
  std::string data_format;  // as --data_format ("" : the built-in example's synthetic data)
  bool float_dense = false;
  std::string csv_columns;
};

// Text of "<key> <value>" lines; names and values hold no whitespace (InvalidArgument naming
// the value otherwise). Parse errors are InvalidArgument naming `path` and the line.
absl::StatusOr<std::string> SerializeBundleModel(const BundleModel& model);
absl::StatusOr<BundleModel> ParseBundleModel(absl::string_view text, const std::string& path);

// Prepares <root>/export-<step> (creates it, or empties an incomplete leftover of an earlier
// attempt: its MANIFEST goes first). Returns the directory.
absl::StatusOr<std::string> BeginExport(FileSystem* fs, const std::string& root, int64_t step);
// The commit: writes `files` (name -> contents) atomically into `dir`, then its MANIFEST with
// `meta` listing them and `pserver_manifests` (already in `dir`; checksummed here).
absl::Status CommitExport(FileSystem* fs, const std::string& dir, const BundleMeta& meta,
                          const std::map<std::string, std::string>& files,
                          const std::vector<std::string>& pserver_manifests);
// After a commit: points LATEST at export-<step> and deletes the exports that neither are among
// the newest `keep` complete ones nor belong to the chain of one of those (a kept delta keeps
// its base and every delta between), and incomplete ones older than `step`.
absl::Status FinishExport(FileSystem* fs, const std::string& root, int64_t step, int keep);
// After a failed export: removes <root>/export-<step> unless it is complete.
absl::Status AbandonExport(FileSystem* fs, const std::string& root, int64_t step);

// One export of a chain.
struct BundleLink {
  std::string dir;
  BundleMeta meta;
  Manifest manifest;
};

// The exports to apply for `path`, base first: `path` itself if it holds a MANIFEST, else the
// newest complete export-* under it, with every export its chain needs. NotFound naming `path`
// when there is none; FailedPrecondition naming the missing export for a gap ("export-... is a
// delta on export-..., which is missing or incomplete"); DataLoss naming a damaged manifest.
absl::StatusOr<std::vector<BundleLink>> ResolveBundle(FileSystem* fs, const std::string& path);

}  // namespace io
}  // namespace tessera

#endif  // TESSERA_COMMON_IO_BUNDLE_H_
