#include "pserver/pserver_daemon.h"

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include <atomic>
#include <thread>

#include "common/metrics/metrics.h"
#include "common/metrics/metrics_server.h"
#include "common/ops/ops.h"
#include "common/program_io.h"
#include "common/rpc/grpc/grpc_server.h"
#include "common/status.h"
#include "pserver/parameter_server.h"
#include "transpiler/cluster_programs.h"

namespace tessera {

absl::Status RunPserver(const ClusterConfig& config, std::ostream& log) {
  auto registry = NewStandardOpRegistry();
  TS_ASSIGN_OR_RETURN(DistributeTranspiler t, TranspileFor(config, *registry, config.trainer_id));
  TS_ASSIGN_OR_RETURN(ProgramDesc program, t.GetPserverProgram(config.current_endpoint));
  TS_ASSIGN_OR_RETURN(ProgramDesc startup, t.GetPserverStartupProgram(config.current_endpoint));

  Scope scope;
  Executor exec(registry.get());
  absl::Status s = exec.Run(startup, 0, &scope);
  if (!s.ok()) return absl::Status(s.code(), absl::StrCat("pserver startup program: ", s.message()));

  ParameterServerOptions po;
  po.job_id = config.job_id;
  po.endpoint = config.current_endpoint;
  po.barrier_timeout = absl::Seconds(config.barrier_timeout_s);
  po.table_admission_threshold = config.table_admission_threshold;
  po.table_evict_after_steps = config.table_evict_after_steps;
  TS_ASSIGN_OR_RETURN(auto ps, ParameterServer::Create(program, &scope, registry.get(), po));

  GrpcServerOptions so;
  so.address = config.current_endpoint;
  GrpcServer server(so, ps.get());
  TS_RETURN_IF_ERROR(server.Start());
  log << "pserver " << config.current_endpoint << ": serving " << program.blocks_size() - 1
      << " parameter blocks for " << config.trainers << " trainers ("
      << (config.sync_mode ? "sync" : "async") << ")" << std::endl;

  // Prometheus metrics: the server's counters, published every 500 ms.
  MetricsRegistry metrics;
  std::unique_ptr<MetricsServer> metrics_server;
  std::atomic<bool> exporting{true};
  std::thread exporter;
  if (config.metrics_port > 0) {
    MetricsServerOptions mo;
    mo.host = config.current_endpoint.substr(0, config.current_endpoint.rfind(':'));
    mo.port = config.metrics_port;
    metrics_server = std::make_unique<MetricsServer>(&metrics, mo);
    TS_RETURN_IF_ERROR(metrics_server->Start());
    log << "pserver " << config.current_endpoint << ": metrics on http://" << mo.host << ":"
        << metrics_server->port() << "/metrics" << std::endl;
    Labels labels = {{"endpoint", config.current_endpoint}};
    auto counter = [&](const char* name, const char* help) {
      return *metrics.GetCounter(name, help, labels);
    };
    Counter* steps = counter("tessera_pserver_steps_total", "Completed sync steps.");
    Counter* sends = counter("tessera_pserver_send_messages_total", "SendVariable messages.");
    Counter* gets = counter("tessera_pserver_get_requests_total", "GetVariable requests.");
    Counter* prefetches = counter("tessera_pserver_prefetch_requests_total", "Prefetch requests.");
    Counter* applied = counter("tessera_pserver_grads_applied_total", "Gradients optimized.");
    Gauge* rows = *metrics.GetGauge("tessera_pserver_table_rows",
                                    "Rows held by this pserver's table shards.", labels);
    exporter = std::thread([&, steps, sends, gets, prefetches, applied, rows] {
      ParameterServerStats last;
      while (exporting) {
        ParameterServerStats now = ps->stats();
        steps->Increment(static_cast<double>(now.steps - last.steps));
        sends->Increment(static_cast<double>(now.sends - last.sends));
        gets->Increment(static_cast<double>(now.gets - last.gets));
        prefetches->Increment(static_cast<double>(now.prefetches - last.prefetches));
        applied->Increment(static_cast<double>(now.grads_applied - last.grads_applied));
        rows->Set(static_cast<double>(now.table_rows));
        last = now;
        absl::SleepFor(absl::Milliseconds(500));
      }
    });
  }

  absl::Status result = ps->Wait();
  exporting = false;
  if (exporter.joinable()) exporter.join();
  if (metrics_server != nullptr) metrics_server->Shutdown();
  server.Shutdown();
  server.Wait();
  if (result.ok() && !config.table_export_dir.empty()) {
    auto rows = ps->ExportTables(config.table_export_dir, TableExportOptions());
    if (!rows.ok()) return rows.status();
    log << "pserver " << config.current_endpoint << ": exported " << *rows << " table rows to "
        << config.table_export_dir << std::endl;
  }
  ParameterServerStats stats = ps->stats();
  log << "pserver " << config.current_endpoint << ": steps=" << stats.steps
      << " sends=" << stats.sends << " grads_applied=" << stats.grads_applied
      << " gets=" << stats.gets << " prefetches=" << stats.prefetches
      << " table_rows=" << stats.table_rows;
  for (const auto& [trainer, n] : stats.grads_received) {
    log << " grads_from_trainer_" << trainer << "=" << n;
  }
  log << std::endl;
  return result;
}

}  // namespace tessera
