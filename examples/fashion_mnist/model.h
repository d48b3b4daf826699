// Image classifiers on Fashion-MNIST (28x28 grey images, 10 classes), the examples of the
// systems Tessera learns from:
//   fashion_mnist_mlp  784 -> 256 ReLU -> 10, PyTorch DDP tutorial's MLP;
//   lenet              SINGA DistOpt's LeNet: conv 5x5x20, max pool 2, conv 5x5x50, max pool 2
//                      (ReLU after each conv), flatten (800), fc 500 ReLU, fc 10.
// Both: feeds "pixels" [-1, 784] float32 (in [0, 1]) and label "label" [-1, 1] int64 (the
// class); loss: mean softmax cross-entropy; prediction: the softmax [-1, 10]; metric accuracy;
// SGD with momentum.
#ifndef TESSERA_EXAMPLES_FASHION_MNIST_MODEL_H_
#define TESSERA_EXAMPLES_FASHION_MNIST_MODEL_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "common/data/example.h"
#include "proto/model.pb.h"

namespace tessera {
namespace examples {

struct ImageModelOptions {
  float learning_rate = 0.0f;  // 0: the model's default (0.02)
  float momentum = 0.9f;
  int64_t hidden = 256;        // fashion_mnist_mlp: hidden units
  int64_t random_seed = 0;     // program seed (initializers); 0 = the builder's default
};

absl::StatusOr<ModelFile> FashionMnistMlpModelFile(const ImageModelOptions& options = {});
absl::StatusOr<ModelFile> LenetModelFile(const ImageModelOptions& options = {});

// Where Debian's dataset-fashion-mnist package installs the data (IDX, gzip): the prefixes of
// the training set (60,000 images) and of the test set (10,000).
inline constexpr char kFashionMnistTrain[] = "/usr/share/datasets/fashion-mnist/train";
inline constexpr char kFashionMnistTest[] = "/usr/share/datasets/fashion-mnist/t10k";

// The IDX data of `spec` (common/data/idx.h), its first `limit` images when 0 < limit < its
// size.
absl::StatusOr<data::Dataset> ReadFashionMnist(const std::string& spec, int64_t limit = 0);

}  // namespace examples
}  // namespace tessera

#endif  // TESSERA_EXAMPLES_FASHION_MNIST_MODEL_H_
