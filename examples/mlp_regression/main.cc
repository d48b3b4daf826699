// mlp_regression: trains the classic perceptron regression model on one machine.
//
//   bazel run //examples/mlp_regression -- [--epochs=100] [--batch_size=32] [--lr=0.001]
//   mlp_regression --program=main.pbtxt --startup_program=startup.pbtxt [...]
//
// Generates 10,000 training examples (10 features uniform in [1, 2], target sum x_i^3 plus
// noise of variance 0.5) and a held-out set, trains with SGD + momentum 0.9, prints progress,
// and reports the mean squared error on both sets.
//
// --program/--startup_program train programs read from text-proto files instead (e.g. written
// by `tessera_program --example=mlp_regression --out=... --startup_out=...` and edited); they
// are fed the same x [-1, 10] and y [-1, 1] and must compute the built-in model's loss variable.
// Exit status: 0 on success, 2 for bad flags, 1 for anything that fails later (a file that does
// not parse, an unknown op type, shapes that disagree, ...), always with one line on stderr.
#include <cstdio>
#include <iostream>
#include <string>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/data/synthetic.h"
#include "common/base/mutex_tuning.h"
#include "common/ops/ops.h"
#include "common/framework/program_io.h"
#include "examples/example_main.h"
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
ABSL_FLAG(std::string, program, "",
          "Train this main program (text proto) instead of the built-in one; needs "
          "--startup_program. Fed x [-1, 10] and y [-1, 1]; --lr and --momentum do not apply.");
ABSL_FLAG(std::string, startup_program, "", "The startup program that goes with --program.");

namespace {

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "mlp_regression: %s\n", std::string(s.message()).c_str());
  return 1;
}

int BadFlag(const std::string& message) {
  std::fprintf(stderr, "mlp_regression: %s\n", message.c_str());
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  tessera::DisableMutexDeadlockDetection();  // as the daemons do (common/base/mutex_tuning.h)
  tessera::examples::ParseExampleFlags(
      argc, argv,
      "trains the 10-100-1 perceptron regression model on one machine and "
      "reports the mean squared error");
  using tessera::data::Dataset;
  const uint64_t seed = absl::GetFlag(FLAGS_seed);
  const std::string program_file = absl::GetFlag(FLAGS_program);
  const std::string startup_file = absl::GetFlag(FLAGS_startup_program);
  if (program_file.empty() != startup_file.empty()) {
    return BadFlag("--program and --startup_program go together: give both or neither");
  }
  if (absl::GetFlag(FLAGS_batch_size) < 1) {
    return BadFlag(
        absl::StrFormat("--batch_size=%d must be >= 1", absl::GetFlag(FLAGS_batch_size)));
  }
  if (absl::GetFlag(FLAGS_epochs) < 0) {
    return BadFlag(absl::StrFormat("--epochs=%d must be >= 0", absl::GetFlag(FLAGS_epochs)));
  }

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
  if (program_file.empty()) {
    std::cout << absl::StrFormat(
        "built the program: %d ops in main (forward, backward, momentum updates), %d in startup\n",
        model->main.blocks(0).ops_size(), model->startup.blocks(0).ops_size());
  } else {
    // Same feeds and loss variable as the built-in model; the programs come from the files.
    auto main_program = tessera::ReadProgramFile(program_file);
    if (!main_program.ok()) return Fail(main_program.status());
    auto startup_program = tessera::ReadProgramFile(startup_file);
    if (!startup_program.ok()) return Fail(startup_program.status());
    if (main_program->blocks_size() == 0 || startup_program->blocks_size() == 0) {
      return Fail(absl::InvalidArgumentError(
          absl::StrCat(main_program->blocks_size() == 0 ? program_file : startup_file,
                       ": the program has no blocks")));
    }
    model->main = *std::move(main_program);
    model->startup = *std::move(startup_program);
    std::cout << absl::StrFormat("read the program from %s (%d ops) and %s (%d ops)\n",
                                 program_file, model->main.blocks(0).ops_size(), startup_file,
                                 model->startup.blocks(0).ops_size());
  }

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
