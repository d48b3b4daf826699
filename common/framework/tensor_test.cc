#include "common/framework/tensor.h"

#include "common/framework/scope.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {


TEST(TensorTest, OuterAndInnerElements) {
  const Shape s = {2, 3, 4, 5};
  EXPECT_EQ(OuterElements(s, 0), 1);
  EXPECT_EQ(InnerElements(s, 0), 60);
  EXPECT_EQ(OuterElements(s, 2), 6);
  EXPECT_EQ(InnerElements(s, 2), 5);
  EXPECT_EQ(InnerElements(s, 3), 1);
}

TEST(TensorTest, ResizeReusesBufferWhenLargeEnough) {
  Tensor t(FLOAT32, {4, 8});
  float* p = t.data<float>();
  t.Resize(FLOAT32, {2, 8});
  EXPECT_EQ(t.data<float>(), p);
  EXPECT_EQ(t.numel(), 16);
  t.Resize(FLOAT32, {64, 8});
  EXPECT_EQ(t.numel(), 512);
}

TEST(TensorTest, CopyIsShallowCloneIsDeep) {
  Tensor a(FLOAT64, {3});
  a.flat<double>().setConstant(2.0);
  Tensor shared = a;
  Tensor deep = a.Clone();
  a.data<double>()[0] = 5.0;
  EXPECT_EQ(shared.data<double>()[0], 5.0);
  EXPECT_EQ(deep.data<double>()[0], 2.0);
}

TEST(TensorTest, ResizeKeepsContentsUnlessItGrows) {
  Tensor a(FLOAT32, {2});
  a.flat<float>().setConstant(1.0f);
  Tensor b = a;  // aliases a
  b.Resize(FLOAT32, {2});
  EXPECT_EQ(b.data<float>()[1], 1.0f);
  b.flat<float>().setConstant(3.0f);
  EXPECT_EQ(a.data<float>()[0], 3.0f);
  b.Resize(FLOAT32, {1024});  // grows: b gets its own buffer, a keeps the old one
  b.flat<float>().setConstant(4.0f);
  EXPECT_EQ(a.data<float>()[0], 3.0f);
}

TEST(TensorTest, MatrixView) {
  Tensor t(FLOAT32, {2, 3, 4});
  EXPECT_EQ(t.matrix<float>(1).rows(), 2);
  EXPECT_EQ(t.matrix<float>(1).cols(), 12);
  EXPECT_EQ(t.matrix<float>(2).rows(), 6);
}

TEST(TensorTest, ReshapeChecksElementCount) {
  Tensor t(INT64, {2, 3});
  EXPECT_TRUE(t.Reshape({3, 2}).ok());
  absl::Status s = t.Reshape({4, 2});
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("[4, 2]"), std::string::npos);
}

TEST(TensorTest, ProtoRoundTripAndBadProto) {
  Tensor t(INT64, {2, 2});
  for (int i = 0; i < 4; ++i) t.data<int64_t>()[i] = -i * 1000000000000LL;
  TensorProto p;
  TensorToProto(t, &p);
  Tensor back;
  ASSERT_TRUE(TensorFromProto(p, &back).ok());
  EXPECT_EQ(back.shape(), t.shape());
  EXPECT_EQ(back.data<int64_t>()[3], -3000000000000LL);

  p.mutable_data()->resize(5);
  EXPECT_FALSE(TensorFromProto(p, &back).ok());
  p.add_dims(-1);
  EXPECT_FALSE(TensorFromProto(p, &back).ok());
}

TEST(ScopeTest, ChildFallsBackToParent) {
  Scope root;
  root.Var("w")->GetMutable<Tensor>()->Resize(FLOAT32, {1});
  Scope* kid = root.NewScope();
  EXPECT_EQ(kid->FindVar("w"), root.FindVar("w"));
  EXPECT_EQ(kid->FindLocalVar("w"), nullptr);
  kid->Var("tmp");
  EXPECT_EQ(root.FindVar("tmp"), nullptr);
  EXPECT_EQ(kid->LocalVarNames(), std::vector<std::string>{"tmp"});
  root.DeleteScope(kid);
  root.EraseVars({"w"});
  EXPECT_EQ(root.FindVar("w"), nullptr);
}

}  // namespace
}  // namespace tessera
