#include "trainer/trainer_daemon.h"

#include "absl/strings/str_cat.h"
#include "common/device/placement.h"
#include "common/layers/memory_optimize.h"
#include "common/metrics/metrics.h"
#include "common/metrics/metrics_server.h"
#include "common/ops/ops.h"
#include "common/params_io.h"
#include "common/rpc/grpc/grpc_client.h"
#include "common/status.h"
#include "trainer/collective_ops.h"
#include "trainer/communicator.h"
#include "trainer/device_setup.h"
#include "trainer/local_trainer.h"
#include "trainer/rpc_ops.h"
#include "transpiler/cluster_programs.h"

namespace tessera {

absl::Status RunTrainer(const ClusterConfig& config, std::ostream& log) {
  // --device=gpu without a usable GPU (or in a CPU-only build) fails here, before any work.
  TS_ASSIGN_OR_RETURN(std::vector<Place> places, ParseDevices(config.device, config.devices));
  for (const Place& place : places) TS_RETURN_IF_ERROR(CheckPlaceAvailable(place));
  RpcContext rpc;
  rpc.job_id = config.job_id;
  rpc.trainer_id = config.trainer_id;
  GrpcClientOptions co;
  co.deadline = absl::Seconds(config.rpc_deadline_s);
  co.chunk_bytes = config.chunk_bytes;
  ClientPool pool([co](const std::string& ep) {
    return std::make_unique<GrpcPServerClient>(ep, co);
  });
  rpc.clients = &pool;
  std::unique_ptr<AsyncCommunicator> communicator;
  if (!config.sync_mode) {
    CommunicatorOptions cop;
    cop.max_merge = config.async_max_merge;
    cop.queue_capacity = config.async_max_merge;
    communicator = std::make_unique<AsyncCommunicator>(&rpc, cop);
    rpc.communicator = communicator.get();
    rpc.read_own_writes = config.async_read_own_writes;
  }

  OpRegistry registry;
  TS_RETURN_IF_ERROR(RegisterStandardOps(&registry));
  TS_RETURN_IF_ERROR(RegisterRpcOps(&registry, &rpc));

  CollectiveState collective;
  const bool collective_mode = config.mode == "collective";
  if (collective_mode) {
    collective.rank = config.trainer_id;
    collective.world_size = config.trainers;
    collective.params.endpoint = config.trainer_endpoints[0];
    collective.params.job_id = config.job_id;
    collective.params.timeout = absl::Seconds(config.barrier_timeout_s);
    TS_RETURN_IF_ERROR(RegisterCollectiveOps(&registry, &collective));
  }
  TS_ASSIGN_OR_RETURN(ModelSpec model, LoadModel(config, registry));
  std::vector<std::string> trainable;
  for (const auto& v : model.main.blocks(0).vars()) {
    if (v.trainable() && !v.is_distributed()) trainable.push_back(v.name());  // tables: pservers
  }
  ModelSpec dist = model;
  if (collective_mode) {
    TS_ASSIGN_OR_RETURN(CollectivePrograms programs,
                        TranspileCollective(model.main, model.startup));
    dist.main = programs.trainer;
    dist.startup = programs.trainer_startup;
  } else {
    TS_ASSIGN_OR_RETURN(DistributeTranspiler t,
                        DistributeTranspiler::Transpile(
                            model.main, model.startup,
                            TranspilerConfigFor(config, config.trainer_id)));
    dist.main = t.trainer_program();
    dist.startup = t.trainer_startup_program();
  }
  if (config.memory_optimize) {
    // Gradients stay intact (they are sent to the pservers); feeds and fetches keep their names.
    MemoryOptimizeOptions mo;
    mo.skip_grads = true;
    mo.skip_vars = {dist.loss, dist.prediction, dist.feeds.dense, dist.feeds.label};
    for (const auto& slot : dist.feeds.slots) mo.skip_vars.insert(slot.name);
    // Variables that RPC ops send, receive or prefetch: their names are names on the wire.
    for (const auto& op : dist.main.blocks(0).ops()) {
      if ((OpRoleOf(op) & kRoleRPC) == 0 && op.type() != "prefetch") continue;
      for (const auto& a : AllInputArgs(op)) mo.skip_vars.insert(a);
      for (const auto& a : AllOutputArgs(op)) mo.skip_vars.insert(a);
    }
    TS_ASSIGN_OR_RETURN(MemoryOptimizeStats stats, MemoryOptimize(&dist.main, mo));
    log << "trainer " << config.trainer_id << ": " << MemoryOptimizeReport(stats) << std::endl;
  }

  TS_ASSIGN_OR_RETURN(examples::ExampleData data,
                      examples::LoadExampleData(ExampleOptionsFor(config)));
  LocalTrainerOptions lo;
  lo.batch_size = config.batch_size;
  lo.epochs = config.epochs;
  lo.seed = config.seed;
  lo.num_replicas = config.trainers;
  lo.rank = config.trainer_id;
  lo.log_every_steps = config.trainer_id == 0 ? config.log_every_steps : 0;
  lo.log = &log;
  lo.before_step = [&rpc](int64_t step) { rpc.step = step; };

  // Prometheus metrics, updated after every step.
  MetricsRegistry metrics;
  std::unique_ptr<MetricsServer> metrics_server;
  if (config.metrics_port > 0) {
    MetricsServerOptions mo;
    mo.port = config.metrics_port;
    metrics_server = std::make_unique<MetricsServer>(&metrics, mo);
    TS_RETURN_IF_ERROR(metrics_server->Start());
    log << "trainer " << config.trainer_id << ": metrics on http://" << mo.host << ":"
        << metrics_server->port() << "/metrics" << std::endl;
    Labels labels = {{"trainer_id", std::to_string(config.trainer_id)}};
    Counter* steps = *metrics.GetCounter("tessera_trainer_steps_total", "Training steps.", labels);
    Counter* samples =
        *metrics.GetCounter("tessera_trainer_samples_total", "Training examples.", labels);
    Gauge* loss = *metrics.GetGauge("tessera_trainer_loss", "Loss of the last step.", labels);
    lo.after_step = [steps, samples, loss](int64_t, double l, int64_t n) {
      steps->Increment();
      samples->Increment(static_cast<double>(n));
      loss->Set(l);
    };
  }

  log << "trainer " << config.trainer_id << "/" << config.trainers << ": example "
      << config.example << ", " << data.train.examples.size() << " training examples, global batch "
      << config.batch_size << ", "
      << (collective_mode ? std::string("collective (Gloo all-reduce)")
                          : absl::StrCat("pservers ", config.pservers.size(), " (",
                                         config.sync_mode ? "sync" : "async", ")"))
      << std::endl;
  // --device=gpu: ops run through a placed registry (GPU kernels, CPU fallback).
  TS_ASSIGN_OR_RETURN(DevicePlan devices,
                      PlanTrainerDevices(config.device, config.devices, registry, dist, &lo));
  if (devices.on_gpu()) {
    log << "trainer " << config.trainer_id << ": ops on " << devices.places[0].DebugString()
        << " (CPU kernels for the rest)" << std::endl;
  }
  // Create() runs the startup program, which pulls the initial parameters from the pservers.
  TS_ASSIGN_OR_RETURN(auto trainer,
                      LocalTrainer::Create(devices.executor_registry(&registry), dist, lo));
  TS_RETURN_IF_ERROR(trainer->Train(data.train).status());
  if (devices.on_gpu()) {
    log << "trainer " << config.trainer_id << ": " << PlaceMemoryReport(devices.places[0])
        << std::endl;
  }
  if (config.trainer_id == 0 && !data.test.examples.empty()) {
    TS_ASSIGN_OR_RETURN(EvalResult eval, trainer->Evaluate(data.test));
    log << "trainer 0: held-out loss " << eval.mean_loss;
    if (eval.has_auc) log << " auc " << eval.auc;
    log << std::endl;
  }
  if (communicator != nullptr) {
    TS_RETURN_IF_ERROR(communicator->Flush());
    CommunicatorStats cs = communicator->stats();
    log << "trainer " << config.trainer_id << ": async gradients pushed=" << cs.pushed
        << " sent=" << cs.sent << std::endl;
  }
  if (collective_mode) {
    TS_RETURN_IF_ERROR(collective.context.Shutdown());
  } else {
    TS_RETURN_IF_ERROR(NotifyComplete(&rpc, config.pservers));
  }
  if (!config.dump_params.empty()) {
    if (devices.on_gpu()) MoveScopeToHost(trainer->scope());
    TS_RETURN_IF_ERROR(SaveVariables(*trainer->scope(), trainable, config.dump_params));
  }
  return absl::OkStatus();
}

}  // namespace tessera
