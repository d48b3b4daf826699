#include "common/ops/optimizer_ops.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "common/framework/executor.h"
#include "common/ops/grad_check.h"
#include "common/ops/ops.h"
#include "common/ops/selected_rows_util.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

constexpr int64_t kRows = 5;
constexpr int64_t kWidth = 3;
constexpr double kLr = 0.1;
constexpr float kBeta1 = 0.8f, kBeta2 = 0.95f, kMu = 0.9f;

// State variables of each optimizer: {input slot, output slot, variable}.
struct StateSlot {
  std::string in, out, var;
};
std::vector<StateSlot> States(const std::string& type) {
  if (type == "momentum") return {{"Velocity", "VelocityOut", "v"}};
  if (type == "adagrad") return {{"Moment", "MomentOut", "m"}};
  if (type == "adam") {
    return {{"Moment1", "Moment1Out", "m1"},
            {"Moment2", "Moment2Out", "m2"},
            {"Beta1Pow", "Beta1PowOut", "b1p"},
            {"Beta2Pow", "Beta2PowOut", "b2p"}};
  }
  return {};
}

// The optimizer op, updating param `p` and its state in place from gradient `g`.
OpDesc Optimizer(const std::string& type, double coeff, bool nesterov = false) {
  Slots ins = {{"Param", {"p"}}, {"Grad", {"g"}}, {"LearningRate", {"lr"}}};
  Slots outs = {{"ParamOut", {"p"}}};
  for (const auto& s : States(type)) {
    ins.push_back({s.in, {s.var}});
    outs.push_back({s.out, {s.var}});
  }
  OpDesc op = MakeOp(type, ins, outs);
  SetAttr(&op, "regularization_coeff", static_cast<float>(coeff));
  if (type == "momentum") {
    SetAttr(&op, "mu", kMu);
    SetAttr(&op, "use_nesterov", nesterov);
  }
  if (type == "adam") {
    SetAttr(&op, "beta1", kBeta1);
    SetAttr(&op, "beta2", kBeta2);
  }
  return op;
}

using Vec = std::vector<double>;

// Reference update of element arrays (float64, plain loops), as documented for each op.
void ReferenceStep(const std::string& type, double coeff, bool nesterov, Vec& p, const Vec& grad,
                   std::map<std::string, Vec>& st) {
  const double b1 = kBeta1, b2 = kBeta2, mu = kMu;
  const double lr_t = type == "adam" ? kLr * std::sqrt(1 - st["b2p"][0]) / (1 - st["b1p"][0]) : 0;
  for (size_t i = 0; i < p.size(); ++i) {
    double g = grad[i] + coeff * p[i];
    if (type == "sgd") {
      p[i] -= kLr * g;
    } else if (type == "momentum") {
      double& v = st["v"][i];
      v = mu * v + g;
      p[i] -= nesterov ? kLr * (g + mu * v) : kLr * v;
    } else if (type == "adagrad") {
      double& m = st["m"][i];
      m += g * g;
      p[i] -= kLr * g / (std::sqrt(m) + static_cast<double>(1e-6f));
    } else if (type == "adam") {
      double& m1 = st["m1"][i];
      double& m2 = st["m2"][i];
      m1 = b1 * m1 + (1 - b1) * g;
      m2 = b2 * m2 + (1 - b2) * g * g;
      p[i] -= lr_t * m1 / (std::sqrt(m2) + static_cast<double>(1e-8f));
    }
  }
  if (type == "adam") {
    st["b1p"][0] *= b1;
    st["b2p"][0] *= b2;
  }
}

Tensor FromVec(const Vec& v, const Shape& shape) {
  Tensor t(FLOAT64, shape);
  for (size_t i = 0; i < v.size(); ++i) t.data<double>()[i] = v[i];
  return t;
}

Vec ToVec(const Tensor& t) { return Vec(t.data<double>(), t.data<double>() + t.numel()); }

class OptimizerOpsTest : public ::testing::TestWithParam<std::string> {
 protected:
  void Feed(Scope* scope, const std::string& name, const Tensor& t) {
    scope->Var(name)->GetMutable<Tensor>()->CopyFrom(t);
  }
  Vec Get(Scope* scope, const std::string& name) {
    return ToVec(scope->FindVar(name)->Get<Tensor>());
  }
  // Initial parameter, learning rate and optimizer state in `scope`; returns the state values.
  std::map<std::string, Vec> Init(Scope* scope, const std::string& type) {
    Feed(scope, "p", RandomTensor({kRows, kWidth}, -1, 1, 10));
    Feed(scope, "lr", FromVec({kLr}, {1}));
    std::map<std::string, Vec> st;
    uint64_t seed = 20;
    for (const auto& s : States(type)) {
      Tensor t;
      if (s.var == "b1p") {
        t = FromVec({kBeta1}, {1});
      } else if (s.var == "b2p") {
        t = FromVec({kBeta2}, {1});
      } else {
        t = RandomTensor({kRows, kWidth}, s.var == "v" || s.var == "m1" ? -1 : 0, 1, seed++);
      }
      Feed(scope, s.var, t);
      st[s.var] = ToVec(t);
    }
    return st;
  }
  void ExpectNear(const Vec& a, const Vec& b, const std::string& what) {
    ASSERT_EQ(a.size(), b.size()) << what;
    for (size_t i = 0; i < a.size(); ++i) {
      EXPECT_NEAR(a[i], b[i], 1e-12 * (1 + std::fabs(b[i]))) << what << "[" << i << "]";
    }
  }

  std::unique_ptr<OpRegistry> registry_ = NewStandardOpRegistry();
  Executor exec_{registry_.get()};
};

TEST_P(OptimizerOpsTest, TwoDenseStepsMatchReference) {
  const std::string type = GetParam();
  for (double coeff : {0.0, 0.05}) {
    for (bool nesterov : {false, true}) {
      if (nesterov && type != "momentum") continue;
      Scope scope;
      std::map<std::string, Vec> st = Init(&scope, type);
      Vec p = Get(&scope, "p");
      OpDesc op = Optimizer(type, coeff, nesterov);
      for (int step = 0; step < 2; ++step) {
        Tensor g = RandomTensor({kRows, kWidth}, -1, 1, 100 + step);
        Feed(&scope, "g", g);
        ASSERT_TRUE(exec_.RunOp(op, &scope).ok()) << OpSignature(op);
        ReferenceStep(type, static_cast<float>(coeff), nesterov, p, ToVec(g), st);
      }
      std::string what =
          type + " coeff=" + std::to_string(coeff) + " nesterov=" + std::to_string(nesterov);
      ExpectNear(Get(&scope, "p"), p, what + " p");
      for (const auto& [name, v] : st) ExpectNear(Get(&scope, name), v, what + " " + name);
    }
  }
}

TEST_P(OptimizerOpsTest, SparseGradientUpdatesOnlyTouchedRowsLikeDense) {
  const std::string type = GetParam();
  const double coeff = 0.05;
  const std::vector<int64_t> rows = {3, 0, 3, 1, 3};  // duplicates merged by summing
  Tensor values = RandomTensor({5, kWidth}, -1, 1, 7);
  Vec dense_grad(kRows * kWidth, 0.0);
  for (size_t i = 0; i < rows.size(); ++i) {
    for (int64_t j = 0; j < kWidth; ++j) {
      dense_grad[rows[i] * kWidth + j] += values.data<double>()[i * kWidth + j];
    }
  }
  Scope sparse, dense;
  std::map<std::string, Vec> st0 = Init(&sparse, type);
  Init(&dense, type);
  Vec p0 = Get(&sparse, "p");
  SelectedRows* sr = sparse.Var("g")->GetMutable<SelectedRows>();
  sr->rows = rows;
  sr->height = kRows;
  sr->value = values;
  Feed(&dense, "g", FromVec(dense_grad, {kRows, kWidth}));
  OpDesc op = Optimizer(type, coeff);
  for (int step = 0; step < 2; ++step) {
    ASSERT_TRUE(exec_.RunOp(op, &sparse).ok());
    ASSERT_TRUE(exec_.RunOp(op, &dense).ok());
  }
  std::vector<std::string> vars = {"p"};
  for (const auto& s : States(type)) vars.push_back(s.var);
  for (const auto& name : vars) {
    Vec sv = Get(&sparse, name), dv = Get(&dense, name);
    Vec init = name == "p" ? p0 : st0[name];
    if (name == "b1p" || name == "b2p") {  // advance once per call, sparse or not
      ExpectNear(sv, dv, name);
      continue;
    }
    for (int64_t r = 0; r < kRows; ++r) {
      const bool touched = r == 0 || r == 1 || r == 3;
      for (int64_t j = 0; j < kWidth; ++j) {
        int64_t i = r * kWidth + j;
        if (touched) {
          EXPECT_NEAR(sv[i], dv[i], 1e-12) << type << " " << name << " row " << r;
          EXPECT_NE(sv[i], init[i]) << type << " " << name << " row " << r;
        } else {
          EXPECT_EQ(sv[i], init[i]) << type << " " << name << " untouched row " << r;
        }
      }
    }
  }
}

TEST_P(OptimizerOpsTest, EmptySparseGradientOnlyAdvancesBetaPows) {
  const std::string type = GetParam();
  Scope scope;
  std::map<std::string, Vec> st = Init(&scope, type);
  Vec p0 = Get(&scope, "p");
  scope.Var("g")->GetMutable<SelectedRows>()->height = kRows;  // no rows, no value
  ASSERT_TRUE(exec_.RunOp(Optimizer(type, 0.05), &scope).ok());
  EXPECT_EQ(Get(&scope, "p"), p0);
  for (const auto& [name, v] : st) {
    if (name == "b1p") {
      EXPECT_DOUBLE_EQ(Get(&scope, name)[0], v[0] * kBeta1);
    } else if (name != "b2p") {
      EXPECT_EQ(Get(&scope, name), v) << name;
    }
  }
}

TEST_P(OptimizerOpsTest, WritesToSeparateOutputsLeavingInputs) {
  const std::string type = GetParam();
  Scope scope;
  Init(&scope, type);
  Vec p0 = Get(&scope, "p");
  Feed(&scope, "g", RandomTensor({kRows, kWidth}, -1, 1, 3));
  OpDesc in_place = Optimizer(type, 0);
  OpDesc separate = in_place;
  SetOpOutputs(&separate, "ParamOut", {"p_new"});
  Scope copy;
  Init(&copy, type);
  Feed(&copy, "g", RandomTensor({kRows, kWidth}, -1, 1, 3));
  ASSERT_TRUE(exec_.RunOp(separate, &scope).ok());
  ASSERT_TRUE(exec_.RunOp(in_place, &copy).ok());
  EXPECT_EQ(Get(&scope, "p"), p0);
  ExpectNear(Get(&scope, "p_new"), Get(&copy, "p"), "p_new");
}

TEST_P(OptimizerOpsTest, RejectsBadGradients) {
  const std::string type = GetParam();
  Scope scope;
  Init(&scope, type);
  OpDesc op = Optimizer(type, 0);
  SelectedRows* sr = scope.Var("g")->GetMutable<SelectedRows>();
  sr->rows = {1, kRows};
  sr->value = RandomTensor({2, kWidth}, -1, 1, 3);
  Vec p0 = Get(&scope, "p");
  absl::Status s = exec_.RunOp(op, &scope);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("row 5"), std::string::npos) << s;
  EXPECT_NE(s.message().find("'p'"), std::string::npos) << s;
  EXPECT_EQ(Get(&scope, "p"), p0);  // nothing applied

  sr->rows = {1};
  sr->value = RandomTensor({1, kWidth + 1}, -1, 1, 3);
  EXPECT_FALSE(exec_.RunOp(op, &scope).ok());

  Feed(&scope, "g", RandomTensor({kRows, kWidth + 1}, -1, 1, 3));
  s = exec_.RunOp(op, &scope);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("'g'"), std::string::npos) << s;

  Feed(&scope, "g", RandomTensor({kRows, kWidth}, -1, 1, 3));
  Feed(&scope, "lr", FromVec({0.1, 0.2}, {2}));
  s = exec_.RunOp(op, &scope);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("LearningRate 'lr'"), std::string::npos) << s;
}

INSTANTIATE_TEST_SUITE_P(All, OptimizerOpsTest,
                         ::testing::Values("sgd", "momentum", "adam", "adagrad"));

TEST(OptimizerFloat32Test, SgdAndAdamUpdateFloat32Parameters) {
  auto registry = NewStandardOpRegistry();
  Executor exec(registry.get());
  Scope scope;
  auto scalar = [](float v) {
    Tensor t(FLOAT32, {1});
    t.data<float>()[0] = v;
    return t;
  };
  Tensor p(FLOAT32, {2}), g(FLOAT32, {2});
  p.data<float>()[0] = 1.0f;
  p.data<float>()[1] = -2.0f;
  g.data<float>()[0] = 0.5f;
  g.data<float>()[1] = 4.0f;
  scope.Var("p")->GetMutable<Tensor>()->CopyFrom(p);
  scope.Var("g")->GetMutable<Tensor>()->CopyFrom(g);
  scope.Var("lr")->GetMutable<Tensor>()->CopyFrom(scalar(0.5f));
  OpDesc sgd = MakeOp("sgd", {{"Param", {"p"}}, {"Grad", {"g"}}, {"LearningRate", {"lr"}}},
                      {{"ParamOut", {"p"}}});
  ASSERT_TRUE(exec.RunOp(sgd, &scope).ok());
  const Tensor& out = scope.FindVar("p")->Get<Tensor>();
  EXPECT_EQ(out.dtype(), FLOAT32);
  EXPECT_FLOAT_EQ(out.data<float>()[0], 0.75f);
  EXPECT_FLOAT_EQ(out.data<float>()[1], -4.0f);

  // Adam's first step moves each element by about lr against the gradient's sign.
  Tensor zeros(FLOAT32, {2});
  zeros.SetZero();
  scope.Var("m1")->GetMutable<Tensor>()->CopyFrom(zeros);
  scope.Var("m2")->GetMutable<Tensor>()->CopyFrom(zeros);
  scope.Var("b1p")->GetMutable<Tensor>()->CopyFrom(scalar(0.9f));
  scope.Var("b2p")->GetMutable<Tensor>()->CopyFrom(scalar(0.999f));
  OpDesc adam = MakeOp("adam",
                       {{"Param", {"p"}},
                        {"Grad", {"g"}},
                        {"LearningRate", {"lr"}},
                        {"Moment1", {"m1"}},
                        {"Moment2", {"m2"}},
                        {"Beta1Pow", {"b1p"}},
                        {"Beta2Pow", {"b2p"}}},
                       {{"ParamOut", {"p"}},
                        {"Moment1Out", {"m1"}},
                        {"Moment2Out", {"m2"}},
                        {"Beta1PowOut", {"b1p"}},
                        {"Beta2PowOut", {"b2p"}}});
  ASSERT_TRUE(exec.RunOp(adam, &scope).ok());
  EXPECT_NEAR(out.data<float>()[0], 0.75f - 0.5f, 1e-5);
  EXPECT_NEAR(out.data<float>()[1], -4.0f - 0.5f, 1e-5);
  EXPECT_FLOAT_EQ(scope.FindVar("b1p")->Get<Tensor>().data<float>()[0], 0.81f);
  EXPECT_NEAR(scope.FindVar("b2p")->Get<Tensor>().data<float>()[0], 0.999 * 0.999, 1e-6);
}

// A dense gradient [3, 0] and a sparse one whose rows 1, 1 (summed: [0, 4]) and 0 ([0, 0]): a
// global norm of 5 (the repeated row summed before squaring, not 3^2 + 2^2 + 2^2).
class ClipByGlobalNormTest : public ::testing::Test {
 protected:
  void SetUp() override {
    Tensor d(FLOAT32, {2});
    d.data<float>()[0] = 3.0f;
    d.data<float>()[1] = 0.0f;
    scope_.Var("d")->GetMutable<Tensor>()->CopyFrom(d);
    SelectedRows* sr = scope_.Var("s")->GetMutable<SelectedRows>();
    sr->rows = {1, 1, 0};
    sr->height = 4;
    sr->value = Tensor(FLOAT32, {3, 2});
    const float v[] = {0, 2, 0, 2, 0, 0};
    std::copy(v, v + 6, sr->value.data<float>());
  }
  absl::Status Clip(float max_norm) {
    OpDesc op = MakeOp("clip_by_global_norm", {{"X", {"d", "s"}}}, {{"Out", {"d", "s"}}});
    SetAttr(&op, "max_norm", max_norm);
    return exec_.RunOp(op, &scope_);
  }
  float D(int i) { return scope_.FindVar("d")->Get<Tensor>().data<float>()[i]; }
  float S(int i) { return scope_.FindVar("s")->Get<SelectedRows>().value.data<float>()[i]; }

  std::unique_ptr<OpRegistry> registry_ = NewStandardOpRegistry();
  Executor exec_{registry_.get()};
  Scope scope_;
};

TEST_F(ClipByGlobalNormTest, ScalesEveryGradientByTheBoundOverTheGlobalNorm) {
  ASSERT_TRUE(Clip(1.0f).ok());
  EXPECT_FLOAT_EQ(D(0), 3.0f / 5);
  EXPECT_FLOAT_EQ(S(1), 2.0f / 5);
  EXPECT_FLOAT_EQ(S(3), 2.0f / 5);
  EXPECT_EQ(scope_.FindVar("s")->Get<SelectedRows>().rows, (std::vector<int64_t>{1, 1, 0}));
}

TEST_F(ClipByGlobalNormTest, LeavesGradientsWithinTheBound) {
  ASSERT_TRUE(Clip(5.0f).ok());
  EXPECT_FLOAT_EQ(D(0), 3.0f);
  EXPECT_FLOAT_EQ(S(1), 2.0f);
}

TEST_F(ClipByGlobalNormTest, RefusesABadBoundOrAnOutputThatIsNotItsInput) {
  absl::Status s = Clip(0.0f);
  EXPECT_NE(s.message().find("max_norm 0 must be positive"), std::string::npos) << s;
  OpDesc op = MakeOp("clip_by_global_norm", {{"X", {"d"}}}, {{"Out", {"e"}}});
  SetAttr(&op, "max_norm", 1.0f);
  s = exec_.RunOp(op, &scope_);
  EXPECT_NE(s.message().find("(clipping is in place)"), std::string::npos) << s;
  EXPECT_FLOAT_EQ(D(0), 3.0f);
}

TEST(MergeRowsTest, SortsUniqueRowsAndSumsValues) {
  SelectedRows in;
  in.rows = {7, 2, 7, -3, 2, 7};
  in.height = 0;
  in.value = Tensor(FLOAT32, {6, 2});
  for (int i = 0; i < 12; ++i) in.value.data<float>()[i] = static_cast<float>(i);
  ASSERT_TRUE(ValidateSelectedRows(in).ok());
  SelectedRows out = MergeRows(in);
  EXPECT_EQ(out.rows, (std::vector<int64_t>{-3, 2, 7}));
  EXPECT_EQ(out.height, 0);
  ASSERT_EQ(out.value.shape(), (Shape{3, 2}));
  const float* v = out.value.data<float>();
  EXPECT_EQ(v[0], 6);  // row -3: entry 3
  EXPECT_EQ(v[1], 7);
  EXPECT_EQ(v[2], 2 + 8);  // row 2: entries 1 and 4
  EXPECT_EQ(v[3], 3 + 9);
  EXPECT_EQ(v[4], 0 + 4 + 10);  // row 7: entries 0, 2 and 5
  EXPECT_EQ(v[5], 1 + 5 + 11);
  EXPECT_EQ(in.value.data<float>()[4], 4);  // input untouched

  SelectedRows empty;
  empty.height = 4;
  empty.value = Tensor(FLOAT64, {0, 3});
  SelectedRows merged = MergeRows(empty);
  EXPECT_TRUE(merged.rows.empty());
  EXPECT_EQ(merged.value.shape(), (Shape{0, 3}));
  EXPECT_EQ(merged.height, 4);

  SelectedRows none;  // no rows and no value at all
  ASSERT_TRUE(ValidateSelectedRows(none).ok());
  EXPECT_TRUE(MergeRows(none).rows.empty());

  SelectedRows bad;
  bad.rows = {1, 2};
  bad.value = Tensor(FLOAT64, {3, 1});
  EXPECT_FALSE(ValidateSelectedRows(bad).ok());
  bad.value = Tensor(INT64, {2, 1});
  EXPECT_FALSE(ValidateSelectedRows(bad).ok());
}

}  // namespace
}  // namespace tessera
