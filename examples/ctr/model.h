// A wide & deep click-through-rate model over Criteo-shaped examples (13 dense features, 26
// categorical slots), like Fluid's CTR/DeepFM demos:
//
//   deep:  concat(emb_0(slot_0), ..., emb_25(slot_25), dense_input) -> fc relu 64 -> fc relu 32
//          -> fc 1                                    (embeddings of dimension embedding_dim)
//   wide:  sum_s wide_s(slot_s)  +  linear(dense_input)      (dimension-1 embeddings per slot)
//   logit = deep + wide;  loss = mean(sigmoid_cross_entropy_with_logits(logit, label));
//   prediction = sigmoid(logit).
#ifndef TESSERA_EXAMPLES_CTR_MODEL_H_
#define TESSERA_EXAMPLES_CTR_MODEL_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/framework/op_registry.h"
#include "common/framework/model_spec.h"
#include "proto/model.pb.h"

namespace tessera {
namespace examples {

struct CtrOptions {
  int num_dense = 13;         // >= 0 (0: no dense input)
  int num_slots = 26;         // >= 1
  int64_t embedding_dim = 8;  // >= 1
  // Rows of each slot's local tables (emb_<s>, wide_<s>): dict_sizes[s] when given (then it has
  // num_slots entries), else dict_size. Raw ids are fed modulo this size (FeedSpec). For
  // distributed tables the size is only a hint and ids are fed unchanged.
  int64_t dict_size = 100000;
  std::vector<int64_t> dict_sizes;
  bool is_sparse = true;                   // sparse (SelectedRows) gradients for the tables
  bool is_distributed = false;             // tables live only on pservers (implies is_sparse)
  std::vector<int64_t> hidden = {64, 32};  // deep fc sizes (ReLU)
  std::string optimizer = "adam";          // "sgd", "momentum" (0.9), "adam" or "adagrad"
  float learning_rate = 0.001f;
  float l2_decay = 0.0f;
  int64_t random_seed = 0;  // program seed (initializers); 0 = the builder's default
};

// Feeds: "dense_input" [-1, num_dense] float32, "slot_<s>" [-1, 1] int64 for each slot,
// "label" [-1, 1] float32 (0/1). ModelSpec::prediction is the sigmoid of the logit.
// InvalidArgument names a bad option; Minimize's errors pass through.
// The model file (forward program, feeds, optimizer); BuildCtr compiles it.
absl::StatusOr<ModelFile> CtrModelFile(const CtrOptions& options = {});
absl::StatusOr<ModelSpec> BuildCtr(const OpRegistry& registry, const CtrOptions& options = {});

}  // namespace examples
}  // namespace tessera

#endif  // TESSERA_EXAMPLES_CTR_MODEL_H_
