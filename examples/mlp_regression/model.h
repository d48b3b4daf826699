// The classic perceptron regression model: 10 dense features in [1, 2] -> 100 ReLU units -> 1
// output, trained on the square error with SGD + momentum 0.9.
#ifndef TESSERA_EXAMPLES_MLP_REGRESSION_MODEL_H_
#define TESSERA_EXAMPLES_MLP_REGRESSION_MODEL_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "common/framework/op_registry.h"
#include "common/framework/model_spec.h"
#include "proto/model.pb.h"

namespace tessera {
namespace examples {

struct MlpRegressionOptions {
  int num_features = 10;  // >= 1
  int64_t hidden = 100;   // >= 1
  float learning_rate = 0.001f;
  float momentum = 0.9f;
  // Maps each feature from its range [1, 2] to zero mean and unit variance (x - 1.5) * sqrt(12)
  // inside the model, so that the first layer starts well conditioned.
  bool standardize_inputs = true;
  int64_t random_seed = 0;  // program seed (initializers); 0 = the builder's default
};

// Feeds: "x" [-1, num_features] float32, label "y" [-1, 1] float32. ModelSpec::loss is the
// batch's mean square error; there is no prediction for AUC. InvalidArgument on bad options; errors
// of AppendBackward/Minimize (e.g. an op missing from `registry`) pass through.
// The model file (forward program, feeds, optimizer); BuildMlpRegression compiles it.
absl::StatusOr<ModelFile> MlpRegressionModelFile(const MlpRegressionOptions& options = {});
absl::StatusOr<ModelSpec> BuildMlpRegression(const OpRegistry& registry,
                                             const MlpRegressionOptions& options = {});

}  // namespace examples
}  // namespace tessera

#endif  // TESSERA_EXAMPLES_MLP_REGRESSION_MODEL_H_
