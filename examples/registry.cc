#include "examples/registry.h"

#include "absl/strings/str_cat.h"
#include "common/data/criteo.h"
#include "common/data/synthetic.h"
#include "common/layers/model_file.h"
#include "common/base/status.h"
#include "examples/ctr/model.h"
#include "examples/fashion_mnist/model.h"
#include "examples/mlp_regression/model.h"

namespace tessera {
namespace examples {

namespace {
constexpr uint64_t kTestSeedOffset = 1000003;
constexpr uint64_t kModelSeed = 7;
}  // namespace

std::vector<std::string> ExampleNames() {
  return {"ctr", "mlp_regression", "fashion_mnist_mlp", "lenet"};
}

absl::StatusOr<ModelFile> ExampleModelFile(absl::string_view name) {
  if (name == "ctr") {
    CtrOptions o;
    o.dict_size = kCtrRowsPerSlot;
    o.is_sparse = true;
    return CtrModelFile(o);
  }
  if (name == "mlp_regression") return MlpRegressionModelFile();
  if (name == "fashion_mnist_mlp") return FashionMnistMlpModelFile();
  if (name == "lenet") return LenetModelFile();
  return absl::InvalidArgumentError(absl::StrCat(
      "unknown example '", name, "' (known: ctr, mlp_regression, fashion_mnist_mlp, lenet)"));
}

absl::StatusOr<ModelSpec> BuildExampleModel(const OpRegistry& registry,
                                            const ExampleOptions& options) {
  TS_ASSIGN_OR_RETURN(ModelFile model, ExampleModelFile(options.name));
  ModelOverrides overrides;
  overrides.learning_rate = options.learning_rate;
  overrides.distributed_tables = options.name == "ctr" && options.distributed_tables;
  return CompileModel(ApplyOverrides(std::move(model), overrides), registry,
                      absl::StrCat("built-in ", options.name));
}

absl::StatusOr<ExampleData> LoadExampleData(const ExampleOptions& options) {
  ExampleData d;
  if (options.name == "mlp_regression") {
    auto train = data::MakeRegressionData(options.num_examples, options.seed);
    if (!train.ok()) return train.status();
    auto test = data::MakeRegressionData(options.num_test_examples, options.seed + kTestSeedOffset);
    if (!test.ok()) return test.status();
    d.train = std::move(*train);
    d.test = std::move(*test);
    return d;
  }
  if (options.name == "fashion_mnist_mlp" || options.name == "lenet") {
    // Real data: Debian's Fashion-MNIST unless --train_data / --test_data name other IDX files;
    // num_examples and num_test_examples take the first images.
    const std::string train_spec =
        options.train_data.empty() ? kFashionMnistTrain : options.train_data;
    const std::string test_spec = options.test_data.empty()
                                      ? (options.train_data.empty() ? kFashionMnistTest : "")
                                      : options.test_data;
    TS_ASSIGN_OR_RETURN(d.train, ReadFashionMnist(train_spec, options.num_examples));
    if (!test_spec.empty() && options.num_test_examples > 0) {
      TS_ASSIGN_OR_RETURN(d.test, ReadFashionMnist(test_spec, options.num_test_examples));
    }
    return d;
  }
  if (options.name != "ctr") {
    return absl::InvalidArgumentError(absl::StrCat("unknown example '", options.name, "'"));
  }
  if (!options.train_data.empty()) {
    auto train = data::ReadCriteoData(options.train_data, options.read, &d.train_read);
    if (!train.ok()) return train.status();
    d.train = std::move(*train);
    if (!options.test_data.empty()) {
      auto test = data::ReadCriteoData(options.test_data, options.read, &d.test_read);
      if (!test.ok()) return test.status();
      d.test = std::move(*test);
    }
    return d;
  }
  data::CtrDataOptions o;
  o.vocab_per_slot = options.vocab_per_slot;
  o.num_multi = options.read.num_multi;
  o.model_seed = kModelSeed;
  o.seed = options.seed;
  auto train = data::MakeCtrData(options.num_examples, o);
  if (!train.ok()) return train.status();
  o.seed = options.seed + kTestSeedOffset;
  auto test = data::MakeCtrData(options.num_test_examples, o);
  if (!test.ok()) return test.status();
  d.train = std::move(*train);
  d.test = std::move(*test);
  return d;
}

}  // namespace examples
}  // namespace tessera
