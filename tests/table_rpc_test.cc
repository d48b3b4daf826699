// A distributed table end to end over gRPC: trainer-side prefetch / lookup_sparse_grad /
// split_by_shard / send ops against two in-process pservers (real GrpcServer + ParameterServer).
// Ids anywhere in int64, batches where every id repeats, and empty batches.
#include <cstring>
#include <climits>

#include "common/framework/executor.h"
#include "common/layers/layers.h"
#include "common/layers/optimizer.h"
#include "common/ops/ops.h"
#include "common/rpc/grpc/grpc_client.h"
#include "common/rpc/grpc/grpc_server.h"
#include "gtest/gtest.h"
#include "pserver/parameter_server.h"
#include "tests/cluster_util.h"
#include "trainer/rpc_ops.h"
#include "transpiler/distribute_transpiler.h"

namespace tessera {
namespace {

constexpr int kDim = 4;
constexpr float kLr = 0.5f;

class TableRpcTest : public ::testing::Test {
 protected:
  void SetUp() override {
    registry_ = NewStandardOpRegistry();
    ProgramBuilder b(&main_, &startup_);
    std::string ids = layers::Data(b, "ids", {-1, 1}, INT64);
    layers::EmbeddingOptions e;
    e.name = "table";
    e.is_sparse = true;
    e.is_distributed = true;
    std::string emb = layers::Embedding(b, ids, 1000, kDim, e);
    std::string loss = layers::Mean(b, emb);
    OptimizerOptions oo;
    oo.learning_rate = kLr;
    ASSERT_TRUE(SGD(oo).Minimize(b, *registry_, loss).ok());

    auto eps = FreeEndpoints(2);
    ASSERT_TRUE(eps.ok());
    TranspilerConfig cfg;
    cfg.pservers = *eps;
    auto t = DistributeTranspiler::Transpile(main_, startup_, cfg);
    ASSERT_TRUE(t.ok()) << t.status();
    Executor exec(registry_.get());
    for (int p = 0; p < 2; ++p) {
      scopes_.push_back(std::make_unique<Scope>());
      auto startup = t->GetPserverStartupProgram((*eps)[p]);
      ASSERT_TRUE(exec.Run(*startup, 0, scopes_.back().get()).ok());
      ParameterServerOptions po;
      po.job_id = "job";
      po.endpoint = (*eps)[p];
      auto ps = ParameterServer::Create(*t->GetPserverProgram((*eps)[p]), scopes_.back().get(),
                                        registry_.get(), po);
      ASSERT_TRUE(ps.ok()) << ps.status();
      servers_.push_back(std::move(*ps));
      grpc_.push_back(std::make_unique<GrpcServer>(GrpcServerOptions{(*eps)[p]}, servers_[p].get()));
      ASSERT_TRUE(grpc_.back()->Start().ok());
    }
    eps_ = *eps;
    pool_ = std::make_unique<ClientPool>([](const std::string& ep) {
      GrpcClientOptions o;
      o.deadline = absl::Seconds(20);
      return std::make_unique<GrpcPServerClient>(ep, o);
    });
    rpc_.job_id = "job";
    rpc_.clients = pool_.get();
    ASSERT_TRUE(RegisterStandardOps(&trainer_ops_).ok());
    ASSERT_TRUE(RegisterRpcOps(&trainer_ops_, &rpc_).ok());
  }
  void TearDown() override {
    for (auto& g : grpc_) g->Shutdown();
  }

  // Rows of `ids` through the prefetch op.
  Tensor Prefetch(const std::vector<int64_t>& ids) {
    Tensor* t = scope_.Var("ids")->GetMutable<Tensor>();
    t->Resize(INT64, {static_cast<int64_t>(ids.size()), 1});
    for (size_t i = 0; i < ids.size(); ++i) t->data<int64_t>()[i] = ids[i];
    OpDesc op = MakeOp("prefetch", {{"Ids", {"ids"}}}, {{"Out", {"rows"}}});
    SetAttr(&op, "table", "table");
    SetAttr(&op, "epmap", eps_);
    SetAttr(&op, "dim", int64_t{kDim});
    Executor exec(&trainer_ops_);
    absl::Status s = exec.RunOp(op, &scope_);
    EXPECT_TRUE(s.ok()) << s;
    return scope_.FindVar("rows")->Get<Tensor>().Clone();
  }

  // Pushes gradient rows `grad` (one per id) through lookup_sparse_grad, split_by_shard, send.
  void Push(const std::vector<int64_t>& ids, const std::vector<float>& grad) {
    Tensor* t = scope_.Var("ids")->GetMutable<Tensor>();
    t->Resize(INT64, {static_cast<int64_t>(ids.size()), 1});
    for (size_t i = 0; i < ids.size(); ++i) t->data<int64_t>()[i] = ids[i];
    Tensor* g = scope_.Var("dout")->GetMutable<Tensor>();
    g->Resize(FLOAT32, {static_cast<int64_t>(ids.size()), kDim});
    for (size_t i = 0; i < grad.size(); ++i) g->data<float>()[i] = grad[i];
    Executor exec(&trainer_ops_);
    ASSERT_TRUE(exec.RunOp(MakeOp("lookup_sparse_grad", {{"Ids", {"ids"}}, {"Out@GRAD", {"dout"}}},
                                  {{"W@GRAD", {"table@GRAD"}}}),
                           &scope_)
                    .ok());
    OpDesc split = MakeOp("split_by_shard", {{"X", {"table@GRAD"}}},
                          {{"Out", {"table@GRAD.shard0", "table@GRAD.shard1"}}});
    ASSERT_TRUE(exec.RunOp(split, &scope_).ok());
    OpDesc send = MakeOp("send", {{"X", {"table@GRAD.shard0", "table@GRAD.shard1"}}}, {});
    SetAttr(&send, "epmap", eps_);
    absl::Status s = exec.RunOp(send, &scope_);
    ASSERT_TRUE(s.ok()) << s;
    for (const auto& kind : {SEND_BARRIER, FETCH_BARRIER}) {
      for (const auto& ep : eps_) ASSERT_TRUE(pool_->Get(ep)->Barrier(rpc_.Meta(), kind).ok());
    }
    rpc_.step = rpc_.step + 1;
  }

  std::unique_ptr<OpRegistry> registry_;
  ProgramDesc main_, startup_;
  std::vector<std::unique_ptr<Scope>> scopes_;
  std::vector<std::unique_ptr<ParameterServer>> servers_;
  std::vector<std::unique_ptr<GrpcServer>> grpc_;
  std::vector<std::string> eps_;
  std::unique_ptr<ClientPool> pool_;
  RpcContext rpc_;
  OpRegistry trainer_ops_;
  Scope scope_;
};

// The multi-table form: entries naming one table (two slots sharing it, or one slot twice)
// share its lookups, and each Out gets the rows of its own Ids, as one-table prefetches give.
TEST_F(TableRpcTest, EntriesSharingATableOrIdsGetTheRowsOfTheirIds) {
  const std::vector<int64_t> a = {5, -7, 5, int64_t{1} << 40, 12};
  const std::vector<int64_t> b = {12, 99, -7};
  const Tensor want_a = Prefetch(a), want_b = Prefetch(b);
  auto set = [&](const char* name, const std::vector<int64_t>& ids) {
    Tensor* t = scope_.Var(name)->GetMutable<Tensor>();
    t->Resize(INT64, {static_cast<int64_t>(ids.size()), 1});
    for (size_t i = 0; i < ids.size(); ++i) t->data<int64_t>()[i] = ids[i];
  };
  set("ids_a", a);
  set("ids_b", b);
  OpDesc op = MakeOp("prefetch", {{"Ids", {"ids_a", "ids_b", "ids_a"}}},
                     {{"Out", {"rows_a", "rows_b", "rows_a2"}}});
  SetAttr(&op, "tables", std::vector<std::string>{"table", "table", "table"});
  SetAttr(&op, "dims", std::vector<int64_t>{kDim, kDim, kDim});
  SetAttr(&op, "epmap", eps_);
  Executor exec(&trainer_ops_);
  absl::Status s = exec.RunOp(op, &scope_);
  ASSERT_TRUE(s.ok()) << s;
  for (const auto& [name, want] : {std::pair<const char*, const Tensor*>{"rows_a", &want_a},
                                   {"rows_b", &want_b},
                                   {"rows_a2", &want_a}}) {
    const Tensor& got = scope_.FindVar(name)->Get<Tensor>();
    ASSERT_EQ(got.shape(), want->shape()) << name;
    EXPECT_EQ(0, std::memcmp(got.raw_data(), want->raw_data(), got.nbytes())) << name;
  }
}

// Table-wise placement's form (attr owners): a table's ids all go to the pserver that holds it
// whole, and only there; its fresh rows are those any pserver creates for the ids. An owner
// outside the epmap is refused, naming it.
TEST_F(TableRpcTest, AWholeTableIsLookedUpAtItsOwnerAlone) {
  const std::vector<int64_t> ids = {5, -7, 12, int64_t{1} << 40, 99, 5};
  Tensor* t = scope_.Var("ids_w")->GetMutable<Tensor>();
  t->Resize(INT64, {static_cast<int64_t>(ids.size()), 1});
  for (size_t i = 0; i < ids.size(); ++i) t->data<int64_t>()[i] = ids[i];
  const int64_t before[2] = {servers_[0]->stats().prefetches, servers_[1]->stats().prefetches};
  OpDesc op = MakeOp("prefetch", {{"Ids", {"ids_w"}}}, {{"Out", {"rows_w"}}});
  SetAttr(&op, "tables", std::vector<std::string>{"table"});
  SetAttr(&op, "dims", std::vector<int64_t>{kDim});
  SetAttr(&op, "epmap", eps_);
  SetAttr(&op, "owners", std::vector<int64_t>{1});
  Executor exec(&trainer_ops_);
  absl::Status s = exec.RunOp(op, &scope_);
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(servers_[0]->stats().prefetches, before[0]);
  EXPECT_GT(servers_[1]->stats().prefetches, before[1]);
  const Tensor got = scope_.FindVar("rows_w")->Get<Tensor>().Clone();
  const Tensor want = Prefetch(ids);  // split by id over both pservers
  ASSERT_EQ(got.shape(), want.shape());
  EXPECT_EQ(0, std::memcmp(got.raw_data(), want.raw_data(), got.nbytes()));
  SetAttr(&op, "owners", std::vector<int64_t>{2});
  s = exec.RunOp(op, &scope_);
  EXPECT_NE(s.message().find("owner 2"), std::string::npos) << s;
}

TEST_F(TableRpcTest, ExtremeIdsRepeatedAndEmptyBatches) {
  const std::vector<int64_t> ids = {0, -1, INT64_MIN, INT64_MAX, 1000000000000000000LL};
  Tensor before = Prefetch(ids);
  ASSERT_EQ(before.shape(), (Shape{5, kDim}));
  // Same ids again, in another order and repeated: the same rows.
  Tensor again = Prefetch({INT64_MAX, 0, INT64_MAX, 1000000000000000000LL, -1, INT64_MIN});
  for (int j = 0; j < kDim; ++j) {
    EXPECT_EQ(again.data<float>()[0 * kDim + j], before.data<float>()[3 * kDim + j]);
    EXPECT_EQ(again.data<float>()[2 * kDim + j], before.data<float>()[3 * kDim + j]);
    EXPECT_EQ(again.data<float>()[5 * kDim + j], before.data<float>()[2 * kDim + j]);
  }
  // Empty batch.
  EXPECT_EQ(Prefetch({}).shape(), (Shape{0, kDim}));
  Push({}, {});

  // A batch where every id repeats: the gradients of an id are summed, one SGD step.
  std::vector<float> grad(3 * kDim, 1.0f);
  Push({INT64_MIN, INT64_MIN, INT64_MIN}, grad);
  std::vector<float> g2(5 * kDim);
  for (int i = 0; i < 5 * kDim; ++i) g2[i] = 0.25f * (i % kDim + 1);
  Push(ids, g2);
  Tensor after = Prefetch(ids);
  for (int i = 0; i < 5; ++i) {
    for (int j = 0; j < kDim; ++j) {
      float want = before.data<float>()[i * kDim + j] - kLr * g2[i * kDim + j];
      if (ids[i] == INT64_MIN) want -= kLr * 3.0f;
      EXPECT_NEAR(after.data<float>()[i * kDim + j], want, 1e-6) << "id " << ids[i];
    }
  }
  int64_t rows = 0;
  for (auto& s : servers_) rows += s->stats().table_rows;
  EXPECT_EQ(rows, 5);
}

TEST_F(TableRpcTest, RowInitDoesNotDependOnThePserverCount) {
  // Row `id` starts as row `id` of the single-machine [1000, 4] table.
  Executor exec(registry_.get());
  Scope local;
  ASSERT_TRUE(exec.Run(startup_, 0, &local).ok());
  const Tensor& table = local.FindVar("table")->Get<Tensor>();
  Tensor rows = Prefetch({7, 999, 0});
  int64_t want_rows[] = {7, 999, 0};
  for (int i = 0; i < 3; ++i) {
    for (int j = 0; j < kDim; ++j) {
      EXPECT_EQ(rows.data<float>()[i * kDim + j], table.data<float>()[want_rows[i] * kDim + j]);
    }
  }
}

}  // namespace
}  // namespace tessera
