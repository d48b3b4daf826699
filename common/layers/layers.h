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
