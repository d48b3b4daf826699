#include "trainer/trainer_daemon.h"

#include <algorithm>

#include "absl/random/random.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "cluster/cluster_programs.h"
#include "cluster/job_fields.h"
#include "common/device/placement.h"
#include "common/io/checkpoint_io.h"
#include "common/layers/memory_optimize.h"
#include "common/metrics/metrics.h"
#include "common/metrics/metrics_server.h"
#include "common/metrics/trace.h"
#include "common/ops/ops.h"
#include "common/framework/params_io.h"
#include "common/rpc/grpc/credentials.h"
#include "common/rpc/grpc/grpc_client.h"
#include "common/rpc/request_checks.h"
#include "common/rpc/rpc_metrics.h"
#include "common/base/status.h"
#include "trainer/checkpoints.h"
#include "trainer/collective_ops.h"
#include "trainer/communicator.h"
#include "trainer/device_setup.h"
#include "trainer/heartbeat.h"
#include "trainer/local_trainer.h"
#include "trainer/op_timing.h"
#include "trainer/rpc_ops.h"
#include "trainer/training_data.h"

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

// A trainer that stops with an error, at start (RunTrainer) or later (Start, Wait), tells
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

}  // namespace

absl::StatusOr<std::unique_ptr<TrainerProcess>> TrainerProcess::Create(const ClusterConfig& config,
                                                                       std::ostream& log,
                                                                       io::FileSystem* fs) {
  std::unique_ptr<TrainerProcess> p(
      new TrainerProcess(config, log, fs != nullptr ? fs : io::PosixFileSystem::Default()));
  TS_RETURN_IF_ERROR(p->Init());  // on failure, p's destructor writes the trace
  return p;
}

TrainerProcess::~TrainerProcess() {
  // Started but never waited for: the pservers would wait for this trainer at a barrier.
  if (started_ && !stopped_) {
    AbortPservers(config_, absl::CancelledError("trainer process stopped"));
    trainer_.reset();
  }
  Stop();
}

// Everything local, in the order the trainer always built it; any error is a configuration
// error (DaemonMain: exit 2).
absl::Status TrainerProcess::Init() {
  // Metrics and the trace first: the RPC clients and the timed op kernels report into them.
  TS_RETURN_IF_ERROR(SetUpMetricsAndTrace());
  TS_RETURN_IF_ERROR(SetUpPlacesAndRpc());
  TS_RETURN_IF_ERROR(SetUpCollective());
  TS_RETURN_IF_ERROR(BuildPrograms());
  TS_RETURN_IF_ERROR(OpenData());
  SetTrainerOptions();
  TS_RETURN_IF_ERROR(SetUpCheckpoints());
  TS_RETURN_IF_ERROR(StartMetricsServer());
  LogDescription();
  TS_RETURN_IF_ERROR(SetUpTimedOps());
  return PlanDevices();
}

// Metrics (served with --metrics_port) and the --trace timeline.
absl::Status TrainerProcess::SetUpMetricsAndTrace() {
  const ClusterConfig& config = config_;
  const Labels trainer_label = {{"trainer_id", std::to_string(config.trainer_id)}};
  TS_ASSIGN_OR_RETURN(rpc_metrics_, RpcMetrics::Create(&metrics_, RpcSide::kClient, trainer_label));
  if (!config.trace.empty()) {
    auto tracer = std::make_unique<Tracer>(
        TracerOptions{config.trainer_id, absl::StrCat("trainer ", config.trainer_id)});
    // An empty trace now: a bad --trace path fails at start, not after training.
    TS_RETURN_IF_ERROR(tracer->WriteFile(config.trace));
    step_tracer_ =
        std::make_unique<StepTracer>(tracer.get(), config.trace_first_step, config.trace_steps);
    // From here on Stop() writes it, whatever the outcome, so a failed run leaves the steps it
    // recorded.
    tracer_ = std::move(tracer);
  }
  return absl::OkStatus();
}

// The trainer's places, its RPC clients (not connected yet), the async communicator and the
// registry of standard and RPC ops.
absl::Status TrainerProcess::SetUpPlacesAndRpc() {
  const ClusterConfig& config = config_;
  // --device=gpu without a usable GPU (or in a CPU-only build) fails here, before any work.
  TS_ASSIGN_OR_RETURN(places_, ParseDevices(config.device, config.devices));
  for (const Place& place : places_) TS_RETURN_IF_ERROR(CheckPlaceAvailable(place));
  rpc_.job_id = config.job_id;
  rpc_.trainer_id = config.trainer_id;
  TS_ASSIGN_OR_RETURN(client_options_, ClientOptionsFor(config));
  client_options_.observer = rpc_metrics_.get();
  pool_ = std::make_unique<ClientPool>([co = client_options_](const std::string& ep) {
    return std::make_unique<GrpcPServerClient>(ep, co);
  });
  rpc_.clients = pool_.get();
  if (!config.sync_mode) {
    CommunicatorOptions cop;
    cop.max_merge = config.async_max_merge;
    cop.queue_capacity = config.async_max_merge;
    communicator_ = std::make_unique<AsyncCommunicator>(&rpc_, cop);
    rpc_.communicator = communicator_.get();
    rpc_.read_own_writes = config.async_read_own_writes;
  }

  TS_RETURN_IF_ERROR(RegisterStandardOps(&registry_));
  return RegisterRpcOps(&registry_, &rpc_);
}

// The all-reduce of --mode=collective and hybrid: rendezvous, backend, buckets, compression.
absl::Status TrainerProcess::SetUpCollective() {
  const ClusterConfig& config = config_;
  collective_ = std::make_unique<CollectiveState>();
  CollectiveState& collective = *collective_;
  // collective: trainers only, every gradient all-reduced. hybrid: distributed tables on the
  // pservers, the other gradients all-reduced among the trainers. pserver: everything pushed.
  collective_mode_ = config.mode == "collective";
  all_reduces_ = config.mode != "pserver";
  if (!all_reduces_) return absl::OkStatus();
  collective.rank = config.trainer_id;
  collective.world_size = config.trainers;
  collective.params.endpoint = config.trainer_endpoints[0];
  collective.params.job_id = config.job_id;
  // (checked by the rendezvous store)
  collective.params.job_token = client_options_.security.job_token;
  collective.params.timeout = absl::Seconds(config.barrier_timeout_s);
  // GPU trainers all-reduce with NCCL on their device (trainer 0's store hands out the NCCL
  // unique id, Fluid's gen_nccl_id; a rank that fails or stalls ends the others' operations
  // within --barrier_timeout_s); CPU trainers with Gloo.
  if (places_[0].is_gpu()) {
    collective.params.backend = collective::BackendType::kNccl;
    collective.params.device_id = places_[0].device;
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
  return RegisterCollectiveOps(&registry_, &collective);
}

// The model, and the program this trainer runs: transpiled for collective, hybrid or pserver
// mode, memory-optimized with --memory_optimize.
absl::Status TrainerProcess::BuildPrograms() {
  const ClusterConfig& config = config_;
  TS_ASSIGN_OR_RETURN(model_, LoadModel(config, registry_));
  for (const auto& v : model_.main.blocks(0).vars()) {
    if (v.trainable() && !v.is_distributed()) trainable_.push_back(v.name());  // tables: pservers
  }
  dist_ = model_;
  // The all-reduce overlaps backward where it can (see --allreduce_overlap).
  overlap_ = all_reduces_ && config.allreduce_overlap && config.cpu_places == 1 &&
             places_.size() == 1 &&
             (config.allreduce_compression == "none" || config.allreduce_compression == "fp16");
  if (collective_mode_) {
    TS_ASSIGN_OR_RETURN(CollectivePrograms programs,
                        TranspileCollective(model_.main, model_.startup, overlap_));
    dist_.main = programs.trainer;
    dist_.startup = programs.trainer_startup;
  } else {
    // (hybrid: TranspilerConfigFor asks for the all-reduce of the dense gradients)
    TranspilerConfig tc = TranspilerConfigFor(config, config.trainer_id);
    tc.overlap_allreduce = overlap_;
    TS_ASSIGN_OR_RETURN(DistributeTranspiler t,
                        DistributeTranspiler::Transpile(model_.main, model_.startup, tc));
    dist_.main = t.trainer_program();
    dist_.startup = t.trainer_startup_program();
  }
  if (config.memory_optimize) TS_RETURN_IF_ERROR(MemoryOptimizeProgram());
  return absl::OkStatus();
}

// --memory_optimize: reuses the buffers of the trainer program's temporaries.
absl::Status TrainerProcess::MemoryOptimizeProgram() {
  // Gradients stay intact (they are sent to the pservers); feeds and fetches keep their names.
  MemoryOptimizeOptions mo;
  mo.skip_grads = true;
  mo.skip_vars = {dist_.loss, dist_.prediction, dist_.feeds.dense, dist_.feeds.label};
  for (const auto& slot : dist_.feeds.slots) mo.skip_vars.insert(slot.name);
  for (const auto& slot : dist_.feeds.multi_slots) mo.skip_vars.insert(slot.name);
  // Variables that RPC ops send, receive or prefetch: their names are names on the wire.
  for (const auto& op : dist_.main.blocks(0).ops()) {
    if ((OpRoleOf(op) & kRoleRPC) == 0 && op.type() != "prefetch") continue;
    for (const auto& a : AllInputArgs(op)) mo.skip_vars.insert(a);
    for (const auto& a : AllOutputArgs(op)) mo.skip_vars.insert(a);
  }
  TS_ASSIGN_OR_RETURN(MemoryOptimizeStats stats, MemoryOptimize(&dist_.main, mo));
  log_ << "trainer " << config_.trainer_id << ": " << MemoryOptimizeReport(stats) << std::endl;
  return absl::OkStatus();
}

// The training (and held-out) data; a job that would train no step is refused here.
absl::Status TrainerProcess::OpenData() {
  const ClusterConfig& config = config_;
  TS_ASSIGN_OR_RETURN(data_, TrainingData::Open(config, model_.feeds, &metrics_, &log_));
  streaming_ = data_->streamed();
  // A job that would train no step is a configuration error, refused before anything starts.
  const int64_t num_train = static_cast<int64_t>(data_->train().examples.size());
  steps_per_epoch_ =
      num_train / config.batch_size + (num_train % config.batch_size >= config.trainers ? 1 : 0);
  if (!streaming_ && steps_per_epoch_ * config.epochs == 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "this job would train 0 steps: ", num_train, " training examples, --batch_size=",
        config.batch_size, ", --trainers=", config.trainers, ", --epochs=", config.epochs,
        " (a step needs a global batch with at least one example per trainer)"));
  }
  return absl::OkStatus();
}

// The options of the LocalTrainer that Start creates: this trainer's share of every global
// batch, prefetching, per-step logging, and the RPC context's step bookkeeping.
void TrainerProcess::SetTrainerOptions() {
  const ClusterConfig& config = config_;
  LocalTrainerOptions& lo = trainer_options_;
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
      config.prefetch_ahead && !collective_mode_ && config.table_admission_threshold == 0;
  lo.send_early_bytes = int64_t{config.send_early_kb} * 1024;
  lo.deferred_lookups = &rpc_.deferred_lookups;
  lo.lookup_riders = &rpc_.lookup_riders;  // the look-ahead's lookups ride on the step's request
  // Async, reading its own writes: each step's push carries its receive (and the next batch's
  // lookups), so the step makes one request per pserver and waits for it, as it would anyway.
  lo.fold_async_receive = !config.sync_mode && config.async_read_own_writes;
  lo.log_every_steps = config.trainer_id == 0 ? config.log_every_steps : 0;
  lo.log = &log_;
  lo.before_step = [rpc = &rpc_](int64_t step) { rpc->step = step; };
  if (streaming_) {
    if (config.sync_mode) {
      // Every trainer ends the epoch after the step in which the first one ran out of data:
      // its send barrier says so, and the pservers' answer tells all (README "Data at scale").
      lo.before_stream_step = [rpc = &rpc_](bool last) {
        rpc->step_reply.epoch_end.store(false);
        rpc->last_batch.store(last);
      };
      lo.stream_epoch_ends = [rpc = &rpc_] { return rpc->step_reply.epoch_end.load(); };
    }
  }
}

// Checkpoints (trainer/checkpoints.h): every trainer resumes at --init_from's position;
// trainer 0 commits a checkpoint every --checkpoint_every steps and at the end.
absl::Status TrainerProcess::SetUpCheckpoints() {
  const ClusterConfig& config = config_;
  io::FileSystem* fs = fs_;
  if (all_reduces_ && (!config.checkpoint_dir.empty() || !config.init_from.empty())) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--checkpoint_dir / --init_from need every parameter on the pservers (not supported with "
        "--mode=",
        config.mode, ")"));
  }
  TS_ASSIGN_OR_RETURN(resume_, ReadResumePosition(config, fs, log_));
  if (resume_.has_value()) {
    rpc_.step = resume_->global_step;
    trainer_options_.epochs =
        static_cast<int>(std::max<int64_t>(0, config.epochs - resume_->epoch));
  }
  checkpointing_ = config.trainer_id == 0 && !config.checkpoint_dir.empty();
  std::vector<PServerClient*> pserver_clients;
  for (const std::string& ep : config.pservers) pserver_clients.push_back(pool_->Get(ep));
  checkpoints_ = std::make_unique<CheckpointWriter>(config, fs, pserver_clients, &log_);
  if (resume_.has_value()) checkpoints_->set_last_step(resume_->global_step);
  if (checkpointing_ && config.checkpoint_every > 0) {
    trainer_options_.on_step_end = [this](const TrainPosition& p) {
      return p.global_step % config_.checkpoint_every == 0 ? SaveCheckpoint(p) : absl::OkStatus();
    };
  }
  // Inference bundles (trainer/bundle_export.h): trainer 0, after the step's checkpoint.
  if (config.trainer_id == 0 && !config.export_dir.empty()) {
    TS_ASSIGN_OR_RETURN(exporter_, BundleExporter::Create(config, model_, fs, pserver_clients, &log_));
    if (config.export_every_steps > 0) {
      trainer_options_.on_step_end = [this, checkpoint = std::move(trainer_options_.on_step_end)](
                                         const TrainPosition& p) -> absl::Status {
        if (checkpoint) TS_RETURN_IF_ERROR(checkpoint(p));
        return p.global_step % config_.export_every_steps == 0 ? Export() : absl::OkStatus();
      };
    }
  }
  // Evaluations during training (--eval_every_steps, --eval_every_epoch), after the step's
  // checkpoint and export. Every trainer takes part (its share of the held-out set).
  if (config.eval_every_steps > 0 || config.eval_every_epoch) {
    trainer_options_.on_step_end = [this, checkpoint = std::move(trainer_options_.on_step_end)](
                                       const TrainPosition& p) -> absl::Status {
      if (checkpoint) TS_RETURN_IF_ERROR(checkpoint(p));
      const bool every = config_.eval_every_steps > 0 && p.global_step % config_.eval_every_steps == 0;
      const bool epoch_end = config_.eval_every_epoch &&
                             (p.step_in_epoch == 0 ||
                              (steps_per_epoch_ > 0 && p.step_in_epoch == steps_per_epoch_));
      return every || epoch_end ? Evaluate() : absl::OkStatus();
    };
  }
  return absl::OkStatus();
}

absl::Status TrainerProcess::SaveCheckpoint(const TrainPosition& p) {
  return checkpoints_->Save(rpc_.Meta(), p);
}

absl::Status TrainerProcess::Export() {
  return exporter_->Export(rpc_.Meta(), trainer_->global_step(), *trainer_->scope());
}

// Prometheus metrics (--metrics_port), updated after every step.
absl::Status TrainerProcess::StartMetricsServer() {
  const ClusterConfig& config = config_;
  if (config.metrics_port <= 0) return absl::OkStatus();
  MetricsServerOptions mo;
  mo.port = config.metrics_port;
  // Bind this trainer's own configured address where it has one (collective mode); a
  // pserver-mode trainer has none and listens on every interface.
  if (config.trainer_id < static_cast<int>(config.trainer_endpoints.size())) {
    const std::string& own = config.trainer_endpoints[config.trainer_id];
    mo.host = own.substr(0, own.rfind(':'));
  }
  metrics_server_ = std::make_unique<MetricsServer>(&metrics_, mo);
  TS_RETURN_IF_ERROR(metrics_server_->Start());
  log_ << "trainer " << config.trainer_id << ": metrics on http://" << mo.host << ":"
       << metrics_server_->port() << "/metrics" << std::endl;
  Labels labels = {{"trainer_id", std::to_string(config.trainer_id)}};
  Counter* steps = *metrics_.GetCounter("tessera_trainer_steps_total", "Training steps.", labels);
  Counter* samples =
      *metrics_.GetCounter("tessera_trainer_samples_total", "Training examples.", labels);
  Gauge* loss = *metrics_.GetGauge("tessera_trainer_loss", "Loss of the last step.", labels);
  eval_loss_ = *metrics_.GetGauge("tessera_trainer_eval_loss",
                                  "Held-out loss of the job's last evaluation (trainer 0).", labels);
  eval_auc_ = *metrics_.GetGauge("tessera_trainer_eval_auc",
                                 "Held-out AUC of the job's last evaluation (trainer 0).", labels);
  eval_accuracy_ = *metrics_.GetGauge(
      "tessera_trainer_eval_accuracy", "Held-out accuracy of the job's last evaluation (trainer 0).",
      labels);
  trainer_options_.after_step = [steps, samples, loss](int64_t, double l, int64_t n) {
    steps->Increment();
    samples->Increment(static_cast<double>(n));
    loss->Set(l);
  };
  return absl::OkStatus();
}

// The line that says what this trainer is about to do.
void TrainerProcess::LogDescription() {
  const ClusterConfig& config = config_;
  const char* all_reduce_backend = places_[0].is_gpu() ? "NCCL" : "Gloo";
  log_ << "trainer " << config.trainer_id << "/" << config.trainers << ": example "
       << config.example << ", " << data_->Describe() << ", global batch " << config.batch_size
       << ", "
       << (collective_mode_ ? absl::StrCat("collective (", all_reduce_backend, " all-reduce)")
           : all_reduces_   ? absl::StrCat("hybrid (tables on ", config.pservers.size(),
                                           " pservers, dense gradients all-reduced with ",
                                           all_reduce_backend, ")")
                            : absl::StrCat("pservers ", config.pservers.size(), " (",
                                         config.sync_mode ? "sync" : "async", ")"))
       << (config.cpu_places > 1 ? absl::StrCat(", ", config.cpu_places, " cpu places") : "")
       << (overlap_ ? absl::StrCat(", all-reduce overlapped with backward (buckets of ",
                                   config.allreduce_bucket_kb, " KiB)")
                    : "")
       << std::endl;
}

// The kernels the trainer runs, timed for the trace and the barrier waits (op_timing.h), and
// the step hooks of the trace.
absl::Status TrainerProcess::SetUpTimedOps() {
  const ClusterConfig& config = config_;
  auto barrier_wait = [&](const char* kind) {
    return metrics_.GetHistogram(
        "tessera_trainer_barrier_wait_seconds",
        "Time blocked in the step's send / fetch barrier (with the send or recv that carries it).",
        RpcLatencyBuckets(), {{"trainer_id", std::to_string(config.trainer_id)}, {"kind", kind}});
  };
  timing_.tracer = step_tracer_.get();
  TS_ASSIGN_OR_RETURN(timing_.send_barrier_wait, barrier_wait("send"));
  TS_ASSIGN_OR_RETURN(timing_.fetch_barrier_wait, barrier_wait("fetch"));
  TS_RETURN_IF_ERROR(RegisterTimedOps(registry_, timing_, &timed_registry_));
  if (step_tracer_ == nullptr) return absl::OkStatus();
  LocalTrainerOptions& lo = trainer_options_;
  lo.before_step = [st = step_tracer_.get(), inner = lo.before_step](int64_t step) {
    if (inner) inner(step);
    st->BeginStep(step);
  };
  // The trace is also written as soon as its last step ends, so that a trainer killed later
  // (a signal skips the write at exit) still leaves it.
  const int64_t last_traced = config.trace_first_step + config.trace_steps - 1;
  lo.after_step = [this, st = step_tracer_.get(), inner = lo.after_step, last_traced](
                      int64_t step, double loss, int64_t n) {
    st->EndStep();
    if (step == last_traced) {
      absl::Status s = tracer_->WriteFile(config_.trace);
      if (!s.ok()) log_ << "trainer " << config_.trainer_id << ": " << s.message() << std::endl;
    }
    if (inner) inner(step, loss, n);
  };
  return absl::OkStatus();
}

// --device=gpu: ops run through a placed registry (GPU kernels, CPU fallback). The placed
// registries are built over the plain kernels and then timed whole, so that the trace's compute
// spans hold the device kernels too and no CPU kernel is timed twice.
absl::Status TrainerProcess::PlanDevices() {
  const ClusterConfig& config = config_;
  TS_ASSIGN_OR_RETURN(devices_, PlanTrainerDevices(config.device, config.devices, registry_, dist_,
                                                   &trainer_options_));
  executor_registry_ = &timed_registry_;
  if (!devices_.on_gpu()) return absl::OkStatus();
  auto timed = [this](const OpRegistry& placed) -> absl::StatusOr<const OpRegistry*> {
    timed_placed_.push_back(std::make_unique<OpRegistry>());
    TS_RETURN_IF_ERROR(RegisterTimedOps(placed, timing_, timed_placed_.back().get()));
    return timed_placed_.back().get();
  };
  if (devices_.registry != nullptr) {
    TS_ASSIGN_OR_RETURN(executor_registry_, timed(*devices_.registry));
  }
  std::vector<const OpRegistry*>& places = trainer_options_.place_registries;
  if (places.size() != devices_.place_registries.size()) {
    return absl::InternalError("the device plan's place registries disagree with the options'");
  }
  for (size_t i = 0; i < places.size(); ++i) {
    TS_ASSIGN_OR_RETURN(places[i], timed(*devices_.place_registries[i]));
  }
  log_ << "trainer " << config.trainer_id << ": ops on " << devices_.places[0].DebugString()
       << " (CPU kernels for the rest)" << std::endl;
  return absl::OkStatus();
}

absl::Status TrainerProcess::Start() {
  if (start_called_ || stopped_) {
    return absl::FailedPreconditionError("TrainerProcess::Start runs once, before Wait");
  }
  start_called_ = true;
  // Everything local is in place (RunTrainer has called DaemonPhase::Started); from here on the
  // trainer depends on its peers. A failure from here on is told to the pservers (ABORT) while
  // this trainer still beats and before its communicator flushes what it queued, so that the
  // cause reaches them first.
  absl::Status connected = Connect();
  if (!connected.ok()) {
    AbortPservers(config_, connected);
    return connected;
  }
  started_ = true;
  return absl::OkStatus();
}

// Start's work: the pservers (pserver and hybrid modes), then the startup program.
absl::Status TrainerProcess::Connect() {
  if (!collective_mode_) TS_RETURN_IF_ERROR(ConnectPservers());
  // Create() runs the startup program, which pulls the initial parameters from the pservers.
  TS_ASSIGN_OR_RETURN(trainer_, LocalTrainer::Create(executor_registry_, dist_, trainer_options_));
  if (resume_.has_value()) trainer_->ResumeAt(*resume_);
  return absl::OkStatus();
}

// Every pserver reached and registered (the job handshake), then the heartbeats.
absl::Status TrainerProcess::ConnectPservers() {
  const ClusterConfig& config = config_;
  // Every pserver reachable within --connect_timeout_s (one deadline for all), or the cause.
  const absl::Time connect_deadline = absl::Now() + absl::Seconds(config.connect_timeout_s);
  for (const std::string& ep : config.pservers) {
    absl::Status connected =
        pool_->Get(ep)->Connect(std::max(absl::Milliseconds(1), connect_deadline - absl::Now()));
    if (!connected.ok()) {
      return absl::Status(connected.code(),
                          absl::StrCat(connected.message(), " (waited --connect_timeout_s=",
                                       config.connect_timeout_s, ")"));
    }
  }
  // The job handshake: every pserver compares what this trainer was started with to its own
  // flags and model (and to the other trainers'); a mismatch fails the job at once, naming the
  // field and both values.
  JobFields fields = JobFieldsFor(config, model_);
  fields.push_back({kStepsPerEpochField, streaming_ ? "streamed" : absl::StrCat(steps_per_epoch_)});
  const uint64_t nonce = absl::Uniform<uint64_t>(absl::BitGen());
  for (const std::string& ep : config.pservers) {
    absl::Status registered = pool_->Get(ep)->Register(rpc_.Meta(), fields, nonce);
    if (!registered.ok()) {
      return absl::Status(registered.code(),
                          absl::StrCat("pserver ", ep, ": ", registered.message()));
    }
  }
  // From the handshake on, every pserver hears from this trainer every --heartbeat_s, so that it
  // can tell a trainer that died or froze from a slow one (trainer/heartbeat.h).
  if (config.heartbeat_s > 0) {
    std::vector<PServerClient*> pservers;
    for (const std::string& ep : config.pservers) pservers.push_back(pool_->Get(ep));
    heartbeat_ = std::make_unique<Heartbeat>(std::move(pservers), rpc_.Meta(),
                                             absl::Seconds(config.heartbeat_s));
  }
  return absl::OkStatus();
}

absl::Status TrainerProcess::Wait() {
  if (!started_ || stopped_) {
    return absl::FailedPreconditionError(
        "TrainerProcess::Wait runs once, after a successful Start");
  }
  absl::Status result = Train();
  if (result.ok()) result = Finish();
  // A failure is told to the pservers (ABORT) while this trainer still beats and before its
  // communicator flushes (in Stop); that also ends the LocalTrainer's requests still waiting on
  // them (a pipelined step's receives and lookups wait for an update this trainer never sent),
  // so it goes second.
  if (!result.ok()) AbortPservers(config_, result);
  trainer_.reset();
  Stop();
  return result;
}

// The epochs, the last checkpoint and the held-out evaluation (trainer 0).
absl::Status TrainerProcess::Train() {
  const ClusterConfig& config = config_;
  const PlacementCounters placed = GetPlacementCounters();
  const int64_t first_step = trainer_->global_step();
  TS_RETURN_IF_ERROR(
      (streaming_ ? trainer_->Train(data_->streams()) : trainer_->Train(data_->train())).status());
  if (streaming_) data_->ReportStreamBadLines();
  if (devices_.on_gpu()) {
    log_ << "trainer " << config.trainer_id << ": " << PlaceMemoryReport(devices_.places[0])
         << std::endl;
    log_ << "trainer " << config.trainer_id << ": placement "
         << PlacementPerStep(placed, GetPlacementCounters(), trainer_->global_step() - first_step)
         << std::endl;
  }
  if (checkpointing_ && trainer_->global_step() != checkpoints_->last_step()) {
    TS_RETURN_IF_ERROR(
        SaveCheckpoint(TrainPosition{trainer_->global_step(), trainer_->epochs_done(), 0}));
  }
  if (exporter_ != nullptr) TS_RETURN_IF_ERROR(Export());
  // The held-out evaluation at the end (unless one just ran at this step).
  if (last_eval_step_ != trainer_->global_step()) TS_RETURN_IF_ERROR(Evaluate());
  return absl::OkStatus();
}

// Distributed evaluation: every trainer scores its share of the held-out set, the shares'
// partials are summed (pserver mode: by the first pserver; collective and hybrid: an all-reduce)
// and trainer 0 reports the job's result. Every trainer runs the same rounds in the same order.
absl::Status TrainerProcess::Evaluate() {
  const ClusterConfig& config = config_;
  const data::Dataset& test = data_->test();
  const int64_t n = static_cast<int64_t>(test.examples.size());
  if (n == 0) return absl::OkStatus();
  last_eval_step_ = trainer_->global_step();
  const int64_t begin = n * config.trainer_id / config.trainers;
  const int64_t end = n * (config.trainer_id + 1) / config.trainers;
  TS_ASSIGN_OR_RETURN(EvalPartial partial, trainer_->EvaluatePartial(test, begin, end));
  const int64_t round = eval_rounds_++;
  if (all_reduces_) {
    Tensor sum = partial.ToTensor();
    TS_RETURN_IF_ERROR(collective_->context.world()->AllReduce(
        absl::Span<double>(sum.data<double>(), static_cast<size_t>(sum.numel())),
        collective::ReduceOp::kSum));
    TS_ASSIGN_OR_RETURN(partial, EvalPartial::FromTensor(sum));
  } else if (config.trainers > 1) {
    TS_ASSIGN_OR_RETURN(partial, ReduceEvaluation(&rpc_, config.pservers[0], round, partial,
                                                  /*fetch=*/config.trainer_id == 0));
  }
  if (config.trainer_id != 0) return absl::OkStatus();
  const EvalResult eval = partial.Result();
  log_ << absl::StrFormat("trainer 0: held-out loss %.9g", eval.mean_loss);
  if (eval.has_auc) log_ << absl::StrFormat(" auc %.9g", eval.auc);
  if (eval.has_accuracy) log_ << absl::StrFormat(" accuracy %.9g", eval.accuracy);
  log_ << " on " << eval.samples << " examples at step " << trainer_->global_step() << " ("
       << config.trainers << (config.trainers == 1 ? " trainer" : " trainers") << ")"
       << std::endl;
  if (eval_loss_ != nullptr) {
    eval_loss_->Set(eval.mean_loss);
    if (eval.has_auc) eval_auc_->Set(eval.auc);
    if (eval.has_accuracy) eval_accuracy_->Set(eval.accuracy);
  }
  return absl::OkStatus();
}

// The end of the job: async gradients flushed, the all-reduce shut down, COMPLETE to the
// pservers, --dump_params.
absl::Status TrainerProcess::Finish() {
  const ClusterConfig& config = config_;
  if (communicator_ != nullptr) {
    TS_RETURN_IF_ERROR(communicator_->Flush());
    CommunicatorStats cs = communicator_->stats();
    const int64_t folded = rpc_.folded_pushes.load();  // pushed and sent with their receive
    log_ << "trainer " << config.trainer_id << ": async gradients pushed=" << cs.pushed + folded
         << " sent=" << cs.sent + folded << std::endl;
  }
  if (all_reduces_) {
    log_ << "trainer " << config.trainer_id
         << ": gradient all-reduce bytes=" << collective_->gradient_bytes << " (compression "
         << config.allreduce_compression << ")" << std::endl;
    TS_RETURN_IF_ERROR(collective_->context.Shutdown());
  }
  if (!collective_mode_) TS_RETURN_IF_ERROR(NotifyComplete(&rpc_, config.pservers));
  if (!config.dump_params.empty()) {
    if (devices_.on_gpu()) TS_RETURN_IF_ERROR(MoveScopeToHost(trainer_->scope()));
    TS_RETURN_IF_ERROR(SaveVariables(*trainer_->scope(), trainable_, config.dump_params));
  }
  return absl::OkStatus();
}

void TrainerProcess::Stop() {
  if (stopped_) return;
  stopped_ = true;
  trainer_.reset();
  heartbeat_.reset();
  { DevicePlan released = std::move(devices_); }  // its members in reverse order, as ever
  metrics_server_.reset();
  trainer_options_.place_reducer.reset();  // shared with the device plan
  data_.reset();
  collective_.reset();
  communicator_.reset();  // flushes what a failed run left queued (errors dropped)
  pool_.reset();
  // Written on every outcome, so a failed run leaves the steps it recorded.
  if (tracer_ == nullptr) return;
  step_tracer_->Finish();
  absl::Status s = tracer_->WriteFile(config_.trace);
  log_ << "trainer " << config_.trainer_id << ": "
       << (s.ok() ? absl::StrCat("trace of ", tracer_->size(), " spans written to ", config_.trace)
                  : std::string(s.message()))
       << std::endl;
}

absl::Status RunTrainer(const ClusterConfig& config, std::ostream& log, DaemonPhase* phase) {
  absl::StatusOr<std::unique_ptr<TrainerProcess>> process = TrainerProcess::Create(config, log);
  if (!process.ok()) {
    // A failure at start (no data, zero steps, a bad model): nobody was told yet.
    AbortPservers(config, process.status());
    return process.status();
  }
  // Everything local is in place; from here on the trainer depends on its peers (Start and Wait
  // tell the pservers of their own failures).
  phase->Started();
  TS_RETURN_IF_ERROR((*process)->Start());
  return (*process)->Wait();
}

}  // namespace tessera
