#include "common/ops/loss_ops.h"

#include <cmath>
#include <string>
#include <vector>

#include "common/framework/executor.h"
#include "common/ops/grad_check.h"
#include "common/ops/ops.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

Tensor Doubles(const Shape& shape, const std::vector<double>& values) {
  Tensor t(FLOAT64, shape);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<double>()[i] = values[i];
  return t;
}

Tensor Labels(const std::vector<int64_t>& values) {
  Tensor t(INT64, {static_cast<int64_t>(values.size()), 1});
  for (size_t i = 0; i < values.size(); ++i) t.data<int64_t>()[i] = values[i];
  return t;
}

class LossOpsTest : public ::testing::Test {
 protected:
  void Feed(const std::string& name, const Tensor& t) {
    scope_.Var(name)->GetMutable<Tensor>()->CopyFrom(t);
  }
  const Tensor& Get(const std::string& name) { return scope_.FindVar(name)->Get<Tensor>(); }

  std::unique_ptr<OpRegistry> registry_ = NewStandardOpRegistry();
  Executor exec_{registry_.get()};
  Scope scope_;
};

OpDesc SoftmaxCe(bool soft = false) {
  OpDesc op = MakeOp("softmax_with_cross_entropy", {{"Logits", {"logits"}}, {"Label", {"label"}}},
                     {{"Softmax", {"softmax"}}, {"Loss", {"loss"}}});
  SetAttr(&op, "soft_label", soft);
  return op;
}

// ----------------------------------------------------------------- softmax_with_cross_entropy

TEST_F(LossOpsTest, SoftmaxCrossEntropyForwardValues) {
  // Row 0: logits [0, ln 3] -> softmax [1/4, 3/4]; label 1 -> loss -ln(3/4).
  // Row 1: logits [5, 5] -> softmax [1/2, 1/2]; label 0 -> loss ln 2.
  Tensor logits(FLOAT32, {2, 2});
  const float v[] = {0.0f, std::log(3.0f), 5.0f, 5.0f};
  for (int i = 0; i < 4; ++i) logits.data<float>()[i] = v[i];
  Feed("logits", logits);
  Feed("label", Labels({1, 0}));
  ASSERT_TRUE(exec_.RunOp(SoftmaxCe(), &scope_).ok());
  const Tensor& sm = Get("softmax");
  const Tensor& loss = Get("loss");
  ASSERT_EQ(sm.shape(), (Shape{2, 2}));
  ASSERT_EQ(loss.shape(), (Shape{2, 1}));
  EXPECT_NEAR(sm.data<float>()[0], 0.25f, 1e-6);
  EXPECT_NEAR(sm.data<float>()[1], 0.75f, 1e-6);
  EXPECT_NEAR(sm.data<float>()[2], 0.5f, 1e-6);
  EXPECT_NEAR(loss.data<float>()[0], -std::log(0.75f), 1e-6);
  EXPECT_NEAR(loss.data<float>()[1], std::log(2.0f), 1e-6);
}

TEST_F(LossOpsTest, SoftmaxCrossEntropyIsStableForLargeLogits) {
  Feed("logits", Doubles({1, 3}, {1000, 0, -1000}));
  Feed("label", Labels({1}));
  ASSERT_TRUE(exec_.RunOp(SoftmaxCe(), &scope_).ok());
  EXPECT_DOUBLE_EQ(Get("softmax").data<double>()[0], 1.0);
  EXPECT_DOUBLE_EQ(Get("softmax").data<double>()[2], 0.0);
  EXPECT_NEAR(Get("loss").data<double>()[0], 1000.0, 1e-9);
}

TEST_F(LossOpsTest, SoftmaxCrossEntropyHardLabelGradient) {
  GradCheckOptions opt;
  opt.wrt = {"logits"};
  opt.outputs = {"loss"};
  absl::Status s = CheckGradient(
      *registry_, SoftmaxCe(),
      {{"logits", RandomTensor({4, 5}, -2, 2, 1)}, {"label", Labels({0, 4, 2, 2})}}, opt);
  EXPECT_TRUE(s.ok()) << s;
  s = CheckGradient(*registry_, SoftmaxCe(),
                    {{"logits", RandomTensor({1, 2}, -2, 2, 2)}, {"label", Labels({1})}}, opt);
  EXPECT_TRUE(s.ok()) << s;
}

TEST_F(LossOpsTest, SoftmaxCrossEntropySoftLabelGradient) {
  Tensor label = RandomTensor({3, 4}, 0, 1, 7);
  for (int r = 0; r < 3; ++r) {  // rows sum to 1, as probabilities
    double sum = 0;
    for (int j = 0; j < 4; ++j) sum += label.data<double>()[r * 4 + j];
    for (int j = 0; j < 4; ++j) label.data<double>()[r * 4 + j] /= sum;
  }
  GradCheckOptions opt;
  opt.wrt = {"logits"};
  opt.outputs = {"loss"};
  absl::Status s =
      CheckGradient(*registry_, SoftmaxCe(true),
                    {{"logits", RandomTensor({3, 4}, -2, 2, 1)}, {"label", label}}, opt);
  EXPECT_TRUE(s.ok()) << s;
  // Unnormalized soft labels get the exact gradient too.
  s = CheckGradient(
      *registry_, SoftmaxCe(true),
      {{"logits", RandomTensor({2, 3}, -2, 2, 3)}, {"label", RandomTensor({2, 3}, 0, 1, 4)}}, opt);
  EXPECT_TRUE(s.ok()) << s;
}

TEST_F(LossOpsTest, SoftmaxCrossEntropySoftLabelValue) {
  // Soft label [1/2, 1/2] on logits [0, ln 3]: loss = -(ln(1/4) + ln(3/4)) / 2.
  Feed("logits", Doubles({1, 2}, {0, std::log(3.0)}));
  Feed("label", Doubles({1, 2}, {0.5, 0.5}));
  ASSERT_TRUE(exec_.RunOp(SoftmaxCe(true), &scope_).ok());
  EXPECT_NEAR(Get("loss").data<double>()[0], -(std::log(0.25) + std::log(0.75)) / 2, 1e-12);
}

TEST_F(LossOpsTest, SoftmaxCrossEntropyIgnoreIndex) {
  OpDesc op = SoftmaxCe();
  SetAttr(&op, "ignore_index", 3);
  Feed("logits", RandomTensor({3, 3}, -1, 1, 1));
  Feed("label", Labels({0, 3, 2}));
  ASSERT_TRUE(exec_.RunOp(op, &scope_).ok());
  EXPECT_EQ(Get("loss").data<double>()[1], 0.0);
  EXPECT_GT(Get("loss").data<double>()[0], 0.0);

  Feed("loss@GRAD", Doubles({3, 1}, {1, 1, 1}));
  const OpInfo* info = registry_->Find("softmax_with_cross_entropy");
  std::vector<OpDesc> grads = info->grad_maker(op);
  ASSERT_EQ(grads.size(), 1u);
  EXPECT_EQ(OpInputs(grads[0], "Logits"), std::vector<std::string>{});  // logits not kept
  ASSERT_TRUE(exec_.RunOp(grads[0], &scope_).ok());
  const Tensor& g = Get("logits@GRAD");
  ASSERT_EQ(g.shape(), (Shape{3, 3}));
  for (int j = 0; j < 3; ++j) EXPECT_EQ(g.data<double>()[3 + j], 0.0);
  // Row 0, label 0: softmax - onehot.
  EXPECT_NEAR(g.data<double>()[0], Get("softmax").data<double>()[0] - 1, 1e-12);
  EXPECT_NEAR(g.data<double>()[1], Get("softmax").data<double>()[1], 1e-12);

  GradCheckOptions opt;
  opt.wrt = {"logits"};
  opt.outputs = {"loss"};
  absl::Status s = CheckGradient(
      *registry_, op, {{"logits", RandomTensor({3, 3}, -1, 1, 2)}, {"label", Labels({0, 3, 2})}},
      opt);
  EXPECT_TRUE(s.ok()) << s;
}

TEST_F(LossOpsTest, SoftmaxCrossEntropyLabelOutOfRange) {
  Feed("logits", RandomTensor({3, 4}, -1, 1, 1));
  Feed("label", Labels({0, 2, 4}));
  absl::Status s = exec_.RunOp(SoftmaxCe(), &scope_);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("'label' has value 4 at row 2"), std::string::npos) << s;
  EXPECT_NE(s.message().find("[0, 4)"), std::string::npos) << s;
  Feed("label", Labels({0, -1, 1}));
  s = exec_.RunOp(SoftmaxCe(), &scope_);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("value -1 at row 1"), std::string::npos) << s;
}

TEST_F(LossOpsTest, SoftmaxCrossEntropyLabelShapeAndType) {
  Feed("logits", RandomTensor({3, 4}, -1, 1, 1));
  Feed("label", Labels({0, 1}));
  absl::Status s = exec_.RunOp(SoftmaxCe(), &scope_);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("'label' [2, 1]"), std::string::npos) << s;
  EXPECT_NE(s.message().find("'logits' [3, 4]"), std::string::npos) << s;
  Feed("label", RandomTensor({3, 1}, 0, 1, 2));
  s = exec_.RunOp(SoftmaxCe(), &scope_);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("'label' is float64"), std::string::npos) << s;
}

// -------------------------------------------------------- sigmoid_cross_entropy_with_logits

OpDesc SigmoidCe() {
  return MakeOp("sigmoid_cross_entropy_with_logits", {{"X", {"x"}}, {"Label", {"z"}}},
                {{"Out", {"out"}}});
}

TEST_F(LossOpsTest, SigmoidCrossEntropyForwardValues) {
  Feed("x", Doubles({4}, {0, 2, -3, 100}));
  Feed("z", Doubles({4}, {1, 0, 0.25, 1}));
  ASSERT_TRUE(exec_.RunOp(SigmoidCe(), &scope_).ok());
  const double* o = Get("out").data<double>();
  EXPECT_NEAR(o[0], std::log(2.0), 1e-12);
  EXPECT_NEAR(o[1], std::log(1 + std::exp(2.0)), 1e-12);  // -log(1 - s(2))
  EXPECT_NEAR(
      o[2],
      -(0.25 * std::log(1 / (1 + std::exp(3.0))) + 0.75 * std::log(1 - 1 / (1 + std::exp(3.0)))),
      1e-12);
  EXPECT_NEAR(o[3], 0.0, 1e-12);  // stable at large logits
}

TEST_F(LossOpsTest, SigmoidCrossEntropyGradient) {
  GradCheckOptions opt;
  opt.wrt = {"x"};
  for (const Shape& shape : {Shape{5}, Shape{3, 2}}) {
    absl::Status s = CheckGradient(
        *registry_, SigmoidCe(),
        {{"x", RandomTensor(shape, -3, 3, 1)}, {"z", RandomTensor(shape, 0, 1, 2)}}, opt);
    EXPECT_TRUE(s.ok()) << ShapeString(shape) << ": " << s;
  }
}

TEST_F(LossOpsTest, SigmoidCrossEntropyIgnoreAndNormalize) {
  OpDesc op = SigmoidCe();
  SetAttr(&op, "normalize", true);
  Feed("x", Doubles({3}, {0, 1, 0}));
  Feed("z", Doubles({3}, {1, -100, 0}));
  ASSERT_TRUE(exec_.RunOp(op, &scope_).ok());
  const double* o = Get("out").data<double>();
  EXPECT_NEAR(o[0], std::log(2.0) / 2, 1e-12);
  EXPECT_EQ(o[1], 0.0);
  EXPECT_NEAR(o[2], std::log(2.0) / 2, 1e-12);
  GradCheckOptions opt;
  opt.wrt = {"x"};
  absl::Status s =
      CheckGradient(*registry_, op,
                    {{"x", RandomTensor({3}, -2, 2, 3)}, {"z", Doubles({3}, {1, -100, 0.3})}}, opt);
  EXPECT_TRUE(s.ok()) << s;
}

TEST_F(LossOpsTest, SigmoidCrossEntropyShapeMismatch) {
  Feed("x", RandomTensor({3}, -1, 1, 1));
  Feed("z", RandomTensor({4}, 0, 1, 2));
  absl::Status s = exec_.RunOp(SigmoidCe(), &scope_);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("'x' [3]"), std::string::npos) << s;
  EXPECT_NE(s.message().find("'z' [4]"), std::string::npos) << s;
}

// ------------------------------------------------------------------------ square_error, mean

TEST_F(LossOpsTest, SquareErrorValuesAndGradient) {
  Feed("x", Doubles({3}, {1, 2, 3}));
  Feed("y", Doubles({3}, {3, 2, 0.5}));
  OpDesc op = MakeOp("square_error", {{"X", {"x"}}, {"Y", {"y"}}}, {{"Out", {"o"}}});
  ASSERT_TRUE(exec_.RunOp(op, &scope_).ok());
  const double* o = Get("o").data<double>();
  EXPECT_EQ(std::vector<double>(o, o + 3), (std::vector<double>{4, 0, 6.25}));
  GradCheckOptions opt;
  opt.wrt = {"x", "y"};
  for (const Shape& shape : {Shape{4}, Shape{2, 3}}) {
    absl::Status s = CheckGradient(
        *registry_, op,
        {{"x", RandomTensor(shape, -1, 1, 1)}, {"y", RandomTensor(shape, -1, 1, 2)}}, opt);
    EXPECT_TRUE(s.ok()) << s;
  }
}

TEST_F(LossOpsTest, SquareErrorShapeMismatch) {
  Feed("pred", RandomTensor({4, 1}, -1, 1, 1));
  Feed("target", RandomTensor({4}, -1, 1, 2));
  absl::Status s = exec_.RunOp(
      MakeOp("square_error", {{"X", {"pred"}}, {"Y", {"target"}}}, {{"Out", {"o"}}}), &scope_);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("'pred' [4, 1]"), std::string::npos) << s;
  EXPECT_NE(s.message().find("'target' [4]"), std::string::npos) << s;
}

TEST_F(LossOpsTest, MeanValueAndGradient) {
  Tensor x(FLOAT32, {2, 2});
  for (int i = 0; i < 4; ++i) x.data<float>()[i] = static_cast<float>(i + 1);
  Feed("x", x);
  OpDesc op = MakeOp("mean", {{"X", {"x"}}}, {{"Out", {"m"}}});
  ASSERT_TRUE(exec_.RunOp(op, &scope_).ok());
  EXPECT_EQ(Get("m").shape(), (Shape{1}));
  EXPECT_FLOAT_EQ(Get("m").data<float>()[0], 2.5f);

  Tensor g(FLOAT32, {1});
  g.data<float>()[0] = 2.0f;
  Feed("m@GRAD", g);
  ASSERT_TRUE(exec_
                  .RunOp(MakeOp("mean_grad", {{"X", {"x"}}, {"Out@GRAD", {"m@GRAD"}}},
                                {{"X@GRAD", {"x@GRAD"}}}),
                         &scope_)
                  .ok());
  const Tensor& dx = Get("x@GRAD");
  ASSERT_EQ(dx.shape(), (Shape{2, 2}));
  for (int i = 0; i < 4; ++i) EXPECT_FLOAT_EQ(dx.data<float>()[i], 0.5f);

  GradCheckOptions opt;
  opt.wrt = {"x"};
  absl::Status s = CheckGradient(*registry_, op, {{"x", RandomTensor({3, 5}, -1, 1, 1)}}, opt);
  EXPECT_TRUE(s.ok()) << s;
}

TEST_F(LossOpsTest, MeanOfEmptyIsAnError) {
  Feed("x", Tensor(FLOAT32, {0, 3}));
  absl::Status s = exec_.RunOp(MakeOp("mean", {{"X", {"x"}}}, {{"Out", {"m"}}}), &scope_);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("'x' [0, 3]"), std::string::npos) << s;
}

}  // namespace
}  // namespace tessera
