// The pserver's request path in parts, without a server around them: GradientInbox (checks,
// receive buffers, chunk counting, which table gradients a step applies) and Applier (sync steps,
// async pushes, reads and lookups), on a transpiled pserver program of a model with a dense
// parameter, a sparse local table and a distributed table, for 2 trainers.
#include <cmath>

#include "common/framework/executor.h"
#include "common/layers/layers.h"
#include "common/layers/optimizer.h"
#include "common/framework/op_desc.h"
#include "common/ops/ops.h"
#include "gtest/gtest.h"
#include "pserver/applier.h"
#include "pserver/gradient_inbox.h"
#include "transpiler/distribute_transpiler.h"

namespace tessera {
namespace {

constexpr float kLr = 0.5f;
constexpr int kTrainers = 2;
const char kEndpoint[] = "10.0.0.1:7000";

struct Pserver {
  ProgramDesc program;
  std::unique_ptr<OpRegistry> registry = NewStandardOpRegistry();
  Scope scope;
  std::unique_ptr<Applier> applier;
  std::unique_ptr<GradientInbox> inbox;
};

// fc (3x2, dense) + a sparse local table (10x2) + a distributed table (width 2), SGD, all on one
// pserver; startup run, applier and inbox created as ParameterServer does.
std::unique_ptr<Pserver> MakePserver(bool sync) {
  auto ps = std::make_unique<Pserver>();
  ProgramDesc main, startup;
  ProgramBuilder b(&main, &startup);
  std::string x = layers::Data(b, "x", {-1, 3});
  std::string ids = layers::Data(b, "ids", {-1, 1}, INT64);
  layers::FcOptions fo;
  fo.name = "fc";
  fo.bias = false;
  layers::EmbeddingOptions local;
  local.name = "local";
  local.is_sparse = true;
  layers::EmbeddingOptions dist;
  dist.name = "table";
  dist.is_sparse = true;
  dist.is_distributed = true;
  std::string loss = layers::ElementwiseAdd(
      b, layers::Mean(b, layers::Fc(b, x, 2, fo)),
      layers::ElementwiseAdd(b, layers::Mean(b, layers::Embedding(b, ids, 10, 2, local)),
                             layers::Mean(b, layers::Embedding(b, ids, 10, 2, dist))));
  OptimizerOptions oo;
  oo.learning_rate = kLr;
  EXPECT_TRUE(SGD(oo).Minimize(b, *ps->registry, loss).ok());
  TranspilerConfig cfg;
  cfg.pservers = {kEndpoint};
  cfg.trainers = kTrainers;
  cfg.sync_mode = sync;
  auto t = DistributeTranspiler::Transpile(main, startup, cfg);
  EXPECT_TRUE(t.ok()) << t.status();
  ps->program = *t->GetPserverProgram(kEndpoint);
  Executor exec(ps->registry.get());
  EXPECT_TRUE(exec.Run(*t->GetPserverStartupProgram(kEndpoint), 0, &ps->scope).ok());
  const OpDesc* ls = nullptr;
  for (const auto& op : ps->program.blocks(0).ops()) {
    if (op.type() == "listen_and_serv") ls = &op;
  }
  EXPECT_NE(ls, nullptr);
  ApplierOptions ao;
  ao.endpoint = kEndpoint;
  auto applier =
      Applier::Create(ps->program, *ls, kTrainers, sync, &ps->scope, ps->registry.get(), ao);
  EXPECT_TRUE(applier.ok()) << applier.status();
  ps->applier = std::move(*applier);
  CreateBlockVariables(ps->program.blocks(0), &ps->scope);
  ps->inbox = std::make_unique<GradientInbox>(
      &ps->program, &ps->scope, kTrainers, sync, kEndpoint, ps->applier->dense_gradients(),
      ps->applier->table_gradients());
  return ps;
}

RequestMeta Meta(int trainer, int64_t step) {
  RequestMeta m;
  m.job_id = "job";
  m.trainer_id = trainer;
  m.step = step;
  return m;
}

VariableHeader Dense(const std::string& name, std::vector<int64_t> dims) {
  VariableHeader h;
  h.name = name;
  h.dims = std::move(dims);
  int64_t n = 1;
  for (int64_t d : h.dims) n *= d;
  h.total_bytes = h.chunk_bytes = n * 4;
  return h;
}

VariableHeader Sparse(const std::string& name, int64_t rows, int64_t width, int64_t height) {
  VariableHeader h;
  h.name = name;
  h.type = SELECTED_ROWS;
  h.dims = {rows, width};
  h.height = height;
  h.num_rows = rows;
  h.total_bytes = h.chunk_bytes = rows * (8 + width * 4);
  return h;
}

// The one gradient of the inbox's dense gradients that has `param` in its name.
std::string GradOf(const Pserver& ps, const std::string& param) {
  for (const std::string& g : ps.applier->dense_gradients()) {
    if (g.rfind(param, 0) == 0) return g;
  }
  ADD_FAILURE() << "no gradient of " << param;
  return "";
}

std::string TableGrad(const Pserver& ps) {
  auto grads = ps.applier->table_gradients();
  EXPECT_EQ(grads.size(), 1u);
  return grads.begin()->first;
}

std::vector<float> Values(const Tensor& t) {
  return std::vector<float>(t.data<float>(), t.data<float>() + t.numel());
}

TEST(GradientInboxTest, RefusesWhatTheProgramDoesNotDeclare) {
  auto ps = MakePserver(true);
  const std::string fc = GradOf(*ps, "fc");
  auto unknown = ps->inbox->Prepare(Meta(0, 0), Dense("nope@GRAD", {3, 2}), 0);
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(unknown.status().message().find("'nope@GRAD'"), std::string::npos);

  auto shape = ps->inbox->Prepare(Meta(0, 0), Dense(fc, {2, 3}), 0);
  EXPECT_EQ(shape.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(shape.status().message().find("[2, 3]"), std::string::npos) << shape.status();

  VariableHeader f64 = Dense(fc, {3, 2});
  f64.dtype = FLOAT64;
  EXPECT_EQ(ps->inbox->Prepare(Meta(0, 0), f64, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ps->inbox->Prepare(Meta(0, 0), Sparse(fc, 1, 2, 3), 0).status().code(),
            absl::StatusCode::kInvalidArgument);

  auto width = ps->inbox->Prepare(Meta(0, 0), Sparse(TableGrad(*ps), 1, 3, 0), 0);
  EXPECT_EQ(width.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(width.status().message().find("width 2"), std::string::npos) << width.status();

  auto step = ps->inbox->Prepare(Meta(1, 4), Dense(fc, {3, 2}), 3);
  EXPECT_EQ(step.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(step.status().message().find("step 4 but pserver is at step 3"), std::string::npos);
}

TEST(GradientInboxTest, SyncBuffersArePerTrainerAndChunksCompleteAGradient) {
  auto ps = MakePserver(true);
  const std::string fc = GradOf(*ps, "fc");
  auto a = ps->inbox->Prepare(Meta(0, 0), Dense(fc, {3, 2}), 0);
  auto b = ps->inbox->Prepare(Meta(1, 0), Dense(fc, {3, 2}), 0);
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_NE(*a, *b);
  EXPECT_EQ(*a, ps->scope.FindVar(TrainerGradName(fc, 0)));
  EXPECT_EQ((*a)->Get<Tensor>().shape(), (Shape{3, 2}));

  VariableHeader half = Dense(fc, {3, 2});
  half.chunk_bytes = half.total_bytes / 2;
  EXPECT_FALSE(ps->inbox->Arrived(Meta(0, 0), half));
  EXPECT_FALSE(ps->inbox->Arrived(Meta(1, 0), half));  // trainers count apart
  EXPECT_TRUE(ps->inbox->Arrived(Meta(0, 0), half));
  EXPECT_FALSE(ps->inbox->Arrived(Meta(0, 0), half));  // the next gradient starts from zero
  EXPECT_TRUE(ps->inbox->Arrived(Meta(0, 0), half));

  // Complete from every trainer only once trainer 1's second half is in, and only for its step.
  EXPECT_TRUE(ps->inbox->CompleteFromAll(fc, 0, {0}));
  EXPECT_FALSE(ps->inbox->CompleteFromAll(fc, 0, {0, 1}));
  EXPECT_TRUE(ps->inbox->Arrived(Meta(1, 0), half));
  EXPECT_TRUE(ps->inbox->CompleteFromAll(fc, 0, {0, 1}));
  EXPECT_FALSE(ps->inbox->CompleteFromAll(fc, 1, {0, 1}));
  EXPECT_FALSE(ps->inbox->CompleteFromAll("no_such@GRAD", 0, {0}));
}

TEST(GradientInboxTest, AsyncBuffersLiveInTheTrainersScopes) {
  auto ps = MakePserver(false);
  const std::string fc = GradOf(*ps, "fc");
  auto a = ps->inbox->Prepare(Meta(1, 7), Dense(fc, {3, 2}), 0);  // async: any step
  ASSERT_TRUE(a.ok()) << a.status();
  EXPECT_EQ(*a, ps->inbox->trainer_scope(1)->FindLocalVar(fc));
  EXPECT_EQ(ps->inbox->trainer_scope(0)->FindLocalVar(fc), nullptr);
}

TEST(GradientInboxTest, RowsOutsideASlicedParameterAreRefusedAndDropped) {
  auto ps = MakePserver(true);
  const std::string local = GradOf(*ps, "local");
  auto v = ps->inbox->Prepare(Meta(0, 0), Sparse(local, 2, 2, 10), 0);
  ASSERT_TRUE(v.ok()) << v.status();
  SelectedRows* sr = (*v)->GetMutable<SelectedRows>();
  sr->rows = {3, 10};
  absl::Status s = ps->inbox->CheckRows(Sparse(local, 2, 2, 10), *v);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("row 10 (entry 1) outside [0, 10)"), std::string::npos) << s;
  EXPECT_TRUE(sr->rows.empty());
  EXPECT_EQ(sr->value.dim(0), 0);

  sr->rows = {3, 9};
  sr->value.Resize(FLOAT32, {2, 2});
  EXPECT_TRUE(ps->inbox->CheckRows(Sparse(local, 2, 2, 10), *v).ok());
  // Distributed tables take any int64 id.
  auto t = ps->inbox->Prepare(Meta(0, 0), Sparse(TableGrad(*ps), 1, 2, 0), 0);
  ASSERT_TRUE(t.ok());
  (*t)->GetMutable<SelectedRows>()->rows = {int64_t{1} << 60};
  EXPECT_TRUE(ps->inbox->CheckRows(Sparse(TableGrad(*ps), 1, 2, 0), *t).ok());
}

TEST(GradientInboxTest, AStepAppliesOnlyTheTableGradientsSentForIt) {
  auto ps = MakePserver(true);
  const std::string grad = TableGrad(*ps);
  ASSERT_TRUE(ps->inbox->Prepare(Meta(1, 0), Sparse(grad, 1, 2, 0), 0).ok());
  ASSERT_TRUE(ps->inbox->Prepare(Meta(0, 0), Sparse(grad, 2, 2, 0), 0).ok());
  std::vector<const SelectedRows*> step0 = ps->inbox->TableGradients(grad, 0);
  ASSERT_EQ(step0.size(), 2u);
  EXPECT_EQ(step0[0]->rows.size(), 2u);  // trainer order
  EXPECT_EQ(step0[1]->rows.size(), 1u);
  // Step 1: only trainer 1's batch had ids of the table.
  ASSERT_TRUE(ps->inbox->Prepare(Meta(1, 1), Sparse(grad, 3, 2, 0), 1).ok());
  std::vector<const SelectedRows*> step1 = ps->inbox->TableGradients(grad, 1);
  ASSERT_EQ(step1.size(), 1u);
  EXPECT_EQ(step1[0]->rows.size(), 3u);
}

TEST(ApplierTest, SyncStepAppliesTheMeanOfTheTrainersGradients) {
  auto ps = MakePserver(true);
  const std::string fc_grad = GradOf(*ps, "fc");
  const std::string table_grad = TableGrad(*ps);
  auto before = ps->applier->Read("fc.w");
  ASSERT_TRUE(before.ok()) << before.status();
  const std::vector<float> w0 = Values(before->Get<Tensor>());
  for (int k = 0; k < kTrainers; ++k) {
    auto v = ps->inbox->Prepare(Meta(k, 0), Dense(fc_grad, {3, 2}), 0);
    ASSERT_TRUE(v.ok());
    float* g = (*v)->GetMutable<Tensor>()->data<float>();
    for (int i = 0; i < 6; ++i) g[i] = static_cast<float>((k + 1) * (i + 1));
  }
  auto rows0 = ps->applier->Lookup("table", {5, -7});
  ASSERT_TRUE(rows0.ok()) << rows0.status();
  auto t0 = ps->inbox->Prepare(Meta(0, 0), Sparse(table_grad, 1, 2, 0), 0);
  auto t1 = ps->inbox->Prepare(Meta(1, 0), Sparse(table_grad, 2, 2, 0), 0);
  ASSERT_TRUE(t0.ok() && t1.ok());
  SelectedRows* s0 = (*t0)->GetMutable<SelectedRows>();
  s0->rows = {5};
  s0->value.data<float>()[0] = 1;
  s0->value.data<float>()[1] = 2;
  SelectedRows* s1 = (*t1)->GetMutable<SelectedRows>();
  s1->rows = {5, -7};
  for (int i = 0; i < 4; ++i) s1->value.data<float>()[i] = 4;

  // The local table's gradients: no rows this step.
  for (int k = 0; k < kTrainers; ++k) {
    ASSERT_TRUE(ps->inbox->Prepare(Meta(k, 0), Sparse(GradOf(*ps, "local"), 0, 2, 10), 0).ok());
  }
  absl::Status applied = ps->applier->ApplyStep(
      0, [&](const std::string& g) { return ps->inbox->TableGradients(g, 0); });
  ASSERT_TRUE(applied.ok()) << applied;
  const std::vector<float> w1 = Values(ps->applier->Read("fc.w")->Get<Tensor>());
  for (int i = 0; i < 6; ++i) {
    const float mean = (1.0f * (i + 1) + 2.0f * (i + 1)) / 2;
    EXPECT_NEAR(w1[i], w0[i] - kLr * mean, 1e-6) << i;
  }
  auto rows1 = ps->applier->Lookup("table", {5, -7});
  ASSERT_TRUE(rows1.ok());
  const float* r0 = rows0->data<float>();
  const float* r1 = rows1->data<float>();
  EXPECT_NEAR(r1[0], r0[0] - kLr * (1 + 4) / 2.0f, 1e-6);  // id 5: both trainers, summed
  EXPECT_NEAR(r1[1], r0[1] - kLr * (2 + 4) / 2.0f, 1e-6);
  EXPECT_NEAR(r1[2], r0[2] - kLr * 4 / 2.0f, 1e-6);  // id -7: trainer 1 only
  EXPECT_EQ(ps->applier->applies_per_step(), 3);     // fc, local, table
}

TEST(ApplierTest, AsyncPushAppliesOneTrainersGradientScaledByOneOverN) {
  auto ps = MakePserver(false);
  const std::string fc_grad = GradOf(*ps, "fc");
  const std::vector<float> w0 = Values(ps->applier->Read("fc.w")->Get<Tensor>());
  auto v = ps->inbox->Prepare(Meta(1, 0), Dense(fc_grad, {3, 2}), 0);
  ASSERT_TRUE(v.ok());
  for (int i = 0; i < 6; ++i) (*v)->GetMutable<Tensor>()->data<float>()[i] = 2;
  ASSERT_TRUE(ps->applier->ApplyPush(fc_grad, ps->inbox->trainer_scope(1)).ok());
  auto read = ps->applier->Read("fc.w");
  ASSERT_TRUE(read.ok());
  // An async read is a copy: later pushes do not change what a trainer fetched.
  EXPECT_NE(read->Get<Tensor>().data<float>(),
            ps->scope.FindVar("fc.w")->Get<Tensor>().data<float>());
  for (int i = 0; i < 6; ++i) {
    EXPECT_NEAR(read->Get<Tensor>().data<float>()[i], w0[i] - kLr * 2 / kTrainers, 1e-6);
  }
}

TEST(ApplierTest, UnknownParametersAndTablesAreNamed) {
  auto ps = MakePserver(true);
  auto get = ps->applier->Read("nope");
  EXPECT_EQ(get.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(get.status().message().find("'nope'"), std::string::npos);
  auto lookup = ps->applier->Lookup("nope", {1});
  EXPECT_EQ(lookup.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(lookup.status().message().find("'nope'"), std::string::npos);
}

TEST(ApplierTest, MalformedBlockMapIsRefused) {
  auto ps = MakePserver(true);
  OpDesc ls;
  ls.set_type("listen_and_serv");
  SetAttr(&ls, "grad_to_block_id", std::vector<std::string>{"fc.w@GRAD:99"});
  auto a = Applier::Create(ps->program, ls, kTrainers, true, &ps->scope, ps->registry.get(), {});
  EXPECT_EQ(a.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(a.status().message().find("'fc.w@GRAD:99'"), std::string::npos) << a.status();
}

// Consecutive sparse_table ops of one `group` are one table of their columns, served under the
// group's name; members that differ in what the one table applies to all are refused, naming
// the member and the attribute.
TEST(ApplierTest, AGroupsMembersAreOneTableAndMustAgree) {
  auto ps = MakePserver(true);
  const OpDesc* ls = nullptr;
  auto with_member = [&](const std::string& attr, const std::string& value) {
    ProgramDesc program = ps->program;
    auto* ops = program.mutable_blocks(0)->mutable_ops();
    for (int i = 0; i < ops->size(); ++i) {
      if (ops->Get(i).type() != "sparse_table") continue;
      OpDesc other = ops->Get(i);
      SetAttr(&other, "table", std::string("other"));
      SetAttr(&other, "dim", int64_t{1});
      if (attr == "shard") SetAttr(&other, "shard", int64_t{1});
      if (attr == "optimizer") SetAttr(&other, "optimizer", value);
      SetAttr(ops->Mutable(i), "group", std::string("table+other"));
      SetAttr(&other, "group", std::string("table+other"));
      *ops->Add() = other;
      for (int j = ops->size() - 1; j > i + 1; --j) ops->SwapElements(j, j - 1);
      break;
    }
    return program;
  };
  for (const auto& op : ps->program.blocks(0).ops()) {
    if (op.type() == "listen_and_serv") ls = &op;
  }
  ASSERT_NE(ls, nullptr);
  const ProgramDesc good = with_member("", "");
  auto a = Applier::Create(good, *ls, kTrainers, true, &ps->scope, ps->registry.get(), {});
  ASSERT_TRUE(a.ok()) << a.status();
  auto rows = (*a)->Lookup("table+other", {3, 4});
  ASSERT_TRUE(rows.ok()) << rows.status();
  EXPECT_EQ(rows->shape(), (Shape{2, 3}));
  const std::vector<PserverTableRef> refs = (*a)->TableRefs();
  ASSERT_EQ(refs.size(), 2u);
  EXPECT_EQ(refs[0].name + "/" + refs[1].name, "table/other");
  EXPECT_EQ(refs[1].member, 1);
  for (const auto& [attr, value] :
       std::vector<std::pair<std::string, std::string>>{{"optimizer", "adagrad"}, {"shard", ""}}) {
    const ProgramDesc bad = with_member(attr, value);
    auto refused = Applier::Create(bad, *ls, kTrainers, true, &ps->scope, ps->registry.get(), {});
    EXPECT_EQ(refused.status().code(), absl::StatusCode::kInvalidArgument) << attr;
    EXPECT_NE(
        refused.status().message().find("table other of group table+other has another " + attr),
        std::string::npos)
        << refused.status();
  }
}

// A table expects its share of the declared vocabulary (the sparse_table op's rows, of the
// whole table, over the table's pserver shards), rounded up; none when the op declares none.
TEST(ApplierTest, ATableExpectsItsShareOfTheDeclaredRows) {
  auto ps = MakePserver(true);
  const OpDesc* ls = nullptr;
  for (const auto& op : ps->program.blocks(0).ops()) {
    if (op.type() == "listen_and_serv") ls = &op;
  }
  ASSERT_NE(ls, nullptr);
  auto expected = [&](int64_t rows, int64_t shards) -> int64_t {
    ProgramDesc program = ps->program;
    for (OpDesc& op : *program.mutable_blocks(0)->mutable_ops()) {
      if (op.type() != "sparse_table") continue;
      EXPECT_EQ(GetIntAttr(op, "rows", 0), 10);  // as transpiled: Embedding(ids, 10, 2)
      SetAttr(&op, "rows", rows);
      SetAttr(&op, "num_shards", shards);
    }
    auto a = Applier::Create(program, *ls, kTrainers, true, &ps->scope, ps->registry.get(), {});
    EXPECT_TRUE(a.ok()) << a.status();
    if (!a.ok()) return -1;
    const std::vector<PserverTableRef> refs = (*a)->TableRefs();
    EXPECT_EQ(refs.size(), 1u);
    return refs.empty() ? -1 : refs[0].table->options().expected_rows;
  };
  EXPECT_EQ(expected(10, 1), 10);
  EXPECT_EQ(expected(1000, 3), 334);
  EXPECT_EQ(expected(0, 2), 0);
}

}  // namespace
}  // namespace tessera
