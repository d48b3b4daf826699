// mlp_regression: trains the classic perceptron regression model on one machine.
//
//   bazel run //examples/mlp_regression -- [--epochs=100] [--batch_size=32] [--lr=0.001]
//
// Generates 10,000 training examples (10 features uniform in [1, 2], target sum x_i^3 plus
// noise of variance 0.5) and a held-out set, trains with SGD + momentum 0.9, prints progress,
// and reports the mean squared error on both sets.
#include <cstdio>
#include <iostream>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_format.h"
#include "common/data/synthetic.h"
#include "common/ops/ops.h"
#include "examples/mlp_regression/model.h"
#include "trainer/local_trainer.h"

ABSL_FLAG(int, epochs, 100, "Maximum number of passes over the training set.");
ABSL_FLAG(int64_t, batch_size, 32, "Examples per step.");
ABSL_FLAG(double, lr, 0.001, "Learning rate of SGD with momentum.");
ABSL_FLAG(double, momentum, 0.9, "Momentum.");
ABSL_FLAG(int64_t, train_samples, 10000, "Size of the generated training set.");
ABSL_FLAG(int64_t, test_samples, 2000, "Size of the generated held-out set.");
ABSL_FLAG(uint64_t, seed, 1, "Seed of the data and of the shuffling.");
ABSL_FLAG(int64_t, log_every_steps, 100, "Steps between progress lines (0: none).");
ABSL_FLAG(double, target_mse, 0.0,
          "Stop once the held-out MSE is below this after an epoch (0: run every epoch).");

namespace {

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "mlp_regression: %s\n", std::string(s.message()).c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  using tessera::data::Dataset;
  const uint64_t seed = absl::GetFlag(FLAGS_seed);

  std::cout << "mlp_regression: a 10-100-1 ReLU perceptron learns y = sum_i x_i^3 + noise\n";
  auto train = tessera::data::MakeRegressionData(absl::GetFlag(FLAGS_train_samples), seed);
  if (!train.ok()) return Fail(train.status());
  auto test = tessera::data::MakeRegressionData(absl::GetFlag(FLAGS_test_samples), seed + 1000);
  if (!test.ok()) return Fail(test.status());
  std::cout << absl::StrFormat(
      "generated %d training and %d held-out examples (10 features in [1, 2]); the noise "
      "alone gives MSE 0.5\n",
      train->examples.size(), test->examples.size());

  auto registry = tessera::NewStandardOpRegistry();
  tessera::examples::MlpRegressionOptions mo;
  mo.learning_rate = static_cast<float>(absl::GetFlag(FLAGS_lr));
  mo.momentum = static_cast<float>(absl::GetFlag(FLAGS_momentum));
  auto model = tessera::examples::BuildMlpRegression(*registry, mo);
  if (!model.ok()) return Fail(model.status());
  std::cout << absl::StrFormat(
      "built the program: %d ops in main (forward, backward, momentum updates), %d in startup\n",
      model->main.blocks(0).ops_size(), model->startup.blocks(0).ops_size());

  tessera::LocalTrainer::Options to;
  to.batch_size = absl::GetFlag(FLAGS_batch_size);
  to.epochs = absl::GetFlag(FLAGS_epochs);
  to.log_every_steps = absl::GetFlag(FLAGS_log_every_steps);
  to.seed = seed;
  auto trainer = tessera::LocalTrainer::Create(registry.get(), *std::move(model), to);
  if (!trainer.ok()) return Fail(trainer.status());
  std::cout << absl::StrFormat("training up to %d epochs, batch size %d, lr %g, momentum %g\n",
                               to.epochs, to.batch_size, mo.learning_rate, mo.momentum);

  const double target = absl::GetFlag(FLAGS_target_mse);
  double test_mse = 0;
  for (int e = 0; e < to.epochs; ++e) {
    auto stats = (*trainer)->TrainEpoch(*train);
    if (!stats.ok()) return Fail(stats.status());
    auto eval = (*trainer)->Evaluate(*test);
    if (!eval.ok()) return Fail(eval.status());
    test_mse = eval->mean_loss;
    std::cout << absl::StrFormat("epoch %d held-out MSE %.4f\n", e, test_mse);
    if (target > 0 && test_mse < target) {
      std::cout << absl::StrFormat("held-out MSE is below the target %g: stopping\n", target);
      break;
    }
  }
  auto final_train = (*trainer)->Evaluate(*train);
  if (!final_train.ok()) return Fail(final_train.status());
  std::cout << absl::StrFormat("final MSE: training %.4f, held-out %.4f (after %d epochs)\n",
                               final_train->mean_loss, test_mse, (*trainer)->epochs_done());
  return 0;
}
