#include "common/layers/layers.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"

namespace tessera {
namespace layers {

namespace {

const VarDesc& VarOf(ProgramBuilder& b, absl::string_view name) {
  const VarDesc* v = b.FindVar(name);
  if (v == nullptr) {  // a layer used on a name nobody declared: programmer error
    std::fprintf(stderr, "tessera layers: variable '%.*s' is not declared\n",
                 static_cast<int>(name.size()), name.data());
    std::abort();
  }
  return *v;
}

Shape ShapeOf(ProgramBuilder& b, absl::string_view name) {
  const VarDesc& v = VarOf(b, name);
  return Shape(v.shape().begin(), v.shape().end());
}

// Appends a one-input one-output op whose output has the input's shape.
std::string Unary(ProgramBuilder& b, absl::string_view type, absl::string_view x) {
  std::string out = b.UniqueName(absl::StrCat(type, ".out"));
  b.CreateVar(out, ShapeOf(b, x), VarOf(b, x).dtype());
  b.AppendOp(MakeOp(type, {{"X", {std::string(x)}}}, {{"Out", {out}}}));
  return out;
}

std::string Binary(ProgramBuilder& b, absl::string_view type, absl::string_view x,
                   absl::string_view y, int64_t axis) {
  std::string out = b.UniqueName(absl::StrCat(type, ".out"));
  b.CreateVar(out, ShapeOf(b, x), VarOf(b, x).dtype());
  OpDesc* op =
      b.AppendOp(MakeOp(type, {{"X", {std::string(x)}}, {"Y", {std::string(y)}}}, {{"Out", {out}}}));
  SetAttr(op, "axis", axis);
  return out;
}

}  // namespace

std::string Data(ProgramBuilder& b, absl::string_view name, const Shape& shape, DataType dtype) {
  VarDesc* v = b.CreateVar(name, shape, dtype);
  v->set_stop_gradient(true);
  return std::string(name);
}

std::string Fc(ProgramBuilder& b, absl::string_view input, int64_t size, FcOptions opts) {
  std::string prefix = opts.name.empty() ? b.UniqueName("fc") : opts.name;
  Shape in_shape = ShapeOf(b, input);
  int64_t k = 1;
  for (size_t i = 1; i < in_shape.size(); ++i) k *= in_shape[i];
  DataType dtype = VarOf(b, input).dtype();
  std::string w = absl::StrCat(prefix, ".w");
  b.CreateParameter(w, {k, size}, opts.weight_init, dtype);
  std::string mul_out = absl::StrCat(prefix, ".mul");
  Shape out_shape = {in_shape.empty() ? -1 : in_shape[0], size};
  b.CreateVar(mul_out, out_shape, dtype);
  OpDesc* mul =
      b.AppendOp(MakeOp("mul", {{"X", {std::string(input)}}, {"Y", {w}}}, {{"Out", {mul_out}}}));
  SetAttr(mul, "x_num_col_dims", int64_t{1});
  std::string out = mul_out;
  if (opts.bias) {
    std::string bias = absl::StrCat(prefix, ".b");
    b.CreateParameter(bias, {size}, opts.bias_init, dtype);
    out = absl::StrCat(prefix, ".pre_act");
    b.CreateVar(out, out_shape, dtype);
    OpDesc* add = b.AppendOp(
        MakeOp("elementwise_add", {{"X", {mul_out}}, {"Y", {bias}}}, {{"Out", {out}}}));
    SetAttr(add, "axis", int64_t{1});
  }
  return Activation(b, out, opts.act);
}

std::string Embedding(ProgramBuilder& b, absl::string_view ids, int64_t dict_size, int64_t dim,
                      EmbeddingOptions opts) {
  std::string table = opts.name.empty() ? b.UniqueName("embedding") : opts.name;
  VarDesc* w = b.CreateParameter(table, {dict_size, dim}, opts.init);
  w->set_is_sparse(opts.is_sparse);
  w->set_is_distributed(opts.is_distributed);
  std::string out = b.UniqueName(absl::StrCat(table, ".out"));
  Shape ids_shape = ShapeOf(b, ids);
  b.CreateVar(out, {ids_shape.empty() ? -1 : ids_shape[0], dim});
  OpDesc* op = b.AppendOp(
      MakeOp("lookup_table", {{"W", {table}}, {"Ids", {std::string(ids)}}}, {{"Out", {out}}}));
  SetAttr(op, "is_sparse", opts.is_sparse);
  SetAttr(op, "is_distributed", opts.is_distributed);
  SetAttr(op, "padding_idx", opts.padding_idx);
  return out;
}

namespace {

// An output extent of a window sliding over `in` (-1 stays unknown).
int64_t SlideExtent(int64_t in, int64_t window, int64_t stride, int64_t padding) {
  return in < 0 ? -1 : (in + 2 * padding - window) / stride + 1;
}

}  // namespace

std::string Conv2d(ProgramBuilder& b, absl::string_view input, int64_t num_filters,
                   int64_t filter_size, Conv2dOptions opts) {
  std::string prefix = opts.name.empty() ? b.UniqueName("conv2d") : opts.name;
  const Shape in = ShapeOf(b, input);  // [-1, C, H, W]
  const DataType dtype = VarOf(b, input).dtype();
  const int64_t c = in.size() == 4 ? in[1] : 1;
  Initializer init = opts.filter_init;
  if (init.kind == Initializer::kXavierUniform) {
    const double receptive = static_cast<double>(filter_size * filter_size);
    const float bound = static_cast<float>(
        std::sqrt(6.0 / (receptive * static_cast<double>(c + num_filters))));
    init = Initializer::Uniform(-bound, bound);
  }
  std::string w = absl::StrCat(prefix, ".w");
  b.CreateParameter(w, {num_filters, c, filter_size, filter_size}, init, dtype);
  const int64_t span = opts.dilation * (filter_size - 1) + 1;
  Shape out_shape = {in.empty() ? -1 : in[0], num_filters,
                     in.size() == 4 ? SlideExtent(in[2], span, opts.stride, opts.padding) : -1,
                     in.size() == 4 ? SlideExtent(in[3], span, opts.stride, opts.padding) : -1};
  std::string conv_out = absl::StrCat(prefix, ".conv");
  b.CreateVar(conv_out, out_shape, dtype);
  OpDesc* op = b.AppendOp(MakeOp("conv2d", {{"Input", {std::string(input)}}, {"Filter", {w}}},
                                 {{"Output", {conv_out}}}));
  SetAttr(op, "strides", std::vector<int64_t>{opts.stride, opts.stride});
  SetAttr(op, "paddings", std::vector<int64_t>{opts.padding, opts.padding});
  SetAttr(op, "dilations", std::vector<int64_t>{opts.dilation, opts.dilation});
  std::string out = conv_out;
  if (opts.bias) {
    std::string bias = absl::StrCat(prefix, ".b");
    b.CreateParameter(bias, {num_filters}, Initializer::Constant(0.0f), dtype);
    out = absl::StrCat(prefix, ".pre_act");
    b.CreateVar(out, out_shape, dtype);
    OpDesc* add = b.AppendOp(
        MakeOp("elementwise_add", {{"X", {conv_out}}, {"Y", {bias}}}, {{"Out", {out}}}));
    SetAttr(add, "axis", int64_t{1});
  }
  return Activation(b, out, opts.act);
}

std::string Pool2d(ProgramBuilder& b, absl::string_view input, int64_t size,
                   absl::string_view type, int64_t stride, int64_t padding) {
  if (stride <= 0) stride = size;
  Shape shape = ShapeOf(b, input);
  if (shape.size() == 4) {
    shape[2] = SlideExtent(shape[2], size, stride, padding);
    shape[3] = SlideExtent(shape[3], size, stride, padding);
  }
  std::string out = b.UniqueName("pool2d.out");
  b.CreateVar(out, shape, VarOf(b, input).dtype());
  OpDesc* op = b.AppendOp(MakeOp("pool2d", {{"X", {std::string(input)}}}, {{"Out", {out}}}));
  SetAttr(op, "pooling_type", std::string(type));
  SetAttr(op, "ksize", std::vector<int64_t>{size, size});
  SetAttr(op, "strides", std::vector<int64_t>{stride, stride});
  SetAttr(op, "paddings", std::vector<int64_t>{padding, padding});
  return out;
}

std::string Flatten(ProgramBuilder& b, absl::string_view x, int64_t axis) {
  const Shape in = ShapeOf(b, x);
  auto product = [](Shape::const_iterator begin, Shape::const_iterator end) {
    int64_t p = 1;
    for (auto it = begin; it != end; ++it) p = (p < 0 || *it < 0) ? -1 : p * *it;
    return p;
  };
  const auto split = in.begin() + std::min<int64_t>(axis, static_cast<int64_t>(in.size()));
  std::string out = b.UniqueName("flatten.out");
  b.CreateVar(out, {product(in.begin(), split), product(split, in.end())}, VarOf(b, x).dtype());
  OpDesc* op = b.AppendOp(MakeOp("flatten", {{"X", {std::string(x)}}}, {{"Out", {out}}}));
  SetAttr(op, "axis", axis);
  return out;
}

std::string BatchNorm(ProgramBuilder& b, absl::string_view input, BatchNormOptions opts) {
  std::string prefix = opts.name.empty() ? b.UniqueName("batch_norm") : opts.name;
  const Shape in = ShapeOf(b, input);
  const DataType dtype = VarOf(b, input).dtype();
  const int64_t c = in.size() >= 2 ? in[1] : 1;
  const std::string scale = absl::StrCat(prefix, ".scale"), bias = absl::StrCat(prefix, ".bias");
  const std::string mean = absl::StrCat(prefix, ".mean"), var = absl::StrCat(prefix, ".variance");
  b.CreateParameter(scale, {c}, Initializer::Constant(1.0f), dtype);
  b.CreateParameter(bias, {c}, Initializer::Constant(0.0f), dtype);
  b.CreatePersistable(mean, {c}, 0.0f, dtype);
  b.CreatePersistable(var, {c}, 1.0f, dtype);
  std::string y = b.UniqueName(absl::StrCat(prefix, ".out"));
  b.CreateVar(y, in, dtype);
  const std::string saved_mean = absl::StrCat(prefix, ".saved_mean");
  const std::string saved_var = absl::StrCat(prefix, ".saved_variance");
  b.CreateVar(saved_mean, {c}, dtype)->set_stop_gradient(true);
  b.CreateVar(saved_var, {c}, dtype)->set_stop_gradient(true);
  OpDesc* op = b.AppendOp(MakeOp(
      "batch_norm",
      {{"X", {std::string(input)}}, {"Scale", {scale}}, {"Bias", {bias}}, {"Mean", {mean}},
       {"Variance", {var}}},
      {{"Y", {y}}, {"MeanOut", {mean}}, {"VarianceOut", {var}}, {"SavedMean", {saved_mean}},
       {"SavedVariance", {saved_var}}}));
  SetAttr(op, "momentum", opts.momentum);
  SetAttr(op, "epsilon", opts.epsilon);
  SetAttr(op, "is_test", false);
  return Activation(b, y, opts.act);
}

std::string Dropout(ProgramBuilder& b, absl::string_view x, float prob, int64_t seed) {
  std::string out = b.UniqueName("dropout.out");
  std::string mask = b.UniqueName("dropout.mask");
  b.CreateVar(out, ShapeOf(b, x), VarOf(b, x).dtype());
  b.CreateVar(mask, ShapeOf(b, x), VarOf(b, x).dtype())->set_stop_gradient(true);
  OpDesc* op = b.AppendOp(
      MakeOp("dropout", {{"X", {std::string(x)}}}, {{"Out", {out}}, {"Mask", {mask}}}));
  SetAttr(op, "dropout_prob", prob);
  SetAttr(op, "seed", seed);
  SetAttr(op, "is_test", false);
  return out;
}

std::string Accuracy(ProgramBuilder& b, absl::string_view scores, absl::string_view label,
                     int64_t k) {
  std::string acc = b.UniqueName("accuracy.out");
  std::string correct = b.UniqueName("accuracy.correct");
  std::string total = b.UniqueName("accuracy.total");
  b.CreateVar(acc, {1}, VarOf(b, scores).dtype())->set_stop_gradient(true);
  b.CreateVar(correct, {1}, INT64)->set_stop_gradient(true);
  b.CreateVar(total, {1}, INT64)->set_stop_gradient(true);
  OpDesc* op = b.AppendOp(
      MakeOp("accuracy", {{"X", {std::string(scores)}}, {"Label", {std::string(label)}}},
             {{"Accuracy", {acc}}, {"Correct", {correct}}, {"Total", {total}}}));
  SetAttr(op, "k", k);
  return acc;
}

std::string Relu(ProgramBuilder& b, absl::string_view x) { return Unary(b, "relu", x); }
std::string Sigmoid(ProgramBuilder& b, absl::string_view x) { return Unary(b, "sigmoid", x); }
std::string Tanh(ProgramBuilder& b, absl::string_view x) { return Unary(b, "tanh", x); }

std::string Activation(ProgramBuilder& b, absl::string_view x, absl::string_view act) {
  if (act.empty()) return std::string(x);
  return Unary(b, act, x);
}

std::string ElementwiseAdd(ProgramBuilder& b, absl::string_view x, absl::string_view y,
                           int64_t axis) {
  return Binary(b, "elementwise_add", x, y, axis);
}
std::string ElementwiseMul(ProgramBuilder& b, absl::string_view x, absl::string_view y,
                           int64_t axis) {
  return Binary(b, "elementwise_mul", x, y, axis);
}

std::string Scale(ProgramBuilder& b, absl::string_view x, float scale, float bias) {
  std::string out = Unary(b, "scale", x);
  OpDesc* op = b.block()->mutable_ops(b.block()->ops_size() - 1);
  SetAttr(op, "scale", scale);
  SetAttr(op, "bias", bias);
  return out;
}

std::string Concat(ProgramBuilder& b, const std::vector<std::string>& xs, int64_t axis) {
  Shape shape = ShapeOf(b, xs[0]);
  int64_t total = 0;
  for (const auto& x : xs) {
    Shape s = ShapeOf(b, x);
    total = (total < 0 || s[axis] < 0) ? -1 : total + s[axis];
  }
  shape[axis] = total;
  std::string out = b.UniqueName("concat.out");
  b.CreateVar(out, shape, VarOf(b, xs[0]).dtype());
  OpDesc* op = b.AppendOp(MakeOp("concat", {{"X", xs}}, {{"Out", {out}}}));
  SetAttr(op, "axis", axis);
  return out;
}

std::string Reshape(ProgramBuilder& b, absl::string_view x, const Shape& shape) {
  std::string out = b.UniqueName("reshape.out");
  b.CreateVar(out, shape, VarOf(b, x).dtype());
  OpDesc* op = b.AppendOp(MakeOp("reshape", {{"X", {std::string(x)}}}, {{"Out", {out}}}));
  SetAttr(op, "shape", std::vector<int64_t>(shape.begin(), shape.end()));
  return out;
}

std::string Cast(ProgramBuilder& b, absl::string_view x, DataType dtype) {
  std::string out = b.UniqueName("cast.out");
  b.CreateVar(out, ShapeOf(b, x), dtype);
  OpDesc* op = b.AppendOp(MakeOp("cast", {{"X", {std::string(x)}}}, {{"Out", {out}}}));
  SetAttr(op, "out_dtype", static_cast<int64_t>(dtype));
  return out;
}

std::string Mean(ProgramBuilder& b, absl::string_view x) {
  std::string out = b.UniqueName("mean.out");
  b.CreateVar(out, {1}, VarOf(b, x).dtype());
  b.AppendOp(MakeOp("mean", {{"X", {std::string(x)}}}, {{"Out", {out}}}));
  return out;
}

std::string SquareError(ProgramBuilder& b, absl::string_view x, absl::string_view label) {
  std::string out = b.UniqueName("square_error.out");
  b.CreateVar(out, ShapeOf(b, x), VarOf(b, x).dtype());
  b.AppendOp(MakeOp("square_error", {{"X", {std::string(x)}}, {"Y", {std::string(label)}}},
                    {{"Out", {out}}}));
  return out;
}

std::string SoftmaxWithCrossEntropy(ProgramBuilder& b, absl::string_view logits,
                                    absl::string_view label, std::string* softmax) {
  Shape shape = ShapeOf(b, logits);
  std::string sm = b.UniqueName("softmax.out");
  std::string loss = b.UniqueName("cross_entropy.out");
  DataType dtype = VarOf(b, logits).dtype();
  b.CreateVar(sm, shape, dtype);
  b.CreateVar(loss, {shape[0], 1}, dtype);
  b.AppendOp(MakeOp("softmax_with_cross_entropy",
                    {{"Logits", {std::string(logits)}}, {"Label", {std::string(label)}}},
                    {{"Softmax", {sm}}, {"Loss", {loss}}}));
  if (softmax != nullptr) *softmax = sm;
  return loss;
}

std::string SigmoidCrossEntropyWithLogits(ProgramBuilder& b, absl::string_view logits,
                                          absl::string_view label) {
  std::string out = b.UniqueName("sigmoid_ce.out");
  b.CreateVar(out, ShapeOf(b, logits), VarOf(b, logits).dtype());
  b.AppendOp(MakeOp("sigmoid_cross_entropy_with_logits",
                    {{"X", {std::string(logits)}}, {"Label", {std::string(label)}}},
                    {{"Out", {out}}}));
  return out;
}

}  // namespace layers
}  // namespace tessera
