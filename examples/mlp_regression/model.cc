#include "examples/mlp_regression/model.h"

#include <cmath>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/layers/layers.h"
#include "common/layers/program_builder.h"
#include "common/layers/model_file.h"
#include "common/base/status.h"

namespace tessera {
namespace examples {

absl::StatusOr<ModelFile> MlpRegressionModelFile(const MlpRegressionOptions& options) {
  if (options.num_features < 1 || options.hidden < 1) {
    return absl::InvalidArgumentError(absl::StrCat("mlp_regression: num_features (",
                                                   options.num_features, ") and hidden (",
                                                   options.hidden, ") must be >= 1"));
  }
  if (!(options.learning_rate > 0) || !std::isfinite(options.learning_rate)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "mlp_regression: learning_rate must be a positive number, got ", options.learning_rate));
  }
  if (!(options.momentum >= 0 && options.momentum < 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("mlp_regression: momentum must be in [0, 1), got ", options.momentum));
  }
  ModelParts spec;
  spec.forward.set_random_seed(options.random_seed);
  ProgramBuilder b(&spec.forward, &spec.startup);
  std::string x = layers::Data(b, "x", {-1, options.num_features});
  std::string y = layers::Data(b, "y", {-1, 1});
  std::string in = x;
  if (options.standardize_inputs) {
    // Uniform [1, 2]: mean 1.5, standard deviation 1 / sqrt(12).
    const float k = static_cast<float>(std::sqrt(12.0));
    in = layers::Scale(b, x, k, -1.5f * k);
  }
  layers::FcOptions hidden;
  hidden.name = "hidden";
  hidden.act = "relu";
  std::string h = layers::Fc(b, in, options.hidden, hidden);
  layers::FcOptions out;
  out.name = "output";
  std::string pred = layers::Fc(b, h, 1, out);
  std::string loss = layers::Mean(b, layers::SquareError(b, pred, y));

  spec.optimizer.set_type("momentum");
  spec.optimizer.set_learning_rate(options.learning_rate);
  spec.optimizer.set_momentum(options.momentum);
  spec.loss = loss;
  spec.metrics = {"mse"};
  spec.feeds.dense = x;
  spec.feeds.num_dense = options.num_features;
  spec.feeds.label = y;
  spec.feeds.label_dtype = FLOAT32;
  return MakeModelFile(std::move(spec));
}

absl::StatusOr<ModelSpec> BuildMlpRegression(const OpRegistry& registry,
                                             const MlpRegressionOptions& options) {
  TS_ASSIGN_OR_RETURN(ModelFile model, MlpRegressionModelFile(options));
  return CompileModel(model, registry, "mlp_regression");
}

}  // namespace examples
}  // namespace tessera
