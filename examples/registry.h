// The example models by name, with their data, for the daemons and tools: a trainer or pserver
// started with --example=ctr builds the same single-machine program as examples/ctr does.
#ifndef TESSERA_EXAMPLES_REGISTRY_H_
#define TESSERA_EXAMPLES_REGISTRY_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/data/criteo.h"
#include "common/data/example.h"
#include "common/framework/op_registry.h"
#include "common/framework/model_spec.h"
#include "proto/model.pb.h"

namespace tessera {
namespace examples {

struct ExampleOptions {
  std::string name = "ctr";  // "ctr" | "mlp_regression" | "fashion_mnist_mlp" | "lenet"
  float learning_rate = 0.0f;      // 0: the example's default
  int64_t vocab_per_slot = 10000;  // ctr: synthetic ids per slot
  bool distributed_tables = false; // ctr: tables live on pservers
  uint64_t seed = 1;               // data seed (test data uses seed + 1000003)
  int64_t num_examples = 60000;
  int64_t num_test_examples = 5000;
  std::string train_data;          // data files instead of synthetic data (ctr)
  std::string test_data;
  // How the files are read (format, schema, longest line, bad lines skipped in train and test
  // data each); its num_multi is also the synthetic data's multi-hot slots (the model's
  // MULTI_SLOT feeds).
  data::CriteoDataOptions read;
};

// Names the daemons accept.
std::vector<std::string> ExampleNames();

// Rows of each local table of the built-in ctr model (ids are fed modulo this).
inline constexpr int64_t kCtrRowsPerSlot = 10000;

// The built-in model's file (cluster/builtin_models/<name>.pbtxt holds the same text; a test
// keeps them equal).
absl::StatusOr<ModelFile> ExampleModelFile(absl::string_view name);
// Its ModelSpec with the options' overrides (learning rate; ctr's distributed tables).
absl::StatusOr<ModelSpec> BuildExampleModel(const OpRegistry& registry,
                                            const ExampleOptions& options);

struct ExampleData {
  data::Dataset train, test;
  data::CriteoReadStats train_read, test_read;  // files read and lines skipped
};
// Synthetic data (deterministic in options.seed), or the given files (ctr), or Fashion-MNIST
// (fashion_mnist_mlp, lenet: IDX files, by default Debian's; the first num_examples training
// and num_test_examples held-out images) (data::ReadCriteoData's
// specs: files, directories, patterns; plain or gzip).
absl::StatusOr<ExampleData> LoadExampleData(const ExampleOptions& options);

}  // namespace examples
}  // namespace tessera

#endif  // TESSERA_EXAMPLES_REGISTRY_H_
