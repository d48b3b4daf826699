#include "trainer/local_trainer.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <iostream>
#include <optional>
#include <set>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/notification.h"
#include "common/data/auc.h"
#include "common/data/sampler.h"
#include "common/framework/op_desc.h"
#include "common/ops/nn_ops.h"
#include "common/base/status.h"

namespace tessera {

namespace {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

constexpr int64_t kNonForwardRoles =
    kRoleBackward | kRoleOptimize | kRoleRPC | kRoleDist | kRoleLRSched;

// Reads element i of a float32/float64 tensor as double.
double ValueAt(const Tensor& t, int64_t i) {
  return t.dtype() == FLOAT64 ? t.data<double>()[i] : static_cast<double>(t.data<float>()[i]);
}

// The prefetch_ahead split of a block: ops [0, head) are its leading lookups
// (LeadingLookupOps), ops [tail, n) recv / fetch_barrier ops, then perhaps the concats that
// assemble sliced parameters from what they received, all writing nothing the lookups read or
// write. {0, 0} when the block has no such shape.
std::pair<int, int> AheadSplit(const BlockDesc& block) {
  const int n = block.ops_size();
  const int head = LeadingLookupOps(block);
  int tail = n;
  while (tail > head && block.ops(tail - 1).type() == "concat") --tail;
  const int concats = tail;
  while (tail > head && (block.ops(tail - 1).type() == "recv" ||
                         block.ops(tail - 1).type() == "fetch_barrier")) {
    --tail;
  }
  if (head == 0 || tail == concats) return {0, 0};
  std::set<std::string> head_args;
  for (int i = 0; i < head; ++i) {
    for (const auto& in : AllInputArgs(block.ops(i))) head_args.insert(in);
    for (const auto& out : AllOutputArgs(block.ops(i))) head_args.insert(out);
  }
  for (int i = tail; i < n; ++i) {
    for (const auto& out : AllOutputArgs(block.ops(i))) {
      if (head_args.count(out) > 0) return {0, 0};
    }
  }
  return {head, tail};
}

// Whether a block split by AheadSplit at `tail` can send its receives and the next batch's
// lookups along with its send: the op before the receives is a `send` and the receives are
// followed by nothing but concats of sliced parameters. Sync: the send carries the send barrier
// (the pservers then apply the step before answering it) and the receives the fetch barrier,
// the last one (so no parameter changes before every trainer fetched). Async: neither carries a
// barrier (the receive after the push then takes the lookups).
bool PipelinedSend(const BlockDesc& block, int tail) {
  if (tail < 1) return false;
  const OpDesc& send = block.ops(tail - 1);
  if (send.type() != "send") return false;
  int end = tail;  // past the last recv
  while (end < block.ops_size() && block.ops(end).type() == "recv") ++end;
  for (int i = end; i < block.ops_size(); ++i) {
    if (block.ops(i).type() != "concat") return false;
  }
  if (end == tail) return false;
  if (!GetBoolAttr(send, "sync_mode", true)) {
    for (int i = tail; i < end; ++i) {
      if (!GetStringsAttr(block.ops(i), "fetch_barrier_endpoints").empty()) return false;
    }
    return GetStringsAttr(send, "barrier_endpoints").empty();
  }
  return !GetStringsAttr(send, "barrier_endpoints").empty() &&
         !GetStringsAttr(block.ops(end - 1), "fetch_barrier_endpoints").empty();
}

// Folds a step's receive into its send. Sync: a `send` carrying the send barrier immediately
// followed by a `recv` carrying the fetch barrier, every pserver the recv involves getting the
// send's barrier. Async (`fold_async`: the trainer reads its own writes, so its step waits for
// its push anyway): a `send` without barrier immediately followed by a `recv` without the fetch
// barrier, every pserver the recv involves getting gradients from the send. (Ops after them,
// e.g. the concats of sliced parameters, read what the recv wrote, which the send now writes at
// the same point.) The send gets the recv's outputs ("Out", from "recv_epmap"; perhaps none, as
// in hybrid mode) and fetch barrier (attr recv_folded) and sends them with its gradients: one
// request per pserver (SendGetBatch), answered once the pserver applied the step (sync) or the
// gradients (async), as the recv would be. The recv stays in the block; a step must not run
// it. Returns the recv's index, or -1 (and `block` unchanged) if there is none such.
int FoldReceive(BlockDesc* block, bool fold_async) {
  for (int i = 1; i < block->ops_size(); ++i) {
    const OpDesc& recv = block->ops(i);
    OpDesc* send = block->mutable_ops(i - 1);
    if (recv.type() != "recv" || send->type() != "send" || !OpOutputs(*send, "Out").empty()) {
      continue;
    }
    const bool sync = GetBoolAttr(*send, "sync_mode", true);
    if (!sync && !fold_async) continue;
    const std::vector<std::string> barrier = GetStringsAttr(*send, "barrier_endpoints");
    const std::vector<std::string> eps = GetStringsAttr(recv, "epmap");
    const std::vector<std::string> fetch = GetStringsAttr(recv, "fetch_barrier_endpoints");
    if (sync ? barrier.empty() || fetch.empty() : !barrier.empty() || !fetch.empty()) continue;
    const std::vector<std::string> reached = sync ? barrier : GetStringsAttr(*send, "epmap");
    bool covered = true;
    for (const std::vector<std::string>* list : {&eps, &fetch}) {
      for (const std::string& ep : *list) {
        covered &= std::find(reached.begin(), reached.end(), ep) != reached.end();
      }
    }
    if (!covered) continue;
    SetOpOutputs(send, "Out", OpOutputs(recv, "Out"));
    SetAttr(send, "recv_epmap", eps);
    SetAttr(send, "fetch_barrier_endpoints", fetch);
    SetAttr(send, "recv_folded", true);
    return i;
  }
  return -1;
}

// Moves op `from` of `block` up to index `to` (<= from), keeping the others' order.
void MoveOpUp(BlockDesc* block, int from, int to) {
  auto* ops = block->mutable_ops();
  for (int k = from; k > to; --k) ops->SwapElements(k, k - 1);
}

// The transpiler splits the gradients of sliced parameters into their blocks (`split`) and the
// tables' gradients by shard (`split_by_shard`) together, right before the step's send at
// `send`. Each such op whose outputs only that send reads moves up to right after the last op
// writing one of its inputs, so that its blocks are ready as soon as backward produced the
// gradient (not past an op that reads or writes one of its outputs). The same values, earlier.
void HoistGradientSplits(BlockDesc* block, int send) {
  const std::vector<std::string> sent = OpInputs(block->ops(send), "X");
  auto contains = [](const std::vector<std::string>& list, const std::string& name) {
    return std::find(list.begin(), list.end(), name) != list.end();
  };
  for (int i = 0; i < send; ++i) {
    const OpDesc& op = block->ops(i);
    if (op.type() != "split" && op.type() != "split_by_shard") continue;
    const std::vector<std::string> ins = AllInputArgs(op);
    const std::vector<std::string> outs = AllOutputArgs(op);
    if (ins.empty() || outs.empty() ||
        !std::all_of(outs.begin(), outs.end(),
                     [&](const std::string& o) { return contains(sent, o); })) {
      continue;
    }
    int to = i;
    for (; to > 0; --to) {
      const OpDesc& prev = block->ops(to - 1);
      bool blocks = false;
      for (const auto& a : AllOutputArgs(prev)) blocks |= contains(ins, a) || contains(outs, a);
      for (const auto& a : AllInputArgs(prev)) blocks |= contains(outs, a);
      if (blocks) break;
    }
    if (to > 0 && to < i) MoveOpUp(block, i, to);
  }
}

// What SendEarly made: the early send's index (-1: none), its gradient blocks and their bytes.
struct EarlySend {
  int index = -1;
  size_t blocks = 0;
  int64_t bytes = 0;
};

// LocalTrainerOptions::send_early_bytes: splits the step's send (the sync send carrying the send
// barrier) of `original`. With the gradient splits hoisted (HoistGradientSplits), its dense
// gradient blocks (declared with a static shape) in the order backward completes them (their
// last writer before the send): the first of them until they reach `min_bytes` (and any other
// the same op completes) go out in a send with attr early placed right after the op completing
// the last of them, and leave the step's send. Nothing changes (`original` is left as it is)
// when they stay under `min_bytes` or that op is the one before the send (nothing to overlap).
EarlySend SendEarly(BlockDesc* original, int64_t min_bytes) {
  if (min_bytes <= 0) return {};
  int send = -1;
  for (int i = 0; i < original->ops_size(); ++i) {
    const OpDesc& op = original->ops(i);
    if (op.type() == "send" && GetBoolAttr(op, "sync_mode", true) &&
        !GetBoolAttr(op, "early", false) && !GetStringsAttr(op, "barrier_endpoints").empty()) {
      send = i;
    }
  }
  if (send < 0) return {};
  BlockDesc split = *original;  // replaces `original` once an early send is made
  BlockDesc* block = &split;
  HoistGradientSplits(block, send);
  OpDesc* step_send = block->mutable_ops(send);
  std::vector<std::string> vars = OpInputs(*step_send, "X");
  std::vector<std::string> eps = GetStringsAttr(*step_send, "epmap");
  if (vars.size() != eps.size()) return {};
  struct Ready {
    int op;  // the last writer before the send
    size_t var;
    int64_t bytes;
  };
  std::vector<Ready> ready;
  for (size_t v = 0; v < vars.size(); ++v) {
    const VarDesc* desc = FindVarDesc(*block, vars[v]);
    if (desc == nullptr || desc->type() != DENSE_TENSOR || desc->shape().empty()) continue;
    int64_t numel = 1;
    for (int64_t d : desc->shape()) numel = d > 0 ? numel * d : -1;
    if (numel <= 0) continue;
    int last = -1;
    for (int i = 0; i < send; ++i) {
      const auto outs = AllOutputArgs(block->ops(i));
      if (std::find(outs.begin(), outs.end(), vars[v]) != outs.end()) last = i;
    }
    if (last < 0) continue;
    ready.push_back({last, v, numel * static_cast<int64_t>(SizeOf(desc->dtype()))});
  }
  std::stable_sort(ready.begin(), ready.end(),
                   [](const Ready& a, const Ready& b) { return a.op < b.op; });
  int64_t bytes = 0;
  size_t taken = 0;
  while (taken < ready.size() && bytes < min_bytes) bytes += ready[taken++].bytes;
  // Every block that op completes too.
  while (taken < ready.size() && ready[taken].op == ready[taken - 1].op) {
    bytes += ready[taken++].bytes;
  }
  if (bytes < min_bytes || ready[taken - 1].op >= send - 1) return {};
  const int after = ready[taken - 1].op;
  std::vector<bool> early(vars.size(), false);
  OpDesc op;
  op.set_type("send");
  std::vector<std::string> early_vars, early_eps, rest_vars, rest_eps;
  for (size_t k = 0; k < taken; ++k) early[ready[k].var] = true;
  for (size_t v = 0; v < vars.size(); ++v) {
    (early[v] ? early_vars : rest_vars).push_back(vars[v]);
    (early[v] ? early_eps : rest_eps).push_back(eps[v]);
  }
  SetOpInputs(&op, "X", early_vars);
  SetAttr(&op, "epmap", early_eps);
  SetAttr(&op, "sync_mode", true);
  SetAttr(&op, "early", true);
  SetAttr(&op, kOpRoleAttr, OpRoleOf(*step_send));
  SetOpInputs(step_send, "X", rest_vars);
  SetAttr(step_send, "epmap", rest_eps);
  *block->add_ops() = std::move(op);
  MoveOpUp(block, block->ops_size() - 1, after + 1);
  *original = std::move(split);
  return {after + 1, taken, bytes};
}

}  // namespace

absl::StatusOr<ProgramDesc> ForwardProgram(const ProgramDesc& main,
                                           const std::vector<std::string>& targets) {
  if (main.blocks_size() == 0) return absl::InvalidArgumentError("the main program has no blocks");
  const BlockDesc& block = main.blocks(0);
  std::set<std::string> needed(targets.begin(), targets.end());
  std::set<std::string> produced;
  std::vector<bool> keep(static_cast<size_t>(block.ops_size()), false);
  for (int i = block.ops_size() - 1; i >= 0; --i) {
    const OpDesc& op = block.ops(i);
    if ((OpRoleOf(op) & kNonForwardRoles) != 0) continue;
    bool useful = false;
    for (const auto& out : AllOutputArgs(op)) {
      if (needed.count(out) > 0) useful = true;
    }
    if (!useful) continue;
    keep[static_cast<size_t>(i)] = true;
    for (const auto& out : AllOutputArgs(op)) produced.insert(out);
    for (const auto& in : AllInputArgs(op)) needed.insert(in);
  }
  for (const auto& t : targets) {
    if (produced.count(t) == 0) {
      return absl::NotFoundError(
          absl::StrCat("no forward op of the main program produces '", t, "'"));
    }
  }
  ProgramDesc out;
  out.set_random_seed(main.random_seed());
  BlockDesc* ob = out.add_blocks();
  ob->set_idx(0);
  ob->set_parent_idx(-1);
  std::set<std::string> used;
  for (int i = 0; i < block.ops_size(); ++i) {
    if (!keep[static_cast<size_t>(i)]) continue;
    OpDesc* op = ob->add_ops();
    *op = block.ops(i);
    if (op->type() == "dropout" || op->type() == "batch_norm") SetAttr(op, "is_test", true);
    for (const auto& a : AllInputArgs(block.ops(i))) used.insert(a);
    for (const auto& a : AllOutputArgs(block.ops(i))) used.insert(a);
  }
  for (const auto& v : block.vars()) {
    if (used.count(v.name()) > 0) *ob->add_vars() = v;
  }
  return out;
}

LocalTrainer::LocalTrainer(const OpRegistry* registry, ModelSpec model, Options options)
    : executor_(registry), model_(std::move(model)), options_(options), feeder_(model_.feeds) {}

absl::StatusOr<std::unique_ptr<LocalTrainer>> LocalTrainer::Create(const OpRegistry* registry,
                                                                   ModelSpec model,
                                                                   Options options) {
  if (options.batch_size < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("LocalTrainer: batch_size must be >= 1, got ", options.batch_size));
  }
  if (options.epochs < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("LocalTrainer: epochs must be >= 0, got ", options.epochs));
  }
  if (options.log_every_steps < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("LocalTrainer: log_every_steps must be >= 0, got ", options.log_every_steps));
  }
  if (options.cpu_places < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("LocalTrainer: cpu_places must be >= 1, got ", options.cpu_places));
  }
  if (!options.place_registries.empty() && options.cpu_places != 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "LocalTrainer: ", options.place_registries.size(), " device places and cpu_places=",
        options.cpu_places, ": a trainer runs on devices or on CPU places, not both"));
  }
  if (model.main.blocks_size() == 0 || model.startup.blocks_size() == 0) {
    return absl::InvalidArgumentError("LocalTrainer: the main or startup program has no blocks");
  }
  const BlockDesc& block = model.main.blocks(0);
  if (model.loss.empty() || FindVarDesc(block, model.loss) == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("LocalTrainer: loss variable '", model.loss,
                                                   "' is not declared in the main program"));
  }
  if (!model.prediction.empty() && FindVarDesc(block, model.prediction) == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat("LocalTrainer: prediction variable '",
                                                   model.prediction,
                                                   "' is not declared in the main program"));
  }
  TS_RETURN_IF_ERROR(Feeder(model.feeds).Validate(model.main));

  std::unique_ptr<LocalTrainer> t(new LocalTrainer(registry, std::move(model), options));
  std::vector<std::string> targets = {t->model_.loss};
  if (!t->model_.prediction.empty()) targets.push_back(t->model_.prediction);
  TS_ASSIGN_OR_RETURN(t->eval_program_, ForwardProgram(t->model_.main, targets));
  const int num_places = t->options_.place_registries.empty()
                             ? t->options_.cpu_places
                             : static_cast<int>(t->options_.place_registries.size());
  // A sync step's receive rides on its send where the program allows (not on device places,
  // whose parameters are copied to the devices after the receive).
  t->run_program_ = t->model_.main;
  // (Not on a GPU place, whose step ends by copying to the host: after_run.)
  if (num_places == 1 && t->options_.place_registries.empty() && !t->options_.after_run &&
      t->options_.send_early_bytes > 0) {
    const EarlySend early =
        SendEarly(t->run_program_.mutable_blocks(0), t->options_.send_early_bytes);
    if (early.index < 0) {
      t->log() << "early send: none (no sync send with a barrier, or backward completes fewer "
               << "than " << t->options_.send_early_bytes
               << " bytes of dense gradients before its last op)\n";
    } else {
      const BlockDesc& run = t->run_program_.blocks(0);
      t->log() << "early send: " << early.blocks << " dense gradient blocks ("
               << (early.bytes + 1023) / 1024 << " KiB) go out after op " << early.index - 1
               << " of " << run.ops_size() << " (" << run.ops(early.index - 1).type()
               << "), during backward\n";
    }
  }
  if (t->options_.place_registries.empty()) {
    t->folded_recv_ =
        FoldReceive(t->run_program_.mutable_blocks(0), t->options_.fold_async_receive);
  }
  TS_ASSIGN_OR_RETURN(t->main_block_, t->executor_.Prepare(t->run_program_, 0));
  TS_ASSIGN_OR_RETURN(t->eval_block_, t->executor_.Prepare(t->eval_program_, 0));
  absl::Status s = t->executor_.Run(t->model_.startup, 0, &t->scope_);
  if (s.ok() && t->options_.after_run) s = t->options_.after_run(&t->scope_);
  if (!s.ok()) {
    return absl::Status(s.code(), absl::StrCat("startup program: ", s.message()));
  }
  if (t->options_.prefetch_ahead && num_places == 1 && !t->options_.after_run) {
    // (The block run: an early send may have been put into it.)
    const BlockDesc& run = t->run_program_.blocks(0);
    std::tie(t->head_end_, t->tail_begin_) = AheadSplit(run);
    const bool async =
        t->tail_begin_ > 0 && !GetBoolAttr(run.ops(t->tail_begin_ - 1), "sync_mode", true);
    // Async pipelines only when the lookups can ride on the receive: sent by themselves from
    // the look-ahead they would overtake the step's push.
    if (t->head_end_ > 0 && PipelinedSend(run, t->tail_begin_) &&
        (!async || (t->options_.lookup_riders != nullptr && t->head_end_ == 1))) {
      t->async_ = async;
      t->pipelined_program_ = t->run_program_;
      BlockDesc* b = t->pipelined_program_.mutable_blocks(0);
      // Sync: the lookups and the receives wait on the pservers for the step's update instead.
      if (!async) {
        for (int i = 0; i < t->head_end_; ++i) SetAttr(b->mutable_ops(i), "after_update", true);
      }
      // The lookup op's requests ride on the step's request: only a block's single one (a later
      // one would go out only once the first got its answer, with the step's reply). Sync: only
      // with several trainers, whose shared pservers' CPU gains (2x2 CTR 5-10% faster); with
      // one trainer the lookups' own request costs the otherwise idle pserver little, and its
      // early answer (once the tables are applied) overlaps the dense update; riding did not
      // pay there (tests/bench/RESULTS.md). Async: always, on the receive that follows the push
      // (one request per pserver besides the push instead of two).
      t->ride_ = t->options_.lookup_riders != nullptr && t->head_end_ == 1 &&
                 (async || (t->options_.num_replicas > 1 && t->folded_recv_ == t->tail_begin_));
      if (t->ride_) SetAttr(b->mutable_ops(0), "ride_on_step", true);
      // Async with the receive folded into the push, the push takes them.
      if (async && t->folded_recv_ != t->tail_begin_) {
        SetAttr(b->mutable_ops(t->tail_begin_), "takes_lookups", true);
      }
      t->defer_ = !t->ride_ && t->options_.deferred_lookups != nullptr;
      if (t->defer_) {
        for (int i = 0; i < t->head_end_; ++i) SetAttr(b->mutable_ops(i), "complete_later", true);
        t->deferred_wait_.pending = t->options_.deferred_lookups;
      }
      for (int i = t->tail_begin_; i < b->ops_size() && !async; ++i) {
        if (b->ops(i).type() == "recv") SetAttr(b->mutable_ops(i), "after_update", true);
      }
      TS_ASSIGN_OR_RETURN(t->pipelined_block_, t->executor_.Prepare(t->pipelined_program_, 0));
      t->pipelined_ = true;
    }
    // Pipelined: the next batch's lookups and the step's receives, each on its own thread.
    if (t->head_end_ > 0) t->ahead_ = std::make_unique<ThreadPool>(t->pipelined_ ? 2 : 1);
  }
  if (num_places > 1 || !t->options_.place_registries.empty()) {
    PlaceRunnerOptions po;
    po.num_places = num_places;
    po.loss = t->model_.loss;
    if (!t->model_.prediction.empty()) po.concat = {t->model_.prediction, t->model_.feeds.label};
    for (const OpRegistry* r : t->options_.place_registries) {
      t->place_executors_.push_back(std::make_unique<Executor>(r));
      po.place_executors.push_back(t->place_executors_.back().get());
    }
    po.after_place = t->options_.place_after_run;
    po.reducer = t->options_.place_reducer;
    // The places' runner steps the program with the folded recv taken out.
    ProgramDesc stepped = t->run_program_;
    if (t->folded_recv_ >= 0) {
      stepped.mutable_blocks(0)->mutable_ops()->DeleteSubrange(t->folded_recv_, 1);
    }
    auto runner = PlaceRunner::Create(&t->executor_, stepped, std::move(po), &t->scope_);
    if (!runner.ok()) {
      return absl::Status(runner.status().code(),
                          absl::StrCat("LocalTrainer: cpu_places=", t->options_.cpu_places, ": ",
                                       runner.status().message()));
    }
    t->places_ = std::move(*runner);
  }
  return t;
}

std::ostream& LocalTrainer::log() const {
  return options_.log != nullptr ? *options_.log : std::cout;
}

absl::StatusOr<double> LocalTrainer::ReadLoss() const {
  const Variable* v = scope_.FindVar(model_.loss);
  const Tensor* t = v == nullptr ? nullptr : v->GetIf<Tensor>();
  if (t == nullptr || !t->initialized() || t->numel() < 1 ||
      (t->dtype() != FLOAT32 && t->dtype() != FLOAT64)) {
    return absl::InternalError(
        absl::StrCat("loss variable '", model_.loss, "' is not a float tensor after the step",
                     t == nullptr ? "" : absl::StrCat(" (it is ", t->DebugString(), ")")));
  }
  return ValueAt(*t, 0);
}

template <typename Data>
absl::StatusOr<std::vector<EpochStats>> LocalTrainer::TrainEpochs(const Data& data) {
  std::vector<EpochStats> all;
  epochs_target_ = epoch_ + options_.epochs;
  for (int e = 0; e < options_.epochs; ++e) {
    TS_ASSIGN_OR_RETURN(EpochStats stats, TrainEpoch(data));
    all.push_back(stats);
  }
  return all;
}

absl::StatusOr<std::vector<EpochStats>> LocalTrainer::Train(const data::Dataset& train) {
  return TrainEpochs(train);
}

void LocalTrainer::ResumeAt(const TrainPosition& position) {
  global_step_ = position.global_step;
  epoch_ = position.epoch;
  skip_steps_ = position.step_in_epoch;
}

// The running statistics of one epoch.
struct LocalTrainer::EpochRun {
  EpochStats stats;
  double loss_sum = 0;
  double interval_loss = 0;
  int64_t interval_steps = 0;
  int64_t interval_samples = 0;
  std::optional<data::StreamingAuc> interval_auc;
  Clock::time_point start;
  Clock::time_point interval_start;
  int64_t step_in_epoch = 0;    // steps of this epoch run so far (skipped ones included)
  int64_t steps_per_epoch = -1;  // for the ETA; -1: unknown (streamed data)
};

LocalTrainer::EpochRun LocalTrainer::BeginEpoch() {
  epochs_target_ = std::max(epochs_target_, epoch_ + 1);
  EpochRun run;
  run.stats.epoch = epoch_;
  staged_ = false;  // a staged batch belongs to the step after it in the same epoch
  if (!model_.prediction.empty() && model_.feeds.label_dtype == FLOAT32 &&
      options_.log_every_steps > 0) {
    auto auc = data::StreamingAuc::Create(1023);
    if (auc.ok()) run.interval_auc = std::move(*auc);
  }
  run.start = run.interval_start = Clock::now();
  return run;
}

absl::Status LocalTrainer::RunSteps(const PreparedBlock& block, int begin, int end,
                                    Scope* scope) {
  if (folded_recv_ < begin || folded_recv_ >= end) {
    return executor_.RunOps(block, begin, end, scope);
  }
  TS_RETURN_IF_ERROR(executor_.RunOps(block, begin, folded_recv_, scope));
  return executor_.RunOps(block, folded_recv_ + 1, end, scope);
}

absl::Status LocalTrainer::RunPipelined(int64_t next_size, const FeedFn& next_feed) {
  const int n = run_program_.blocks(0).ops_size();
  executor_.CreateVariables(main_block_, &scope_);
  const bool looked_up = staged_;
  staged_ = false;
  // A request in flight from an earlier step that failed: nothing may run beside it.
  if (in_flight_ != nullptr) {
    in_flight_->lookups_done.WaitForNotification();
    in_flight_->received_done.WaitForNotification();
    if (defer_) options_.deferred_lookups->Wait().IgnoreError();
  }
  auto flight = std::make_shared<InFlight>();
  in_flight_ = flight;
  const bool ahead = next_feed != nullptr && next_size > 0;
  if (ahead) {
    // The next batch is fed beside the compute; its lookups go out then (ride_: with the
    // send) and are answered once the pservers applied this step.
    if (ride_) options_.lookup_riders->Expect();
    ahead_->Schedule([this, flight, next_size, next_feed] {
      flight->lookups = next_feed(0, next_size, &staging_);
      if (flight->lookups.ok()) {
        flight->lookups = executor_.RunOps(pipelined_block_, 0, head_end_, &staging_);
      }
      if (ride_) options_.lookup_riders->Withdraw();  // they never came (the send must not wait)
      flight->lookups_done.Notify();
    });
  } else {
    flight->lookups_done.Notify();
  }
  absl::Status s = RunSteps(main_block_, looked_up ? head_end_ : 0, tail_begin_ - 1, &scope_);
  if (s.ok() && folded_recv_ == tail_begin_) {
    flight->received_done.Notify();
    // The send, with the step's receive (the op after it) folded in; then what follows the
    // receive (the concats of sliced parameters), which reads what the send received.
    s = executor_.RunOps(pipelined_block_, tail_begin_ - 1, tail_begin_, &scope_);
    if (s.ok() && tail_begin_ + 1 < n) {
      s = executor_.RunOps(pipelined_block_, tail_begin_ + 1, n, &scope_);
    }
  } else if (s.ok() && async_) {
    // The push (handed to the communicator), then the receive, which takes the next batch's
    // lookups: after the push, as a receive and lookups unpipelined go.
    s = executor_.RunOps(pipelined_block_, tail_begin_ - 1, tail_begin_, &scope_);
    if (s.ok()) s = RunSteps(pipelined_block_, tail_begin_, n, &scope_);
    flight->received_done.Notify();
  } else if (s.ok()) {
    ahead_->Schedule([this, flight, n] {
      flight->received = RunSteps(pipelined_block_, tail_begin_, n, &scope_);
      flight->received_done.Notify();
    });
    s = executor_.RunOps(pipelined_block_, tail_begin_ - 1, tail_begin_, &scope_);  // the send
  } else {
    flight->received_done.Notify();
  }
  // Lookups the send did not take: the step failed before its send (they get its error).
  if (ride_) options_.lookup_riders->Release(s);
  // On an error the requests in flight may wait on the pservers until the job fails (this
  // trainer's caller aborts it): they are not waited for here.
  TS_RETURN_IF_ERROR(s);
  flight->received_done.WaitForNotification();
  flight->lookups_done.WaitForNotification();
  if (defer_) {  // the rows, stored by the last reply's thread
    absl::Status stored = options_.deferred_lookups->Wait();
    if (flight->lookups.ok()) flight->lookups = stored;
  }
  in_flight_ = nullptr;
  TS_RETURN_IF_ERROR(flight->received);
  TS_RETURN_IF_ERROR(flight->lookups);
  staged_ = ahead;
  return absl::OkStatus();
}

absl::Status LocalTrainer::RunAhead(int64_t next_size, const FeedFn& next_feed,
                                    const std::function<bool()>& ends) {
  // Data in memory: whether a next batch exists is known before the step.
  if (pipelined_ && ends == nullptr) return RunPipelined(next_size, next_feed);
  const BlockDesc& block = run_program_.blocks(0);
  executor_.CreateVariables(main_block_, &scope_);
  const bool looked_up = staged_;
  staged_ = false;
  TS_RETURN_IF_ERROR(RunSteps(main_block_, looked_up ? head_end_ : 0, tail_begin_, &scope_));
  // The send has returned (sync: every pserver applied this step): the next batch's lookups
  // see what they would see at the next step's start. Not when the epoch ends here.
  const bool ahead = next_feed != nullptr && next_size > 0 && !(ends && ends());
  absl::Status looked;
  absl::Notification done;
  if (ahead) {
    TS_RETURN_IF_ERROR(next_feed(0, next_size, &staging_));
    ahead_->Schedule([&] {
      looked = executor_.RunOps(main_block_, 0, head_end_, &staging_);
      done.Notify();
    });
  }
  absl::Status received = RunSteps(main_block_, tail_begin_, block.ops_size(), &scope_);
  if (ahead) done.WaitForNotification();
  TS_RETURN_IF_ERROR(received);
  TS_RETURN_IF_ERROR(looked);
  staged_ = ahead;
  return absl::OkStatus();
}

absl::Status LocalTrainer::RunStep(int64_t size, FeedFn feed, const std::function<bool()>& ends,
                                   EpochRun* run, int64_t next_size, FeedFn next_feed) {
  if (places_ != nullptr) {  // the local batch split across cpu_places
    if (options_.before_step) options_.before_step(global_step_);
    TS_RETURN_IF_ERROR(places_->Step(size, feed));
  } else if (head_end_ > 0) {
    if (staged_) {
      // Fed and looked up during the previous step: swap it in (tensors keep their buffers).
      if (staging_.ChainVersion() != staged_version_) {  // its variables, listed once
        staged_names_ = staging_.LocalVarNames();
        staged_version_ = staging_.ChainVersion();
      }
      for (const std::string& name : staged_names_) {
        staging_.FindLocalVar(name)->Swap(*scope_.Var(name));
      }
    } else {
      TS_RETURN_IF_ERROR(feed(0, size, &scope_));
    }
    if (options_.before_step) options_.before_step(global_step_);
    TS_RETURN_IF_ERROR(RunAhead(next_size, next_feed, ends));
  } else {
    TS_RETURN_IF_ERROR(feed(0, size, &scope_));
    if (options_.before_step) options_.before_step(global_step_);
    if (folded_recv_ >= 0) {
      executor_.CreateVariables(main_block_, &scope_);
      TS_RETURN_IF_ERROR(RunSteps(main_block_, 0, run_program_.blocks(0).ops_size(), &scope_));
    } else {
      TS_RETURN_IF_ERROR(executor_.Run(main_block_, &scope_));
    }
  }
  if (options_.after_run) TS_RETURN_IF_ERROR(options_.after_run(&scope_));
  TS_ASSIGN_OR_RETURN(double loss, ReadLoss());
  if (options_.after_step) options_.after_step(global_step_, loss, size);
  ++global_step_;
  ++run->step_in_epoch;
  if (!std::isfinite(loss)) {
    return absl::FailedPreconditionError(
        absl::StrCat("step ", global_step_, " (epoch ", epoch_, "): loss '", model_.loss, "' is ",
                     loss, "; training diverged — lower the learning rate"));
  }
  if (options_.on_step_end) {
    // A step known to end the epoch reports the next epoch's start, so that a checkpoint taken
    // here resumes there (streamed data: only then is the end known).
    const bool last = ends && ends();
    TS_RETURN_IF_ERROR(options_.on_step_end(
        last ? TrainPosition{global_step_, epoch_ + 1, 0}
             : TrainPosition{global_step_, epoch_, run->step_in_epoch}));
  }
  run->loss_sum += loss * size;
  run->stats.samples += size;
  ++run->stats.steps;
  run->interval_loss += loss;
  ++run->interval_steps;
  run->interval_samples += size;
  if (run->interval_auc.has_value()) {  // the live AUC of the interval's training batches
    const Variable* pred = scope_.FindVar(model_.prediction);
    const Variable* label = scope_.FindVar(model_.feeds.label);
    if (pred != nullptr && label != nullptr && pred->Is<Tensor>() && label->Is<Tensor>() &&
        pred->Get<Tensor>().dtype() == FLOAT32 && label->Get<Tensor>().dtype() == FLOAT32 &&
        pred->Get<Tensor>().numel() == label->Get<Tensor>().numel()) {
      const Tensor& p = pred->Get<Tensor>();
      const Tensor& l = label->Get<Tensor>();
      run->interval_auc
          ->Update(absl::MakeConstSpan(p.data<float>(), p.numel()),
                   absl::MakeConstSpan(l.data<float>(), l.numel()))
          .IgnoreError();
    }
  }
  if (options_.log_every_steps > 0 && global_step_ % options_.log_every_steps == 0) {
    const double secs = SecondsSince(run->interval_start);
    log() << absl::StrFormat("step %d loss %.6g samples/s %.0f", global_step_,
                             run->interval_loss / run->interval_steps,
                             secs > 0 ? run->interval_samples / secs : 0.0);
    if (run->steps_per_epoch >= 0) {
      // ETA of this Train() call: steps left in this epoch and the epochs still to run.
      const int64_t left =
          (run->steps_per_epoch - run->stats.steps) +
          run->steps_per_epoch * std::max<int64_t>(0, epochs_target_ - epoch_ - 1);
      log() << absl::StrFormat(" eta %.0fs", left * secs / run->interval_steps);
    }
    if (run->interval_auc.has_value()) {
      log() << absl::StrFormat(" auc %.4f", run->interval_auc->Compute());
      run->interval_auc->Reset();
    }
    log() << "\n";
    run->interval_loss = 0;
    run->interval_steps = run->interval_samples = 0;
    run->interval_start = Clock::now();
  }
  return absl::OkStatus();
}

EpochStats LocalTrainer::EndEpoch(EpochRun* run) {
  EpochStats& stats = run->stats;
  stats.seconds = SecondsSince(run->start);
  stats.mean_loss = stats.samples > 0 ? run->loss_sum / static_cast<double>(stats.samples) : 0.0;
  stats.samples_per_sec = stats.seconds > 0 ? stats.samples / stats.seconds : 0.0;
  log() << absl::StrFormat("epoch %d mean loss %.6g samples %d samples/s %.0f seconds %.2f\n",
                           stats.epoch, stats.mean_loss, stats.samples, stats.samples_per_sec,
                           stats.seconds);
  log().flush();
  ++epoch_;
  return stats;
}

absl::StatusOr<EpochStats> LocalTrainer::TrainEpoch(const data::Dataset& train) {
  const int64_t n = static_cast<int64_t>(train.examples.size());
  if (n == 0) return absl::InvalidArgumentError("LocalTrainer: the training data set is empty");
  data::DistributedSamplerOptions so;
  so.num_samples = n;
  so.num_replicas = 1;
  so.rank = 0;
  so.shuffle = options_.shuffle;
  so.seed = options_.seed;
  TS_ASSIGN_OR_RETURN(data::DistributedSampler sampler, data::DistributedSampler::Create(so));
  sampler.SetEpoch(epoch_);
  const std::vector<int64_t> order = sampler.Indices();
  TS_ASSIGN_OR_RETURN(data::BatchSharder sharder,
                      data::BatchSharder::Create(options_.num_replicas, options_.rank));
  const absl::Span<const int64_t> all(order);
  const absl::Span<const data::Example> examples(train.examples);

  EpochRun run = BeginEpoch();
  run.steps_per_epoch =
      (static_cast<int64_t>(order.size()) + options_.batch_size - 1) / options_.batch_size;
  const int64_t skip = skip_steps_;
  skip_steps_ = 0;
  // This trainer's share of the global batch at `begin`; empty when there is no such step.
  auto local_at = [&](int64_t begin) -> absl::Span<const int64_t> {
    if (begin >= static_cast<int64_t>(order.size())) return {};
    const int64_t global = std::min<int64_t>(options_.batch_size, order.size() - begin);
    if (global < options_.num_replicas) return {};
    const data::ShardRange shard = sharder.ShardOf(global, options_.rank);
    return all.subspan(begin + shard.begin, shard.size());
  };
  auto feed_of = [&](absl::Span<const int64_t> local) -> FeedFn {
    return [this, examples, local](int64_t b, int64_t count, Scope* scope) {
      return feeder_.Feed(examples, local.subspan(b, count), scope);
    };
  };
  for (int64_t begin = 0;; begin += options_.batch_size) {
    const absl::Span<const int64_t> local = local_at(begin);
    if (local.empty()) break;
    if (run.step_in_epoch < skip) {  // resumed: run before the checkpoint
      ++run.step_in_epoch;
      continue;
    }
    const absl::Span<const int64_t> next = local_at(begin + options_.batch_size);
    TS_RETURN_IF_ERROR(RunStep(static_cast<int64_t>(local.size()), feed_of(local), nullptr, &run,
                               static_cast<int64_t>(next.size()), feed_of(next)));
  }
  return EndEpoch(&run);
}

absl::StatusOr<std::vector<EpochStats>> LocalTrainer::Train(const StreamFactory& streams) {
  return TrainEpochs(streams);
}

absl::StatusOr<EpochStats> LocalTrainer::TrainEpoch(const StreamFactory& streams) {
  TS_ASSIGN_OR_RETURN(data::BatchSharder sharder,
                      data::BatchSharder::Create(options_.num_replicas, options_.rank));
  const int64_t local = sharder.Shard(options_.batch_size).size();
  if (local == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("LocalTrainer: a global batch of ", options_.batch_size, " leaves trainer ",
                     options_.rank, " of ", options_.num_replicas, " no example"));
  }
  TS_ASSIGN_OR_RETURN(std::unique_ptr<data::ExampleStream> stream, streams(epoch_));
  EpochRun run = BeginEpoch();
  const int64_t skip = skip_steps_;
  skip_steps_ = 0;
  if (skip > 0) {  // resumed: the examples of the steps before the checkpoint
    TS_ASSIGN_OR_RETURN(const int64_t skipped, stream->Skip(skip * local));
    if (skipped < skip * local) {
      return absl::FailedPreconditionError(absl::StrCat(
          "resuming epoch ", epoch_, " at its step ", skip, " needs ", skip * local,
          " examples of trainer ", options_.rank, "'s data, which holds only ", skipped,
          ": did the data files or the batch size change since the checkpoint?"));
    }
    run.step_in_epoch = skip;
  }
  std::vector<data::Example> batch, next;
  TS_ASSIGN_OR_RETURN(int64_t size, stream->NextBatch(local, &batch));
  if (size == 0 && skip == 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "epoch ", epoch_, ": trainer ", options_.rank, " has no training example to read"));
  }
  while (size > 0) {
    // The batch after this one: whether there is one tells the other trainers (sync) before
    // this step ends; its examples parse in the background meanwhile.
    TS_ASSIGN_OR_RETURN(const int64_t next_size, stream->NextBatch(local, &next));
    const bool last = next_size == 0;
    if (options_.before_stream_step) options_.before_stream_step(last);
    bool ends = last;
    auto epoch_ends = [&] {
      if (options_.stream_epoch_ends && options_.stream_epoch_ends()) ends = true;
      return ends;
    };
    const absl::Span<const data::Example> examples(batch.data(), static_cast<size_t>(size));
    const absl::Span<const data::Example> following(next.data(), static_cast<size_t>(next_size));
    TS_RETURN_IF_ERROR(RunStep(
        size,
        [&](int64_t b, int64_t count, Scope* scope) {
          return feeder_.Feed(examples.subspan(b, count), scope);
        },
        epoch_ends, &run, next_size,
        [&](int64_t b, int64_t count, Scope* scope) {
          return feeder_.Feed(following.subspan(b, count), scope);
        }));
    if (epoch_ends()) {
      if (!last) {
        log() << "trainer " << options_.rank << ": epoch " << epoch_
              << " ended when another trainer ran out of data; the rest of this trainer's share "
                 "was not read (more files, or a file count that is a multiple of the trainers, "
                 "leave less behind)\n";
      }
      break;
    }
    std::swap(batch, next);
    size = next_size;
  }
  return EndEpoch(&run);
}

absl::Status LocalTrainer::Score(
    absl::Span<const data::Example> examples, double* loss_sum, int64_t* correct,
    int64_t* classes, const std::function<void(const data::Example&, double)>& binary_score) {
  const int64_t n = static_cast<int64_t>(examples.size());
  const bool with_prediction = !model_.prediction.empty();
  *classes = 0;  // the prediction's width, from its first batch
  for (int64_t begin = 0; begin < n; begin += options_.batch_size) {
    const int64_t size = std::min<int64_t>(options_.batch_size, n - begin);
    const absl::Span<const data::Example> batch = examples.subspan(begin, size);
    TS_RETURN_IF_ERROR(feeder_.Feed(batch, &scope_));
    TS_RETURN_IF_ERROR(executor_.Run(eval_block_, &scope_));
    if (options_.after_run) TS_RETURN_IF_ERROR(options_.after_run(&scope_));
    TS_ASSIGN_OR_RETURN(double loss, ReadLoss());
    *loss_sum += loss * size;
    if (!with_prediction) continue;
    const Variable* v = scope_.FindVar(model_.prediction);
    const Tensor* p = v == nullptr ? nullptr : v->GetIf<Tensor>();
    if (*classes == 0 && p != nullptr && p->initialized() && size > 0) *classes = p->numel() / size;
    if (p == nullptr || !p->initialized() || *classes < 1 || p->numel() != size * *classes ||
        (p->dtype() != FLOAT32 && p->dtype() != FLOAT64)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "prediction '", model_.prediction, "' must be a float [", size, ", 1] or [", size,
          ", classes] tensor, got ", p == nullptr ? std::string("nothing") : p->DebugString()));
    }
    for (int64_t i = 0; i < size; ++i) {
      const data::Example& example = batch[static_cast<size_t>(i)];
      const float label = example.label;
      if (*classes == 1) {
        const float prob = static_cast<float>(ValueAt(*p, i));
        binary_score(example, prob);
        *correct += (prob >= 0.5f) == (label >= 0.5f);
        continue;
      }
      const int64_t k = static_cast<int64_t>(label);
      if (k < 0 || k >= *classes || static_cast<float>(k) != label) {
        return absl::InvalidArgumentError(
            absl::StrCat("example ", begin + i, " has label ", label, ", not a class of the ",
                         *classes, " scores of prediction '", model_.prediction, "'"));
      }
      *correct += p->dtype() == FLOAT32
                      ? TopKCorrect(p->data<float>() + i * *classes, *classes, k, 1)
                      : TopKCorrect(p->data<double>() + i * *classes, *classes, k, 1);
    }
  }
  return absl::OkStatus();
}

bool LocalTrainer::ReportsMetric(const char* metric) const {
  return !model_.prediction.empty() &&
         std::find(model_.metrics.begin(), model_.metrics.end(), metric) != model_.metrics.end();
}

absl::StatusOr<EvalResult> LocalTrainer::Evaluate(const data::Dataset& dataset) {
  const int64_t n = static_cast<int64_t>(dataset.examples.size());
  if (n == 0) return absl::InvalidArgumentError("LocalTrainer: the evaluation data set is empty");
  const bool binary_accuracy = ReportsMetric("accuracy");
  std::vector<float> predictions, labels;
  int64_t classes = 0, correct = 0;
  double loss_sum = 0;
  TS_RETURN_IF_ERROR(Score(dataset.examples, &loss_sum, &correct, &classes,
                           [&](const data::Example& e, double prob) {
                             predictions.push_back(static_cast<float>(prob));
                             labels.push_back(e.label);
                           }));
  EvalResult result;
  if (classes > 1 || (classes == 1 && binary_accuracy)) {
    result.has_accuracy = true;
    result.accuracy = static_cast<double>(correct) / static_cast<double>(n);
  }
  result.samples = n;
  result.mean_loss = loss_sum / static_cast<double>(n);
  if (classes == 1) {
    absl::StatusOr<double> auc =
        data::ExactAuc(absl::Span<const float>(predictions), absl::Span<const float>(labels));
    if (auc.ok()) {
      result.has_auc = true;
      result.auc = *auc;
    } else if (auc.status().code() != absl::StatusCode::kFailedPrecondition) {
      return absl::Status(
          auc.status().code(),
          absl::StrCat("AUC of prediction '", model_.prediction, "': ", auc.status().message()));
    }  // else: one class only, AUC undefined
  }
  return result;
}

absl::StatusOr<EvalPartial> LocalTrainer::EvaluatePartial(
    const data::Dataset& dataset, int64_t begin, int64_t end,
    const std::function<void(const data::Example&, double)>& on_prediction) {
  const int64_t n = static_cast<int64_t>(dataset.examples.size());
  if (begin < 0 || end < begin || end > n) {
    return absl::InvalidArgumentError(absl::StrCat("evaluation range [", begin, ", ", end,
                                                   ") of a data set of ", n, " examples"));
  }
  // What a partial measures follows from the model's metrics, never from the share, so that
  // every trainer's partial has the same shape (an empty share included): an AUC histogram
  // with "auc" (the prediction must then be a probability), accuracy with "accuracy" (top-1 of
  // class scores, or a [B, 1] prediction rounded at 0.5).
  EvalPartial partial;
  partial.has_auc_histogram = ReportsMetric("auc");
  partial.has_accuracy = ReportsMetric("accuracy");
  int64_t classes = 0;
  absl::Status bad;
  TS_RETURN_IF_ERROR(Score(absl::Span<const data::Example>(dataset.examples).subspan(
                               static_cast<size_t>(begin), static_cast<size_t>(end - begin)),
                           &partial.loss_sum, &partial.correct, &classes,
                           [&](const data::Example& e, double prob) {
                             if (on_prediction) on_prediction(e, prob);
                             if (!partial.has_auc_histogram || !bad.ok()) return;
                             bad = partial.auc.Update(absl::Span<const double>(&prob, 1),
                                                      absl::Span<const float>(&e.label, 1));
                           }));
  if (!bad.ok()) {
    return absl::Status(bad.code(), absl::StrCat("AUC of prediction '", model_.prediction,
                                                 "': ", bad.message()));
  }
  if (partial.has_auc_histogram && classes > 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "the model asks for an AUC, but its prediction '", model_.prediction, "' has ", classes,
        " class scores per example (AUC needs one probability)"));
  }
  partial.samples = end - begin;
  return partial;
}

}  // namespace tessera
