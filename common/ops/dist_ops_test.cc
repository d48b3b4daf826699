#include "common/ops/dist_ops.h"

#include "common/executor.h"
#include "common/ops/ops.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

TEST(DistOpsTest, SplitSelectedRowsRebasesRowsPerSection) {
  auto registry = NewStandardOpRegistry();
  Executor exec(registry.get());
  Scope scope;
  SelectedRows* x = scope.Var("g")->GetMutable<SelectedRows>();
  x->height = 10;
  x->rows = {9, 0, 4, 4, 5};
  x->value.Resize(FLOAT32, {5, 2});
  for (int i = 0; i < 10; ++i) x->value.data<float>()[i] = i;
  OpDesc op = MakeOp("split_selected_rows", {{"X", {"g"}}}, {{"Out", {"a", "b"}}});
  SetAttr(&op, "height_sections", std::vector<int64_t>{5, 5});
  absl::Status s = exec.RunOp(op, &scope);
  ASSERT_TRUE(s.ok()) << s;
  const SelectedRows& a = scope.FindVar("a")->Get<SelectedRows>();
  const SelectedRows& b = scope.FindVar("b")->Get<SelectedRows>();
  EXPECT_EQ(a.rows, (std::vector<int64_t>{0, 4, 4}));
  EXPECT_EQ(b.rows, (std::vector<int64_t>{4, 0}));
  EXPECT_EQ(a.height, 5);
  EXPECT_EQ(a.value.data<float>()[0], 2.0f);  // row 0 came from input position 1
  EXPECT_EQ(a.value.data<float>()[2], 4.0f);  // first row 4 from input position 2
  EXPECT_EQ(b.value.data<float>()[0], 0.0f);  // row 9 -> 4, input position 0
  EXPECT_EQ(b.value.data<float>()[3], 9.0f);  // row 5 -> 0, input position 4

  SetAttr(&op, "height_sections", std::vector<int64_t>{5, 4});
  s = exec.RunOp(op, &scope);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("height 10"), std::string::npos) << s;
}

}  // namespace
}  // namespace tessera
