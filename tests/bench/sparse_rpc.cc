// End-to-end distributed-table step rate: each step prefetches 4096 Zipf-distributed ids
// (alpha 1.1, 10^7 distinct, dim 16) from one pserver over gRPC on loopback and pushes their
// sparse gradient back (lookup_sparse_grad -> split_by_shard -> send), async mode as the trainer
// runs it (pushes go through the background AsyncCommunicator, overlapping the next prefetch;
// every push is applied before the clock stops), 1 trainer. The pserver (GrpcServer +
// ParameterServer) runs in a child process, as a deployment runs it.
// Baseline measured in the same run: the same lookups + updates on an in-process table (no
// RPC), after the child is gone. Prints steps/s of both and the ratio, and the trainer thread's
// time per op per step (prefetch includes waiting for the pserver).
//
// With --pin the pserver process runs on CPU 1 and the trainer process (all its threads) on CPU 0
// (on other machines each would have its own cores); without it they share every CPU.
//
//   bazel run -c opt //tests/bench:sparse_rpc -- [--steps=4000] [--pin]
#include <dirent.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "common/data/synthetic.h"
#include "common/framework/executor.h"
#include "common/layers/layers.h"
#include "common/layers/optimizer.h"
#include "common/base/malloc_tuning.h"
#include "common/ops/ops.h"
#include "common/rpc/grpc/grpc_client.h"
#include "common/rpc/grpc/grpc_server.h"
#include "common/base/status.h"
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

// Binds the calling process (its threads started from now on) to one CPU.
bool PinToCpu(int cpu) {
  cpu_set_t set;
  CPU_ZERO(&set);
  CPU_SET(cpu, &set);
  if (sched_setaffinity(0, sizeof(set), &set) == 0) return true;
  std::fprintf(stderr, "sparse_rpc: cannot bind to CPU %d: %s\n", cpu, std::strerror(errno));
  return false;
}

// CPU seconds (user + system, all threads) of process `pid`, from /proc/<pid>/stat.
double CpuSeconds(pid_t pid) {
  std::ifstream f("/proc/" + std::to_string(pid) + "/stat");
  std::string line;
  std::getline(f, line);
  size_t close = line.rfind(')');
  if (close == std::string::npos) return 0;
  std::istringstream rest(line.substr(close + 2));
  std::string field;
  double utime = 0, stime = 0;
  for (int i = 3; i <= 15 && rest >> field; ++i) {
    if (i == 14) utime = std::stod(field);
    if (i == 15) stime = std::stod(field);
  }
  return (utime + stime) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

// Context switches (voluntary + involuntary) of the live threads of process `pid`.
int64_t ContextSwitches(pid_t pid) {
  const std::string tasks = "/proc/" + std::to_string(pid) + "/task";
  int64_t total = 0;
  DIR* dir = opendir(tasks.c_str());
  if (dir == nullptr) return 0;
  while (dirent* e = readdir(dir)) {
    if (e->d_name[0] == '.') continue;
    std::ifstream f(tasks + "/" + e->d_name + "/status");
    std::string line;
    while (std::getline(f, line)) {
      int64_t n = 0;
      if (line.find("ctxt_switches:") != std::string::npos &&
          absl::SimpleAtoi(absl::StripAsciiWhitespace(line.substr(line.find(':') + 1)), &n)) {
        total += n;
      }
    }
  }
  closedir(dir);
  return total;
}

int Run(int steps_to_run, bool pin) {
  // The id stream is generated before the clocks start (a trainer reads ids from its data; the
  // sampler is not what is measured), and both runs replay the same stream on a fresh table.
  constexpr int kWarmup = 50;
  auto zipf = data::ZipfSampler::Create(10000000, 1.1, 7);
  std::vector<int64_t> stream(static_cast<size_t>(kWarmup + steps_to_run) * kIds);
  for (auto& id : stream) id = zipf->Next();

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
  // The pserver: forked before any thread exists; reports "ready" on a pipe, then serves until
  // the parent kills it (or dies: PR_SET_PDEATHSIG).
  int ready[2];
  if (pipe(ready) != 0) return 1;
  const pid_t parent = getpid();
  const pid_t child = fork();
  if (child < 0) return 1;
  if (child == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (pin && !PinToCpu(1)) _exit(1);
    if (getppid() != parent) _exit(1);
    close(ready[0]);
    Scope ps_scope;
    Executor exec(registry.get());
    if (!exec.Run(*t->GetPserverStartupProgram(ep), 0, &ps_scope).ok()) _exit(1);
    ParameterServerOptions po;
    po.job_id = "bench";
    po.endpoint = ep;
    auto ps = ParameterServer::Create(*t->GetPserverProgram(ep), &ps_scope, registry.get(), po);
    if (!ps.ok()) _exit(1);
    GrpcServer server(GrpcServerOptions{ep}, ps->get());
    if (!server.Start().ok()) _exit(1);
    if (write(ready[1], "r", 1) != 1) _exit(1);
    for (;;) pause();
  }
  close(ready[1]);
  if (pin && !PinToCpu(0)) return 1;
  struct Reaper {
    pid_t pid;
    ~Reaper() {
      if (pid > 0) {
        kill(pid, SIGKILL);
        waitpid(pid, nullptr, 0);
      }
    }
  } reaper{child};
  pollfd pfd{ready[0], POLLIN, 0};
  char c;
  if (poll(&pfd, 1, 30000) != 1 || read(ready[0], &c, 1) != 1) {
    std::fprintf(stderr, "sparse_rpc: the pserver child did not start within 30 s\n");
    return 1;
  }
  close(ready[0]);

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
  OpDesc grad =
      MakeOp("lookup_sparse_grad", {{"Ids", {"ids"}}, {"Out@GRAD", {"rows"}}}, {{"W@GRAD", {"g"}}});
  OpDesc split = MakeOp("split_by_shard", {{"X", {"g"}}}, {{"Out", {"table@GRAD.shard0"}}});
  OpDesc send = MakeOp("send", {{"X", {"table@GRAD.shard0"}}}, {});
  SetAttr(&send, "epmap", std::vector<std::string>{ep});
  SetAttr(&send, "sync_mode", false);

  Tensor* id_tensor = scope.Var("ids")->GetMutable<Tensor>();
  id_tensor->Resize(INT64, {kIds, 1});
  // Wall time of each op on the trainer thread (the step's critical path), summed over steps.
  double op_seconds[4] = {0, 0, 0, 0};
  auto step = [&](int s) -> absl::Status {
    std::memcpy(id_tensor->data<int64_t>(), stream.data() + static_cast<size_t>(s) * kIds,
                kIds * sizeof(int64_t));
    const OpDesc* ops_in_order[4] = {&prefetch, &grad, &split, &send};
    for (int k = 0; k < 4; ++k) {
      const double t0 = Now();
      TS_RETURN_IF_ERROR(trainer.RunOp(*ops_in_order[k], &scope));
      op_seconds[k] += Now() - t0;
    }
    return absl::OkStatus();
  };
  for (int i = 0; i < kWarmup; ++i) {  // warm up (connections, first rows)
    absl::Status s = step(i);
    if (!s.ok()) {
      std::fprintf(stderr, "%s\n", s.ToString().c_str());
      return 1;
    }
  }
  for (double& t : op_seconds) t = 0;
  double start = Now();
  const double trainer_cpu0 = CpuSeconds(getpid()), pserver_cpu0 = CpuSeconds(child);
  const int64_t trainer_cs0 = ContextSwitches(getpid()), pserver_cs0 = ContextSwitches(child);
  for (int i = kWarmup; i < kWarmup + steps_to_run; ++i) {
    if (!step(i).ok()) return 1;
  }
  if (!communicator.Flush().ok()) return 1;
  double rpc_rate = steps_to_run / (Now() - start);
  const double trainer_cpu = CpuSeconds(getpid()) - trainer_cpu0;
  const double pserver_cpu = CpuSeconds(child) - pserver_cpu0;
  const int64_t trainer_cs = ContextSwitches(getpid()) - trainer_cs0;
  const int64_t pserver_cs = ContextSwitches(child) - pserver_cs0;
  CommunicatorStats cs = communicator.stats();
  kill(reaper.pid, SIGKILL);
  waitpid(reaper.pid, nullptr, 0);
  reaper.pid = 0;

  // Baseline: the same work on an in-process table (no RPC, no ops).
  SparseTableOptions to;
  to.dim = kDim;
  to.optimizer = "adagrad";
  auto table = SparseTable::Create(to);
  std::vector<int64_t> batch(kIds);
  std::vector<float> rows(kIds * kDim);
  auto local_step = [&](int s) {
    std::memcpy(batch.data(), stream.data() + static_cast<size_t>(s) * kIds,
                kIds * sizeof(int64_t));
    return (*table)->Lookup(batch, rows.data()).ok() &&
           (*table)->ApplyGradients(batch, rows.data(), 0.01f, s + 1).ok();
  };
  for (int i = 0; i < kWarmup; ++i) {
    if (!local_step(i)) return 1;
  }
  start = Now();
  for (int i = kWarmup; i < kWarmup + steps_to_run; ++i) {
    if (!local_step(i)) return 1;
  }
  double local_rate = steps_to_run / (Now() - start);
  std::printf("prefetch+push over gRPC: %.0f steps/s (%d ids/step, dim %d, 1 trainer, 1 pserver)\n",
              rpc_rate, kIds, kDim);
  std::printf(
      "trainer thread per step: prefetch %.0f us, lookup_sparse_grad %.0f us, "
      "split_by_shard %.0f us, send %.0f us\n",
      1e6 * op_seconds[0] / steps_to_run, 1e6 * op_seconds[1] / steps_to_run,
      1e6 * op_seconds[2] / steps_to_run, 1e6 * op_seconds[3] / steps_to_run);
  std::printf(
      "per step: CPU trainer process %.0f us, pserver process %.0f us; context switches "
      "trainer %.1f, pserver %.1f\n",
      1e6 * trainer_cpu / steps_to_run, 1e6 * pserver_cpu / steps_to_run,
      static_cast<double>(trainer_cs) / steps_to_run,
      static_cast<double>(pserver_cs) / steps_to_run);
  std::printf("in-process table lookup+update (baseline): %.0f steps/s\n", local_rate);
  std::printf("ratio rpc/in-process: %.2f (pushes: %lld gradients in %lld messages)\n",
              rpc_rate / local_rate, static_cast<long long>(cs.pushed),
              static_cast<long long>(cs.sent));
  return 0;
}

}  // namespace
}  // namespace tessera

int main(int argc, char** argv) {
  // Both halves of the cluster live in this process: tune malloc as both daemons do.
  tessera::TuneMallocForLargeBuffers();
  int steps = 4000;
  bool pin = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--pin") {
      pin = true;
    } else if (a.rfind("--steps=", 0) != 0 || !absl::SimpleAtoi(a.substr(8), &steps) || steps < 1) {
      std::fprintf(stderr, "sparse_rpc: bad argument '%s' (usage: [--steps=N, N >= 1] [--pin])\n",
                   a.c_str());
      return 2;
    }
  }
  if (pin) {
    cpu_set_t set;
    if (sched_getaffinity(0, sizeof(set), &set) != 0 || !CPU_ISSET(0, &set) ||
        !CPU_ISSET(1, &set)) {
      std::fprintf(stderr, "sparse_rpc: --pin needs CPUs 0 and 1\n");
      return 2;
    }
  }
  return tessera::Run(steps, pin);
}
