// Layers: functions that append the forward ops of common model pieces to a ProgramBuilder and
// return the name of the output variable (like fluid.layers). Shapes use -1 for the batch.
#ifndef TESSERA_COMMON_LAYERS_LAYERS_H_
#define TESSERA_COMMON_LAYERS_LAYERS_H_

#include <string>
#include <vector>

#include "common/layers/program_builder.h"

namespace tessera {
namespace layers {

// An input fed by the trainer (no gradient flows into it).
std::string Data(ProgramBuilder& b, absl::string_view name, const Shape& shape,
                 DataType dtype = FLOAT32);

struct FcOptions {
  std::string name;          // parameter prefix; "" = unique "fc_N"
  std::string act;           // "", "relu", "sigmoid", "tanh"
  bool bias = true;
  Initializer weight_init = Initializer::Xavier();
  Initializer bias_init = Initializer::Constant(0.0f);
};
// out = act(input · W + b); input [-1, K] (or more dims, flattened after dim 0), out [-1, size].
std::string Fc(ProgramBuilder& b, absl::string_view input, int64_t size, FcOptions opts = {});

struct EmbeddingOptions {
  std::string name;       // table name; "" = unique "embedding_N"
  bool is_sparse = false;       // gradient as SelectedRows (only touched rows updated)
  bool is_distributed = false;  // table lives only on pservers (ids may be any int64)
  int64_t padding_idx = -1;
  Initializer init = Initializer::Uniform(-0.05f, 0.05f);
};
// ids [-1, 1] int64 -> [-1, dim]. dict_size is the row count of a local table; for a
// distributed table it is only a hint.
std::string Embedding(ProgramBuilder& b, absl::string_view ids, int64_t dict_size, int64_t dim,
                      EmbeddingOptions opts = {});

std::string Relu(ProgramBuilder& b, absl::string_view x);
std::string Sigmoid(ProgramBuilder& b, absl::string_view x);
std::string Tanh(ProgramBuilder& b, absl::string_view x);
// Applies the named activation ("" returns x unchanged).
std::string Activation(ProgramBuilder& b, absl::string_view x, absl::string_view act);

std::string ElementwiseAdd(ProgramBuilder& b, absl::string_view x, absl::string_view y,
                           int64_t axis = -1);
std::string ElementwiseMul(ProgramBuilder& b, absl::string_view x, absl::string_view y,
                           int64_t axis = -1);
std::string Scale(ProgramBuilder& b, absl::string_view x, float scale, float bias = 0.0f);
std::string Concat(ProgramBuilder& b, const std::vector<std::string>& xs, int64_t axis);
std::string Reshape(ProgramBuilder& b, absl::string_view x, const Shape& shape);
std::string Cast(ProgramBuilder& b, absl::string_view x, DataType dtype);
std::string Mean(ProgramBuilder& b, absl::string_view x);

// Image layers over NCHW inputs ([-1, C, H, W]).
struct Conv2dOptions {
  std::string name;  // parameter prefix; "" = unique "conv2d_N"
  std::string act;   // "", "relu", "sigmoid", "tanh"
  int64_t stride = 1;
  int64_t padding = 0;
  int64_t dilation = 1;
  bool bias = true;
  // Filter init; kXavierUniform uses the filter's fan-in C kh kw and fan-out M kh kw.
  Initializer filter_init = Initializer::Xavier();
};
// out = act(conv2d(input, W) + b), W [num_filters, C, k, k], b [num_filters].
std::string Conv2d(ProgramBuilder& b, absl::string_view input, int64_t num_filters,
                   int64_t filter_size, Conv2dOptions opts = {});
// Max ("max") or average ("avg") pooling over size x size windows.
std::string Pool2d(ProgramBuilder& b, absl::string_view input, int64_t size,
                   absl::string_view type = "max", int64_t stride = 0 /* = size */,
                   int64_t padding = 0);
// [d0, ..., dk] -> [d0 ... d(axis-1), d(axis) ... dk].
std::string Flatten(ProgramBuilder& b, absl::string_view x, int64_t axis = 1);
struct BatchNormOptions {
  std::string name;  // parameter prefix; "" = unique "batch_norm_N"
  std::string act;
  float momentum = 0.9f;
  float epsilon = 1e-5f;
};
// Normalizes each channel (dim 1) of input; learns <name>.scale and <name>.bias and keeps the
// running statistics <name>.mean and <name>.variance (persistable, not trained; local to each
// trainer in distributed training).
std::string BatchNorm(ProgramBuilder& b, absl::string_view input, BatchNormOptions opts = {});
// Zeros each element with probability `prob` in training (downgrade_in_infer: inference scales
// by 1 - prob); `seed` keys the draws.
std::string Dropout(ProgramBuilder& b, absl::string_view x, float prob, int64_t seed = 0);
// The share of rows of scores [-1, C] whose label [-1, 1] is among the top k ([1]).
std::string Accuracy(ProgramBuilder& b, absl::string_view scores, absl::string_view label,
                     int64_t k = 1);

// Per-example losses, shape [-1, 1].
std::string SquareError(ProgramBuilder& b, absl::string_view x, absl::string_view label);
// logits [-1, C], label [-1, 1] int64. Returns the loss; *softmax (if given) gets the softmax.
std::string SoftmaxWithCrossEntropy(ProgramBuilder& b, absl::string_view logits,
                                    absl::string_view label, std::string* softmax = nullptr);
// logits and label [-1, 1] float (label 0/1).
std::string SigmoidCrossEntropyWithLogits(ProgramBuilder& b, absl::string_view logits,
                                          absl::string_view label);

}  // namespace layers
}  // namespace tessera

#endif  // TESSERA_COMMON_LAYERS_LAYERS_H_
