#include "pserver/parameter_server.h"

#include <algorithm>
#include <cstring>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/base/status.h"
#include "common/framework/op_desc.h"
#include "common/io/checkpoint_io.h"
#include "pserver/bundle_tables.h"
#include "pserver/checkpoint.h"
#include "transpiler/distribute_transpiler.h"

namespace tessera {

namespace {

const OpDesc* FindListenAndServ(const ProgramDesc& program) {
  if (program.blocks_size() == 0) return nullptr;
  for (const auto& op : program.blocks(0).ops()) {
    if (op.type() == "listen_and_serv") return &op;
  }
  return nullptr;
}

}  // namespace

absl::StatusOr<std::unique_ptr<ParameterServer>> ParameterServer::Create(
    const ProgramDesc& program, Scope* scope, const OpRegistry* registry,
    ParameterServerOptions options) {
  std::unique_ptr<ParameterServer> ps(
      new ParameterServer(program, scope, registry, std::move(options)));
  TS_RETURN_IF_ERROR(ps->Init());
  return ps;
}

ParameterServer::ParameterServer(const ProgramDesc& program, Scope* scope,
                                 const OpRegistry* registry, ParameterServerOptions options)
    : program_(program), scope_(scope), registry_(registry), options_(std::move(options)) {}

absl::Status ParameterServer::Init() {
  const OpDesc* ls = FindListenAndServ(program_);
  if (ls == nullptr) {
    return absl::InvalidArgumentError("pserver program has no listen_and_serv op in block 0");
  }
  num_trainers_ = static_cast<int>(GetIntAttr(*ls, "Fanin", 1));
  sync_ = GetBoolAttr(*ls, "sync_mode", true);
  lookups_ahead_ = sync_ && options_.table_admission_threshold == 0 &&
                   options_.table_evict_after_steps == 0 && options_.table_max_rows == 0;
  if (num_trainers_ < 1) {
    return absl::InvalidArgumentError(absl::StrCat("listen_and_serv Fanin=", num_trainers_));
  }
  ApplierOptions ao;
  ao.endpoint = options_.endpoint;
  ao.optimize_threads = options_.optimize_threads;
  ao.table_admission_threshold = options_.table_admission_threshold;
  ao.table_evict_after_steps = options_.table_evict_after_steps;
  ao.table_max_rows = options_.table_max_rows;
  ao.table_shards = options_.table_shards;
  TS_ASSIGN_OR_RETURN(applier_,
                      Applier::Create(program_, *ls, num_trainers_, sync_, scope_, registry_, ao));
  CreateBlockVariables(program_.blocks(0), scope_);
  eval_ = std::make_unique<EvalReducer>(num_trainers_, options_.endpoint);
  inbox_ = std::make_unique<GradientInbox>(&program_, scope_, num_trainers_, sync_,
                                           options_.endpoint, applier_->dense_gradients(),
                                           applier_->table_gradients());
  {
    absl::MutexLock lock(&mu_);
    barrier_ = SyncBarrier(num_trainers_);
  }
  checkpoint_pool_ = std::make_unique<ThreadPool>(1);
  watchdog_ = std::thread([this] { Watchdog(); });
  return absl::OkStatus();
}

ParameterServer::~ParameterServer() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (watchdog_.joinable()) watchdog_.join();
  checkpoint_pool_.reset();
  // The optimizer pool's tasks call back into this server and through applier_: they run
  // before applier_ is reset.
  applier_->Stop();
  applier_.reset();
}

absl::Status ParameterServer::AdmitHeartbeat(const RequestMeta& meta) {
  TS_RETURN_IF_ERROR(CheckJobAndTrainer(meta));
  absl::MutexLock lock(&mu_);
  if (last_beat_.empty()) last_beat_.assign(num_trainers_, absl::InfinitePast());
  last_beat_[meta.trainer_id] = absl::Now();
  return failure_;
}

absl::Status ParameterServer::Admit(const RequestMeta& meta) {
  TS_RETURN_IF_ERROR(CheckJobAndTrainer(meta));
  absl::MutexLock lock(&mu_);
  last_request_ = absl::Now();
  if (first_request_ == absl::InfinitePast()) first_request_ = last_request_;
  if (last_seen_.empty()) last_seen_.assign(num_trainers_, absl::InfinitePast());
  last_seen_[meta.trainer_id] = last_request_;
  return failure_;
}

absl::Status ParameterServer::CheckJobAndTrainer(const RequestMeta& meta) const {
  if (meta.job_id != options_.job_id) {
    return absl::UnauthenticatedError(absl::StrCat(
        "request of job '", meta.job_id, "' refused by pserver of job '", options_.job_id, "'"));
  }
  if (meta.trainer_id < 0 || meta.trainer_id >= num_trainers_) {
    return absl::InvalidArgumentError(
        absl::StrCat("trainer_id ", meta.trainer_id, " is outside [0, ", num_trainers_, ")"));
  }
  return absl::OkStatus();
}

absl::StatusOr<Variable*> ParameterServer::PrepareReceive(const RequestMeta& meta,
                                                          const VariableHeader& h) {
  if (EvalReducer::IsEvalVariable(h.name)) return eval_->Prepare(meta.trainer_id, h);
  int64_t step;
  {
    absl::MutexLock lock(&mu_);
    step = barrier_.step();
  }
  return inbox_->Prepare(meta, h, step);
}

void ParameterServer::HandleSend(const RequestMeta& meta, const VariableHeader& h, Variable* var,
                                 DoneCallback done) {
  if (EvalReducer::IsEvalVariable(h.name)) {
    std::vector<std::function<void()>> answers;
    absl::Status s = eval_->Add(meta.trainer_id, h, &answers);
    for (auto& a : answers) a();
    return done(s);
  }
  // Bad rows are refused as bad input before anything counts them, rather than as an optimizer
  // failure (sync: one that fails the whole step).
  if (absl::Status rows = inbox_->CheckRows(h, var); !rows.ok()) return done(rows);
  const bool complete = inbox_->Arrived(meta, h);
  bool early = false;
  {
    absl::MutexLock lock(&mu_);
    ++stats_.sends;
    if (complete) ++stats_.grads_received[meta.trainer_id];
    early = complete && sync_ && StartEarlyApply(meta, h);
  }
  if (early) {
    applier_->Schedule([this, grad = h.name, step = meta.step] { EarlyApply(grad, step); });
  }
  if (sync_ || !complete) {
    done(absl::OkStatus());
    return;
  }
  std::string grad = h.name;
  int trainer = meta.trainer_id;
  applier_->Schedule(
      [this, trainer, grad, done = std::move(done)] { AsyncApply(trainer, grad, done); });
}

bool ParameterServer::StartEarlyApply(const RequestMeta& meta, const VariableHeader& h) {
  // Every trainer active: one that completed no longer sends, and its buffer holds an older
  // step's gradient (the job fails at the next barrier: trainers disagree on its length).
  if (meta.barrier_follows || !failure_.ok() || checkpointing_ || meta.step != barrier_.step() ||
      barrier_.optimizing() || barrier_.Applied(meta.step) ||
      static_cast<int>(barrier_.active().size()) != num_trainers_ ||
      inbox_->IsTableGradient(h.name) ||
      !inbox_->CompleteFromAll(h.name, meta.step, barrier_.active())) {
    return false;
  }
  ++early_running_;
  early_step_ = meta.step;
  return true;
}

void ParameterServer::EarlyApply(const std::string& grad, int64_t step) {
  const bool ran = applier_->ApplyEarly(grad, step);
  absl::MutexLock lock(&mu_);
  --early_running_;
  if (ran) ++stats_.early_applies;
}

void ParameterServer::AsyncApply(int trainer, const std::string& grad, DoneCallback done) {
  absl::Status s = applier_->ApplyPush(grad, inbox_->trainer_scope(trainer));
  if (s.ok()) {
    absl::MutexLock lock(&mu_);
    ++stats_.grads_applied;
  }
  done(s);
}

void ParameterServer::ServeGet(const std::string& name, const GetDone& done) {
  done(applier_->Read(name));
}

void ParameterServer::HandleGet(const RequestMeta& meta, const std::string& name, GetDone done) {
  if (EvalReducer::IsEvalVariable(name)) {
    std::vector<std::function<void()>> answers;
    eval_->Get(name, std::move(done), &answers);
    for (auto& a : answers) a();
    return;
  }
  {
    absl::MutexLock lock(&mu_);
    ++stats_.gets;
    if (sync_ && barrier_.optimizing()) {
      pending_gets_.push_back({name, std::move(done)});
      return;
    }
  }
  ServeGet(name, done);
}

void ParameterServer::HandlePrefetch(const RequestMeta& meta, const std::string& table,
                                     std::vector<int64_t> ids, PrefetchDone done) {
  {
    absl::MutexLock lock(&mu_);
    ++stats_.prefetches;
  }
  done(applier_->Lookup(table, ids));
}

bool ParameterServer::Traced(int64_t step) const {
  return options_.tracer != nullptr && step >= options_.trace_first_step &&
         step - options_.trace_first_step < options_.trace_steps;
}

template <typename Done>
Done ParameterServer::TraceUntil(const char* name, const RequestMeta& meta, Done done) const {
  if (!Traced(meta.step)) return done;
  return [tracer = options_.tracer, name, step = meta.step, trainer = meta.trainer_id,
          start = Tracer::NowMicros(), inner = std::move(done)](auto result) {
    tracer->AddSpan(name, start, Tracer::NowMicros() - start,
                    {{"step", step}, {"trainer", trainer}});
    inner(std::move(result));
  };
}

void ParameterServer::HandlePrefetchBatch(const RequestMeta& meta,
                                          std::vector<PrefetchQuery> queries, bool after_update,
                                          PrefetchBatchDone done) {
  done = TraceUntil("prefetch", meta, std::move(done));
  auto batch = std::make_shared<FusedLookup>();
  batch->queries = std::move(queries);
  batch->rows.resize(batch->queries.size());
  batch->filled.assign(batch->queries.size(), 0);
  batch->done = std::move(done);
  bool ahead = false;
  // Looks every query up (unless the step's optimize did), then answers; nothing if the
  // optimize answered already.
  auto finish = [this, batch](absl::Status s) {
    if (batch->answered.exchange(true)) return;
    if (!s.ok()) return batch->done(std::vector<absl::StatusOr<Tensor>>(batch->queries.size(), s));
    if (!batch->looked_up) {
      applier_->ParallelFor(static_cast<int>(batch->queries.size()),
                            [&](int i) { LookUpInto(*batch, static_cast<size_t>(i)); });
    }
    batch->done(std::move(batch->rows));
  };
  {
    absl::MutexLock lock(&mu_);
    stats_.prefetches += static_cast<int64_t>(batch->queries.size());
    // Sync, before the step's optimize starts: it looks the rows up as it applies each table.
    if (after_update && sync_ && failure_.ok() && meta.step == barrier_.step() &&
        !barrier_.optimizing() && !barrier_.Applied(meta.step)) {
      // Ahead only when the lookups came on their own, before the step's gradients (with them,
      // riding on a trainer's send, the optimize is near and the trainers' CPUs are busy).
      if (lookups_ahead_ && !meta.barrier_follows) {
        batch->ahead.reset(new std::atomic<int>[batch->queries.size()]);
        for (size_t i = 0; i < batch->queries.size(); ++i) batch->ahead[i] = FusedLookup::kNobody;
        batch->trainer = meta.trainer_id;
        TakeSpareRows(*batch);
        ahead = true;
        ++early_running_;  // a step boundary (checkpoint) waits for it
      }
      fused_lookups_.push_back(batch);
      stats_.fused_prefetches += static_cast<int64_t>(batch->queries.size());
    }
  }
  if (ahead) applier_->Schedule([this, batch] { LookUpAhead(*batch); });
  if (!after_update) return finish(absl::OkStatus());
  // Answered once the step is applied (by then the optimize may have looked the rows up), at once
  // in async mode, or with the job's failure.
  AwaitUpdate(meta, std::move(finish));
}

void ParameterServer::LookUpAhead(FusedLookup& f) {
  std::atomic<int64_t> looked_up{0};
  const int n = static_cast<int>(f.queries.size());
  // On the pool's threads, last table first (the optimize starts with the first).
  applier_->ParallelFor(n, [&](int k) {
    if (f.optimizing.load()) return;
    const size_t i = static_cast<size_t>(n - 1 - k);
    int nobody = FusedLookup::kNobody;
    if (!f.ahead[i].compare_exchange_strong(nobody, FusedLookup::kAheadRunning)) return;
    LookUpInto(f, i);
    f.ahead[i].store(FusedLookup::kAheadDone, std::memory_order_release);
    ++looked_up;
  });
  absl::MutexLock lock(&mu_);
  stats_.lookups_ahead += looked_up.load();
  --early_running_;
}

void ParameterServer::LookUpInto(FusedLookup& f, size_t i) {
  absl::StatusOr<Tensor>& rows = f.rows[i];
  if (!rows.ok()) rows = Tensor();
  absl::Status s = applier_->Lookup(f.queries[i].table, f.queries[i].ids, &*rows);
  if (!s.ok()) rows = std::move(s);
}

void ParameterServer::TakeSpareRows(FusedLookup& f) {
  absl::MutexLock lock(&spare_mu_);
  const size_t t = static_cast<size_t>(f.trainer);
  if (t >= spare_rows_.size()) return;
  std::vector<std::pair<std::string, Tensor>>& spare = spare_rows_[t];
  for (size_t i = 0; i < f.queries.size() && i < spare.size(); ++i) {
    if (spare[i].first == f.queries[i].table && !spare[i].second.buffer_shared()) {
      f.rows[i] = spare[i].second;  // shared with spare[i] until the reply is sent
    }
  }
}

void ParameterServer::KeepSpareRows(const FusedLookup& f) {
  if (f.trainer < 0 || f.trainer >= num_trainers_) return;  // bounded: one set per trainer
  absl::MutexLock lock(&spare_mu_);
  if (spare_rows_.size() <= static_cast<size_t>(f.trainer)) spare_rows_.resize(f.trainer + 1);
  std::vector<std::pair<std::string, Tensor>>& spare = spare_rows_[f.trainer];
  spare.resize(f.queries.size());
  for (size_t i = 0; i < f.queries.size(); ++i) {
    if (f.rows[i].ok()) {
      spare[i] = {f.queries[i].table, *f.rows[i]};
    } else {
      spare[i] = {};
    }
  }
}

bool ParameterServer::ClaimForOptimize(FusedLookup& f, size_t i) {
  if (f.ahead == nullptr) return true;
  int nobody = FusedLookup::kNobody;
  if (f.ahead[i].compare_exchange_strong(nobody, FusedLookup::kOptimize)) return true;
  while (f.ahead[i].load(std::memory_order_acquire) == FusedLookup::kAheadRunning) {
    std::this_thread::yield();
  }
  return f.ahead[i].load(std::memory_order_acquire) == FusedLookup::kOptimize;
}

void ParameterServer::HandleCheckpoint(const RequestMeta& meta, const std::string& name,
                                       DoneCallback done) {
  int64_t export_step = 0;
  bool delta = false;
  if (io::ParseExportRequestName(name, &export_step, &delta)) {
    return HandleExport(export_step, delta, std::move(done));
  }
  // Least authority: a peer chooses only the step; the directory is this pserver's own.
  if (options_.checkpoint_dir.empty()) {
    done(absl::FailedPreconditionError(absl::StrCat(
        "pserver ", options_.endpoint, " refuses checkpoint ", name,
        ": it has no --checkpoint_dir (give the pservers the trainers' --checkpoint_dir)")));
    return;
  }
  if (io::CheckpointStep(name) < 0) {
    done(absl::InvalidArgumentError(
        absl::StrCat("pserver ", options_.endpoint, " refuses checkpoint '", name,
                     "': not a ckpt-<step> name under its --checkpoint_dir")));
    return;
  }
  const std::string dir = io::JoinPath(options_.checkpoint_dir, name);
  // Saving blocks (file I/O, waiting for an optimization): off the RPC threads.
  checkpoint_pool_->Schedule([this, dir, done = std::move(done)] {
    absl::Status s = SaveCheckpoint(dir);
    if (!s.ok()) {
      s = absl::Status(s.code(), absl::StrCat("pserver ", options_.endpoint, " checkpoint to ", dir,
                                              ": ", s.message()));
    }
    done(s);
  });
}

// A serving export (io::ExportRequestName): the peer chooses the step and the kind; the
// directory is <this pserver's --export_dir>/export-<step>.
void ParameterServer::HandleExport(int64_t step, bool delta, DoneCallback done) {
  if (options_.export_dir.empty()) {
    done(absl::FailedPreconditionError(absl::StrCat(
        "pserver ", options_.endpoint, " refuses the export of step ", step,
        ": it has no --export_dir (give the pservers the trainers' --export_dir)")));
    return;
  }
  const std::string dir = io::JoinPath(options_.export_dir, io::ExportDirName(step));
  checkpoint_pool_->Schedule([this, dir, delta, done = std::move(done)] {
    io::FileSystem* fs = options_.fs != nullptr ? options_.fs : io::PosixFileSystem::Default();
    absl::Status s = AtStepBoundary([&](int64_t) -> absl::Status {
      // Trainer 0 created the directory when both share a file system; a pserver with its own
      // disk creates it here.
      TS_RETURN_IF_ERROR(fs->CreateDirs(dir));
      std::vector<BundleTableRef> tables;
      for (const PserverTableRef& t : applier_->TableRefs()) {
        tables.push_back({t.name, t.table, t.member});
      }
      return WritePserverExport(fs, dir, options_.pserver_index, options_.num_pservers, delta,
                                tables);
    });
    if (!s.ok()) {
      s = absl::Status(s.code(), absl::StrCat("pserver ", options_.endpoint, " export to ", dir,
                                              ": ", s.message()));
    }
    done(s);
  });
}

absl::Status ParameterServer::AtStepBoundary(const std::function<absl::Status(int64_t)>& fn) {
  int64_t step = 0;
  {
    absl::MutexLock lock(&mu_);
    auto idle = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return (!barrier_.optimizing() && !checkpointing_ && early_running_ == 0) || !failure_.ok();
    };
    mu_.Await(absl::Condition(&idle));
    if (!failure_.ok()) return failure_;
    checkpointing_ = true;
    barrier_.Pause();
    step = barrier_.step();
  }
  absl::Status s = fn(step);
  std::vector<SyncBarrier::Reply> replies;
  {
    absl::MutexLock lock(&mu_);
    checkpointing_ = false;
    // Barrier waits do not count the save; a send barrier may have completed meanwhile.
    replies = Act(barrier_.Resume(absl::Now()));
  }
  for (SyncBarrier::Reply& r : replies) r.done(r.status);
  return s;
}

absl::Status ParameterServer::SaveCheckpoint(const std::string& dir) {
  io::FileSystem* fs = options_.fs != nullptr ? options_.fs : io::PosixFileSystem::Default();
  PserverShardToSave shard;
  shard.index = options_.pserver_index;
  shard.num_pservers = options_.num_pservers;
  shard.slices = DenseSlices(program_, options_.param_blocks);
  return AtStepBoundary([&](int64_t step) -> absl::Status {
    {
      absl::MutexLock lock(&mu_);
      if (early_step_ == step && !barrier_.Applied(step)) {
        return absl::FailedPreconditionError(absl::StrCat(
            "pserver ", options_.endpoint, " refuses a checkpoint at step ", step,
            ": gradient blocks of that step, sent ahead of its barrier, are applied already (the "
            "checkpoint would hold half a step; take it between steps)"));
      }
    }
    shard.step = step;
    applier_->CopyDense(shard.slices, &shard.dense);
    shard.tables = applier_->TableRefs();
    return SavePserverShard(fs, dir, shard);
  });
}

absl::Status ParameterServer::RestoreCheckpoint(const std::string& dir) {
  io::FileSystem* fs = options_.fs != nullptr ? options_.fs : io::PosixFileSystem::Default();
  PserverRestoreTarget target;
  target.index = options_.pserver_index;
  target.num_pservers = options_.num_pservers;
  target.scope = scope_;
  target.slices = DenseSlices(program_, options_.param_blocks);
  target.table_shard_method = options_.table_shard_method;
  target.tables = applier_->TableRefs();
  TS_ASSIGN_OR_RETURN(PserverRestored restored, RestorePserverShard(fs, dir, target));
  applier_->RestoreTables(restored.table_applies, restored.step);
  absl::MutexLock lock(&mu_);
  barrier_.SetStep(restored.step);
  early_step_ = -1;
  return absl::OkStatus();
}

void ParameterServer::HandleAbort(const RequestMeta& meta, const std::string& reason,
                                  DoneCallback done) {
  // Every other process learns the cause from this, on one line of a readable length (the
  // trainer's own log has it in full).
  constexpr size_t kShownReasonBytes = 200;
  std::string shown = reason;
  if (shown.size() > kShownReasonBytes) {
    shown.resize(kShownReasonBytes - 3);
    shown += "...";
  }
  Fail(absl::AbortedError(
      reason.empty()
          ? absl::StrCat("trainer ", meta.trainer_id,
                         " stopped with an error (its log says why), so pserver ",
                         options_.endpoint, " stops the job")
          : absl::StrCat("trainer ", meta.trainer_id, " stopped with an error, so pserver ",
                         options_.endpoint, " stops the job: ", shown)));
  done(absl::OkStatus());
}

void ParameterServer::HandleBarrier(const RequestMeta& meta, BarrierKind kind, DoneCallback done) {
  if (kind == ABORT) return HandleAbort(meta, "", std::move(done));
  // AdmitHeartbeat noted the time, and answered a failed job with its failure already.
  if (kind == HEARTBEAT) return done(absl::OkStatus());
  std::vector<SyncBarrier::Reply> replies;
  absl::Status abort;
  // The last trainer's send barrier starts the step's optimize on this thread: no hand-off to
  // the pool between the gradients' arrival and their update.
  bool optimize_here = false;
  {
    absl::MutexLock lock(&mu_);
    if (!failure_.ok()) {
      replies.push_back({std::move(done), failure_});
    } else if (kind != SEND_BARRIER && kind != FETCH_BARRIER && kind != COMPLETE) {
      replies.push_back({std::move(done), absl::InvalidArgumentError(absl::StrCat(
                                              "unknown barrier kind ", static_cast<int>(kind)))});
    } else if (kind == COMPLETE) {
      replies = Act(barrier_.Leave(meta.trainer_id, /*completed=*/sync_));
      replies.push_back({std::move(done), absl::OkStatus()});
      if (barrier_.finished()) finished_ = true;
    } else if (!sync_) {  // async: barriers are no-ops
      replies.push_back({std::move(done), absl::OkStatus()});
    } else {
      if (options_.on_barrier_wait) {
        done = [on_wait = &options_.on_barrier_wait, kind, arrival = absl::Now(),
                inner = std::move(done)](absl::Status s) {
          (*on_wait)(kind, absl::Now() - arrival);
          inner(std::move(s));
        };
      }
      done = TraceUntil(kind == SEND_BARRIER ? "send_barrier" : "fetch_barrier", meta,
                        std::move(done));
      if (kind == SEND_BARRIER && meta.last_batch) barrier_.MarkLastBatch(meta.step);
      SyncBarrier::Actions actions = barrier_.Arrive(
          meta.trainer_id, meta.step,
          kind == SEND_BARRIER ? SyncBarrier::Kind::kSend : SyncBarrier::Kind::kFetch,
          std::move(done), absl::Now(), absl::StrCat("pserver ", options_.endpoint));
      abort = actions.fail_job;
      replies = Act(std::move(actions), &optimize_here);
    }
  }
  if (!abort.ok()) Fail(abort);
  for (SyncBarrier::Reply& r : replies) r.done(r.status);
  if (optimize_here) RunSyncOptimize();
}

void ParameterServer::AwaitUpdate(const RequestMeta& meta, DoneCallback done) {
  if (!sync_) return done(absl::OkStatus());
  std::vector<SyncBarrier::Reply> replies;
  {
    absl::MutexLock lock(&mu_);
    if (!failure_.ok()) {
      replies.push_back({std::move(done), failure_});
    } else {
      replies = Act(barrier_.AwaitUpdate(meta.trainer_id, meta.step, std::move(done), absl::Now(),
                                         absl::StrCat("pserver ", options_.endpoint)));
    }
  }
  for (SyncBarrier::Reply& r : replies) r.done(r.status);
}

bool ParameterServer::StepEndsEpoch(int64_t step) {
  absl::MutexLock lock(&mu_);
  return sync_ && barrier_.EndsEpoch(step);
}

void ParameterServer::HandleRegister(const RequestMeta& meta, const JobFields& fields,
                                     uint64_t nonce, DoneCallback done) {
  const std::string me = absl::StrCat("pserver ", options_.endpoint);
  const int k = meta.trainer_id;
  absl::Status mismatch;
  {
    absl::MutexLock lock(&mu_);
    if (!failure_.ok()) return done(failure_);
    auto seen = registered_.find(k);
    if (seen != registered_.end() && seen->second != nonce && sync_) {
      mismatch = absl::FailedPreconditionError(absl::StrCat(
          "job mismatch: trainer ", k, " registered with ", me,
          " twice, from two processes (two trainers started with --trainer_id=", k,
          "? or a trainer restarted without a checkpoint: a sync job cannot take one back)"));
    }
    registered_[k] = nonce;
    std::map<std::string, std::string> sent(fields.begin(), fields.end());
    for (const auto& [name, want] : options_.job_fields) {
      if (!mismatch.ok()) break;
      auto got = sent.find(name);
      if (got == sent.end()) {
        mismatch = absl::FailedPreconditionError(
            absl::StrCat("job mismatch: trainer ", k, " sent no '", name, "' but ", me, " has ",
                         name, "=", want, " (is it an older tessera?)"));
      } else if (got->second != want) {
        mismatch = absl::FailedPreconditionError(absl::StrCat(
            "job mismatch: trainer ", k, " has ", name, "=", got->second, " but ", me, " has ",
            name, "=", want, " (start every process of a job with the same model and flags)"));
      }
      if (got != sent.end()) sent.erase(got);
    }
    for (const auto& [name, value] : sent) {  // fields only trainers know
      if (!mismatch.ok()) break;
      auto first = trainer_fields_.emplace(name, std::make_pair(value, k)).first;
      if (first->second.first != value) {
        mismatch = absl::FailedPreconditionError(absl::StrCat(
            "job mismatch: trainer ", k, " has ", name, "=", value, " but trainer ",
            first->second.second, " has ", name, "=", first->second.first,
            " (the same data, batch size and epochs on every trainer?)"));
      }
    }
  }
  if (!mismatch.ok()) {
    Fail(mismatch);  // every other waiting trainer gets it too: the job cannot go on
    return done(mismatch);
  }
  done(absl::OkStatus());
}

std::vector<SyncBarrier::Reply> ParameterServer::Act(SyncBarrier::Actions actions,
                                                     bool* optimize_here) {
  if (actions.start_optimize) {
    if (optimize_here != nullptr) {
      *optimize_here = true;
    } else {
      applier_->Schedule([this] { RunSyncOptimize(); });
    }
  }
  if (actions.step_advanced) ++stats_.steps;
  // Each goes on to serve a GetBatch or a PrefetchBatch, on the thread that answers the replies
  // (the optimize's, which looked the rows up already; a PrefetchBatch that came too late for
  // that looks up in parallel on the pool).
  std::vector<SyncBarrier::Reply> replies = std::move(actions.replies);
  for (SyncBarrier::Reply& r : actions.updated) replies.push_back(std::move(r));
  return replies;
}

void ParameterServer::RunSyncOptimize() {
  int64_t step;
  {
    absl::MutexLock lock(&mu_);
    step = barrier_.step();
  }
  // The trace's phases: start, tables applied (their lookups answered from then), answered.
  const bool traced = Traced(step);
  const int64_t start_us = traced ? Tracer::NowMicros() : 0;
  int64_t tables_us = -1, answered_us = -1;
  // The next batches' lookups that came before this optimize: each table's right after its
  // update, while its rows are at hand, on the same threads.
  std::vector<std::shared_ptr<FusedLookup>> fused;
  {
    absl::MutexLock lock(&mu_);
    fused.swap(fused_lookups_);
  }
  std::map<std::string, std::vector<std::pair<FusedLookup*, size_t>>> by_table;
  for (const auto& f : fused) {
    for (size_t i = 0; i < f->queries.size(); ++i) {
      by_table[f->queries[i].table].push_back({f.get(), i});
    }
  }
  for (const auto& f : fused) f->optimizing.store(true);
  // Each table's lookups, right after its update, while its rows are at hand. Those looked up
  // ahead had their rows made and found then: this lookup of the same ids only copies the
  // updated rows (SparseTableOptions::remember_lookups).
  Applier::TableHooks hooks;
  hooks.after = [&](const std::string& table) {
    auto it = by_table.find(table);
    if (it == by_table.end()) return;
    for (auto& [f, i] : it->second) {
      ClaimForOptimize(*f, i);  // waits for a look-ahead of it that is still running
      LookUpInto(*f, i);        // into the look-ahead's answer (the same shape: no allocation)
      f->filled[i] = 1;
    }
  };
  // A table this pserver does not serve was not applied: its lookup gives the error.
  auto complete = [this](FusedLookup& f) {
    for (size_t i = 0; i < f.queries.size(); ++i) {
      if (!f.filled[i] && ClaimForOptimize(f, i)) LookUpInto(f, i);
    }
    f.looked_up = true;
  };
  absl::Status s = applier_->ApplyStep(
      step, [&](const std::string& grad) { return inbox_->TableGradients(grad, step); }, hooks,
      [&] {
        // Every table is applied: the rows are the step's, answered while the dense blocks run
        // (their gets and the send barrier wait for the whole update).
        if (traced) tables_us = Tracer::NowMicros();
        for (const auto& f : fused) {
          complete(*f);
          if (!f->answered.exchange(true)) {
            KeepSpareRows(*f);
            f->done(std::move(f->rows));
          }
        }
        if (traced) answered_us = Tracer::NowMicros();
      });
  if (traced) {
    const int64_t end_us = Tracer::NowMicros();
    const TraceArgs args = {{"step", step}};
    options_.tracer->AddSpan("optimize", start_us, end_us - start_us, args);
    if (answered_us >= 0) {
      options_.tracer->AddSpan("tables", start_us, tables_us - start_us, args);
      options_.tracer->AddSpan("answer", tables_us, answered_us - tables_us, args);
      options_.tracer->AddSpan("blocks", answered_us, end_us - answered_us, args);
    }
  }
  for (const auto& f : fused) {
    if (!f->looked_up) complete(*f);
  }
  std::vector<SyncBarrier::Reply> replies;
  std::vector<PendingGet> gets;
  {
    absl::MutexLock lock(&mu_);
    if (s.ok()) stats_.grads_applied += applier_->applies_per_step();
    gets.swap(pending_gets_);
    if (!s.ok() && failure_.ok()) failure_ = s;
    // The send barrier's waiters get `s`; a fetch barrier may complete now too (its other
    // trainers completed meanwhile).
    replies = Act(barrier_.OptimizeDone(s));
  }
  for (SyncBarrier::Reply& r : replies) r.done(r.status);
  for (auto& g : gets) ServeGet(g.name, g.done);
  if (traced && options_.on_traced &&
      step == options_.trace_first_step + options_.trace_steps - 1) {
    options_.on_traced();
  }
}

void ParameterServer::Fail(absl::Status reason) {
  std::vector<SyncBarrier::Reply> replies;
  std::vector<PendingGet> gets;
  {
    absl::MutexLock lock(&mu_);
    if (failure_.ok()) failure_ = reason;
    replies = barrier_.FailAll(reason).replies;
    gets.swap(pending_gets_);
  }
  for (SyncBarrier::Reply& r : replies) r.done(r.status);
  for (auto& g : gets) g.done(reason);
  std::vector<std::function<void()>> evals;
  if (eval_ != nullptr) eval_->FailAll(reason, &evals);
  for (auto& e : evals) e();
}

void ParameterServer::Watchdog() {
  while (true) {
    absl::Status timeout;
    {
      absl::MutexLock lock(&mu_);
      auto stop = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return stopping_; };
      mu_.AwaitWithTimeout(absl::Condition(&stop), absl::Milliseconds(100));
      if (stopping_) return;
      if (!failure_.ok()) continue;
      // Each trainer on its own: async silence, and in both modes heartbeats that stopped
      // (before the check of silence from everyone, so that trainers dropped after the others
      // completed let the server finish).
      if ((!sync_ || options_.heartbeat_timeout > absl::ZeroDuration()) && !finished_ &&
          first_request_ != absl::InfinitePast()) {
        timeout = CheckSilentTrainers();
      }
      // Nobody ever came.
      if (options_.startup_timeout > absl::ZeroDuration() &&
          first_request_ == absl::InfinitePast() &&
          absl::Now() - created_ > options_.startup_timeout) {
        timeout = absl::DeadlineExceededError(absl::StrCat(
            "pserver ", options_.endpoint, ": no trainer reached it within --startup_timeout_s=",
            absl::ToDoubleSeconds(options_.startup_timeout),
            " (are the trainers running, with this endpoint in their --pservers and the same "
            "TLS settings and job token?)"));
      }
      // Silence from everyone (nobody waits at a barrier, which names the missing instead).
      if (timeout.ok() && !finished_ && !barrier_.finished() &&
          last_request_ != absl::InfinitePast() &&
          absl::Now() - last_request_ > options_.barrier_timeout && !barrier_.optimizing() &&
          barrier_.idle()) {
        timeout = absl::DeadlineExceededError(absl::StrCat(
            "pserver ", options_.endpoint, ": no request from any trainer for ",
            absl::FormatDuration(options_.barrier_timeout), "; trainers ",
            barrier_.MissingFromAll(), " presumed dead (check their logs, then restart the job)"));
      }
      if (timeout.ok()) {
        timeout = barrier_.CheckTimeout(absl::Now(), options_.barrier_timeout,
                                        absl::StrCat("pserver ", options_.endpoint));
      }
    }
    if (!timeout.ok()) Fail(timeout);
  }
}

absl::Status ParameterServer::CheckSilentTrainers() {
  const absl::Time now = absl::Now();
  // `silent`: async trainers that sent no request (heartbeats are none) for barrier_timeout;
  // `lost`: in both modes, trainers that sent heartbeats and then nothing, not even a request,
  // for heartbeat_timeout.
  std::vector<int> lost, silent;
  for (int k : barrier_.active()) {
    // A trainer that never called counts from the first request of any trainer.
    const absl::Time seen = std::max(last_seen_[k], first_request_);
    const absl::Time beat = last_beat_.empty() ? absl::InfinitePast() : last_beat_[k];
    if (!sync_ && now - seen > options_.barrier_timeout) {
      silent.push_back(k);
    } else if (options_.heartbeat_timeout > absl::ZeroDuration() &&
               beat != absl::InfinitePast() &&
               now - std::max(seen, beat) > options_.heartbeat_timeout) {
      lost.push_back(k);
    }
  }
  if (lost.empty() && silent.empty()) return absl::OkStatus();
  // Dropping everyone when no trainer completed would end a job that trained nobody's data
  // to the end: that is a failure whatever the option says.
  const bool nobody_completed = barrier_.active().size() + stats_.trainers_dropped.size() ==
                                static_cast<size_t>(num_trainers_);
  const bool all_silent = lost.size() + silent.size() == barrier_.active().size();
  if (sync_ || !options_.async_drop_silent_trainers || (all_silent && nobody_completed)) {
    std::vector<std::string> parts;
    if (!lost.empty()) {
      parts.push_back(absl::StrCat(
          "trainers [", absl::StrJoin(lost, ", "), "] sent no heartbeat for ",
          absl::FormatDuration(options_.heartbeat_timeout),
          " (the process died, froze or lost its network: see its log and host)"));
    }
    if (!silent.empty()) {
      parts.push_back(absl::StrCat("trainers [", absl::StrJoin(silent, ", "),
                                   "] sent nothing for ",
                                   absl::FormatDuration(options_.barrier_timeout)));
    }
    return absl::DeadlineExceededError(absl::StrCat(
        "pserver ", options_.endpoint, ": ", absl::StrJoin(parts, "; "),
        sync_ ? " (a sync job cannot go on without it)"
        : all_silent && nobody_completed
            ? " and no trainer completed (all dead or stuck)"
            : " (dead or stuck; --async_drop_silent_trainers lets the others go on)"));
  }
  silent.insert(silent.end(), lost.begin(), lost.end());
  for (int k : silent) {
    // Async: no barrier waits, so leaving asks nothing of us; evaluations stop waiting for it
    // (their answers run on the optimizer pool, outside mu_).
    (void)barrier_.Leave(k);
    stats_.trainers_dropped.push_back(k);
    std::vector<std::function<void()>> answers;
    eval_->Leave(k, &answers);
    for (auto& a : answers) applier_->Schedule(std::move(a));
  }
  if (barrier_.finished()) finished_ = true;
  return absl::OkStatus();
}

absl::Status ParameterServer::Wait() {
  absl::MutexLock lock(&mu_);
  auto done = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return finished_ || !failure_.ok(); };
  mu_.Await(absl::Condition(&done));
  return failure_;
}

absl::StatusOr<int64_t> ParameterServer::ExportTables(const std::string& dir,
                                                      const TableExportOptions& options) {
  SparseTableExportOptions eo;
  eo.only_changed = options.only_changed;
  eo.with_optimizer_state = options.with_optimizer_state;
  return applier_->ExportTables(dir, eo);
}

ParameterServerStats ParameterServer::stats() const {
  ParameterServerStats out;
  {
    absl::MutexLock lock(&mu_);
    out = stats_;
  }
  out.table_shard_rows =
      applier_->TableRows(&out.table_refused_rows, &out.table_updates_reusing_lookups);
  for (const auto& [shard, rows] : out.table_shard_rows) out.table_rows += rows;
  return out;
}

}  // namespace tessera
