#include "common/layers/memory_optimize.h"

#include <cstring>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/framework/executor.h"
#include "common/framework/op_desc.h"
#include "common/ops/grad_check.h"
#include "common/ops/ops.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

using Renames = std::vector<std::pair<std::string, std::string>>;

VarDesc* AddVar(ProgramDesc* p, const std::string& name, const Shape& shape,
                DataType dtype = FLOAT64, bool persistable = false, VarType type = DENSE_TENSOR) {
  VarDesc* v = p->mutable_blocks(0)->add_vars();
  v->set_name(name);
  for (int64_t d : shape) v->add_shape(d);
  v->set_dtype(dtype);
  v->set_persistable(persistable);
  v->set_type(type);
  return v;
}

void AddOp(ProgramDesc* p, OpDesc op) { *p->mutable_blocks(0)->add_ops() = std::move(op); }

OpDesc Fill(const std::string& out, const Shape& shape, float value, DataType dtype = FLOAT64) {
  OpDesc op = MakeOp("fill_constant", {}, {{"Out", {out}}});
  SetAttr(&op, "shape", std::vector<int64_t>(shape));
  SetAttr(&op, "value", value);
  SetAttr(&op, "dtype", static_cast<int64_t>(dtype));
  return op;
}

OpDesc ScaleOp(const std::string& x, const std::string& out, float scale, float bias = 0.0f) {
  OpDesc op = MakeOp("scale", {{"X", {x}}}, {{"Out", {out}}});
  SetAttr(&op, "scale", scale);
  SetAttr(&op, "bias", bias);
  return op;
}

OpDesc SumOp(const std::vector<std::string>& xs, const std::string& out) {
  return MakeOp("sum", {{"X", xs}}, {{"Out", {out}}});
}

ProgramDesc NewProgram() {
  ProgramDesc p;
  p.add_blocks()->set_parent_idx(-1);
  return p;
}

bool Declared(const ProgramDesc& p, const std::string& name) {
  return FindVarDesc(p.blocks(0), name) != nullptr;
}

bool IsGrad(const std::string& name) {
  return IsGradVarName(name) || absl::StrContains(name, "@GRAD@");
}

bool SameTensor(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() &&
         std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0;
}

::testing::AssertionResult SameVar(const Scope& sa, const std::string& a, const Scope& sb,
                                   const std::string& b) {
  const Variable* va = sa.FindVar(a);
  const Variable* vb = sb.FindVar(b);
  if (va == nullptr || !va->Is<Tensor>()) {
    return ::testing::AssertionFailure() << "'" << a << "' missing in the original run";
  }
  if (vb == nullptr || !vb->Is<Tensor>()) {
    return ::testing::AssertionFailure() << "'" << b << "' missing in the optimized run";
  }
  if (!SameTensor(va->Get<Tensor>(), vb->Get<Tensor>())) {
    return ::testing::AssertionFailure()
           << "'" << a << "' (original) " << va->Get<Tensor>().DebugString() << " differs from '"
           << b << "' (optimized) " << vb->Get<Tensor>().DebugString();
  }
  return ::testing::AssertionSuccess();
}

// Runs `original` and `optimized` side by side, op by op, `steps` times, on scopes seeded with
// `feeds`. After every op, each variable the original op wrote must equal the optimized
// program's variable it was renamed to (so every live value agrees). At the end, every variable
// of the original program that the pass neither renamed nor reused must agree, also in a third
// scope where the optimized program ran through Executor::Run.
::testing::AssertionResult RunsAgree(const OpRegistry& registry, const ProgramDesc& original,
                                     const ProgramDesc& optimized, const Renames& renames,
                                     const std::map<std::string, Tensor>& feeds, int steps = 2) {
  const BlockDesc& ob = original.blocks(0);
  const BlockDesc& nb = optimized.blocks(0);
  if (ob.ops_size() != nb.ops_size()) {
    return ::testing::AssertionFailure() << "op count changed";
  }
  std::map<std::string, std::string> to(renames.begin(), renames.end());
  std::set<std::string> touched;
  for (const auto& [from, slot] : renames) touched.insert({from, slot});
  auto target = [&](const std::string& v) { return to.count(v) ? to[v] : v; };

  Executor exec(&registry);
  Scope s_orig, s_opt, s_run;
  for (Scope* s : {&s_orig, &s_opt, &s_run}) {
    for (const auto& [name, t] : feeds) s->Var(name)->GetMutable<Tensor>()->CopyFrom(t);
  }
  CreateBlockVariables(ob, &s_orig);
  CreateBlockVariables(nb, &s_opt);
  for (int step = 0; step < steps; ++step) {
    for (int i = 0; i < ob.ops_size(); ++i) {
      if (ob.ops(i).type() != nb.ops(i).type()) {
        return ::testing::AssertionFailure() << "op #" << i << " changed type";
      }
      absl::Status s = exec.RunOp(ob.ops(i), &s_orig);
      if (!s.ok()) return ::testing::AssertionFailure() << "original op #" << i << ": " << s;
      s = exec.RunOp(nb.ops(i), &s_opt);
      if (!s.ok()) return ::testing::AssertionFailure() << "optimized op #" << i << ": " << s;
      for (const auto& out : AllOutputArgs(ob.ops(i))) {
        if (out == kEmptyVarName) continue;
        auto r = SameVar(s_orig, out, s_opt, target(out));
        if (!r) {
          return r << " after op #" << i << " " << OpSignature(nb.ops(i)) << ", step " << step;
        }
      }
    }
    absl::Status s = exec.Run(optimized, 0, &s_run);
    if (!s.ok()) return ::testing::AssertionFailure() << "Executor::Run(optimized): " << s;
  }
  for (const auto& v : ob.vars()) {
    if (touched.count(v.name()) > 0) continue;
    if (s_orig.FindVar(v.name()) == nullptr || !s_orig.FindVar(v.name())->Is<Tensor>()) continue;
    for (const Scope* s : {&s_opt, &s_run}) {
      auto r = SameVar(s_orig, v.name(), *s, v.name());
      if (!r) return r << " at the end";
    }
  }
  return ::testing::AssertionSuccess();
}

class MemoryOptimizeTest : public ::testing::Test {
 protected:
  // a = 1.5; b = 2a; c = b + 1; d = c + w; loss = d / 2 (all float64 [4, 3]; w a parameter).
  static ProgramDesc Chain() {
    ProgramDesc p = NewProgram();
    AddVar(&p, "w", {4, 3}, FLOAT64, /*persistable=*/true);
    for (const char* v : {"a", "b", "c", "d", "loss"}) AddVar(&p, v, {4, 3});
    AddOp(&p, Fill("a", {4, 3}, 1.5f));
    AddOp(&p, ScaleOp("a", "b", 2.0f));
    AddOp(&p, ScaleOp("b", "c", 1.0f, 1.0f));
    AddOp(&p, SumOp({"c", "w"}, "d"));
    AddOp(&p, ScaleOp("d", "loss", 0.5f));
    return p;
  }

  absl::StatusOr<MemoryOptimizeStats> Optimize(ProgramDesc* p, MemoryOptimizeOptions opts = {}) {
    return MemoryOptimize(p, opts);
  }

  std::unique_ptr<OpRegistry> registry_ = NewStandardOpRegistry();
  Executor exec_{registry_.get()};
};

TEST_F(MemoryOptimizeTest, ChainReusesDeadBuffers) {
  ProgramDesc original = Chain();
  ProgramDesc p = original;
  MemoryOptimizeOptions opts;
  opts.skip_vars = {"loss"};
  auto stats = Optimize(&p, opts);
  ASSERT_TRUE(stats.ok()) << stats.status();
  // a dies at op 1 and b at op 2: c (defined at op 2) takes a, d (op 3) takes b.
  EXPECT_EQ(stats->renames, (Renames{{"c", "a"}, {"d", "b"}}));
  EXPECT_EQ(stats->vars_reused, 2);
  EXPECT_EQ(stats->num_candidates, 4);  // a, b, c, d (w is persistable, loss skipped)
  EXPECT_EQ(stats->bytes_saved_per_example, 2 * 12 * 8);
  EXPECT_EQ(p.blocks(0).vars_size(), original.blocks(0).vars_size() - 2);
  EXPECT_FALSE(Declared(p, "c"));
  EXPECT_FALSE(Declared(p, "d"));
  const BlockDesc& b = p.blocks(0);
  EXPECT_EQ(OpOutput(b.ops(1), "Out"), "b");  // b is not merged into a, read by the same op
  EXPECT_EQ(OpOutput(b.ops(2), "Out"), "a");
  EXPECT_EQ(OpInputs(b.ops(3), "X"), (std::vector<std::string>{"a", "w"}));
  EXPECT_EQ(OpOutput(b.ops(3), "Out"), "b");
  EXPECT_EQ(OpInput(b.ops(4), "X"), "b");
  EXPECT_EQ(OpOutput(b.ops(4), "Out"), "loss");

  Tensor w = RandomTensor({4, 3}, -1, 1, 7);
  EXPECT_TRUE(RunsAgree(*registry_, original, p, stats->renames, {{"w", w}}));

  // Hand-computed: loss = (2 * 1.5 + 1 + w) / 2.
  Scope scope;
  scope.Var("w")->GetMutable<Tensor>()->CopyFrom(w);
  ASSERT_TRUE(exec_.Run(p, 0, &scope).ok());
  const Tensor& loss = scope.FindVar("loss")->Get<Tensor>();
  for (int i = 0; i < 12; ++i) {
    EXPECT_DOUBLE_EQ(loss.data<double>()[i], 0.5 * (4.0 + w.data<double>()[i]));
  }
}

TEST_F(MemoryOptimizeTest, OnlySameDtypeAndShapeAreMerged) {
  ProgramDesc p = NewProgram();
  AddVar(&p, "a", {4, 3});
  AddVar(&p, "b", {-1, 3});          // batch dim vs 4: different shape
  AddVar(&p, "c", {4, 3}, FLOAT32);  // same shape as a, other dtype
  AddVar(&p, "d", {3, 4});           // same size as a, other shape
  AddVar(&p, "e", {-1, 3});          // -1 == -1: may take b
  AddVar(&p, "f", {4, 3});           // may take a
  for (int i = 1; i <= 6; ++i) AddVar(&p, absl::StrCat("s", i), {});
  AddOp(&p, Fill("a", {4, 3}, 1));
  AddOp(&p, ScaleOp("a", "s1", 1));
  AddOp(&p, Fill("b", {3, 3}, 2));
  AddOp(&p, ScaleOp("b", "s2", 1));
  AddOp(&p, Fill("c", {4, 3}, 3, FLOAT32));
  AddOp(&p, ScaleOp("c", "s3", 1));
  AddOp(&p, Fill("d", {3, 4}, 4));
  AddOp(&p, ScaleOp("d", "s4", 1));
  AddOp(&p, Fill("e", {5, 3}, 5));
  AddOp(&p, ScaleOp("e", "s5", 1));
  AddOp(&p, Fill("f", {4, 3}, 6));
  AddOp(&p, ScaleOp("f", "s6", 1));
  ProgramDesc original = p;
  MemoryOptimizeOptions opts;
  opts.skip_vars = {"s1", "s2", "s3", "s4", "s5", "s6"};
  auto stats = Optimize(&p, opts);
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->renames, (Renames{{"e", "b"}, {"f", "a"}}));
  EXPECT_EQ(stats->bytes_saved_per_example, 3 * 8 + 12 * 8);  // [-1, 3] counts one example
  for (const char* v : {"a", "b", "c", "d"}) EXPECT_TRUE(Declared(p, v)) << v;
  EXPECT_TRUE(RunsAgree(*registry_, original, p, stats->renames, {}));
}

TEST_F(MemoryOptimizeTest, SkipVarsAreNeitherRenamedNorReused) {
  ProgramDesc original = Chain();
  ProgramDesc p = original;
  MemoryOptimizeOptions opts;
  opts.skip_vars = {"loss", "a", "c"};
  auto stats = Optimize(&p, opts);
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->renames, (Renames{{"d", "b"}}));  // without the skips: c->a too
  EXPECT_TRUE(Declared(p, "a"));
  EXPECT_TRUE(Declared(p, "c"));
  EXPECT_EQ(OpOutput(p.blocks(0).ops(2), "Out"), "c");
  EXPECT_TRUE(
      RunsAgree(*registry_, original, p, stats->renames, {{"w", RandomTensor({4, 3}, -1, 1, 8)}}));
}

// h -> h@GRAD -> t -> w@GRAD -> h@GRAD@RENAME@0 -> u -> out, all [2, 2].
ProgramDesc GradChain() {
  ProgramDesc p = NewProgram();
  for (const char* v : {"h", "h@GRAD", "t", "w@GRAD", "h@GRAD@RENAME@0", "u", "out"}) {
    AddVar(&p, v, {2, 2});
  }
  AddVar(&p, "w", {2, 2}, FLOAT64, /*persistable=*/true);
  AddOp(&p, Fill("h", {2, 2}, 0.5f));
  AddOp(&p, ScaleOp("h", "h@GRAD", 3));
  AddOp(&p, ScaleOp("h@GRAD", "t", 1, 2));
  OpDesc g = ScaleOp("t", "w@GRAD", -1);
  SetAttr(&g, kOpRoleAttr, static_cast<int64_t>(kRoleBackward));
  SetAttr(&g, kOpRoleVarAttr, std::vector<std::string>{"w", "w@GRAD"});
  AddOp(&p, g);
  AddOp(&p, ScaleOp("w@GRAD", "h@GRAD@RENAME@0", 4));
  AddOp(&p, SumOp({"h@GRAD@RENAME@0"}, "u"));
  AddOp(&p, ScaleOp("u", "out", 2));
  return p;
}

TEST_F(MemoryOptimizeTest, SkipGradsKeepsEveryGradientIntact) {
  ProgramDesc original = GradChain();
  MemoryOptimizeOptions opts;
  opts.skip_vars = {"out"};

  // Without skip_grads gradients take part like any temporary (and op_role_var follows).
  ProgramDesc loose = original;
  auto all = Optimize(&loose, opts);
  ASSERT_TRUE(all.ok()) << all.status();
  EXPECT_EQ(all->renames,
            (Renames{{"t", "h"}, {"w@GRAD", "h@GRAD"}, {"h@GRAD@RENAME@0", "h"}, {"u", "h@GRAD"}}));
  EXPECT_EQ(GetStringsAttr(loose.blocks(0).ops(3), kOpRoleVarAttr),
            (std::vector<std::string>{"w", "h@GRAD"}));
  EXPECT_TRUE(RunsAgree(*registry_, original, loose, all->renames, {}));

  opts.skip_grads = true;
  ProgramDesc p = original;
  auto stats = Optimize(&p, opts);
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->renames, (Renames{{"t", "h"}, {"u", "h"}}));
  for (const auto& [from, to] : stats->renames) {
    EXPECT_FALSE(IsGrad(from)) << from;
    EXPECT_FALSE(IsGrad(to)) << to;
  }
  // Every gradient argument of every op, and every gradient VarDesc, is unchanged.
  for (int i = 0; i < original.blocks(0).ops_size(); ++i) {
    const OpDesc& before = original.blocks(0).ops(i);
    const OpDesc& after = p.blocks(0).ops(i);
    for (auto args : {std::make_pair(AllInputArgs(before), AllInputArgs(after)),
                      std::make_pair(AllOutputArgs(before), AllOutputArgs(after))}) {
      ASSERT_EQ(args.first.size(), args.second.size());
      for (size_t k = 0; k < args.first.size(); ++k) {
        if (IsGrad(args.first[k]) || IsGrad(args.second[k])) {
          EXPECT_EQ(args.first[k], args.second[k]) << "op #" << i;
        }
      }
    }
  }
  for (const auto& v : original.blocks(0).vars()) {
    if (IsGrad(v.name())) {
      EXPECT_TRUE(Declared(p, v.name())) << v.name();
    }
  }
  EXPECT_EQ(GetStringsAttr(p.blocks(0).ops(3), kOpRoleVarAttr),
            (std::vector<std::string>{"w", "w@GRAD"}));
  EXPECT_TRUE(RunsAgree(*registry_, original, p, stats->renames, {}));
}

TEST_F(MemoryOptimizeTest, InPlaceOpsAndFedVariables) {
  ProgramDesc p = NewProgram();
  // acc is read by op 0 before anything writes it: a fed accumulator, updated in place. It is
  // not a candidate, so u (same shape, defined after acc's last use) must not take it: that
  // would clobber the accumulator for the next run.
  for (const char* v : {"acc", "t", "b", "u"}) AddVar(&p, v, {3});
  AddVar(&p, "out", {3});
  AddVar(&p, "out2", {3});
  AddOp(&p, ScaleOp("acc", "acc", 1, 1));  // 0: acc += 1
  AddOp(&p, Fill("t", {3}, 2));            // 1
  AddOp(&p, SumOp({"acc", "t"}, "b"));     // 2: last use of acc and t; b must not take either
  AddOp(&p, ScaleOp("b", "b", 3));         // 3: b in place, live across
  AddOp(&p, Fill("u", {3}, 4));            // 4: t and acc are dead; b is live
  AddOp(&p, SumOp({"b", "u"}, "out"));     // 5
  AddOp(&p, ScaleOp("u", "out2", 1));      // 6
  ProgramDesc original = p;
  MemoryOptimizeOptions opts;
  opts.skip_vars = {"out", "out2"};
  auto stats = Optimize(&p, opts);
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->num_candidates, 3);  // t, b, u
  EXPECT_EQ(stats->renames, (Renames{{"u", "t"}}));
  EXPECT_EQ(OpOutput(p.blocks(0).ops(0), "Out"), "acc");
  EXPECT_EQ(OpOutput(p.blocks(0).ops(3), "Out"), "b");

  Tensor acc(FLOAT64, {3});
  acc.flat<double>().setConstant(10);
  EXPECT_TRUE(RunsAgree(*registry_, original, p, stats->renames, {{"acc", acc}}, /*steps=*/3));
  Scope scope;
  scope.Var("acc")->GetMutable<Tensor>()->CopyFrom(acc);
  for (int step = 0; step < 2; ++step) ASSERT_TRUE(exec_.Run(p, 0, &scope).ok());
  // Second run: acc = 12, b = 3 * (12 + 2) = 42, out = 42 + 4.
  EXPECT_EQ(scope.FindVar("out")->Get<Tensor>().data<double>()[0], 46.0);

  // The check above has teeth: merging u into the fed accumulator changes the second run.
  ProgramDesc bad = original;
  for (auto& op : *bad.mutable_blocks(0)->mutable_ops()) {
    RenameOpInput(&op, "u", "acc");
    RenameOpOutput(&op, "u", "acc");
  }
  EXPECT_FALSE(RunsAgree(*registry_, original, bad, {{"u", "acc"}}, {{"acc", acc}}));
}

TEST_F(MemoryOptimizeTest, OpsWithSubBlocksPinTheirVariables) {
  ProgramDesc p = NewProgram();
  for (const char* v : {"a", "b", "c", "d", "e", "f", "k"}) AddVar(&p, v, {2, 2});
  BlockDesc* sub = p.add_blocks();
  sub->set_idx(1);
  sub->set_parent_idx(0);
  // The sub-block reads `a`, which its op does not list.
  *sub->add_ops() = ScaleOp("a", "k", 2);
  AddOp(&p, Fill("a", {2, 2}, 1.5f));  // 0
  AddOp(&p, ScaleOp("a", "b", 1));     // 1: last use of a in block 0
  AddOp(&p, Fill("c", {2, 2}, 7));     // 2: must not take a
  AddOp(&p, ScaleOp("c", "d", 1));     // 3
  OpDesc run = MakeOp("run_block", {{"X", {"b", "d"}}}, {});
  SetBlockAttr(&run, "sub_block", 1);
  AddOp(&p, run);                   // 4
  AddOp(&p, Fill("e", {2, 2}, 3));  // 5: may take c
  AddOp(&p, ScaleOp("e", "f", 1));  // 6
  ProgramDesc original = p;

  // run_block runs the ops of its sub_block on the current scope.
  KernelFn run_block = [&](OpContext& ctx) -> absl::Status {
    int32_t idx = GetBlockAttr(ctx.op(), "sub_block");
    for (const auto& op : original.blocks(idx).ops()) {
      absl::Status s = exec_.RunOp(op, ctx.scope());
      if (!s.ok()) return s;
    }
    return absl::OkStatus();
  };
  ASSERT_TRUE(registry_->Register("run_block", {run_block, nullptr}).ok());
  MemoryOptimizeOptions opts;
  opts.skip_vars = {"f"};
  auto stats = Optimize(&p, opts);
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->num_candidates, 2);  // c, e: a, k (sub-block body), b, d (run_block) are pinned
  EXPECT_EQ(stats->renames, (Renames{{"e", "c"}}));
  EXPECT_EQ(p.blocks(1).SerializeAsString(), original.blocks(1).SerializeAsString());
  EXPECT_TRUE(RunsAgree(*registry_, original, p, stats->renames, {}));
  Scope scope;
  ASSERT_TRUE(exec_.Run(p, 0, &scope).ok());
  EXPECT_EQ(scope.FindVar("k")->Get<Tensor>().data<double>()[0], 3.0);
}

TEST_F(MemoryOptimizeTest, SkipsPersistableSparseAndUndeclaredVariables) {
  ProgramDesc p = NewProgram();
  AddVar(&p, "p", {2}, FLOAT64, /*persistable=*/true);
  AddVar(&p, "r", {2}, FLOAT64, false, SELECTED_ROWS);
  AddVar(&p, "q", {2});
  AddVar(&p, "out", {2});
  AddOp(&p, Fill("p", {2}, 1));
  AddOp(&p, ScaleOp("p", "s", 1));  // s has no VarDesc
  AddOp(&p, Fill("r", {2}, 2));
  AddOp(&p, SumOp({"r", "s"}, "x"));
  AddOp(&p, Fill("q", {2}, 3));  // p, r, s are all dead but none may be reused
  AddOp(&p, SumOp({"q", "x"}, "out"));
  ProgramDesc original = p;
  MemoryOptimizeOptions opts;
  opts.skip_vars = {"out"};
  auto stats = Optimize(&p, opts);
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->num_candidates, 1);  // q
  EXPECT_EQ(stats->vars_reused, 0);
  EXPECT_EQ(p.SerializeAsString(), original.SerializeAsString());
}

// An inference MLP: three fc+relu layers of width 8 (float64, batch -1). Each layer's
// temporaries die one op after they are made, so two buffers serve all eight.
ProgramDesc Mlp() {
  ProgramDesc p = NewProgram();
  AddVar(&p, "x", {-1, 4});
  int64_t in = 4;
  std::string h = "x";
  for (int l = 1; l <= 3; ++l) {
    std::string w = absl::StrCat("w", l), b = absl::StrCat("b", l);
    AddVar(&p, w, {in, 8}, FLOAT64, true);
    AddVar(&p, b, {8}, FLOAT64, true);
    std::string m = absl::StrCat("m", l), a = absl::StrCat("a", l);
    std::string r = l == 3 ? "out" : absl::StrCat("r", l);
    for (const auto& v : {m, a, r}) AddVar(&p, v, {-1, 8});
    AddOp(&p, MakeOp("mul", {{"X", {h}}, {"Y", {w}}}, {{"Out", {m}}}));
    AddOp(&p, MakeOp("elementwise_add", {{"X", {m}}, {"Y", {b}}}, {{"Out", {a}}}));
    AddOp(&p, MakeOp("relu", {{"X", {a}}}, {{"Out", {r}}}));
    h = r;
    in = 8;
  }
  return p;
}

std::map<std::string, Tensor> MlpFeeds() {
  return {{"x", RandomTensor({5, 4}, -1, 1, 1)}, {"w1", RandomTensor({4, 8}, -1, 1, 2)},
          {"b1", RandomTensor({8}, -1, 1, 3)},   {"w2", RandomTensor({8, 8}, -1, 1, 4)},
          {"b2", RandomTensor({8}, -1, 1, 5)},   {"w3", RandomTensor({8, 8}, -1, 1, 6)},
          {"b3", RandomTensor({8}, -1, 1, 7)}};
}

TEST_F(MemoryOptimizeTest, MlpForwardUsesTwoBuffers) {
  ProgramDesc original = Mlp();
  ProgramDesc p = original;
  MemoryOptimizeOptions opts;
  opts.skip_vars = {"out"};
  auto stats = Optimize(&p, opts);
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->num_candidates, 8);
  EXPECT_EQ(
      stats->renames,
      (Renames{
          {"r1", "m1"}, {"m2", "a1"}, {"a2", "m1"}, {"r2", "a1"}, {"m3", "m1"}, {"a3", "a1"}}));
  EXPECT_EQ(stats->bytes_saved_per_example, 6 * 8 * 8);
  // No op reads and writes the same buffer.
  for (const auto& op : p.blocks(0).ops()) {
    for (const auto& out : AllOutputArgs(op)) {
      for (const auto& in : AllInputArgs(op)) EXPECT_NE(in, out) << OpSignature(op);
    }
  }
  EXPECT_TRUE(RunsAgree(*registry_, original, p, stats->renames, MlpFeeds()));
}

// The MLP with a hand-appended backward pass (the registered gradient makers, in reverse).
ProgramDesc MlpWithBackward(const OpRegistry& registry) {
  ProgramDesc p = Mlp();
  BlockDesc* block = p.mutable_blocks(0);
  std::vector<OpDesc> forward(block->ops().begin(), block->ops().end());
  AddVar(&p, "out@GRAD", {-1, 8});
  AddOp(&p, Fill("out@GRAD", {5, 8}, 1));
  for (auto it = forward.rbegin(); it != forward.rend(); ++it) {
    for (OpDesc g : registry.Find(it->type())->grad_maker(*it)) {
      for (auto& s : *g.mutable_outputs()) {
        for (auto& a : *s.mutable_arguments()) {
          if (a == "x@GRAD") a = kEmptyVarName;  // x is data: no gradient needed
          if (a != kEmptyVarName && !Declared(p, a)) {
            const VarDesc* fwd = FindVarDesc(p.blocks(0), OriginalVarName(a));
            AddVar(&p, a, {fwd->shape().begin(), fwd->shape().end()});
          }
        }
      }
      if (g.type() == "mul_grad") {
        std::string w = OpInput(*it, "Y");
        SetAttr(&g, kOpRoleVarAttr, std::vector<std::string>{w, GradVarName(w)});
      }
      AddOp(&p, g);
    }
  }
  return p;
}

TEST_F(MemoryOptimizeTest, MlpTrainingProgramWithAndWithoutSkipGrads) {
  ProgramDesc original = MlpWithBackward(*registry_);
  MemoryOptimizeOptions opts;
  opts.skip_vars = {"out"};

  ProgramDesc loose = original;
  auto all = Optimize(&loose, opts);
  ASSERT_TRUE(all.ok()) << all.status();
  bool renamed_a_grad = false;
  for (const auto& [from, to] : all->renames) renamed_a_grad |= IsGrad(from);
  EXPECT_TRUE(renamed_a_grad);
  EXPECT_LT(loose.blocks(0).vars_size(), original.blocks(0).vars_size());
  EXPECT_TRUE(RunsAgree(*registry_, original, loose, all->renames, MlpFeeds()));

  opts.skip_grads = true;
  ProgramDesc p = original;
  auto stats = Optimize(&p, opts);
  ASSERT_TRUE(stats.ok()) << stats.status();
  for (const auto& [from, to] : stats->renames) {
    EXPECT_FALSE(IsGrad(from) || IsGrad(to)) << from << "->" << to;
  }
  for (const auto& v : original.blocks(0).vars()) {
    if (IsGrad(v.name())) {
      EXPECT_TRUE(Declared(p, v.name())) << v.name();
    }
  }
  // RunsAgree also compares the final parameter gradients, which skip_grads keeps intact.
  EXPECT_TRUE(RunsAgree(*registry_, original, p, stats->renames, MlpFeeds()));
}

TEST_F(MemoryOptimizeTest, DeterministicAndIdempotent) {
  ProgramDesc a = MlpWithBackward(*registry_), b = a;
  MemoryOptimizeOptions opts;
  opts.skip_vars = {"out"};
  ASSERT_TRUE(Optimize(&a, opts).ok());
  ASSERT_TRUE(Optimize(&b, opts).ok());
  EXPECT_EQ(a.SerializeAsString(), b.SerializeAsString());
  ProgramDesc again = a;
  auto stats = Optimize(&again, opts);
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->vars_reused, 0);
  EXPECT_EQ(again.SerializeAsString(), a.SerializeAsString());
}

TEST_F(MemoryOptimizeTest, RejectsBadPrograms) {
  EXPECT_EQ(MemoryOptimize(nullptr, {}).status().code(), absl::StatusCode::kInvalidArgument);
  ProgramDesc empty;
  EXPECT_EQ(MemoryOptimize(&empty, {}).status().code(), absl::StatusCode::kInvalidArgument);

  ProgramDesc p = Chain();
  OpDesc run = MakeOp("run_block", {{"X", {"a"}}}, {});
  SetBlockAttr(&run, "sub_block", 5);
  AddOp(&p, run);
  ProgramDesc before = p;
  auto stats = MemoryOptimize(&p, {});
  ASSERT_FALSE(stats.ok());
  EXPECT_EQ(stats.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(stats.status().message(), "refers to block 5")) << stats.status();
  EXPECT_TRUE(absl::StrContains(stats.status().message(), "sub_block")) << stats.status();
  EXPECT_EQ(p.SerializeAsString(), before.SerializeAsString());
}

TEST_F(MemoryOptimizeTest, ReportIsOneLine) {
  ProgramDesc p = Chain();
  MemoryOptimizeOptions opts;
  opts.skip_vars = {"loss"};
  auto stats = Optimize(&p, opts);
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(MemoryOptimizeReport(*stats),
            "memory_optimize: reused 2 of 4 candidate variables, saving 192 bytes per example "
            "(c->a, d->b)");
  MemoryOptimizeStats many;
  many.num_candidates = 20;
  many.vars_reused = 10;
  for (int i = 0; i < 10; ++i) many.renames.emplace_back(absl::StrCat("v", i), "s");
  std::string line = MemoryOptimizeReport(many);
  EXPECT_TRUE(absl::StrContains(line, "v7->s, ... 2 more)")) << line;
  EXPECT_FALSE(absl::StrContains(line, "v8->s")) << line;
  EXPECT_EQ(line.find('\n'), std::string::npos);
}

}  // namespace
}  // namespace tessera
