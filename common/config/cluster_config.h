// ClusterConfig: everything a pserver or trainer daemon is configured with, and how it is read.
//
// Precedence for each setting: an explicit command-line flag, then TESSERA_<FLAG> (upper case),
// then Fluid's PADDLE_* name where one exists (PADDLE_TRAINING_ROLE, PADDLE_PSERVERS_IP_PORT_LIST,
// PADDLE_TRAINER_ID, PADDLE_TRAINERS_NUM, PADDLE_CURRENT_ENDPOINT, PADDLE_TRAINER_ENDPOINTS),
// then the default. Bad values give one line naming the setting, where it came from and why it
// is wrong; daemons exit with status 2 on such errors.
#ifndef TESSERA_COMMON_CONFIG_CLUSTER_CONFIG_H_
#define TESSERA_COMMON_CONFIG_CLUSTER_CONFIG_H_

#include <functional>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace tessera {

// A pserver takes a trainer that sent heartbeats and then nothing for this many --heartbeat_s as
// lost.
inline constexpr int kHeartbeatsMissed = 5;

struct ClusterConfig {
  // Cluster shape.
  std::string role;                   // "pserver" | "trainer"
  std::vector<std::string> pservers;  // host:port,...
  int trainers = 1;
  int trainer_id = 0;
  std::string current_endpoint;                // this pserver's host:port
  std::vector<std::string> trainer_endpoints;  // collective mode
  std::string mode = "pserver";                // "pserver" | "collective"
  std::string job_id = "tessera";
  // Transpiler.
  bool sync_mode = true;
  std::string split_method = "round_robin";
  bool slice_var_up = true;
  int64_t min_block_size = 8192;
  // Model and data.
  std::string example = "ctr";  // ctr | mlp_regression: built-in model and synthetic data
  std::string model;            // model file (proto/model.proto); "" = the example's
  std::string program;          // optional text-proto main program (overrides example's)
  std::string startup_program;  // its startup program
  std::string train_data;       // Criteo-format file; "" = synthetic data
  std::string test_data;
  int64_t max_line_bytes = int64_t{1} << 20;  // longest line a data file may have
  int64_t max_bad_lines = 0;  // malformed data lines skipped before failing
  std::string reader = "memory";  // "memory" | "stream" (common/data/stream.h)
  std::string data_format = "criteo";  // criteo | csv | libsvm | multislot (common/data/formats.h)
  bool float_dense = false;            // criteo: dense fields are floats, not counts
  std::string csv_columns;             // csv: "label=..;dense=..;slots=..;multi=.." ("" = Criteo names)
  int64_t shuffle_buffer = 10000;   // --reader=stream: examples of the shuffle buffer
  int64_t reader_queue = 8192;      // --reader=stream: parsed examples read ahead
  int64_t num_examples = 60000;  // synthetic training examples
  int64_t num_test_examples = 5000;
  int64_t vocab_per_slot = 10000;           // synthetic CTR vocabulary (distinct ids per slot)
  bool distributed_tables = true;           // ctr: embedding tables live only on the pservers
  std::string table_shard_method = "hash";  // distributed tables: "hash" or "mod" of the id
  // distributed tables: "row_wise" (split by id over all pservers) or "table_wise" (each whole
  // on one pserver; transpiler/distribute_transpiler.h)
  std::string table_placement = "row_wise";
  bool fuse_tables = true;
  int64_t table_admission_threshold = 0;    // create a row at its K-th sighting (0 = off)
  int64_t table_evict_after_steps = 0;      // drop rows unseen for T steps (0 = off)
  // pserver: rows per table shard; new ids beyond are refused (0 = no limit)
  int64_t table_max_rows = 0;
  std::string table_export_dir;             // pserver: export its table shards here at the end
  int64_t batch_size = 256;                 // global batch (split across trainers)
  int epochs = 1;
  uint64_t seed = 1;
  float learning_rate = 0.0f;  // 0 = the example's default
  int64_t log_every_steps = 20;
  // trainer: a distributed held-out evaluation (every trainer scores its share, trainer 0 reports
  // the job's result) every N steps (0 = only at the end) and/or after every epoch.
  int64_t eval_every_steps = 0;
  bool eval_every_epoch = false;
  std::string dump_params;       // trainer: write final parameters here
  bool memory_optimize = false;  // trainer: reuse buffers of temporaries (grads kept)
  // RPC.
  double rpc_deadline_s = 120;
  double connect_timeout_s = 10;  // trainer: wait this long for each pserver at start
  double keepalive_s = 5;  // trainer: ping interval and timeout of pserver connections (0 = off)
  // Trainers send each pserver a heartbeat this often; a pserver takes a trainer that sent one
  // and then nothing for kHeartbeatsMissed times this as lost (0 = no heartbeats).
  double heartbeat_s = 2;
  double startup_timeout_s = 600;  // pserver: fail if no trainer came within this (0 = wait)
  double barrier_timeout_s = 60;
  int64_t chunk_bytes = int64_t{4} << 20;
  int async_max_merge = 4;            // async: gradients merged per push
  bool async_read_own_writes = true;  // async: recv waits for this trainer's pushes
  // Async, pserver: a trainer silent for barrier_timeout_s is dropped and the others go on
  // (false: the pserver fails naming it).
  bool async_drop_silent_trainers = false;
  // Monitoring.
  int metrics_port = 0;  // Prometheus /metrics HTTP port; 0 = off
  // Security: PEM file paths for mutual TLS (all three or none), and the job token every
  // request must carry (the value, or a file holding it so it stays out of `ps`; not both).
  std::string tls_cert;
  std::string tls_key;
  std::string tls_ca;
  std::string job_token;
  std::string job_token_file;
  // Multi-device trainers.
  bool prefetch_ahead = true;  // trainer: the next batch's table lookups run during this recv
  int send_early_kb = 0;       // trainer, sync: dense gradients out during backward (0: off)
  int cpu_places = 1;  // trainer: split each local batch across K CPU places (threads); the
                       // gradients are reduced in memory before send / all-reduce / optimizer
  // Collective mode: gradient compression of the all-reduce.
  std::string allreduce_compression = "none";  // none | fp16 | topk | threshold
  // collective/hybrid: all-reduce gradient buckets while backward runs (none/fp16, 1 place)
  bool allreduce_overlap = true;
  int allreduce_bucket_kb = 4096;  // the overlapped all-reduce's bucket size
  double allreduce_topk = 0.01;       // topk: fraction of the entries each trainer sends, (0, 1]
  double allreduce_threshold = 1e-3;  // threshold: send entries with |value| >= this (>= 0)
  // topk and threshold keep what a trainer did not send and add it to its next step's
  // gradients (error feedback).
  // Observability.
  double stats_interval_s = 10;  // pserver: log a stats line every N seconds; 0 = off
  // Errors in full besides their one-line cause: a failed op with every input and output.
  bool verbose = false;
  std::string trace;             // trainer, pserver: write a Chrome-trace JSON timeline here
  int64_t trace_steps = 200;     // trainer, pserver: steps the trace records (bounds its memory)
  int64_t trace_first_step = 0;  // trainer, pserver: the first traced step (skip a warm-up)
  // Checkpoints (README "Checkpoints"): trainer 0 commits <checkpoint_dir>/ckpt-<step> every
  // checkpoint_every steps (0 = only at the end) and keeps the newest checkpoint_keep; both
  // daemons restore from init_from (a ckpt-* directory, or a checkpoint_dir: its newest).
  std::string checkpoint_dir;    // trainer 0: where checkpoints go; "" = none
  int64_t checkpoint_every = 0;  // trainer 0: steps between checkpoints (0 = at the end only)
  int64_t checkpoint_keep = 2;   // trainer 0: complete checkpoints kept (>= 1)
  std::string init_from;         // pserver and trainer: restore this checkpoint at start
  // Inference bundles (README "Serving"): trainer 0 commits <export_dir>/export-<step> every
  // export_every_steps steps (0 = only at the end) and keeps the newest export_keep (with the
  // exports their delta chains need); every export_full_every-th export is a full one, the
  // others deltas. The pservers write their table shards under their own export_dir.
  std::string export_dir;           // pservers and trainer 0: "" = no export
  int64_t export_every_steps = 0;   // trainer 0: steps between exports (0 = at the end only)
  int64_t export_keep = 3;          // trainer 0: complete exports kept (>= 1)
  int64_t export_full_every = 1;    // trainer 0: a full export every N exports (1 = always)
  // Serving (pserver): load this pserver's shard of a bundle's tables and answer Prefetch only;
  // with watch_bundle, poll it every watch_bundle_interval_s for newer exports.
  std::string serve_bundle;
  bool watch_bundle = false;
  double watch_bundle_interval_s = 10;
  // Devices (trainer).
  std::string device = "cpu";  // cpu | gpu: where the trainer's ops run
  std::string devices;         // gpu: GPU ordinals, e.g. "1" ("" = 0); one for now
};

// Looks up an environment variable (nullopt when unset).
using EnvLookup = std::function<std::optional<std::string>(const std::string&)>;
// The process environment (getenv), for main()s; everything below them takes an EnvLookup.
EnvLookup ProcessEnvironment();

// One configurable setting: its flag name, environment names, and how to apply a string value.
struct SettingInfo {
  std::string flag;
  std::vector<std::string> env;  // in precedence order (TESSERA_* first)
  std::string help;              // what it does, one line
  std::string default_value;     // as a flag value ("" for an empty string or list)
};
// All settings, in a stable order (used by docs, tests and the deploy manifests' checks).
const std::vector<SettingInfo>& AllSettings();

// Sets `flag` on `config` from its string form; InvalidArgument names the flag and the value.
absl::Status SetFromString(const std::string& flag, const std::string& value,
                           ClusterConfig* config);

// For every setting not in `explicit_flags`, applies the first environment variable that is set
// (older Fluid launchers' PADDLE_PSERVERS + PADDLE_PORT, POD_IP + PADDLE_PORT and TRAINING_ROLE
// stand in for the PADDLE_* names when those are unset). Errors name the variable.
absl::Status ApplyEnvironment(const std::set<std::string>& explicit_flags, const EnvLookup& env,
                              ClusterConfig* config);

// Checks the values together (role known, trainer_id < trainers, endpoints host:port, the
// pserver's current_endpoint among pservers, ...).
absl::Status Validate(const ClusterConfig& config);

}  // namespace tessera

#endif  // TESSERA_COMMON_CONFIG_CLUSTER_CONFIG_H_
