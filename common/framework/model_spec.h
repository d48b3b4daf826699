// ModelSpec: what a trainer needs to know about a model besides its programs — which variable
// is the loss, which is the prediction, and how a batch of data::Examples becomes feed tensors.
// Examples (examples/mlp_regression, examples/ctr) build one; LocalTrainer and the distributed
// trainer consume it. It sits in common/ so that what describes a model depends on no runner.
// Plain values; thread-compatible.
#ifndef TESSERA_COMMON_FRAMEWORK_MODEL_SPEC_H_
#define TESSERA_COMMON_FRAMEWORK_MODEL_SPEC_H_

#include <cstdint>
#include <string>
#include <vector>

#include "proto/program.pb.h"
#include "proto/tensor.pb.h"

namespace tessera {

// One categorical slot: Example::sparse[i] feeds slots[i] as a [B, 1] int64 tensor.
struct SlotFeed {
  std::string name;
  // > 0: a local table of dict_size rows; raw ids are mapped into [0, dict_size) by a
  // non-negative modulo ((id % d) + d) % d. 0: ids are fed as they are (distributed tables,
  // whose rows are addressed by any int64).
  int64_t dict_size = 0;
};

// How Examples become feed tensors. B is the batch size of each step.
struct FeedSpec {
  // Dense features: Example::dense -> [B, num_dense] float32 variable `dense` ("" = none).
  std::string dense;
  int num_dense = 0;
  // Categorical slots, in Example::sparse order (may be empty).
  std::vector<SlotFeed> slots;
  // Multi-hot slots, in Example::multi order: Example::multi[i] feeds multi_slots[i] as the
  // batch's ids concatenated, [total, 1] int64, one sequence per example (Tensor::lod).
  std::vector<SlotFeed> multi_slots;
  // Example::label -> [B, 1] tensor `label` of `label_dtype` (FLOAT32, FLOAT64, or INT64 for
  // class indices, where the label must be a non-negative integer).
  std::string label;
  DataType label_dtype = FLOAT32;
};

struct ModelSpec {
  ProgramDesc main;        // forward + backward + optimize ops (block 0)
  ProgramDesc startup;     // initializes the persistable variables
  std::string loss;        // [1] variable: the mean loss of a batch
  std::string prediction;  // [B, 1] probability of the positive class for AUC; "" if none
  std::vector<std::string> metrics;  // what to report on held-out data ("auc", "mse", ...)
  FeedSpec feeds;
};

}  // namespace tessera

#endif  // TESSERA_COMMON_FRAMEWORK_MODEL_SPEC_H_
