#include "common/ops/embedding_ops.h"

#include "common/framework/executor.h"
#include "common/ops/grad_check.h"
#include "common/ops/ops.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

Tensor Ids(const std::vector<int64_t>& ids, bool column = true) {
  Shape shape = {static_cast<int64_t>(ids.size())};
  if (column) shape.push_back(1);
  Tensor t(INT64, shape);
  for (size_t i = 0; i < ids.size(); ++i) t.data<int64_t>()[i] = ids[i];
  return t;
}

class EmbeddingOpsTest : public ::testing::Test {
 protected:
  void Feed(const std::string& name, const Tensor& t) {
    scope_.Var(name)->GetMutable<Tensor>()->CopyFrom(t);
  }
  OpDesc Lookup(bool is_sparse, int64_t padding_idx = -1) {
    OpDesc op = MakeOp("lookup_table", {{"W", {"w"}}, {"Ids", {"ids"}}}, {{"Out", {"out"}}});
    SetAttr(&op, "is_sparse", is_sparse);
    if (padding_idx != -1) SetAttr(&op, "padding_idx", padding_idx);
    return op;
  }
  // Runs lookup_table's gradient ops with Out@GRAD = `dout`.
  absl::Status RunGrad(const OpDesc& fwd, const Tensor& dout) {
    Feed("out@GRAD", dout);
    for (const OpDesc& g : registry_->Find("lookup_table")->grad_maker(fwd)) {
      absl::Status s = exec_.RunOp(g, &scope_);
      if (!s.ok()) return s;
    }
    return absl::OkStatus();
  }

  std::unique_ptr<OpRegistry> registry_ = NewStandardOpRegistry();
  Executor exec_{registry_.get()};
  Scope scope_;
};

TEST_F(EmbeddingOpsTest, LooksUpRowsWithPadding) {
  Tensor w = RandomTensor({5, 3}, -1, 1, 1);
  Feed("w", w);
  Feed("ids", Ids({4, 0, 4, 2}));
  ASSERT_TRUE(exec_.RunOp(Lookup(false, 2), &scope_).ok());
  const Tensor& out = scope_.FindVar("out")->Get<Tensor>();
  ASSERT_EQ(out.shape(), (Shape{4, 3}));
  const double* o = out.data<double>();
  const double* wd = w.data<double>();
  for (int j = 0; j < 3; ++j) {
    EXPECT_EQ(o[0 * 3 + j], wd[4 * 3 + j]);
    EXPECT_EQ(o[1 * 3 + j], wd[0 * 3 + j]);
    EXPECT_EQ(o[2 * 3 + j], wd[4 * 3 + j]);
    EXPECT_EQ(o[3 * 3 + j], 0.0);  // padding id 2
  }
  // Ids of shape [N] give [N, D] too; float32 tables work.
  Tensor wf(FLOAT32, {5, 3});
  for (int i = 0; i < 15; ++i) wf.data<float>()[i] = i;
  Feed("w", wf);
  Feed("ids", Ids({1, 3}, /*column=*/false));
  ASSERT_TRUE(exec_.RunOp(Lookup(false), &scope_).ok());
  const Tensor& outf = scope_.FindVar("out")->Get<Tensor>();
  ASSERT_EQ(outf.shape(), (Shape{2, 3}));
  EXPECT_EQ(outf.data<float>()[0], 3.0f);
  EXPECT_EQ(outf.data<float>()[5], 11.0f);
}

TEST_F(EmbeddingOpsTest, OutOfRangeIdNamesIdPositionAndVocabulary) {
  Feed("w", RandomTensor({5, 3}, -1, 1, 1));
  Feed("ids", Ids({1, 2, 7}));
  absl::Status s = exec_.RunOp(Lookup(false), &scope_);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("id 7"), std::string::npos) << s;
  EXPECT_NE(s.message().find("position 2"), std::string::npos) << s;
  EXPECT_NE(s.message().find("[0, 5)"), std::string::npos) << s;
  EXPECT_NE(s.message().find("'ids'"), std::string::npos) << s;

  Feed("ids", Ids({-1}));
  EXPECT_FALSE(exec_.RunOp(Lookup(false), &scope_).ok());

  Tensor wrong_type(INT32, {1, 1});
  wrong_type.SetZero();
  Feed("ids", wrong_type);
  s = exec_.RunOp(Lookup(false), &scope_);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("int32"), std::string::npos) << s;
}

TEST_F(EmbeddingOpsTest, DenseAndSparseGradientsWithRepeatedIds) {
  for (bool is_sparse : {false, true}) {
    for (int64_t padding : {int64_t{-1}, int64_t{3}}) {
      GradCheckOptions opt;
      opt.wrt = {"w"};
      absl::Status s = CheckGradient(
          *registry_, Lookup(is_sparse, padding),
          {{"w", RandomTensor({6, 4}, -1, 1, 2)}, {"ids", Ids({5, 1, 5, 3, 0, 5, 3})}}, opt);
      EXPECT_TRUE(s.ok()) << "is_sparse=" << is_sparse << " padding=" << padding << ": " << s;
    }
  }
}

TEST_F(EmbeddingOpsTest, SparseGradientKeepsBatchOrderAndDuplicates) {
  Feed("w", RandomTensor({6, 2}, -1, 1, 1));
  Feed("ids", Ids({5, 1, 5, 2}));
  Tensor dout = RandomTensor({4, 2}, -1, 1, 3);
  ASSERT_TRUE(RunGrad(Lookup(true, 2), dout).ok());
  const SelectedRows& g = scope_.FindVar("w@GRAD")->Get<SelectedRows>();
  EXPECT_EQ(g.rows, (std::vector<int64_t>{5, 1, 5}));  // padding id 2 dropped
  EXPECT_EQ(g.height, 6);
  ASSERT_EQ(g.value.shape(), (Shape{3, 2}));
  for (int i = 0; i < 6; ++i) EXPECT_EQ(g.value.data<double>()[i], dout.data<double>()[i]);

  // Dense: zero except the scatter-added rows.
  ASSERT_TRUE(RunGrad(Lookup(false), dout).ok());
  const Tensor& d = scope_.FindVar("w@GRAD")->Get<Tensor>();
  ASSERT_EQ(d.shape(), (Shape{6, 2}));
  const double* o = dout.data<double>();
  EXPECT_DOUBLE_EQ(d.data<double>()[5 * 2 + 1], o[0 * 2 + 1] + o[2 * 2 + 1]);
  EXPECT_DOUBLE_EQ(d.data<double>()[2 * 2 + 0], o[3 * 2 + 0]);
  EXPECT_EQ(d.data<double>()[0], 0.0);
  EXPECT_EQ(d.data<double>()[4 * 2 + 1], 0.0);
}

TEST_F(EmbeddingOpsTest, GradientRejectsMismatchedOutGrad) {
  Feed("w", RandomTensor({6, 2}, -1, 1, 1));
  Feed("ids", Ids({5, 1}));
  absl::Status s = RunGrad(Lookup(true), RandomTensor({3, 2}, -1, 1, 3));
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("out@GRAD"), std::string::npos) << s;
}

}  // namespace
}  // namespace tessera
