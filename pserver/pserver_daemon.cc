#include "pserver/pserver_daemon.h"

#include <pthread.h>
#include <signal.h>

#include <atomic>
#include <set>
#include <string>
#include <thread>

#include "absl/cleanup/cleanup.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "cluster/cluster_programs.h"
#include "cluster/job_fields.h"
#include "common/base/status.h"
#include "common/framework/program_io.h"
#include "common/io/checkpoint_io.h"
#include "common/metrics/interval_stats.h"
#include "common/ops/ops.h"
#include "common/rpc/grpc/credentials.h"

namespace tessera {

namespace {
// How long a failed pserver keeps answering requests with its failure before it exits.
constexpr absl::Duration kFailureLinger = absl::Seconds(2);

// The position of --current_endpoint in --pservers; -1 if it is not there.
int PserverIndex(const ClusterConfig& config) {
  for (size_t i = 0; i < config.pservers.size(); ++i) {
    if (config.pservers[i] == config.current_endpoint) return static_cast<int>(i);
  }
  return -1;
}

// Serves `handler` on --current_endpoint with the daemons' mutual TLS (--tls_*) and job token
// (--job_token, --job_token_file) settings; `*server` is set before it starts, so that a caller's
// shutdown finds it either way. `*security` gets what the log line says of them.
absl::Status StartRpcServer(const ClusterConfig& config, RequestHandler* handler,
                            RpcObserver* observer, std::unique_ptr<GrpcServer>* server,
                            std::string* security) {
  GrpcServerOptions so;
  so.address = config.current_endpoint;
  so.observer = observer;
  TS_ASSIGN_OR_RETURN(so.security, LoadRpcSecurity(config.tls_cert, config.tls_key, config.tls_ca,
                                                   config.job_token, config.job_token_file));
  *security = absl::StrCat(so.security.tls() ? ", mutual TLS" : "",
                           so.security.job_token.empty() ? "" : ", job token required");
  *server = std::make_unique<GrpcServer>(so, handler);
  return (*server)->Start();
}

// Serves `metrics` on http://<--current_endpoint's host>:<--metrics_port>/metrics when
// --metrics_port is set (`*server` stays null otherwise), and logs where.
absl::Status StartMetricsServer(const ClusterConfig& config, MetricsRegistry* metrics,
                                std::ostream& log, std::unique_ptr<MetricsServer>* server) {
  if (config.metrics_port <= 0) return absl::OkStatus();
  MetricsServerOptions mo;
  mo.host = config.current_endpoint.substr(0, config.current_endpoint.rfind(':'));
  mo.port = config.metrics_port;
  *server = std::make_unique<MetricsServer>(metrics, mo);
  TS_RETURN_IF_ERROR((*server)->Start());
  log << "pserver " << config.current_endpoint << ": metrics on http://" << mo.host << ":"
      << (*server)->port() << "/metrics" << std::endl;
  return absl::OkStatus();
}

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
  std::set<std::string> groups;
  for (const OpDesc& op : program.blocks(0).ops()) {
    if (op.type() != "sparse_table") continue;
    ++table_shards_;
    const std::string group = GetStringAttr(op, "group", "");
    if (!group.empty()) groups.insert(group);
  }
  table_groups_ = static_cast<int>(groups.size());

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
  po.export_dir = config.export_dir;
  po.fs = fs_;
  if (!config.trace.empty()) {
    // Pserver k is process 1000 + k of the timeline (trainers are their ids).
    tracer_ = std::make_unique<Tracer>(TracerOptions{
        1000 + po.pserver_index,
        absl::StrCat("pserver ", po.pserver_index, " (", config.current_endpoint, ")")});
    // An empty trace now: a bad --trace path fails at start, not after training.
    TS_RETURN_IF_ERROR(tracer_->WriteFile(config.trace));
    po.tracer = tracer_.get();
    po.trace_first_step = config.trace_first_step;
    po.trace_steps = config.trace_steps;
    // Also as soon as the last traced step is applied: a pserver killed later keeps it.
    po.on_traced = [this] { WriteTrace(); };
  }
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
  std::string security;
  TS_RETURN_IF_ERROR(StartRpcServer(config, ps_.get(), rpc_metrics_.get(), &server_, &security));
  log_ << "pserver " << config.current_endpoint << ": serving " << blocks_
       << " parameter blocks and " << table_shards_ << " table shards"
       << (table_groups_ > 0 ? absl::StrCat(" (", table_groups_, " table groups)") : "") << " for "
       << config.trainers << " trainers (" << (config.sync_mode ? "sync" : "async") << ")"
       << security << std::endl;
  TS_RETURN_IF_ERROR(StartMetricsServer(config, &metrics_, log_, &metrics_server_));
  if (metrics_server_ != nullptr) AddMetricsCollector();
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
  Counter* fused =
      counter("tessera_pserver_fused_prefetches_total",
              "Table lookups a sync step's optimize did right after the table's update.");
  Counter* ahead = counter("tessera_pserver_lookups_ahead_total",
                           "Of the fused lookups, those looked up as soon as they came, while the "
                           "trainer computed (one trainer's look-ahead).");
  Counter* reusing = counter("tessera_pserver_table_updates_reusing_lookups_total",
                             "Table updates that took the rows their batch's lookup found instead "
                             "of searching the table again (one sync trainer, async pushes).");
  Counter* applied = counter("tessera_pserver_grads_applied_total", "Gradients optimized.");
  Counter* early =
      counter("tessera_pserver_early_applies_total",
              "Sync: gradient blocks applied as soon as every trainer's copy was in, ahead of "
              "the step's barrier (early sends, chunked tensors).");
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
  metrics_.AddCollector([this, published, steps, sends, gets, prefetches, fused, ahead, reusing,
                         applied, early, rows, refused_ids, unauthenticated] {
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
    fused->Increment(static_cast<double>(now.fused_prefetches - last.fused_prefetches));
    ahead->Increment(static_cast<double>(now.lookups_ahead - last.lookups_ahead));
    reusing->Increment(static_cast<double>(now.table_updates_reusing_lookups -
                                           last.table_updates_reusing_lookups));
    applied->Increment(static_cast<double>(now.grads_applied - last.grads_applied));
    early->Increment(static_cast<double>(now.early_applies - last.early_applies));
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
  std::string who =
      absl::StrCat("pserver ", PserverIndex(config_), " (", config_.current_endpoint, ")");
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

void PserverProcess::WriteTrace() {
  if (tracer_ == nullptr) return;
  absl::Status s = tracer_->WriteFile(config_.trace);
  log_ << "pserver " << config_.current_endpoint << ": "
       << (s.ok() ? absl::StrCat("trace of ", tracer_->size(), " spans written to ", config_.trace)
                  : absl::StrCat("trace not written: ", s.message()))
       << std::endl;
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
  WriteTrace();
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
       << " fused_prefetches=" << stats.fused_prefetches << " lookups_ahead=" << stats.lookups_ahead
       << " early_applies=" << stats.early_applies << " table_rows=" << stats.table_rows
       << " table_refused_ids=" << stats.table_refused_rows
       << " table_updates_reusing_lookups=" << stats.table_updates_reusing_lookups
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

// The serving process.

absl::StatusOr<std::unique_ptr<ServingPserverProcess>> ServingPserverProcess::Create(
    const ClusterConfig& config, std::ostream& log, io::FileSystem* fs) {
  std::unique_ptr<ServingPserverProcess> p(
      new ServingPserverProcess(config, log, fs != nullptr ? fs : io::PosixFileSystem::Default()));
  TS_RETURN_IF_ERROR(p->Init());
  return p;
}

ServingPserverProcess::~ServingPserverProcess() { Stop(); }

absl::Status ServingPserverProcess::Init() {
  const ClusterConfig& config = config_;
  shard_ = PserverIndex(config);
  num_shards_ = static_cast<int>(config.pservers.size());
  if (shard_ < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--current_endpoint=", config.current_endpoint,
                     " is not in --pservers=", absl::StrJoin(config.pservers, ",")));
  }
  TS_ASSIGN_OR_RETURN(rpc_metrics_, RpcMetrics::Create(&metrics_, RpcSide::kServer,
                                                       {{"endpoint", config.current_endpoint}}));
  TableServerOptions to;
  to.bundle = config.serve_bundle;
  to.shard = shard_;
  to.num_shards = num_shards_;
  to.job_id = config.job_id;
  to.endpoint = config.current_endpoint;
  to.fs = fs_;
  auto tables = TableServer::Create(to);
  if (!tables.ok()) {
    return absl::Status(tables.status().code(), absl::StrCat("--serve_bundle=", config.serve_bundle,
                                                             ": ", tables.status().message()));
  }
  tables_ = *std::move(tables);
  return absl::OkStatus();
}

int ServingPserverProcess::port() const { return server_ != nullptr ? server_->port() : 0; }

absl::Status ServingPserverProcess::Start() {
  const ClusterConfig& config = config_;
  std::string security;
  TS_RETURN_IF_ERROR(
      StartRpcServer(config, tables_.get(), rpc_metrics_.get(), &server_, &security));
  const ServedExport served = tables_->served();
  log_ << "pserver " << config.current_endpoint << ": serving " << served.dir << " (step "
       << served.step << "): " << served.tables << " tables, " << served.rows << " rows (shard "
       << shard_ << " of " << num_shards_ << "), read-only" << security;
  if (config.watch_bundle) {
    log_ << ", watching " << config.serve_bundle << " every " << config.watch_bundle_interval_s
         << " s";
  }
  log_ << std::endl;
  TS_RETURN_IF_ERROR(StartMetricsServer(config, &metrics_, log_, &metrics_server_));
  if (metrics_server_ != nullptr) AddMetricsCollector();
  StartStatsLine();
  if (config.watch_bundle) StartWatcher();
  return absl::OkStatus();
}

void ServingPserverProcess::AddMetricsCollector() {
  Labels labels = {{"endpoint", config_.current_endpoint}};
  auto counter = [&](const char* name, const char* help) {
    return *metrics_.GetCounter(name, help, labels);
  };
  auto gauge = [&](const char* name, const char* help) {
    return *metrics_.GetGauge(name, help, labels);
  };
  Counter* prefetches = counter("tessera_pserver_prefetch_requests_total", "Prefetch requests.");
  Counter* ids = counter("tessera_serving_ids_total", "Ids looked up by Prefetch requests.");
  Counter* reloads = counter("tessera_serving_reloads_total",
                             "Newer exports picked up without a restart (--watch_bundle).");
  Counter* failed = counter("tessera_serving_failed_refreshes_total",
                            "Looks for a newer export that failed (the served one stayed).");
  Counter* unauthenticated =
      counter("tessera_rpc_unauthenticated_total",
              "Requests refused for a missing or wrong job token (UNAUTHENTICATED).");
  Gauge* step = gauge("tessera_serving_export_step", "The step of the export served.");
  Gauge* rows = gauge("tessera_pserver_table_rows", "Rows held by this pserver's table shards.");
  Gauge* tables = gauge("tessera_serving_tables", "Tables served.");
  // What the counters last published, so that each collection adds the difference.
  struct Published {
    absl::Mutex mu;
    TableServerStats stats ABSL_GUARDED_BY(mu);
    int64_t unauthenticated ABSL_GUARDED_BY(mu) = 0;
  };
  auto published = std::make_shared<Published>();
  metrics_.AddCollector(
      [this, published, prefetches, ids, reloads, failed, unauthenticated, step, rows, tables] {
        absl::MutexLock lock(&published->mu);
        const int64_t refused = server_->unauthenticated_requests();
        unauthenticated->Increment(static_cast<double>(refused - published->unauthenticated));
        published->unauthenticated = refused;
        const TableServerStats now = tables_->stats();
        const TableServerStats& last = published->stats;
        prefetches->Increment(static_cast<double>(now.prefetches - last.prefetches));
        ids->Increment(static_cast<double>(now.ids - last.ids));
        reloads->Increment(static_cast<double>(now.reloads - last.reloads));
        failed->Increment(static_cast<double>(now.failed_refreshes - last.failed_refreshes));
        step->Set(static_cast<double>(now.served.step));
        rows->Set(static_cast<double>(now.served.rows));
        tables->Set(static_cast<double>(now.served.tables));
        published->stats = now;
      });
}

void ServingPserverProcess::StartStatsLine() {
  // One line per --stats_interval_s: "pserver 0 (ep): 120 req/s, in 0.1 MB/s, out 2.3 MB/s,
  // 0 errors, 120.0 prefetches/s, 30720 ids/s, step 42".
  if (config_.stats_interval_s <= 0) return;
  struct Sample {
    absl::Time at;
    RpcTotals rpc;
    TableServerStats tables;
  };
  auto sample = [this] { return Sample{absl::Now(), rpc_metrics_->Totals(), tables_->stats()}; };
  std::string who = absl::StrCat("pserver ", shard_, " (", config_.current_endpoint, ")");
  stats_logger_ = std::thread([this, sample, who] {
    Sample last = sample();
    while (!stop_threads_.WaitForNotificationWithTimeout(absl::Seconds(config_.stats_interval_s))) {
      Sample now = sample();
      const double s = absl::ToDoubleSeconds(now.at - last.at);
      auto rate = [s](int64_t after, int64_t before) {
        return s > 0 ? static_cast<double>(after - before) / s : 0.0;
      };
      log_ << absl::StrFormat(
                  "%s: %.0f req/s, in %.1f MB/s, out %.1f MB/s, %d errors, %.1f prefetches/s, "
                  "%.0f ids/s, step %d",
                  who, rate(now.rpc.requests, last.rpc.requests),
                  rate(now.rpc.bytes_received, last.rpc.bytes_received) / 1e6,
                  rate(now.rpc.bytes_sent, last.rpc.bytes_sent) / 1e6,
                  now.rpc.errors - last.rpc.errors,
                  rate(now.tables.prefetches, last.tables.prefetches),
                  rate(now.tables.ids, last.tables.ids), now.tables.served.step)
           << std::endl;
      last = now;
    }
  });
}

void ServingPserverProcess::StartWatcher() {
  watcher_ = std::thread([this] {
    const std::string& ep = config_.current_endpoint;
    std::string last_error;  // a failure is logged once until it changes or a refresh succeeds
    while (!stop_threads_.WaitForNotificationWithTimeout(
        absl::Seconds(config_.watch_bundle_interval_s))) {
      const int64_t reloads = tables_->stats().reloads;
      absl::Status s = tables_->Refresh();
      const ServedExport served = tables_->served();
      if (!s.ok()) {
        if (s.message() != last_error) {
          log_ << "pserver " << ep << ": still serving " << served.dir << " (step " << served.step
               << "): " << s.message() << std::endl;
          last_error = std::string(s.message());
        }
        continue;
      }
      last_error.clear();
      if (tables_->stats().reloads == reloads) continue;
      log_ << "pserver " << ep << ": now serving " << served.dir << " (step " << served.step << ", "
           << (served.by_delta ? "delta" : "new base") << "): " << served.tables << " tables, "
           << served.rows << " rows" << std::endl;
    }
  });
}

void ServingPserverProcess::RequestStop() {
  if (!stop_asked_.exchange(true)) stop_requested_.Notify();
}

void ServingPserverProcess::Stop() {
  if (stopped_) return;
  stopped_ = true;
  stop_threads_.Notify();
  // A refresh in progress (loading a new base) finishes first.
  if (watcher_.joinable()) watcher_.join();
  if (stats_logger_.joinable()) stats_logger_.join();
  if (metrics_server_ != nullptr) metrics_server_->Shutdown();
  if (server_ != nullptr) {
    server_->Shutdown();
    server_->Wait();
  }
}

absl::Status ServingPserverProcess::Wait() {
  stop_requested_.WaitForNotification();
  Stop();
  const TableServerStats stats = tables_->stats();
  RpcTotals rpc = rpc_metrics_->Totals();
  log_ << "pserver " << config_.current_endpoint << ": served " << stats.served.dir << " (step "
       << stats.served.step << ") prefetches=" << stats.prefetches << " ids=" << stats.ids
       << " reloads=" << stats.reloads << " failed_refreshes=" << stats.failed_refreshes
       << " unauthenticated=" << (server_ != nullptr ? server_->unauthenticated_requests() : 0)
       << " requests=" << rpc.requests << " bytes_in=" << rpc.bytes_received
       << " bytes_out=" << rpc.bytes_sent << std::endl;
  return absl::OkStatus();
}

namespace {

// The serving daemon: serves until SIGTERM or SIGINT. Both are blocked in this thread before any
// other thread starts (every thread started after inherits the mask), so that only the sigwait
// below receives them; the previous mask is restored on return.
absl::Status RunServingPserver(const ClusterConfig& config, std::ostream& log, DaemonPhase* phase) {
  sigset_t stop_signals, previous;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGTERM);
  sigaddset(&stop_signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &stop_signals, &previous);
  absl::Cleanup restore = [&previous] { pthread_sigmask(SIG_SETMASK, &previous, nullptr); };
  TS_ASSIGN_OR_RETURN(std::unique_ptr<ServingPserverProcess> process,
                      ServingPserverProcess::Create(config, log));
  TS_RETURN_IF_ERROR(process->Start());
  phase->Started();
  int sig = 0;
  while (sigwait(&stop_signals, &sig) != 0) {
  }
  log << "pserver " << config.current_endpoint << ": " << (sig == SIGTERM ? "SIGTERM" : "SIGINT")
      << ", stopping" << std::endl;
  process->RequestStop();
  return process->Wait();
}

}  // namespace

absl::Status RunPserver(const ClusterConfig& config, std::ostream& log, DaemonPhase* phase) {
  // Serving a bundle needs no model, program or trainer.
  if (!config.serve_bundle.empty()) return RunServingPserver(config, log, phase);
  TS_ASSIGN_OR_RETURN(std::unique_ptr<PserverProcess> process, PserverProcess::Create(config, log));
  TS_RETURN_IF_ERROR(process->Start());
  // Serving, with everything local in place; from here on the pserver depends on its trainers.
  phase->Started();
  return process->Wait();
}

}  // namespace tessera
