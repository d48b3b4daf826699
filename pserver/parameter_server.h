// ParameterServer: the pserver's RequestHandler. Holds the parameter blocks of one pserver
// program (block 0: a listen_and_serv op; one optimize block per parameter block) in a Scope and
// applies the trainers' gradients.
//
// Sync mode, per step s (all requests carry s):
//   trainers send gradients (stored per trainer) -> SEND_BARRIER from every active trainer ->
//   all optimize blocks run in parallel (sum the trainers' gradients, scale 1/N, optimizer) ->
//   the send barriers return; gets are served (a get that arrives while optimizing waits) ->
//   FETCH_BARRIER from every active trainer -> step s+1.
// A gradient block that arrives ahead of the barrier (RequestMeta::barrier_follows false: an
// early send, or a large dense tensor's chunks) is applied as soon as every trainer's copy of
// step s is in, on the optimizer pool, and the step's optimize leaves it out
// (Applier::ApplyEarly).
// A barrier that is not complete within barrier_timeout fails for everyone with a message naming
// the missing trainer ids, and Wait() returns that error; so does silence from every trainer
// for barrier_timeout once training started (all trainers dead). Barriers are idempotent per
// trainer.
// Async mode: each complete gradient is optimized as it arrives under its block's lock; gets
// return a copy taken under that lock. Distributed tables (sparse_table ops): Prefetch looks
// rows up in this pserver's shard; their sparse gradients are merged across trainers and
// applied once per step (sync, scaled 1/N like dense gradients) or per push (async, 1/N). COMPLETE
// from a trainer removes it from the barriers; when every trainer has completed, Wait() returns OK.
// Thread-safe; RPC threads only record and dispatch, optimization runs on an internal pool.
//
// In parts: this class is the request handler and the job's state (admission, the step protocol
// in SyncBarrier, failure, the watchdog, the job handshake, checkpoint coordination, stats). A
// GradientInbox (pserver/gradient_inbox.h) checks gradient messages and gives them receive
// buffers; an Applier (pserver/applier.h) holds the optimize blocks and tables, applies
// gradients and serves reads. Each has its own unit tests.
#ifndef TESSERA_PSERVER_PARAMETER_SERVER_H_
#define TESSERA_PSERVER_PARAMETER_SERVER_H_

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/base/thread_pool.h"
#include "common/framework/executor.h"
#include "common/io/file_system.h"
#include "common/metrics/trace.h"
#include "common/rpc/server.h"
#include "pserver/applier.h"
#include "pserver/eval_reducer.h"
#include "pserver/gradient_inbox.h"
#include "pserver/sparse_table.h"
#include "pserver/sync_barrier.h"
#include "transpiler/distribute_transpiler.h"

namespace tessera {

struct ParameterServerOptions {
  std::string job_id;
  // The job handshake: the fields this pserver's own flags and model give (cluster/job_fields.h).
  // A trainer's field that differs, or a field it lacks, fails the job naming both values; a
  // field this list lacks is compared with the first trainer's. Empty: no handshake is checked.
  JobFields job_fields;
  std::string endpoint;  // for messages
  absl::Duration barrier_timeout = absl::Seconds(60);
  // Async mode: a trainer silent for barrier_timeout (killed, or its machine gone) fails the
  // server naming it (false), or is dropped and training goes on with the others (true; the
  // server finishes when every remaining trainer completed). Sync mode always fails: its steps
  // need every trainer.
  bool async_drop_silent_trainers = false;
  // A trainer that sent a HEARTBEAT and then nothing for this long is lost (died, froze, cut
  // off): sync mode fails the job naming it; async mode fails too, or drops it with
  // async_drop_silent_trainers. Zero: heartbeats are not watched (barrier_timeout still is).
  absl::Duration heartbeat_timeout = absl::ZeroDuration();
  // A server that no trainer has reached this long after it was created fails (its trainers
  // never started, or were pointed elsewhere). Zero: it waits forever.
  absl::Duration startup_timeout = absl::ZeroDuration();
  int optimize_threads = 0;  // ApplierOptions::optimize_threads (0: hardware threads, >= 2)
  // Distributed tables (every sparse_table op of the program): lifecycle options, off at 0.
  int64_t table_admission_threshold = 0;
  int64_t table_evict_after_steps = 0;
  // Row budget of each table shard on this pserver (0 = none): new ids beyond it are refused
  // with RESOURCE_EXHAUSTED and counted; held rows are never dropped for it.
  int64_t table_max_rows = 0;
  // Internal shards (locks) of each distributed table (SparseTableOptions::num_shards). 0: the
  // smallest power of two >= 2 x the machine's hardware threads, in [4, 64]. Shards are there for
  // concurrency: more than the threads that can touch a table at once only thin out each batch's
  // per-shard runs (a CTR batch holds a few hundred ids per table) and scatter its rows.
  int table_shards = 0;
  // Checkpoints (pserver/checkpoint.h): this pserver's index among num_pservers, the
  // transpiler's parameter blocks of all pservers (the slice metadata saved with a checkpoint),
  // how table ids are sharded, and the file system (null: the local one).
  int pserver_index = 0;
  int num_pservers = 1;
  std::vector<VarBlock> param_blocks;
  std::string table_shard_method = "hash";
  io::FileSystem* fs = nullptr;
  // Where a remote Checkpoint request may write: it names a "ckpt-<step>" directory, which is
  // taken under this root (never a path of the peer's choosing). "" refuses every request.
  std::string checkpoint_dir;
  // Where a remote serving-export request (io::ExportRequestName: "export-<step>:full|delta")
  // writes this pserver's table files: <export_dir>/export-<step>. "" refuses every request.
  std::string export_dir;
  // Observability (optional): told how long each sync send/fetch barrier request waited, from
  // its arrival to its release (or failure). Runs on any thread, possibly under the server's
  // lock: it must be quick and must not call the server.
  std::function<void(BarrierKind kind, absl::Duration wait)> on_barrier_wait;
  // The --trace timeline (optional; must outlive the server): sync steps trace_first_step ..
  // trace_first_step + trace_steps - 1 as spans. Per request of a trainer (args step, trainer):
  // each send and fetch barrier from its arrival to its release ("send_barrier",
  // "fetch_barrier"), each PrefetchBatch from its arrival to its answer ("prefetch"). Per step
  // (arg step): the optimize ("optimize") and in it the tables with the next batches' lookups
  // ("tables"), answering those lookups ("answer") and the dense blocks ("blocks"). Its
  // timestamps line up with the trainers' traces (trace.h). on_traced runs (on the optimize's
  // thread, without the server's lock) once the last traced step's optimize ended.
  Tracer* tracer = nullptr;
  int64_t trace_first_step = 0;
  int64_t trace_steps = 0;
  std::function<void()> on_traced;
};

struct TableExportOptions {
  bool only_changed = false;          // rows created/updated since the previous export
  bool with_optimizer_state = false;  // to resume training (serving needs values only)
};

struct ParameterServerStats {
  int64_t steps = 0;          // completed sync steps
  int64_t sends = 0;          // SendVariable messages (chunks count separately)
  int64_t grads_applied = 0;  // gradients optimized (async: per push; sync: per block per step)
  std::map<int, int64_t> grads_received;  // complete gradients per trainer
  int64_t gets = 0;
  int64_t prefetches = 0;
  // Of `prefetches`, the lookups a sync step's optimize did right after each table's update
  // (their PrefetchBatch came, with after_update, before the optimize started).
  int64_t fused_prefetches = 0;
  // Of `fused_prefetches`, the tables' lookups done ahead of the optimize, while the trainers
  // still computed the step (only the rows the step then updated were looked up again after it).
  int64_t lookups_ahead = 0;
  // Sync: optimize blocks applied as soon as every trainer's gradient for the step was in,
  // ahead of the step's optimize (gradients that arrived ahead of the barrier: early sends,
  // chunked tensors).
  int64_t early_applies = 0;
  std::vector<int> trainers_dropped;  // async_drop_silent_trainers: silent trainers let go
  int64_t table_rows = 0;             // rows held by this pserver's table shards
  int64_t table_refused_rows = 0;     // new ids refused for the row budget
  // Table updates that took the rows their ids' lookup found (SparseTableOptions::
  // remember_lookups: one sync trainer, or async) instead of hashing the ids again.
  int64_t table_updates_reusing_lookups = 0;
  std::map<std::pair<std::string, int>, int64_t> table_shard_rows;  // (table, shard) -> rows
};

class ParameterServer : public RequestHandler {
 public:
  // `program` is a pserver program from the transpiler; its startup program must already have
  // run on `scope`. `registry` and `scope` must outlive the server.
  static absl::StatusOr<std::unique_ptr<ParameterServer>> Create(const ProgramDesc& program,
                                                                 Scope* scope,
                                                                 const OpRegistry* registry,
                                                                 ParameterServerOptions options);
  ~ParameterServer() override;

  // Blocks until every trainer has completed (OK) or the server failed (the failure).
  absl::Status Wait();
  // Fails every pending and future request with `reason` and releases Wait().
  void Fail(absl::Status reason);
  ParameterServerStats stats() const;
  // Writes every table shard of this pserver to <dir>/<table>.shard<k>.tbl (format in
  // pserver/sparse_table.h). Returns the rows written.
  absl::StatusOr<int64_t> ExportTables(const std::string& dir, const TableExportOptions& options);
  bool sync_mode() const { return sync_; }
  // Writes this pserver's part of a checkpoint into the directory `dir` (pserver/checkpoint.h).
  // Sync mode: waits for a running optimization and holds the next one until done (trainer 0
  // calls it between steps, after its fetch barrier). Async: a consistent copy per block.
  absl::Status SaveCheckpoint(const std::string& dir);
  // Loads this pserver's part of the complete checkpoint `dir` (taken with any number of
  // pservers) and moves the server to its step. Call before serving. Errors name the file or
  // variable; on error the server must not be used.
  absl::Status RestoreCheckpoint(const std::string& dir);

  absl::Status Admit(const RequestMeta& meta) override;
  // A heartbeat: the trainer is alive (watched for heartbeat_timeout from now on), which is not
  // a request for the silence checks of barrier_timeout.
  absl::Status AdmitHeartbeat(const RequestMeta& meta) override;
  absl::StatusOr<Variable*> PrepareReceive(const RequestMeta& meta,
                                           const VariableHeader& header) override;
  void HandleSend(const RequestMeta& meta, const VariableHeader& header, Variable* var,
                  DoneCallback done) override;
  void HandleGet(const RequestMeta& meta, const std::string& name, GetDone done) override;
  void HandlePrefetch(const RequestMeta& meta, const std::string& table, std::vector<int64_t> ids,
                      PrefetchDone done) override;
  // The tables side by side on the optimizer pool (and the calling thread). Sync, with
  // after_update for the current step before its optimize started: the optimize looks each
  // table up as soon as it applied it (its rows still in cache), and answers once every table
  // is applied (before the dense blocks).
  void HandlePrefetchBatch(const RequestMeta& meta, std::vector<PrefetchQuery> queries,
                           bool after_update, PrefetchBatchDone done) override;
  void HandleBarrier(const RequestMeta& meta, BarrierKind kind, DoneCallback done) override;
  // Sync mode: `done` runs (on the optimizer pool) once step meta.step is applied, at once if
  // it is already; async mode: at once.
  void AwaitUpdate(const RequestMeta& meta, DoneCallback done) override;
  bool StepEndsEpoch(int64_t step) override;
  // Fails the job, passing on the trainer's reason (so that a pserver that lost a peer, or a
  // trainer refused elsewhere, is named in every process's log).
  void HandleAbort(const RequestMeta& meta, const std::string& reason, DoneCallback done) override;
  void HandleRegister(const RequestMeta& meta, const JobFields& fields, uint64_t nonce,
                      DoneCallback done) override;
  // `dir` is a "ckpt-<step>" name, whose shard goes to <options.checkpoint_dir>/<dir>, or a
  // serving export's io::ExportRequestName, whose table files go to
  // <options.export_dir>/export-<step> (pserver/bundle_tables.h).
  void HandleCheckpoint(const RequestMeta& meta, const std::string& dir,
                        DoneCallback done) override;

 private:
  struct PendingGet {
    std::string name;
    GetDone done;
  };
  // A PrefetchBatch waiting for the step's update; `rows` filled by the optimize (looked_up)
  // or after it. Answered once (`answered`): by the optimize as soon as its tables are applied
  // (before the dense blocks), else when the update is awaited (its failure, or a late batch).
  struct FusedLookup {
    // Per query, who looks it up first: nobody yet, the look-ahead (LookUpAhead: running, or
    // done; the optimize then looks it up again after the table's update, which only copies
    // the rows: SparseTableOptions::remember_lookups), or the optimize (right after the table's
    // update).
    enum Ahead : int { kNobody, kAheadRunning, kAheadDone, kOptimize };
    int trainer = 0;
    std::vector<PrefetchQuery> queries;
    std::vector<absl::StatusOr<Tensor>> rows;
    std::vector<char> filled;  // per query: looked up by the optimize
    std::unique_ptr<std::atomic<int>[]> ahead;            // per query: an Ahead (null: none ahead)
    std::atomic<bool> optimizing{false};                  // the look-ahead stops taking queries
    bool looked_up = false;
    PrefetchBatchDone done;
    std::atomic<bool> answered{false};
  };

  ParameterServer(const ProgramDesc& program, Scope* scope, const OpRegistry* registry,
                  ParameterServerOptions options);
  absl::Status Init();
  void HandleExport(int64_t step, bool delta, DoneCallback done);
  // Runs fn(step) with no optimization running and the next one held until it returns (a
  // consistent state at a step boundary, for checkpoints and exports).
  absl::Status AtStepBoundary(const std::function<absl::Status(int64_t step)>& fn);
  void RunSyncOptimize();
  // Sync, for lookups that came in their own request (not riding on a send): looks up, before
  // the step's optimize, the queries of `f` (last first) until the optimize starts, so that
  // their ids are hashed, their rows found and new rows made off the step's path. The optimize
  // then looks each up again after its table's update, which only copies the rows
  // (SparseTableOptions::remember_lookups). Runs while the trainer computes, on the optimizer
  // pool's threads (with one trainer, its compute leaves the other cores free).
  void LookUpAhead(FusedLookup& f) ABSL_LOCKS_EXCLUDED(mu_);
  // Looks query i of f up into f.rows[i] (a tensor there keeps its buffer; an error replaces it).
  void LookUpInto(FusedLookup& f, size_t i);
  // A look-ahead's rows: the last answer's tensors of its trainer where the reply released them
  // (spare_rows_), and after the answer the tensors it sent.
  void TakeSpareRows(FusedLookup& f) ABSL_LOCKS_EXCLUDED(spare_mu_);
  void KeepSpareRows(const FusedLookup& f) ABSL_LOCKS_EXCLUDED(spare_mu_);
  // The optimize's claim on query i of `f` (true) or, when the look-ahead took it, false once
  // that lookup finished (it waits for one table's lookup at most).
  static bool ClaimForOptimize(FusedLookup& f, size_t i);
  // Whether sync step `step` is on the trace (options_.tracer).
  bool Traced(int64_t step) const;
  // `done`, recording span `name` of `meta`'s step and trainer from now until it runs.
  template <typename Done>
  Done TraceUntil(const char* name, const RequestMeta& meta, Done done) const;
  // Sync: whether gradient `h` of `meta`, just complete, is one to apply before the step's
  // barrier (it arrived ahead of the barrier, every trainer is active and has its copy in, the
  // step's optimize has not started, no checkpoint runs); counts it as running if so.
  bool StartEarlyApply(const RequestMeta& meta, const VariableHeader& h)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void EarlyApply(const std::string& grad, int64_t step) ABSL_LOCKS_EXCLUDED(mu_);
  void ServeGet(const std::string& name, const GetDone& done);
  void AsyncApply(int trainer, const std::string& grad, DoneCallback done);
  // Acts on what a barrier event asks (starts the optimize, counts a step, hands the waiters
  // for an update to the optimizer pool) and returns the replies, which the caller answers
  // after unlocking mu_.
  // With `optimize_here`, a step's optimize is not scheduled but left to the caller (set true),
  // to run on its own thread once it unlocked mu_ and answered the replies.
  std::vector<SyncBarrier::Reply> Act(SyncBarrier::Actions actions, bool* optimize_here = nullptr)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void Watchdog();
  // Async: fails naming the trainers silent for barrier_timeout, or drops them (the option).
  // Both modes: the same for trainers whose heartbeats stopped for heartbeat_timeout.
  absl::Status CheckSilentTrainers() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The request's job id is this server's and its trainer id one of the job's.
  absl::Status CheckJobAndTrainer(const RequestMeta& meta) const;

  const ProgramDesc program_;
  Scope* scope_;
  const OpRegistry* registry_;
  ParameterServerOptions options_;
  int num_trainers_ = 1;
  bool sync_ = true;
  // The request path's two halves: where gradients land, and what applies them.
  std::unique_ptr<GradientInbox> inbox_;
  std::unique_ptr<Applier> applier_;
  // Distributed evaluation: the trainers' partials summed (pserver/eval_reducer.h).
  std::unique_ptr<EvalReducer> eval_;

  mutable absl::Mutex mu_;
  // The step protocol: the step, the active trainers, both barriers, the optimize in progress
  // (its trainers are the active ones in async mode too, where its barriers are not used).
  SyncBarrier barrier_ ABSL_GUARDED_BY(mu_){0};
  std::vector<PendingGet> pending_gets_ ABSL_GUARDED_BY(mu_);
  // Lookups for the next optimize to do as it applies (their waits are in barrier_).
  std::vector<std::shared_ptr<FusedLookup>> fused_lookups_ ABSL_GUARDED_BY(mu_);
  // Per trainer and query: the tensor of the last look-ahead answer (a table name and the rows
  // sent). Once the reply released it (no longer buffer_shared), the next look-ahead of that
  // table looks up into it: its rows are neither allocated nor freed per step (the reply is
  // freed on a gRPC thread, and the process's one malloc arena is shared by all threads:
  // common/base/malloc_tuning.h).
  absl::Mutex spare_mu_;
  std::vector<std::vector<std::pair<std::string, Tensor>>> spare_rows_ ABSL_GUARDED_BY(spare_mu_);
  // Sync lookups are done ahead of the optimize (LookUpAhead) when no row lifecycle option can
  // make a second lookup of an id count (admission, eviction, a row budget).
  bool lookups_ahead_ = false;
  absl::Status failure_ ABSL_GUARDED_BY(mu_);
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool checkpointing_ ABSL_GUARDED_BY(mu_) = false;  // AtStepBoundary running: no optimize
  // Sync early applies and look-ahead lookups (which may create rows): running or scheduled now
  // (a step boundary waits for none), and the step of the last early apply (a checkpoint of a
  // step with blocks applied early would be half a step).
  int early_running_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t early_step_ ABSL_GUARDED_BY(mu_) = -1;
  ParameterServerStats stats_ ABSL_GUARDED_BY(mu_);
  // Job handshake: each registered trainer's process nonce, and the first trainer's value of
  // each field this pserver does not know itself (with that trainer's id).
  std::map<int, uint64_t> registered_ ABSL_GUARDED_BY(mu_);
  std::map<std::string, std::pair<std::string, int>> trainer_fields_ ABSL_GUARDED_BY(mu_);
  // Last request from any trainer (InfinitePast before the first): when every active trainer
  // has been silent for barrier_timeout, they are presumed dead and the server fails.
  absl::Time last_request_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  // Per trainer: its last request (async silence detection); InfinitePast until its first.
  std::vector<absl::Time> last_seen_ ABSL_GUARDED_BY(mu_);
  // Per trainer: its last HEARTBEAT (InfinitePast until its first; from then on it is watched
  // for heartbeat_timeout).
  std::vector<absl::Time> last_beat_ ABSL_GUARDED_BY(mu_);
  absl::Time first_request_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
  const absl::Time created_ = absl::Now();  // for options_.startup_timeout

  std::unique_ptr<ThreadPool> checkpoint_pool_;  // checkpoints and exports, off the RPC threads
  std::thread watchdog_;
};

}  // namespace tessera

#endif  // TESSERA_PSERVER_PARAMETER_SERVER_H_
