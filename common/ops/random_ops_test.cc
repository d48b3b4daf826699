#include "common/ops/random_ops.h"

#include <cmath>
#include <cstring>

#include "common/framework/executor.h"
#include "common/ops/counter_rng.h"
#include "common/ops/ops.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

class RandomOpsTest : public ::testing::TestWithParam<const char*> {
 protected:
  // Runs the op named by the test parameter and returns a copy of its output.
  Tensor Run(const Shape& shape, int64_t seed, int64_t offset = 0, DataType dtype = FLOAT32) {
    OpDesc op = MakeOp(GetParam(), {}, {{"Out", {"out"}}});
    SetAttr(&op, "shape", shape);
    SetAttr(&op, "seed", seed);
    SetAttr(&op, "dtype", static_cast<int64_t>(dtype));
    if (offset != 0) SetAttr(&op, "offset", offset);
    absl::Status s = exec_.RunOp(op, &scope_);
    EXPECT_TRUE(s.ok()) << s;
    return scope_.FindVar("out")->Get<Tensor>().Clone();
  }

  std::unique_ptr<OpRegistry> registry_ = NewStandardOpRegistry();
  Executor exec_{registry_.get()};
  Scope scope_;
};

bool SameBits(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() &&
         std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0;
}

TEST_P(RandomOpsTest, SameSeedSameValuesDifferentSeedDiffers) {
  Tensor a = Run({50, 8}, 7);
  Tensor b = Run({50, 8}, 7);
  Tensor c = Run({50, 8}, 8);
  EXPECT_EQ(a.shape(), (Shape{50, 8}));
  EXPECT_TRUE(SameBits(a, b));
  int equal = 0;
  for (int64_t i = 0; i < a.numel(); ++i) equal += a.data<float>()[i] == c.data<float>()[i];
  EXPECT_LT(equal, 3);
  // Neighbouring elements differ too (no stuck stream).
  int repeats = 0;
  for (int64_t i = 1; i < a.numel(); ++i) repeats += a.data<float>()[i] == a.data<float>()[i - 1];
  EXPECT_LT(repeats, 3);
}

TEST_P(RandomOpsTest, SliceWithOffsetEqualsRowsOfWholeTensor) {
  const int64_t width = 6;
  for (DataType dtype : {FLOAT32, FLOAT64}) {
    Tensor full = Run({20, width}, 42, 0, dtype);
    Tensor rows = Run({5, width}, 42, 7 * width, dtype);  // rows [7, 12)
    const char* full_rows = static_cast<const char*>(full.raw_data()) + 7 * width * SizeOf(dtype);
    EXPECT_EQ(std::memcmp(rows.raw_data(), full_rows, rows.nbytes()), 0) << DataTypeName(dtype);
  }
}

TEST_P(RandomOpsTest, RowsForAnyIdMatchCounterFunctions) {
  // A sparse-table row for id r is generated with offset r * width (wrapping for big/negative ids).
  const int64_t width = 4;
  for (int64_t id : {int64_t{3}, int64_t{-5}, int64_t{1} << 62}) {
    Tensor row =
        Run({1, width}, 11, static_cast<int64_t>(static_cast<uint64_t>(id) * width), FLOAT64);
    for (int64_t j = 0; j < width; ++j) {
      uint64_t index = static_cast<uint64_t>(id) * width + j;
      double expect = std::string(GetParam()) == "uniform_random"
                          ? -1.0 + 2.0 * CounterUniform(11, index)
                          : CounterGaussian(11, index);
      EXPECT_EQ(row.data<double>()[j], expect) << "id " << id << " col " << j;
    }
  }
}

TEST_P(RandomOpsTest, RejectsBadAttributes) {
  OpDesc op = MakeOp(GetParam(), {}, {{"Out", {"out"}}});
  SetAttr(&op, "shape", std::vector<int64_t>{2, -1});
  absl::Status s = exec_.RunOp(op, &scope_);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("[2, -1]"), std::string::npos) << s;
  SetAttr(&op, "shape", std::vector<int64_t>{2});
  SetAttr(&op, "dtype", static_cast<int64_t>(INT64));
  EXPECT_FALSE(exec_.RunOp(op, &scope_).ok());
}

INSTANTIATE_TEST_SUITE_P(Ops, RandomOpsTest,
                         ::testing::Values("uniform_random", "gaussian_random"));

class RandomMomentsTest : public ::testing::Test {
 protected:
  std::unique_ptr<OpRegistry> registry_ = NewStandardOpRegistry();
  Executor exec_{registry_.get()};
  Scope scope_;
};

TEST_F(RandomMomentsTest, UniformRangeAndMoments) {
  OpDesc op = MakeOp("uniform_random", {}, {{"Out", {"u"}}});
  SetAttr(&op, "shape", std::vector<int64_t>{200, 500});
  SetAttr(&op, "min", 2.0f);
  SetAttr(&op, "max", 5.0f);
  SetAttr(&op, "seed", int64_t{3});
  ASSERT_TRUE(exec_.RunOp(op, &scope_).ok());
  const Tensor& u = scope_.FindVar("u")->Get<Tensor>();
  ASSERT_EQ(u.dtype(), FLOAT32);
  double sum = 0, sq = 0, lo = 1e9, hi = -1e9;
  int buckets[10] = {0};
  for (int64_t i = 0; i < u.numel(); ++i) {
    double v = u.data<float>()[i];
    sum += v;
    sq += v * v;
    lo = std::min(lo, v);
    hi = std::max(hi, v);
    buckets[std::min(9, static_cast<int>((v - 2.0) / 0.3))]++;
  }
  double n = u.numel(), mean = sum / n, var = sq / n - mean * mean;
  EXPECT_GE(lo, 2.0);
  EXPECT_LT(hi, 5.0);
  EXPECT_NEAR(mean, 3.5, 0.01);
  EXPECT_NEAR(var, 9.0 / 12, 0.01);
  for (int b : buckets) EXPECT_NEAR(b, n / 10, n / 100);  // 10% buckets, within 1% of n
}

TEST_F(RandomMomentsTest, GaussianMoments) {
  OpDesc op = MakeOp("gaussian_random", {}, {{"Out", {"g"}}});
  SetAttr(&op, "shape", std::vector<int64_t>{100000});
  SetAttr(&op, "mean", 1.0f);
  SetAttr(&op, "std", 2.0f);
  SetAttr(&op, "seed", int64_t{5});
  SetAttr(&op, "dtype", static_cast<int64_t>(FLOAT64));
  ASSERT_TRUE(exec_.RunOp(op, &scope_).ok());
  const Tensor& g = scope_.FindVar("g")->Get<Tensor>();
  double sum = 0, sq = 0, quart = 0;
  int within_1sd = 0;
  for (int64_t i = 0; i < g.numel(); ++i) {
    double v = g.data<double>()[i];
    ASSERT_TRUE(std::isfinite(v));
    sum += v;
    sq += v * v;
    double z = (v - 1.0) / 2.0;
    quart += z * z * z * z;
    within_1sd += std::fabs(z) < 1.0;
  }
  double n = g.numel(), mean = sum / n, var = sq / n - mean * mean;
  EXPECT_NEAR(mean, 1.0, 0.03);
  EXPECT_NEAR(var, 4.0, 0.08);
  EXPECT_NEAR(quart / n, 3.0, 0.1);           // kurtosis of a normal
  EXPECT_NEAR(within_1sd / n, 0.6827, 0.01);  // 68% within one standard deviation
}

TEST(CounterRngTest, UniformInUnitIntervalAndSeedsIndependent) {
  double sum = 0, cross = 0;
  const int n = 100000;
  for (int i = 0; i < n; ++i) {
    double a = CounterUniform(1, i), b = CounterUniform(2, i);
    ASSERT_GE(a, 0.0);
    ASSERT_LT(a, 1.0);
    sum += a;
    cross += (a - 0.5) * (b - 0.5);
  }
  EXPECT_NEAR(sum / n, 0.5, 0.005);
  EXPECT_NEAR(cross / n, 0.0, 0.002);  // seeds 1 and 2 uncorrelated
  EXPECT_EQ(CounterBits(9, 123), CounterBits(9, 123));
  EXPECT_NE(CounterBits(9, 123), CounterBits(9, 124));
}

// dropout on a [100, 50] input of ones and twos.
class DropoutTest : public ::testing::Test {
 protected:
  void SetUp() override {
    Tensor* x = scope_.Var("x")->GetMutable<Tensor>();
    x->Resize(FLOAT32, {100, 50});
    for (int64_t i = 0; i < x->numel(); ++i) x->data<float>()[i] = 1.0f + static_cast<float>(i % 2);
  }
  OpDesc Op(float p, const std::string& impl, bool is_test) {
    OpDesc op = MakeOp("dropout", {{"X", {"x"}}}, {{"Out", {"out"}}, {"Mask", {"mask"}}});
    SetAttr(&op, "dropout_prob", p);
    SetAttr(&op, "dropout_implementation", impl);
    SetAttr(&op, "is_test", is_test);
    SetAttr(&op, "seed", int64_t{17});
    return op;
  }
  Tensor Get(const std::string& name) { return scope_.FindVar(name)->Get<Tensor>().Clone(); }

  std::unique_ptr<OpRegistry> registry_ = NewStandardOpRegistry();
  Executor exec_{registry_.get()};
  Scope scope_;
};

TEST_F(DropoutTest, TrainingDropsAboutPAndScalesAsItsImplementationSays) {
  for (const char* impl : {"downgrade_in_infer", "upscale_in_train"}) {
    ASSERT_TRUE(exec_.RunOp(Op(0.3f, impl, false), &scope_).ok());
    Tensor out = Get("out"), mask = Get("mask");
    const float scale = std::string(impl) == "upscale_in_train" ? 1.0f / 0.7f : 1.0f;
    int64_t dropped = 0;
    for (int64_t i = 0; i < out.numel(); ++i) {
      const float m = mask.data<float>()[i];
      ASSERT_TRUE(m == 0.0f || m == 1.0f);
      dropped += m == 0.0f;
      const float x = 1.0f + static_cast<float>(i % 2);
      EXPECT_FLOAT_EQ(out.data<float>()[i], m * x * scale) << i;
    }
    // 5000 draws of p = 0.3: mean 1500, standard deviation 32.4.
    EXPECT_NEAR(static_cast<double>(dropped), 1500.0, 130.0) << impl;
  }
}

TEST_F(DropoutTest, EveryRunDrawsANewMaskReproducibly) {
  ASSERT_TRUE(exec_.RunOp(Op(0.5f, "downgrade_in_infer", false), &scope_).ok());
  Tensor first = Get("mask");
  ASSERT_TRUE(exec_.RunOp(Op(0.5f, "downgrade_in_infer", false), &scope_).ok());
  Tensor second = Get("mask");
  EXPECT_FALSE(SameBits(first, second));
  // A fresh scope with the same input replays the same sequence.
  Scope other;
  *other.Var("x")->GetMutable<Tensor>() = scope_.FindVar("x")->Get<Tensor>().Clone();
  ASSERT_TRUE(exec_.RunOp(Op(0.5f, "downgrade_in_infer", false), &other).ok());
  EXPECT_TRUE(SameBits(first, other.FindVar("mask")->Get<Tensor>()));
  // Another input (another place's part of the batch) draws another mask.
  Scope third;
  Tensor* x = third.Var("x")->GetMutable<Tensor>();
  x->Resize(FLOAT32, {100, 50});
  for (int64_t i = 0; i < x->numel(); ++i) x->data<float>()[i] = 3.0f;
  ASSERT_TRUE(exec_.RunOp(Op(0.5f, "downgrade_in_infer", false), &third).ok());
  EXPECT_FALSE(SameBits(first, third.FindVar("mask")->Get<Tensor>()));
}

TEST_F(DropoutTest, InferenceScalesAndGradientFollowsTheMask) {
  ASSERT_TRUE(exec_.RunOp(Op(0.25f, "downgrade_in_infer", true), &scope_).ok());
  EXPECT_FLOAT_EQ(Get("out").data<float>()[1], 2.0f * 0.75f);
  ASSERT_TRUE(exec_.RunOp(Op(0.25f, "upscale_in_train", true), &scope_).ok());
  EXPECT_FLOAT_EQ(Get("out").data<float>()[1], 2.0f);

  OpDesc fwd = Op(0.25f, "upscale_in_train", false);
  ASSERT_TRUE(exec_.RunOp(fwd, &scope_).ok());
  Tensor* dout = scope_.Var("out@GRAD")->GetMutable<Tensor>();
  dout->Resize(FLOAT32, {100, 50});
  for (int64_t i = 0; i < dout->numel(); ++i) dout->data<float>()[i] = 0.5f;
  std::vector<OpDesc> grads = registry_->Find("dropout")->grad_maker(fwd);
  ASSERT_EQ(grads.size(), 1u);
  ASSERT_TRUE(exec_.RunOp(grads[0], &scope_).ok());
  Tensor dx = Get("x@GRAD"), mask = Get("mask");
  for (int64_t i = 0; i < dx.numel(); ++i) {
    EXPECT_FLOAT_EQ(dx.data<float>()[i], 0.5f * mask.data<float>()[i] / 0.75f) << i;
  }
}

TEST_F(DropoutTest, BadAttributesAreNamed) {
  absl::Status s = exec_.RunOp(Op(1.0f, "downgrade_in_infer", false), &scope_);
  EXPECT_NE(s.message().find("dropout_prob 1 must be in [0, 1)"), std::string::npos) << s;
  s = exec_.RunOp(Op(0.5f, "scale_sometimes", false), &scope_);
  EXPECT_NE(s.message().find("'scale_sometimes'"), std::string::npos) << s;
}

}  // namespace
}  // namespace tessera
