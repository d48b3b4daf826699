// Every GPU kernel against its CPU kernel on random inputs, forward and gradient. Each case
// runs its ops once through the CPU registry and once through the GPU-placed registry (which
// must run every op on the device: a silent CPU fallback fails the case), then compares every
// output on the host. Tolerance: |gpu - cpu| <= 1e-5 + 1e-4 |cpu| (float32; cuBLAS and the
// device reductions sum in other orders than Eigen), exact for copies and integer rows; the
// dropout and accuracy cases compare every output bit for bit.
#include <cmath>
#include <cstring>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "common/device/cuda/gpu_ops.h"
#include "common/device/cuda/gpu_test_main.h"
#include "common/device/placement.h"
#include "common/framework/executor.h"
#include "common/framework/op_desc.h"
#include "common/ops/ops.h"

namespace tessera {
namespace {

constexpr double kAtol = 1e-5, kRtol = 1e-4;

Tensor Random(Shape shape, std::mt19937* rng, float lo = -1.0f, float hi = 1.0f) {
  Tensor t(FLOAT32, std::move(shape));
  std::uniform_real_distribution<float> u(lo, hi);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = u(*rng);
  return t;
}

Tensor Ints(Shape shape, std::vector<int64_t> values) {
  Tensor t(INT64, std::move(shape));
  for (int64_t i = 0; i < t.numel(); ++i) t.data<int64_t>()[i] = values[i];
  return t;
}

Tensor Scalar(float v) {
  Tensor t(FLOAT32, {1});
  t.data<float>()[0] = v;
  return t;
}

using Vars = std::map<std::string, Variable>;

void Load(const Vars& inputs, Scope* scope) {
  for (const auto& [name, v] : inputs) {
    Variable* dst = scope->Var(name);
    if (const Tensor* t = v.GetIf<Tensor>()) {
      *dst->GetMutable<Tensor>() = t->Clone();
    } else {
      const SelectedRows& sr = v.Get<SelectedRows>();
      SelectedRows* o = dst->GetMutable<SelectedRows>();
      o->rows = sr.rows;
      o->height = sr.height;
      o->value = sr.value.Clone();
    }
  }
}

void ExpectNear(const Tensor& got, const Tensor& want, const std::string& what) {
  ASSERT_TRUE(got.place().is_cpu()) << what;
  ASSERT_EQ(got.dtype(), want.dtype()) << what;
  ASSERT_EQ(got.shape(), want.shape()) << what;
  for (int64_t i = 0; i < got.numel(); ++i) {
    double g, w;
    switch (want.dtype()) {
      case FLOAT32:
        g = got.data<float>()[i];
        w = want.data<float>()[i];
        break;
      case FLOAT64:
        g = got.data<double>()[i];
        w = want.data<double>()[i];
        break;
      case INT64:
        g = static_cast<double>(got.data<int64_t>()[i]);
        w = static_cast<double>(want.data<int64_t>()[i]);
        break;
      default:
        FAIL() << what << ": unexpected dtype";
    }
    ASSERT_LE(std::abs(g - w), kAtol + kRtol * std::abs(w)) << what << "[" << i << "]";
  }
}

// Bit-for-bit equality (dropout masks, accuracy counts).
void ExpectExact(const Tensor& got, const Tensor& want, const std::string& what) {
  ASSERT_TRUE(got.place().is_cpu()) << what;
  ASSERT_EQ(got.dtype(), want.dtype()) << what;
  ASSERT_EQ(got.shape(), want.shape()) << what;
  const size_t es = SizeOf(want.dtype());
  const char* g = static_cast<const char*>(got.raw_data());
  const char* w = static_cast<const char*>(want.raw_data());
  for (int64_t i = 0; i < got.numel(); ++i) {
    ASSERT_EQ(std::memcmp(g + i * es, w + i * es, es), 0) << what << "[" << i << "] differs";
  }
}

class GpuOpsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(RegisterStandardOps(&cpu_).ok());
    ASSERT_TRUE(RegisterGpuKernels(&kernels_).ok());
    auto placed = MakePlacedRegistry(cpu_, Place::Gpu(0), kernels_);
    ASSERT_TRUE(placed.ok()) << placed.status();
    gpu_ = std::move(*placed);
  }

  // Runs `ops` on both registries from `inputs` and compares `outputs` (dense or sparse; dense
  // ones bit for bit when `exact`).
  void Check(const std::string& name, const std::vector<OpDesc>& ops, const Vars& inputs,
             const std::vector<std::string>& outputs, bool exact = false) {
    SCOPED_TRACE(name);
    Scope cpu_scope, gpu_scope;
    Load(inputs, &cpu_scope);
    Load(inputs, &gpu_scope);
    Executor cpu_exec(&cpu_), gpu_exec(gpu_.get());
    const PlacementCounters before = GetPlacementCounters();
    for (const OpDesc& op : ops) {
      absl::Status s = cpu_exec.RunOp(op, &cpu_scope);
      ASSERT_TRUE(s.ok()) << "cpu: " << s;
      s = gpu_exec.RunOp(op, &gpu_scope);
      ASSERT_TRUE(s.ok()) << "gpu: " << s;
    }
    const PlacementCounters after = GetPlacementCounters();
    EXPECT_EQ(after.ops_on_device - before.ops_on_device, static_cast<int64_t>(ops.size()))
        << "an op fell back to its CPU kernel";
    EXPECT_EQ(after.ops_on_host, before.ops_on_host);
    ASSERT_TRUE(SynchronizePlace(Place::Gpu(0)).ok());
    ASSERT_TRUE(MoveScopeToHost(&gpu_scope).ok());
    for (const std::string& out : outputs) {
      const Variable* want = cpu_scope.FindVar(out);
      const Variable* got = gpu_scope.FindVar(out);
      ASSERT_NE(want, nullptr) << out;
      ASSERT_NE(got, nullptr) << out;
      if (want->Is<SelectedRows>()) {
        ASSERT_TRUE(got->Is<SelectedRows>()) << out;
        EXPECT_EQ(got->Get<SelectedRows>().rows, want->Get<SelectedRows>().rows) << out;
        EXPECT_EQ(got->Get<SelectedRows>().height, want->Get<SelectedRows>().height) << out;
        ExpectNear(got->Get<SelectedRows>().value, want->Get<SelectedRows>().value, out);
      } else {
        ASSERT_TRUE(got->Is<Tensor>()) << out;
        if (exact) {
          ExpectExact(got->Get<Tensor>(), want->Get<Tensor>(), out);
        } else {
          ExpectNear(got->Get<Tensor>(), want->Get<Tensor>(), out);
        }
      }
    }
  }

  static void Put(Vars* v, const std::string& name, Tensor t) {
    *(*v)[name].GetMutable<Tensor>() = std::move(t);
  }

  OpRegistry cpu_;
  DeviceKernelTable kernels_;  // the GPU kernels, for gpu_ (which must not outlive it)
  std::unique_ptr<OpRegistry> gpu_;
  std::mt19937 rng_{20261123};
};

TEST_F(GpuOpsTest, Mul) {
  for (int xn : {1, 2}) {
    Vars v;
    Put(&v, "x", Random({4, 3, 8}, &rng_));
    const int64_t k = xn == 1 ? 24 : 8;
    Put(&v, "y", Random({k, 6}, &rng_));
    Put(&v, "out@GRAD", Random({xn == 1 ? 4 : 12, 6}, &rng_));
    OpDesc fwd = MakeOp("mul", {{"X", {"x"}}, {"Y", {"y"}}}, {{"Out", {"out"}}});
    SetAttr(&fwd, "x_num_col_dims", xn);
    OpDesc grad = MakeOp("mul_grad", {{"X", {"x"}}, {"Y", {"y"}}, {"Out@GRAD", {"out@GRAD"}}},
                         {{"X@GRAD", {"x@GRAD"}}, {"Y@GRAD", {"y@GRAD"}}});
    SetAttr(&grad, "x_num_col_dims", xn);
    if (xn == 2) {  // out [4, 3, 6]: the gradient has that shape too
      Put(&v, "out@GRAD", Random({4, 3, 6}, &rng_));
    }
    Check("mul x_num_col_dims=" + std::to_string(xn), {fwd, grad}, v,
          {"out", "x@GRAD", "y@GRAD"});
  }
}

TEST_F(GpuOpsTest, MatmulEveryTranspose) {
  for (bool tx : {false, true}) {
    for (bool ty : {false, true}) {
      const int64_t m = 5, k = 7, n = 3;
      Vars v;
      Put(&v, "x", Random(tx ? Shape{k, m} : Shape{m, k}, &rng_));
      Put(&v, "y", Random(ty ? Shape{n, k} : Shape{k, n}, &rng_));
      Put(&v, "out@GRAD", Random({m, n}, &rng_));
      OpDesc fwd = MakeOp("matmul", {{"X", {"x"}}, {"Y", {"y"}}}, {{"Out", {"out"}}});
      OpDesc grad =
          MakeOp("matmul_grad", {{"X", {"x"}}, {"Y", {"y"}}, {"Out@GRAD", {"out@GRAD"}}},
                 {{"X@GRAD", {"x@GRAD"}}, {"Y@GRAD", {"y@GRAD"}}});
      for (OpDesc* op : {&fwd, &grad}) {
        SetAttr(op, "transpose_X", tx);
        SetAttr(op, "transpose_Y", ty);
        SetAttr(op, "alpha", 0.5f);
      }
      Check(absl::StrCat("matmul tx=", tx, " ty=", ty), {fwd, grad}, v,
            {"out", "x@GRAD", "y@GRAD"});
    }
  }
}

TEST_F(GpuOpsTest, ElementwiseWithBroadcast) {
  struct Shapes {
    Shape x, y;
    int axis;
  };
  for (const Shapes& s : {Shapes{{6, 5}, {6, 5}, -1}, Shapes{{6, 5}, {5}, -1},
                          Shapes{{2, 3, 4}, {3}, 1}, Shapes{{2, 3, 4}, {3, 1}, 1}}) {
    for (const char* type : {"elementwise_add", "elementwise_sub", "elementwise_mul"}) {
      Vars v;
      Put(&v, "x", Random(s.x, &rng_));
      Put(&v, "y", Random(s.y, &rng_));
      Put(&v, "out@GRAD", Random(s.x, &rng_));
      OpDesc fwd = MakeOp(type, {{"X", {"x"}}, {"Y", {"y"}}}, {{"Out", {"out"}}});
      OpDesc grad = MakeOp(absl::StrCat(type, "_grad"),
                           {{"X", {"x"}}, {"Y", {"y"}}, {"Out@GRAD", {"out@GRAD"}}},
                           {{"X@GRAD", {"x@GRAD"}}, {"Y@GRAD", {"y@GRAD"}}});
      SetAttr(&fwd, "axis", s.axis);
      SetAttr(&grad, "axis", s.axis);
      Check(absl::StrCat(type, " ", ShapeString(s.x), " ", ShapeString(s.y)), {fwd, grad}, v,
            {"out", "x@GRAD", "y@GRAD"});
    }
  }
}

TEST_F(GpuOpsTest, Activations) {
  for (const char* type : {"relu", "sigmoid", "tanh"}) {
    Vars v;
    Put(&v, "x", Random({7, 9}, &rng_, -3, 3));
    Put(&v, "out@GRAD", Random({7, 9}, &rng_));
    Check(type,
          {MakeOp(type, {{"X", {"x"}}}, {{"Out", {"out"}}}),
           MakeOp(absl::StrCat(type, "_grad"), {{"Out", {"out"}}, {"Out@GRAD", {"out@GRAD"}}},
                  {{"X@GRAD", {"x@GRAD"}}})},
          v, {"out", "x@GRAD"});
  }
}

TEST_F(GpuOpsTest, ReductionsAndBasics) {
  Vars v;
  Put(&v, "x", Random({33, 17}, &rng_));
  Put(&v, "b", Random({33, 17}, &rng_));
  Put(&v, "c", Random({33, 17}, &rng_));
  Put(&v, "out@GRAD", Scalar(0.75f));
  OpDesc scale1 = MakeOp("scale", {{"X", {"x"}}}, {{"Out", {"s1"}}});
  SetAttr(&scale1, "scale", 2.5f);
  SetAttr(&scale1, "bias", 0.25f);
  OpDesc scale2 = MakeOp("scale", {{"X", {"x"}}}, {{"Out", {"s2"}}});
  SetAttr(&scale2, "scale", -1.5f);
  SetAttr(&scale2, "bias", 1.0f);
  SetAttr(&scale2, "bias_after_scale", false);
  OpDesc fill = MakeOp("fill_constant", {}, {{"Out", {"f"}}});
  SetAttr(&fill, "shape", std::vector<int64_t>{4, 3});
  SetAttr(&fill, "value", 1.25f);
  Check("basics",
        {MakeOp("mean", {{"X", {"x"}}}, {{"Out", {"out"}}}),
         MakeOp("mean_grad", {{"X", {"x"}}, {"Out@GRAD", {"out@GRAD"}}}, {{"X@GRAD", {"x@GRAD"}}}),
         MakeOp("sum", {{"X", {"x", "b", "c"}}}, {{"Out", {"sum"}}}),
         MakeOp("sum", {{"X", {"sum", "b"}}}, {{"Out", {"sum"}}}),  // in place
         scale1, scale2, fill, MakeOp("assign", {{"X", {"x"}}}, {{"Out", {"copy"}}}),
         MakeOp("fill_zeros_like", {{"X", {"x"}}}, {{"Out", {"zeros"}}})},
        v, {"out", "x@GRAD", "sum", "s1", "s2", "f", "copy", "zeros"});
}

TEST_F(GpuOpsTest, Losses) {
  Vars v;
  Put(&v, "x", Random({16, 1}, &rng_, -4, 4));
  Put(&v, "y", Random({16, 1}, &rng_));
  Tensor z(FLOAT32, {16, 1});
  for (int i = 0; i < 16; ++i) z.data<float>()[i] = i == 5 ? -100.0f : static_cast<float>(i % 2);
  Put(&v, "z", z);
  Put(&v, "out@GRAD", Random({16, 1}, &rng_));
  Check("square_error",
        {MakeOp("square_error", {{"X", {"x"}}, {"Y", {"y"}}}, {{"Out", {"out"}}}),
         MakeOp("square_error_grad", {{"X", {"x"}}, {"Y", {"y"}}, {"Out@GRAD", {"out@GRAD"}}},
                {{"X@GRAD", {"x@GRAD"}}, {"Y@GRAD", {"y@GRAD"}}})},
        v, {"out", "x@GRAD", "y@GRAD"});
  Check("sigmoid_cross_entropy_with_logits",
        {MakeOp("sigmoid_cross_entropy_with_logits", {{"X", {"x"}}, {"Label", {"z"}}},
                {{"Out", {"out"}}}),
         MakeOp("sigmoid_cross_entropy_with_logits_grad",
                {{"X", {"x"}}, {"Label", {"z"}}, {"Out@GRAD", {"out@GRAD"}}},
                {{"X@GRAD", {"x@GRAD"}}})},
        v, {"out", "x@GRAD"});
}

TEST_F(GpuOpsTest, SoftmaxCrossEntropyHardAndSoft) {
  for (bool soft : {false, true}) {
    const int64_t n = 12, c = 10;
    Vars v;
    Put(&v, "logits", Random({n, c}, &rng_, -5, 5));
    if (soft) {
      Tensor z = Random({n, c}, &rng_, 0, 1);
      Put(&v, "label", z);
    } else {
      std::vector<int64_t> ids;
      for (int64_t i = 0; i < n; ++i) ids.push_back(i == 3 ? -100 : (i * 7) % c);
      Put(&v, "label", Ints({n, 1}, ids));
    }
    Put(&v, "loss@GRAD", Random({n, 1}, &rng_));
    OpDesc fwd = MakeOp("softmax_with_cross_entropy", {{"Logits", {"logits"}}, {"Label", {"label"}}},
                        {{"Softmax", {"softmax"}}, {"Loss", {"loss"}}});
    OpDesc grad = MakeOp("softmax_with_cross_entropy_grad",
                         {{"Softmax", {"softmax"}}, {"Label", {"label"}}, {"Loss@GRAD", {"loss@GRAD"}}},
                         {{"Logits@GRAD", {"logits@GRAD"}}});
    SetAttr(&fwd, "soft_label", soft);
    SetAttr(&grad, "soft_label", soft);
    Check(soft ? "soft labels" : "hard labels", {fwd, grad}, v,
          {"softmax", "loss", "logits@GRAD"});
  }
}

TEST_F(GpuOpsTest, LookupTableDenseAndSparseGradients) {
  for (bool sparse : {false, true}) {
    Vars v;
    Put(&v, "w", Random({20, 6}, &rng_));
    Put(&v, "ids", Ints({8, 1}, {3, 0, 19, 3, 7, 2, 3, 11}));  // 2 is padding; 3 repeats
    Put(&v, "out@GRAD", Random({8, 6}, &rng_));
    OpDesc fwd = MakeOp("lookup_table", {{"W", {"w"}}, {"Ids", {"ids"}}}, {{"Out", {"out"}}});
    OpDesc grad = MakeOp("lookup_table_grad",
                         {{"W", {"w"}}, {"Ids", {"ids"}}, {"Out@GRAD", {"out@GRAD"}}},
                         {{"W@GRAD", {"w@GRAD"}}});
    for (OpDesc* op : {&fwd, &grad}) {
      SetAttr(op, "padding_idx", 2);
      SetAttr(op, "is_sparse", sparse);
    }
    Check(sparse ? "sparse" : "dense", {fwd, grad}, v, {"out", "w@GRAD"});
  }
}

TEST_F(GpuOpsTest, ConcatAndSplit) {
  Vars v;
  Put(&v, "a", Random({4, 3, 2}, &rng_));
  Put(&v, "b", Random({4, 5, 2}, &rng_));
  Put(&v, "cat@GRAD", Random({4, 8, 2}, &rng_));
  OpDesc cat = MakeOp("concat", {{"X", {"a", "b"}}}, {{"Out", {"cat"}}});
  SetAttr(&cat, "axis", 1);
  OpDesc cat_grad = MakeOp("concat_grad", {{"X", {"a", "b"}}, {"Out@GRAD", {"cat@GRAD"}}},
                           {{"X@GRAD", {"a@GRAD", "b@GRAD"}}});
  SetAttr(&cat_grad, "axis", 1);
  OpDesc split = MakeOp("split", {{"X", {"cat"}}}, {{"Out", {"p", "q", "r"}}});
  SetAttr(&split, "axis", -2);
  SetAttr(&split, "sections", std::vector<int64_t>{2, -1, 1});
  Check("concat/split", {cat, cat_grad, split}, v, {"cat", "a@GRAD", "b@GRAD", "p", "q", "r"});
}

// Output extent of a convolution or pooling window along one dimension.
int64_t OutSize(int64_t in, int64_t k, int64_t stride, int64_t pad, int64_t dilation = 1) {
  return (in + 2 * pad - (dilation * (k - 1) + 1)) / stride + 1;
}

std::vector<int64_t> Pair(const std::vector<int64_t>& v, int64_t dflt) {
  if (v.empty()) return {dflt, dflt};
  return v.size() == 1 ? std::vector<int64_t>{v[0], v[0]} : v;
}

TEST_F(GpuOpsTest, Conv2dStridesPaddingsDilations) {
  struct Case {
    Shape x, w;
    std::vector<int64_t> strides, paddings, dilations;  // empty: attribute absent
  };
  for (const Case& c : {Case{{2, 3, 7, 7}, {4, 3, 3, 3}, {}, {}, {}},
                        Case{{2, 3, 8, 9}, {5, 3, 3, 2}, {2}, {1}, {}},
                        Case{{3, 2, 9, 8}, {4, 2, 3, 3}, {1, 2}, {2, 1}, {2, 2}},
                        Case{{1, 1, 5, 5}, {2, 1, 5, 5}, {}, {2, 2}, {}},
                        Case{{2, 4, 6, 6}, {3, 4, 1, 1}, {2, 2}, {}, {}},
                        Case{{2, 2, 10, 7}, {3, 2, 2, 3}, {3, 2}, {1, 0}, {3, 1}}}) {
    const std::vector<int64_t> s = Pair(c.strides, 1), p = Pair(c.paddings, 0),
                               d = Pair(c.dilations, 1);
    const Shape out = {c.x[0], c.w[0], OutSize(c.x[2], c.w[2], s[0], p[0], d[0]),
                       OutSize(c.x[3], c.w[3], s[1], p[1], d[1])};
    Vars v;
    Put(&v, "x", Random(c.x, &rng_));
    Put(&v, "w", Random(c.w, &rng_));
    Put(&v, "out@GRAD", Random(out, &rng_));
    OpDesc fwd = MakeOp("conv2d", {{"Input", {"x"}}, {"Filter", {"w"}}}, {{"Output", {"out"}}});
    OpDesc grad =
        MakeOp("conv2d_grad", {{"Input", {"x"}}, {"Filter", {"w"}}, {"Output@GRAD", {"out@GRAD"}}},
               {{"Input@GRAD", {"x@GRAD"}}, {"Filter@GRAD", {"w@GRAD"}}});
    OpDesc grad_w =
        MakeOp("conv2d_grad", {{"Input", {"x"}}, {"Filter", {"w"}}, {"Output@GRAD", {"out@GRAD"}}},
               {{"Filter@GRAD", {"w@GRAD2"}}});
    for (OpDesc* op : {&fwd, &grad, &grad_w}) {
      if (!c.strides.empty()) SetAttr(op, "strides", c.strides);
      if (!c.paddings.empty()) SetAttr(op, "paddings", c.paddings);
      if (!c.dilations.empty()) SetAttr(op, "dilations", c.dilations);
    }
    Check(absl::StrCat("conv2d x ", ShapeString(c.x), " w ", ShapeString(c.w)), {fwd, grad, grad_w},
          v, {"out", "x@GRAD", "w@GRAD", "w@GRAD2"});
  }
}

TEST_F(GpuOpsTest, Pool2dMaxAvgPaddedGlobal) {
  struct Case {
    std::string type;
    std::vector<int64_t> ksize, strides, paddings;
    bool exclusive, global, ties;  // ties: X takes few distinct values
  };
  for (const Case& c :
       {Case{"max", {2}, {2}, {}, true, false, false},
        Case{"max", {3, 3}, {2, 2}, {1, 1}, true, false, false},
        Case{"max", {3, 2}, {1, 2}, {1, 0}, true, false, true},
        Case{"avg", {3, 3}, {1, 1}, {1, 1}, true, false, false},
        Case{"avg", {3, 3}, {2, 1}, {1, 2}, false, false, false},
        Case{"avg", {2, 2}, {2, 2}, {}, true, false, false},
        Case{"max", {}, {}, {}, true, true, true}, Case{"avg", {}, {}, {}, true, true, false}}) {
    const Shape xs = {2, 3, 7, 6};
    Shape out = {2, 3, 1, 1};
    if (!c.global) {
      const std::vector<int64_t> k = Pair(c.ksize, 2), s = Pair(c.strides, 1),
                                 p = Pair(c.paddings, 0);
      out = {2, 3, OutSize(xs[2], k[0], s[0], p[0]), OutSize(xs[3], k[1], s[1], p[1])};
    }
    Vars v;
    Tensor x = Random(xs, &rng_);
    if (c.ties) {
      for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = std::round(x.data<float>()[i]);
    }
    Put(&v, "x", x);
    Put(&v, "out@GRAD", Random(out, &rng_));
    OpDesc fwd = MakeOp("pool2d", {{"X", {"x"}}}, {{"Out", {"out"}}});
    OpDesc grad =
        MakeOp("pool2d_grad", {{"X", {"x"}}, {"Out", {"out"}}, {"Out@GRAD", {"out@GRAD"}}},
               {{"X@GRAD", {"x@GRAD"}}});
    for (OpDesc* op : {&fwd, &grad}) {
      SetAttr(op, "pooling_type", c.type);
      if (!c.ksize.empty()) SetAttr(op, "ksize", c.ksize);
      if (!c.strides.empty()) SetAttr(op, "strides", c.strides);
      if (!c.paddings.empty()) SetAttr(op, "paddings", c.paddings);
      SetAttr(op, "exclusive", c.exclusive);
      SetAttr(op, "global_pooling", c.global);
    }
    Check(absl::StrCat("pool2d ", c.type, " ksize ", Pair(c.ksize, 2)[0], "x", Pair(c.ksize, 2)[1],
                       c.global ? " global" : "", c.exclusive ? "" : " inclusive",
                       c.ties ? " ties" : ""),
          {fwd, grad}, v, {"out", "x@GRAD"});
  }
}

TEST_F(GpuOpsTest, FlattenEveryAxis) {
  const Shape xs = {2, 3, 4, 5};
  for (int64_t axis : {0, 1, 2, 4}) {
    int64_t outer = 1;
    for (int64_t i = 0; i < axis; ++i) outer *= xs[i];
    Vars v;
    Put(&v, "x", Random(xs, &rng_));
    Put(&v, "out@GRAD", Random({outer, 120 / outer}, &rng_));
    std::vector<int64_t> ids(120);
    for (int64_t i = 0; i < 120; ++i) ids[i] = i * 7 - 3;
    Put(&v, "ids", Ints(xs, ids));
    OpDesc fwd = MakeOp("flatten", {{"X", {"x"}}}, {{"Out", {"out"}}});
    OpDesc grad = MakeOp("flatten_grad", {{"X", {"x"}}, {"Out@GRAD", {"out@GRAD"}}},
                         {{"X@GRAD", {"x@GRAD"}}});
    OpDesc ints = MakeOp("flatten", {{"X", {"ids"}}}, {{"Out", {"ids_flat"}}});
    for (OpDesc* op : {&fwd, &grad, &ints}) SetAttr(op, "axis", axis);
    Check(absl::StrCat("flatten axis ", axis), {fwd, grad, ints}, v, {"out", "x@GRAD", "ids_flat"});
  }
}

TEST_F(GpuOpsTest, BatchNormTrainAndGlobalStats) {
  for (const Shape& xs : {Shape{4, 3, 5, 5}, Shape{6, 4}, Shape{2, 5, 3}}) {
    for (const char* mode : {"train", "is_test", "use_global_stats"}) {
      const int64_t c = xs[1];
      const std::string m = mode;
      Vars v;
      Put(&v, "x", Random(xs, &rng_, -2, 3));
      Put(&v, "scale", Random({c}, &rng_, 0.5f, 1.5f));
      Put(&v, "bias", Random({c}, &rng_));
      Put(&v, "mean", Random({c}, &rng_));
      Put(&v, "var", Random({c}, &rng_, 0.5f, 2.0f));
      Put(&v, "saved_mean", Random({c}, &rng_));
      Put(&v, "saved_var", Random({c}, &rng_, 0.5f, 2.0f));
      Put(&v, "y@GRAD", Random(xs, &rng_));
      OpDesc fwd = MakeOp("batch_norm",
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
      OpDesc grad = MakeOp(
          "batch_norm_grad",
          {{"X", {"x"}},
           {"Scale", {"scale"}},
           {"Mean", {"mean"}},
           {"Variance", {"var"}},
           {"SavedMean", {"saved_mean"}},
           {"SavedVariance", {"saved_var"}},
           {"Y@GRAD", {"y@GRAD"}}},
          {{"X@GRAD", {"x@GRAD"}}, {"Scale@GRAD", {"scale@GRAD"}}, {"Bias@GRAD", {"bias@GRAD"}}});
      OpDesc grad_x = MakeOp("batch_norm_grad",
                             {{"X", {"x"}},
                              {"Scale", {"scale"}},
                              {"Mean", {"mean"}},
                              {"Variance", {"var"}},
                              {"SavedMean", {"saved_mean"}},
                              {"SavedVariance", {"saved_var"}},
                              {"Y@GRAD", {"y@GRAD"}}},
                             {{"X@GRAD", {"x@GRAD2"}}});
      for (OpDesc* op : {&fwd, &grad, &grad_x}) {
        SetAttr(op, "epsilon", 1e-3f);
        SetAttr(op, "momentum", 0.8f);
        if (m != "train") SetAttr(op, m, true);
      }
      // Two forward steps: the second reads the running statistics the first moved.
      Check(absl::StrCat("batch_norm ", ShapeString(xs), " ", m), {fwd, fwd, grad, grad_x}, v,
            {"y", "mean", "var", "saved_mean", "saved_var", "x@GRAD", "scale@GRAD", "bias@GRAD",
             "x@GRAD2"});
    }
  }
}

TEST_F(GpuOpsTest, OptimizersDenseAndSparse) {
  const Shape shape = {10, 4};
  for (const char* type : {"sgd", "momentum", "adam", "adagrad"}) {
    for (bool sparse : {false, true}) {
      for (bool nesterov : {false, true}) {
        if (nesterov && std::string(type) != "momentum") continue;
        Vars v;
        Put(&v, "p", Random(shape, &rng_));
        Put(&v, "lr", Scalar(0.05f));
        if (sparse) {
          SelectedRows* g = v["g"].GetMutable<SelectedRows>();
          g->rows = {7, 1, 7, 0, 9};
          g->height = 10;
          g->value = Random({5, 4}, &rng_);
        } else {
          Put(&v, "g", Random(shape, &rng_));
        }
        std::map<std::string, std::vector<std::string>> ins = {
            {"Param", {"p"}}, {"Grad", {"g"}}, {"LearningRate", {"lr"}}};
        std::map<std::string, std::vector<std::string>> outs = {{"ParamOut", {"p"}}};
        std::vector<std::string> check = {"p"};
        auto state = [&](const char* in, const char* out, const char* var, float lo) {
          Put(&v, var, Random(shape, &rng_, lo, 1.0f));
          ins[in] = {var};
          outs[out] = {var};
          check.push_back(var);
        };
        const std::string t = type;
        if (t == "momentum") state("Velocity", "VelocityOut", "vel", -1.0f);
        if (t == "adagrad") state("Moment", "MomentOut", "mom", 0.0f);
        if (t == "adam") {
          state("Moment1", "Moment1Out", "m1", -1.0f);
          state("Moment2", "Moment2Out", "m2", 0.0f);
          Put(&v, "b1p", Scalar(0.9f * 0.9f));
          Put(&v, "b2p", Scalar(0.999f));
          ins["Beta1Pow"] = {"b1p"};
          ins["Beta2Pow"] = {"b2p"};
          outs["Beta1PowOut"] = {"b1p"};
          outs["Beta2PowOut"] = {"b2p"};
          check.push_back("b1p");
          check.push_back("b2p");
        }
        Slots in_slots(ins.begin(), ins.end()), out_slots(outs.begin(), outs.end());
        OpDesc op = MakeOp(type, in_slots, out_slots);
        SetAttr(&op, "regularization_coeff", 0.01f);
        SetAttr(&op, "mu", 0.9f);
        SetAttr(&op, "use_nesterov", nesterov);
        // Two steps: the second reads the state the first left on the device.
        Check(absl::StrCat(type, sparse ? " sparse" : " dense", nesterov ? " nesterov" : ""),
              {op, op}, v, check);
      }
    }
  }
}

OpDesc DropoutOp(const std::string& x, const std::string& out, const std::string& mask, float p,
                 const std::string& impl, int64_t seed, bool is_test) {
  std::map<std::string, std::vector<std::string>> outs = {{"Out", {out}}};
  if (!mask.empty()) outs["Mask"] = {mask};
  OpDesc op = MakeOp("dropout", {{"X", {x}}}, Slots(outs.begin(), outs.end()));
  SetAttr(&op, "dropout_prob", p);
  SetAttr(&op, "dropout_implementation", impl);
  SetAttr(&op, "seed", seed);
  SetAttr(&op, "is_test", is_test);
  return op;
}

OpDesc DropoutGradOp(const std::string& mask, const std::string& dout, const std::string& dx,
                     float p, const std::string& impl, bool is_test) {
  std::map<std::string, std::vector<std::string>> ins = {{"Out@GRAD", {dout}}};
  if (!mask.empty()) ins["Mask"] = {mask};
  OpDesc op = MakeOp("dropout_grad", Slots(ins.begin(), ins.end()), {{"X@GRAD", {dx}}});
  SetAttr(&op, "dropout_prob", p);
  SetAttr(&op, "dropout_implementation", impl);
  SetAttr(&op, "is_test", is_test);
  return op;
}

// The training mask is drawn on the device from the key the host computes (seed, run count,
// X's first 64 bytes): it must be the CPU's bit for bit, on the first run (X fed on the host)
// and the second (X already on the device, the run count advanced), with X shorter than 64
// bytes, of a partial last word, and large enough for the grid-stride loop to wrap.
TEST_F(GpuOpsTest, DropoutTrainMaskBitIdentical) {
  struct Case {
    Shape x;
    float p;
    std::string impl;
    int64_t seed;
  };
  for (const Case& c : {Case{{3}, 0.5f, "downgrade_in_infer", 0},
                        Case{{2, 5}, 0.3f, "upscale_in_train", 7},
                        Case{{33, 17}, 0.1f, "downgrade_in_infer", 1},
                        Case{{4, 3, 5, 5}, 0.9f, "upscale_in_train", 12345},
                        Case{{1100, 1000}, 0.5f, "upscale_in_train", -3}}) {
    Vars v;
    Put(&v, "x", Random(c.x, &rng_, -2, 2));
    Put(&v, "out@GRAD", Random(c.x, &rng_));
    const std::vector<OpDesc> ops = {
        DropoutOp("x", "out1", "mask", c.p, c.impl, c.seed, false),
        DropoutGradOp("mask", "out@GRAD", "x@GRAD1", c.p, c.impl, false),
        MakeOp("assign", {{"X", {"mask"}}}, {{"Out", {"mask1"}}}),
        DropoutOp("x", "out2", "mask", c.p, c.impl, c.seed, false),  // run 1: another mask
        DropoutGradOp("mask", "out@GRAD", "x@GRAD2", c.p, c.impl, false)};
    Check(absl::StrCat("dropout ", ShapeString(c.x), " p=", c.p, " ", c.impl, " seed=", c.seed),
          ops, v, {"out1", "mask1", "x@GRAD1", "out2", "mask", "x@GRAD2", "mask@runs"}, true);
  }
  // In place (Out is X): the key reads X before the kernel overwrites it.
  Vars v;
  Put(&v, "x", Random({9, 11}, &rng_));
  const OpDesc in_place = DropoutOp("x", "x", "mask", 0.4f, "upscale_in_train", 5, false);
  Check("dropout in place", {in_place, in_place}, v, {"x", "mask", "mask@runs"}, true);
}

TEST_F(GpuOpsTest, DropoutIsTestAndGrad) {
  for (const char* impl : {"downgrade_in_infer", "upscale_in_train"}) {
    Vars v;
    Put(&v, "x", Random({13, 7}, &rng_, -3, 3));
    Put(&v, "out@GRAD", Random({13, 7}, &rng_));
    Check(absl::StrCat("dropout is_test ", impl),
          {DropoutOp("x", "out", "", 0.35f, impl, 0, true),
           DropoutGradOp("", "out@GRAD", "x@GRAD", 0.35f, impl, true)},
          v, {"out", "x@GRAD"}, true);
  }
}

// Scores on a coarse grid, so that many rows tie with their label's score.
TEST_F(GpuOpsTest, AccuracyTopKWithTies) {
  const int64_t n = 300, c = 7;
  for (int64_t k : {1, 3}) {
    for (bool counts : {true, false}) {
      Vars v;
      Tensor x = Random({n, c}, &rng_);
      for (int64_t i = 0; i < x.numel(); ++i) {
        x.data<float>()[i] = std::round(x.data<float>()[i] * 2) / 2;
      }
      for (int64_t j = 0; j < c; ++j) x.data<float>()[5 * c + j] = 0.5f;  // a row all ties
      Put(&v, "x", x);
      std::vector<int64_t> labels(n);
      for (int64_t i = 0; i < n; ++i) labels[i] = (i * 5 + i / 7) % c;
      Put(&v, "label", Ints({n, 1}, labels));
      std::map<std::string, std::vector<std::string>> outs = {{"Accuracy", {"acc"}}};
      std::vector<std::string> check = {"acc"};
      if (counts) {
        outs["Correct"] = {"correct"};
        outs["Total"] = {"total"};
        check.push_back("correct");
        check.push_back("total");
      }
      OpDesc op = MakeOp("accuracy", {{"X", {"x"}}, {"Label", {"label"}}},
                         Slots(outs.begin(), outs.end()));
      SetAttr(&op, "k", k);
      Check(absl::StrCat("accuracy k=", k, counts ? " with counts" : ""), {op}, v, check, true);
    }
  }
}

// A label outside [0, C) declines: the CPU kernel runs and reports its error; int32 labels run
// on the CPU.
TEST_F(GpuOpsTest, AccuracyFallsBackForBadOrInt32Labels) {
  const int64_t n = 6, c = 4;
  Tensor bad = Ints({n, 1}, {0, 1, 2, 4, 3, 0});
  Tensor narrow(INT32, {n, 1});
  for (int64_t i = 0; i < n; ++i) narrow.data<int32_t>()[i] = static_cast<int32_t>(i % c);
  Tensor x = Random({n, c}, &rng_);
  for (const Tensor* label : {&bad, &narrow}) {
    const bool int32 = label == &narrow;
    SCOPED_TRACE(int32 ? "int32 labels" : "bad label");
    Vars v;
    Put(&v, "x", x.Clone());
    Put(&v, "label", label->Clone());
    OpDesc op = MakeOp("accuracy", {{"X", {"x"}}, {"Label", {"label"}}},
                       {{"Accuracy", {"acc"}}, {"Correct", {"correct"}}, {"Total", {"total"}}});
    Scope cpu_scope, gpu_scope;
    Load(v, &cpu_scope);
    Load(v, &gpu_scope);
    Executor cpu_exec(&cpu_), gpu_exec(gpu_.get());
    const PlacementCounters before = GetPlacementCounters();
    const absl::Status want = cpu_exec.RunOp(op, &cpu_scope);
    const absl::Status got = gpu_exec.RunOp(op, &gpu_scope);
    const PlacementCounters after = GetPlacementCounters();
    EXPECT_EQ(after.ops_on_host - before.ops_on_host, 1) << "the CPU kernel should run it";
    EXPECT_EQ(after.ops_on_device, before.ops_on_device);
    ASSERT_EQ(got.ok(), want.ok()) << got << " vs " << want;
    EXPECT_EQ(got.ok(), int32);
    EXPECT_EQ(got.message(), want.message());
    if (!int32) continue;
    ASSERT_TRUE(MoveScopeToHost(&gpu_scope).ok());
    for (const char* out : {"acc", "correct", "total"}) {
      ExpectExact(gpu_scope.FindVar(out)->Get<Tensor>(), cpu_scope.FindVar(out)->Get<Tensor>(),
                  out);
    }
  }
}

}  // namespace
}  // namespace tessera

TESSERA_GPU_TEST_MAIN()
