#include "pserver/pserver_daemon.h"

#include <atomic>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/io/checkpoint_io.h"
#include "common/metrics/interval_stats.h"
#include "common/ops/ops.h"
#include "common/framework/program_io.h"
#include "common/rpc/grpc/credentials.h"
#include "common/base/status.h"
#include "cluster/cluster_programs.h"
#include "cluster/job_fields.h"

namespace tessera {

namespace {
// How long a failed pserver keeps answering requests with its failure before it exits.
constexpr absl::Duration kFailureLinger = absl::Seconds(2);
}  // namespace

absl::StatusOr<std::unique_ptr<PserverProcess>> PserverProcess::Create(const ClusterConfig& config,
                                                                       std::ostream& log,
                                                                       io::FileSystem* fs) {
  std::unique_ptr<PserverProcess> p(
      new PserverProcess(config, log, fs != nullptr ? fs : io::PosixFileSystem::Default()));
  TS_RETURN_IF_ERROR(p->Init());
  return p;
}

PserverProcess::~PserverProcess() {
  // Without Wait: fail the server first, so that requests waiting at a barrier are answered and
  // the gRPC server can shut down.
  if (!stopped_ && ps_ != nullptr) ps_->Fail(absl::CancelledError("pserver process stopped"));
  Stop();
}

absl::Status PserverProcess::Init() {
  const ClusterConfig& config = config_;
  registry_ = NewStandardOpRegistry();
  TS_ASSIGN_OR_RETURN(ModelSpec model, LoadModel(config, *registry_));
  TS_ASSIGN_OR_RETURN(DistributeTranspiler t,
                      DistributeTranspiler::Transpile(
                          model.main, model.startup, TranspilerConfigFor(config, config.trainer_id)));
  TS_ASSIGN_OR_RETURN(ProgramDesc program, t.GetPserverProgram(config.current_endpoint));
  TS_ASSIGN_OR_RETURN(ProgramDesc startup, t.GetPserverStartupProgram(config.current_endpoint));
  blocks_ = program.blocks_size() - 1;

  Executor exec(registry_.get());
  absl::Status s = exec.Run(startup, 0, &scope_);
  if (!s.ok())
    return absl::Status(s.code(), absl::StrCat("pserver startup program: ", s.message()));

  // RPC and barrier-wait metrics are recorded always (the stats line reads them); with
  // --metrics_port they are served with the rest.
  const Labels endpoint_label = {{"endpoint", config.current_endpoint}};
  TS_ASSIGN_OR_RETURN(rpc_metrics_,
                      RpcMetrics::Create(&metrics_, RpcSide::kServer, endpoint_label));
  auto barrier_histogram = [&](const char* kind) {
    return metrics_.GetHistogram(
        "tessera_pserver_barrier_wait_seconds",
        "Sync barrier requests: time from a trainer's arrival to its release, by kind.",
        RpcLatencyBuckets(), {{"endpoint", config.current_endpoint}, {"kind", kind}});
  };
  TS_ASSIGN_OR_RETURN(send_barrier_wait_, barrier_histogram("send"));
  TS_ASSIGN_OR_RETURN(fetch_barrier_wait_, barrier_histogram("fetch"));

  ParameterServerOptions po;
  po.on_barrier_wait = [send = send_barrier_wait_, fetch = fetch_barrier_wait_](
                           BarrierKind kind, absl::Duration wait) {
    (kind == SEND_BARRIER ? send : fetch)->Observe(absl::ToDoubleSeconds(wait));
  };
  po.job_id = config.job_id;
  po.job_fields = JobFieldsFor(config, model);
  po.endpoint = config.current_endpoint;
  po.barrier_timeout = absl::Seconds(config.barrier_timeout_s);
  po.heartbeat_timeout = kHeartbeatsMissed * absl::Seconds(config.heartbeat_s);
  po.async_drop_silent_trainers = config.async_drop_silent_trainers;
  po.startup_timeout = absl::Seconds(config.startup_timeout_s);
  po.table_admission_threshold = config.table_admission_threshold;
  po.table_evict_after_steps = config.table_evict_after_steps;
  po.table_max_rows = config.table_max_rows;
  po.num_pservers = static_cast<int>(config.pservers.size());
  for (int i = 0; i < po.num_pservers; ++i) {
    if (config.pservers[i] == config.current_endpoint) po.pserver_index = i;
  }
  po.param_blocks = t.param_blocks();
  po.table_shard_method = config.table_shard_method;
  po.checkpoint_dir = config.checkpoint_dir;
  po.fs = fs_;
  TS_ASSIGN_OR_RETURN(ps_, ParameterServer::Create(program, &scope_, registry_.get(), po));
  if (!config.init_from.empty()) {  // restore before serving anything
    TS_ASSIGN_OR_RETURN(std::string ckpt,
                        io::ResolveCheckpoint(fs_, config.init_from));
    absl::Status restored = ps_->RestoreCheckpoint(ckpt);
    if (!restored.ok()) {
      return absl::Status(restored.code(),
                          absl::StrCat("--init_from=", config.init_from, ": ", restored.message()));
    }
    log_ << "pserver " << config.current_endpoint << ": restored " << ckpt << " ("
         << ps_->stats().table_rows << " table rows)" << std::endl;
  }
  return absl::OkStatus();
}

absl::Status PserverProcess::Start() {
  const ClusterConfig& config = config_;
  GrpcServerOptions so;
  so.address = config.current_endpoint;
  so.observer = rpc_metrics_.get();
  TS_ASSIGN_OR_RETURN(so.security, LoadRpcSecurity(config.tls_cert, config.tls_key, config.tls_ca,
                                                   config.job_token, config.job_token_file));
  server_ = std::make_unique<GrpcServer>(so, ps_.get());
  TS_RETURN_IF_ERROR(server_->Start());
  log_ << "pserver " << config.current_endpoint << ": serving " << blocks_
       << " parameter blocks for " << config.trainers << " trainers ("
       << (config.sync_mode ? "sync" : "async") << ")" << (so.security.tls() ? ", mutual TLS" : "")
       << (so.security.job_token.empty() ? "" : ", job token required") << std::endl;

  if (config.metrics_port > 0) {
    MetricsServerOptions mo;
    mo.host = config.current_endpoint.substr(0, config.current_endpoint.rfind(':'));
    mo.port = config.metrics_port;
    metrics_server_ = std::make_unique<MetricsServer>(&metrics_, mo);
    TS_RETURN_IF_ERROR(metrics_server_->Start());
    log_ << "pserver " << config.current_endpoint << ": metrics on http://" << mo.host << ":"
         << metrics_server_->port() << "/metrics" << std::endl;
    AddMetricsCollector();
  }
  StartStatsLine();
  return absl::OkStatus();
}

void PserverProcess::AddMetricsCollector() {
  // Prometheus metrics: the server's counters, brought up to date whenever /metrics is read (a
  // collector of the registry; no thread polls them).
  Labels labels = {{"endpoint", config_.current_endpoint}};
  auto counter = [&](const char* name, const char* help) {
    return *metrics_.GetCounter(name, help, labels);
  };
  Counter* steps = counter("tessera_pserver_steps_total", "Completed sync steps.");
  Counter* sends = counter("tessera_pserver_send_messages_total", "SendVariable messages.");
  Counter* gets = counter("tessera_pserver_get_requests_total", "GetVariable requests.");
  Counter* prefetches = counter("tessera_pserver_prefetch_requests_total", "Prefetch requests.");
  Counter* applied = counter("tessera_pserver_grads_applied_total", "Gradients optimized.");
  Gauge* rows = *metrics_.GetGauge("tessera_pserver_table_rows",
                                   "Rows held by this pserver's table shards.", labels);
  Counter* refused_ids = counter("tessera_pserver_table_refused_ids_total",
                                 "New table ids refused for the row budget (--table_max_rows).");
  Counter* unauthenticated =
      counter("tessera_rpc_unauthenticated_total",
              "Requests refused for a missing or wrong job token (UNAUTHENTICATED).");
  // What the counters last published, so that each collection adds the difference.
  struct Published {
    absl::Mutex mu;
    ParameterServerStats stats ABSL_GUARDED_BY(mu);
    int64_t unauthenticated ABSL_GUARDED_BY(mu) = 0;
  };
  auto published = std::make_shared<Published>();
  metrics_.AddCollector([this, published, steps, sends, gets, prefetches, applied, rows,
                         refused_ids, unauthenticated] {
    absl::MutexLock lock(&published->mu);
    const int64_t refused = server_->unauthenticated_requests();
    unauthenticated->Increment(static_cast<double>(refused - published->unauthenticated));
    published->unauthenticated = refused;
    const ParameterServerStats now = ps_->stats();
    const ParameterServerStats& last = published->stats;
    steps->Increment(static_cast<double>(now.steps - last.steps));
    sends->Increment(static_cast<double>(now.sends - last.sends));
    gets->Increment(static_cast<double>(now.gets - last.gets));
    prefetches->Increment(static_cast<double>(now.prefetches - last.prefetches));
    applied->Increment(static_cast<double>(now.grads_applied - last.grads_applied));
    rows->Set(static_cast<double>(now.table_rows));
    refused_ids->Increment(static_cast<double>(now.table_refused_rows - last.table_refused_rows));
    for (const auto& [shard, n] : now.table_shard_rows) {
      auto gauge =
          metrics_.GetGauge("tessera_pserver_table_shard_rows", "Rows held by each table shard.",
                            {{"endpoint", config_.current_endpoint},
                             {"table", shard.first},
                             {"shard", std::to_string(shard.second)}});
      if (gauge.ok()) (*gauge)->Set(static_cast<double>(n));
    }
    published->stats = now;
  });
}

void PserverProcess::StartStatsLine() {
  // One stats line per --stats_interval_s: rates over the interval.
  if (config_.stats_interval_s <= 0) return;
  auto sample = [this] {
    ServerCounters c;
    c.at = absl::Now();
    RpcTotals rpc = rpc_metrics_->Totals();
    c.requests = rpc.requests;
    c.errors = rpc.errors;
    c.bytes_in = rpc.bytes_received;
    c.bytes_out = rpc.bytes_sent;
    ParameterServerStats st = ps_->stats();
    c.steps = st.steps;
    c.grads_applied = st.grads_applied;
    for (Histogram* h : {send_barrier_wait_, fetch_barrier_wait_}) {
      Histogram::Snapshot snap = h->Get();
      c.barrier_waits += static_cast<int64_t>(snap.count);
      c.barrier_wait_seconds += snap.sum;
    }
    return c;
  };
  int index = 0;
  while (index < static_cast<int>(config_.pservers.size()) &&
         config_.pservers[index] != config_.current_endpoint) {
    ++index;
  }
  std::string who = absl::StrCat("pserver ", index, " (", config_.current_endpoint, ")");
  stats_logger_ = std::thread([this, sample, who] {
    ServerCounters last = sample();
    while (!stop_stats_.WaitForNotificationWithTimeout(absl::Seconds(config_.stats_interval_s))) {
      ServerCounters now = sample();
      log_ << FormatIntervalStats(who, last, now) << std::endl;
      last = now;
    }
  });
}

void PserverProcess::Stop() {
  if (stopped_) return;
  stopped_ = true;
  if (!stop_stats_.HasBeenNotified()) stop_stats_.Notify();
  if (stats_logger_.joinable()) stats_logger_.join();
  if (metrics_server_ != nullptr) metrics_server_->Shutdown();
  if (server_ != nullptr) {
    server_->Shutdown();
    server_->Wait();
  }
}

absl::Status PserverProcess::Wait() {
  const ClusterConfig& config = config_;
  absl::Status result = ps_->Wait();
  if (!result.ok()) {
    // A failed server keeps answering a moment (every request gets the failure), so that its
    // trainers learn the cause, and pass it on, instead of finding the port closed.
    absl::SleepFor(kFailureLinger);
  }
  Stop();
  if (result.ok() && !config.table_export_dir.empty()) {
    auto rows = ps_->ExportTables(config.table_export_dir, TableExportOptions());
    if (!rows.ok()) return rows.status();
    log_ << "pserver " << config.current_endpoint << ": exported " << *rows << " table rows to "
         << config.table_export_dir << std::endl;
  }
  ParameterServerStats stats = ps_->stats();
  log_ << "pserver " << config.current_endpoint << ": steps=" << stats.steps
       << " sends=" << stats.sends << " grads_applied=" << stats.grads_applied
       << " gets=" << stats.gets << " prefetches=" << stats.prefetches
       << " table_rows=" << stats.table_rows << " table_refused_ids=" << stats.table_refused_rows
       << " unauthenticated=" << (server_ != nullptr ? server_->unauthenticated_requests() : 0);
  RpcTotals rpc_totals = rpc_metrics_->Totals();
  log_ << " requests=" << rpc_totals.requests << " bytes_in=" << rpc_totals.bytes_received
       << " bytes_out=" << rpc_totals.bytes_sent;
  for (const auto& [trainer, n] : stats.grads_received) {
    log_ << " grads_from_trainer_" << trainer << "=" << n;
  }
  if (!stats.trainers_dropped.empty()) {
    log_ << " dropped_silent_trainers=[" << absl::StrJoin(stats.trainers_dropped, ",") << "]";
  }
  log_ << std::endl;
  return result;
}

absl::Status RunPserver(const ClusterConfig& config, std::ostream& log, DaemonPhase* phase) {
  TS_ASSIGN_OR_RETURN(std::unique_ptr<PserverProcess> process,
                      PserverProcess::Create(config, log));
  TS_RETURN_IF_ERROR(process->Start());
  // Serving, with everything local in place; from here on the pserver depends on its trainers.
  phase->Started();
  return process->Wait();
}

}  // namespace tessera
