#include "common/ops/nn_ops.h"

#include <cmath>
#include <map>
#include <string>
#include <vector>

#include "common/framework/executor.h"
#include "common/ops/grad_check.h"
#include "common/ops/ops.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

class NnOpsTest : public ::testing::Test {
 protected:
  void Feed(const std::string& name, const Tensor& t) {
    scope_.Var(name)->GetMutable<Tensor>()->CopyFrom(t);
  }
  const Tensor& Get(const std::string& name) { return scope_.FindVar(name)->Get<Tensor>(); }
  absl::Status Run(const OpDesc& op) { return exec_.RunOp(op, &scope_); }
  absl::Status Check(const OpDesc& op, const std::map<std::string, Tensor>& inputs,
                     std::vector<std::string> wrt, std::vector<std::string> outputs = {}) {
    GradCheckOptions opt;
    opt.wrt = std::move(wrt);
    opt.outputs = std::move(outputs);
    return CheckGradient(*registry_, op, inputs, opt);
  }

  std::unique_ptr<OpRegistry> registry_ = NewStandardOpRegistry();
  Executor exec_{registry_.get()};
  Scope scope_;
};

OpDesc Conv(std::vector<int64_t> strides, std::vector<int64_t> paddings,
            std::vector<int64_t> dilations = {1, 1}) {
  OpDesc op = MakeOp("conv2d", {{"Input", {"x"}}, {"Filter", {"w"}}}, {{"Output", {"y"}}});
  SetAttr(&op, "strides", strides);
  SetAttr(&op, "paddings", paddings);
  SetAttr(&op, "dilations", dilations);
  return op;
}

// The textbook convolution, one output element at a time.
Tensor NaiveConv(const Tensor& x, const Tensor& w, int64_t sh, int64_t sw, int64_t ph, int64_t pw,
                 int64_t dh, int64_t dw) {
  const int64_t n = x.dim(0), c = x.dim(1), h = x.dim(2), wd = x.dim(3);
  const int64_t m = w.dim(0), kh = w.dim(2), kw = w.dim(3);
  const int64_t ho = (h + 2 * ph - (dh * (kh - 1) + 1)) / sh + 1;
  const int64_t wo = (wd + 2 * pw - (dw * (kw - 1) + 1)) / sw + 1;
  Tensor y(FLOAT64, {n, m, ho, wo});
  const double* xp = x.data<double>();
  const double* wp = w.data<double>();
  for (int64_t b = 0; b < n; ++b)
    for (int64_t o = 0; o < m; ++o)
      for (int64_t i = 0; i < ho; ++i)
        for (int64_t j = 0; j < wo; ++j) {
          double s = 0;
          for (int64_t ci = 0; ci < c; ++ci)
            for (int64_t a = 0; a < kh; ++a)
              for (int64_t bb = 0; bb < kw; ++bb) {
                const int64_t ih = i * sh - ph + a * dh, iw = j * sw - pw + bb * dw;
                if (ih < 0 || ih >= h || iw < 0 || iw >= wd) continue;
                s += xp[((b * c + ci) * h + ih) * wd + iw] * wp[((o * c + ci) * kh + a) * kw + bb];
              }
          y.data<double>()[((b * m + o) * ho + i) * wo + j] = s;
        }
  return y;
}

TEST_F(NnOpsTest, Conv2dEqualsNaiveConvolution) {
  struct Case {
    Shape x, w;
    int64_t sh, sw, ph, pw, dh, dw;
  };
  for (const Case& c : {Case{{2, 3, 7, 6}, {4, 3, 3, 3}, 1, 1, 0, 0, 1, 1},
                        Case{{3, 2, 8, 9}, {5, 2, 3, 2}, 2, 1, 1, 2, 1, 1},
                        Case{{1, 1, 28, 28}, {20, 1, 5, 5}, 1, 1, 0, 0, 1, 1},
                        Case{{2, 2, 9, 9}, {3, 2, 3, 3}, 2, 2, 2, 1, 2, 1},
                        // Padding wider than the image: whole rows of columns are padding.
                        Case{{2, 2, 2, 1}, {3, 2, 3, 7}, 1, 1, 1, 3, 1, 1},
                        Case{{1, 1, 2, 2}, {2, 1, 3, 3}, 2, 3, 4, 4, 1, 2},
                        // 14400 column values per sample: chunks of 9 samples (the last of 4).
                        Case{{40, 4, 16, 16}, {3, 4, 5, 5}, 1, 1, 0, 0, 1, 1}}) {
    Tensor x = RandomTensor(c.x, -1, 1, 1);
    Tensor w = RandomTensor(c.w, -1, 1, 2);
    Feed("x", x);
    Feed("w", w);
    ASSERT_TRUE(Run(Conv({c.sh, c.sw}, {c.ph, c.pw}, {c.dh, c.dw})).ok());
    Tensor want = NaiveConv(x, w, c.sh, c.sw, c.ph, c.pw, c.dh, c.dw);
    const Tensor& got = Get("y");
    ASSERT_EQ(got.shape(), want.shape()) << ShapeString(c.x);
    for (int64_t i = 0; i < want.numel(); ++i) {
      ASSERT_NEAR(got.data<double>()[i], want.data<double>()[i], 1e-12) << i;
    }
  }
}

TEST_F(NnOpsTest, Conv2dGradientWithStrideAndPadding) {
  std::map<std::string, Tensor> in = {{"x", RandomTensor({2, 2, 6, 5}, -1, 1, 3)},
                                      {"w", RandomTensor({3, 2, 3, 3}, -1, 1, 4)}};
  absl::Status s = Check(Conv({1, 1}, {0, 0}), in, {"x", "w"}, {"y"});
  EXPECT_TRUE(s.ok()) << s;
  s = Check(Conv({2, 1}, {1, 2}), in, {"x", "w"}, {"y"});
  EXPECT_TRUE(s.ok()) << s;
  s = Check(Conv({2, 2}, {1, 1}, {2, 1}), in, {"x", "w"}, {"y"});
  EXPECT_TRUE(s.ok()) << s;
  // Padding wider than the image.
  std::map<std::string, Tensor> tiny = {{"x", RandomTensor({2, 2, 2, 1}, -1, 1, 5)},
                                        {"w", RandomTensor({3, 2, 3, 7}, -1, 1, 6)}};
  s = Check(Conv({1, 1}, {1, 3}), tiny, {"x", "w"}, {"y"});
  EXPECT_TRUE(s.ok()) << s;
}

// A batch that im2col takes in several chunks has the gradients of its samples taken one by one:
// Filter@GRAD is their sum, Input@GRAD their concatenation.
TEST_F(NnOpsTest, Conv2dGradientOverChunksEqualsPerSampleGradients) {
  const int64_t n = 40;
  Tensor x = RandomTensor({n, 4, 16, 16}, -1, 1, 21), w = RandomTensor({3, 4, 5, 5}, -1, 1, 22);
  Tensor dy = RandomTensor({n, 3, 12, 12}, -1, 1, 23);
  OpDesc grad =
      MakeOp("conv2d_grad", {{"Input", {"x"}}, {"Filter", {"w"}}, {"Output@GRAD", {"dy"}}},
             {{"Input@GRAD", {"dx"}}, {"Filter@GRAD", {"dw"}}});
  Feed("x", x);
  Feed("w", w);
  Feed("dy", dy);
  ASSERT_TRUE(Run(grad).ok());
  Tensor dx, dw;
  dx.CopyFrom(Get("dx"));
  dw.CopyFrom(Get("dw"));
  std::vector<double> dw_sum(static_cast<size_t>(w.numel()), 0.0);
  const int64_t xs = 4 * 16 * 16, ys = 3 * 12 * 12;
  for (int64_t s = 0; s < n; ++s) {
    Tensor xi(FLOAT64, {1, 4, 16, 16}), dyi(FLOAT64, {1, 3, 12, 12});
    std::copy_n(x.data<double>() + s * xs, xs, xi.data<double>());
    std::copy_n(dy.data<double>() + s * ys, ys, dyi.data<double>());
    Feed("x", xi);
    Feed("dy", dyi);
    ASSERT_TRUE(Run(grad).ok());
    for (int64_t k = 0; k < xs; ++k) {
      ASSERT_NEAR(dx.data<double>()[s * xs + k], Get("dx").data<double>()[k], 1e-12) << s;
    }
    for (int64_t k = 0; k < w.numel(); ++k) dw_sum[k] += Get("dw").data<double>()[k];
  }
  for (int64_t k = 0; k < w.numel(); ++k) ASSERT_NEAR(dw.data<double>()[k], dw_sum[k], 1e-9);
}

TEST_F(NnOpsTest, Conv2dFloat32MatchesFloat64) {
  Tensor x = RandomTensor({4, 3, 10, 10}, -1, 1, 5), w = RandomTensor({6, 3, 5, 5}, -1, 1, 6);
  Feed("x", x);
  Feed("w", w);
  ASSERT_TRUE(Run(Conv({1, 1}, {2, 2})).ok());
  Tensor want;
  want.CopyFrom(Get("y"));
  Tensor xf(FLOAT32, x.shape()), wf(FLOAT32, w.shape());
  for (int64_t i = 0; i < x.numel(); ++i) xf.data<float>()[i] = x.data<double>()[i];
  for (int64_t i = 0; i < w.numel(); ++i) wf.data<float>()[i] = w.data<double>()[i];
  Feed("x", xf);
  Feed("w", wf);
  ASSERT_TRUE(Run(Conv({1, 1}, {2, 2})).ok());
  for (int64_t i = 0; i < want.numel(); ++i) {
    ASSERT_NEAR(Get("y").data<float>()[i], want.data<double>()[i], 1e-4) << i;
  }
}

TEST_F(NnOpsTest, Conv2dRejectsBadShapesWithOneLine) {
  Feed("x", RandomTensor({1, 3, 4, 4}, -1, 1, 1));
  Feed("w", RandomTensor({2, 2, 3, 3}, -1, 1, 1));
  absl::Status s = Run(Conv({1, 1}, {0, 0}));
  EXPECT_NE(s.message().find("must be the input's channels 3"), std::string::npos) << s;
  Feed("w", RandomTensor({2, 3, 5, 5}, -1, 1, 1));
  s = Run(Conv({1, 1}, {0, 0}));
  EXPECT_NE(s.message().find("is larger than Input"), std::string::npos) << s;
  s = Run(Conv({0, 1}, {0, 0}));
  EXPECT_NE(s.message().find("strides [0, 1]"), std::string::npos) << s;
  Feed("x", RandomTensor({3, 4, 4}, -1, 1, 1));
  s = Run(Conv({1, 1}, {0, 0}));
  EXPECT_NE(s.message().find("must be 4-D"), std::string::npos) << s;
}

OpDesc Pool(const std::string& type, std::vector<int64_t> ksize, std::vector<int64_t> strides,
            std::vector<int64_t> paddings, bool exclusive = true) {
  OpDesc op = MakeOp("pool2d", {{"X", {"x"}}}, {{"Out", {"y"}}});
  SetAttr(&op, "pooling_type", type);
  SetAttr(&op, "ksize", ksize);
  SetAttr(&op, "strides", strides);
  SetAttr(&op, "paddings", paddings);
  SetAttr(&op, "exclusive", exclusive);
  return op;
}

TEST_F(NnOpsTest, Pool2dForwardValues) {
  // One 3x4 plane 0..11; 2x2 windows, stride 2, padding [1, 0]: rows {-1,0}, {1,2}.
  Tensor x(FLOAT64, {1, 1, 3, 4});
  for (int i = 0; i < 12; ++i) x.data<double>()[i] = i;
  Feed("x", x);
  ASSERT_TRUE(Run(Pool("max", {2, 2}, {2, 2}, {1, 0})).ok());
  ASSERT_EQ(Get("y").shape(), (Shape{1, 1, 2, 2}));
  EXPECT_EQ(std::vector<double>(Get("y").data<double>(), Get("y").data<double>() + 4),
            (std::vector<double>{1, 3, 9, 11}));
  ASSERT_TRUE(Run(Pool("avg", {2, 2}, {2, 2}, {1, 0})).ok());
  EXPECT_EQ(std::vector<double>(Get("y").data<double>(), Get("y").data<double>() + 4),
            (std::vector<double>{0.5, 2.5, 6.5, 8.5}));
  ASSERT_TRUE(Run(Pool("avg", {2, 2}, {2, 2}, {1, 0}, /*exclusive=*/false)).ok());
  EXPECT_EQ(std::vector<double>(Get("y").data<double>(), Get("y").data<double>() + 4),
            (std::vector<double>{0.25, 1.25, 6.5, 8.5}));
  OpDesc global = Pool("avg", {1, 1}, {1, 1}, {0, 0});
  SetAttr(&global, "global_pooling", true);
  ASSERT_TRUE(Run(global).ok());
  ASSERT_EQ(Get("y").shape(), (Shape{1, 1, 1, 1}));
  EXPECT_DOUBLE_EQ(Get("y").data<double>()[0], 5.5);
}

TEST_F(NnOpsTest, Pool2dGradients) {
  // Distinct values, so that each max window has one maximum (finite differences agree).
  Tensor x(FLOAT64, {2, 3, 6, 5});
  for (int64_t i = 0; i < x.numel(); ++i) x.data<double>()[i] = std::sin(1.7 * i) * 3 + 0.01 * i;
  for (const std::string type : {"max", "avg"}) {
    for (bool exclusive : {true, false}) {
      absl::Status s = Check(Pool(type, {2, 2}, {2, 2}, {0, 0}, exclusive), {{"x", x}}, {"x"});
      EXPECT_TRUE(s.ok()) << type << " " << s;
      s = Check(Pool(type, {3, 2}, {2, 1}, {1, 1}, exclusive), {{"x", x}}, {"x"});
      EXPECT_TRUE(s.ok()) << type << " padded " << s;
    }
  }
}

TEST_F(NnOpsTest, Pool2dRejectsBadAttributes) {
  Feed("x", RandomTensor({1, 1, 4, 4}, -1, 1, 1));
  absl::Status s = Run(Pool("median", {2, 2}, {2, 2}, {0, 0}));
  EXPECT_NE(s.message().find("pooling_type 'median'"), std::string::npos) << s;
  s = Run(Pool("max", {2, 2}, {2, 2}, {2, 0}));
  EXPECT_NE(s.message().find("must be smaller than ksize"), std::string::npos) << s;
  s = Run(Pool("max", {5, 5}, {1, 1}, {0, 0}));
  EXPECT_NE(s.message().find("is larger than X"), std::string::npos) << s;
}

TEST_F(NnOpsTest, FlattenShapeAndGradient) {
  OpDesc op = MakeOp("flatten", {{"X", {"x"}}}, {{"Out", {"y"}}});
  Tensor x = RandomTensor({2, 3, 4, 5}, -1, 1, 7);
  Feed("x", x);
  ASSERT_TRUE(Run(op).ok());
  EXPECT_EQ(Get("y").shape(), (Shape{2, 60}));
  EXPECT_EQ(Get("y").data<double>()[61], x.data<double>()[61]);
  SetAttr(&op, "axis", int64_t{3});
  ASSERT_TRUE(Run(op).ok());
  EXPECT_EQ(Get("y").shape(), (Shape{24, 5}));
  EXPECT_TRUE(Check(op, {{"x", x}}, {"x"}).ok());
  SetAttr(&op, "axis", int64_t{5});
  EXPECT_NE(Run(op).message().find("axis 5 must be in [0, 4]"), std::string::npos);
}

OpDesc BatchNormOp(bool is_test) {
  OpDesc op = MakeOp("batch_norm",
                     {{"X", {"x"}},
                      {"Scale", {"scale"}},
                      {"Bias", {"bias"}},
                      {"Mean", {"mean"}},
                      {"Variance", {"var"}}},
                     {{"Y", {"y"}},
                      {"MeanOut", {"mean"}},
                      {"VarianceOut", {"var"}},
                      {"SavedMean", {"saved_mean"}},
                      {"SavedVariance", {"saved_var"}}});
  SetAttr(&op, "is_test", is_test);
  SetAttr(&op, "momentum", 0.75f);
  return op;
}

TEST_F(NnOpsTest, BatchNormNormalizesAndMovesRunningStatistics) {
  // Channel 0 holds 1, 3 (mean 2, var 1); channel 1 holds 0, 4 (mean 2, var 4).
  Tensor x(FLOAT64, {2, 2, 1, 1});
  const double v[] = {1, 0, 3, 4};
  for (int i = 0; i < 4; ++i) x.data<double>()[i] = v[i];
  Feed("x", x);
  Tensor ones(FLOAT64, {2}), zeros(FLOAT64, {2});
  ones.flat<double>().setConstant(1);
  zeros.flat<double>().setZero();
  Feed("scale", ones);
  Feed("bias", zeros);
  Feed("mean", zeros);
  Feed("var", ones);
  ASSERT_TRUE(Run(BatchNormOp(false)).ok());
  const double eps = 1e-5;
  EXPECT_NEAR(Get("y").data<double>()[0], -1 / std::sqrt(1 + eps), 1e-7);
  EXPECT_NEAR(Get("y").data<double>()[3], 2 / std::sqrt(4 + eps), 1e-7);
  EXPECT_NEAR(Get("mean").data<double>()[0], 0.25 * 2, 1e-6);        // 0.75 * 0 + 0.25 * 2
  EXPECT_NEAR(Get("var").data<double>()[1], 0.75 + 0.25 * 4, 1e-6);  // 0.75 * 1 + 0.25 * 4
  // Inference uses the running statistics.
  ASSERT_TRUE(Run(BatchNormOp(true)).ok());
  EXPECT_NEAR(Get("y").data<double>()[0], (1 - 0.5) / std::sqrt(0.75 + 0.25 * 1 + eps), 1e-6);
  EXPECT_NEAR(Get("mean").data<double>()[0], 0.5, 1e-6);  // unchanged
}

TEST_F(NnOpsTest, BatchNormGradients) {
  std::map<std::string, Tensor> in = {{"x", RandomTensor({3, 2, 2, 3}, -2, 2, 8)},
                                      {"scale", RandomTensor({2}, 0.5, 1.5, 9)},
                                      {"bias", RandomTensor({2}, -1, 1, 10)},
                                      {"mean", RandomTensor({2}, -1, 1, 11)},
                                      {"var", RandomTensor({2}, 0.5, 2, 12)}};
  // Training: the running statistics are outputs too; the loss is over Y only.
  absl::Status s = Check(BatchNormOp(false), in, {"x", "scale", "bias"}, {"y"});
  EXPECT_TRUE(s.ok()) << s;
  s = Check(BatchNormOp(true), in, {"x", "scale", "bias"}, {"y"});
  EXPECT_TRUE(s.ok()) << s;
  in["x"] = RandomTensor({5, 3}, -2, 2, 13);  // [N, C]
  in["scale"] = RandomTensor({3}, 0.5, 1.5, 14);
  in["bias"] = RandomTensor({3}, -1, 1, 15);
  in["mean"] = RandomTensor({3}, -1, 1, 17);
  in["var"] = RandomTensor({3}, 0.5, 2, 16);
  s = Check(BatchNormOp(false), in, {"x", "scale", "bias"}, {"y"});
  EXPECT_TRUE(s.ok()) << s;
}

TEST_F(NnOpsTest, AccuracyTopK) {
  Tensor x(FLOAT32, {4, 3});
  const float v[] = {0.1f, 0.7f, 0.2f,   // label 1: top-1
                     0.5f, 0.3f, 0.2f,   // label 1: second
                     0.2f, 0.3f, 0.5f,   // label 0: third
                     0.4f, 0.4f, 0.2f};  // label 1: tied for first
  for (int i = 0; i < 12; ++i) x.data<float>()[i] = v[i];
  Tensor label(INT64, {4, 1});
  const int64_t l[] = {1, 1, 0, 1};
  for (int i = 0; i < 4; ++i) label.data<int64_t>()[i] = l[i];
  Feed("x", x);
  Feed("label", label);
  OpDesc op = MakeOp("accuracy", {{"X", {"x"}}, {"Label", {"label"}}},
                     {{"Accuracy", {"acc"}}, {"Correct", {"correct"}}, {"Total", {"total"}}});
  ASSERT_TRUE(Run(op).ok());
  EXPECT_FLOAT_EQ(Get("acc").data<float>()[0], 0.5f);
  EXPECT_EQ(Get("correct").data<int64_t>()[0], 2);
  EXPECT_EQ(Get("total").data<int64_t>()[0], 4);
  SetAttr(&op, "k", int64_t{2});
  ASSERT_TRUE(Run(op).ok());
  EXPECT_FLOAT_EQ(Get("acc").data<float>()[0], 0.75f);
  label.data<int64_t>()[2] = 3;
  Feed("label", label);
  EXPECT_NE(Run(op).message().find("has value 3 at row 2, outside [0, 3)"), std::string::npos);
}

}  // namespace
}  // namespace tessera
