// ctr: trains the wide & deep click-through-rate model on one machine and reports the AUC on
// held-out data.
//
//   bazel run //examples/ctr -- [--epochs=1] [--train_samples=200000] [--vocab=100000]
//   bazel run //examples/ctr -- --train=train.txt --test=test.txt   (Criteo-format files, e.g.
//                                                                     from generate_data)
//
//   bazel run //examples/ctr -- --model=my_model.pbtxt [--train=... --test=...]
//                                      (any model file over Criteo-format examples)
//
// Without files it generates Criteo-like synthetic data (13 dense counts, 26 categorical slots
// with Zipf-distributed ids over all of int64, clicks drawn from a planted logistic model) and
// holds out a test set drawn from the same model.
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/strings/str_format.h"
#include "common/data/auc.h"
#include "common/data/criteo.h"
#include "common/data/synthetic.h"
#include "common/layers/model_file.h"
#include "common/base/mutex_tuning.h"
#include "common/ops/ops.h"
#include "examples/ctr/model.h"
#include "examples/example_main.h"
#include "trainer/local_trainer.h"

ABSL_FLAG(std::string, model, "",
          "Model file to train (proto/model.proto, e.g. written by python/tessera) instead of "
          "the built-in wide & deep model; its feeds bind the Criteo columns.");
ABSL_FLAG(std::string, train, "",
          "Criteo-format training data: comma-separated files, directories and glob patterns, "
          "plain or gzip (default: synthetic data).");
ABSL_FLAG(int64_t, max_bad_lines, 0,
          "Malformed data lines skipped (counted) before stopping; 0: stop at the first.");
ABSL_FLAG(std::string, test, "", "Criteo-format held-out file (required with --train).");
ABSL_FLAG(int64_t, train_samples, 200000, "Synthetic training examples.");
ABSL_FLAG(int64_t, test_samples, 50000, "Synthetic held-out examples.");
ABSL_FLAG(int64_t, vocab, 100000, "Synthetic distinct ids per slot.");
ABSL_FLAG(int64_t, dict_size, 100000, "Rows of each slot's embedding tables (ids modulo this).");
ABSL_FLAG(int64_t, embedding_dim, 8, "Dimension of the deep embeddings.");
ABSL_FLAG(int, epochs, 1, "Passes over the training set.");
ABSL_FLAG(int64_t, batch_size, 256, "Examples per step.");
ABSL_FLAG(std::string, optimizer, "adam", "sgd, momentum, adam or adagrad.");
ABSL_FLAG(double, lr, 0.001, "Learning rate.");
ABSL_FLAG(uint64_t, seed, 1, "Seed of the synthetic data and of the shuffling.");
ABSL_FLAG(int64_t, log_every_steps, 200, "Steps between progress lines (0: none).");

namespace {

int Fail(const absl::Status& s, int code = 1) {
  std::fprintf(stderr, "ctr: %s\n", std::string(s.message()).c_str());
  return code;
}

}  // namespace

int main(int argc, char** argv) {
  tessera::DisableMutexDeadlockDetection();  // as the daemons do (common/base/mutex_tuning.h)
  tessera::examples::ParseExampleFlags(
      argc, argv,
      "trains a click model (the built-in wide & deep, or --model=FILE) on one machine on "
      "Criteo-format data (--train/--test) or synthetic data, and reports the held-out AUC");
  namespace data = tessera::data;
  const std::string train_path = absl::GetFlag(FLAGS_train);
  const std::string test_path = absl::GetFlag(FLAGS_test);
  if (train_path.empty() != test_path.empty()) {
    std::fprintf(stderr, "ctr: --train and --test go together (got --train='%s' --test='%s')\n",
                 train_path.c_str(), test_path.c_str());
    return 2;
  }

  std::cout << "ctr: a wide & deep click model (26 embedded slots + 13 dense features)\n";
  // A model file's multi-hot slots (MULTI_SLOT feeds) come after the categorical ones.
  const std::string model_path = absl::GetFlag(FLAGS_model);
  absl::StatusOr<tessera::ModelFile> file;
  int num_multi = 0;
  if (!model_path.empty()) {
    file = tessera::ReadModelFile(model_path);
    if (!file.ok()) return Fail(file.status(), 2);
    for (const tessera::FeedBinding& f : file->feeds()) {
      num_multi += f.source() == tessera::FeedBinding::MULTI_SLOT;
    }
  }
  data::Dataset train, test;
  if (!train_path.empty()) {
    data::CriteoDataOptions read;
    read.num_multi = num_multi;
    read.max_bad_lines = absl::GetFlag(FLAGS_max_bad_lines);
    data::CriteoReadStats train_read, test_read;
    auto tr = data::ReadCriteoData(train_path, read, &train_read);
    if (!tr.ok()) return Fail(tr.status());
    auto te = data::ReadCriteoData(test_path, read, &test_read);
    if (!te.ok()) return Fail(te.status());
    for (const data::CriteoReadStats* r : {&train_read, &test_read}) {
      if (r->bad_lines > 0) {
        std::cout << "skipped " << r->bad_lines << " bad lines; the first: " << r->first_bad_line
                  << "\n";
      }
    }
    train = *std::move(tr);
    test = *std::move(te);
    std::cout << absl::StrFormat("read %d training examples from %s, %d held-out from %s\n",
                                 train.examples.size(), train_path, test.examples.size(),
                                 test_path);
  } else {
    data::CtrDataOptions o;
    o.vocab_per_slot = absl::GetFlag(FLAGS_vocab);
    o.seed = absl::GetFlag(FLAGS_seed);
    o.model_seed = 7;
    o.num_multi = num_multi;
    auto tr = data::MakeCtrData(absl::GetFlag(FLAGS_train_samples), o);
    if (!tr.ok()) return Fail(tr.status());
    o.seed += 1000003;  // different examples, same planted model
    auto te = data::MakeCtrData(absl::GetFlag(FLAGS_test_samples), o);
    if (!te.ok()) return Fail(te.status());
    train = *std::move(tr);
    test = *std::move(te);
    std::cout << absl::StrFormat(
        "generated %d training and %d held-out examples (%d ids per slot, Zipf)\n",
        train.examples.size(), test.examples.size(), o.vocab_per_slot);
    // The best any model can do: the AUC of the planted logits themselves.
    auto generator = data::CtrGenerator::Create(o);
    if (!generator.ok()) return Fail(generator.status());
    std::vector<double> true_logits;
    std::vector<float> labels;
    for (const auto& e : test.examples) {
      true_logits.push_back(generator->TrueLogit(e));
      labels.push_back(e.label);
    }
    auto best = data::ExactAuc(true_logits, labels);
    if (best.ok()) {
      std::cout << absl::StrFormat("the planted model scores held-out AUC %.4f (the ceiling)\n",
                                   *best);
    }
  }
  double clicks = 0;
  for (const auto& e : train.examples) clicks += e.label;
  std::cout << absl::StrFormat("training click rate %.3f\n",
                               clicks / std::max<size_t>(1, train.examples.size()));

  auto registry = tessera::NewStandardOpRegistry();
  tessera::examples::CtrOptions mo;
  mo.num_dense = train.num_dense;
  mo.num_slots = train.num_sparse;
  mo.dict_size = absl::GetFlag(FLAGS_dict_size);
  mo.embedding_dim = absl::GetFlag(FLAGS_embedding_dim);
  mo.optimizer = absl::GetFlag(FLAGS_optimizer);
  mo.learning_rate = static_cast<float>(absl::GetFlag(FLAGS_lr));
  absl::StatusOr<tessera::ModelSpec> model;
  if (model_path.empty()) {
    model = tessera::examples::BuildCtr(*registry, mo);
  } else {
    // One process: distributed tables become local ones (ids modulo their declared rows).
    tessera::ModelOverrides local;
    local.single_machine = true;
    model = tessera::CompileModel(tessera::ApplyOverrides(*std::move(file), local), *registry,
                                  model_path);
    if (!model.ok()) return Fail(model.status(), 2);
  }
  if (!model.ok()) return Fail(model.status());
  std::cout << absl::StrFormat("built the program%s: %d ops in main, %d in startup\n",
                               model_path.empty() ? "" : " of " + model_path,
                               model->main.blocks(0).ops_size(),
                               model->startup.blocks(0).ops_size());

  tessera::LocalTrainer::Options to;
  to.batch_size = absl::GetFlag(FLAGS_batch_size);
  to.epochs = absl::GetFlag(FLAGS_epochs);
  to.log_every_steps = absl::GetFlag(FLAGS_log_every_steps);
  to.seed = absl::GetFlag(FLAGS_seed);
  auto trainer = tessera::LocalTrainer::Create(registry.get(), *std::move(model), to);
  if (!trainer.ok()) return Fail(trainer.status());
  std::cout << absl::StrFormat("training %d epochs, batch size %d\n", to.epochs, to.batch_size);
  double auc = 0;
  for (int e = 0; e < to.epochs; ++e) {
    auto stats = (*trainer)->TrainEpoch(train);
    if (!stats.ok()) return Fail(stats.status());
    auto eval = (*trainer)->Evaluate(test);
    if (!eval.ok()) return Fail(eval.status());
    auc = eval->auc;
    std::cout << absl::StrFormat("epoch %d held-out loss %.4f AUC %.4f\n", e, eval->mean_loss,
                                 eval->has_auc ? eval->auc : 0.0);
  }
  std::cout << absl::StrFormat("final held-out AUC %.4f\n", auc);
  return 0;
}
