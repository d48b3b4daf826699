// Applier: what a pserver does with complete gradients. It holds the optimize blocks of a
// pserver program (one per parameter block, from listen_and_serv's grad_to_block_id), its
// distributed tables (every sparse_table op: a SparseTable shard each; the consecutive ops of one
// `group`, tables looked up with the same ids, one SparseTable of their columns) and its
// learning-rate schedule block (lr_decay_block_id), and applies gradients to them:
//   sync   ApplyStep: once per step, the schedule, then every table and then every optimize
//          block, each in parallel on the pool (each table concatenates the trainers' rows, in
//          trainer order, and applies them scaled 1/N, taking an optimizer step whether or not
//          its rows were touched; each block sums the trainers' gradients and scales 1/N);
//          ApplyEarly: one block of the step before its barrier (every trainer's copy is in),
//          after the step's schedule; ApplyStep then leaves that block (and the schedule) out.
//          The schedule and each block run once per step whichever comes first;
//   async  ApplyPush: one trainer's complete gradient, alone, under its block's (or table's)
//          lock; every N-th push of the first gradient advances the schedule.
// It also serves what reads parameters: Read (a get), Lookup (a prefetch), consistent copies for
// checkpoints, table exports and row counts. It knows nothing of trainers, steps' barriers or
// the wire: ParameterServer (pserver/parameter_server.h) decides when to apply.
//
// Thread-safe as ParameterServer uses it: sync ApplyStep never runs beside another ApplyStep or
// a Read (the barrier holds gets back); ApplyEarly runs beside ApplyStep (each block and the
// schedule run under their own locks, once per step) and beside Reads of other parameters (a
// block is applied early only once every trainer sent its gradient for the step, so no trainer
// still reads that block's parameter of the step before); async calls run concurrently under
// per-block locks.
#ifndef TESSERA_PSERVER_APPLIER_H_
#define TESSERA_PSERVER_APPLIER_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/framework/executor.h"
#include "common/framework/scope.h"
#include "common/base/thread_pool.h"
#include "proto/program.pb.h"
#include "pserver/checkpoint.h"
#include "pserver/sparse_table.h"

namespace tessera {

struct ApplierOptions {
  std::string endpoint;  // for messages
  // Threads of the optimizer pool, which applies a sync step's blocks and tables and looks up
  // the next batches' rows side by side. 0: the machine's hardware threads, at least 2.
  int optimize_threads = 0;
  // Distributed tables (SparseTableOptions): lifecycle, row budget and internal shards (0: the
  // smallest power of two >= 2 x the hardware threads, in [4, 64]).
  int64_t table_admission_threshold = 0;
  int64_t table_evict_after_steps = 0;
  int64_t table_max_rows = 0;
  int table_shards = 0;
};

class Applier {
 public:
  // `program` is a pserver program whose block 0 holds `listen_and_serv`; its startup program
  // must already have run on `scope`. `registry` and `scope` must outlive the applier.
  // InvalidArgument naming the attribute, block or table for a malformed program.
  static absl::StatusOr<std::unique_ptr<Applier>> Create(const ProgramDesc& program,
                                                         const OpDesc& listen_and_serv,
                                                         int num_trainers, bool sync,
                                                         Scope* scope, const OpRegistry* registry,
                                                         ApplierOptions options);
  ~Applier();
  // Runs what was scheduled on the optimizer pool and joins it, while this applier is whole
  // (those closures use it; call before destroying it from a pointer they go through).
  void Stop() {
    if (pool_ != nullptr) pool_->Join();  // (none when Init failed)
  }

  // What a sync step's optimize does after each table's update, on the thread that applied it
  // (e.g. the next batch's lookups): `after(table)` (may be empty).
  struct TableHooks {
    std::function<void(const std::string& table)> after;
  };
  // Sync step `step` (0-based): applies every table, then every block; `table_grads(grad)` gives
  // the trainers' gradients of a table for this step; `hooks` run after each table's update;
  // `tables_done()` (may be empty) runs once every table was applied without error, on this
  // thread while the pool starts the blocks (the tables' rows are final for the step: lookups
  // can be answered). Returns the first
  // failure, naming the pserver and the gradient (InternalError).
  absl::Status ApplyStep(
      int64_t step,
      const std::function<std::vector<const SelectedRows*>(const std::string& grad)>& table_grads,
      const TableHooks& hooks = {}, const std::function<void()>& tables_done = nullptr);
  // Sync, before step `step`'s barrier: applies the optimize block of gradient `grad` (every
  // trainer's copy for the step is in), running the step's schedule first if nothing of the step
  // ran it yet. True when it applied the block; false when the block was applied for `step`
  // already, `grad` is no block's, or it failed. A failure (the block's or the schedule's) is
  // kept and reported by the step's ApplyStep, which does not run the block again.
  bool ApplyEarly(const std::string& grad, int64_t step);
  // Async: applies gradient `grad` received in `trainer_scope`.
  absl::Status ApplyPush(const std::string& grad, Scope* trainer_scope);
  // Runs `fn` on the optimizer pool.
  void Schedule(std::function<void()> fn) { pool_->Schedule(std::move(fn)); }
  // Runs fn(0..n-1) on the optimizer pool and the calling thread; returns when all ran.
  void ParallelFor(int n, const std::function<void(int)>& fn) { pool_->ParallelFor(n, fn); }

  // The parameter `name`: in sync mode sharing its buffer (nothing writes it until every trainer
  // fetched), in async mode a copy taken under its block's lock. NotFound naming it otherwise.
  absl::StatusOr<Variable> Read(const std::string& name) const;
  // Rows `ids` of distributed table `table`: InvalidArgument for a table this pserver does not
  // serve; the table's own error (e.g. RESOURCE_EXHAUSTED for its row budget) otherwise.
  absl::StatusOr<Tensor> Lookup(const std::string& table, const std::vector<int64_t>& ids);
  // The same into *rows, resized to [ids, dim]: a tensor of that shape keeps its buffer (a
  // look-ahead's answer looked up again after the update allocates nothing). Errors as Lookup;
  // *rows is then unspecified.
  absl::Status Lookup(const std::string& table, const std::vector<int64_t>& ids, Tensor* rows);

  // Gradients that land in the GradientInbox: the optimize blocks', and each table gradient's
  // (table name, row width).
  std::vector<std::string> dense_gradients() const;
  std::map<std::string, std::pair<std::string, int64_t>> table_gradients() const;
  // Gradients applied by one sync step (blocks and tables).
  int64_t applies_per_step() const { return static_cast<int64_t>(blocks_.size() + tables_.size()); }

  // Checkpoints: copies of the dense variables of `slices` (holding every block's lock, so
  // async pushes leave them consistent), and the tables with their optimizer step counts.
  void CopyDense(const std::map<std::string, DenseSlice>& slices,
                 std::map<std::string, Tensor>* out);
  std::vector<PserverTableRef> TableRefs();
  // After a restore: each table's optimizer steps (async Adam's t) and current step; the
  // schedule and every block may run once for any step from `step` on.
  void RestoreTables(const std::map<std::string, int64_t>& applies, int64_t step);
  // Writes every table shard to <dir>/<table>.shard<k>.tbl (a group's: one file per member);
  // returns the rows written.
  absl::StatusOr<int64_t> ExportTables(const std::string& dir,
                                       const SparseTableExportOptions& options);
  // Rows per (table, shard) (a group's members each); adds the rows refused for the row budget
  // and the updates that took their lookup's rows (SparseTableStats), summed over tables.
  std::map<std::pair<std::string, int>, int64_t> TableRows(int64_t* refused,
                                                           int64_t* updates_taking_lookups) const;

 private:
  struct OptimizeBlock {
    int block_id;
    std::string grad;   // received gradient block name
    std::string param;  // parameter block it updates
    PreparedBlock prepared;
    // Async updates; sync: one run per step (ApplyStep and ApplyEarly).
    std::unique_ptr<absl::Mutex> mu = std::make_unique<absl::Mutex>();
    int64_t applied_step = -1;  // sync: the last step it ran for, under mu
    absl::Status status;        // and how that run ended
  };
  struct Table {
    std::string name;  // the table variable, or a group's name (its members': table_gradients)
    std::vector<std::string> members;  // the tables it holds: itself, or a group's members
    int shard = 0;     // which shard of the table this pserver holds
    int num_shards = 0;  // of how many (0: a program from before the attr: the pserver count)
    std::string grad;  // its gradient shard name, as trainers send it
    std::string lr;    // learning-rate variable
    int64_t dim = 0;
    std::unique_ptr<SparseTable> table;
    std::unique_ptr<absl::Mutex> mu = std::make_unique<absl::Mutex>();
    int64_t applies = 0;  // async: optimizer steps taken (Adam's t)
  };

  Applier(const ProgramDesc& program, int num_trainers, bool sync, Scope* scope,
          const OpRegistry* registry, ApplierOptions options)
      : program_(program),
        num_trainers_(num_trainers),
        sync_(sync),
        scope_(scope),
        executor_(registry),
        options_(std::move(options)) {}
  absl::Status Init(const OpDesc& listen_and_serv);
  absl::Status InitTables();
  float LearningRate(const std::string& var) const;
  // Sync: block `b`'s update of `step`, run once (`ran`, nullable: whether this call ran it); a
  // block already run for `step` gives that run's status.
  absl::Status ApplyBlockOnce(OptimizeBlock& b, int64_t step, bool* ran = nullptr);
  // Sync: the schedule of `step`, run once (the same way).
  absl::Status RunScheduleOnce(int64_t step);
  // Applies `grads` (rows of one table's gradient) scaled by 1/N at optimizer step `step`.
  absl::Status ApplyTable(Table& t, const std::vector<const SelectedRows*>& grads, int64_t step);

  const ProgramDesc& program_;
  const int num_trainers_;
  const bool sync_;
  Scope* scope_;
  Executor executor_;
  const ApplierOptions options_;
  std::vector<OptimizeBlock> blocks_;
  std::map<std::string, int> grad_to_block_;   // gradient block name -> index into blocks_
  std::map<std::string, int> param_to_block_;  // parameter block name -> index into blocks_
  std::vector<Table> tables_;
  std::map<std::string, int> table_by_grad_, table_by_name_;
  // Learning-rate schedule block: sync once per step; async on each push of `lr_clock_grad_`
  // (each push advances it 1/N).
  bool has_lr_block_ = false;
  PreparedBlock lr_block_;
  std::string lr_clock_grad_;
  absl::Mutex lr_mu_;
  int64_t lr_step_ ABSL_GUARDED_BY(lr_mu_) = -1;  // sync: the last step the schedule ran for
  absl::Status lr_status_ ABSL_GUARDED_BY(lr_mu_);
  std::unique_ptr<ThreadPool> pool_;
};

}  // namespace tessera

#endif  // TESSERA_PSERVER_APPLIER_H_
