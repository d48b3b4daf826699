#include "common/ops/sequence_ops.h"

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "common/framework/executor.h"
#include "common/framework/op_desc.h"
#include "common/ops/ops.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

class SequencePoolTest : public ::testing::Test {
 protected:
  // X: 4 rows of width 2 in 3 sequences of 2, 0 and 2 rows.
  void SetUp() override {
    Tensor* x = scope_.Var("x")->GetMutable<Tensor>();
    x->Resize(FLOAT32, {4, 2});
    const float v[] = {1, 5, 3, -1, 2, 2, -4, 6};
    for (int i = 0; i < 8; ++i) x->data<float>()[i] = v[i];
    x->set_lod({0, 2, 2, 4});
  }
  std::vector<float> Values(const std::string& name) {
    const Tensor& t = scope_.FindVar(name)->Get<Tensor>();
    return std::vector<float>(t.data<float>(), t.data<float>() + t.numel());
  }
  absl::Status Pool(const std::string& type) {
    OpDesc op = MakeOp("sequence_pool", {{"X", {"x"}}}, {{"Out", {"out"}}});
    SetAttr(&op, "pooltype", type);
    return exec_.RunOp(op, &scope_);
  }
  // X@GRAD for Out@GRAD = [[1, 2], [3, 4], [5, 6]].
  std::vector<float> Grad(const std::string& type) {
    Tensor* g = scope_.Var("out@GRAD")->GetMutable<Tensor>();
    g->Resize(FLOAT32, {3, 2});
    for (int i = 0; i < 6; ++i) g->data<float>()[i] = static_cast<float>(i + 1);
    OpDesc op = MakeOp("sequence_pool_grad", {{"X", {"x"}}, {"Out@GRAD", {"out@GRAD"}}},
                       {{"X@GRAD", {"x@GRAD"}}});
    SetAttr(&op, "pooltype", type);
    absl::Status s = exec_.RunOp(op, &scope_);
    EXPECT_TRUE(s.ok()) << s;
    return Values("x@GRAD");
  }

  std::unique_ptr<OpRegistry> registry_ = NewStandardOpRegistry();
  Executor exec_{registry_.get()};
  Scope scope_;
};

TEST_F(SequencePoolTest, PoolsEachSequenceAndEmptyOnesToZero) {
  ASSERT_TRUE(Pool("SUM").ok());
  EXPECT_EQ(scope_.FindVar("out")->Get<Tensor>().shape(), (Shape{3, 2}));
  EXPECT_EQ(Values("out"), (std::vector<float>{4, 4, 0, 0, -2, 8}));
  ASSERT_TRUE(Pool("AVERAGE").ok());
  EXPECT_EQ(Values("out"), (std::vector<float>{2, 2, 0, 0, -1, 4}));
  ASSERT_TRUE(Pool("MAX").ok());
  EXPECT_EQ(Values("out"), (std::vector<float>{3, 5, 0, 0, 2, 6}));
  ASSERT_TRUE(Pool("SQRT").ok());
  const float r2 = std::sqrt(2.0f);
  const std::vector<float> sqrt_pooled = Values("out");
  EXPECT_FLOAT_EQ(sqrt_pooled[0], 4 / r2);
  EXPECT_FLOAT_EQ(sqrt_pooled[5], 8 / r2);
  EXPECT_TRUE(scope_.FindVar("out")->Get<Tensor>().lod().empty());
}

TEST_F(SequencePoolTest, GradientsFollowThePooling) {
  EXPECT_EQ(Grad("SUM"), (std::vector<float>{1, 2, 1, 2, 5, 6, 5, 6}));
  EXPECT_EQ(Grad("AVERAGE"), (std::vector<float>{0.5, 1, 0.5, 1, 2.5, 3, 2.5, 3}));
  // Max of column 0: row 1 (3) and row 2 (2); of column 1: row 0 (5) and row 3 (6).
  EXPECT_EQ(Grad("MAX"), (std::vector<float>{0, 2, 1, 0, 5, 0, 0, 6}));
}

TEST_F(SequencePoolTest, RefusesInputWithoutSequencesOrUnknownType) {
  absl::Status s = Pool("MEDIAN");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("pooltype 'MEDIAN' is unknown"), absl::string_view::npos) << s;
  scope_.Var("x")->GetMutable<Tensor>()->set_lod({});
  s = Pool("SUM");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("holds no sequences"), absl::string_view::npos) << s;
  scope_.Var("x")->GetMutable<Tensor>()->set_lod({0, 3});
  s = Pool("SUM");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("do not cover them"), absl::string_view::npos) << s;
}

// lookup_table keeps the sequences of its ids, so its output can be pooled.
TEST_F(SequencePoolTest, LookupKeepsTheSequencesOfItsIds) {
  Tensor* w = scope_.Var("w")->GetMutable<Tensor>();
  w->Resize(FLOAT32, {3, 1});
  for (int i = 0; i < 3; ++i) w->data<float>()[i] = static_cast<float>(10 * i);
  Tensor* ids = scope_.Var("ids")->GetMutable<Tensor>();
  ids->Resize(INT64, {3, 1});
  for (int i = 0; i < 3; ++i) ids->data<int64_t>()[i] = 2 - i;
  ids->set_lod({0, 0, 3});
  ASSERT_TRUE(
      exec_.RunOp(MakeOp("lookup_table", {{"W", {"w"}}, {"Ids", {"ids"}}}, {{"Out", {"emb"}}}),
                  &scope_)
          .ok());
  EXPECT_EQ(scope_.FindVar("emb")->Get<Tensor>().lod(), (std::vector<int64_t>{0, 0, 3}));
  OpDesc pool = MakeOp("sequence_pool", {{"X", {"emb"}}}, {{"Out", {"pooled"}}});
  SetAttr(&pool, "pooltype", "SUM");
  ASSERT_TRUE(exec_.RunOp(pool, &scope_).ok());
  EXPECT_EQ(Values("pooled"), (std::vector<float>{0, 30}));
}

}  // namespace
}  // namespace tessera
