#include "examples/fashion_mnist/model.h"

#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/data/idx.h"
#include "common/layers/layers.h"
#include "common/layers/program_builder.h"
#include "common/layers/model_file.h"
#include "common/base/status.h"

namespace tessera {
namespace examples {

namespace {

constexpr int64_t kPixels = 28 * 28;
constexpr int64_t kClasses = 10;

absl::Status CheckOptions(absl::string_view model, const ImageModelOptions& o) {
  if (!(o.learning_rate >= 0) || !std::isfinite(o.learning_rate)) {
    return absl::InvalidArgumentError(absl::StrCat(
        model, ": learning_rate must be a positive number (0: default), got ", o.learning_rate));
  }
  if (!(o.momentum >= 0 && o.momentum < 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat(model, ": momentum must be in [0, 1), got ", o.momentum));
  }
  if (o.hidden < 1) {
    return absl::InvalidArgumentError(absl::StrCat(model, ": hidden must be >= 1, got ", o.hidden));
  }
  return absl::OkStatus();
}

// The shared head and feeds: logits -> softmax cross-entropy, prediction, accuracy, optimizer.
absl::StatusOr<ModelFile> Finish(ModelParts& spec, ProgramBuilder& b, const std::string& pixels,
                                 const std::string& label, const std::string& logits,
                                 const ImageModelOptions& o, float default_lr) {
  std::string softmax;
  std::string loss = layers::Mean(b, layers::SoftmaxWithCrossEntropy(b, logits, label, &softmax));
  spec.optimizer.set_type("momentum");
  spec.optimizer.set_learning_rate(o.learning_rate > 0 ? o.learning_rate : default_lr);
  spec.optimizer.set_momentum(o.momentum);
  spec.loss = loss;
  spec.prediction = softmax;
  spec.metrics = {"accuracy"};
  spec.feeds.dense = pixels;
  spec.feeds.num_dense = kPixels;
  spec.feeds.label = label;
  spec.feeds.label_dtype = INT64;
  return MakeModelFile(std::move(spec));
}

}  // namespace

absl::StatusOr<ModelFile> FashionMnistMlpModelFile(const ImageModelOptions& o) {
  TS_RETURN_IF_ERROR(CheckOptions("fashion_mnist_mlp", o));
  ModelParts spec;
  spec.forward.set_random_seed(o.random_seed);
  ProgramBuilder b(&spec.forward, &spec.startup);
  std::string pixels = layers::Data(b, "pixels", {-1, kPixels});
  std::string label = layers::Data(b, "label", {-1, 1}, INT64);
  layers::FcOptions hidden;
  hidden.name = "hidden";
  hidden.act = "relu";
  std::string h = layers::Fc(b, pixels, o.hidden, hidden);
  layers::FcOptions out;
  out.name = "output";
  std::string logits = layers::Fc(b, h, kClasses, out);
  return Finish(spec, b, pixels, label, logits, o, 0.02f);
}

absl::StatusOr<ModelFile> LenetModelFile(const ImageModelOptions& o) {
  TS_RETURN_IF_ERROR(CheckOptions("lenet", o));
  ModelParts spec;
  spec.forward.set_random_seed(o.random_seed);
  ProgramBuilder b(&spec.forward, &spec.startup);
  std::string pixels = layers::Data(b, "pixels", {-1, kPixels});
  std::string label = layers::Data(b, "label", {-1, 1}, INT64);
  std::string image = layers::Reshape(b, pixels, {-1, 1, 28, 28});
  layers::Conv2dOptions conv1;
  conv1.name = "conv1";
  conv1.act = "relu";
  std::string x = layers::Pool2d(b, layers::Conv2d(b, image, 20, 5, conv1), 2, "max");
  layers::Conv2dOptions conv2;
  conv2.name = "conv2";
  conv2.act = "relu";
  x = layers::Pool2d(b, layers::Conv2d(b, x, 50, 5, conv2), 2, "max");
  x = layers::Flatten(b, x);  // [-1, 800]
  layers::FcOptions fc1;
  fc1.name = "fc1";
  fc1.act = "relu";
  x = layers::Fc(b, x, 500, fc1);
  layers::FcOptions fc2;
  fc2.name = "fc2";
  std::string logits = layers::Fc(b, x, kClasses, fc2);
  return Finish(spec, b, pixels, label, logits, o, 0.02f);
}

absl::StatusOr<data::Dataset> ReadFashionMnist(const std::string& spec, int64_t limit) {
  TS_ASSIGN_OR_RETURN(data::Dataset d, data::ReadIdxData(spec, kPixels));
  for (const data::Example& e : d.examples) {
    if (e.label < 0 || e.label >= kClasses) {
      return absl::InvalidArgumentError(absl::StrCat("Fashion-MNIST data '", spec, "': label ",
                                                     e.label, " is not a class in [0, 10)"));
    }
  }
  if (limit > 0 && limit < static_cast<int64_t>(d.examples.size())) {
    d.examples.resize(static_cast<size_t>(limit));
  }
  return d;
}

}  // namespace examples
}  // namespace tessera
