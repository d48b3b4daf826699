// Test helpers of serving/: a small click model with one embedding table, and an inference
// bundle of it written by hand (what trainer 0 and one pserver export), for the predictor's unit
// test and tessera_predict's command-line test.
#ifndef TESSERA_SERVING_TEST_BUNDLE_H_
#define TESSERA_SERVING_TEST_BUNDLE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/data/example.h"
#include "common/framework/model_spec.h"
#include "common/framework/scope.h"
#include "common/io/file_system.h"
#include "pserver/sparse_table.h"

namespace tessera {

inline constexpr char kTestTable[] = "emb";
inline constexpr int kTestNumDense = 2;

struct TestModelOptions {
  int64_t vocab = 50;  // rows of the table (a hint when distributed)
  int64_t dim = 4;
  bool distributed = true;
};

// Feeds "dense_input" [-1, 2] float32, "slot_0" [-1, 1] int64 (ids as they are) and "label"
// [-1, 1] float32. logit = fc 1 (fc 8 relu (concat(emb[slot_0], dense_input))); loss = mean
// sigmoid cross-entropy; prediction = sigmoid(logit); metrics {"auc"}. `main` holds the forward
// ops only; `startup` initializes every parameter (the table too).
ModelSpec BuildTestModel(const TestModelOptions& options);

// The table's options: `dim` wide, uniform initial values in [-0.5, 0.5) with seed 11, sgd.
SparseTableOptions TestTableOptions(int64_t dim);
// A table with TestTableOptions whose rows of ids [0, vocab / 2) were moved one sgd step away
// from their initial values (the other ids are not held).
absl::StatusOr<std::unique_ptr<SparseTable>> MakeTestTable(int64_t vocab, int64_t dim);

struct TestBundleOptions {
  int64_t step = 42;
  int64_t batch_size = 16;
  std::string data_format = "csv";
  std::string omit_param;  // a dense parameter to leave out of dense.params
};

// Writes <root>/export-<step> as a job would: pserver 0 of 1's file of `table` (named
// kTestTable) and manifest, then model.spec, predict.program, score.program and dense.params
// (the values `params` holds, e.g. after running model.startup), committed by the MANIFEST.
// Returns the export's directory.
absl::StatusOr<std::string> WriteTestBundle(io::FileSystem* fs, const std::string& root,
                                            const ModelSpec& model, const Scope& params,
                                            SparseTable* table, const TestBundleOptions& options);

// `n` examples: dense values uniform in [-1, 1], ids taken from `ids` in turn, labels 0/1,
// all from `seed`.
data::Dataset MakeTestData(int64_t n, const std::vector<int64_t>& ids, uint64_t seed);

// The data set as CSV with the header "label,I1,I2,C1" (the default column names).
std::string TestDataCsv(const data::Dataset& dataset);

}  // namespace tessera

#endif  // TESSERA_SERVING_TEST_BUNDLE_H_
