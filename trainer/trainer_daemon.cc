#include "trainer/trainer_daemon.h"

#include "absl/cleanup/cleanup.h"
#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "cluster/cluster_programs.h"
#include "cluster/job_fields.h"
#include "common/device/placement.h"
#include "common/io/checkpoint_io.h"
#include "common/layers/memory_optimize.h"
#include "common/metrics/metrics.h"
#include "common/metrics/metrics_server.h"
#include "common/metrics/trace.h"
#include "common/ops/ops.h"
#include "common/params_io.h"
#include "common/rpc/grpc/credentials.h"
#include "common/rpc/grpc/grpc_client.h"
#include "common/rpc/request_checks.h"
#include "common/rpc/rpc_metrics.h"
#include "common/status.h"
#include "trainer/collective_ops.h"
#include "trainer/checkpoints.h"
#include "trainer/communicator.h"
#include "trainer/device_setup.h"
#include "trainer/heartbeat.h"
#include "trainer/local_trainer.h"
#include "trainer/training_data.h"
#include "trainer/op_timing.h"
#include "trainer/rpc_ops.h"

namespace tessera {

namespace {

// The error a failed trainer passes to the pservers with its ABORT: one printable line of at most
// kMaxAbortReasonBytes.
std::string AbortReason(const absl::Status& error) {
  std::string reason(error.message());
  for (char& c : reason) {
    if (static_cast<unsigned char>(c) < 0x20 || c == 0x7f) c = ' ';
  }
  if (reason.size() > kMaxAbortReasonBytes) {
    reason.resize(kMaxAbortReasonBytes - 3);
    reason += "...";
  }
  return reason;
}

// The client options every connection of this trainer to a pserver uses.
absl::StatusOr<GrpcClientOptions> ClientOptionsFor(const ClusterConfig& config) {
  GrpcClientOptions co;
  co.deadline = absl::Seconds(config.rpc_deadline_s);
  co.chunk_bytes = config.chunk_bytes;
  co.keepalive = absl::Seconds(config.keepalive_s);
  co.abort_deadline = std::min(absl::Seconds(2), absl::Seconds(config.connect_timeout_s));
  TS_ASSIGN_OR_RETURN(co.security, LoadRpcSecurity(config.tls_cert, config.tls_key, config.tls_ca,
                                                   config.job_token, config.job_token_file));
  return co;
}

// A trainer that stops with an error, at start (RunTrainer) or while training (Train), tells
// every pserver (ABORT, with the error) so that they fail the job at once and pass the cause on
// to the other trainers, instead of waiting for this one at a barrier until --barrier_timeout_s.
// Best effort, all pservers at once, each bounded by the client's abort deadline; over fresh
// connections, so that it works for failures before any was made.
void AbortPservers(const ClusterConfig& config, const absl::Status& error) {
  if (config.mode == "collective" || config.pservers.empty()) return;
  absl::StatusOr<GrpcClientOptions> co = ClientOptionsFor(config);
  if (!co.ok()) return;  // no way to reach them (the TLS files are the failure)
  std::vector<std::unique_ptr<GrpcPServerClient>> clients;
  for (const std::string& ep : config.pservers) {
    clients.push_back(std::make_unique<GrpcPServerClient>(ep, *co));
  }
  RequestMeta meta;
  meta.job_id = config.job_id;
  meta.trainer_id = config.trainer_id;
  const std::string reason = AbortReason(error);
  StatusGroup group(static_cast<int>(clients.size()));
  for (auto& client : clients) client->AbortAsync(meta, reason, group.Callback());
  (void)group.Wait();  // the trainer's own error is what it reports
}

absl::Status Train(const ClusterConfig& config, std::ostream& log, DaemonPhase* phase) {
  // Metrics (served with --metrics_port) and the --trace timeline come first: the RPC clients
  // and the timed op kernels below report into them.
  MetricsRegistry metrics;
  const Labels trainer_label = {{"trainer_id", std::to_string(config.trainer_id)}};
  TS_ASSIGN_OR_RETURN(std::unique_ptr<RpcMetrics> rpc_metrics,
                      RpcMetrics::Create(&metrics, RpcSide::kClient, trainer_label));
  std::unique_ptr<Tracer> tracer;
  std::unique_ptr<StepTracer> step_tracer;
  if (!config.trace.empty()) {
    tracer = std::make_unique<Tracer>(
        TracerOptions{config.trainer_id, absl::StrCat("trainer ", config.trainer_id)});
    // An empty trace now: a bad --trace path fails at start, not after training.
    TS_RETURN_IF_ERROR(tracer->WriteFile(config.trace));
    step_tracer =
        std::make_unique<StepTracer>(tracer.get(), config.trace_first_step, config.trace_steps);
  }
  // Written on every return, so a failed run leaves the steps it recorded.
  absl::Cleanup write_trace = [&] {
    if (tracer == nullptr) return;
    step_tracer->Finish();
    absl::Status s = tracer->WriteFile(config.trace);
    log << "trainer " << config.trainer_id << ": "
        << (s.ok() ? absl::StrCat("trace of ", tracer->size(), " spans written to ", config.trace)
                   : std::string(s.message()))
        << std::endl;
  };

  // --device=gpu without a usable GPU (or in a CPU-only build) fails here, before any work.
  TS_ASSIGN_OR_RETURN(std::vector<Place> places, ParseDevices(config.device, config.devices));
  for (const Place& place : places) TS_RETURN_IF_ERROR(CheckPlaceAvailable(place));
  RpcContext rpc;
  rpc.job_id = config.job_id;
  rpc.trainer_id = config.trainer_id;
  TS_ASSIGN_OR_RETURN(GrpcClientOptions co, ClientOptionsFor(config));
  co.observer = rpc_metrics.get();
  ClientPool pool(
      [co](const std::string& ep) { return std::make_unique<GrpcPServerClient>(ep, co); });
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
  // collective: trainers only, every gradient all-reduced. hybrid: distributed tables on the
  // pservers, the other gradients all-reduced among the trainers. pserver: everything pushed.
  const bool collective_mode = config.mode == "collective";
  const bool all_reduces = config.mode != "pserver";
  const char* all_reduce_backend = places[0].is_gpu() ? "NCCL" : "Gloo";
  if (all_reduces) {
    collective.rank = config.trainer_id;
    collective.world_size = config.trainers;
    collective.params.endpoint = config.trainer_endpoints[0];
    collective.params.job_id = config.job_id;
    collective.params.job_token = co.security.job_token;  // checked by the rendezvous store
    collective.params.timeout = absl::Seconds(config.barrier_timeout_s);
    // GPU trainers all-reduce with NCCL on their device (trainer 0's store hands out the NCCL
    // unique id, Fluid's gen_nccl_id; a rank that fails or stalls ends the others' operations
    // within --barrier_timeout_s); CPU trainers with Gloo.
    if (places[0].is_gpu()) {
      collective.params.backend = collective::BackendType::kNccl;
      collective.params.device_id = places[0].device;
    }
    collective.bucket_bytes = static_cast<size_t>(config.allreduce_bucket_kb) * 1024;
    collective::CompressionOptions& compression = collective.reduce.compression;
    if (config.allreduce_compression == "fp16") compression.kind = collective::Compression::kFp16;
    if (config.allreduce_compression == "topk") compression.kind = collective::Compression::kTopK;
    if (config.allreduce_compression == "threshold") {
      compression.kind = collective::Compression::kThreshold;
    }
    compression.topk_fraction = config.allreduce_topk;
    compression.threshold = config.allreduce_threshold;
    TS_RETURN_IF_ERROR(collective::ValidateCompression(compression));
    TS_RETURN_IF_ERROR(RegisterCollectiveOps(&registry, &collective));
  }
  TS_ASSIGN_OR_RETURN(ModelSpec model, LoadModel(config, registry));
  std::vector<std::string> trainable;
  for (const auto& v : model.main.blocks(0).vars()) {
    if (v.trainable() && !v.is_distributed()) trainable.push_back(v.name());  // tables: pservers
  }
  ModelSpec dist = model;
  // The all-reduce overlaps backward where it can (see --allreduce_overlap).
  const bool overlap = all_reduces && config.allreduce_overlap && config.cpu_places == 1 &&
                       places.size() == 1 &&
                       (config.allreduce_compression == "none" ||
                        config.allreduce_compression == "fp16");
  if (collective_mode) {
    TS_ASSIGN_OR_RETURN(CollectivePrograms programs,
                        TranspileCollective(model.main, model.startup, overlap));
    dist.main = programs.trainer;
    dist.startup = programs.trainer_startup;
  } else {
    // (hybrid: TranspilerConfigFor asks for the all-reduce of the dense gradients)
    TranspilerConfig tc = TranspilerConfigFor(config, config.trainer_id);
    tc.overlap_allreduce = overlap;
    TS_ASSIGN_OR_RETURN(DistributeTranspiler t,
                        DistributeTranspiler::Transpile(model.main, model.startup, tc));
    dist.main = t.trainer_program();
    dist.startup = t.trainer_startup_program();
  }
  if (config.memory_optimize) {
    // Gradients stay intact (they are sent to the pservers); feeds and fetches keep their names.
    MemoryOptimizeOptions mo;
    mo.skip_grads = true;
    mo.skip_vars = {dist.loss, dist.prediction, dist.feeds.dense, dist.feeds.label};
    for (const auto& slot : dist.feeds.slots) mo.skip_vars.insert(slot.name);
    for (const auto& slot : dist.feeds.multi_slots) mo.skip_vars.insert(slot.name);
    // Variables that RPC ops send, receive or prefetch: their names are names on the wire.
    for (const auto& op : dist.main.blocks(0).ops()) {
      if ((OpRoleOf(op) & kRoleRPC) == 0 && op.type() != "prefetch") continue;
      for (const auto& a : AllInputArgs(op)) mo.skip_vars.insert(a);
      for (const auto& a : AllOutputArgs(op)) mo.skip_vars.insert(a);
    }
    TS_ASSIGN_OR_RETURN(MemoryOptimizeStats stats, MemoryOptimize(&dist.main, mo));
    log << "trainer " << config.trainer_id << ": " << MemoryOptimizeReport(stats) << std::endl;
  }

  TS_ASSIGN_OR_RETURN(std::unique_ptr<TrainingData> data,
                      TrainingData::Open(config, model.feeds, &metrics, &log));
  const bool streaming = data->streamed();
  // A job that would train no step is a configuration error, refused before anything starts.
  const int64_t num_train = static_cast<int64_t>(data->train().examples.size());
  const int64_t steps_per_epoch = num_train / config.batch_size +
                                  (num_train % config.batch_size >= config.trainers ? 1 : 0);
  if (!streaming && steps_per_epoch * config.epochs == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "this job would train 0 steps: ", num_train, " training examples, --batch_size=",
        config.batch_size, ", --trainers=", config.trainers, ", --epochs=", config.epochs,
        " (a step needs a global batch with at least one example per trainer)"));
  }
  LocalTrainerOptions lo;
  lo.batch_size = config.batch_size;
  lo.epochs = config.epochs;
  lo.seed = config.seed;
  lo.num_replicas = config.trainers;
  lo.rank = config.trainer_id;
  lo.cpu_places = config.cpu_places;  // the local batch split across threads (trainer/places.h)
  // Double buffering: the next batch's table lookups during this step's recv (PS mode only;
  // inert for programs without distributed tables). Not with admission counts: a checkpoint
  // taken after a step would already hold the next batch's sightings, counted again on resume.
  lo.prefetch_ahead =
      config.prefetch_ahead && !collective_mode && config.table_admission_threshold == 0;
  lo.log_every_steps = config.trainer_id == 0 ? config.log_every_steps : 0;
  lo.log = &log;
  lo.before_step = [&rpc](int64_t step) { rpc.step = step; };
  if (streaming) {
    if (config.sync_mode) {
      // Every trainer ends the epoch after the step in which the first one ran out of data:
      // its send barrier says so, and the pservers' answer tells all (README "Data at scale").
      lo.before_stream_step = [&rpc](bool last) {
        rpc.step_reply.epoch_end.store(false);
        rpc.last_batch.store(last);
      };
      lo.stream_epoch_ends = [&rpc] { return rpc.step_reply.epoch_end.load(); };
    }
  }

  // Checkpoints (trainer/checkpoints.h): every trainer resumes at --init_from's position;
  // trainer 0 commits a checkpoint every --checkpoint_every steps and at the end.
  io::FileSystem* fs = io::PosixFileSystem::Default();
  if (all_reduces && (!config.checkpoint_dir.empty() || !config.init_from.empty())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--checkpoint_dir / --init_from need every parameter on the pservers (not supported with "
        "--mode=", config.mode, ")"));
  }
  TS_ASSIGN_OR_RETURN(std::optional<TrainPosition> resume, ReadResumePosition(config, fs, log));
  if (resume.has_value()) {
    rpc.step = resume->global_step;
    lo.epochs = static_cast<int>(std::max<int64_t>(0, config.epochs - resume->epoch));
  }
  const bool checkpointing = config.trainer_id == 0 && !config.checkpoint_dir.empty();
  std::vector<PServerClient*> pserver_clients;
  for (const std::string& ep : config.pservers) pserver_clients.push_back(pool.Get(ep));
  CheckpointWriter checkpoints(config, fs, pserver_clients, &log);
  if (resume.has_value()) checkpoints.set_last_step(resume->global_step);
  auto checkpoint = [&](const TrainPosition& p) { return checkpoints.Save(rpc.Meta(), p); };
  if (checkpointing && config.checkpoint_every > 0) {
    lo.on_step_end = [&](const TrainPosition& p) {
      return p.global_step % config.checkpoint_every == 0 ? checkpoint(p) : absl::OkStatus();
    };
  }

  // Prometheus metrics, updated after every step.
  std::unique_ptr<MetricsServer> metrics_server;
  if (config.metrics_port > 0) {
    MetricsServerOptions mo;
    mo.port = config.metrics_port;
    // Bind this trainer's own configured address where it has one (collective mode); a
    // pserver-mode trainer has none and listens on every interface.
    if (config.trainer_id < static_cast<int>(config.trainer_endpoints.size())) {
      const std::string& own = config.trainer_endpoints[config.trainer_id];
      mo.host = own.substr(0, own.rfind(':'));
    }
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

  log << "trainer " << config.trainer_id << "/" << config.trainers << ": example " << config.example
      << ", " << data->Describe() << ", global batch "
      << config.batch_size << ", "
      << (collective_mode ? absl::StrCat("collective (", all_reduce_backend, " all-reduce)")
          : all_reduces   ? absl::StrCat("hybrid (tables on ", config.pservers.size(),
                                         " pservers, dense gradients all-reduced with ",
                                         all_reduce_backend, ")")
                          : absl::StrCat("pservers ", config.pservers.size(), " (",
                                         config.sync_mode ? "sync" : "async", ")"))
      << (config.cpu_places > 1 ? absl::StrCat(", ", config.cpu_places, " cpu places") : "")
      << (overlap ? absl::StrCat(", all-reduce overlapped with backward (buckets of ",
                                 config.allreduce_bucket_kb, " KiB)")
                  : "")
      << std::endl;
  // The kernels the trainer runs, timed for the trace and the barrier waits (op_timing.h).
  auto barrier_wait = [&](const char* kind) {
    return metrics.GetHistogram(
        "tessera_trainer_barrier_wait_seconds",
        "Time blocked in the step's send / fetch barrier (with the send or recv that carries it).",
        RpcLatencyBuckets(), {{"trainer_id", std::to_string(config.trainer_id)}, {"kind", kind}});
  };
  OpTimingOptions timing;
  timing.tracer = step_tracer.get();
  TS_ASSIGN_OR_RETURN(timing.send_barrier_wait, barrier_wait("send"));
  TS_ASSIGN_OR_RETURN(timing.fetch_barrier_wait, barrier_wait("fetch"));
  OpRegistry timed_registry;
  TS_RETURN_IF_ERROR(RegisterTimedOps(registry, timing, &timed_registry));
  if (step_tracer != nullptr) {
    lo.before_step = [st = step_tracer.get(), inner = lo.before_step](int64_t step) {
      if (inner) inner(step);
      st->BeginStep(step);
    };
    // The trace is also written as soon as its last step ends, so that a trainer killed later
    // (a signal skips the write at exit) still leaves it.
    const int64_t last_traced = config.trace_first_step + config.trace_steps - 1;
    lo.after_step = [&, st = step_tracer.get(), inner = lo.after_step, last_traced](
                        int64_t step, double loss, int64_t n) {
      st->EndStep();
      if (step == last_traced) {
        absl::Status s = tracer->WriteFile(config.trace);
        if (!s.ok()) log << "trainer " << config.trainer_id << ": " << s.message() << std::endl;
      }
      if (inner) inner(step, loss, n);
    };
  }
  // --device=gpu: ops run through a placed registry (GPU kernels, CPU fallback).
  TS_ASSIGN_OR_RETURN(DevicePlan devices,
                      PlanTrainerDevices(config.device, config.devices, timed_registry, dist, &lo));
  if (devices.on_gpu()) {
    log << "trainer " << config.trainer_id << ": ops on " << devices.places[0].DebugString()
        << " (CPU kernels for the rest)" << std::endl;
  }
  // Everything local is in place; from here on the trainer depends on its peers.
  phase->Started();
  // From the handshake on, every pserver hears from this trainer every --heartbeat_s, so that it
  // can tell a trainer that died or froze from a slow one (trainer/heartbeat.h).
  std::unique_ptr<Heartbeat> heartbeat;
  // A failure from here on is told to the pservers (ABORT) while this trainer still beats and
  // before its communicator flushes what it queued, so that the cause reaches them first.
  absl::Status result = [&]() -> absl::Status {
    if (!collective_mode) {
      // Every pserver reachable within --connect_timeout_s (one deadline for all), or the cause.
      const absl::Time connect_deadline = absl::Now() + absl::Seconds(config.connect_timeout_s);
      for (const std::string& ep : config.pservers) {
        absl::Status connected =
            pool.Get(ep)->Connect(std::max(absl::Milliseconds(1), connect_deadline - absl::Now()));
        if (!connected.ok()) {
          return absl::Status(connected.code(),
                              absl::StrCat(connected.message(), " (waited --connect_timeout_s=",
                                           config.connect_timeout_s, ")"));
        }
      }
      // The job handshake: every pserver compares what this trainer was started with to its own
      // flags and model (and to the other trainers'); a mismatch fails the job at once, naming
      // the field and both values.
      JobFields fields = JobFieldsFor(config, model);
      fields.push_back(
          {kStepsPerEpochField, streaming ? "streamed" : absl::StrCat(steps_per_epoch)});
      const uint64_t nonce = absl::Uniform<uint64_t>(absl::BitGen());
      for (const std::string& ep : config.pservers) {
        absl::Status registered = pool.Get(ep)->Register(rpc.Meta(), fields, nonce);
        if (!registered.ok()) {
          return absl::Status(registered.code(),
                              absl::StrCat("pserver ", ep, ": ", registered.message()));
        }
      }
      if (config.heartbeat_s > 0) {
        std::vector<PServerClient*> pservers;
        for (const std::string& ep : config.pservers) pservers.push_back(pool.Get(ep));
        heartbeat = std::make_unique<Heartbeat>(std::move(pservers), rpc.Meta(),
                                                absl::Seconds(config.heartbeat_s));
      }
    }
    // Create() runs the startup program, which pulls the initial parameters from the pservers.
    TS_ASSIGN_OR_RETURN(auto trainer,
                        LocalTrainer::Create(devices.executor_registry(&timed_registry), dist, lo));
    if (resume.has_value()) trainer->ResumeAt(*resume);
    TS_RETURN_IF_ERROR(
        (streaming ? trainer->Train(data->streams()) : trainer->Train(data->train())).status());
    if (streaming) data->ReportStreamBadLines();
    if (devices.on_gpu()) {
      log << "trainer " << config.trainer_id << ": " << PlaceMemoryReport(devices.places[0])
          << std::endl;
    }
    if (checkpointing && trainer->global_step() != checkpoints.last_step()) {
      TS_RETURN_IF_ERROR(
          checkpoint(TrainPosition{trainer->global_step(), trainer->epochs_done(), 0}));
    }
    if (config.trainer_id == 0 && !data->test().examples.empty()) {
      TS_ASSIGN_OR_RETURN(EvalResult eval, trainer->Evaluate(data->test()));
      log << "trainer 0: held-out loss " << eval.mean_loss;
      if (eval.has_auc) log << " auc " << eval.auc;
      if (eval.has_accuracy) log << " accuracy " << eval.accuracy;
      log << std::endl;
    }
    if (communicator != nullptr) {
      TS_RETURN_IF_ERROR(communicator->Flush());
      CommunicatorStats cs = communicator->stats();
      log << "trainer " << config.trainer_id << ": async gradients pushed=" << cs.pushed
          << " sent=" << cs.sent << std::endl;
    }
    if (all_reduces) {
      log << "trainer " << config.trainer_id
          << ": gradient all-reduce bytes=" << collective.gradient_bytes << " (compression "
          << config.allreduce_compression << ")" << std::endl;
      TS_RETURN_IF_ERROR(collective.context.Shutdown());
    }
    if (!collective_mode) TS_RETURN_IF_ERROR(NotifyComplete(&rpc, config.pservers));
    if (!config.dump_params.empty()) {
      if (devices.on_gpu()) TS_RETURN_IF_ERROR(MoveScopeToHost(trainer->scope()));
      TS_RETURN_IF_ERROR(SaveVariables(*trainer->scope(), trainable, config.dump_params));
    }
    return absl::OkStatus();
  }();
  if (!result.ok()) AbortPservers(config, result);
  return result;
}

}  // namespace

absl::Status RunTrainer(const ClusterConfig& config, std::ostream& log, DaemonPhase* phase) {
  absl::Status result = Train(config, log, phase);
  // A failure at start (no data, zero steps, a bad model): Train told nobody yet.
  if (!result.ok() && !phase->started()) AbortPservers(config, result);
  return result;
}

}  // namespace tessera
