#include "common/framework/executor.h"

#include "common/ops/ops.h"
#include "common/framework/program_io.h"
#include "common/base/status.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

class ExecutorTest : public ::testing::Test {
 protected:
  std::unique_ptr<OpRegistry> registry_ = NewStandardOpRegistry();
  Executor exec_{registry_.get()};
};

ProgramDesc OneBlock() {
  ProgramDesc p;
  p.add_blocks()->set_parent_idx(-1);
  return p;
}

TEST_F(ExecutorTest, RunsOpsInOrder) {
  ProgramDesc p = OneBlock();
  OpDesc fill = MakeOp("fill_constant", {}, {{"Out", {"a"}}});
  SetAttr(&fill, "shape", std::vector<int64_t>{3});
  SetAttr(&fill, "value", 2.0f);
  OpDesc scale = MakeOp("scale", {{"X", {"a"}}}, {{"Out", {"b"}}});
  SetAttr(&scale, "scale", 3.0f);
  *p.mutable_blocks(0)->add_ops() = fill;
  *p.mutable_blocks(0)->add_ops() = scale;
  Scope scope;
  ASSERT_TRUE(exec_.Run(p, 0, &scope).ok());
  EXPECT_EQ(scope.FindVar("b")->Get<Tensor>().data<float>()[2], 6.0f);
}

TEST_F(ExecutorTest, RunOpsRunsARangeInTwoScopesAndRefusesBadRanges) {
  ProgramDesc p = OneBlock();
  OpDesc fill = MakeOp("fill_constant", {}, {{"Out", {"a"}}});
  SetAttr(&fill, "shape", std::vector<int64_t>{2});
  SetAttr(&fill, "value", 2.0f);
  OpDesc scale = MakeOp("scale", {{"X", {"a"}}}, {{"Out", {"b"}}});
  SetAttr(&scale, "scale", 3.0f);
  *p.mutable_blocks(0)->add_ops() = fill;
  *p.mutable_blocks(0)->add_ops() = scale;
  auto prepared = exec_.Prepare(p, 0);
  ASSERT_TRUE(prepared.ok());
  Scope first, second;
  ASSERT_TRUE(exec_.RunOps(*prepared, 0, 1, &first).ok());
  EXPECT_EQ(first.FindVar("b"), nullptr);  // op 1 did not run
  // Op 1 alone in another scope: its input is not there.
  absl::Status s = exec_.RunOps(*prepared, 1, 2, &second);
  EXPECT_NE(s.message().find("op #1 scale"), std::string::npos) << s;
  ASSERT_TRUE(exec_.RunOps(*prepared, 1, 2, &first).ok());
  EXPECT_EQ(first.FindVar("b")->Get<Tensor>().data<float>()[1], 6.0f);
  for (auto [begin, end] : {std::pair{-1, 1}, std::pair{0, 3}, std::pair{2, 1}}) {
    s = exec_.RunOps(*prepared, begin, end, &first);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << begin << " " << end;
    EXPECT_NE(s.message().find("block of 2 ops"), std::string::npos) << s;
  }
}

// Runs resolve each op's variables once per scope (PreparedBlock::args) and must notice every
// change that would make a lookup find another variable.
TEST_F(ExecutorTest, CachedArgumentsFollowCreatedErasedAndShadowedVariables) {
  ProgramDesc p = OneBlock();
  OpDesc scale = MakeOp("scale", {{"X", {"a"}}}, {{"Out", {"b"}}});
  SetAttr(&scale, "scale", 3.0f);
  *p.mutable_blocks(0)->add_ops() = scale;
  auto prepared = exec_.Prepare(p, 0);
  ASSERT_TRUE(prepared.ok());
  auto set = [](Scope* s, const char* name, float v) {
    Tensor* t = s->Var(name)->GetMutable<Tensor>();
    t->Resize(FLOAT32, {1});
    t->data<float>()[0] = v;
  };
  auto b_of = [](const Scope& s) { return s.FindVar("b")->Get<Tensor>().data<float>()[0]; };

  Scope parent;
  set(&parent, "a", 2);
  Scope* child = parent.NewScope();
  ASSERT_TRUE(exec_.Run(*prepared, child).ok());
  EXPECT_EQ(b_of(*child), 6.0f);
  ASSERT_TRUE(exec_.Run(*prepared, child).ok());  // cached
  EXPECT_EQ(b_of(*child), 6.0f);
  set(child, "a", 5);  // now shadows the parent's
  ASSERT_TRUE(exec_.Run(*prepared, child).ok());
  EXPECT_EQ(b_of(*child), 15.0f);
  child->EraseVars({"a"});  // the parent's again
  ASSERT_TRUE(exec_.Run(*prepared, child).ok());
  EXPECT_EQ(b_of(*child), 6.0f);
  parent.EraseVars({"a"});  // an ancestor's change
  set(&parent, "a", 7);
  ASSERT_TRUE(exec_.Run(*prepared, child).ok());
  EXPECT_EQ(b_of(*child), 21.0f);
  parent.EraseVars({"a"});
  absl::Status s = exec_.Run(*prepared, child);
  EXPECT_NE(s.message().find("'a' is absent"), std::string::npos) << s;
  // Scopes come and go (an address may be reused): each is resolved afresh.
  for (float v : {1.0f, 4.0f, 8.0f}) {
    auto scope = std::make_unique<Scope>();
    set(scope.get(), "a", v);
    ASSERT_TRUE(exec_.Run(*prepared, scope.get()).ok());
    EXPECT_EQ(b_of(*scope), 3 * v);
  }
}

TEST_F(ExecutorTest, UnknownOpIsNamed) {
  ProgramDesc p = OneBlock();
  *p.mutable_blocks(0)->add_ops() = MakeOp("frobnicate", {}, {});
  Scope scope;
  absl::Status s = exec_.Run(p, 0, &scope);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_NE(s.message().find("'frobnicate'"), std::string::npos) << s;
}

TEST_F(ExecutorTest, MissingInputNamesOpAndVariable) {
  ProgramDesc p = OneBlock();
  *p.mutable_blocks(0)->add_ops() = MakeOp("scale", {{"X", {"nowhere"}}}, {{"Out", {"b"}}});
  Scope scope;
  absl::Status s = exec_.Run(p, 0, &scope);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("op #0 scale"), std::string::npos) << s;
  EXPECT_NE(s.message().find("'nowhere'"), std::string::npos) << s;
}

TEST_F(ExecutorTest, ErrorOfAnOpWithManyInputsLeadsWithTheCauseOnAShortLine) {
  std::vector<std::string> inputs;
  Scope scope;
  for (int i = 0; i < 100; ++i) {
    inputs.push_back("a_rather_long_gradient_name_" + std::to_string(i) + "@GRAD");
    if (i != 57) scope.Var(inputs.back())->GetMutable<Tensor>()->Resize(FLOAT32, {2});
  }
  absl::Status s = exec_.RunOp(MakeOp("sum", {{"X", inputs}}, {{"Out", {"total"}}}), &scope);
  ASSERT_FALSE(s.ok());
  const std::string m(s.message());
  EXPECT_LE(m.size(), 400u) << m;
  EXPECT_EQ(m.find('\n'), std::string::npos) << m;
  // The cause (the missing variable) comes before the op, which is named by type and index.
  const size_t cause = m.find("a_rather_long_gradient_name_57@GRAD");
  const size_t op = m.find("(op #0 sum(X=a_rather_long_gradient_name_0@GRAD,");
  ASSERT_NE(cause, std::string::npos) << m;
  ASSERT_NE(op, std::string::npos) << m;
  EXPECT_LT(cause, op) << m;
  EXPECT_NE(m.find("... and 97 more)"), std::string::npos) << m;
  // The op in full rides along for a verbose log: every input, and the outputs.
  const std::string detail = ErrorDetail(s);
  EXPECT_EQ(detail.rfind("op #0 sum(X=a_rather_long_gradient_name_0@GRAD,", 0), 0u) << detail;
  EXPECT_NE(detail.find("a_rather_long_gradient_name_99@GRAD) -> (Out=total)"), std::string::npos)
      << detail;
  EXPECT_EQ(ErrorDetail(absl::InternalError("no op")), "");
}

TEST(OpBriefTest, ShowsAtMostThreeInputs) {
  EXPECT_EQ(OpBrief(MakeOp("mul", {{"X", {"a"}}, {"Y", {"b"}}}, {{"Out", {"c"}}})),
            "mul(X=a, Y=b)");
  EXPECT_EQ(OpBrief(MakeOp("send", {{"X", {"a", "b", "c", "d"}}}, {})),
            "send(X=a,b,c ... and 1 more)");
  EXPECT_EQ(OpBrief(MakeOp("f", {{"X", {"a", "b"}}, {"Y", {"c", "d"}}}, {})),
            "f(X=a,b, Y=c ... and 1 more)");
  EXPECT_EQ(OpBrief(MakeOp("send_barrier", {}, {})), "send_barrier()");
}

TEST_F(ExecutorTest, WrongAttrTypeIsReported) {
  OpDesc scale = MakeOp("scale", {{"X", {"a"}}}, {{"Out", {"b"}}});
  SetAttr(&scale, "scale", "three");
  Scope scope;
  scope.Var("a")->GetMutable<Tensor>()->Resize(FLOAT32, {1});
  absl::Status s = exec_.RunOp(scale, &scope);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("'scale'"), std::string::npos) << s;
}

TEST_F(ExecutorTest, ProgramTextRoundTripAndParseErrors) {
  ProgramDesc p = OneBlock();
  OpDesc fill = MakeOp("fill_constant", {}, {{"Out", {"a"}}});
  SetAttr(&fill, "shape", std::vector<int64_t>{3});
  *p.mutable_blocks(0)->add_ops() = fill;
  std::string text = ProgramToText(p);
  auto back = ParseProgramText(text, "p.pbtxt");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(ProgramToText(*back), text);

  auto bad = ParseProgramText("blocks {\n  ops { type: \"x\" \n", "bad.pbtxt");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message().find('\n'), std::string::npos);
  EXPECT_EQ(bad.status().message().rfind("bad.pbtxt:", 0), 0u) << bad.status();

  auto unknown_field = ParseProgramText("blocks { opz {} }", "u.pbtxt");
  ASSERT_FALSE(unknown_field.ok());
  EXPECT_NE(unknown_field.status().message().find("u.pbtxt:1:"), std::string::npos)
      << unknown_field.status();
}

}  // namespace
}  // namespace tessera
