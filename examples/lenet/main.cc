// lenet: Apache SINGA DistOpt's LeNet CNN (conv 20, pool, conv 50, pool, fc 500, fc 10) on
// Fashion-MNIST, one machine.
//
//   bazel run //examples/lenet -- [--epochs=5] [--batch_size=64] [--lr=0.02]
//
// Reads Debian's dataset-fashion-mnist files (deploy/setup installs them), trains with SGD +
// momentum and prints the held-out accuracy after each epoch.
#include "examples/fashion_mnist/train_main.h"

int main(int argc, char** argv) {
  return tessera::examples::RunImageExample(
      argc, argv, "lenet",
      "trains SINGA's LeNet CNN on Fashion-MNIST on one machine and reports held-out accuracy",
      /*default_epochs=*/5, tessera::examples::LenetModelFile);
}
