#include "tests/inproc_cluster.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/framework/executor.h"
#include "common/layers/layers.h"
#include "common/layers/optimizer.h"
#include "common/ops/ops.h"
#include "common/ops/sharding.h"
#include "common/rpc/inproc/inproc_client.h"
#include "gtest/gtest.h"
#include "trainer/rpc_ops.h"

namespace tessera {

InprocModel BuildInprocModel(const OpRegistry& registry, const InprocModelOptions& options) {
  InprocModel m;
  ProgramBuilder b(&m.main, &m.startup);
  std::string x = layers::Data(b, "x", {-1, kInprocFeatures});
  std::string ids = layers::Data(b, "ids", {-1, 1}, INT64);
  std::string y = layers::Data(b, "y", {-1, 1});
  layers::FcOptions h;
  h.name = "hidden";
  h.act = "relu";
  std::string hid = layers::Fc(b, x, 512, h);
  layers::EmbeddingOptions e;
  e.name = "emb";
  e.is_sparse = true;
  e.is_distributed = options.distributed_table;
  std::string emb = layers::Embedding(b, ids, options.vocab, options.emb_dim, e);
  std::vector<std::string> parts = {hid, emb};
  if (options.wide_dim > 0) {
    layers::EmbeddingOptions w = e;
    w.name = "wide";
    parts.push_back(layers::Embedding(b, ids, options.vocab, options.wide_dim, w));
  }
  std::string both = layers::Concat(b, parts, 1);
  layers::FcOptions o;
  o.name = "out";
  std::string pred = layers::Fc(b, both, 1, o);
  m.loss = layers::Mean(b, layers::SquareError(b, pred, y));
  OptimizerOptions oo;
  oo.learning_rate = options.learning_rate;
  oo.decay_steps = options.decay_steps;
  oo.decay_rate = options.decay_rate;
  std::unique_ptr<Optimizer> opt;
  if (options.optimizer == "adam") {
    opt = std::make_unique<Adam>(oo);
  } else if (options.optimizer == "adagrad") {
    opt = std::make_unique<Adagrad>(oo);
  } else {
    EXPECT_EQ(options.optimizer, "sgd") << "unknown optimizer";
    opt = std::make_unique<SGD>(oo);
  }
  EXPECT_TRUE(opt->Minimize(b, registry, m.loss).ok());
  return m;
}

void FeedInprocBatch(Scope* scope, int step, int begin, int end, int id_range) {
  int n = end - begin;
  Tensor* x = scope->Var("x")->GetMutable<Tensor>();
  Tensor* ids = scope->Var("ids")->GetMutable<Tensor>();
  Tensor* y = scope->Var("y")->GetMutable<Tensor>();
  x->Resize(FLOAT32, {n, kInprocFeatures});
  ids->Resize(INT64, {n, 1});
  y->Resize(FLOAT32, {n, 1});
  for (int i = 0; i < n; ++i) {
    int g = begin + i;
    float t = 0;
    for (int j = 0; j < kInprocFeatures; ++j) {
      float v = std::sin(0.37f * (step * 131 + g * 17 + j));
      x->data<float>()[i * kInprocFeatures + j] = v;
      t += v * (j % 3 - 1);
    }
    // Repeats within and across trainers when id_range is small.
    ids->data<int64_t>()[i] = (step * 7 + g * 13) % id_range;
    y->data<float>()[i] = t;
  }
}

std::unique_ptr<InprocJob> RunInprocJob(
    const InprocModelOptions& model_options, const InprocJobOptions& options,
    const std::function<void(int trainer, const InprocModel& model, const Scope& scope)>&
        on_trainer_done) {
  auto job = std::make_unique<InprocJob>();
  job->registry = NewStandardOpRegistry();
  job->model = BuildInprocModel(*job->registry, model_options);
  const InprocModel& m = job->model;
  for (int p = 0; p < options.pservers; ++p) job->endpoints.push_back(absl::StrCat("ps", p, ":0"));
  const std::vector<std::string>& eps = job->endpoints;
  TranspilerConfig& cfg = job->config;
  cfg.pservers = eps;
  cfg.trainers = options.trainers;
  cfg.split_method = options.split;
  cfg.slice_var_up = options.slice;
  cfg.table_placement = options.table_placement;
  cfg.fuse_tables = options.fuse_tables;

  // Pservers.
  Executor base_exec(job->registry.get());
  for (int p = 0; p < options.pservers; ++p) {
    auto t = DistributeTranspiler::Transpile(m.main, m.startup, cfg);
    EXPECT_TRUE(t.ok()) << t.status();
    job->ps_scopes.push_back(std::make_unique<Scope>());
    absl::Status s =
        base_exec.Run(*t->GetPserverStartupProgram(eps[p]), 0, job->ps_scopes.back().get());
    EXPECT_TRUE(s.ok()) << s;
    ParameterServerOptions po;
    po.job_id = "job";
    po.endpoint = eps[p];
    po.barrier_timeout = absl::Seconds(30);
    po.pserver_index = p;
    po.num_pservers = options.pservers;
    po.param_blocks = t->param_blocks();
    auto server = ParameterServer::Create(*t->GetPserverProgram(eps[p]),
                                          job->ps_scopes.back().get(), job->registry.get(), po);
    EXPECT_TRUE(server.ok()) << server.status();
    if (!options.restore_from.empty()) {
      s = (*server)->RestoreCheckpoint(options.restore_from);
      EXPECT_TRUE(s.ok()) << s;
    }
    job->servers.push_back(std::move(*server));
  }
  std::map<std::string, RequestHandler*> handlers;
  for (int p = 0; p < options.pservers; ++p) handlers[eps[p]] = job->servers[p].get();

  // Trainers as threads.
  std::vector<std::thread> threads;
  for (int k = 0; k < options.trainers; ++k) {
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
      rpc.step = options.first_step;
      OpRegistry registry;
      ASSERT_TRUE(RegisterStandardOps(&registry).ok());
      ASSERT_TRUE(RegisterRpcOps(&registry, &rpc).ok());
      Executor exec(&registry);
      Scope scope;
      absl::Status s = exec.Run(t->trainer_startup_program(), 0, &scope);
      ASSERT_TRUE(s.ok()) << s;
      const int per = options.batch / options.trainers;
      for (int step = options.first_step; step < options.last_step; ++step) {
        rpc.step = step;
        FeedInprocBatch(&scope, step, k * per, (k + 1) * per, options.id_range);
        s = exec.Run(t->trainer_program(), 0, &scope);
        ASSERT_TRUE(s.ok()) << "trainer " << k << " step " << step << ": " << s;
      }
      if (options.notify_complete) {
        ASSERT_TRUE(NotifyComplete(&rpc, eps).ok());
      }
      on_trainer_done(k, m, scope);
    });
  }
  for (auto& th : threads) th.join();
  if (options.notify_complete) {
    for (auto& s : job->servers) EXPECT_TRUE(s->Wait().ok());
  }
  return job;
}

std::map<int64_t, std::vector<float>> GatherTableRows(const InprocJob& job,
                                                      const std::string& table, int vocab,
                                                      int dim, int64_t step) {
  std::map<int64_t, std::vector<float>> rows;
  const int pservers = job.servers.size();
  // Where the pservers hold the table: the pserver table (itself, or its group: the consecutive
  // sparse_table ops naming it), its columns there, and table-wise the one pserver holding it.
  std::string served = table;
  int64_t offset = 0, width = dim;
  int holder = -1;
  auto t = DistributeTranspiler::Transpile(job.model.main, job.model.startup, job.config);
  EXPECT_TRUE(t.ok()) << t.status();
  for (int p = 0; t.ok() && p < pservers; ++p) {
    const absl::StatusOr<ProgramDesc> program = t->GetPserverProgram(job.endpoints[p]);
    EXPECT_TRUE(program.ok()) << program.status();
    if (!program.ok()) continue;
    std::map<std::string, int64_t> group_width;  // of each group's members so far, in op order
    for (const OpDesc& op : program->blocks(0).ops()) {
      if (op.type() != "sparse_table") continue;
      const std::string group = GetStringAttr(op, "group", "");
      if (group.empty()) {
        if (GetStringAttr(op, "table", "") == table) holder = p;
        continue;
      }
      if (GetStringAttr(op, "table", "") == table) {
        holder = p;
        served = group;
        offset = group_width[group];
      }
      group_width[group] += GetIntAttr(op, "dim", 0);
    }
    if (holder == p && served != table) width = group_width[served];
  }
  EXPECT_GE(holder, 0) << "no pserver holds " << table;
  if (holder < 0) return rows;
  const bool whole = job.config.table_placement == TablePlacement::kTableWise;
  for (int64_t id = 0; id < vocab; ++id) {
    const int owner = whole ? holder : ShardOf(id, pservers, ShardMethod::kHash);
    job.servers[owner]->HandlePrefetch(
        {"job", 0, step}, served, {id}, [&](absl::StatusOr<Tensor> row) {
          ASSERT_TRUE(row.ok()) << row.status();
          ASSERT_EQ(row->numel(), width) << served;
          rows[id].assign(row->data<float>() + offset, row->data<float>() + offset + dim);
        });
  }
  return rows;
}

double WorstRelativeError(const Tensor& got, const Tensor& want, double floor) {
  double worst = 0;
  for (int64_t i = 0; i < want.numel(); ++i) {
    double x = got.data<float>()[i], y = want.data<float>()[i];
    worst = std::max(worst, std::fabs(x - y) / std::max(floor, std::fabs(y)));
  }
  return worst;
}

}  // namespace tessera
