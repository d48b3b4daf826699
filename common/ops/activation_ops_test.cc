#include "common/ops/activation_ops.h"

#include <cmath>
#include <string>
#include <vector>

#include "common/framework/executor.h"
#include "common/ops/grad_check.h"
#include "common/ops/ops.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

class ActivationOpsTest : public ::testing::Test {
 protected:
  void Feed(const std::string& name, const Tensor& t) {
    scope_.Var(name)->GetMutable<Tensor>()->CopyFrom(t);
  }
  const Tensor& Get(const std::string& name) { return scope_.FindVar(name)->Get<Tensor>(); }

  std::unique_ptr<OpRegistry> registry_ = NewStandardOpRegistry();
  Executor exec_{registry_.get()};
  Scope scope_;
};

// Values in [0.1, 1) with alternating signs: away from relu's kink at 0.
Tensor AwayFromZero(const Shape& shape, uint64_t seed) {
  Tensor t = RandomTensor(shape, 0.1, 1.0, seed);
  for (int64_t i = 0; i < t.numel(); i += 2) t.data<double>()[i] *= -1;
  return t;
}

TEST_F(ActivationOpsTest, ForwardValues) {
  Tensor x(FLOAT32, {4});
  const float in[] = {-2.0f, -0.5f, 0.0f, 1.5f};
  for (int i = 0; i < 4; ++i) x.data<float>()[i] = in[i];
  Feed("x", x);
  for (const char* type : {"relu", "sigmoid", "tanh"}) {
    ASSERT_TRUE(exec_.RunOp(MakeOp(type, {{"X", {"x"}}}, {{"Out", {"o"}}}), &scope_).ok());
    const Tensor& o = Get("o");
    ASSERT_EQ(o.dtype(), FLOAT32);
    ASSERT_EQ(o.shape(), (Shape{4}));
    for (int i = 0; i < 4; ++i) {
      double want = std::string(type) == "relu"      ? std::max(0.0f, in[i])
                    : std::string(type) == "sigmoid" ? 1 / (1 + std::exp(-in[i]))
                                                     : std::tanh(in[i]);
      EXPECT_NEAR(o.data<float>()[i], want, 1e-6) << type << " at " << in[i];
    }
  }
  EXPECT_FLOAT_EQ(Get("o").data<float>()[2], 0.0f);  // tanh(0)
}

TEST_F(ActivationOpsTest, SigmoidSaturatesWithoutNaN) {
  Tensor x(FLOAT32, {2});
  x.data<float>()[0] = -200.0f;
  x.data<float>()[1] = 200.0f;
  Feed("x", x);
  ASSERT_TRUE(exec_.RunOp(MakeOp("sigmoid", {{"X", {"x"}}}, {{"Out", {"o"}}}), &scope_).ok());
  EXPECT_NEAR(Get("o").data<float>()[0], 0.0f, 1e-30);
  EXPECT_FLOAT_EQ(Get("o").data<float>()[1], 1.0f);
}

TEST_F(ActivationOpsTest, Gradients) {
  for (const char* type : {"relu", "sigmoid", "tanh"}) {
    for (const Shape& shape : {Shape{7}, Shape{3, 4}}) {
      GradCheckOptions opt;
      opt.wrt = {"x"};
      absl::Status s = CheckGradient(*registry_, MakeOp(type, {{"X", {"x"}}}, {{"Out", {"o"}}}),
                                     {{"x", AwayFromZero(shape, 5)}}, opt);
      EXPECT_TRUE(s.ok()) << type << " " << ShapeString(shape) << ": " << s;
    }
  }
}

TEST_F(ActivationOpsTest, ReluGradValues) {
  Tensor out(FLOAT64, {4}), dout(FLOAT64, {4});
  const double o[] = {0, 0.5, 0, 2}, g[] = {1, 2, 3, 4};
  for (int i = 0; i < 4; ++i) {
    out.data<double>()[i] = o[i];
    dout.data<double>()[i] = g[i];
  }
  Feed("o", out);
  Feed("o@GRAD", dout);
  ASSERT_TRUE(exec_
                  .RunOp(MakeOp("relu_grad", {{"Out", {"o"}}, {"Out@GRAD", {"o@GRAD"}}},
                                {{"X@GRAD", {"x@GRAD"}}}),
                         &scope_)
                  .ok());
  const double* dx = Get("x@GRAD").data<double>();
  EXPECT_EQ(std::vector<double>(dx, dx + 4), (std::vector<double>{0, 2, 0, 4}));
}

TEST_F(ActivationOpsTest, InPlaceForwardAndGrad) {
  // Out == X and X@GRAD == Out@GRAD, as a memory-reusing program would bind them.
  Tensor x(FLOAT32, {3});
  x.data<float>()[0] = -1;
  x.data<float>()[1] = 2;
  x.data<float>()[2] = 3;
  Feed("h", x);
  ASSERT_TRUE(exec_.RunOp(MakeOp("relu", {{"X", {"h"}}}, {{"Out", {"h"}}}), &scope_).ok());
  EXPECT_EQ(std::vector<float>(Get("h").data<float>(), Get("h").data<float>() + 3),
            (std::vector<float>{0, 2, 3}));
  Tensor g(FLOAT32, {3});
  for (int i = 0; i < 3; ++i) g.data<float>()[i] = 10;
  Feed("h@GRAD", g);
  ASSERT_TRUE(
      exec_
          .RunOp(MakeOp("relu_grad", {{"X", {"h"}}, {"Out", {"h"}}, {"Out@GRAD", {"h@GRAD"}}},
                        {{"X@GRAD", {"h@GRAD"}}}),
                 &scope_)
          .ok());
  EXPECT_EQ(std::vector<float>(Get("h@GRAD").data<float>(), Get("h@GRAD").data<float>() + 3),
            (std::vector<float>{0, 10, 10}));
}

TEST_F(ActivationOpsTest, GradSkipsUnboundOutput) {
  Feed("o", RandomTensor({3}, -1, 1, 1));
  Feed("o@GRAD", RandomTensor({3}, -1, 1, 2));
  ASSERT_TRUE(exec_
                  .RunOp(MakeOp("tanh_grad", {{"Out", {"o"}}, {"Out@GRAD", {"o@GRAD"}}},
                                {{"X@GRAD", {kEmptyVarName}}}),
                         &scope_)
                  .ok());
  EXPECT_EQ(scope_.FindVar(kEmptyVarName), nullptr);
}

TEST_F(ActivationOpsTest, GradShapeMismatchNamesVariables) {
  Feed("o", RandomTensor({3}, -1, 1, 1));
  Feed("o@GRAD", RandomTensor({4}, -1, 1, 2));
  absl::Status s = exec_.RunOp(
      MakeOp("sigmoid_grad", {{"Out", {"o"}}, {"Out@GRAD", {"o@GRAD"}}}, {{"X@GRAD", {"x@GRAD"}}}),
      &scope_);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("'o@GRAD' is float64[4]"), std::string::npos) << s;
  EXPECT_NE(s.message().find("'o' is float64[3]"), std::string::npos) << s;
}

TEST_F(ActivationOpsTest, RejectsIntegerInput) {
  Tensor x(INT64, {2});
  x.data<int64_t>()[0] = 1;
  x.data<int64_t>()[1] = 2;
  Feed("ids", x);
  absl::Status s = exec_.RunOp(MakeOp("relu", {{"X", {"ids"}}}, {{"Out", {"o"}}}), &scope_);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("'ids' has dtype int64"), std::string::npos) << s;
}

}  // namespace
}  // namespace tessera
