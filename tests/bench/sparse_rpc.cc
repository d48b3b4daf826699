// End-to-end distributed-table step rate: each step prefetches 4096 Zipf-distributed ids
// (alpha 1.1, 10^7 distinct, dim 16) from one pserver over gRPC on loopback and pushes their
// sparse gradient back (lookup_sparse_grad -> split_by_shard -> send), async mode as the trainer
// runs it (pushes go through the background AsyncCommunicator, overlapping the next prefetch;
// every push is applied before the clock stops), 1 trainer.
// Baseline measured in the same run: the same lookups + updates on the pserver's table in
// process (no RPC). Prints steps/s of both and the ratio.
//
//   bazel run -c opt //tests/bench:sparse_rpc -- [--seconds=5]
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>

#include "absl/strings/numbers.h"
#include "common/data/synthetic.h"
#include "common/executor.h"
#include "common/status.h"
#include "common/layers/layers.h"
#include "common/layers/optimizer.h"
#include "common/ops/ops.h"
#include "common/rpc/grpc/grpc_client.h"
#include "common/rpc/grpc/grpc_server.h"
#include "deploy/launch/launcher.h"
#include "pserver/parameter_server.h"
#include "trainer/communicator.h"
#include "trainer/rpc_ops.h"
#include "transpiler/distribute_transpiler.h"

namespace tessera {
namespace {

constexpr int kDim = 16;
constexpr int kIds = 4096;

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

int Run(double seconds) {
  auto registry = NewStandardOpRegistry();
  ProgramDesc main, startup;
  ProgramBuilder b(&main, &startup);
  std::string ids = layers::Data(b, "ids", {-1, 1}, INT64);
  layers::EmbeddingOptions e;
  e.name = "table";
  e.is_sparse = true;
  e.is_distributed = true;
  std::string loss = layers::Mean(b, layers::Embedding(b, ids, 10000000, kDim, e));
  OptimizerOptions oo;
  oo.learning_rate = 0.01f;
  if (!Adagrad(oo).Minimize(b, *registry, loss).ok()) return 1;

  auto port = PickFreePort("127.0.0.1");
  if (!port.ok()) return 1;
  std::string ep = "127.0.0.1:" + std::to_string(*port);
  TranspilerConfig cfg;
  cfg.pservers = {ep};
  cfg.sync_mode = false;
  auto t = DistributeTranspiler::Transpile(main, startup, cfg);
  if (!t.ok()) {
    std::fprintf(stderr, "%s\n", t.status().ToString().c_str());
    return 1;
  }
  Scope ps_scope;
  Executor exec(registry.get());
  if (!exec.Run(*t->GetPserverStartupProgram(ep), 0, &ps_scope).ok()) return 1;
  ParameterServerOptions po;
  po.job_id = "bench";
  po.endpoint = ep;
  auto ps = ParameterServer::Create(*t->GetPserverProgram(ep), &ps_scope, registry.get(), po);
  if (!ps.ok()) return 1;
  GrpcServer server(GrpcServerOptions{ep}, ps->get());
  if (!server.Start().ok()) return 1;

  ClientPool pool([](const std::string& endpoint) {
    return std::make_unique<GrpcPServerClient>(endpoint, GrpcClientOptions());
  });
  RpcContext rpc;
  rpc.job_id = "bench";
  rpc.clients = &pool;
  AsyncCommunicator communicator(&rpc, CommunicatorOptions());
  rpc.communicator = &communicator;
  OpRegistry ops;
  if (!RegisterStandardOps(&ops).ok() || !RegisterRpcOps(&ops, &rpc).ok()) return 1;
  Executor trainer(&ops);
  Scope scope;
  OpDesc prefetch = MakeOp("prefetch", {{"Ids", {"ids"}}}, {{"Out", {"rows"}}});
  SetAttr(&prefetch, "table", "table");
  SetAttr(&prefetch, "epmap", std::vector<std::string>{ep});
  SetAttr(&prefetch, "dim", int64_t{kDim});
  OpDesc grad = MakeOp("lookup_sparse_grad", {{"Ids", {"ids"}}, {"Out@GRAD", {"rows"}}},
                       {{"W@GRAD", {"g"}}});
  OpDesc split = MakeOp("split_by_shard", {{"X", {"g"}}}, {{"Out", {"table@GRAD.shard0"}}});
  OpDesc send = MakeOp("send", {{"X", {"table@GRAD.shard0"}}}, {});
  SetAttr(&send, "epmap", std::vector<std::string>{ep});
  SetAttr(&send, "sync_mode", false);

  auto zipf = data::ZipfSampler::Create(10000000, 1.1, 7);
  Tensor* id_tensor = scope.Var("ids")->GetMutable<Tensor>();
  id_tensor->Resize(INT64, {kIds, 1});
  auto fill_ids = [&] {
    for (int i = 0; i < kIds; ++i) id_tensor->data<int64_t>()[i] = zipf->Next();
  };
  auto step = [&]() -> absl::Status {
    fill_ids();
    TS_RETURN_IF_ERROR(trainer.RunOp(prefetch, &scope));
    TS_RETURN_IF_ERROR(trainer.RunOp(grad, &scope));
    TS_RETURN_IF_ERROR(trainer.RunOp(split, &scope));
    return trainer.RunOp(send, &scope);
  };
  for (int i = 0; i < 50; ++i) {  // warm up (connections, first rows)
    absl::Status s = step();
    if (!s.ok()) {
      std::fprintf(stderr, "%s\n", s.ToString().c_str());
      return 1;
    }
  }
  int64_t steps = 0;
  double start = Now();
  while (Now() - start < seconds) {
    if (!step().ok()) return 1;
    ++steps;
  }
  if (!communicator.Flush().ok()) return 1;
  double rpc_rate = steps / (Now() - start);
  CommunicatorStats cs = communicator.stats();

  // Baseline: the same work on an in-process table (no RPC, no ops).
  SparseTableOptions to;
  to.dim = kDim;
  to.optimizer = "adagrad";
  auto table = SparseTable::Create(to);
  std::vector<int64_t> batch(kIds);
  std::vector<float> rows(kIds * kDim);
  int64_t local = 0;
  start = Now();
  while (Now() - start < seconds) {
    for (auto& id : batch) id = zipf->Next();
    if (!(*table)->Lookup(batch, rows.data()).ok()) return 1;
    if (!(*table)->ApplyGradients(batch, rows.data(), 0.01f, local + 1).ok()) return 1;
    ++local;
  }
  double local_rate = local / (Now() - start);
  std::printf("prefetch+push over gRPC: %.0f steps/s (%d ids/step, dim %d, 1 trainer, 1 pserver)\n",
              rpc_rate, kIds, kDim);
  std::printf("in-process table lookup+update (baseline): %.0f steps/s\n", local_rate);
  std::printf("ratio rpc/in-process: %.2f (pushes: %lld gradients in %lld messages)\n",
              rpc_rate / local_rate, static_cast<long long>(cs.pushed),
              static_cast<long long>(cs.sent));
  server.Shutdown();
  return 0;
}

}  // namespace
}  // namespace tessera

int main(int argc, char** argv) {
  double seconds = 5;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind("--seconds=", 0) == 0 && !absl::SimpleAtod(a.substr(10), &seconds)) {
      std::fprintf(stderr, "sparse_rpc: %s: not a number\n", a.c_str());
      return 2;
    }
  }
  return tessera::Run(seconds);
}
