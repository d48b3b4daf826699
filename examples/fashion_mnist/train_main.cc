#include "examples/fashion_mnist/train_main.h"

#include <cstdio>
#include <iostream>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/layers/model_file.h"
#include "common/base/mutex_tuning.h"
#include "common/ops/ops.h"
#include "examples/example_main.h"
#include "trainer/local_trainer.h"

ABSL_FLAG(int, epochs, 0,
          "Passes over the training set (0: the model's default, mlp 10, lenet 5).");
ABSL_FLAG(int64_t, batch_size, 64, "Examples per step.");
ABSL_FLAG(double, lr, 0, "Learning rate of SGD with momentum (0: the model's default).");
ABSL_FLAG(double, momentum, 0.9, "Momentum.");
ABSL_FLAG(std::string, train_data, tessera::examples::kFashionMnistTrain,
          "IDX training data: a prefix (<prefix>-images-idx3-ubyte[.gz] and "
          "<prefix>-labels-idx1-ubyte[.gz]) or '<images>,<labels>'; the default is where "
          "Debian's dataset-fashion-mnist installs it.");
ABSL_FLAG(std::string, test_data, tessera::examples::kFashionMnistTest,
          "IDX held-out data, as --train_data.");
ABSL_FLAG(int64_t, train_samples, 0, "Train on the first N training images (0: all 60,000).");
ABSL_FLAG(int64_t, test_samples, 0, "Evaluate on the first N held-out images (0: all 10,000).");
ABSL_FLAG(uint64_t, seed, 1, "Seed of the shuffling.");
ABSL_FLAG(int64_t, log_every_steps, 200, "Steps between progress lines (0: none).");
ABSL_FLAG(double, target_accuracy, 0,
          "Stop once the held-out accuracy reaches this after an epoch (0: run every epoch).");

namespace tessera {
namespace examples {

int RunImageExample(int argc, char** argv, const std::string& name, const std::string& about,
                    int default_epochs, const ImageModelFn& model_fn) {
  DisableMutexDeadlockDetection();  // as the daemons do (common/base/mutex_tuning.h)
  ParseExampleFlags(argc, argv, about);
  auto fail = [&](const absl::Status& s, int code) {
    std::fprintf(stderr, "%s: %s\n", name.c_str(), std::string(s.message()).c_str());
    return code;
  };
  const int epochs = absl::GetFlag(FLAGS_epochs) > 0 ? absl::GetFlag(FLAGS_epochs) : default_epochs;
  if (absl::GetFlag(FLAGS_epochs) < 0 || absl::GetFlag(FLAGS_batch_size) < 1 ||
      absl::GetFlag(FLAGS_lr) < 0) {
    return fail(
        absl::InvalidArgumentError(absl::StrFormat(
            "--epochs=%d must be >= 0, --batch_size=%d >= 1 and --lr=%g >= 0",
            absl::GetFlag(FLAGS_epochs), absl::GetFlag(FLAGS_batch_size), absl::GetFlag(FLAGS_lr))),
        2);
  }
  auto train =
      ReadFashionMnist(absl::GetFlag(FLAGS_train_data), absl::GetFlag(FLAGS_train_samples));
  if (!train.ok()) return fail(train.status(), 1);
  auto test = ReadFashionMnist(absl::GetFlag(FLAGS_test_data), absl::GetFlag(FLAGS_test_samples));
  if (!test.ok()) return fail(test.status(), 1);
  std::cout << absl::StrFormat("%s: %d training and %d held-out images\n", name,
                               train->examples.size(), test->examples.size());

  ImageModelOptions mo;
  mo.learning_rate = static_cast<float>(absl::GetFlag(FLAGS_lr));
  mo.momentum = static_cast<float>(absl::GetFlag(FLAGS_momentum));
  auto file = model_fn(mo);
  if (!file.ok()) return fail(file.status(), 2);
  auto registry = NewStandardOpRegistry();
  auto model = CompileModel(*file, *registry, name);
  if (!model.ok()) return fail(model.status(), 1);
  LocalTrainer::Options to;
  to.batch_size = absl::GetFlag(FLAGS_batch_size);
  to.epochs = epochs;
  to.log_every_steps = absl::GetFlag(FLAGS_log_every_steps);
  to.seed = absl::GetFlag(FLAGS_seed);
  auto trainer = LocalTrainer::Create(registry.get(), *std::move(model), to);
  if (!trainer.ok()) return fail(trainer.status(), 1);
  std::cout << absl::StrFormat("training %d epochs, batch size %d, lr %g, momentum %g\n", epochs,
                               to.batch_size, file->optimizer().learning_rate(), mo.momentum);
  const double target = absl::GetFlag(FLAGS_target_accuracy);
  for (int e = 0; e < epochs; ++e) {
    auto stats = (*trainer)->TrainEpoch(*train);
    if (!stats.ok()) return fail(stats.status(), 1);
    auto eval = (*trainer)->Evaluate(*test);
    if (!eval.ok()) return fail(eval.status(), 1);
    std::cout << absl::StrFormat(
        "epoch %d: train loss %.4f, %.0f samples/s; held-out loss %.4f accuracy %.4f\n", e,
        stats->mean_loss, stats->samples_per_sec, eval->mean_loss, eval->accuracy);
    if (target > 0 && eval->accuracy >= target) {
      std::cout << absl::StrFormat("held-out accuracy reached the target %g: stopping\n", target);
      break;
    }
  }
  return 0;
}

}  // namespace examples
}  // namespace tessera
