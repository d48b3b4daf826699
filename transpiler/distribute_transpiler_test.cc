// DistributeTranspiler: slicing around the 8192-element threshold, placement (RoundRobin,
// HashName, a custom dispatcher), purity (byte-identical output), text round trips, error
// messages, and pserver startup slices equal to the rows of the single-machine startup.
#include "transpiler/distribute_transpiler.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/framework/executor.h"
#include "common/layers/layers.h"
#include "common/layers/optimizer.h"
#include "common/framework/op_desc.h"
#include "common/ops/ops.h"
#include "common/framework/program_io.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

using ::testing::TestWithParam;

// ---------------------------------------------------------------------------------------------
// Models: one parameter per ParamSpec, each multiplied elementwise by a fed input of the same
// shape and averaged; the loss is the sum of the averages.

struct ParamSpec {
  std::string name;
  Shape shape;
  Initializer init = Initializer::Xavier();
};

struct Model {
  ProgramDesc main, startup;
};

enum class Opt { kSgd, kMomentum, kAdam };

Model BuildModel(const std::vector<ParamSpec>& params, Opt opt = Opt::kSgd,
                 float clip_global_norm = 0) {
  auto registry = NewStandardOpRegistry();
  Model m;
  ProgramBuilder b(&m.main, &m.startup);
  std::string loss;
  for (const auto& p : params) {
    b.CreateParameter(p.name, p.shape, p.init);
    Shape xshape = {-1};
    xshape.insert(xshape.end(), p.shape.begin(), p.shape.end());
    std::string x = layers::Data(b, absl::StrCat("x_", p.name), xshape);
    std::string term = layers::Mean(b, layers::ElementwiseMul(b, x, p.name));
    loss = loss.empty() ? term : layers::ElementwiseAdd(b, loss, term);
  }
  OptimizerOptions oo;
  oo.learning_rate = 0.1f;
  oo.clip_global_norm = clip_global_norm;
  std::unique_ptr<Optimizer> o;
  switch (opt) {
    case Opt::kSgd:
      o = std::make_unique<SGD>(oo);
      break;
    case Opt::kMomentum:
      o = std::make_unique<Momentum>(oo, 0.9f);
      break;
    case Opt::kAdam:
      o = std::make_unique<Adam>(oo);
      break;
  }
  auto pairs = o->Minimize(b, *registry, loss);
  EXPECT_TRUE(pairs.ok()) << pairs.status();
  return m;
}

std::vector<std::string> Endpoints(int n) {
  std::vector<std::string> eps;
  for (int i = 0; i < n; ++i) eps.push_back(absl::StrCat("10.0.0.", i + 1, ":", 7000 + i));
  return eps;
}

TranspilerConfig Config(int pservers, int64_t min_block_size = 8192) {
  TranspilerConfig c;
  c.pservers = Endpoints(pservers);
  c.min_block_size = min_block_size;
  return c;
}

DistributeTranspiler MustTranspile(const Model& m, const TranspilerConfig& c) {
  auto t = DistributeTranspiler::Transpile(m.main, m.startup, c);
  EXPECT_TRUE(t.ok()) << t.status();
  return *std::move(t);
}

// The only op of `type` in block 0 of `p`.
const OpDesc& OnlyOp(const ProgramDesc& p, const std::string& type) {
  const OpDesc* found = nullptr;
  for (const auto& op : p.blocks(0).ops()) {
    if (op.type() == type) {
      EXPECT_EQ(found, nullptr) << "two " << type << " ops";
      found = &op;
    }
  }
  EXPECT_NE(found, nullptr) << "no " << type << " op";
  static const OpDesc empty;
  return found == nullptr ? empty : *found;
}

std::vector<int64_t> Rows(const std::vector<VarBlock>& blocks) {
  std::vector<int64_t> rows;
  for (const auto& b : blocks) rows.push_back(b.num_rows);
  return rows;
}

// ---------------------------------------------------------------------------------------------
// Slicing.

struct SliceCase {
  std::string label;
  Shape shape;
  int pservers;
  int64_t min_block_size;
  std::vector<int64_t> rows;  // expected rows per block
};

class SliceTest : public TestWithParam<SliceCase> {};

TEST_P(SliceTest, BlockCountsSizesAndNames) {
  const SliceCase& c = GetParam();
  std::vector<VarBlock> blocks = SliceVariable("w", c.shape, c.pservers, true, c.min_block_size);
  ASSERT_EQ(Rows(blocks), c.rows);
  const int64_t width = NumElements(c.shape) / c.shape[0];
  int64_t begin = 0, total = 0;
  for (size_t i = 0; i < blocks.size(); ++i) {
    const VarBlock& b = blocks[i];
    EXPECT_EQ(b.var, "w");
    EXPECT_EQ(b.index, static_cast<int>(i));
    EXPECT_EQ(b.name, blocks.size() == 1 ? "w" : absl::StrCat("w.block", i));
    EXPECT_EQ(b.begin_row, begin);
    EXPECT_EQ(b.row_width, width);
    Shape want = c.shape;
    want[0] = b.num_rows;
    EXPECT_EQ(b.shape, want);
    begin += b.num_rows;
    total += NumElements(b.shape);
  }
  EXPECT_EQ(begin, c.shape[0]);
  EXPECT_EQ(total, NumElements(c.shape));
  // The block count never exceeds #pservers, dim 0, or numel / min_block_size (at least 1).
  EXPECT_LE(static_cast<int64_t>(blocks.size()), std::max<int64_t>(1, c.pservers));
  EXPECT_LE(static_cast<int64_t>(blocks.size()), c.shape[0]);
  EXPECT_LE(static_cast<int64_t>(blocks.size()),
            std::max<int64_t>(1, NumElements(c.shape) / c.min_block_size));

  // slice_var_up=false: one whole block.
  std::vector<VarBlock> whole = SliceVariable("w", c.shape, c.pservers, false, c.min_block_size);
  ASSERT_EQ(whole.size(), 1u);
  EXPECT_EQ(whole[0].name, "w");
  EXPECT_EQ(whole[0].shape, c.shape);
}

INSTANTIATE_TEST_SUITE_P(
    AroundThreshold, SliceTest,
    ::testing::Values(
        // Default 8192: numel / min_block_size is 0 or 1 (< #pservers) -> never sliced.
        SliceCase{"d1_8191", {8191}, 2, 8192, {8191}},
        SliceCase{"d1_8192", {8192}, 2, 8192, {8192}},
        SliceCase{"d1_8193", {8193}, 2, 8192, {8193}},
        SliceCase{"d2_8191", {8191, 1}, 2, 8192, {8191}},
        SliceCase{"d2_8192", {64, 128}, 2, 8192, {64}},
        SliceCase{"d2_8193", {3, 2731}, 2, 8192, {3}},
        // Twice the threshold: 2 blocks even with 4 pservers (numel / min_block_size = 2).
        SliceCase{"d1_16383", {16383}, 4, 8192, {16383}},
        SliceCase{"d1_16384", {16384}, 4, 8192, {8192, 8192}},
        SliceCase{"d1_16385", {16385}, 4, 8192, {8193, 8192}},
        SliceCase{"d2_16384", {128, 128}, 4, 8192, {64, 64}},
        // numel / min_block_size smaller than #pservers (4096: 1 or 2 blocks of 3 pservers).
        SliceCase{"small_ratio_8191", {8191}, 3, 4096, {8191}},
        SliceCase{"small_ratio_8192", {8192}, 3, 4096, {4096, 4096}},
        SliceCase{"small_ratio_8193", {8193}, 3, 4096, {4097, 4096}},
        SliceCase{"small_ratio_2d", {64, 128}, 3, 4096, {32, 32}},
        // numel / min_block_size larger than #pservers (1024: 8 > 3): one block per pserver.
        SliceCase{"large_ratio_8191", {8191}, 3, 1024, {2731, 2731, 2729}},
        SliceCase{"large_ratio_8192", {8192}, 3, 1024, {2731, 2731, 2730}},
        SliceCase{"large_ratio_8193", {8193}, 3, 1024, {2731, 2731, 2731}},
        SliceCase{"large_ratio_2d", {64, 128}, 3, 1024, {22, 22, 20}},
        // dim 0 smaller than the block count: one row per block, or rows rounded up.
        SliceCase{"dim0_3_of_4", {3, 2731}, 4, 1024, {1, 1, 1}},
        SliceCase{"dim0_9_of_4", {9, 1024}, 4, 1024, {3, 3, 3}},
        SliceCase{"dim0_10_of_4", {10, 1024}, 4, 1024, {3, 3, 3, 1}},
        SliceCase{"dim0_1", {1, 8193}, 4, 1024, {1}},
        SliceCase{"one_pserver", {8193}, 1, 1024, {8193}}),
    [](const ::testing::TestParamInfo<SliceCase>& info) { return info.param.label; });

TEST(SliceTest, TranspiledProgramsUseTheSlices) {
  // 3 pservers, min_block_size 1024: w [64, 128] -> 22, 22, 20 rows; b [8191] -> 3 blocks.
  Model m = BuildModel({{"w", {64, 128}}, {"b", {8191}}, {"tiny", {10}}});
  DistributeTranspiler t = MustTranspile(m, Config(3, 1024));
  const ProgramDesc& tp = t.trainer_program();
  // The gradient is split into the blocks' rows before sending; params are concatenated.
  int splits = 0;
  for (const auto& op : tp.blocks(0).ops()) {
    if (op.type() != "split") continue;
    ++splits;
    const std::string x = OpInput(op, "X");
    if (x == GradVarName("w")) {
      EXPECT_EQ(GetIntsAttr(op, "sections"), (std::vector<int64_t>{22, 22, 20}));
      EXPECT_EQ(OpOutputs(op, "Out"),
                (std::vector<std::string>{"w@GRAD.block0", "w@GRAD.block1", "w@GRAD.block2"}));
    } else {
      EXPECT_EQ(x, GradVarName("b"));
      EXPECT_EQ(GetIntsAttr(op, "sections"), (std::vector<int64_t>{2731, 2731, 2729}));
    }
  }
  EXPECT_EQ(splits, 2);  // "tiny" is not split
  const VarDesc* block1 = FindVarDesc(tp.blocks(0), "w.block1");
  ASSERT_NE(block1, nullptr);
  EXPECT_EQ(std::vector<int64_t>(block1->shape().begin(), block1->shape().end()),
            (std::vector<int64_t>{22, 128}));
  // The blocks' shapes on the pservers add up to the parameter's.
  int64_t rows = 0;
  for (const auto& ep : Endpoints(3)) {
    auto prog = t.GetPserverProgram(ep);
    ASSERT_TRUE(prog.ok()) << prog.status();
    for (const auto& v : prog->blocks(0).vars()) {
      if (absl::StartsWith(v.name(), "w.block") && v.persistable()) rows += v.shape(0);
    }
  }
  EXPECT_EQ(rows, 64);
}

// ---------------------------------------------------------------------------------------------
// Placement.

// Endpoint of every parameter block, from the trainer's recv op, and of every gradient block,
// from its send op.
std::map<std::string, std::string> RecvPlacement(const DistributeTranspiler& t) {
  const OpDesc& recv = OnlyOp(t.trainer_program(), "recv");
  std::vector<std::string> vars = OpOutputs(recv, "Out");
  std::vector<std::string> eps = GetStringsAttr(recv, "epmap");
  EXPECT_EQ(vars.size(), eps.size());
  std::map<std::string, std::string> out;
  for (size_t i = 0; i < vars.size() && i < eps.size(); ++i) out[vars[i]] = eps[i];
  return out;
}

std::map<std::string, std::string> SendPlacement(const DistributeTranspiler& t) {
  const OpDesc& send = OnlyOp(t.trainer_program(), "send");
  std::vector<std::string> vars = OpInputs(send, "X");
  std::vector<std::string> eps = GetStringsAttr(send, "epmap");
  EXPECT_EQ(vars.size(), eps.size());
  std::map<std::string, std::string> out;
  for (size_t i = 0; i < vars.size() && i < eps.size(); ++i) out[vars[i]] = eps[i];
  return out;
}

// Which pserver program declares each persistable parameter block and serves each gradient.
void ExpectPserversHold(const DistributeTranspiler& t, const std::vector<std::string>& eps) {
  for (const auto& b : t.param_blocks()) {
    int holders = 0;
    for (const auto& ep : eps) {
      auto prog = t.GetPserverProgram(ep);
      ASSERT_TRUE(prog.ok());
      const VarDesc* v = FindVarDesc(prog->blocks(0), b.name);
      const OpDesc& ls = OnlyOp(*prog, "listen_and_serv");
      bool serves_grad = false;
      for (const auto& g : GetStringsAttr(ls, "grad_to_block_id")) {
        const std::string grad =
            absl::StrCat(GradVarName(b.var), b.name == b.var ? "" : b.name.substr(b.var.size()));
        serves_grad |= absl::StartsWith(g, grad + ":");
      }
      if (v != nullptr) {
        ++holders;
        EXPECT_EQ(ep, b.endpoint) << b.name;
        EXPECT_TRUE(v->persistable()) << b.name;
        EXPECT_TRUE(serves_grad) << b.name << " on " << ep;
      } else {
        EXPECT_FALSE(serves_grad) << b.name << " on " << ep;
      }
    }
    EXPECT_EQ(holders, 1) << b.name;
  }
}

TEST(PlacementTest, RoundRobinOneCounterAcrossVariables) {
  // Parameter order is the optimize ops' order; a (3 blocks), b (whole), c (2 blocks).
  Model m = BuildModel({{"a", {30, 100}}, {"b", {10}}, {"c", {2048}}});
  TranspilerConfig cfg = Config(2, 1000);
  cfg.pservers = {"ps0:1", "ps1:1"};
  // a: 3000 elements, min(2, 3) = 2 blocks; c: 2048 -> 2 blocks.
  DistributeTranspiler t = MustTranspile(m, cfg);
  std::vector<std::pair<std::string, std::string>> got;
  for (const auto& b : t.param_blocks()) got.emplace_back(b.name, b.endpoint);
  // Order of the optimize ops of the program (Minimize's parameter order).
  std::vector<std::string> order;
  for (const auto& op : m.main.blocks(0).ops()) {
    if ((OpRoleOf(op) & kRoleOptimize) != 0) order.push_back(GetStringsAttr(op, kOpRoleVarAttr)[0]);
  }
  std::map<std::string, std::vector<std::string>> names = {
      {"a", {"a.block0", "a.block1"}}, {"b", {"b"}}, {"c", {"c.block0", "c.block1"}}};
  std::vector<std::pair<std::string, std::string>> want;
  int counter = 0;
  for (const auto& p : order) {
    for (const auto& n : names.at(p)) want.emplace_back(n, cfg.pservers[counter++ % 2]);
  }
  ASSERT_EQ(want.size(), 5u);
  EXPECT_EQ(got, want);

  // Gradient block i goes where parameter block i goes, in the same order.
  std::map<std::string, std::string> recv = RecvPlacement(t), send = SendPlacement(t);
  ASSERT_EQ(recv.size(), 5u);
  ASSERT_EQ(send.size(), 5u);
  for (const auto& b : t.param_blocks()) {
    EXPECT_EQ(recv.at(b.name), b.endpoint);
    std::string grad =
        b.name == b.var ? GradVarName(b.var) : absl::StrCat(GradVarName(b.var), ".block", b.index);
    EXPECT_EQ(send.at(grad), b.endpoint) << grad;
  }
  ExpectPserversHold(t, cfg.pservers);
}

TEST(PlacementTest, RoundRobinWrapsAroundThreePservers) {
  Model m = BuildModel({{"w", {8193}}, {"v", {4, 4}}});
  TranspilerConfig cfg = Config(3, 1024);  // w: 3 blocks, v: whole
  DistributeTranspiler t = MustTranspile(m, cfg);
  std::vector<std::string> eps;
  for (const auto& b : t.param_blocks()) eps.push_back(b.endpoint);
  ASSERT_EQ(eps.size(), 4u);
  for (size_t i = 0; i < eps.size(); ++i) EXPECT_EQ(eps[i], cfg.pservers[i % 3]) << i;
  ExpectPserversHold(t, cfg.pservers);
}

TEST(PlacementTest, StableHashHasFixedValues) {
  // Fixed values: the placement must not depend on the process, platform or std::hash.
  // (FNV-1a's loop, but with offset basis 1469598103934665603 where FNV-1a has
  // 14695981039346656037; what matters here is that it never changes.)
  EXPECT_EQ(StableHash(""), 1469598103934665603ULL);
  EXPECT_EQ(StableHash("a"), 4953267810257967366ULL);
  EXPECT_EQ(StableHash("foobar"), 9870438755804841970ULL);
}

TEST(PlacementTest, HashNameGivesAFixedPlacement) {
  Model m = BuildModel(
      {{"fc_0.w_0", {16, 8}}, {"fc_0.b_0", {8}}, {"emb", {4096, 4}}, {"fc_1.w_0", {8, 1}}});
  TranspilerConfig cfg = Config(3, 4096);  // emb: 16384 elements -> 3 blocks
  cfg.pservers = {"a:1", "b:2", "c:3"};
  cfg.split_method = SplitMethod::kHashName;
  DistributeTranspiler t = MustTranspile(m, cfg);
  std::map<std::string, std::string> got;
  for (const auto& b : t.param_blocks()) got[b.name] = b.endpoint;
  // StableHash(name) % 3, computed once and written down.
  const std::map<std::string, std::string> want = {{"fc_0.w_0", "a:1"},   {"fc_0.b_0", "c:3"},
                                                   {"emb.block0", "b:2"}, {"emb.block1", "c:3"},
                                                   {"emb.block2", "c:3"}, {"fc_1.w_0", "a:1"}};
  EXPECT_EQ(got, want);
  for (const auto& [name, ep] : got) {
    EXPECT_EQ(ep, cfg.pservers[StableHash(name) % 3]) << name;
  }
  // The same names give the same placement in another order and with other parameters around.
  Model m2 = BuildModel({{"fc_1.w_0", {8, 1}}, {"other", {3}}, {"fc_0.w_0", {16, 8}}});
  DistributeTranspiler t2 = MustTranspile(m2, cfg);
  for (const auto& b : t2.param_blocks()) {
    if (want.count(b.name) > 0) EXPECT_EQ(b.endpoint, want.at(b.name)) << b.name;
  }
  ExpectPserversHold(t, cfg.pservers);
  // Gradient blocks follow their parameter blocks.
  std::map<std::string, std::string> send = SendPlacement(t);
  EXPECT_EQ(send.at("emb@GRAD.block1"), "c:3");
  EXPECT_EQ(send.at("fc_0.b_0@GRAD"), "c:3");
  EXPECT_EQ(send.at("emb@GRAD.block0"), "b:2");
}

TEST(PlacementTest, CustomDispatcher) {
  Model m = BuildModel({{"w", {8193}}, {"v", {4}}, {"u", {2, 2}}});
  TranspilerConfig cfg = Config(3, 1024);
  std::vector<std::tuple<std::string, int, int>> calls;
  // Everything on the last pserver except blocks whose name ends in "1".
  cfg.dispatcher = [&calls](const std::string& name, int index, int n) {
    calls.emplace_back(name, index, n);
    return absl::EndsWith(name, "1") ? 0 : n - 1;
  };
  cfg.split_method = SplitMethod::kHashName;  // ignored: the dispatcher wins
  DistributeTranspiler t = MustTranspile(m, cfg);
  ASSERT_EQ(t.param_blocks().size(), 5u);
  for (size_t i = 0; i < calls.size(); ++i) {
    EXPECT_EQ(std::get<0>(calls[i]), t.param_blocks()[i].name);
    EXPECT_EQ(std::get<1>(calls[i]), static_cast<int>(i));
    EXPECT_EQ(std::get<2>(calls[i]), 3);
  }
  for (const auto& b : t.param_blocks()) {
    EXPECT_EQ(b.endpoint, absl::EndsWith(b.name, "1") ? cfg.pservers[0] : cfg.pservers[2])
        << b.name;
  }
  // The middle pserver holds nothing but still gets a program that serves nothing.
  auto empty = t.GetPserverProgram(cfg.pservers[1]);
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ(empty->blocks_size(), 1);
  EXPECT_TRUE(GetStringsAttr(OnlyOp(*empty, "listen_and_serv"), "grad_to_block_id").empty());
  ExpectPserversHold(t, cfg.pservers);

  // A dispatcher answering outside [0, n) is an error naming the block.
  cfg.dispatcher = [](const std::string&, int, int n) { return n; };
  auto bad = DistributeTranspiler::Transpile(m.main, m.startup, cfg);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(bad.status().message(), "pserver 3 of 3")) << bad.status();
}

// ---------------------------------------------------------------------------------------------
// Purity and text round trips.

std::vector<ProgramDesc> AllPrograms(const DistributeTranspiler& t, const TranspilerConfig& c) {
  std::vector<ProgramDesc> out = {t.trainer_program(), t.trainer_startup_program()};
  for (const auto& ep : c.pservers) {
    out.push_back(*t.GetPserverProgram(ep));
    out.push_back(*t.GetPserverStartupProgram(ep));
  }
  return out;
}

std::string Serialize(const ProgramDesc& p) {
  std::string s;
  EXPECT_TRUE(p.SerializeToString(&s));
  return s;
}

TEST(PurityTest, RepeatedRunsAreByteIdentical) {
  for (SplitMethod split : {SplitMethod::kRoundRobin, SplitMethod::kHashName}) {
    for (bool sync : {true, false}) {
      // Two independently built models (fresh builders, fresh registries).
      Model m1 = BuildModel({{"w", {64, 128}}, {"b", {8193}}, {"s", {3}}}, Opt::kAdam);
      Model m2 = BuildModel({{"w", {64, 128}}, {"b", {8193}}, {"s", {3}}}, Opt::kAdam);
      ASSERT_TRUE(Serialize(m1.main) == Serialize(m2.main));
      TranspilerConfig c = Config(3, 1024);
      c.trainers = 2;
      c.trainer_id = 1;
      c.split_method = split;
      c.sync_mode = sync;
      DistributeTranspiler t1 = MustTranspile(m1, c);
      DistributeTranspiler t2 = MustTranspile(m2, c);
      DistributeTranspiler t3 = MustTranspile(m1, c);
      std::vector<ProgramDesc> a = AllPrograms(t1, c), b = AllPrograms(t2, c),
                               d = AllPrograms(t3, c);
      ASSERT_EQ(a.size(), b.size());
      for (size_t i = 0; i < a.size(); ++i) {
        EXPECT_TRUE(Serialize(a[i]) == Serialize(b[i])) << "program " << i << " differs";
        EXPECT_TRUE(Serialize(a[i]) == Serialize(d[i])) << "program " << i << " differs";
        EXPECT_TRUE(ProgramToText(a[i]) == ProgramToText(b[i])) << "program " << i << " differs";
      }
    }
  }
}

TEST(PurityTest, PrintedProgramsParseBackIdentical) {
  Model m = BuildModel({{"w", {64, 128}}, {"b", {8193}}, {"s", {3}}}, Opt::kMomentum);
  TranspilerConfig c = Config(2, 1024);
  c.trainers = 3;
  DistributeTranspiler t = MustTranspile(m, c);
  std::vector<ProgramDesc> all = AllPrograms(t, c);
  all.push_back(m.main);
  all.push_back(m.startup);
  for (size_t i = 0; i < all.size(); ++i) {
    const std::string text = ProgramToText(all[i]);
    ASSERT_FALSE(text.empty());
    auto parsed = ParseProgramText(text, absl::StrCat("program_", i, ".pbtxt"));
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_TRUE(Serialize(*parsed) == Serialize(all[i])) << "program " << i << " differs";
    EXPECT_TRUE(ProgramToText(*parsed) == text) << "program " << i << " prints differently";
  }
}

// ---------------------------------------------------------------------------------------------
// Errors: InvalidArgument (NotFound for an unknown endpoint) with one line naming the value.

void ExpectOneLineError(const absl::Status& s, absl::StatusCode code, const std::string& text) {
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), code) << s;
  EXPECT_FALSE(absl::StrContains(s.message(), "\n")) << s;
  EXPECT_TRUE(absl::StrContains(s.message(), text)) << s << " lacks '" << text << "'";
}

// Index of the first op of `type` in block 0 of `p` (-1 if none).
int FirstOp(const ProgramDesc& p, const std::string& type) {
  for (int i = 0; i < p.blocks(0).ops_size(); ++i) {
    if (p.blocks(0).ops(i).type() == type) return i;
  }
  return -1;
}

// Clipping by global norm needs every gradient: in pserver mode it stays on the trainer, before
// the gradients are sent, and no pserver gets it; in collective mode it runs on the all-reduced
// gradients, so it clips what one machine clips.
TEST(ClipTest, ClippingStaysOnTheTrainerBeforeSendsAndAfterAllReduce) {
  Model m = BuildModel({{"a", {10, 4}}, {"b", {6}}}, Opt::kAdam, 1.5f);
  DistributeTranspiler t = MustTranspile(m, Config(2, 8));
  const ProgramDesc& trainer = t.trainer_program();
  const int clip = FirstOp(trainer, "clip_by_global_norm");
  ASSERT_GE(clip, 0) << ProgramToText(trainer);
  int send = FirstOp(trainer, "send");
  if (send < 0) send = FirstOp(trainer, "send_batch");
  ASSERT_GE(send, 0) << ProgramToText(trainer);
  EXPECT_LT(clip, send);
  EXPECT_EQ(OpInputs(trainer.blocks(0).ops(clip), "X"),
            (std::vector<std::string>{"a@GRAD", "b@GRAD"}));
  EXPECT_EQ(FirstOp(trainer, "adam"), -1);
  for (const std::string& ep : Endpoints(2)) {
    auto ps = t.GetPserverProgram(ep);
    ASSERT_TRUE(ps.ok()) << ps.status();
    for (const BlockDesc& block : ps->blocks()) {
      for (const OpDesc& op : block.ops()) EXPECT_NE(op.type(), "clip_by_global_norm") << ep;
    }
  }

  auto collective = TranspileCollective(m.main, m.startup);
  ASSERT_TRUE(collective.ok()) << collective.status();
  const int reduce = FirstOp(collective->trainer, "c_allreduce_mean");
  const int clip_c = FirstOp(collective->trainer, "clip_by_global_norm");
  ASSERT_GE(reduce, 0);
  EXPECT_EQ(clip_c, reduce + 1);
  EXPECT_LT(clip_c, FirstOp(collective->trainer, "adam"));
}

// ---------------------------------------------------------------------------------------------
// Hybrid mode: a distributed table on the pservers, the dense layer on the trainers.

// Adam (learning rate 0.1) minimizing `loss`.
void MinimizeWithAdam(ProgramBuilder& b, const OpRegistry& registry, const std::string& loss) {
  OptimizerOptions oo;
  oo.learning_rate = 0.1f;
  auto pairs = Adam(oo).Minimize(b, registry, loss);
  EXPECT_TRUE(pairs.ok()) << pairs.status();
}

Model BuildTableModel() {
  auto registry = NewStandardOpRegistry();
  Model m;
  ProgramBuilder b(&m.main, &m.startup);
  std::string ids = layers::Data(b, "ids", {-1, 1}, INT64);
  layers::EmbeddingOptions eo;
  eo.name = "table";
  eo.is_sparse = true;
  eo.is_distributed = true;
  layers::FcOptions fo;
  fo.name = "fc";
  std::string loss = layers::Mean(b, layers::Fc(b, layers::Embedding(b, ids, 100, 4, eo), 1, fo));
  MinimizeWithAdam(b, *registry, loss);
  return m;
}

TEST(HybridTest, TablesGoToThePserversAndDenseGradientsAreAllReduced) {
  Model m = BuildTableModel();
  TranspilerConfig c = Config(2);
  c.hybrid = true;
  DistributeTranspiler t = MustTranspile(m, c);
  const ProgramDesc& trainer = t.trainer_program();
  const std::string text = ProgramToText(trainer);
  const OpDesc& reduce = OnlyOp(trainer, "c_allreduce_mean");
  EXPECT_EQ(OpInputs(reduce, "X"), (std::vector<std::string>{"fc.w@GRAD", "fc.b@GRAD"}));
  // The dense parameters' Adam runs on the trainer, after the all-reduce; the table's does not.
  std::vector<std::string> adam_params;
  for (const OpDesc& op : trainer.blocks(0).ops()) {
    if (op.type() == "adam") adam_params.push_back(OpInput(op, "Param"));
  }
  EXPECT_EQ(adam_params, (std::vector<std::string>{"fc.w", "fc.b"})) << text;
  EXPECT_LT(FirstOp(trainer, "c_allreduce_mean"), FirstOp(trainer, "adam"));
  EXPECT_GE(FirstOp(trainer, "prefetch"), 0) << text;
  EXPECT_TRUE(OpOutputs(OnlyOp(trainer, "recv"), "Out").empty()) << text;
  EXPECT_EQ(GetStringsAttr(OnlyOp(trainer, "recv"), "fetch_barrier_endpoints"), Endpoints(2));
  EXPECT_NE(FindVarDesc(trainer.blocks(0), "fc.w.moment1"), nullptr) << text;  // its state too
  // Startup: local initialization, then the trainers' job and trainer 0's dense values.
  const ProgramDesc& startup = t.trainer_startup_program();
  EXPECT_EQ(FirstOp(startup, "recv"), -1);
  EXPECT_GE(FirstOp(startup, "c_comm_init"), 0);
  EXPECT_EQ(OpInputs(OnlyOp(startup, "c_broadcast"), "X"),
            (std::vector<std::string>{"fc.b", "fc.w"}));
  // Each pserver: its shard of the table and no optimize block.
  for (const std::string& ep : Endpoints(2)) {
    auto ps = t.GetPserverProgram(ep);
    ASSERT_TRUE(ps.ok()) << ps.status();
    EXPECT_EQ(GetStringAttr(OnlyOp(*ps, "sparse_table"), "table", ""), "table");
    EXPECT_TRUE(GetIntsAttr(OnlyOp(*ps, "listen_and_serv"), "optimize_blocks").empty());
  }
  // Without hybrid, the dense layer goes to the pservers.
  c.hybrid = false;
  DistributeTranspiler ps_mode = MustTranspile(m, c);
  EXPECT_EQ(FirstOp(ps_mode.trainer_program(), "c_allreduce_mean"), -1);
  EXPECT_EQ(FirstOp(ps_mode.trainer_program(), "adam"), -1);
}

// Tables whose lookups read `ids` (slot name -> its tables, name and dim), each lookup averaged
// into the loss; Adam.
Model BuildSlotTablesModel(
    const std::vector<std::pair<std::string, std::vector<std::pair<std::string, int64_t>>>>&
        slots) {
  auto registry = NewStandardOpRegistry();
  Model m;
  ProgramBuilder b(&m.main, &m.startup);
  std::string loss;
  for (const auto& [slot, tables] : slots) {
    std::string ids = layers::Data(b, slot, {-1, 1}, INT64);
    for (const auto& [name, dim] : tables) {
      layers::EmbeddingOptions eo;
      eo.name = name;
      eo.is_sparse = true;
      eo.is_distributed = true;
      std::string term = layers::Mean(b, layers::Embedding(b, ids, 100, dim, eo));
      loss = loss.empty() ? term : layers::ElementwiseAdd(b, loss, term);
    }
  }
  MinimizeWithAdam(b, *registry, loss);
  return m;
}

// Table-wise placement: a slot's tables (same ids) stay together, the groups go largest first
// to the pserver with the fewest columns so far; each pserver describes only the tables it
// holds, each whole (shard 0 of 1); the trainer looks each table up at its owner and sends its
// gradient there unsplit. Row-wise (the default) splits every table over every pserver.
TEST(TablePlacementTest, TableWiseKeepsSlotsTogetherAndBalancesColumns) {
  Model m = BuildSlotTablesModel({{"ids_a", {{"emb_a", 8}, {"wide_a", 1}}},
                                  {"ids_b", {{"emb_b", 8}, {"wide_b", 1}}},
                                  {"ids_c", {{"emb_c", 16}}}});
  TranspilerConfig c = Config(2);
  c.table_placement = TablePlacement::kTableWise;
  DistributeTranspiler t = MustTranspile(m, c);
  // Groups by width: c (16) on pserver 0, then a (9) and b (9) on pserver 1 (9 < 16, 18 > 16
  // only after b).
  const std::map<std::string, int> want = {
      {"emb_a", 1}, {"wide_a", 1}, {"emb_b", 1}, {"wide_b", 1}, {"emb_c", 0}};
  for (int ps = 0; ps < 2; ++ps) {
    auto program = t.GetPserverProgram(Endpoints(2)[ps]);
    ASSERT_TRUE(program.ok()) << program.status();
    std::vector<std::string> held;
    for (const OpDesc& op : program->blocks(0).ops()) {
      if (op.type() != "sparse_table") continue;
      const std::string table = GetStringAttr(op, "table", "");
      held.push_back(table);
      EXPECT_EQ(GetIntAttr(op, "shard", -1), 0) << table;
      EXPECT_EQ(GetIntAttr(op, "num_shards", -1), 1) << table;
      EXPECT_EQ(GetStringAttr(op, "grad", ""), table + "@GRAD.shard0");
    }
    std::vector<std::string> expected;
    for (const auto& [table, owner] : want) {
      if (owner == ps) expected.push_back(table);
    }
    std::sort(held.begin(), held.end());
    EXPECT_EQ(held, expected) << "pserver " << ps;
  }
  const ProgramDesc& trainer = t.trainer_program();
  const OpDesc& prefetch = OnlyOp(trainer, "prefetch");
  const std::vector<std::string> tables = GetStringsAttr(prefetch, "tables");
  const std::vector<int64_t> owners = GetIntsAttr(prefetch, "owners");
  ASSERT_EQ(tables.size(), 5u);
  ASSERT_EQ(owners.size(), 5u);
  EXPECT_EQ(GetStringsAttr(prefetch, "epmap"), Endpoints(2));
  for (size_t i = 0; i < tables.size(); ++i) EXPECT_EQ(owners[i], want.at(tables[i])) << tables[i];
  // Each table's gradient: one piece (duplicate ids merged), sent to its owner.
  const OpDesc& send = OnlyOp(trainer, "send");
  const std::vector<std::string> sent = OpInputs(send, "X");
  const std::vector<std::string> eps = GetStringsAttr(send, "epmap");
  for (const auto& [table, owner] : want) {
    const auto at = std::find(sent.begin(), sent.end(), table + "@GRAD.shard0");
    ASSERT_NE(at, sent.end()) << table;
    EXPECT_EQ(eps[at - sent.begin()], Endpoints(2)[owner]) << table;
    EXPECT_EQ(std::count(sent.begin(), sent.end(), table + "@GRAD.shard1"), 0) << table;
  }
  int splits = 0;
  for (const OpDesc& op : trainer.blocks(0).ops()) {
    if (op.type() != "split_by_shard") continue;
    ++splits;
    EXPECT_EQ(OpOutputs(op, "Out").size(), 1u) << OpInput(op, "X");
  }
  EXPECT_EQ(splits, 5);

  // Row-wise: every pserver holds shard p of 2 of every table, and the prefetch has no owners.
  c.table_placement = TablePlacement::kRowWise;
  DistributeTranspiler rows = MustTranspile(m, c);
  for (int ps = 0; ps < 2; ++ps) {
    auto program = rows.GetPserverProgram(Endpoints(2)[ps]);
    ASSERT_TRUE(program.ok()) << program.status();
    int held = 0;
    for (const OpDesc& op : program->blocks(0).ops()) {
      if (op.type() != "sparse_table") continue;
      ++held;
      EXPECT_EQ(GetIntAttr(op, "shard", -1), ps);
      EXPECT_EQ(GetIntAttr(op, "num_shards", -1), 2);
    }
    EXPECT_EQ(held, 5);
  }
  EXPECT_TRUE(GetIntsAttr(OnlyOp(rows.trainer_program(), "prefetch"), "owners").empty());

  EXPECT_EQ(*ParseTablePlacement("table_wise"), TablePlacement::kTableWise);
  EXPECT_EQ(*ParseTablePlacement("row_wise"), TablePlacement::kRowWise);
  EXPECT_NE(ParseTablePlacement("tables").status().message().find("'tables'"), std::string::npos);
}

// Sets attribute beta1 of the adam op that updates `param` in `m`'s main program.
void SetAdamBeta1(Model* m, const std::string& param, float beta1) {
  for (auto& op : *m->main.mutable_blocks(0)->mutable_ops()) {
    const std::vector<std::string> rv = GetStringsAttr(op, kOpRoleVarAttr);
    if (op.type() == "adam" && !rv.empty() && rv[0] == param) SetAttr(&op, "beta1", beta1);
  }
}

// Table groups (fuse_tables): a slot's tables (same ids, same optimizer) are one pserver table
// "<a>+<b>": the trainer looks the group up once and splits its columns into each table's output,
// concatenates the outputs' gradients into the group's and sends that; each pserver describes
// every member by its own sparse_table op (its width and initializer) naming the group.
TEST(TableGroupTest, ASlotsTablesAreOneTableOfTheirColumns) {
  Model m =
      BuildSlotTablesModel({{"ids_a", {{"emb_a", 8}, {"wide_a", 1}}}, {"ids_c", {{"emb_c", 16}}}});
  TranspilerConfig c = Config(2);
  c.fuse_tables = true;
  DistributeTranspiler t = MustTranspile(m, c);
  const ProgramDesc& trainer = t.trainer_program();
  const OpDesc& prefetch = OnlyOp(trainer, "prefetch");
  EXPECT_EQ(GetStringsAttr(prefetch, "tables"),
            std::vector<std::string>({"emb_a+wide_a", "emb_c"}));
  EXPECT_EQ(GetIntsAttr(prefetch, "dims"), std::vector<int64_t>({9, 16}));
  const OpDesc& split = OnlyOp(trainer, "split");
  EXPECT_EQ(OpInput(split, "X"), "emb_a+wide_a.rows");
  EXPECT_EQ(OpInputs(prefetch, "Ids")[0], "ids_a");
  EXPECT_EQ(OpOutputs(prefetch, "Out")[0], "emb_a+wide_a.rows");
  EXPECT_EQ(GetIntsAttr(split, "sections"), std::vector<int64_t>({8, 1}));
  EXPECT_EQ(GetIntAttr(split, "axis", 0), 1);
  const OpDesc& concat = OnlyOp(trainer, "concat");
  EXPECT_EQ(OpOutput(concat, "Out"), "emb_a+wide_a.rows@GRAD");
  ASSERT_EQ(OpInputs(concat, "X").size(), 2u);
  // The split's outputs are the tables' lookups' outputs, the concat's inputs their gradients.
  for (int i = 0; i < 2; ++i) {
    EXPECT_EQ(OpInputs(concat, "X")[i], OpOutputs(split, "Out")[i] + "@GRAD");
  }
  int grads = 0;
  for (const OpDesc& op : trainer.blocks(0).ops()) {
    if (op.type() != "lookup_sparse_grad") continue;
    ++grads;
    if (OpInput(op, "Out@GRAD") == "emb_a+wide_a.rows@GRAD") {
      EXPECT_EQ(OpOutput(op, "W@GRAD"), "emb_a+wide_a@GRAD");
    }
  }
  EXPECT_EQ(grads, 2);
  const std::vector<std::string> sent = OpInputs(OnlyOp(trainer, "send"), "X");
  for (const char* piece : {"emb_a+wide_a@GRAD.shard0", "emb_a+wide_a@GRAD.shard1",
                            "emb_c@GRAD.shard0", "emb_c@GRAD.shard1"}) {
    EXPECT_EQ(std::count(sent.begin(), sent.end(), piece), 1) << piece;
  }
  for (const char* gone : {"emb_a", "wide_a", "emb_a@GRAD", "wide_a@GRAD"}) {
    EXPECT_EQ(FindVarDesc(trainer.blocks(0), gone), nullptr) << gone;
  }
  for (int ps = 0; ps < 2; ++ps) {
    auto program = t.GetPserverProgram(Endpoints(2)[ps]);
    ASSERT_TRUE(program.ok()) << program.status();
    std::vector<std::string> described;
    for (const OpDesc& op : program->blocks(0).ops()) {
      if (op.type() != "sparse_table") continue;
      const std::string table = GetStringAttr(op, "table", "");
      described.push_back(absl::StrCat(table, "/", GetStringAttr(op, "group", ""), "/",
                                       GetIntAttr(op, "dim", 0), "/",
                                       GetStringAttr(op, "grad", "")));
      EXPECT_EQ(GetStringAttr(op, "init", ""), "uniform_random") << table;
      // The declared vocabulary of the whole table (the pserver sizes its share by it).
      EXPECT_EQ(GetIntAttr(op, "rows", 0), 100) << table;
    }
    const std::string g = absl::StrCat("emb_a+wide_a@GRAD.shard", ps);
    EXPECT_EQ(described,
              std::vector<std::string>({"emb_a/emb_a+wide_a/8/" + g, "wide_a/emb_a+wide_a/1/" + g,
                                        absl::StrCat("emb_c//16/emb_c@GRAD.shard", ps)}));
  }

  // Without fuse_tables, or with another optimizer attribute on one table, each table is its own.
  c.fuse_tables = false;
  EXPECT_EQ(
      GetStringsAttr(OnlyOp(MustTranspile(m, c).trainer_program(), "prefetch"), "tables").size(),
      3u);
  c.fuse_tables = true;
  SetAdamBeta1(&m, "wide_a", 0.5f);
  EXPECT_EQ(
      GetStringsAttr(OnlyOp(MustTranspile(m, c).trainer_program(), "prefetch"), "tables").size(),
      3u);
}

// A group is looked up where its first member was: not when an op between the members' lookups
// writes their ids (the later member would read other ids).
TEST(TableGroupTest, IdsWrittenBetweenTheLookupsKeepTheTablesApart) {
  // The tables the trainer looks up (each prefetch's `table`, or a fused one's `tables`).
  auto looked_up = [](const DistributeTranspiler& t) {
    std::vector<std::string> tables;
    for (const OpDesc& op : t.trainer_program().blocks(0).ops()) {
      if (op.type() != "prefetch") continue;
      const std::string one = GetStringAttr(op, "table", "");
      if (!one.empty()) tables.push_back(one);
      for (const std::string& name : GetStringsAttr(op, "tables")) tables.push_back(name);
    }
    return tables;
  };
  Model m = BuildSlotTablesModel({{"ids_a", {{"emb_a", 8}, {"wide_a", 1}}}});
  TranspilerConfig c = Config(2);
  c.fuse_tables = true;
  ASSERT_EQ(looked_up(MustTranspile(m, c)), std::vector<std::string>({"emb_a+wide_a"}));
  google::protobuf::RepeatedPtrField<OpDesc> ops;
  for (const OpDesc& op : m.main.blocks(0).ops()) {
    *ops.Add() = op;
    if (op.type() == "lookup_table" && OpInput(op, "W") == "emb_a") {
      *ops.Add() = MakeOp("scale", {{"X", {"ids_a"}}}, {{"Out", {"ids_a"}}});
    }
  }
  m.main.mutable_blocks(0)->mutable_ops()->Swap(&ops);
  EXPECT_EQ(looked_up(MustTranspile(m, c)), std::vector<std::string>({"emb_a", "wide_a"}));
}

// Table-wise, a table read with a group's ids that could not join it (another optimizer
// attribute) is placed with the group all the same.
TEST(TableGroupTest, TableWiseKeepsATableOfTheGroupsIdsWithIt) {
  Model m = BuildSlotTablesModel(
      {{"ids_a", {{"emb_a", 8}, {"wide_a", 1}, {"odd_a", 2}}}, {"ids_c", {{"emb_c", 16}}}});
  SetAdamBeta1(&m, "odd_a", 0.5f);
  TranspilerConfig c = Config(2);
  c.fuse_tables = true;
  c.table_placement = TablePlacement::kTableWise;
  const DistributeTranspiler t = MustTranspile(m, c);
  const OpDesc& prefetch = OnlyOp(t.trainer_program(), "prefetch");
  const std::vector<std::string> tables = GetStringsAttr(prefetch, "tables");
  const std::vector<int64_t> owners = GetIntsAttr(prefetch, "owners");
  std::map<std::string, int64_t> owner;
  for (size_t i = 0; i < tables.size() && i < owners.size(); ++i) owner[tables[i]] = owners[i];
  // emb_c (16 columns) on pserver 0; the group (9) with odd_a (2), 11 columns, on pserver 1.
  EXPECT_EQ(owner,
            (std::map<std::string, int64_t>{{"emb_a+wide_a", 1}, {"odd_a", 1}, {"emb_c", 0}}));
}

TEST(HybridTest, NeedsATableAndSyncMode) {
  TranspilerConfig c = Config(2);
  c.hybrid = true;
  Model dense = BuildModel({{"a", {10, 4}}});
  auto t = DistributeTranspiler::Transpile(dense.main, dense.startup, c);
  EXPECT_NE(t.status().message().find("without one use --mode=collective"), std::string::npos)
      << t.status();
  Model tables = BuildTableModel();
  c.sync_mode = false;
  t = DistributeTranspiler::Transpile(tables.main, tables.startup, c);
  EXPECT_NE(t.status().message().find("hybrid mode trains in sync mode"), std::string::npos)
      << t.status();
}

// The overlapped all-reduce: each gradient goes to the reducer right after the op that last
// writes it, and the optimizer waits for all of them.
TEST(CollectiveTest, OverlapStartsEachGradientAfterItsLastWriter) {
  Model m = BuildModel({{"a", {10, 4}}, {"b", {6}}}, Opt::kAdam);
  auto plain = TranspileCollective(m.main, m.startup);
  ASSERT_TRUE(plain.ok()) << plain.status();
  EXPECT_EQ(FirstOp(plain->trainer, "c_allreduce_start"), -1);
  auto overlapped = TranspileCollective(m.main, m.startup, /*overlap_allreduce=*/true);
  ASSERT_TRUE(overlapped.ok()) << overlapped.status();
  const ProgramDesc& p = overlapped->trainer;
  EXPECT_EQ(FirstOp(p, "c_allreduce_mean"), -1);
  const int wait = FirstOp(p, "c_allreduce_wait");
  ASSERT_GE(wait, 0) << ProgramToText(p);
  EXPECT_EQ(OpInputs(p.blocks(0).ops(wait), "X"), (std::vector<std::string>{"a@GRAD", "b@GRAD"}));
  EXPECT_EQ(wait + 1, FirstOp(p, "adam"));
  int starts = 0;
  for (int i = 0; i < p.blocks(0).ops_size(); ++i) {
    const OpDesc& op = p.blocks(0).ops(i);
    if (op.type() != "c_allreduce_start") continue;
    ++starts;
    const std::string g = OpInput(op, "X");
    // The op before writes it, and nothing between it and the wait does.
    const auto before = AllOutputArgs(p.blocks(0).ops(i - 1));
    EXPECT_NE(std::find(before.begin(), before.end(), g), before.end()) << g;
    for (int j = i + 1; j < wait; ++j) {
      for (const auto& out : AllOutputArgs(p.blocks(0).ops(j))) EXPECT_NE(out, g) << j;
    }
    EXPECT_LT(i, wait);
  }
  EXPECT_EQ(starts, 2);
}

TEST(ErrorTest, BadConfigValues) {
  Model m = BuildModel({{"w", {8, 8}}});
  auto transpile = [&m](TranspilerConfig c) {
    return DistributeTranspiler::Transpile(m.main, m.startup, c).status();
  };
  const auto kInvalid = absl::StatusCode::kInvalidArgument;
  TranspilerConfig c = Config(2);
  c.pservers.clear();
  ExpectOneLineError(transpile(c), kInvalid, "no pserver endpoints");
  c = Config(2);
  c.pservers = {"a:1", "b:2", "a:1"};
  ExpectOneLineError(transpile(c), kInvalid, "a:1,b:2,a:1");
  c = Config(2);
  c.trainers = 0;
  ExpectOneLineError(transpile(c), kInvalid, "trainers=0");
  c = Config(2);
  c.trainers = 2;
  c.trainer_id = 2;
  ExpectOneLineError(transpile(c), kInvalid, "trainer_id=2");
  c.trainer_id = -1;
  ExpectOneLineError(transpile(c), kInvalid, "trainer_id=-1");
  c = Config(2, 0);
  ExpectOneLineError(transpile(c), kInvalid, "min_block_size=0");
  c = Config(2, -5);
  ExpectOneLineError(transpile(c), kInvalid, "min_block_size=-5");

  auto split = ParseSplitMethod("by_size");
  ExpectOneLineError(split.status(), kInvalid, "'by_size'");
  EXPECT_EQ(*ParseSplitMethod("hash_name"), SplitMethod::kHashName);
  EXPECT_EQ(*ParseSplitMethod("round_robin"), SplitMethod::kRoundRobin);

  DistributeTranspiler t = MustTranspile(m, Config(2));
  ExpectOneLineError(t.GetPserverProgram("nowhere:1").status(), absl::StatusCode::kNotFound,
                     "nowhere:1");
  ExpectOneLineError(t.GetPserverStartupProgram("nowhere:2").status(), absl::StatusCode::kNotFound,
                     "nowhere:2");
}

TEST(ErrorTest, ProgramsWithoutOptimizeOps) {
  // Forward only: no optimizer's Minimize.
  ProgramDesc main, startup;
  ProgramBuilder b(&main, &startup);
  b.CreateParameter("w", {4}, Initializer::Constant(1));
  layers::Mean(b, layers::ElementwiseMul(b, layers::Data(b, "x", {-1, 4}), "w"));
  auto t = DistributeTranspiler::Transpile(main, startup, Config(2));
  ExpectOneLineError(t.status(), absl::StatusCode::kInvalidArgument, "no optimize ops");

  // No blocks at all.
  t = DistributeTranspiler::Transpile(ProgramDesc(), ProgramDesc(), Config(2));
  ExpectOneLineError(t.status(), absl::StatusCode::kInvalidArgument, "block 0");

  // An optimize op without op_role_var.
  Model m = BuildModel({{"w", {4}}});
  for (auto& op : *m.main.mutable_blocks(0)->mutable_ops()) {
    if ((OpRoleOf(op) & kRoleOptimize) == 0) continue;
    for (int i = 0; i < op.attrs_size(); ++i) {
      if (op.attrs(i).name() == kOpRoleVarAttr) op.mutable_attrs()->DeleteSubrange(i, 1);
    }
  }
  t = DistributeTranspiler::Transpile(m.main, m.startup, Config(2));
  ExpectOneLineError(t.status(), absl::StatusCode::kInvalidArgument, "op_role_var");

  // A startup program that does not initialize a parameter: names it.
  Model m2 = BuildModel({{"w", {4}}});
  auto* ops = m2.startup.mutable_blocks(0)->mutable_ops();
  for (int i = ops->size() - 1; i >= 0; --i) {
    if (OpOutput(ops->Get(i), "Out") == "w") ops->DeleteSubrange(i, 1);
  }
  t = DistributeTranspiler::Transpile(m2.main, m2.startup, Config(2));
  ExpectOneLineError(t.status(), absl::StatusCode::kInvalidArgument, "initialize w");
}

// ---------------------------------------------------------------------------------------------
// Pserver startup: each slice equals the same rows of the single-machine initialization.

void ExpectRowsEqual(const Tensor& full, const Tensor& block, int64_t begin_row,
                     const std::string& name) {
  ASSERT_EQ(full.dtype(), FLOAT32) << name;
  ASSERT_EQ(block.dtype(), FLOAT32) << name;
  const int64_t width = full.numel() / full.dim(0);
  ASSERT_EQ(block.numel() % width, 0) << name;
  ASSERT_LE(begin_row * width + block.numel(), full.numel()) << name;
  const float* want = full.data<float>() + begin_row * width;
  int64_t differ = 0;
  for (int64_t i = 0; i < block.numel(); ++i) differ += want[i] != block.data<float>()[i];
  EXPECT_EQ(differ, 0) << name << ": " << differ << " of " << block.numel() << " values differ";
}

class StartupSliceTest : public TestWithParam<Opt> {};

TEST_P(StartupSliceTest, SlicesEqualTheSingleMachineRows) {
  Model m = BuildModel({{"xavier", {64, 128}},
                        {"uniform", {8193}, Initializer::Uniform(-2, 3)},
                        {"gauss", {100, 33}, Initializer::Gaussian(0.5, 2)},
                        {"whole", {7, 3}, Initializer::Gaussian(0, 1)},
                        {"const", {5000}, Initializer::Constant(0.25)}},
                       GetParam());
  auto registry = NewStandardOpRegistry();
  Executor exec(registry.get());
  Scope single;
  ASSERT_TRUE(exec.Run(m.startup, 0, &single).ok());

  for (SplitMethod split : {SplitMethod::kRoundRobin, SplitMethod::kHashName}) {
    TranspilerConfig c = Config(3, 1000);
    c.split_method = split;
    DistributeTranspiler t = MustTranspile(m, c);
    std::map<std::string, std::unique_ptr<Scope>> scopes;
    for (const auto& ep : c.pservers) {
      auto startup = t.GetPserverStartupProgram(ep);
      ASSERT_TRUE(startup.ok());
      scopes[ep] = std::make_unique<Scope>();
      absl::Status s = exec.Run(*startup, 0, scopes[ep].get());
      ASSERT_TRUE(s.ok()) << ep << ": " << s;
    }
    int sliced = 0;
    for (const auto& b : t.param_blocks()) {
      const Variable* v = scopes.at(b.endpoint)->FindVar(b.name);
      ASSERT_NE(v, nullptr) << b.name << " on " << b.endpoint;
      const Tensor& block = v->Get<Tensor>();
      EXPECT_EQ(block.shape(), b.shape) << b.name;
      const Tensor& full = single.FindVar(b.var)->Get<Tensor>();
      ExpectRowsEqual(full, block, b.begin_row, b.name);
      sliced += b.name != b.var;
      // The other pservers do not hold it.
      for (const auto& [ep, scope] : scopes) {
        if (ep != b.endpoint) EXPECT_EQ(scope->FindVar(b.name), nullptr) << b.name << " on " << ep;
      }
      // Optimizer state sliced like the parameter equals the same rows too.
      for (const auto& state : scopes.at(b.endpoint)->LocalVarNames()) {
        if (!absl::StartsWith(state, b.var + ".") || absl::StartsWith(state, b.var + ".block")) {
          continue;  // not optimizer state of b.var (or one of its parameter blocks)
        }
        const Tensor& st = scopes.at(b.endpoint)->FindVar(state)->Get<Tensor>();
        std::string orig = state;
        const std::string suffix = absl::StrCat(".block", b.index);
        if (b.name != b.var && absl::EndsWith(orig, suffix)) {
          orig = orig.substr(0, orig.size() - suffix.size());
        } else if (b.name != b.var) {
          continue;  // another block's state
        }
        const Variable* fv = single.FindVar(orig);
        ASSERT_NE(fv, nullptr) << state;
        const Tensor& ft = fv->Get<Tensor>();
        if (ft.shape() == single.FindVar(b.var)->Get<Tensor>().shape()) {
          ExpectRowsEqual(ft, st, b.begin_row, state);
        } else {
          EXPECT_EQ(st.shape(), ft.shape()) << state;  // e.g. Adam's beta powers: a whole copy
          ExpectRowsEqual(ft, st, 0, state);
        }
      }
    }
    EXPECT_GE(sliced, 9);  // xavier, uniform and gauss are cut in 3 (const in 3 as well)
  }
}

INSTANTIATE_TEST_SUITE_P(Optimizers, StartupSliceTest,
                         ::testing::Values(Opt::kSgd, Opt::kMomentum, Opt::kAdam),
                         [](const ::testing::TestParamInfo<Opt>& info) {
                           switch (info.param) {
                             case Opt::kSgd:
                               return std::string("sgd");
                             case Opt::kMomentum:
                               return std::string("momentum");
                             default:
                               return std::string("adam");
                           }
                         });

}  // namespace
}  // namespace tessera
