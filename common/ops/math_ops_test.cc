#include "common/ops/math_ops.h"

#include <cmath>
#include <cstring>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "Eigen/Core"
#include "common/framework/executor.h"
#include "common/ops/grad_check.h"
#include "common/ops/ops.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

Tensor FloatTensor(const Shape& shape, const std::vector<float>& values) {
  Tensor t(FLOAT32, shape);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = values[i];
  return t;
}

class MathOpsTest : public ::testing::Test {
 protected:
  void Feed(const std::string& name, const Tensor& t) {
    scope_.Var(name)->GetMutable<Tensor>()->CopyFrom(t);
  }
  const Tensor& Get(const std::string& name) { return scope_.FindVar(name)->Get<Tensor>(); }
  absl::Status Check(const OpDesc& op, const std::map<std::string, Tensor>& inputs,
                     std::vector<std::string> wrt) {
    GradCheckOptions opt;
    opt.wrt = std::move(wrt);
    return CheckGradient(*registry_, op, inputs, opt);
  }

  std::unique_ptr<OpRegistry> registry_ = NewStandardOpRegistry();
  Executor exec_{registry_.get()};
  Scope scope_;
};

// ------------------------------------------------------------------------------------- mul

TEST_F(MathOpsTest, MulForwardValues) {
  Feed("x", FloatTensor({2, 3}, {1, 2, 3, 4, 5, 6}));
  Feed("w", FloatTensor({3, 2}, {1, 0, 0, 1, 1, 1}));
  ASSERT_TRUE(
      exec_.RunOp(MakeOp("mul", {{"X", {"x"}}, {"Y", {"w"}}}, {{"Out", {"o"}}}), &scope_).ok());
  const Tensor& o = Get("o");
  EXPECT_EQ(o.dtype(), FLOAT32);
  ASSERT_EQ(o.shape(), (Shape{2, 2}));
  EXPECT_FLOAT_EQ(o.data<float>()[0], 4);
  EXPECT_FLOAT_EQ(o.data<float>()[1], 5);
  EXPECT_FLOAT_EQ(o.data<float>()[2], 10);
  EXPECT_FLOAT_EQ(o.data<float>()[3], 11);
}

TEST_F(MathOpsTest, MulNumColDimsShapes) {
  Feed("x", RandomTensor({2, 3, 4}, -1, 1, 1));
  Feed("w", RandomTensor({2, 2, 5}, -1, 1, 2));
  OpDesc op = MakeOp("mul", {{"X", {"x"}}, {"Y", {"w"}}}, {{"Out", {"o"}}});
  SetAttr(&op, "x_num_col_dims", 2);
  SetAttr(&op, "y_num_col_dims", 2);
  ASSERT_TRUE(exec_.RunOp(op, &scope_).ok());
  const Tensor& o = Get("o");
  ASSERT_EQ(o.shape(), (Shape{2, 3, 5}));
  // Out[1, 2, 3] = sum_k X[1, 2, k] * W[k / 2, k % 2, 3].
  const double* x = Get("x").data<double>();
  const double* w = Get("w").data<double>();
  double want = 0;
  for (int k = 0; k < 4; ++k) want += x[(1 * 3 + 2) * 4 + k] * w[k * 5 + 3];
  EXPECT_NEAR(o.data<double>()[(1 * 3 + 2) * 5 + 3], want, 1e-12);
}

TEST_F(MathOpsTest, MulGradient) {
  OpDesc op = MakeOp("mul", {{"X", {"x"}}, {"Y", {"w"}}}, {{"Out", {"o"}}});
  EXPECT_TRUE(Check(op,
                    {{"x", RandomTensor({3, 4}, -1, 1, 1)}, {"w", RandomTensor({4, 5}, -1, 1, 2)}},
                    {"x", "w"})
                  .ok());
  EXPECT_TRUE(Check(op,
                    {{"x", RandomTensor({1, 7}, -1, 1, 3)}, {"w", RandomTensor({7, 1}, -1, 1, 4)}},
                    {"x", "w"})
                  .ok());
}

TEST_F(MathOpsTest, MulGradientNumColDims) {
  OpDesc op = MakeOp("mul", {{"X", {"x"}}, {"Y", {"w"}}}, {{"Out", {"o"}}});
  SetAttr(&op, "x_num_col_dims", 2);
  absl::Status s =
      Check(op, {{"x", RandomTensor({2, 3, 4}, -1, 1, 1)}, {"w", RandomTensor({4, 3}, -1, 1, 2)}},
            {"x", "w"});
  EXPECT_TRUE(s.ok()) << s;
  SetAttr(&op, "y_num_col_dims", 2);
  s = Check(op,
            {{"x", RandomTensor({2, 3, 4}, -1, 1, 3)}, {"w", RandomTensor({2, 2, 3}, -1, 1, 4)}},
            {"x", "w"});
  EXPECT_TRUE(s.ok()) << s;
}

TEST_F(MathOpsTest, MulShapeMismatchNamesVariables) {
  Feed("x", RandomTensor({4, 3}, -1, 1, 1));
  Feed("w", RandomTensor({5, 2}, -1, 1, 2));
  absl::Status s =
      exec_.RunOp(MakeOp("mul", {{"X", {"x"}}, {"Y", {"w"}}}, {{"Out", {"o"}}}), &scope_);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("'x' [4, 3]"), std::string::npos) << s;
  EXPECT_NE(s.message().find("'w' [5, 2]"), std::string::npos) << s;
  EXPECT_NE(s.message().find("inner dimension"), std::string::npos) << s;
}

TEST_F(MathOpsTest, MulRejectsBadNumColDims) {
  Feed("x", RandomTensor({4, 3}, -1, 1, 1));
  Feed("w", RandomTensor({3, 2}, -1, 1, 2));
  OpDesc op = MakeOp("mul", {{"X", {"x"}}, {"Y", {"w"}}}, {{"Out", {"o"}}});
  SetAttr(&op, "x_num_col_dims", 2);
  absl::Status s = exec_.RunOp(op, &scope_);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("x_num_col_dims 2"), std::string::npos) << s;
}

TEST_F(MathOpsTest, MulGradSkipsUnboundOutputs) {
  Feed("x", RandomTensor({3, 4}, -1, 1, 1));
  Feed("w", RandomTensor({4, 2}, -1, 1, 2));
  Feed("o@GRAD", RandomTensor({3, 2}, -1, 1, 3));
  OpDesc g = MakeOp("mul_grad", {{"X", {"x"}}, {"Y", {"w"}}, {"Out@GRAD", {"o@GRAD"}}},
                    {{"X@GRAD", {kEmptyVarName}}, {"Y@GRAD", {"w@GRAD"}}});
  ASSERT_TRUE(exec_.RunOp(g, &scope_).ok());
  EXPECT_EQ(scope_.FindVar(kEmptyVarName), nullptr);
  EXPECT_EQ(scope_.FindVar("x@GRAD"), nullptr);
  const Tensor& dw = Get("w@GRAD");
  ASSERT_EQ(dw.shape(), (Shape{4, 2}));
  // dW[2, 1] = sum_i X[i, 2] * dOut[i, 1].
  double want = 0;
  for (int i = 0; i < 3; ++i) {
    want += Get("x").data<double>()[i * 4 + 2] * Get("o@GRAD").data<double>()[i * 2 + 1];
  }
  EXPECT_NEAR(dw.data<double>()[2 * 2 + 1], want, 1e-12);
}

// Products with inner dimension 1 (X with one column, or the gradients of Y with one column and
// of X with one row) give the bits Eigen's product gives, -0 products included, above and below
// Eigen's coefficient-based threshold, in float and double.
template <typename T>
void CheckInnerDimensionOne(const Executor& exec, Scope* scope) {
  using Mat = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  // Values with zeros of both signs and negatives, so that some products are -0.
  auto feed = [&](const std::string& name, const Shape& shape, int seed) {
    Tensor* t = scope->Var(name)->GetMutable<Tensor>();
    t->Resize(DataTypeOf<T>::value, shape);
    for (int64_t i = 0; i < t->numel(); ++i) {
      const int r = static_cast<int>((i * 7 + seed * 13) % 5);
      t->data<T>()[i] = r == 0 ? T(0) : r == 1 ? -T(0) : T(r - 3) * T(0.37) * T(i + 1);
    }
  };
  auto map = [&](const std::string& name, int64_t rows, int64_t cols) {
    return Eigen::Map<const Mat>(scope->FindVar(name)->Get<Tensor>().data<T>(), rows, cols);
  };
  auto same_bits = [&](const std::string& name, const Mat& want) {
    const Tensor& t = scope->FindVar(name)->Get<Tensor>();
    return t.numel() == want.size() &&
           std::memcmp(t.data<T>(), want.data(), sizeof(T) * want.size()) == 0;
  };
  for (const auto& [m, n] : std::vector<std::pair<int64_t, int64_t>>{
           {32, 100}, {256, 1}, {1, 100}, {3, 4}, {1, 1}, {7, 13}}) {
    SCOPED_TRACE(testing::Message() << "m=" << m << " n=" << n << " bytes=" << sizeof(T));
    // Forward: [m, 1] * [1, n].
    feed("x", {m, 1}, 1);
    feed("w", {1, n}, 2);
    ASSERT_TRUE(
        exec.RunOp(MakeOp("mul", {{"X", {"x"}}, {"Y", {"w"}}}, {{"Out", {"o"}}}), scope).ok());
    Mat want(m, n);
    want.noalias() = map("x", m, 1) * map("w", 1, n);
    EXPECT_TRUE(same_bits("o", want));
    // dX = dOut [m, 1] * Y^T [1, n] for Y [n, 1]; dY = X^T [n, 1] * dOut [1, m] for X [1, n].
    feed("y1", {n, 1}, 3);
    feed("g1", {m, 1}, 4);
    feed("xm", {m, n}, 5);
    OpDesc gx = MakeOp("mul_grad", {{"X", {"xm"}}, {"Y", {"y1"}}, {"Out@GRAD", {"g1"}}},
                       {{"X@GRAD", {"xm@GRAD"}}, {"Y@GRAD", {kEmptyVarName}}});
    ASSERT_TRUE(exec.RunOp(gx, scope).ok());
    want.noalias() = map("g1", m, 1) * map("y1", n, 1).transpose();
    EXPECT_TRUE(same_bits("xm@GRAD", want));
    feed("x1", {1, n}, 6);
    feed("w2", {n, m}, 7);
    feed("g2", {1, m}, 8);
    OpDesc gy = MakeOp("mul_grad", {{"X", {"x1"}}, {"Y", {"w2"}}, {"Out@GRAD", {"g2"}}},
                       {{"X@GRAD", {kEmptyVarName}}, {"Y@GRAD", {"w2@GRAD"}}});
    ASSERT_TRUE(exec.RunOp(gy, scope).ok());
    Mat want_y(n, m);
    want_y.noalias() = map("x1", 1, n).transpose() * map("g2", 1, m);
    EXPECT_TRUE(same_bits("w2@GRAD", want_y));
  }
}

TEST_F(MathOpsTest, MulInnerDimensionOneMatchesEigenBitwise) {
  CheckInnerDimensionOne<float>(exec_, &scope_);
  CheckInnerDimensionOne<double>(exec_, &scope_);
}

// mul and mul_grad (Y@GRAD) on the small float shapes SmallGemm takes give Eigen's bits.
TEST_F(MathOpsTest, MulSmallShapesMatchEigenBitwise) {
  using Mat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  for (const auto& [m, k, n] : std::vector<std::tuple<int64_t, int64_t, int64_t>>{
           {32, 10, 100}, {5, 7, 28}, {64, 64, 32}, {13, 3, 20}}) {
    SCOPED_TRACE(testing::Message() << "m=" << m << " k=" << k << " n=" << n);
    std::vector<float> xv(static_cast<size_t>(m * k)), wv(static_cast<size_t>(k * n)),
        gv(static_cast<size_t>(m * n));
    for (size_t i = 0; i < xv.size(); ++i) xv[i] = std::sin(0.7f * i);
    for (size_t i = 0; i < wv.size(); ++i) wv[i] = std::cos(0.3f * i);
    for (size_t i = 0; i < gv.size(); ++i) gv[i] = std::sin(1.3f * i + 0.5f);
    Feed("x", FloatTensor({m, k}, xv));
    Feed("w", FloatTensor({k, n}, wv));
    Feed("o@GRAD", FloatTensor({m, n}, gv));
    ASSERT_TRUE(
        exec_.RunOp(MakeOp("mul", {{"X", {"x"}}, {"Y", {"w"}}}, {{"Out", {"o"}}}), &scope_).ok());
    Mat want(m, n);
    want.noalias() =
        Eigen::Map<const Mat>(xv.data(), m, k) * Eigen::Map<const Mat>(wv.data(), k, n);
    EXPECT_EQ(std::memcmp(Get("o").data<float>(), want.data(), sizeof(float) * want.size()), 0);
    OpDesc g = MakeOp("mul_grad", {{"X", {"x"}}, {"Y", {"w"}}, {"Out@GRAD", {"o@GRAD"}}},
                      {{"X@GRAD", {kEmptyVarName}}, {"Y@GRAD", {"w@GRAD"}}});
    ASSERT_TRUE(exec_.RunOp(g, &scope_).ok());
    Mat want_w(k, n);
    want_w.noalias() =
        Eigen::Map<const Mat>(xv.data(), m, k).transpose() * Eigen::Map<const Mat>(gv.data(), m, n);
    EXPECT_EQ(
        std::memcmp(Get("w@GRAD").data<float>(), want_w.data(), sizeof(float) * want_w.size()), 0);
  }
}

// ---------------------------------------------------------------------------------- matmul

TEST_F(MathOpsTest, MatmulForwardValuesWithTransposeAndAlpha) {
  Feed("a", FloatTensor({3, 2}, {1, 4, 2, 5, 3, 6}));  // A^T = [[1, 2, 3], [4, 5, 6]]
  Feed("b", FloatTensor({2, 3}, {1, 0, 1, 0, 1, 1}));  // B^T = [[1, 0], [0, 1], [1, 1]]
  OpDesc op = MakeOp("matmul", {{"X", {"a"}}, {"Y", {"b"}}}, {{"Out", {"o"}}});
  SetAttr(&op, "transpose_X", true);
  SetAttr(&op, "transpose_Y", true);
  SetAttr(&op, "alpha", 0.5f);
  ASSERT_TRUE(exec_.RunOp(op, &scope_).ok());
  const Tensor& o = Get("o");
  ASSERT_EQ(o.shape(), (Shape{2, 2}));
  EXPECT_FLOAT_EQ(o.data<float>()[0], 2);
  EXPECT_FLOAT_EQ(o.data<float>()[1], 2.5);
  EXPECT_FLOAT_EQ(o.data<float>()[2], 5);
  EXPECT_FLOAT_EQ(o.data<float>()[3], 5.5);
}

TEST_F(MathOpsTest, MatmulGradientAllTransposes) {
  for (bool tx : {false, true}) {
    for (bool ty : {false, true}) {
      OpDesc op = MakeOp("matmul", {{"X", {"x"}}, {"Y", {"y"}}}, {{"Out", {"o"}}});
      SetAttr(&op, "transpose_X", tx);
      SetAttr(&op, "transpose_Y", ty);
      SetAttr(&op, "alpha", 1.5f);
      Shape xs = tx ? Shape{4, 3} : Shape{3, 4};
      Shape ys = ty ? Shape{5, 4} : Shape{4, 5};
      absl::Status s = Check(
          op, {{"x", RandomTensor(xs, -1, 1, 1)}, {"y", RandomTensor(ys, -1, 1, 2)}}, {"x", "y"});
      EXPECT_TRUE(s.ok()) << "tx=" << tx << " ty=" << ty << ": " << s;
    }
  }
}

TEST_F(MathOpsTest, MatmulBatchedGradient) {
  for (bool tx : {false, true}) {
    for (bool ty : {false, true}) {
      OpDesc op = MakeOp("matmul", {{"X", {"x"}}, {"Y", {"y"}}}, {{"Out", {"o"}}});
      SetAttr(&op, "transpose_X", tx);
      SetAttr(&op, "transpose_Y", ty);
      Shape xs = tx ? Shape{2, 4, 3} : Shape{2, 3, 4};
      Shape ys = ty ? Shape{2, 5, 4} : Shape{2, 4, 5};
      absl::Status s = Check(
          op, {{"x", RandomTensor(xs, -1, 1, 1)}, {"y", RandomTensor(ys, -1, 1, 2)}}, {"x", "y"});
      EXPECT_TRUE(s.ok()) << "tx=" << tx << " ty=" << ty << ": " << s;
      // A 2-D Y shared by every batch of X: its gradient sums over batches.
      Shape y2 = ty ? Shape{5, 4} : Shape{4, 5};
      s = Check(op, {{"x", RandomTensor(xs, -1, 1, 3)}, {"y", RandomTensor(y2, -1, 1, 4)}},
                {"x", "y"});
      EXPECT_TRUE(s.ok()) << "broadcast Y, tx=" << tx << " ty=" << ty << ": " << s;
    }
  }
}

TEST_F(MathOpsTest, MatmulBatchedForwardShape) {
  Feed("x", RandomTensor({3, 2, 4}, -1, 1, 1));
  Feed("y", RandomTensor({4, 5}, -1, 1, 2));
  ASSERT_TRUE(
      exec_.RunOp(MakeOp("matmul", {{"X", {"x"}}, {"Y", {"y"}}}, {{"Out", {"o"}}}), &scope_).ok());
  const Tensor& o = Get("o");
  ASSERT_EQ(o.shape(), (Shape{3, 2, 5}));
  double want = 0;
  for (int k = 0; k < 4; ++k) {
    want += Get("x").data<double>()[(2 * 2 + 1) * 4 + k] * Get("y").data<double>()[k * 5 + 3];
  }
  EXPECT_NEAR(o.data<double>()[(2 * 2 + 1) * 5 + 3], want, 1e-12);
}

TEST_F(MathOpsTest, MatmulMismatchNamesVariables) {
  Feed("x", RandomTensor({3, 4}, -1, 1, 1));
  Feed("y", RandomTensor({3, 4}, -1, 1, 2));
  absl::Status s =
      exec_.RunOp(MakeOp("matmul", {{"X", {"x"}}, {"Y", {"y"}}}, {{"Out", {"o"}}}), &scope_);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("'x' [3, 4]"), std::string::npos) << s;
  EXPECT_NE(s.message().find("'y' [3, 4]"), std::string::npos) << s;
  Feed("y3", RandomTensor({3, 4, 2}, -1, 1, 2));
  Feed("x3", RandomTensor({2, 3, 4}, -1, 1, 2));
  s = exec_.RunOp(MakeOp("matmul", {{"X", {"x3"}}, {"Y", {"y3"}}}, {{"Out", {"o"}}}), &scope_);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("batch"), std::string::npos) << s;
}

// ----------------------------------------------------------------------------- elementwise

const char* const kElementwiseOps[] = {"elementwise_add", "elementwise_sub", "elementwise_mul"};

TEST_F(MathOpsTest, ElementwiseForwardValues) {
  Feed("x", FloatTensor({2, 3}, {1, 2, 3, 4, 5, 6}));
  Feed("b", FloatTensor({3}, {10, 20, 30}));
  Feed("c", FloatTensor({2}, {2, -1}));
  Feed("s", FloatTensor({2, 3}, {1, 1, 1, 2, 2, 2}));
  auto run = [&](const char* type, const char* y, int axis) {
    OpDesc op = MakeOp(type, {{"X", {"x"}}, {"Y", {y}}}, {{"Out", {"o"}}});
    SetAttr(&op, "axis", axis);
    absl::Status s = exec_.RunOp(op, &scope_);
    EXPECT_TRUE(s.ok()) << s;
    const Tensor& o = Get("o");
    EXPECT_EQ(o.shape(), (Shape{2, 3}));
    return std::vector<float>(o.data<float>(), o.data<float>() + 6);
  };
  EXPECT_EQ(run("elementwise_add", "b", -1), (std::vector<float>{11, 22, 33, 14, 25, 36}));
  EXPECT_EQ(run("elementwise_sub", "b", 1), (std::vector<float>{-9, -18, -27, -6, -15, -24}));
  EXPECT_EQ(run("elementwise_mul", "c", 0), (std::vector<float>{2, 4, 6, -4, -5, -6}));
  EXPECT_EQ(run("elementwise_mul", "s", -1), (std::vector<float>{1, 2, 3, 8, 10, 12}));
  EXPECT_EQ(run("elementwise_sub", "s", -1), (std::vector<float>{0, 1, 2, 2, 3, 4}));
}

TEST_F(MathOpsTest, ElementwiseGradientSameShape) {
  for (const char* type : kElementwiseOps) {
    OpDesc op = MakeOp(type, {{"X", {"x"}}, {"Y", {"y"}}}, {{"Out", {"o"}}});
    absl::Status s =
        Check(op, {{"x", RandomTensor({3, 4}, -1, 1, 1)}, {"y", RandomTensor({3, 4}, -1, 1, 2)}},
              {"x", "y"});
    EXPECT_TRUE(s.ok()) << type << ": " << s;
  }
}

TEST_F(MathOpsTest, ElementwiseGradientBroadcast) {
  struct Case {
    Shape x, y;
    int axis;
  };
  const Case cases[] = {
      {{4, 5}, {5}, -1},       // bias over rows (post == 1)
      {{2, 3, 4}, {3}, 1},     // middle axis (pre and post)
      {{2, 3, 4}, {2, 3}, 0},  // leading axes (pre == 1)
      {{2, 3, 4}, {3, 1}, 1},  // trailing 1 of Y trimmed
      {{2, 3, 4}, {1}, -1},    // scalar-like Y
  };
  for (const char* type : kElementwiseOps) {
    for (const Case& c : cases) {
      OpDesc op = MakeOp(type, {{"X", {"x"}}, {"Y", {"y"}}}, {{"Out", {"o"}}});
      SetAttr(&op, "axis", c.axis);
      absl::Status s = Check(
          op, {{"x", RandomTensor(c.x, -1, 1, 1)}, {"y", RandomTensor(c.y, -1, 1, 2)}}, {"x", "y"});
      EXPECT_TRUE(s.ok()) << type << " " << ShapeString(c.x) << " with " << ShapeString(c.y) << ": "
                          << s;
    }
  }
}

TEST_F(MathOpsTest, ElementwiseBroadcastMismatchNamesVariables) {
  Feed("x", RandomTensor({2, 3}, -1, 1, 1));
  Feed("y", RandomTensor({4}, -1, 1, 2));
  for (const char* type : kElementwiseOps) {
    absl::Status s =
        exec_.RunOp(MakeOp(type, {{"X", {"x"}}, {"Y", {"y"}}}, {{"Out", {"o"}}}), &scope_);
    ASSERT_FALSE(s.ok()) << type;
    EXPECT_NE(s.message().find("'x' [2, 3]"), std::string::npos) << s;
    EXPECT_NE(s.message().find("'y' [4]"), std::string::npos) << s;
  }
  // A valid Y at the wrong axis.
  Feed("b", RandomTensor({3}, -1, 1, 2));
  OpDesc op = MakeOp("elementwise_add", {{"X", {"x"}}, {"Y", {"b"}}}, {{"Out", {"o"}}});
  SetAttr(&op, "axis", 0);
  absl::Status s = exec_.RunOp(op, &scope_);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("axis 0"), std::string::npos) << s;
}

TEST_F(MathOpsTest, ElementwiseAddInPlace) {
  Feed("x", FloatTensor({2, 2}, {1, 2, 3, 4}));
  Feed("b", FloatTensor({2}, {1, -1}));
  ASSERT_TRUE(
      exec_
          .RunOp(MakeOp("elementwise_add", {{"X", {"x"}}, {"Y", {"b"}}}, {{"Out", {"x"}}}), &scope_)
          .ok());
  const Tensor& x = Get("x");
  EXPECT_EQ(std::vector<float>(x.data<float>(), x.data<float>() + 4),
            (std::vector<float>{2, 1, 4, 3}));
}

TEST_F(MathOpsTest, ElementwiseGradOnlyY) {
  // Only the bias gradient is wanted: X@GRAD is not produced.
  Feed("x", RandomTensor({3, 2}, -1, 1, 1));
  Feed("b", RandomTensor({2}, -1, 1, 2));
  Tensor g(FLOAT64, {3, 2});
  for (int i = 0; i < 6; ++i) g.data<double>()[i] = i + 1;
  Feed("o@GRAD", g);
  OpDesc op = MakeOp("elementwise_add_grad", {{"X", {"x"}}, {"Y", {"b"}}, {"Out@GRAD", {"o@GRAD"}}},
                     {{"X@GRAD", {kEmptyVarName}}, {"Y@GRAD", {"b@GRAD"}}});
  ASSERT_TRUE(exec_.RunOp(op, &scope_).ok());
  EXPECT_EQ(scope_.FindVar(kEmptyVarName), nullptr);
  const Tensor& db = Get("b@GRAD");
  EXPECT_DOUBLE_EQ(db.data<double>()[0], 1 + 3 + 5);
  EXPECT_DOUBLE_EQ(db.data<double>()[1], 2 + 4 + 6);
}

// ------------------------------------------------------------------------------ reduce_sum


TEST_F(MathOpsTest, ReduceSumAndMeanValuesAndShapes) {
  Feed("x", FloatTensor({2, 3}, {1, 2, 3, 4, 5, 6}));
  OpDesc op = MakeOp("reduce_sum", {{"X", {"x"}}}, {{"Out", {"o"}}});
  SetAttr(&op, "dim", std::vector<int64_t>{1});
  SetAttr(&op, "keep_dim", true);
  ASSERT_TRUE(exec_.RunOp(op, &scope_).ok());
  ASSERT_EQ(Get("o").shape(), (Shape{2, 1}));
  EXPECT_FLOAT_EQ(Get("o").data<float>()[0], 6);
  EXPECT_FLOAT_EQ(Get("o").data<float>()[1], 15);

  op = MakeOp("reduce_mean", {{"X", {"x"}}}, {{"Out", {"m"}}});
  SetAttr(&op, "dim", std::vector<int64_t>{-2});
  ASSERT_TRUE(exec_.RunOp(op, &scope_).ok());
  ASSERT_EQ(Get("m").shape(), (Shape{3}));
  EXPECT_FLOAT_EQ(Get("m").data<float>()[0], 2.5f);
  EXPECT_FLOAT_EQ(Get("m").data<float>()[2], 4.5f);

  op = MakeOp("reduce_sum", {{"X", {"x"}}}, {{"Out", {"a"}}});
  SetAttr(&op, "reduce_all", true);
  ASSERT_TRUE(exec_.RunOp(op, &scope_).ok());
  ASSERT_EQ(Get("a").shape(), (Shape{1}));
  EXPECT_FLOAT_EQ(Get("a").data<float>()[0], 21);

  op = MakeOp("reduce_sum", {{"X", {"x"}}}, {{"Out", {"bad"}}});
  SetAttr(&op, "dim", std::vector<int64_t>{2});
  absl::Status s = exec_.RunOp(op, &scope_);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("dim 2 is out of range"), absl::string_view::npos) << s;
}

TEST_F(MathOpsTest, ReduceGradients) {
  for (const char* type : {"reduce_sum", "reduce_mean"}) {
    for (std::vector<int64_t> dims : {std::vector<int64_t>{1}, std::vector<int64_t>{0, 2}}) {
      OpDesc op = MakeOp(type, {{"X", {"x"}}}, {{"Out", {"o"}}});
      SetAttr(&op, "dim", dims);
      SetAttr(&op, "keep_dim", dims.size() == 1);
      EXPECT_TRUE(Check(op, {{"x", RandomTensor({2, 3, 4}, -1, 1, 5)}}, {"x"}).ok()) << type;
    }
  }
}


}  // namespace
}  // namespace tessera
