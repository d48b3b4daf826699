// Predictor: batch scoring of examples with an inference bundle (common/io/bundle.h), with
// exactly the numbers of the trainer's held-out evaluation.
//
// Load() resolves the bundle's chain, reads the newest export's model.spec, score.program and
// dense.params (each checked against that export's MANIFEST) and every table of the chain
// (pserver/bundle_tables.h). The score program's distributed-table lookups (lookup_table with
// is_distributed) become "bundle_lookup" ops of the predictor's own op registry, whose kernel
// reads the loaded tables without changing them (SparseTable::LookupReadOnly: a held row's
// values, an unseen id's initial values; Out [.., dim] float32 keeps the LoD of Ids and zeros
// at padding_idx, as lookup_table). The program then runs in a LocalTrainer, so Score() is
// LocalTrainer::EvaluatePartial: batches of the bundle's batch size, the loss as the mean of
// the batch mean losses weighted by batch size, the AUC (when the model's metrics ask for it)
// from the trainer's histogram.
//
// Every data format (common/data/formats.h) reads a label with each example, so the predictor
// always runs score.program; predict.program (the same ops without the loss) is not needed.
//
// Not thread-safe: one Score() at a time.
#ifndef TESSERA_SERVING_PREDICTOR_H_
#define TESSERA_SERVING_PREDICTOR_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <sstream>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/data/example.h"
#include "common/framework/op_registry.h"
#include "common/io/bundle.h"
#include "common/io/file_system.h"
#include "proto/program.pb.h"
#include "pserver/bundle_tables.h"
#include "trainer/evaluation.h"
#include "trainer/local_trainer.h"

namespace tessera {

// The op type that a distributed table's lookup_table becomes: input Ids (int64), output Out,
// attrs "table" (the table's name) and "padding_idx" (-1: none).
inline constexpr char kBundleLookupOp[] = "bundle_lookup";

struct PredictorOptions {
  int64_t batch_size = 0;  // examples per program run; 0: the bundle's (model.spec)
  int table_shards = 0;    // internal shards of each loaded table; 0: SparseTable's default
};

// What Score() measured.
struct PredictionStats {
  EvalResult eval;              // samples, loss, AUC / accuracy as the trainer reports them
  double seconds = 0;           // the scoring loop alone (not loading, not reading data)
  double examples_per_sec = 0;  // eval.samples / seconds
};

class Predictor {
 public:
  // Loads the bundle at `bundle_path` (an export-* directory, or a root holding them: its
  // newest complete export) through `fs`, which must outlive the call. Errors are one line:
  // NotFound / FailedPrecondition for a missing bundle or a broken chain, DataLoss naming a
  // damaged file, InvalidArgument naming a variable the score program reads that no op
  // produces, no feed provides and dense.params lacks, or a table it looks up that the bundle
  // does not hold.
  static absl::StatusOr<std::unique_ptr<Predictor>> Load(io::FileSystem* fs,
                                                         const std::string& bundle_path,
                                                         const PredictorOptions& options);

  // Scores every example of `dataset` in order; `on_prediction` (may be empty) sees each example
  // with its predicted probability. InvalidArgument for an empty data set, a data set whose
  // shape the feeds cannot take, or a prediction that is not one probability per example.
  absl::StatusOr<PredictionStats> Score(
      const data::Dataset& dataset,
      const std::function<void(const data::Example&, double)>& on_prediction = nullptr);

  // The model's outputs, feeds and how its training data was read.
  const io::BundleModel& model() const { return model_; }
  // The newest export of the chain (the one whose programs and dense parameters are used).
  const io::BundleMeta& meta() const { return meta_; }
  // "export-0000000042".
  std::string export_name() const { return io::ExportDirName(meta_.step); }
  int64_t batch_size() const { return batch_size_; }
  // The score program as it runs (distributed lookups rewritten).
  const ProgramDesc& program() const { return program_; }
  // The distributed tables loaded, by name.
  const BundleTables& tables() const { return tables_; }

 private:
  Predictor() = default;

  io::BundleModel model_;
  io::BundleMeta meta_;
  int64_t batch_size_ = 0;
  ProgramDesc program_;
  // Declared before the registry and the trainer that use them (destroyed after them).
  BundleTables tables_;
  std::unique_ptr<OpRegistry> registry_;
  std::ostringstream trainer_log_;
  std::unique_ptr<LocalTrainer> trainer_;
};

// Rewrites every lookup of a distributed table in block 0 of `program` (a lookup_table op with
// attr is_distributed, or whose W is declared is_distributed) into a kBundleLookupOp op on the
// same Ids and Out, and drops the tables' declarations. Returns the tables' names with the row
// width each lookup declares (-1 if W's declaration gives none).
std::map<std::string, int64_t> RewriteDistributedLookups(ProgramDesc* program);

// Registers kBundleLookupOp into `registry` with a kernel reading `tables`, which must outlive
// the registry's use.
absl::Status RegisterBundleLookup(const BundleTables* tables, OpRegistry* registry);

}  // namespace tessera

#endif  // TESSERA_SERVING_PREDICTOR_H_
