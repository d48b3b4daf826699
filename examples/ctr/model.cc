#include "examples/ctr/model.h"

#include <cmath>
#include <memory>

#include "absl/strings/str_cat.h"
#include "common/layers/layers.h"
#include "common/layers/program_builder.h"
#include "common/layers/model_file.h"
#include "common/base/status.h"

namespace tessera {
namespace examples {

namespace {

absl::Status Invalid(absl::string_view what) {
  return absl::InvalidArgumentError(absl::StrCat("ctr: ", what));
}

absl::StatusOr<OptimizerConfig> MakeOptimizer(const CtrOptions& o) {
  if (o.optimizer != "sgd" && o.optimizer != "momentum" && o.optimizer != "adam" &&
      o.optimizer != "adagrad") {
    return Invalid(
        absl::StrCat("unknown optimizer '", o.optimizer, "' (use sgd, momentum, adam or adagrad)"));
  }
  OptimizerConfig c;
  c.set_type(o.optimizer);
  c.set_learning_rate(o.learning_rate);
  c.set_l2_decay(o.l2_decay);
  if (o.optimizer == "momentum") c.set_momentum(0.9f);
  return c;
}

}  // namespace

absl::StatusOr<ModelFile> CtrModelFile(const CtrOptions& options) {
  if (options.num_dense < 0) return Invalid(absl::StrCat("num_dense ", options.num_dense, " < 0"));
  if (options.num_slots < 1) return Invalid(absl::StrCat("num_slots ", options.num_slots, " < 1"));
  if (options.embedding_dim < 1) {
    return Invalid(absl::StrCat("embedding_dim ", options.embedding_dim, " < 1"));
  }
  if (!options.dict_sizes.empty() &&
      options.dict_sizes.size() != static_cast<size_t>(options.num_slots)) {
    return Invalid(absl::StrCat("dict_sizes has ", options.dict_sizes.size(),
                                " entries but there are ", options.num_slots, " slots"));
  }
  std::vector<int64_t> dict(options.num_slots, options.dict_size);
  if (!options.dict_sizes.empty()) dict = options.dict_sizes;
  for (int s = 0; s < options.num_slots; ++s) {
    if (dict[s] < 1) return Invalid(absl::StrCat("dict size of slot ", s, " is ", dict[s]));
  }
  for (int64_t h : options.hidden) {
    if (h < 1) return Invalid(absl::StrCat("hidden layer size ", h, " < 1"));
  }
  if (!(options.learning_rate > 0) || !std::isfinite(options.learning_rate)) {
    return Invalid(absl::StrCat("learning_rate must be positive, got ", options.learning_rate));
  }
  TS_ASSIGN_OR_RETURN(OptimizerConfig optimizer, MakeOptimizer(options));

  ModelParts spec;
  spec.forward.set_random_seed(options.random_seed);
  ProgramBuilder b(&spec.forward, &spec.startup);
  const bool sparse = options.is_sparse || options.is_distributed;

  std::string dense;
  if (options.num_dense > 0) dense = layers::Data(b, "dense_input", {-1, options.num_dense});
  std::string label = layers::Data(b, "label", {-1, 1});

  std::vector<std::string> deep_inputs, wide_terms;
  for (int s = 0; s < options.num_slots; ++s) {
    std::string ids = layers::Data(b, absl::StrCat("slot_", s), {-1, 1}, INT64);
    layers::EmbeddingOptions eo;
    eo.is_sparse = sparse;
    eo.is_distributed = options.is_distributed;
    eo.name = absl::StrCat("emb_", s);
    deep_inputs.push_back(layers::Embedding(b, ids, dict[s], options.embedding_dim, eo));
    layers::EmbeddingOptions wo = eo;
    wo.name = absl::StrCat("wide_", s);
    wo.init = Initializer::Constant(0.0f);
    wide_terms.push_back(layers::Embedding(b, ids, dict[s], 1, wo));
    spec.feeds.slots.push_back({ids, options.is_distributed ? 0 : dict[s]});
  }

  // Deep part.
  if (!dense.empty()) deep_inputs.push_back(dense);
  std::string h = layers::Concat(b, deep_inputs, 1);
  for (size_t i = 0; i < options.hidden.size(); ++i) {
    layers::FcOptions fc;
    fc.name = absl::StrCat("deep_fc_", i);
    fc.act = "relu";
    h = layers::Fc(b, h, options.hidden[i], fc);
  }
  layers::FcOptions out;
  out.name = "deep_out";
  std::string logit = layers::Fc(b, h, 1, out);

  // Wide part: the per-slot weights summed, plus a linear term on the dense features.
  std::string wide = "wide_sum";
  b.CreateVar(wide, {-1, 1});
  b.AppendOp(MakeOp("sum", {{"X", wide_terms}}, {{"Out", {wide}}}));
  logit = layers::ElementwiseAdd(b, logit, wide);
  if (!dense.empty()) {
    layers::FcOptions lin;
    lin.name = "wide_dense";
    lin.bias = false;  // deep_out carries the bias
    logit = layers::ElementwiseAdd(b, logit, layers::Fc(b, dense, 1, lin));
  }

  std::string loss = layers::Mean(b, layers::SigmoidCrossEntropyWithLogits(b, logit, label));
  std::string prediction = layers::Sigmoid(b, logit);

  spec.loss = loss;
  spec.prediction = prediction;
  spec.metrics = {"auc", "log_loss"};
  spec.optimizer = optimizer;
  spec.feeds.dense = dense;
  spec.feeds.num_dense = options.num_dense;
  spec.feeds.label = label;
  spec.feeds.label_dtype = FLOAT32;
  return MakeModelFile(std::move(spec));
}

absl::StatusOr<ModelSpec> BuildCtr(const OpRegistry& registry, const CtrOptions& options) {
  TS_ASSIGN_OR_RETURN(ModelFile model, CtrModelFile(options));
  return CompileModel(model, registry, "ctr");
}

}  // namespace examples
}  // namespace tessera
