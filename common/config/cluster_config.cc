#include "common/config/cluster_config.h"

#include <cstdlib>
#include <limits>
#include <map>
#include <type_traits>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/data/formats.h"
#include "absl/strings/strip.h"

namespace tessera {

namespace {

using Setter = std::function<absl::Status(const std::string&, ClusterConfig*)>;
using Getter = std::function<std::string(const ClusterConfig&)>;

// How a setting is applied from its string form, and read back (for --help's defaults).
struct Field {
  Field(Setter s, Getter g) : set(std::move(s)), get(std::move(g)) {}
  Setter set;
  Getter get;
};

template <typename T>
Getter Get(T ClusterConfig::*field) {
  return [field](const ClusterConfig& c) {
    if constexpr (std::is_same_v<T, std::string>) {
      return c.*field;
    } else if constexpr (std::is_same_v<T, std::vector<std::string>>) {
      return absl::StrJoin(c.*field, ",");
    } else if constexpr (std::is_same_v<T, bool>) {
      return std::string(c.*field ? "true" : "false");
    } else {
      return absl::StrCat(c.*field);
    }
  };
}

absl::Status Bad(const std::string& flag, const std::string& value, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat("--", flag, "='", value, "': ", why));
}

Field Str(std::string ClusterConfig::*field) {
  return Field(
      [field](const std::string& v, ClusterConfig* c) {
        c->*field = v;
        return absl::OkStatus();
      },
      Get(field));
}

Field List(std::vector<std::string> ClusterConfig::*field) {
  return Field(
      [field](const std::string& v, ClusterConfig* c) {
        c->*field = absl::StrSplit(v, ',', absl::SkipWhitespace());
        for (auto& s : c->*field) s = std::string(absl::StripAsciiWhitespace(s));
        return absl::OkStatus();
      },
      Get(field));
}

// An integer in [min, max]; max defaults to the field type's largest value, so that an int
// field never keeps only the low bits of what was given (4294967297 trainers would become 1).
template <typename T>
constexpr int64_t LargestInt64Of() {
  return static_cast<uint64_t>(std::numeric_limits<T>::max()) >
                 static_cast<uint64_t>(std::numeric_limits<int64_t>::max())
             ? std::numeric_limits<int64_t>::max()
             : static_cast<int64_t>(std::numeric_limits<T>::max());
}

template <typename T>
Field Int(T ClusterConfig::*field, const std::string& flag, int64_t min,
          int64_t max = LargestInt64Of<T>()) {
  return Field(
      [field, flag, min, max](const std::string& v, ClusterConfig* c) {
        int64_t x;
        if (!absl::SimpleAtoi(v, &x)) return Bad(flag, v, "not an integer");
        if (x < min) return Bad(flag, v, absl::StrCat("must be >= ", min));
        if (x > max) return Bad(flag, v, absl::StrCat("must be <= ", max));
        c->*field = static_cast<T>(x);
        return absl::OkStatus();
      },
      Get(field));
}

template <typename T>
Field Real(T ClusterConfig::*field, const std::string& flag, double min) {
  return Field(
      [field, flag, min](const std::string& v, ClusterConfig* c) {
        double x;
        if (!absl::SimpleAtod(v, &x)) return Bad(flag, v, "not a number");
        if (!(x >= min)) return Bad(flag, v, absl::StrCat("must be >= ", min));
        c->*field = static_cast<T>(x);
        return absl::OkStatus();
      },
      Get(field));
}

Field Bool(bool ClusterConfig::*field, const std::string& flag) {
  return Field(
      [field, flag](const std::string& v, ClusterConfig* c) {
        bool x;
        if (!absl::SimpleAtob(v, &x)) return Bad(flag, v, "not a boolean (true/false/1/0)");
        c->*field = x;
        return absl::OkStatus();
      },
      Get(field));
}

struct Setting {
  SettingInfo info;
  Field field;
};

const std::vector<Setting>& Table() {
  static const auto* table = new std::vector<Setting>{
      {{"role",
        {"TESSERA_ROLE", "PADDLE_TRAINING_ROLE"},
        "pserver or trainer (each binary defaults to its own role; also TRAINING_ROLE)"},
       Field(
           [](const std::string& v, ClusterConfig* c) {
             c->role = absl::AsciiStrToLower(v);  // PADDLE_TRAINING_ROLE says PSERVER / TRAINER
             return absl::OkStatus();
           },
           Get(&ClusterConfig::role))},
      {{"pservers",
        {"TESSERA_PSERVERS", "PADDLE_PSERVERS_IP_PORT_LIST"},
        "the pserver endpoints, host:port,host:port (the same list, in the same order, for every "
        "process; also PADDLE_PSERVERS=host,host with PADDLE_PORT)"},
       List(&ClusterConfig::pservers)},
      {{"trainers",
        {"TESSERA_TRAINERS", "PADDLE_TRAINERS_NUM"},
        "number of trainer processes in the job"},
       Int(&ClusterConfig::trainers, "trainers", 1)},
      {{"trainer_id",
        {"TESSERA_TRAINER_ID", "PADDLE_TRAINER_ID"},
        "this trainer's index, 0 .. trainers-1"},
       Int(&ClusterConfig::trainer_id, "trainer_id", 0)},
      {{"current_endpoint",
        {"TESSERA_CURRENT_ENDPOINT", "PADDLE_CURRENT_ENDPOINT"},
        "this pserver's own host:port (one of --pservers); it listens only there (also POD_IP "
        "with PADDLE_PORT)"},
       Str(&ClusterConfig::current_endpoint)},
      {{"trainer_endpoints",
        {"TESSERA_TRAINER_ENDPOINTS", "PADDLE_TRAINER_ENDPOINTS"},
        "collective and hybrid modes: host:port of every trainer; trainer 0 hosts the "
        "rendezvous"},
       List(&ClusterConfig::trainer_endpoints)},
      {{"mode",
        {"TESSERA_MODE"},
        "pserver (parameter servers), collective (all-reduce among trainers, no pservers) or "
        "hybrid (distributed tables on the pservers, the other gradients all-reduced among the "
        "trainers; sync only)"},
       Str(&ClusterConfig::mode)},
      {{"job_id", {"TESSERA_JOB_ID"}, "name of the job; requests of another job are refused"},
       Str(&ClusterConfig::job_id)},
      {{"sync_mode",
        {"TESSERA_SYNC_MODE"},
        "true: barriered sync steps (== one machine); false: async updates as they arrive"},
       Bool(&ClusterConfig::sync_mode, "sync_mode")},
      {{"split_method",
        {"TESSERA_SPLIT_METHOD"},
        "how parameter blocks are placed on pservers: round_robin or hash_name"},
       Str(&ClusterConfig::split_method)},
      {{"slice_var_up",
        {"TESSERA_SLICE_VAR_UP"},
        "slice large parameters into blocks spread over the pservers"},
       Bool(&ClusterConfig::slice_var_up, "slice_var_up")},
      {{"min_block_size",
        {"TESSERA_MIN_BLOCK_SIZE"},
        "smallest slice, in elements, when slicing parameters"},
       Int(&ClusterConfig::min_block_size, "min_block_size", 1)},
      {{"example",
        {"TESSERA_EXAMPLE"},
        "built-in example, ctr, mlp_regression, fashion_mnist_mlp or lenet: its model (unless "
        "--model) and its data (unless --train_data): synthetic for ctr and mlp_regression, "
        "Debian's Fashion-MNIST files for the image models"},
       Str(&ClusterConfig::example)},
      {{"model",
        {"TESSERA_MODEL"},
        "model file to train (text proto, proto/model.proto; written by python/tessera or "
        "tessera_program --model_out); \"\" = the built-in --example's"},
       Str(&ClusterConfig::model)},
      {{"program",
        {"TESSERA_PROGRAM"},
        "a text-proto main program to run instead of the example's (needs --startup_program)"},
       Str(&ClusterConfig::program)},
      {{"startup_program",
        {"TESSERA_STARTUP_PROGRAM"},
        "the text-proto startup program that goes with --program"},
       Str(&ClusterConfig::startup_program)},
      {{"train_data",
        {"TESSERA_TRAIN_DATA"},
        "Criteo-format training data: comma-separated files, directories and glob patterns, "
        "plain or gzip (\"\" = synthetic data)"},
       Str(&ClusterConfig::train_data)},
      {{"test_data",
        {"TESSERA_TEST_DATA"},
        "Criteo-format held-out data, as --train_data (with --train_data)"},
       Str(&ClusterConfig::test_data)},
      {{"data_format",
        {"TESSERA_DATA_FORMAT"},
        "format of --train_data / --test_data: criteo (label, 13 dense counts, 26 hex ids, "
        "tab-separated), csv (a header line; columns by name, see --csv_columns), libsvm "
        "(label index:value ...), multislot (Fluid's: per slot a count, then its values) or idx "
        "(images and labels in IDX files, e.g. MNIST: give <prefix> of "
        "<prefix>-images-idx3-ubyte[.gz]); every format but criteo holds exactly the model's "
        "feeds"},
       Str(&ClusterConfig::data_format)},
      {{"float_dense",
        {"TESSERA_FLOAT_DENSE"},
        "criteo data: the dense fields are decimal floats taken as they are (\"260.0\") instead of "
        "integer counts stored as log(1 + count)"},
       Bool(&ClusterConfig::float_dense, "float_dense")},
      {{"csv_columns",
        {"TESSERA_CSV_COLUMNS"},
        "csv data: the header columns of each feed, as label=COL;dense=COL,...;slots=COL,...;"
        "multi=COL,... (multi-hot ids separated by '|'); a part left out takes the Criteo names "
        "(label, I1.., C1.., M1..)"},
       Str(&ClusterConfig::csv_columns)},
      {{"reader",
        {"TESSERA_READER"},
        "how a trainer reads --train_data: memory (every trainer loads all of it and trains on "
        "its share of each global batch; sync == single machine) or stream (each trainer reads "
        "only its own files, or byte ranges / line strides of them when there are fewer files "
        "than trainers, parsed ahead on a background thread; memory stays bounded by "
        "--shuffle_buffer and --reader_queue; in sync mode every trainer ends the epoch when the "
        "first runs out of data)"},
       Str(&ClusterConfig::reader)},
      {{"shuffle_buffer",
        {"TESSERA_SHUFFLE_BUFFER"},
        "--reader=stream: examples of the shuffle buffer (each step draws from it at random, "
        "seeded by --seed and the epoch); 0 = in file order (files are still reshuffled per "
        "epoch)"},
       Int(&ClusterConfig::shuffle_buffer, "shuffle_buffer", 0)},
      {{"reader_queue",
        {"TESSERA_READER_QUEUE"},
        "--reader=stream: parsed examples the background reader may hold ahead of training"},
       Int(&ClusterConfig::reader_queue, "reader_queue", 1)},
      {{"max_bad_lines",
        {"TESSERA_MAX_BAD_LINES"},
        "malformed data lines skipped (counted and logged) before the trainer stops; 0 = stop at "
        "the first, naming file:line:field"},
       Int(&ClusterConfig::max_bad_lines, "max_bad_lines", 0)},
      {{"max_line_bytes",
        {"TESSERA_MAX_LINE_BYTES"},
        "longest line a data file may have; a longer one stops the trainer naming file:line"},
       Int(&ClusterConfig::max_line_bytes, "max_line_bytes", 1)},
      {{"num_examples",
        {"TESSERA_NUM_EXAMPLES"},
        "synthetic training examples (fashion_mnist_mlp, lenet: the first N training images)"},
       Int(&ClusterConfig::num_examples, "num_examples", 1)},
      {{"num_test_examples",
        {"TESSERA_NUM_TEST_EXAMPLES"},
        "synthetic held-out examples (fashion_mnist_mlp, lenet: the first N test images)"},
       Int(&ClusterConfig::num_test_examples, "num_test_examples", 0)},
      {{"vocab_per_slot", {"TESSERA_VOCAB_PER_SLOT"}, "synthetic CTR data: distinct ids per slot"},
       Int(&ClusterConfig::vocab_per_slot, "vocab_per_slot", 1)},
      {{"distributed_tables",
        {"TESSERA_DISTRIBUTED_TABLES"},
        "built-in ctr: embedding tables live only on the pservers (any int64 id); a model file "
        "sets is_distributed per table"},
       Bool(&ClusterConfig::distributed_tables, "distributed_tables")},
      {{"table_shard_method",
        {"TESSERA_TABLE_SHARD_METHOD"},
        "distributed tables: ids go to pservers by hash or mod of the id"},
       Str(&ClusterConfig::table_shard_method)},
      {{"table_placement",
        {"TESSERA_TABLE_PLACEMENT"},
        "distributed tables: row_wise (each split by id over all pservers; a table may outgrow "
        "one machine) or table_wise (each whole on one pserver, tables sharing ids together: "
        "fewer tables per pserver and step, for many moderate tables)"},
       Str(&ClusterConfig::table_placement)},
      {{"fuse_tables",
        {"TESSERA_FUSE_TABLES"},
        "distributed tables looked up with the same ids (a slot's deep and wide tables) are held "
        "as one pserver table: one row lookup and update for all of them; checkpoints and "
        "exports keep one file per table"},
       Bool(&ClusterConfig::fuse_tables, "fuse_tables")},
      {{"table_admission_threshold",
        {"TESSERA_TABLE_ADMISSION_THRESHOLD"},
        "pserver: create a table row at the K-th sighting of its id (0 = at once)"},
       Int(&ClusterConfig::table_admission_threshold, "table_admission_threshold", 0)},
      {{"table_evict_after_steps",
        {"TESSERA_TABLE_EVICT_AFTER_STEPS"},
        "pserver: drop table rows unseen for T steps (0 = never)"},
       Int(&ClusterConfig::table_evict_after_steps, "table_evict_after_steps", 0)},
      {{"table_max_rows",
        {"TESSERA_TABLE_MAX_ROWS"},
        "pserver: row budget of each table shard (with --table_placement=table_wise, of each "
        "whole table); new ids beyond it are refused, held rows kept (0 = no limit)"},
       Int(&ClusterConfig::table_max_rows, "table_max_rows", 0)},
      {{"table_export_dir",
        {"TESSERA_TABLE_EXPORT_DIR"},
        "pserver: export its table shards here at the end (\"\" = no export)"},
       Str(&ClusterConfig::table_export_dir)},
      {{"batch_size", {"TESSERA_BATCH_SIZE"}, "global batch size, split across the trainers"},
       Int(&ClusterConfig::batch_size, "batch_size", 1)},
      {{"epochs", {"TESSERA_EPOCHS"}, "passes over the training data"},
       Int(&ClusterConfig::epochs, "epochs", 0)},
      {{"seed", {"TESSERA_SEED"}, "data shuffling and synthetic data seed"},
       Int(&ClusterConfig::seed, "seed", 0)},
      {{"learning_rate",
        {"TESSERA_LEARNING_RATE"},
        "optimizer learning rate (0 = the model's default)"},
       Real(&ClusterConfig::learning_rate, "learning_rate", 0.0)},
      {{"log_every_steps",
        {"TESSERA_LOG_EVERY_STEPS"},
        "trainer 0 logs its loss every N steps (0 = never)"},
       Int(&ClusterConfig::log_every_steps, "log_every_steps", 0)},
      {{"eval_every_steps",
        {"TESSERA_EVAL_EVERY_STEPS"},
        "trainer: evaluate on the held-out data every N steps, every trainer its share, trainer 0 "
        "reports the job's result (0 = only at the end)"},
       Int(&ClusterConfig::eval_every_steps, "eval_every_steps", 0)},
      {{"eval_every_epoch",
        {"TESSERA_EVAL_EVERY_EPOCH"},
        "trainer: also evaluate on the held-out data after every epoch"},
       Bool(&ClusterConfig::eval_every_epoch, "eval_every_epoch")},
      {{"dump_params",
        {"TESSERA_DUMP_PARAMS"},
        "trainer: write the final parameters to this file (\"\" = no dump)"},
       Str(&ClusterConfig::dump_params)},
      {{"memory_optimize",
        {"TESSERA_MEMORY_OPTIMIZE"},
        "trainer: reuse the buffers of temporaries (gradients kept)"},
       Bool(&ClusterConfig::memory_optimize, "memory_optimize")},
      {{"rpc_deadline_s", {"TESSERA_RPC_DEADLINE_S"}, "deadline of one RPC, in seconds"},
       Real(&ClusterConfig::rpc_deadline_s, "rpc_deadline_s", 0.001)},
      {{"connect_timeout_s",
        {"TESSERA_CONNECT_TIMEOUT_S"},
        "trainer: seconds to wait for each pserver at start; then fail naming the cause (DNS, "
        "refused, TLS)"},
       Real(&ClusterConfig::connect_timeout_s, "connect_timeout_s", 0.001)},
      {{"keepalive_s",
        {"TESSERA_KEEPALIVE_S"},
        "trainer: ping each pserver connection every this many seconds and drop it when a ping "
        "goes unanswered as long, so a frozen or unreachable pserver ends the trainers within a "
        "few times this, not at --rpc_deadline_s (0 = no pings)"},
       Real(&ClusterConfig::keepalive_s, "keepalive_s", 0.0)},
      {{"heartbeat_s",
        {"TESSERA_HEARTBEAT_S"},
        "trainers send every pserver a heartbeat this often; a trainer silent for 5 times this "
        "(killed, frozen, cut off) fails the job naming it, or with "
        "--async_drop_silent_trainers is dropped (0 = no heartbeats; must agree job-wide)"},
       Real(&ClusterConfig::heartbeat_s, "heartbeat_s", 0.0)},
      {{"startup_timeout_s",
        {"TESSERA_STARTUP_TIMEOUT_S"},
        "pserver: exit with an error if no trainer reached it within this many seconds (0 = wait "
        "forever)"},
       Real(&ClusterConfig::startup_timeout_s, "startup_timeout_s", 0.0)},
      {{"barrier_timeout_s",
        {"TESSERA_BARRIER_TIMEOUT_S"},
        "seconds a sync barrier (or an async pserver) waits for a silent trainer before failing"},
       Real(&ClusterConfig::barrier_timeout_s, "barrier_timeout_s", 0.001)},
      {{"chunk_bytes",
        {"TESSERA_CHUNK_BYTES"},
        "large tensors travel in chunks of this many bytes (0 = whole)"},
       Int(&ClusterConfig::chunk_bytes, "chunk_bytes", 0)},
      {{"async_max_merge",
        {"TESSERA_ASYNC_MAX_MERGE"},
        "async without read-own-writes: gradients of a variable merged into one push at most"},
       Int(&ClusterConfig::async_max_merge, "async_max_merge", 1)},
      {{"async_read_own_writes",
        {"TESSERA_ASYNC_READ_OWN_WRITES"},
        "async: a trainer's recv and lookups wait until its own push is applied (each step's "
        "push carries them)"},
       Bool(&ClusterConfig::async_read_own_writes, "async_read_own_writes")},
      {{"async_drop_silent_trainers",
        {"TESSERA_ASYNC_DROP_SILENT_TRAINERS"},
        "async pserver: drop a trainer silent for --barrier_timeout_s and go on (false: fail)"},
       Bool(&ClusterConfig::async_drop_silent_trainers, "async_drop_silent_trainers")},
      {{"metrics_port",
        {"TESSERA_METRICS_PORT"},
        "serve Prometheus /metrics on this port (0 = off)"},
       Int(&ClusterConfig::metrics_port, "metrics_port", 0, 65535)},
      {{"prefetch_ahead",
        {"TESSERA_PREFETCH_AHEAD"},
        "trainer, pserver mode: feed the next batch and look up its table rows while this "
        "step's recv runs (double buffering; a sync job trains exactly as without it; off "
        "with --table_admission_threshold)"},
       Bool(&ClusterConfig::prefetch_ahead, "prefetch_ahead")},
      {{"send_early_kb",
        {"TESSERA_SEND_EARLY_KB"},
        "trainer, sync pserver mode, one CPU place: once backward has completed this many KiB "
        "of dense gradients, they go to their pservers while the rest of backward runs, and "
        "the pservers apply them once every trainer's copy is in (one more request per "
        "pserver and step; the step's send carries the rest; the same training). 0 = off: "
        "every gradient goes in the step's one request after backward"},
       Int(&ClusterConfig::send_early_kb, "send_early_kb", 0, 1 << 21)},
      {{"allreduce_overlap",
        {"TESSERA_ALLREDUCE_OVERLAP"},
        "trainer, collective and hybrid modes: all-reduce the gradients in buckets of about "
        "--allreduce_bucket_kb as backward produces them, overlapping communication with the "
        "rest of backward (DDP's bucketed reducer; the same mean). Applies with "
        "--allreduce_compression=none or fp16 and one place per trainer; otherwise one "
        "all-reduce after backward"},
       Bool(&ClusterConfig::allreduce_overlap, "allreduce_overlap")},
      {{"allreduce_bucket_kb",
        {"TESSERA_ALLREDUCE_BUCKET_KB"},
        "--allreduce_overlap: a bucket of gradients is reduced once the next gradient would "
        "take it past this many KiB"},
       Int(&ClusterConfig::allreduce_bucket_kb, "allreduce_bucket_kb", 1, 1 << 20)},
      // Trainer: CPU places (threads) per trainer; deploy/launch --devices=cpu:K sets the env.
      {{"cpu_places",
        {"TESSERA_CPU_PLACES"},
        "trainer: split each local batch across K CPU threads"},
       Int(&ClusterConfig::cpu_places, "cpu_places", 1)},
      // Collective mode: all-reduce compression none | fp16 | topk | threshold.
      {{"allreduce_compression",
        {"TESSERA_ALLREDUCE_COMPRESSION"},
        "collective mode: none, fp16, topk or threshold"},
       Field(
           [](const std::string& v, ClusterConfig* c) {
             if (v != "none" && v != "fp16" && v != "topk" && v != "threshold") {
               return Bad("allreduce_compression", v, "must be none, fp16, topk or threshold");
             }
             c->allreduce_compression = v;
             return absl::OkStatus();
           },
           Get(&ClusterConfig::allreduce_compression))},
      // Collective mode, topk: fraction of the gradient entries each trainer sends, in (0, 1].
      {{"allreduce_topk",
        {"TESSERA_ALLREDUCE_TOPK"},
        "collective topk: fraction of gradient entries each trainer sends, in (0, 1]"},
       Field(
           [](const std::string& v, ClusterConfig* c) {
             double x;
             if (!absl::SimpleAtod(v, &x)) return Bad("allreduce_topk", v, "not a number");
             if (!(x > 0 && x <= 1)) return Bad("allreduce_topk", v, "must be in (0, 1]");
             c->allreduce_topk = x;
             return absl::OkStatus();
           },
           Get(&ClusterConfig::allreduce_topk))},
      // Collective mode, threshold: entries with |value| >= t are sent.
      {{"allreduce_threshold",
        {"TESSERA_ALLREDUCE_THRESHOLD"},
        "collective threshold: send gradient entries with |value| >= this"},
       Real(&ClusterConfig::allreduce_threshold, "allreduce_threshold", 0.0)},
      // Security (see common/rpc/grpc/credentials.h): mutual TLS on every gRPC channel when
      // all three PEM files are given, and a shared job token checked on every request.
      {{"tls_cert",
        {"TESSERA_TLS_CERT"},
        "PEM certificate for mutual TLS (with --tls_key and --tls_ca; \"\" = plaintext)"},
       Str(&ClusterConfig::tls_cert)},
      {{"tls_key", {"TESSERA_TLS_KEY"}, "PEM private key of --tls_cert"},
       Str(&ClusterConfig::tls_key)},
      {{"tls_ca", {"TESSERA_TLS_CA"}, "PEM CA that signs every certificate of the job"},
       Str(&ClusterConfig::tls_ca)},
      {{"job_token",
        {"TESSERA_JOB_TOKEN"},
        "secret every request must carry (\"\" = none; prefer --job_token_file)"},
       Str(&ClusterConfig::job_token)},
      {{"job_token_file",
        {"TESSERA_JOB_TOKEN_FILE"},
        "file whose first line is the job token (printable ASCII)"},
       Str(&ClusterConfig::job_token_file)},
      // Observability: the pserver's per-interval stats line (seconds; 0 = off); the trainer's
      // Chrome-trace timeline file (written at exit), how many steps it records, from which.
      {{"verbose",
        {"TESSERA_VERBOSE"},
        "on an error, also log the failed op in full (every input and output) after the "
        "one-line cause"},
       Bool(&ClusterConfig::verbose, "verbose")},
      {{"stats_interval_s",
        {"TESSERA_STATS_INTERVAL_S"},
        "pserver: log a stats line every N seconds (0 = off)"},
       Real(&ClusterConfig::stats_interval_s, "stats_interval_s", 0.0)},
      {{"trace",
        {"TESSERA_TRACE"},
        "trainer, pserver: write a Chrome-trace JSON timeline here at exit (\"\" = none): a "
        "trainer's steps and their phases; a sync pserver's barriers, prefetches and optimizes "
        "per step (process 1000 + its index), on the same clock"},
       Str(&ClusterConfig::trace)},
      {{"trace_steps", {"TESSERA_TRACE_STEPS"}, "trainer, pserver: steps the trace records"},
       Int(&ClusterConfig::trace_steps, "trace_steps", 1)},
      {{"trace_first_step", {"TESSERA_TRACE_FIRST_STEP"}, "trainer, pserver: first traced step"},
       Int(&ClusterConfig::trace_first_step, "trace_first_step", 0)},
      // Checkpoints: where trainer 0 writes them, every how many steps (0 = at the end only),
      // how many complete ones to keep; a checkpoint (or checkpoint dir) both daemons restore.
      {{"checkpoint_dir",
        {"TESSERA_CHECKPOINT_DIR"},
        "pservers and trainer 0: checkpoints go under this directory (\"\" = none; pservers refuse "
        "Checkpoint requests without it)"},
       Str(&ClusterConfig::checkpoint_dir)},
      {{"checkpoint_every",
        {"TESSERA_CHECKPOINT_EVERY"},
        "trainer 0: steps between checkpoints (0 = only at the end)"},
       Int(&ClusterConfig::checkpoint_every, "checkpoint_every", 0)},
      {{"checkpoint_keep", {"TESSERA_CHECKPOINT_KEEP"}, "trainer 0: complete checkpoints kept"},
       Int(&ClusterConfig::checkpoint_keep, "checkpoint_keep", 1)},
      {{"init_from",
        {"TESSERA_INIT_FROM"},
        "restore this checkpoint (a ckpt-* directory or a checkpoint dir: its newest) at start"},
       Str(&ClusterConfig::init_from)},
      // Inference bundles and serving (README "Serving").
      {{"export_dir",
        {"TESSERA_EXPORT_DIR"},
        "pservers and trainer 0: inference bundles go under this directory as export-<step> "
        "(\"\" = none; pservers refuse export requests without it)"},
       Str(&ClusterConfig::export_dir)},
      {{"export_every_steps",
        {"TESSERA_EXPORT_EVERY_STEPS"},
        "trainer 0: steps between inference bundle exports (0 = only at the end)"},
       Int(&ClusterConfig::export_every_steps, "export_every_steps", 0)},
      {{"export_keep",
        {"TESSERA_EXPORT_KEEP"},
        "trainer 0: complete exports kept, besides the exports their delta chains need"},
       Int(&ClusterConfig::export_keep, "export_keep", 1)},
      {{"export_full_every",
        {"TESSERA_EXPORT_FULL_EVERY"},
        "trainer 0: every N-th export holds every table row, the others only the rows changed "
        "and evicted since the previous export (1 = every export full)"},
       Int(&ClusterConfig::export_full_every, "export_full_every", 1)},
      {{"serve_bundle",
        {"TESSERA_SERVE_BUNDLE"},
        "pserver: serve this bundle's tables read-only (an export-* directory, or an export dir: "
        "its newest), answering Prefetch only (\"\" = train)"},
       Str(&ClusterConfig::serve_bundle)},
      {{"watch_bundle",
        {"TESSERA_WATCH_BUNDLE"},
        "pserver, --serve_bundle: pick up newer exports of the bundle's directory without a "
        "restart"},
       Bool(&ClusterConfig::watch_bundle, "watch_bundle")},
      {{"watch_bundle_interval_s",
        {"TESSERA_WATCH_BUNDLE_INTERVAL_S"},
        "pserver, --watch_bundle: seconds between looks for a newer export"},
       Real(&ClusterConfig::watch_bundle_interval_s, "watch_bundle_interval_s", 0.01)},
      // Trainer: where its ops run, cpu | gpu (GPU kernels need a --config=cuda build).
      {{"device",
        {"TESSERA_DEVICE"},
        "trainer: where ops run, cpu or gpu (gpu needs a --config=cuda build)"},
       Str(&ClusterConfig::device)},
      // Trainer, --device=gpu: GPU ordinals as CUDA numbers them after CUDA_VISIBLE_DEVICES
      // ("" = 0); one per trainer process for now.
      {{"devices", {"TESSERA_DEVICES"}, "trainer, --device=gpu: GPU ordinal (\"\" = 0)"},
       Str(&ClusterConfig::devices)},
  };
  return *table;
}

bool ValidEndpoint(const std::string& ep) {
  auto colon = ep.rfind(':');
  if (colon == std::string::npos || colon == 0) return false;
  int port;
  return absl::SimpleAtoi(ep.substr(colon + 1), &port) && port > 0 && port < 65536;
}

}  // namespace

EnvLookup ProcessEnvironment() {
  return [](const std::string& name) -> std::optional<std::string> {
    const char* v = std::getenv(name.c_str());
    if (v == nullptr) return std::nullopt;
    return std::string(v);
  };
}

const std::vector<SettingInfo>& AllSettings() {
  static const auto* infos = [] {
    auto* v = new std::vector<SettingInfo>;
    const ClusterConfig defaults;
    for (const auto& s : Table()) {
      v->push_back(s.info);
      v->back().default_value = s.field.get(defaults);
    }
    return v;
  }();
  return *infos;
}

absl::Status SetFromString(const std::string& flag, const std::string& value,
                           ClusterConfig* config) {
  for (const auto& s : Table()) {
    if (s.info.flag == flag) return s.field.set(value, config);
  }
  return absl::InvalidArgumentError(absl::StrCat("unknown setting --", flag));
}

namespace {

// Older Fluid launchers' variables, read where the names the table lists are unset:
// PADDLE_PSERVERS (comma-separated hosts) with PADDLE_PORT stand for PADDLE_PSERVERS_IP_PORT_LIST,
// POD_IP with PADDLE_PORT for PADDLE_CURRENT_ENDPOINT, and TRAINING_ROLE for PADDLE_TRAINING_ROLE.
EnvLookup WithFluidCompositeNames(const EnvLookup& env) {
  return [env](const std::string& name) -> std::optional<std::string> {
    std::optional<std::string> v = env(name);
    if (v.has_value()) return v;
    if (name == "PADDLE_TRAINING_ROLE") return env("TRAINING_ROLE");
    const std::optional<std::string> port = env("PADDLE_PORT");
    if (!port.has_value()) return std::nullopt;
    if (name == "PADDLE_PSERVERS_IP_PORT_LIST") {
      const std::optional<std::string> hosts = env("PADDLE_PSERVERS");
      if (!hosts.has_value()) return std::nullopt;
      std::vector<std::string> endpoints;
      for (absl::string_view host : absl::StrSplit(*hosts, ',', absl::SkipWhitespace())) {
        endpoints.push_back(absl::StrCat(absl::StripAsciiWhitespace(host), ":", *port));
      }
      return absl::StrJoin(endpoints, ",");
    }
    if (name == "PADDLE_CURRENT_ENDPOINT") {
      const std::optional<std::string> ip = env("POD_IP");
      if (!ip.has_value()) return std::nullopt;
      return absl::StrCat(*ip, ":", *port);
    }
    return std::nullopt;
  };
}

}  // namespace

absl::Status ApplyEnvironment(const std::set<std::string>& explicit_flags,
                              const EnvLookup& process_env, ClusterConfig* config) {
  const EnvLookup env = WithFluidCompositeNames(process_env);
  for (const auto& s : Table()) {
    if (explicit_flags.count(s.info.flag) > 0) continue;
    for (const auto& name : s.info.env) {
      std::optional<std::string> v = env(name);
      if (!v.has_value()) continue;
      absl::Status st = s.field.set(*v, config);
      if (!st.ok()) {
        return absl::InvalidArgumentError(
            absl::StrCat("environment ", name, "='", *v, "': ", st.message()));
      }
      break;
    }
  }
  return absl::OkStatus();
}

absl::Status Validate(const ClusterConfig& c) {
  auto bad = [](absl::string_view msg) { return absl::InvalidArgumentError(msg); };
  if (c.role != "pserver" && c.role != "trainer") {
    return bad(absl::StrCat("--role='", c.role, "' must be pserver or trainer"));
  }
  if (c.mode != "pserver" && c.mode != "collective" && c.mode != "hybrid") {
    return bad(absl::StrCat("--mode='", c.mode, "' must be pserver, collective or hybrid"));
  }
  if (c.mode == "hybrid" && !c.sync_mode) {
    return bad("--mode=hybrid trains in sync mode: its dense gradients are all-reduced every "
               "step (--sync_mode=false is for --mode=pserver)");
  }
  if (absl::StatusOr<data::DataFormat> f = data::ParseDataFormat(c.data_format); !f.ok()) {
    return bad(absl::StrCat("--data_format: ", f.status().message()));
  }
  if (absl::StatusOr<data::CsvColumns> cols = data::ParseCsvColumns(c.csv_columns); !cols.ok()) {
    return bad(absl::StrCat("--csv_columns: ", cols.status().message()));
  }
  if (c.reader != "memory" && c.reader != "stream") {
    return bad(absl::StrCat("--reader='", c.reader, "' must be memory or stream"));
  }
  if (c.reader == "stream" && c.role == "trainer" && c.train_data.empty()) {
    return bad("--reader=stream needs --train_data (synthetic data is generated in memory)");
  }
  if (c.reader == "stream" && c.mode != "pserver") {
    return bad(absl::StrCat("--reader=stream needs --mode=pserver (not supported with --mode=",
                            c.mode, " yet)"));
  }
  if (c.split_method != "round_robin" && c.split_method != "hash_name") {
    return bad(
        absl::StrCat("--split_method='", c.split_method, "' must be round_robin or hash_name"));
  }
  if (c.mode != "pserver" && c.role == "trainer" &&
      static_cast<int>(c.trainer_endpoints.size()) != c.trainers) {
    return bad(absl::StrCat("--mode=", c.mode,
                            " needs --trainer_endpoints with one host:port per trainer (",
                            c.trainers, "), got ", c.trainer_endpoints.size()));
  }
  for (const auto& ep : c.trainer_endpoints) {
    if (!ValidEndpoint(ep)) {
      return bad(absl::StrCat("--trainer_endpoints entry '", ep, "' is not host:port"));
    }
  }
  if (c.mode != "collective" && c.pservers.empty()) {
    return bad("--pservers is empty: give the pserver endpoints as host:port,host:port");
  }
  for (size_t i = 0; i < c.pservers.size(); ++i) {
    const std::string& ep = c.pservers[i];
    if (!ValidEndpoint(ep)) {
      return bad(absl::StrCat("--pservers entry '", ep, "' is not host:port"));
    }
    // One process would serve two pservers' shares, and the other pserver none.
    for (size_t j = 0; j < i; ++j) {
      if (c.pservers[j] == ep) {
        return bad(absl::StrCat("--pservers names ", ep, " twice (entries ", j, " and ", i,
                                "): each pserver needs its own endpoint"));
      }
    }
  }
  // Sub-0.1 s heartbeats or pings would take a healthy peer for a lost one at the first delay.
  for (const auto& [flag, value] :
       {std::make_pair("heartbeat_s", c.heartbeat_s), std::make_pair("keepalive_s", c.keepalive_s)}) {
    if (value != 0 && value < 0.1) {
      return bad(absl::StrCat("--", flag, "=", value, " must be 0 (off) or at least 0.1"));
    }
  }
  if (c.batch_size < c.trainers) {
    return bad(absl::StrCat("--batch_size=", c.batch_size,
                            " is smaller than --trainers=", c.trainers,
                            ": the global batch is split across the trainers, and each needs at "
                            "least one example of it"));
  }
  if (c.trainer_id >= c.trainers) {
    return bad(absl::StrCat("--trainer_id=", c.trainer_id, " must be < --trainers=", c.trainers));
  }
  if (c.role == "pserver") {
    if (!ValidEndpoint(c.current_endpoint)) {
      return bad(absl::StrCat("--current_endpoint='", c.current_endpoint,
                              "' is not host:port (the pserver's own endpoint)"));
    }
    bool found = false;
    for (const auto& ep : c.pservers) found |= ep == c.current_endpoint;
    if (!found) {
      return bad(absl::StrCat("--current_endpoint=", c.current_endpoint,
                              " is not in --pservers=", absl::StrJoin(c.pservers, ",")));
    }
  }
  if (c.table_shard_method != "hash" && c.table_shard_method != "mod") {
    return bad(
        absl::StrCat("--table_shard_method='", c.table_shard_method, "' must be hash or mod"));
  }
  if (c.table_placement != "row_wise" && c.table_placement != "table_wise") {
    return bad(
        absl::StrCat("--table_placement='", c.table_placement, "' must be row_wise or table_wise"));
  }
  if (c.example != "ctr" && c.example != "mlp_regression" && c.example != "fashion_mnist_mlp" &&
      c.example != "lenet") {
    return bad(absl::StrCat("--example='", c.example,
                            "' must be ctr, mlp_regression, fashion_mnist_mlp or lenet"));
  }
  if (c.reader == "stream" && c.data_format == "idx") {
    return bad("--reader=stream reads line formats; --data_format=idx is read into memory "
               "(--reader=memory)");
  }
  if (c.device != "cpu" && c.device != "gpu") {
    return bad(absl::StrCat("--device='", c.device, "' must be cpu or gpu"));
  }
  if (c.device == "cpu" && !c.devices.empty()) {
    return bad(absl::StrCat("--devices=", c.devices, " needs --device=gpu"));
  }
  if (!c.program.empty() && c.startup_program.empty()) {
    return bad("--program needs --startup_program too");
  }
  if (!c.tls_cert.empty() || !c.tls_key.empty() || !c.tls_ca.empty()) {
    const char* missing = c.tls_cert.empty()  ? "tls_cert"
                          : c.tls_key.empty() ? "tls_key"
                          : c.tls_ca.empty()  ? "tls_ca"
                                              : nullptr;
    if (missing != nullptr) {
      return bad(absl::StrCat("--", missing,
                              " is not set: TLS needs all of --tls_cert, "
                              "--tls_key and --tls_ca (or none of them)"));
    }
  }
  if (!c.job_token.empty() && !c.job_token_file.empty()) {
    return bad("--job_token and --job_token_file are both set: give one of them");
  }
  return absl::OkStatus();
}

}  // namespace tessera
