// Model files (proto/model.proto): what a user writes once — the forward program, its
// initializers, feed bindings, loss, outputs and optimizer — and every runner loads with
// --model=PATH. CompileModel validates a file and appends the backward and optimizer ops, giving
// the single-machine ModelSpec that the local trainer runs and the transpiler splits.
//
// Every refusal is one line that starts with the file's name and names the bad value, e.g.
//   "model file m.pbtxt: op 3 'fc_w' is unknown op type 'fcc'".
// Functions are pure (no I/O except Read/WriteModelFile); thread-compatible.
#ifndef TESSERA_COMMON_LAYERS_MODEL_FILE_H_
#define TESSERA_COMMON_LAYERS_MODEL_FILE_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/framework/model_spec.h"
#include "common/framework/op_registry.h"
#include "proto/model.pb.h"

namespace tessera {

// The newest format this build reads and writes.
inline constexpr int kModelFormatVersion = 1;

// The metrics a model file may ask for.
inline constexpr const char* kModelMetrics[] = {"auc", "log_loss", "accuracy", "mse"};

// Parses a text-format ModelFile (syntax errors name `source`, line and column; strings with
// control characters are refused). Does not validate the model.
absl::StatusOr<ModelFile> ParseModelText(absl::string_view text, absl::string_view source);
absl::StatusOr<ModelFile> ReadModelFile(const std::string& path);
// Deterministic text form.
std::string ModelToText(const ModelFile& model);
// Writes atomically (temporary file + rename).
absl::Status WriteModelFile(const ModelFile& model, const std::string& path);

// What a runner's flags may change in a model without editing it.
struct ModelOverrides {
  // > 0: replaces the optimizer's learning rate.
  float learning_rate = 0.0f;
  // Every embedding table lives on the pservers (sparse gradients, ids fed unmodified).
  bool distributed_tables = false;
  // One process, no pservers: a distributed table becomes a local table of its declared rows,
  // its ids fed modulo the rows (so any int64 id maps to a row). Wins over distributed_tables.
  bool single_machine = false;
};

// `model` with `overrides` applied (no validation).
ModelFile ApplyOverrides(ModelFile model, const ModelOverrides& overrides);

// Checks everything a runner relies on: format version, known forward-only ops, variables
// declared and written before they are read (no cycles), every data input bound by exactly one
// feed of the right dtype and shape, a scalar float loss, positive dims, an initializer per
// parameter, an optimizer every table supports, and shapes: a batch of 2 zero examples runs
// through the forward program and every variable must come out with its declared shape (skipped
// when that would take over 1 GiB). `registry` must hold the standard ops.
absl::Status ValidateModel(const ModelFile& model, const OpRegistry& registry,
                           absl::string_view source);

// ValidateModel without the dry run: no kernel runs, nothing is allocated by shape.
absl::Status CheckModelStructure(const ModelFile& model, const OpRegistry& registry,
                                 absl::string_view source);

// ValidateModel, then the ModelSpec: forward + backward + optimizer ops in `main`, the
// initializers (parameters, optimizer state, learning rate) in `startup`, the feed spec.
absl::StatusOr<ModelSpec> CompileModel(const ModelFile& model, const OpRegistry& registry,
                                       absl::string_view source);

// Builds the model file of a model whose forward and startup programs were built with a
// ProgramBuilder (before any optimizer ran), e.g. the built-in examples.
struct ModelParts {
  ProgramDesc forward, startup;
  FeedSpec feeds;
  std::string loss, prediction;
  std::vector<std::string> metrics;
  OptimizerConfig optimizer;
};
ModelFile MakeModelFile(ModelParts parts);

}  // namespace tessera

#endif  // TESSERA_COMMON_LAYERS_MODEL_FILE_H_
