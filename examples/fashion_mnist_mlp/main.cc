// fashion_mnist_mlp: the PyTorch DDP tutorial's MLP (784-256-10) on Fashion-MNIST, one machine.
//
//   bazel run //examples/fashion_mnist_mlp -- [--epochs=10] [--batch_size=64] [--lr=0.02]
//
// Reads Debian's dataset-fashion-mnist files (deploy/setup installs them), trains with SGD +
// momentum and prints the held-out accuracy after each epoch.
#include "examples/fashion_mnist/train_main.h"

int main(int argc, char** argv) {
  return tessera::examples::RunImageExample(
      argc, argv, "fashion_mnist_mlp",
      "trains a 784-256-10 MLP on Fashion-MNIST on one machine and reports held-out accuracy",
      /*default_epochs=*/10, tessera::examples::FashionMnistMlpModelFile);
}
