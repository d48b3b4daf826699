// Parameter-server mode with trainers and pservers as threads of one process (in-process RPC):
// sync training with N trainers, each fed 1/N of every global batch, ends with the same
// parameters as single-machine training on the full batches.
#include <cmath>
#include <thread>

#include "absl/strings/str_cat.h"
#include "common/executor.h"
#include "common/layers/layers.h"
#include "common/layers/optimizer.h"
#include "common/ops/ops.h"
#include "common/ops/sharding.h"
#include "common/rpc/inproc/inproc_client.h"
#include "gtest/gtest.h"
#include "pserver/parameter_server.h"
#include "trainer/rpc_ops.h"
#include "transpiler/distribute_transpiler.h"

namespace tessera {
namespace {

constexpr int kFeatures = 20;
constexpr int kVocab = 1000;

struct Model {
  ProgramDesc main, startup;
  std::string loss;
};

// x [-1, 20] -> fc 512 relu (10240 weights: sliced) -> concat with a sparse embedding of ids
// (1000 x 16: sliced, SelectedRows gradient) -> fc 1 -> mean square error.
Model BuildModel(const OpRegistry& registry, const std::string& optimizer,
                 bool distributed_table = false) {
  Model m;
  ProgramBuilder b(&m.main, &m.startup);
  std::string x = layers::Data(b, "x", {-1, kFeatures});
  std::string ids = layers::Data(b, "ids", {-1, 1}, INT64);
  std::string y = layers::Data(b, "y", {-1, 1});
  layers::FcOptions h;
  h.name = "hidden";
  h.act = "relu";
  std::string hid = layers::Fc(b, x, 512, h);
  layers::EmbeddingOptions e;
  e.name = "emb";
  e.is_sparse = true;
  e.is_distributed = distributed_table;
  std::string emb = layers::Embedding(b, ids, kVocab, 16, e);
  std::string both = layers::Concat(b, {hid, emb}, 1);
  layers::FcOptions o;
  o.name = "out";
  std::string pred = layers::Fc(b, both, 1, o);
  m.loss = layers::Mean(b, layers::SquareError(b, pred, y));
  OptimizerOptions oo;
  oo.learning_rate = 0.01f;
  oo.decay_steps = 2;  // a learning-rate schedule: it runs in its own block on the pservers
  oo.decay_rate = 0.5f;
  std::unique_ptr<Optimizer> opt;
  if (optimizer == "adam") {
    opt = std::make_unique<Adam>(oo);
  } else if (optimizer == "adagrad") {
    opt = std::make_unique<Adagrad>(oo);
  } else {
    opt = std::make_unique<SGD>(oo);
  }
  EXPECT_TRUE(opt->Minimize(b, registry, m.loss).ok());
  return m;
}

// Rows [begin, end) of the global batch for `step`.
void Feed(Scope* scope, int step, int begin, int end) {
  int n = end - begin;
  Tensor* x = scope->Var("x")->GetMutable<Tensor>();
  Tensor* ids = scope->Var("ids")->GetMutable<Tensor>();
  Tensor* y = scope->Var("y")->GetMutable<Tensor>();
  x->Resize(FLOAT32, {n, kFeatures});
  ids->Resize(INT64, {n, 1});
  y->Resize(FLOAT32, {n, 1});
  for (int i = 0; i < n; ++i) {
    int g = begin + i;
    float t = 0;
    for (int j = 0; j < kFeatures; ++j) {
      float v = std::sin(0.37f * (step * 131 + g * 17 + j));
      x->data<float>()[i * kFeatures + j] = v;
      t += v * (j % 3 - 1);
    }
    ids->data<int64_t>()[i] = (step * 7 + g * 13) % 50;  // repeats within and across trainers
    y->data<float>()[i] = t;
  }
}

constexpr int kBatch = 12;
constexpr int kSteps = 4;

std::map<std::string, Tensor> SingleMachine(const std::string& optimizer) {
  auto registry = NewStandardOpRegistry();
  Model m = BuildModel(*registry, optimizer);
  Executor exec(registry.get());
  Scope scope;
  EXPECT_TRUE(exec.Run(m.startup, 0, &scope).ok());
  for (int step = 0; step < kSteps; ++step) {
    Feed(&scope, step, 0, kBatch);
    absl::Status s = exec.Run(m.main, 0, &scope);
    EXPECT_TRUE(s.ok()) << s;
  }
  std::map<std::string, Tensor> params;
  for (const auto& v : m.main.blocks(0).vars()) {
    if (v.trainable()) params[v.name()] = scope.FindVar(v.name())->Get<Tensor>().Clone();
  }
  return params;
}

struct Cluster {
  int trainers;
  int pservers;
  SplitMethod split = SplitMethod::kRoundRobin;
  bool slice = true;
  std::string optimizer = "sgd";
  bool distributed_table = false;  // "emb" lives only on the pservers
};

std::map<std::string, Tensor> Distributed(const Cluster& c) {
  auto base = NewStandardOpRegistry();
  Model m = BuildModel(*base, c.optimizer, c.distributed_table);
  std::vector<std::string> eps;
  for (int p = 0; p < c.pservers; ++p) eps.push_back(absl::StrCat("ps", p, ":0"));
  TranspilerConfig cfg;
  cfg.pservers = eps;
  cfg.trainers = c.trainers;
  cfg.split_method = c.split;
  cfg.slice_var_up = c.slice;

  // Pservers.
  std::vector<std::unique_ptr<Scope>> ps_scopes;
  std::vector<std::unique_ptr<ParameterServer>> servers;
  Executor base_exec(base.get());
  for (const auto& ep : eps) {
    auto t = DistributeTranspiler::Transpile(m.main, m.startup, cfg);
    EXPECT_TRUE(t.ok()) << t.status();
    auto prog = t->GetPserverProgram(ep);
    auto startup = t->GetPserverStartupProgram(ep);
    ps_scopes.push_back(std::make_unique<Scope>());
    absl::Status s = base_exec.Run(*startup, 0, ps_scopes.back().get());
    EXPECT_TRUE(s.ok()) << s;
    ParameterServerOptions po;
    po.job_id = "job";
    po.endpoint = ep;
    po.barrier_timeout = absl::Seconds(30);
    auto server = ParameterServer::Create(*prog, ps_scopes.back().get(), base.get(), po);
    EXPECT_TRUE(server.ok()) << server.status();
    servers.push_back(std::move(*server));
  }
  std::map<std::string, RequestHandler*> handlers;
  for (int p = 0; p < c.pservers; ++p) handlers[eps[p]] = servers[p].get();

  // Trainers as threads.
  std::vector<std::map<std::string, Tensor>> results(c.trainers);
  std::vector<std::thread> threads;
  for (int k = 0; k < c.trainers; ++k) {
    threads.emplace_back([&, k] {
      TranspilerConfig tc = cfg;
      tc.trainer_id = k;
      auto t = DistributeTranspiler::Transpile(m.main, m.startup, tc);
      ASSERT_TRUE(t.ok()) << t.status();
      ClientPool pool([&](const std::string& ep) {
        return std::make_unique<InProcClient>(ep, handlers.at(ep));
      });
      RpcContext rpc;
      rpc.job_id = "job";
      rpc.trainer_id = k;
      rpc.clients = &pool;
      OpRegistry registry;
      ASSERT_TRUE(RegisterStandardOps(&registry).ok());
      ASSERT_TRUE(RegisterRpcOps(&registry, &rpc).ok());
      Executor exec(&registry);
      Scope scope;
      absl::Status s = exec.Run(t->trainer_startup_program(), 0, &scope);
      ASSERT_TRUE(s.ok()) << s;
      int per = kBatch / c.trainers;
      for (int step = 0; step < kSteps; ++step) {
        rpc.step = step;
        Feed(&scope, step, k * per, (k + 1) * per);
        s = exec.Run(t->trainer_program(), 0, &scope);
        ASSERT_TRUE(s.ok()) << "trainer " << k << " step " << step << ": " << s;
      }
      ASSERT_TRUE(NotifyComplete(&rpc, eps).ok());
      for (const auto& v : m.main.blocks(0).vars()) {
        if (!v.trainable()) continue;
        if (v.is_distributed()) {
          EXPECT_EQ(scope.FindVar(v.name()), nullptr) << "a distributed table on a trainer";
          continue;
        }
        results[k][v.name()] = scope.FindVar(v.name())->Get<Tensor>().Clone();
      }
    });
  }
  for (auto& th : threads) th.join();
  for (auto& s : servers) EXPECT_TRUE(s->Wait().ok());
  if (c.distributed_table) {  // gather the table's rows by id from the owning pservers
    Tensor table(FLOAT32, {kVocab, 16});
    for (int64_t id = 0; id < kVocab; ++id) {
      int owner = ShardOf(id, c.pservers, ShardMethod::kHash);
      servers[owner]->HandlePrefetch({"job", 0, 0}, "emb", {id}, [&](absl::StatusOr<Tensor> row) {
        ASSERT_TRUE(row.ok()) << row.status();
        std::memcpy(table.data<float>() + id * 16, row->data<float>(), 16 * sizeof(float));
      });
    }
    results[0]["emb"] = table;
  }
  // Every trainer ends with identical parameters.
  for (int k = 1; k < c.trainers; ++k) {
    for (const auto& [name, t] : results[0]) {
      if (name == "emb" && c.distributed_table) continue;  // gathered from the pservers
      EXPECT_EQ(0, std::memcmp(t.raw_data(), results[k][name].raw_data(), t.nbytes())) << name;
    }
  }
  return results[0];
}

void ExpectClose(const std::map<std::string, Tensor>& a, const std::map<std::string, Tensor>& b) {
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [name, t] : a) {
    const Tensor& u = b.at(name);
    ASSERT_EQ(t.shape(), u.shape()) << name;
    double worst = 0;
    for (int64_t i = 0; i < t.numel(); ++i) {
      double x = t.data<float>()[i], y = u.data<float>()[i];
      // Relative error, with values below 1e-2 compared to 1e-7 absolute (float32 rounding).
      worst = std::max(worst, std::fabs(x - y) / std::max(1e-2, std::fabs(y)));
    }
    EXPECT_LT(worst, 1e-5) << name;
  }
}

class PsInprocTest : public ::testing::TestWithParam<Cluster> {};

TEST_P(PsInprocTest, SyncEqualsSingleMachine) {
  const Cluster& c = GetParam();
  ExpectClose(Distributed(c), SingleMachine(c.optimizer));
}

INSTANTIATE_TEST_SUITE_P(
    Clusters, PsInprocTest,
    ::testing::Values(Cluster{2, 2, SplitMethod::kRoundRobin, true, "sgd"},
                      Cluster{2, 2, SplitMethod::kHashName, true, "sgd"},
                      Cluster{2, 2, SplitMethod::kRoundRobin, false, "sgd"},
                      Cluster{2, 2, SplitMethod::kRoundRobin, true, "adam"},
                      Cluster{2, 2, SplitMethod::kHashName, false, "adam"},
                      Cluster{3, 3, SplitMethod::kRoundRobin, true, "sgd"},
                      Cluster{3, 3, SplitMethod::kHashName, true, "adam"},
                      Cluster{2, 2, SplitMethod::kRoundRobin, true, "sgd", true},
                      Cluster{2, 2, SplitMethod::kHashName, true, "adam", true},
                      Cluster{3, 3, SplitMethod::kRoundRobin, false, "adagrad", true}));

}  // namespace
}  // namespace tessera
