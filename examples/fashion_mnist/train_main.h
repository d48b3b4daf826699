// The command line shared by the Fashion-MNIST example binaries (fashion_mnist_mlp, lenet):
// trains the model on one machine, printing held-out accuracy and loss after each epoch.
#ifndef TESSERA_EXAMPLES_FASHION_MNIST_TRAIN_MAIN_H_
#define TESSERA_EXAMPLES_FASHION_MNIST_TRAIN_MAIN_H_

#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "examples/fashion_mnist/model.h"

namespace tessera {
namespace examples {

using ImageModelFn = std::function<absl::StatusOr<ModelFile>(const ImageModelOptions&)>;

// Exit status: 0 on success, 2 for bad flags, 1 for anything that fails later (missing data
// files among them), always with one line on stderr.
int RunImageExample(int argc, char** argv, const std::string& name, const std::string& about,
                    int default_epochs, const ImageModelFn& model_fn);

}  // namespace examples
}  // namespace tessera

#endif  // TESSERA_EXAMPLES_FASHION_MNIST_TRAIN_MAIN_H_
