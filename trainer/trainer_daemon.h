// TrainerProcess: the whole life of a trainer process, given its configuration.
//   Create  builds everything local: metrics and the --trace timeline, the RPC clients (not yet
//           connected), the model transpiled for this trainer, its data (this trainer's share
//           of every global batch, the same shuffled order on every trainer), the checkpoint
//           position to resume at, /metrics with --metrics_port and the device plan; so its
//           errors are configuration errors (no data, zero steps, a bad model or flag);
//   Start   connects: every pserver within --connect_timeout_s, the job handshake, the
//           heartbeats, then the startup program, which pulls the initial parameters. Returns
//           once the trainer is ready to train;
//   Wait    trains to the end: the epochs, the checkpoints, the held-out loss/AUC (trainer 0),
//           COMPLETE to the pservers, --dump_params; then stops and writes the trace.
// A failure of Start or Wait is told to the pservers (ABORT, with the error) while this trainer
// still beats and before its communicator flushes, so that they fail the job at once instead of
// waiting for it at a barrier. A failure of Create is not (nothing is connected yet): RunTrainer
// tells them.
// RunTrainer is the daemon's body (DaemonMain): Create, Start, Wait.
// Thread-compatible: one thread calls Create, Start, Wait and the destructor, in that order.
#ifndef TESSERA_TRAINER_TRAINER_DAEMON_H_
#define TESSERA_TRAINER_TRAINER_DAEMON_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/config/cluster_config.h"
#include "common/config/daemon_flags.h"
#include "common/device/placement.h"
#include "common/framework/model_spec.h"
#include "common/framework/op_registry.h"
#include "common/io/file_system.h"
#include "common/metrics/metrics.h"
#include "common/metrics/metrics_server.h"
#include "common/metrics/trace.h"
#include "common/rpc/grpc/grpc_client.h"
#include "common/rpc/rpc_metrics.h"
#include "trainer/bundle_export.h"
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

class TrainerProcess {
 public:
  // `config` must outlive the process; progress goes to `log`. Errors name the flag, file or
  // value at fault; whatever was built is released (and a --trace written) before it returns.
  // `fs` (null: the local file system) holds the checkpoints (--checkpoint_dir, --init_from) and
  // must outlive the process.
  static absl::StatusOr<std::unique_ptr<TrainerProcess>> Create(const ClusterConfig& config,
                                                                std::ostream& log,
                                                                io::FileSystem* fs = nullptr);
  // Without Wait: after a successful Start tells the pservers (ABORT, Cancelled) that this
  // trainer stopped; then stops the heartbeats and servers and writes the trace. Blocks at most
  // for the RPCs in flight (each bounded by its deadline).
  ~TrainerProcess();
  TrainerProcess(const TrainerProcess&) = delete;
  TrainerProcess& operator=(const TrainerProcess&) = delete;

  // Blocks until every pserver is reached (--connect_timeout_s), registered and has sent the
  // initial parameters. An unreachable pserver, a job mismatch or a failed startup program fail
  // here (told to the pservers). Call once.
  absl::Status Start();
  // Blocks until training ended: OK when it completed (COMPLETE sent, parameters dumped); the
  // error otherwise (told to the pservers). Then stops. Call once, after a successful Start.
  absl::Status Wait();

 private:
  TrainerProcess(const ClusterConfig& config, std::ostream& log, io::FileSystem* fs)
      : config_(config), log_(log), fs_(fs) {}

  // Create, in order.
  absl::Status Init();
  absl::Status SetUpMetricsAndTrace();
  absl::Status SetUpPlacesAndRpc();
  absl::Status SetUpCollective();
  absl::Status BuildPrograms();
  absl::Status MemoryOptimizeProgram();
  absl::Status OpenData();
  void SetTrainerOptions();
  absl::Status SetUpCheckpoints();
  absl::Status StartMetricsServer();
  void LogDescription();
  absl::Status SetUpTimedOps();
  absl::Status PlanDevices();
  // Start, in order.
  absl::Status Connect();
  absl::Status ConnectPservers();
  // Wait, in order.
  absl::Status Train();
  absl::Status Finish();
  // One distributed evaluation of the held-out set (see trainer_daemon.cc); trainer 0 logs it.
  absl::Status Evaluate();
  // Checkpoint of position `p` (trainer 0 with --checkpoint_dir).
  absl::Status SaveCheckpoint(const TrainPosition& p);
  // An inference bundle of the current step (trainer 0 with --export_dir).
  absl::Status Export();
  // Releases what runs threads or talks to peers, in the order of the old procedure's locals
  // going out of scope, then writes the trace. Idempotent.
  void Stop();

  // Members in the order the phases create them: destroyed in reverse, as the procedure's
  // locals were.
  const ClusterConfig& config_;
  std::ostream& log_;
  io::FileSystem* const fs_;  // checkpoints
  MetricsRegistry metrics_;
  std::unique_ptr<RpcMetrics> rpc_metrics_;
  std::unique_ptr<Tracer> tracer_;  // --trace; null without (or until its first write worked)
  std::unique_ptr<StepTracer> step_tracer_;
  std::vector<Place> places_;
  RpcContext rpc_;
  GrpcClientOptions client_options_;
  std::unique_ptr<ClientPool> pool_;
  std::unique_ptr<AsyncCommunicator> communicator_;  // async mode only
  OpRegistry registry_;
  std::unique_ptr<CollectiveState> collective_;  // registered (all-reduce modes) or unused
  bool collective_mode_ = false;                 // --mode=collective: no pservers
  bool all_reduces_ = false;                     // --mode=collective or hybrid
  ModelSpec model_;
  std::vector<std::string> trainable_;  // dense trainable variables (--dump_params)
  ModelSpec dist_;                      // the program this trainer runs
  bool overlap_ = false;                // all-reduce overlapped with backward
  std::unique_ptr<TrainingData> data_;
  bool streaming_ = false;
  int64_t steps_per_epoch_ = 0;
  LocalTrainerOptions trainer_options_;
  std::optional<TrainPosition> resume_;  // --init_from's position
  bool checkpointing_ = false;
  std::unique_ptr<CheckpointWriter> checkpoints_;
  std::unique_ptr<BundleExporter> exporter_;  // trainer 0 with --export_dir
  std::unique_ptr<MetricsServer> metrics_server_;
  Gauge* eval_loss_ = nullptr;  // --metrics_port only
  Gauge* eval_auc_ = nullptr;
  Gauge* eval_accuracy_ = nullptr;
  int64_t eval_rounds_ = 0;         // evaluations run (the pservers' round numbers)
  int64_t last_eval_step_ = -1;     // global step of the last evaluation
  OpTimingOptions timing_;          // the trace and barrier histograms the timed kernels report to
  OpRegistry timed_registry_;       // registry_'s kernels, timed
  DevicePlan devices_;
  // --device=gpu: the plan's placed registries, timed (they must not outlive devices_).
  std::vector<std::unique_ptr<OpRegistry>> timed_placed_;
  const OpRegistry* executor_registry_ = nullptr;  // timed_registry_ or timed_placed_[0]
  std::unique_ptr<Heartbeat> heartbeat_;
  std::unique_ptr<LocalTrainer> trainer_;
  bool start_called_ = false;
  bool started_ = false;  // Start succeeded
  bool stopped_ = false;
};

// The daemon's body: Create, then (DaemonPhase::Started: everything local is in place) Start
// and Wait. Progress goes to `log`. Returns OK when training completed; the error otherwise,
// told to the pservers whichever phase it came from.
absl::Status RunTrainer(const ClusterConfig& config, std::ostream& log, DaemonPhase* phase);

}  // namespace tessera

#endif  // TESSERA_TRAINER_TRAINER_DAEMON_H_
