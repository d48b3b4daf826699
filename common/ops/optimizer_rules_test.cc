#include "common/ops/optimizer_rules.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "Eigen/Core"
#include "absl/strings/str_cat.h"
#include "common/framework/executor.h"
#include "common/framework/op_desc.h"
#include "common/framework/scope.h"
#include "common/framework/tensor.h"
#include "common/ops/ops.h"
#include "common/ops/optimizer_rows.h"
#include "common/ops/selected_rows_util.h"
#include "gtest/gtest.h"

// Pins the two forms of the rules to each other and the dense ops (common/ops/optimizer_ops.cc)
// to the rules, on random vectors. Built like the ops (-DEIGEN_FAST_MATH=0, the repository's
// -mfma): where the compiler fuses multiply-adds the scalar form is compared within a few units
// in the last place, everything else bit for bit. SparseTable is pinned to the rules in
// pserver/sparse_table_test.cc (the pserver is not visible from common/), the CUDA kernel to the
// dense ops within a tolerance by common/device/cuda/gpu_ops_test.cc.

namespace tessera {
namespace {

namespace rules = optimizer_rules;

// One optimizer configuration: the op type and its attributes as the ops read them.
struct Case {
  std::string type;
  bool nesterov = false;
};
const Case kCases[] = {{"sgd"}, {"momentum"}, {"momentum", true}, {"adagrad"}, {"adam"}};

constexpr float kLr = 0.05f, kCoeff = 0.01f, kMu = 0.9f, kBeta1 = 0.9f, kBeta2 = 0.999f;
// Large enough to change the rounding of sqrt(m) + eps.
constexpr float kEps = 1e-3f;

std::string Name(const Case& c) { return c.type + (c.nesterov ? " nesterov" : ""); }

// Hyper-parameters in the element type, converted as the kernels convert their attributes.
template <typename T>
struct Hyper {
  T lr = static_cast<T>(static_cast<double>(kLr));  // lr_t for adam
  T coeff = static_cast<T>(static_cast<double>(kCoeff));
  T mu = static_cast<T>(static_cast<double>(kMu));
  T beta1 = static_cast<T>(static_cast<double>(kBeta1));
  T beta2 = static_cast<T>(static_cast<double>(kBeta2));
  T eps = static_cast<T>(static_cast<double>(kEps));
};

// Applies the rule of `c` to p, its state s1 (velocity / moment / moment1) and s2 (moment2)
// from g: scalars or Eigen arrays alike.
template <typename P, typename G, typename T>
void Apply(const Case& c, const Hyper<T>& h, P& p, P& s1, P& s2, const G& g) {
  if (c.type == "sgd") {
    rules::SgdUpdate(p, g, h.lr, h.coeff);
  } else if (c.type == "momentum") {
    rules::MomentumUpdate(p, s1, g, h.lr, h.mu, h.coeff, c.nesterov);
  } else if (c.type == "adagrad") {
    rules::AdagradUpdate(p, s1, g, h.lr, h.eps, h.coeff);
  } else {
    rules::AdamUpdate(p, s1, s2, g, h.lr, h.beta1, h.beta2, h.eps, h.coeff);
  }
}

template <typename T>
using Span = Eigen::Map<Eigen::Array<T, Eigen::Dynamic, 1>>;
template <typename T>
using ConstSpan = Eigen::Map<const Eigen::Array<T, Eigen::Dynamic, 1>>;

// The array form on elements [0, n) as one span: the ops' and SparseTable's instantiation.
template <typename T>
void ApplySpan(const Case& c, const Hyper<T>& h, T* p, T* s1, T* s2, const T* g, int64_t n) {
  Span<T> P(p, n), S1(s1, n), S2(s2, n);
  ConstSpan<T> G(g, n);
  Apply(c, h, P, S1, S2, G);
}

// The row form (optimizer_rows.h) on elements [0, n): the ops' and SparseTable's instantiation.
template <typename T>
void ApplyRow(const Case& c, const Hyper<T>& h, T* p, T* s1, T* s2, const T* g, int64_t n) {
  if (c.type == "sgd") {
    optimizer_rows::SgdRow(p, g, n, h.lr, h.coeff);
  } else if (c.type == "momentum") {
    optimizer_rows::MomentumRow(p, s1, g, n, h.lr, h.mu, h.coeff, c.nesterov);
  } else if (c.type == "adagrad") {
    optimizer_rows::AdagradRow(p, s1, g, n, h.lr, h.eps, h.coeff);
  } else {
    optimizer_rows::AdamRow(p, s1, s2, g, n, h.lr, h.beta1, h.beta2, h.eps, h.coeff);
  }
}

// The scalar form (the CUDA kernel's) on each of n elements.
template <typename T>
void ApplyScalar(const Case& c, const Hyper<T>& h, T* p, T* s1, T* s2, const T* g, int64_t n) {
  for (int64_t i = 0; i < n; ++i) Apply(c, h, p[i], s1[i], s2[i], g[i]);
}

template <typename T>
std::vector<T> Random(size_t n, std::mt19937_64* rng, double lo, double hi) {
  std::uniform_real_distribution<double> u(lo, hi);
  std::vector<T> v(n);
  for (T& x : v) x = static_cast<T>(u(*rng));
  return v;
}

// Element-by-element bit equality; the message names the first difference.
template <typename T>
void ExpectSameBits(const T* got, const T* want, int64_t n, const std::string& what) {
  for (int64_t i = 0; i < n; ++i) {
    if (std::memcmp(&got[i], &want[i], sizeof(T)) != 0) {
      ADD_FAILURE() << what << "[" << i << "]: " << got[i] << " != " << want[i] << " (diff "
                    << got[i] - want[i] << ")";
      return;
    }
  }
}

// p, s1, s2 equal wp, ws1, ws2 bit for bit over their first `size` elements.
template <typename T>
void ExpectSameState(const std::vector<T>& p, const std::vector<T>& s1, const std::vector<T>& s2,
                     const std::vector<T>& wp, const std::vector<T>& ws1, const std::vector<T>& ws2,
                     int64_t size, const std::string& what) {
  ExpectSameBits(p.data(), wp.data(), size, what + " p");
  ExpectSameBits(s1.data(), ws1.data(), size, what + " state1");
  ExpectSameBits(s2.data(), ws2.data(), size, what + " state2");
}

// Whether this build may fuse multiply-adds (FMA instructions available: GCC then fuses by
// default).
#if defined(__FP_FAST_FMA) || defined(__FP_FAST_FMAF)
constexpr bool kMayFuse = true;
#else
constexpr bool kMayFuse = false;
#endif

template <typename T>
class OptimizerRulesTest : public ::testing::Test {};
using ElementTypes = ::testing::Types<float, double>;
TYPED_TEST_SUITE(OptimizerRulesTest, ElementTypes);

// One random case per rule, span start offset (alignment) and length.
template <typename T, typename Fn>
void ForEachRandomSpan(Fn&& fn) {
  std::mt19937_64 rng(7);
  for (const Case& c : kCases) {
    Hyper<T> h;
    if (c.type == "adam") h.lr = static_cast<T>(rules::AdamBiasCorrectedLr(kLr, 0.81, 0.998001));
    for (int64_t n : {1, 3, 4, 5, 8, 9, 17, 64, 101}) {
      for (int64_t off = 0; off < 8; ++off) {
        const size_t size = static_cast<size_t>(off + n);
        const std::vector<T> p = Random<T>(size, &rng, -1, 1);
        const std::vector<T> s1 = Random<T>(size, &rng, c.type == "adagrad" ? 0 : -1, 1);
        const std::vector<T> s2 = Random<T>(size, &rng, 0, 1);
        const std::vector<T> g = Random<T>(size, &rng, -1, 1);
        fn(c, h, off, n, p, s1, s2, g, absl::StrCat(Name(c), " n=", n, " offset=", off));
      }
    }
  }
}

// Eigen runs a span's unaligned head through scalar code and the rest in packets: at any start
// offset and length the array form gives the bits it gives element by element (n = 1 spans), so
// an update never depends on where a row lies in memory.
TYPED_TEST(OptimizerRulesTest, ArrayFormIsIndependentOfAlignment) {
  using T = TypeParam;
  ForEachRandomSpan<T>([](const Case& c, const Hyper<T>& h, int64_t off, int64_t n,
                          std::vector<T> p, std::vector<T> s1, std::vector<T> s2,
                          const std::vector<T>& g, const std::string& what) {
    std::vector<T> wp = p, ws1 = s1, ws2 = s2;
    ApplySpan(c, h, p.data() + off, s1.data() + off, s2.data() + off, g.data() + off, n);
    for (int64_t i = off; i < off + n; ++i) {
      ApplySpan(c, h, wp.data() + i, ws1.data() + i, ws2.data() + i, g.data() + i, 1);
    }
    ExpectSameState(p, s1, s2, wp, ws1, ws2, off + n, what);
  });
}

// The row form (optimizer_rows.h: the ops' and SparseTable's instantiation, fixed-size groups)
// gives the array form's bits, at any start offset and length.
TYPED_TEST(OptimizerRulesTest, RowFormGivesTheArrayFormsBits) {
  using T = TypeParam;
  ForEachRandomSpan<T>([](const Case& c, const Hyper<T>& h, int64_t off, int64_t n,
                          std::vector<T> p, std::vector<T> s1, std::vector<T> s2,
                          const std::vector<T>& g, const std::string& what) {
    std::vector<T> wp = p, ws1 = s1, ws2 = s2;
    ApplyRow(c, h, p.data() + off, s1.data() + off, s2.data() + off, g.data() + off, n);
    ApplySpan(c, h, wp.data() + off, ws1.data() + off, ws2.data() + off, g.data() + off, n);
    ExpectSameState(p, s1, s2, wp, ws1, ws2, off + n, what);
  });
}

// The scalar form (CUDA's) is the array form's formula: the same bits where multiply-adds are
// not fused, else within a few units in the last place of the O(1) values involved.
TYPED_TEST(OptimizerRulesTest, ScalarFormMatchesArrayForm) {
  using T = TypeParam;
  const T tol = kMayFuse ? 16 * std::numeric_limits<T>::epsilon() : T(0);
  ForEachRandomSpan<T>([tol](const Case& c, const Hyper<T>& h, int64_t off, int64_t n,
                             std::vector<T> p, std::vector<T> s1, std::vector<T> s2,
                             const std::vector<T>& g, const std::string& what) {
    std::vector<T> wp = p, ws1 = s1, ws2 = s2;
    ApplySpan(c, h, p.data() + off, s1.data() + off, s2.data() + off, g.data() + off, n);
    ApplyScalar(c, h, wp.data() + off, ws1.data() + off, ws2.data() + off, g.data() + off, n);
    for (int64_t i = 0; i < off + n; ++i) {
      ASSERT_LE(std::abs(p[i] - wp[i]), tol * (1 + std::abs(wp[i]))) << what << " p[" << i << "]";
      ASSERT_LE(std::abs(s1[i] - ws1[i]), tol * (1 + std::abs(ws1[i])))
          << what << " state1[" << i << "]";
      ASSERT_LE(std::abs(s2[i] - ws2[i]), tol * (1 + std::abs(ws2[i])))
          << what << " state2[" << i << "]";
    }
  });
}

// A tensor of T holding v.
template <typename T>
Tensor MakeTensor(const Shape& shape, const std::vector<T>& v) {
  Tensor t(DataTypeOf<T>::value, shape);
  std::memcpy(t.data<T>(), v.data(), sizeof(T) * v.size());
  return t;
}

template <typename T>
std::vector<T> Values(const Scope& scope, const std::string& name) {
  const Tensor& t = scope.FindVar(name)->Get<Tensor>();
  return std::vector<T>(t.data<T>(), t.data<T>() + t.numel());
}

// Three runs of each dense op (dense and sparse gradients with repeated rows) on random values:
// Param and every state equal the rules applied to the same (merged) gradients, bit for bit.
TYPED_TEST(OptimizerRulesTest, DenseOpsApplyTheRules) {
  using T = TypeParam;
  constexpr int64_t kRows = 6, kWidth = 5, kNumel = kRows * kWidth;
  const Shape shape = {kRows, kWidth};
  auto registry = NewStandardOpRegistry();
  Executor exec(registry.get());
  std::mt19937_64 rng(11);
  for (const Case& c : kCases) {
    for (bool sparse : {false, true}) {
      const std::string what = absl::StrCat(Name(c), sparse ? " sparse" : " dense");
      Scope scope;
      Slots ins = {{"Param", {"p"}}, {"Grad", {"g"}}, {"LearningRate", {"lr"}}};
      Slots outs = {{"ParamOut", {"p"}}};
      std::vector<T> p = Random<T>(kNumel, &rng, -1, 1);
      std::vector<T> s1 = Random<T>(kNumel, &rng, c.type == "adagrad" ? 0 : -1, 1);
      std::vector<T> s2 = Random<T>(kNumel, &rng, 0, 1);
      auto feed = [&](const std::string& name, const Tensor& t) {
        scope.Var(name)->GetMutable<Tensor>()->CopyFrom(t);
      };
      feed("p", MakeTensor<T>(shape, p));
      feed("lr", MakeTensor<float>({1}, {kLr}));
      if (c.type == "momentum") {
        ins.push_back({"Velocity", {"s1"}});
        outs.push_back({"VelocityOut", {"s1"}});
      } else if (c.type == "adagrad") {
        ins.push_back({"Moment", {"s1"}});
        outs.push_back({"MomentOut", {"s1"}});
      } else if (c.type == "adam") {
        ins.insert(ins.end(), {{"Moment1", {"s1"}},
                               {"Moment2", {"s2"}},
                               {"Beta1Pow", {"b1p"}},
                               {"Beta2Pow", {"b2p"}}});
        outs.insert(outs.end(), {{"Moment1Out", {"s1"}},
                                 {"Moment2Out", {"s2"}},
                                 {"Beta1PowOut", {"b1p"}},
                                 {"Beta2PowOut", {"b2p"}}});
        feed("b1p", MakeTensor<float>({1}, {kBeta1}));
        feed("b2p", MakeTensor<float>({1}, {kBeta2}));
      }
      feed("s1", MakeTensor<T>(shape, s1));
      feed("s2", MakeTensor<T>(shape, s2));
      OpDesc op = MakeOp(c.type, ins, outs);
      SetAttr(&op, "regularization_coeff", kCoeff);
      SetAttr(&op, "mu", kMu);
      SetAttr(&op, "use_nesterov", c.nesterov);
      SetAttr(&op, "beta1", kBeta1);
      SetAttr(&op, "beta2", kBeta2);
      SetAttr(&op, "epsilon", kEps);

      for (int step = 1; step <= 3; ++step) {
        Hyper<T> h;
        if (c.type == "adam") {
          // lr_t from the op's current beta powers (their advance is optimizer_ops_test's).
          h.lr = static_cast<T>(rules::AdamBiasCorrectedLr(kLr, Values<float>(scope, "b1p")[0],
                                                           Values<float>(scope, "b2p")[0]));
        }
        Variable* gv = scope.Var("g");
        if (sparse) {
          SelectedRows* sr = gv->GetMutable<SelectedRows>();
          sr->rows = {4, 1, 4, 0, 5, 1, 4};
          sr->height = kRows;
          const int64_t n = static_cast<int64_t>(sr->rows.size());
          sr->value = MakeTensor<T>({n, kWidth}, Random<T>(n * kWidth, &rng, -1, 1));
          // The rules on the merged rows (duplicates summed in order of appearance).
          const SelectedRows merged = MergeRows(*sr);
          for (size_t r = 0; r < merged.rows.size(); ++r) {
            const int64_t o = merged.rows[r] * kWidth;
            ApplySpan(c, h, p.data() + o, s1.data() + o, s2.data() + o,
                      merged.value.data<T>() + r * kWidth, kWidth);
          }
        } else {
          const std::vector<T> g = Random<T>(kNumel, &rng, -1, 1);
          gv->GetMutable<Tensor>()->CopyFrom(MakeTensor<T>(shape, g));
          ApplySpan(c, h, p.data(), s1.data(), s2.data(), g.data(), kNumel);
        }
        ASSERT_TRUE(exec.RunOp(op, &scope).ok()) << what;
        const std::string at = absl::StrCat(what, " step ", step);
        ExpectSameBits(Values<T>(scope, "p").data(), p.data(), kNumel, at + " Param");
        if (c.type != "sgd") {
          ExpectSameBits(Values<T>(scope, "s1").data(), s1.data(), kNumel, at + " state1");
        }
        if (c.type == "adam") {
          ExpectSameBits(Values<T>(scope, "s2").data(), s2.data(), kNumel, at + " Moment2");
        }
      }
    }
  }
}

// The shared rules are the documented formulas (a float64 spot check with exact values).
TEST(OptimizerRulesScalarTest, Formulas) {
  double p = 1.0, g = 0.5, v = 2.0, m = 3.0, m1 = 0.5, m2 = 0.0;
  rules::SgdUpdate(p, g, 0.5, 1.0);  // p -= 0.5 * (0.5 + 1)
  EXPECT_EQ(p, 0.25);
  p = 1.0;
  rules::MomentumUpdate(p, v, g, 0.5, 0.5, 0.0, false);  // v = 1 + 0.5; p -= 0.75
  EXPECT_EQ(v, 1.5);
  EXPECT_EQ(p, 0.25);
  p = 1.0;
  v = 2.0;
  rules::MomentumUpdate(p, v, g, 0.5, 0.5, 0.0, true);  // v = 1.5; p -= 0.5 * (0.5 + 0.75)
  EXPECT_EQ(p, 0.375);
  p = 1.0;
  g = 1.0;
  rules::AdagradUpdate(p, m, g, 1.0, 0.0, 0.0);  // m = 4; p -= 1 / 2
  EXPECT_EQ(m, 4.0);
  EXPECT_EQ(p, 0.5);
  p = 1.0;
  rules::AdamUpdate(p, m1, m2, g, 0.25, 0.5, 0.75, 0.0, 0.0);  // m1 = 0.75, m2 = 0.25; p -= 0.375
  EXPECT_EQ(m1, 0.75);
  EXPECT_EQ(m2, 0.25);
  EXPECT_EQ(p, 0.625);
  EXPECT_EQ(rules::AdamBiasCorrectedLr(2.0, 0.5, 0.75), 2.0);  // 2 * sqrt(0.25) / 0.5
}

}  // namespace
}  // namespace tessera
