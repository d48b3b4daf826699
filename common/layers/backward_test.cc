#include "common/layers/backward.h"

#include <cmath>

#include "common/framework/executor.h"
#include "common/layers/layers.h"
#include "common/layers/optimizer.h"
#include "common/ops/grad_check.h"
#include "common/ops/ops.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

using Matrix = Eigen::Matrix<double, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

Matrix ToMatrix(const Tensor& t) {
  auto dims = t.MatrixDims(t.rank() > 1 ? t.rank() - 1 : 0);
  Matrix m(dims.first, dims.second);
  for (int64_t i = 0; i < t.numel(); ++i) m.data()[i] = t.data<double>()[i];
  return m;
}

class BackwardTest : public ::testing::Test {
 protected:
  std::unique_ptr<OpRegistry> registry_ = NewStandardOpRegistry();
  Executor exec_{registry_.get()};
};

// loss = mean((relu(x W1 + b1) W2 + b2 - y)^2): autodiff equals the hand-derived gradients.
TEST_F(BackwardTest, TwoLayerMlpMatchesHandDerivedGradients) {
  ProgramDesc main, startup;
  ProgramBuilder b(&main, &startup);
  std::string x = layers::Data(b, "x", {-1, 3}, FLOAT64);
  std::string y = layers::Data(b, "y", {-1, 1}, FLOAT64);
  layers::FcOptions o1;
  o1.name = "fc1";
  o1.act = "relu";
  std::string h = layers::Fc(b, x, 4, o1);
  layers::FcOptions o2;
  o2.name = "fc2";
  std::string pred = layers::Fc(b, h, 1, o2);
  std::string loss = layers::Mean(b, layers::SquareError(b, pred, y));
  auto pairs = AppendBackward(&main, *registry_, loss);
  ASSERT_TRUE(pairs.ok()) << pairs.status();
  ASSERT_EQ(pairs->size(), 4u);
  EXPECT_EQ((*pairs)[0].param, "fc1.w");
  EXPECT_EQ((*pairs)[0].grad, "fc1.w@GRAD");

  const int n = 5;
  Scope scope;
  Tensor xt = RandomTensor({n, 3}, -1, 1, 1), yt = RandomTensor({n, 1}, -1, 1, 2);
  Tensor w1 = RandomTensor({3, 4}, -1, 1, 3), b1 = RandomTensor({4}, -0.5, 0.5, 4);
  Tensor w2 = RandomTensor({4, 1}, -1, 1, 5), b2 = RandomTensor({1}, -0.5, 0.5, 6);
  scope.Var("x")->GetMutable<Tensor>()->CopyFrom(xt);
  scope.Var("y")->GetMutable<Tensor>()->CopyFrom(yt);
  scope.Var("fc1.w")->GetMutable<Tensor>()->CopyFrom(w1);
  scope.Var("fc1.b")->GetMutable<Tensor>()->CopyFrom(b1);
  scope.Var("fc2.w")->GetMutable<Tensor>()->CopyFrom(w2);
  scope.Var("fc2.b")->GetMutable<Tensor>()->CopyFrom(b2);
  absl::Status s = exec_.Run(main, 0, &scope);
  ASSERT_TRUE(s.ok()) << s;

  // Hand-derived.
  Matrix X = ToMatrix(xt), Y = ToMatrix(yt), W1 = ToMatrix(w1), W2 = ToMatrix(w2);
  Eigen::RowVectorXd B1 = Eigen::Map<Eigen::RowVectorXd>(b1.data<double>(), 4);
  Matrix Z1 = (X * W1).rowwise() + B1;
  Matrix H = Z1.cwiseMax(0.0);
  Matrix P = (H * W2).array() + b2.data<double>()[0];
  Matrix dP = 2.0 * (P - Y) / n;
  Matrix dW2 = H.transpose() * dP;
  double dB2 = dP.sum();
  Matrix dH = dP * W2.transpose();
  Matrix dZ1 = dH.array() * (Z1.array() > 0).cast<double>();
  Matrix dW1 = X.transpose() * dZ1;
  Eigen::RowVectorXd dB1 = dZ1.colwise().sum();

  auto grad = [&](const std::string& name) {
    return ToMatrix(scope.FindVar(name)->Get<Tensor>());
  };
  EXPECT_NEAR((grad("fc1.w@GRAD") - dW1).cwiseAbs().maxCoeff(), 0.0, 1e-12);
  EXPECT_NEAR((grad("fc2.w@GRAD") - dW2).cwiseAbs().maxCoeff(), 0.0, 1e-12);
  EXPECT_NEAR(grad("fc2.b@GRAD")(0, 0), dB2, 1e-12);
  Matrix gb1 = grad("fc1.b@GRAD");
  for (int j = 0; j < 4; ++j) EXPECT_NEAR(gb1(0, j), dB1(j), 1e-12);
  double mse = (P - Y).squaredNorm() / n;
  EXPECT_NEAR(scope.FindVar(loss)->Get<Tensor>().data<double>()[0], mse, 1e-12);
  // The data variable's gradient is never computed.
  EXPECT_EQ(FindVarDesc(main.blocks(0), "x@GRAD"), nullptr);
}

// A variable used twice gets both contributions summed.
TEST_F(BackwardTest, SharedVariableGradientsAreSummed) {
  ProgramDesc main, startup;
  ProgramBuilder b(&main, &startup);
  b.CreateParameter("w", {3}, Initializer::Constant(0), FLOAT64);
  std::string a = layers::Scale(b, "w", 2.0f);
  std::string c = layers::Scale(b, "w", 5.0f);
  std::string s = layers::ElementwiseAdd(b, a, c);
  std::string loss = layers::Mean(b, s);
  auto pairs = AppendBackward(&main, *registry_, loss);
  ASSERT_TRUE(pairs.ok()) << pairs.status();
  Scope scope;
  scope.Var("w")->GetMutable<Tensor>()->CopyFrom(RandomTensor({3}, -1, 1, 9));
  ASSERT_TRUE(exec_.Run(main, 0, &scope).ok());
  const Tensor& g = scope.FindVar("w@GRAD")->Get<Tensor>();
  for (int i = 0; i < 3; ++i) EXPECT_NEAR(g.data<double>()[i], 7.0 / 3.0, 1e-12);
  // The op writing w@GRAD carries op_role_var.
  bool tagged = false;
  for (const auto& op : main.blocks(0).ops()) {
    auto rv = GetStringsAttr(op, kOpRoleVarAttr);
    if (rv.size() == 2 && rv[0] == "w" && rv[1] == "w@GRAD") tagged = op.type() == "sum";
  }
  EXPECT_TRUE(tagged);
}

// The bias add's X@GRAD is bound to its Out@GRAD (the kernel then copies nothing) where nothing
// else writes it, and its reader takes Out@GRAD; a temporary used twice keeps its own summed
// gradient.
TEST_F(BackwardTest, ElementwiseAddGradRunsInPlaceWhenSafe) {
  ProgramDesc main, startup;
  ProgramBuilder b(&main, &startup);
  std::string x = layers::Data(b, "x", {-1, 3}, FLOAT64);
  layers::FcOptions o;
  o.name = "fc";
  std::string h = layers::Fc(b, x, 4, o);  // mul -> fc.mul, elementwise_add -> fc.pre_act
  b.CreateParameter("c", {4}, Initializer::Constant(1), FLOAT64);
  // fc.pre_act is used by two adds: its gradient has two producers.
  std::string s = layers::ElementwiseAdd(b, layers::ElementwiseAdd(b, h, "c"), h);
  std::string loss = layers::Mean(b, s);
  ASSERT_TRUE(AppendBackward(&main, *registry_, loss).ok());
  int in_place = 0;
  for (const auto& op : main.blocks(0).ops()) {
    if (op.type() != "elementwise_add_grad") continue;
    const std::string dx = OpOutput(op, "X@GRAD"), dout = OpInput(op, "Out@GRAD");
    if (OpInput(op, "X") == "fc.mul") {
      EXPECT_EQ(dx, dout);  // fc.mul@GRAD is fc.pre_act@GRAD's variable
      ++in_place;
    } else if (OpInput(op, "X") == h) {
      EXPECT_NE(dx, dout);  // a renamed contribution to the summed fc.pre_act@GRAD
    }
  }
  EXPECT_EQ(in_place, 1);
  EXPECT_EQ(FindVarDesc(main.blocks(0), "fc.mul@GRAD"), nullptr);
  for (const auto& op : main.blocks(0).ops()) {
    if (op.type() == "mul_grad") EXPECT_EQ(OpInput(op, "Out@GRAD"), GradVarName(h));
  }
  // The gradients are those of loss = mean(2 (x W + b) + c): dW = 2 x^T 1 / (n * 4).
  Scope scope;
  ASSERT_TRUE(exec_.Run(startup, 0, &scope).ok());
  const int n = 3;
  Tensor xt = RandomTensor({n, 3}, -1, 1, 11);
  scope.Var("x")->GetMutable<Tensor>()->CopyFrom(xt);
  ASSERT_TRUE(exec_.Run(main, 0, &scope).ok());
  Matrix dw = ToMatrix(scope.FindVar("fc.w@GRAD")->Get<Tensor>());
  Matrix want = 2.0 * ToMatrix(xt).transpose() * Matrix::Ones(n, 4) / (n * 4.0);
  EXPECT_NEAR((dw - want).cwiseAbs().maxCoeff(), 0.0, 1e-12);
  Matrix db = ToMatrix(scope.FindVar("fc.b@GRAD")->Get<Tensor>());
  for (int j = 0; j < 4; ++j) EXPECT_NEAR(db(0, j), 2.0 * n / (n * 4.0), 1e-12);
}

TEST_F(BackwardTest, UnknownLossIsAnError) {
  ProgramDesc main, startup;
  ProgramBuilder b(&main, &startup);
  auto pairs = AppendBackward(&main, *registry_, "nope");
  ASSERT_FALSE(pairs.ok());
  EXPECT_NE(pairs.status().message().find("'nope'"), std::string::npos);
}

// Training a tiny linear model with each optimizer lowers the loss.
TEST_F(BackwardTest, EachOptimizerLowersTheLoss) {
  auto make = [](int which) -> std::unique_ptr<Optimizer> {
    OptimizerOptions o;
    o.learning_rate = which == 3 ? 0.5f : 0.05f;  // adagrad's steps shrink as 1/sqrt(t)
    o.l2_decay = which == 0 ? 1e-4f : 0.0f;
    switch (which) {
      case 0: return std::make_unique<SGD>(o);
      case 1: return std::make_unique<Momentum>(o, 0.9f);
      case 2: return std::make_unique<Adam>(o);
      default: return std::make_unique<Adagrad>(o);
    }
  };
  for (int which = 0; which < 4; ++which) {
    ProgramDesc main, startup;
    ProgramBuilder b(&main, &startup);
    std::string x = layers::Data(b, "x", {-1, 4});
    std::string y = layers::Data(b, "y", {-1, 1});
    std::string pred = layers::Fc(b, x, 1);
    std::string loss = layers::Mean(b, layers::SquareError(b, pred, y));
    auto opt = make(which);
    auto pairs = opt->Minimize(b, *registry_, loss);
    ASSERT_TRUE(pairs.ok()) << pairs.status();
    Scope scope;
    ASSERT_TRUE(exec_.Run(startup, 0, &scope).ok());
    Tensor xt(FLOAT32, {16, 4}), yt(FLOAT32, {16, 1});
    for (int i = 0; i < 16; ++i) {
      float t = 0;
      for (int j = 0; j < 4; ++j) {
        xt.data<float>()[i * 4 + j] = std::sin(1.0f + i * 4 + j);
        t += (j + 1) * xt.data<float>()[i * 4 + j];
      }
      yt.data<float>()[i] = t;
    }
    scope.Var("x")->GetMutable<Tensor>()->CopyFrom(xt);
    scope.Var("y")->GetMutable<Tensor>()->CopyFrom(yt);
    auto prepared = exec_.Prepare(main, 0);
    ASSERT_TRUE(prepared.ok());
    float first = 0, last = 0;
    for (int step = 0; step < 200; ++step) {
      absl::Status s = exec_.Run(*prepared, &scope);
      ASSERT_TRUE(s.ok()) << opt->type() << ": " << s;
      last = scope.FindVar(loss)->Get<Tensor>().data<float>()[0];
      if (step == 0) first = last;
    }
    EXPECT_LT(last, first * 0.2f) << opt->type();
  }
}

}  // namespace
}  // namespace tessera
