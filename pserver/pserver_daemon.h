// PserverProcess: the whole life of a pserver process, given its configuration.
//   Create  builds the model's single-machine program, transpiles it, takes this endpoint's
//           pserver program, runs its startup, creates the ParameterServer (restored from
//           --init_from) and its metrics: everything local, so its errors are configuration
//           errors;
//   Start   serves: gRPC on the endpoint, /metrics with --metrics_port, the --stats_interval_s
//           line;
//   Wait    blocks until every trainer completed (OK) or the job failed (the failure, after
//           answering requests with it a moment), shuts the servers down, exports the tables
//           (--table_export_dir) and logs the totals.
// ServingPserverProcess: a pserver serving its shard of an inference bundle's tables read-only
// (--serve_bundle; pserver/table_server.h), with no model or program:
//   Create  resolves the bundle and loads this pserver's shard of its tables (shard i of N: i is
//           --current_endpoint's position in --pservers, N their number): configuration errors;
//   Start   serves: gRPC on the endpoint (TLS and job token as PserverProcess), /metrics with
//           --metrics_port, the --stats_interval_s line, and with --watch_bundle a thread that
//           looks for a newer export every --watch_bundle_interval_s;
//   Wait    blocks until RequestStop(), then shuts everything down and logs the totals.
// RunPserver is the daemon's body (DaemonMain): with --serve_bundle the serving process, which
// ends at SIGTERM or SIGINT (exit 0); else PserverProcess. Each is Create, Start, Wait.
#ifndef TESSERA_PSERVER_PSERVER_DAEMON_H_
#define TESSERA_PSERVER_PSERVER_DAEMON_H_

#include <atomic>
#include <memory>
#include <ostream>
#include <thread>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/notification.h"
#include "common/config/cluster_config.h"
#include "common/config/daemon_flags.h"
#include "common/framework/executor.h"
#include "common/io/file_system.h"
#include "common/metrics/metrics.h"
#include "common/metrics/metrics_server.h"
#include "common/metrics/trace.h"
#include "common/rpc/grpc/grpc_server.h"
#include "common/rpc/rpc_metrics.h"
#include "pserver/parameter_server.h"
#include "pserver/table_server.h"

namespace tessera {

class PserverProcess {
 public:
  // `config` must outlive the process; progress goes to `log`. `fs` (null: the local file
  // system) holds the checkpoints (--checkpoint_dir, --init_from) and must outlive the process.
  static absl::StatusOr<std::unique_ptr<PserverProcess>> Create(const ClusterConfig& config,
                                                                std::ostream& log,
                                                                io::FileSystem* fs = nullptr);
  // Stops whatever Start started if Wait was not called (e.g. after a failed Start).
  ~PserverProcess();

  // A port in use, unreadable TLS files or a bad token fail here.
  absl::Status Start();
  // Returns OK when training completed; the job's failure otherwise.
  absl::Status Wait();

  ParameterServer* server() { return ps_.get(); }

 private:
  PserverProcess(const ClusterConfig& config, std::ostream& log, io::FileSystem* fs)
      : config_(config), log_(log), fs_(fs) {}
  absl::Status Init();
  // Counters and gauges of ParameterServerStats, updated at every read of /metrics.
  void AddMetricsCollector();
  void StartStatsLine();
  void Stop();
  // Writes the --trace timeline (if any), logging where or why not.
  void WriteTrace();

  const ClusterConfig& config_;
  std::ostream& log_;
  io::FileSystem* const fs_;  // checkpoints
  std::unique_ptr<OpRegistry> registry_;
  Scope scope_;
  MetricsRegistry metrics_;
  std::unique_ptr<RpcMetrics> rpc_metrics_;
  Histogram* send_barrier_wait_ = nullptr;
  Histogram* fetch_barrier_wait_ = nullptr;
  int blocks_ = 0;        // parameter blocks served
  int table_shards_ = 0;  // distributed table shards held
  int table_groups_ = 0;  // of them, groups held as one table (--fuse_tables)
  std::unique_ptr<Tracer> tracer_;  // --trace
  std::unique_ptr<ParameterServer> ps_;
  std::unique_ptr<GrpcServer> server_;
  std::unique_ptr<MetricsServer> metrics_server_;
  absl::Notification stop_stats_;
  std::thread stats_logger_;
  bool stopped_ = false;
};

class ServingPserverProcess {
 public:
  // `config` must outlive the process; progress goes to `log`. `fs` (null: the local file
  // system) holds the bundle and must outlive the process.
  static absl::StatusOr<std::unique_ptr<ServingPserverProcess>> Create(
      const ClusterConfig& config, std::ostream& log, io::FileSystem* fs = nullptr);
  // Stops whatever Start started if Wait was not called.
  ~ServingPserverProcess();

  // A port in use, unreadable TLS files or a bad token fail here.
  absl::Status Start();
  // Makes Wait return; any thread, any number of times.
  void RequestStop();
  // Blocks until RequestStop(), then shuts down. OK.
  absl::Status Wait();

  TableServer* server() { return tables_.get(); }
  // The bound gRPC port (after Start).
  int port() const;

 private:
  ServingPserverProcess(const ClusterConfig& config, std::ostream& log, io::FileSystem* fs)
      : config_(config), log_(log), fs_(fs) {}
  absl::Status Init();
  void AddMetricsCollector();
  void StartStatsLine();
  void StartWatcher();
  void Stop();

  const ClusterConfig& config_;
  std::ostream& log_;
  io::FileSystem* const fs_;
  int shard_ = 0;
  int num_shards_ = 1;
  MetricsRegistry metrics_;
  std::unique_ptr<RpcMetrics> rpc_metrics_;
  std::unique_ptr<TableServer> tables_;
  std::unique_ptr<GrpcServer> server_;
  std::unique_ptr<MetricsServer> metrics_server_;
  std::atomic<bool> stop_asked_{false};
  absl::Notification stop_requested_;  // Wait may shut down
  absl::Notification stop_threads_;    // the stats line and the watcher end
  std::thread stats_logger_;
  std::thread watcher_;
  bool stopped_ = false;
};

// Progress goes to `log`. Returns OK when training completed (serving: stopped by a signal); the
// error otherwise.
absl::Status RunPserver(const ClusterConfig& config, std::ostream& log, DaemonPhase* phase);

}  // namespace tessera

#endif  // TESSERA_PSERVER_PSERVER_DAEMON_H_
