#include "common/ops/tensor_ops.h"

#include "absl/strings/str_cat.h"
#include "common/framework/executor.h"
#include "common/ops/grad_check.h"
#include "common/ops/ops.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

class TensorOpsTest : public ::testing::Test {
 protected:
  void Feed(const std::string& name, const Tensor& t) {
    scope_.Var(name)->GetMutable<Tensor>()->CopyFrom(t);
  }
  const Tensor& Get(const std::string& name) { return scope_.FindVar(name)->Get<Tensor>(); }

  std::unique_ptr<OpRegistry> registry_ = NewStandardOpRegistry();
  Executor exec_{registry_.get()};
  Scope scope_;
};

// A float64 tensor holding 0, 1, 2, ...
Tensor Iota(const Shape& shape, double start = 0) {
  Tensor t(FLOAT64, shape);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<double>()[i] = start + i;
  return t;
}

std::vector<double> Values(const Tensor& t) {
  return std::vector<double>(t.data<double>(), t.data<double>() + t.numel());
}

TEST_F(TensorOpsTest, ConcatAlongEachAxis) {
  Feed("a", Iota({2, 2}));      // [[0, 1], [2, 3]]
  Feed("b", Iota({2, 1}, 10));  // [[10], [11]]
  Feed("c", Iota({1, 2}, 20));  // [[20, 21]]
  OpDesc op1 = MakeOp("concat", {{"X", {"a", "b"}}}, {{"Out", {"o1"}}});
  SetAttr(&op1, "axis", 1);
  ASSERT_TRUE(exec_.RunOp(op1, &scope_).ok());
  EXPECT_EQ(Get("o1").shape(), (Shape{2, 3}));
  EXPECT_EQ(Values(Get("o1")), (std::vector<double>{0, 1, 10, 2, 3, 11}));

  OpDesc op0 = MakeOp("concat", {{"X", {"a", "c"}}}, {{"Out", {"o0"}}});
  ASSERT_TRUE(exec_.RunOp(op0, &scope_).ok());
  EXPECT_EQ(Get("o0").shape(), (Shape{3, 2}));
  EXPECT_EQ(Values(Get("o0")), (std::vector<double>{0, 1, 2, 3, 20, 21}));

  SetAttr(&op1, "axis", -1);  // counts from the back
  ASSERT_TRUE(exec_.RunOp(op1, &scope_).ok());
  EXPECT_EQ(Values(Get("o1")), (std::vector<double>{0, 1, 10, 2, 3, 11}));
}

TEST_F(TensorOpsTest, ConcatIntoOneOfItsInputs) {
  Feed("a", Iota({2}));
  Feed("b", Iota({3}, 5));
  ASSERT_TRUE(exec_.RunOp(MakeOp("concat", {{"X", {"a", "b"}}}, {{"Out", {"a"}}}), &scope_).ok());
  EXPECT_EQ(Values(Get("a")), (std::vector<double>{0, 1, 5, 6, 7}));
}

// The output is an input given twice: both reads see the input as it was.
TEST_F(TensorOpsTest, ConcatIntoAnInputGivenTwice) {
  Feed("a", Iota({2}, 3));
  Feed("b", Iota({1}, 9));
  ASSERT_TRUE(
      exec_.RunOp(MakeOp("concat", {{"X", {"a", "b", "a"}}}, {{"Out", {"a"}}}), &scope_).ok());
  EXPECT_EQ(Values(Get("a")), (std::vector<double>{3, 4, 9, 3, 4}));
}

TEST_F(TensorOpsTest, ConcatMismatchNamesInput) {
  Feed("a", Iota({2, 2}));
  Feed("b", Iota({3, 1}));
  OpDesc op = MakeOp("concat", {{"X", {"a", "b"}}}, {{"Out", {"o"}}});
  SetAttr(&op, "axis", 1);
  absl::Status s = exec_.RunOp(op, &scope_);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("'b'"), std::string::npos) << s;
  EXPECT_NE(s.message().find("[3, 1]"), std::string::npos) << s;

  SetAttr(&op, "axis", 2);
  s = exec_.RunOp(op, &scope_);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("axis 2"), std::string::npos) << s;
}

TEST_F(TensorOpsTest, ConcatGradient) {
  OpDesc op = MakeOp("concat", {{"X", {"a", "b", "c"}}}, {{"Out", {"o"}}});
  SetAttr(&op, "axis", 1);
  GradCheckOptions opt;
  opt.wrt = {"a", "b", "c"};
  absl::Status s = CheckGradient(*registry_, op,
                                 {{"a", RandomTensor({2, 1, 3}, -1, 1, 1)},
                                  {"b", RandomTensor({2, 2, 3}, -1, 1, 2)},
                                  {"c", RandomTensor({2, 3, 3}, -1, 1, 3)}},
                                 opt);
  EXPECT_TRUE(s.ok()) << s;
  // Only some gradients wanted: the others are pruned to @EMPTY@ and skipped.
  opt.wrt = {"b"};
  s = CheckGradient(*registry_, op,
                    {{"a", RandomTensor({2, 1, 3}, -1, 1, 1)},
                     {"b", RandomTensor({2, 2, 3}, -1, 1, 2)},
                     {"c", RandomTensor({2, 3, 3}, -1, 1, 3)}},
                    opt);
  EXPECT_TRUE(s.ok()) << s;
}

TEST_F(TensorOpsTest, ConcatGradSplitsOutputGradient) {
  Feed("a", Iota({2, 1}));
  Feed("b", Iota({2, 2}));
  Feed("o@GRAD", Iota({2, 3}, 100));  // [[100, 101, 102], [103, 104, 105]]
  OpDesc fwd = MakeOp("concat", {{"X", {"a", "b"}}}, {{"Out", {"o"}}});
  SetAttr(&fwd, "axis", 1);
  std::vector<OpDesc> grads = registry_->Find("concat")->grad_maker(fwd);
  ASSERT_EQ(grads.size(), 1u);
  SetOpOutputs(&grads[0], "X@GRAD", {kEmptyVarName, "b@GRAD"});
  ASSERT_TRUE(exec_.RunOp(grads[0], &scope_).ok());
  EXPECT_EQ(scope_.FindVar("a@GRAD"), nullptr);
  EXPECT_EQ(Values(Get("b@GRAD")), (std::vector<double>{101, 102, 104, 105}));
}

// A gradient output that is one of the inputs (memory reuse): every slice still takes the shape
// its input had.
TEST_F(TensorOpsTest, ConcatGradIntoItsInputs) {
  Feed("a", Iota({2, 1}));
  Feed("b", Iota({2, 2}));
  Feed("o@GRAD", Iota({2, 3}, 100));
  OpDesc fwd = MakeOp("concat", {{"X", {"a", "b"}}}, {{"Out", {"o"}}});
  SetAttr(&fwd, "axis", 1);
  std::vector<OpDesc> grads = registry_->Find("concat")->grad_maker(fwd);
  ASSERT_EQ(grads.size(), 1u);
  SetOpOutputs(&grads[0], "X@GRAD", {"b", "a"});
  ASSERT_TRUE(exec_.RunOp(grads[0], &scope_).ok());
  EXPECT_EQ(Get("b").shape(), (Shape{2, 1}));
  EXPECT_EQ(Values(Get("b")), (std::vector<double>{100, 103}));
  EXPECT_EQ(Get("a").shape(), (Shape{2, 2}));
  EXPECT_EQ(Values(Get("a")), (std::vector<double>{101, 102, 104, 105}));
}

TEST_F(TensorOpsTest, SplitBySectionsAndNum) {
  Feed("x", Iota({2, 6}));
  OpDesc op = MakeOp("split", {{"X", {"x"}}}, {{"Out", {"p", "q", "r"}}});
  SetAttr(&op, "axis", 1);
  SetAttr(&op, "sections", std::vector<int64_t>{1, -1, 2});
  ASSERT_TRUE(exec_.RunOp(op, &scope_).ok());
  EXPECT_EQ(Get("q").shape(), (Shape{2, 3}));
  EXPECT_EQ(Values(Get("p")), (std::vector<double>{0, 6}));
  EXPECT_EQ(Values(Get("q")), (std::vector<double>{1, 2, 3, 7, 8, 9}));
  EXPECT_EQ(Values(Get("r")), (std::vector<double>{4, 5, 10, 11}));

  OpDesc even = MakeOp("split", {{"X", {"x"}}}, {{"Out", {"e0", "e1"}}});
  SetAttr(&even, "num", 2);
  ASSERT_TRUE(exec_.RunOp(even, &scope_).ok());
  EXPECT_EQ(Get("e1").shape(), (Shape{1, 6}));
  EXPECT_EQ(Values(Get("e1")), (std::vector<double>{6, 7, 8, 9, 10, 11}));

  // Equal parts when neither attribute is given; an unbound output is skipped.
  OpDesc three = MakeOp("split", {{"X", {"x"}}}, {{"Out", {"t0", kEmptyVarName, "t2"}}});
  SetAttr(&three, "axis", -1);
  ASSERT_TRUE(exec_.RunOp(three, &scope_).ok());
  EXPECT_EQ(Values(Get("t2")), (std::vector<double>{4, 5, 10, 11}));
}

// Columns of every width the row copies special-case (4 to 64 bytes) and others: float32 and
// float64 tensors split by columns and concatenated back, the rows' sequences (LoD) kept by the
// split.
TEST_F(TensorOpsTest, SplitAndConcatByColumnsOfEveryWidth) {
  const std::vector<int64_t> widths = {1, 2, 4, 8, 16, 3};
  for (DataType dtype : {FLOAT32, FLOAT64}) {
    auto at = [](const Tensor& t, int64_t i) {
      return t.dtype() == FLOAT32 ? static_cast<double>(t.data<float>()[i]) : t.data<double>()[i];
    };
    Tensor x(dtype, {5, 34});
    for (int64_t i = 0; i < x.numel(); ++i) {
      if (dtype == FLOAT32) x.data<float>()[i] = static_cast<float>(i);
      if (dtype == FLOAT64) x.data<double>()[i] = static_cast<double>(i);
    }
    x.set_lod({0, 2, 5});
    Feed("x", x);
    std::vector<std::string> outs;
    for (size_t i = 0; i < widths.size(); ++i) outs.push_back(absl::StrCat("c", i));
    OpDesc split = MakeOp("split", {{"X", {"x"}}}, {{"Out", outs}});
    SetAttr(&split, "axis", 1);
    SetAttr(&split, "sections", widths);
    ASSERT_TRUE(exec_.RunOp(split, &scope_).ok());
    int64_t first = 0;
    for (size_t i = 0; i < widths.size(); ++i) {
      const Tensor& c = Get(outs[i]);
      ASSERT_EQ(c.shape(), (Shape{5, widths[i]})) << i;
      EXPECT_EQ(c.lod(), (std::vector<int64_t>{0, 2, 5})) << i;
      for (int64_t r = 0; r < 5; ++r) {
        for (int64_t j = 0; j < widths[i]; ++j) {
          ASSERT_EQ(at(c, r * widths[i] + j), static_cast<double>(r * 34 + first + j))
              << DataTypeName(dtype) << " column block " << i << " row " << r << " col " << j;
        }
      }
      first += widths[i];
    }
    OpDesc concat = MakeOp("concat", {{"X", outs}}, {{"Out", {"back"}}});
    SetAttr(&concat, "axis", 1);
    ASSERT_TRUE(exec_.RunOp(concat, &scope_).ok());
    const Tensor& back = Get("back");
    ASSERT_EQ(back.shape(), x.shape());
    for (int64_t i = 0; i < x.numel(); ++i) ASSERT_EQ(at(back, i), at(x, i)) << i;
  }
}

TEST_F(TensorOpsTest, SplitRejectsBadSections) {
  Feed("x", Iota({2, 6}));
  OpDesc op = MakeOp("split", {{"X", {"x"}}}, {{"Out", {"p", "q"}}});
  SetAttr(&op, "axis", 1);
  SetAttr(&op, "sections", std::vector<int64_t>{2, 3});
  absl::Status s = exec_.RunOp(op, &scope_);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("sections [2, 3]"), std::string::npos) << s;
  EXPECT_NE(s.message().find("'x'"), std::string::npos) << s;
  EXPECT_NE(s.message().find("[2, 6]"), std::string::npos) << s;

  SetAttr(&op, "sections", std::vector<int64_t>{-1, -1});
  EXPECT_FALSE(exec_.RunOp(op, &scope_).ok());
  SetAttr(&op, "sections", std::vector<int64_t>{7, -1});
  EXPECT_FALSE(exec_.RunOp(op, &scope_).ok());
  SetAttr(&op, "sections", std::vector<int64_t>{6});
  EXPECT_FALSE(exec_.RunOp(op, &scope_).ok());  // one entry for two outputs

  OpDesc odd = MakeOp("split", {{"X", {"x"}}}, {{"Out", {"a", "b", "c", "d"}}});
  SetAttr(&odd, "axis", 1);
  s = exec_.RunOp(odd, &scope_);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("4 equal parts"), std::string::npos) << s;
}

TEST_F(TensorOpsTest, SplitGradient) {
  OpDesc op = MakeOp("split", {{"X", {"x"}}}, {{"Out", {"p", "q"}}});
  SetAttr(&op, "axis", 1);
  SetAttr(&op, "sections", std::vector<int64_t>{1, 3});
  GradCheckOptions opt;
  opt.wrt = {"x"};
  opt.outputs = {"p", "q"};
  absl::Status s = CheckGradient(*registry_, op, {{"x", RandomTensor({3, 4}, -1, 1, 4)}}, opt);
  EXPECT_TRUE(s.ok()) << s;
}

TEST_F(TensorOpsTest, ReshapeInfersAndCopiesDims) {
  Feed("x", Iota({2, 3, 4}));
  OpDesc op = MakeOp("reshape", {{"X", {"x"}}}, {{"Out", {"y"}}});
  SetAttr(&op, "shape", std::vector<int64_t>{0, -1});
  ASSERT_TRUE(exec_.RunOp(op, &scope_).ok());
  EXPECT_EQ(Get("y").shape(), (Shape{2, 12}));
  EXPECT_EQ(Values(Get("y")), Values(Iota({24})));
  EXPECT_EQ(Get("x").shape(), (Shape{2, 3, 4}));  // X untouched

  SetAttr(&op, "shape", std::vector<int64_t>{4, 0, -1});
  ASSERT_TRUE(exec_.RunOp(op, &scope_).ok());
  EXPECT_EQ(Get("y").shape(), (Shape{4, 3, 2}));

  // In place.
  OpDesc inplace = MakeOp("reshape", {{"X", {"x"}}}, {{"Out", {"x"}}});
  SetAttr(&inplace, "shape", std::vector<int64_t>{24});
  ASSERT_TRUE(exec_.RunOp(inplace, &scope_).ok());
  EXPECT_EQ(Get("x").shape(), (Shape{24}));
}

TEST_F(TensorOpsTest, ReshapeErrors) {
  Feed("x", Iota({2, 3}));
  OpDesc op = MakeOp("reshape", {{"X", {"x"}}}, {{"Out", {"y"}}});
  for (const auto& bad : std::vector<std::vector<int64_t>>{{-1, -1}, {4, -1}, {5}, {1, 1, 0}}) {
    SetAttr(&op, "shape", bad);
    absl::Status s = exec_.RunOp(op, &scope_);
    ASSERT_FALSE(s.ok()) << ShapeString(bad);
    EXPECT_NE(s.message().find(ShapeString(bad)), std::string::npos) << s;
  }
}

TEST_F(TensorOpsTest, ReshapeGradient) {
  OpDesc op = MakeOp("reshape", {{"X", {"x"}}}, {{"Out", {"y"}}});
  SetAttr(&op, "shape", std::vector<int64_t>{-1, 2});
  GradCheckOptions opt;
  opt.wrt = {"x"};
  absl::Status s = CheckGradient(*registry_, op, {{"x", RandomTensor({2, 3, 2}, -1, 1, 5)}}, opt);
  EXPECT_TRUE(s.ok()) << s;
}

TEST_F(TensorOpsTest, CastBetweenTypes) {
  Tensor x(FLOAT64, {4});
  double vals[] = {1.75, -2.5, 3.0, 1e10};
  for (int i = 0; i < 4; ++i) x.data<double>()[i] = vals[i];
  Feed("x", x);
  OpDesc op = MakeOp("cast", {{"X", {"x"}}}, {{"Out", {"f"}}});
  SetAttr(&op, "out_dtype", static_cast<int64_t>(FLOAT32));
  ASSERT_TRUE(exec_.RunOp(op, &scope_).ok());
  EXPECT_EQ(Get("f").dtype(), FLOAT32);
  EXPECT_EQ(Get("f").data<float>()[1], -2.5f);

  OpDesc to_int = MakeOp("cast", {{"X", {"f"}}}, {{"Out", {"i"}}});
  SetAttr(&to_int, "out_dtype", static_cast<int64_t>(INT64));
  ASSERT_TRUE(exec_.RunOp(to_int, &scope_).ok());
  EXPECT_EQ(Get("i").dtype(), INT64);
  EXPECT_EQ(Get("i").data<int64_t>()[0], 1);
  EXPECT_EQ(Get("i").data<int64_t>()[1], -2);
  EXPECT_EQ(Get("i").data<int64_t>()[3], 10000000000);

  OpDesc to_i32 = MakeOp("cast", {{"X", {"i"}}}, {{"Out", {"i"}}});  // in place
  SetAttr(&to_i32, "out_dtype", static_cast<int64_t>(INT32));
  Feed("i", Get("i").Clone());
  scope_.Var("i")->GetMutable<Tensor>()->data<int64_t>()[3] = 7;
  ASSERT_TRUE(exec_.RunOp(to_i32, &scope_).ok());
  EXPECT_EQ(Get("i").dtype(), INT32);
  EXPECT_EQ(Get("i").data<int32_t>()[2], 3);
  EXPECT_EQ(Get("i").data<int32_t>()[3], 7);

  SetAttr(&op, "out_dtype", static_cast<int64_t>(9));
  absl::Status s = exec_.RunOp(op, &scope_);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("out_dtype 9"), std::string::npos) << s;
}

TEST_F(TensorOpsTest, CastGradient) {
  OpDesc op = MakeOp("cast", {{"X", {"x"}}}, {{"Out", {"y"}}});
  SetAttr(&op, "out_dtype", static_cast<int64_t>(FLOAT64));
  GradCheckOptions opt;
  opt.wrt = {"x"};
  absl::Status s = CheckGradient(*registry_, op, {{"x", RandomTensor({5}, -1, 1, 6)}}, opt);
  EXPECT_TRUE(s.ok()) << s;

  // float32 -> float64: the gradient comes back as float32.
  Tensor x(FLOAT32, {2});
  x.data<float>()[0] = 1;
  x.data<float>()[1] = 2;
  Feed("x", x);
  Feed("y@GRAD", Iota({2}, 0.5));
  std::vector<OpDesc> grads = registry_->Find("cast")->grad_maker(op);
  ASSERT_EQ(grads.size(), 1u);
  ASSERT_TRUE(exec_.RunOp(grads[0], &scope_).ok());
  EXPECT_EQ(Get("x@GRAD").dtype(), FLOAT32);
  EXPECT_EQ(Get("x@GRAD").data<float>()[1], 1.5f);

  // No gradient into an integer input.
  Tensor ids(INT64, {2});
  ids.SetZero();
  Feed("x", ids);
  absl::Status bad = exec_.RunOp(grads[0], &scope_);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.message().find("int64"), std::string::npos) << bad;
}

}  // namespace
}  // namespace tessera
