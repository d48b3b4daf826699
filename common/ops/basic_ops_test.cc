#include "common/ops/basic_ops.h"

#include <cmath>

#include "common/framework/executor.h"
#include "common/ops/grad_check.h"
#include "common/ops/ops.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

class BasicOpsTest : public ::testing::Test {
 protected:
  std::unique_ptr<OpRegistry> registry_ = NewStandardOpRegistry();
  Executor exec_{registry_.get()};
  Scope scope_;
};

TEST_F(BasicOpsTest, FillConstantFillsShapeAndValue) {
  OpDesc op = MakeOp("fill_constant", {}, {{"Out", {"c"}}});
  SetAttr(&op, "shape", std::vector<int64_t>{2, 3});
  SetAttr(&op, "value", 1.5f);
  ASSERT_TRUE(exec_.RunOp(op, &scope_).ok());
  const Tensor& t = scope_.FindVar("c")->Get<Tensor>();
  EXPECT_EQ(t.shape(), (Shape{2, 3}));
  for (int i = 0; i < 6; ++i) EXPECT_EQ(t.data<float>()[i], 1.5f);

  SetAttr(&op, "dtype", static_cast<int64_t>(INT64));
  SetAttr(&op, "value", 7.0f);
  ASSERT_TRUE(exec_.RunOp(op, &scope_).ok());
  EXPECT_EQ(scope_.FindVar("c")->Get<Tensor>().data<int64_t>()[5], 7);
}

TEST_F(BasicOpsTest, FillConstantRejectsNegativeShape) {
  OpDesc op = MakeOp("fill_constant", {}, {{"Out", {"c"}}});
  SetAttr(&op, "shape", std::vector<int64_t>{2, -3});
  absl::Status s = exec_.RunOp(op, &scope_);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("[2, -3]"), std::string::npos) << s;
}

TEST_F(BasicOpsTest, ScaleGradient) {
  OpDesc op = MakeOp("scale", {{"X", {"x"}}}, {{"Out", {"y"}}});
  SetAttr(&op, "scale", 2.5f);
  SetAttr(&op, "bias", 1.0f);
  GradCheckOptions opt;
  opt.wrt = {"x"};
  EXPECT_TRUE(CheckGradient(*registry_, op, {{"x", RandomTensor({3, 4}, -1, 1, 1)}}, opt).ok());
}

TEST_F(BasicOpsTest, ScaleBiasBeforeScale) {
  scope_.Var("x")->GetMutable<Tensor>()->CopyFrom(RandomTensor({4}, -1, 1, 2));
  OpDesc op = MakeOp("scale", {{"X", {"x"}}}, {{"Out", {"y"}}});
  SetAttr(&op, "scale", 2.0f);
  SetAttr(&op, "bias", 1.0f);
  SetAttr(&op, "bias_after_scale", false);
  ASSERT_TRUE(exec_.RunOp(op, &scope_).ok());
  const Tensor& x = scope_.FindVar("x")->Get<Tensor>();
  const Tensor& y = scope_.FindVar("y")->Get<Tensor>();
  for (int i = 0; i < 4; ++i) EXPECT_DOUBLE_EQ(y.data<double>()[i], 2 * (x.data<double>()[i] + 1));
}

TEST_F(BasicOpsTest, SumGradient) {
  OpDesc op = MakeOp("sum", {{"X", {"a", "b", "c"}}}, {{"Out", {"s"}}});
  GradCheckOptions opt;
  opt.wrt = {"a", "b", "c"};
  EXPECT_TRUE(CheckGradient(*registry_, op,
                            {{"a", RandomTensor({2, 3}, -1, 1, 1)},
                             {"b", RandomTensor({2, 3}, -1, 1, 2)},
                             {"c", RandomTensor({2, 3}, -1, 1, 3)}},
                            opt)
                  .ok());
}

TEST_F(BasicOpsTest, SumOfSparseAndDense) {
  Tensor d = RandomTensor({4, 2}, -1, 1, 1);
  scope_.Var("d")->GetMutable<Tensor>()->CopyFrom(d);
  SelectedRows* sr = scope_.Var("s")->GetMutable<SelectedRows>();
  sr->rows = {3, 1, 3};
  sr->height = 4;
  sr->value = RandomTensor({3, 2}, -1, 1, 2);
  OpDesc op = MakeOp("sum", {{"X", {"d", "s"}}}, {{"Out", {"o"}}});
  ASSERT_TRUE(exec_.RunOp(op, &scope_).ok());
  const Tensor& o = scope_.FindVar("o")->Get<Tensor>();
  const double* v = sr->value.data<double>();
  EXPECT_DOUBLE_EQ(o.data<double>()[3 * 2 + 1], d.data<double>()[7] + v[1] + v[5]);
  EXPECT_DOUBLE_EQ(o.data<double>()[1 * 2 + 0], d.data<double>()[2] + v[2]);
  EXPECT_DOUBLE_EQ(o.data<double>()[0], d.data<double>()[0]);

  // Two sparse inputs concatenate their rows.
  SelectedRows* sr2 = scope_.Var("s2")->GetMutable<SelectedRows>();
  sr2->rows = {0};
  sr2->value = RandomTensor({1, 2}, -1, 1, 3);
  OpDesc op2 = MakeOp("sum", {{"X", {"s", "s2"}}}, {{"Out", {"o2"}}});
  ASSERT_TRUE(exec_.RunOp(op2, &scope_).ok());
  const SelectedRows& o2 = scope_.FindVar("o2")->Get<SelectedRows>();
  EXPECT_EQ(o2.rows, (std::vector<int64_t>{3, 1, 3, 0}));
  EXPECT_EQ(o2.value.shape(), (Shape{4, 2}));
}

// A dense sum writes into Out's buffer, step after step, unless something else holds that buffer
// (then Out gets a new one and the holder keeps its values) or Out is an input.
TEST_F(BasicOpsTest, SumReusesOutsBufferOnlyWhenItAloneHoldsIt) {
  const Tensor a = RandomTensor({2, 3}, -1, 1, 1), b = RandomTensor({2, 3}, -1, 1, 2);
  scope_.Var("a")->GetMutable<Tensor>()->CopyFrom(a);
  scope_.Var("b")->GetMutable<Tensor>()->CopyFrom(b);
  auto expect_sum = [&](const Tensor& o, const Tensor& x, const Tensor& y) {
    for (int i = 0; i < 6; ++i) {
      EXPECT_DOUBLE_EQ(o.data<double>()[i], x.data<double>()[i] + y.data<double>()[i]) << i;
    }
  };
  const OpDesc op = MakeOp("sum", {{"X", {"a", "b"}}}, {{"Out", {"o"}}});
  ASSERT_TRUE(exec_.RunOp(op, &scope_).ok());
  const void* buffer = scope_.FindVar("o")->Get<Tensor>().raw_data();
  ASSERT_TRUE(exec_.RunOp(op, &scope_).ok());
  EXPECT_EQ(scope_.FindVar("o")->Get<Tensor>().raw_data(), buffer);
  expect_sum(scope_.FindVar("o")->Get<Tensor>(), a, b);
  // Held elsewhere (as an encoded reply holds a tensor): left alone.
  const Tensor held = scope_.FindVar("o")->Get<Tensor>();
  const Tensor before = held.Clone();
  scope_.FindVar("b")->GetMutable<Tensor>()->SetZero();
  ASSERT_TRUE(exec_.RunOp(op, &scope_).ok());
  EXPECT_NE(scope_.FindVar("o")->Get<Tensor>().raw_data(), held.raw_data());
  for (int i = 0; i < 6; ++i) EXPECT_EQ(held.data<double>()[i], before.data<double>()[i]) << i;
  for (int i = 0; i < 6; ++i) {
    EXPECT_EQ(scope_.FindVar("o")->Get<Tensor>().data<double>()[i], a.data<double>()[i]) << i;
  }
  // Out is X[0]: a + b, read before written.
  scope_.FindVar("b")->GetMutable<Tensor>()->CopyFrom(b);
  ASSERT_TRUE(exec_.RunOp(MakeOp("sum", {{"X", {"a", "b"}}}, {{"Out", {"a"}}}), &scope_).ok());
  expect_sum(scope_.FindVar("a")->Get<Tensor>(), a, b);
}

TEST_F(BasicOpsTest, SumShapeMismatchNamesVariables) {
  scope_.Var("a")->GetMutable<Tensor>()->CopyFrom(RandomTensor({2, 3}, -1, 1, 1));
  scope_.Var("b")->GetMutable<Tensor>()->CopyFrom(RandomTensor({3, 2}, -1, 1, 1));
  absl::Status s = exec_.RunOp(MakeOp("sum", {{"X", {"a", "b"}}}, {{"Out", {"o"}}}), &scope_);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("'b'"), std::string::npos) << s;
  EXPECT_NE(s.message().find("[3, 2]"), std::string::npos) << s;
}

TEST_F(BasicOpsTest, LrExponentialDecay) {
  Tensor* step = scope_.Var("step")->GetMutable<Tensor>();
  step->Resize(FLOAT32, {1});
  step->data<float>()[0] = 3;
  OpDesc op = MakeOp("lr_exponential_decay", {{"Step", {"step"}}},
                     {{"Out", {"lr"}}, {"StepOut", {"step"}}});
  SetAttr(&op, "learning_rate", 0.1f);
  SetAttr(&op, "decay_rate", 0.5f);
  SetAttr(&op, "decay_steps", int64_t{2});
  ASSERT_TRUE(exec_.RunOp(op, &scope_).ok());
  EXPECT_NEAR(scope_.FindVar("lr")->Get<Tensor>().data<float>()[0], 0.1 * std::pow(0.5, 1.5),
              1e-7);
  EXPECT_EQ(scope_.FindVar("step")->Get<Tensor>().data<float>()[0], 4.0f);
  SetAttr(&op, "staircase", true);
  ASSERT_TRUE(exec_.RunOp(op, &scope_).ok());  // step 4 -> exponent 2
  EXPECT_NEAR(scope_.FindVar("lr")->Get<Tensor>().data<float>()[0], 0.025, 1e-8);
}

}  // namespace
}  // namespace tessera
