// LocalTrainer: single-machine training of a ModelSpec on an in-memory data set.
//
// Create() prepares the programs and runs the startup program once. Each epoch visits the data
// set in the order of a DistributedSampler with one replica (shuffled with seed + epoch when
// Options::shuffle), in batches of batch_size (the last one may be smaller); each step feeds the
// batch, runs the main program and reads the loss. Every log_every_steps steps it writes
//   step N loss L samples/s S eta Ts [auc A]
// (L: mean loss of the steps since the previous line, S: their throughput, T: the estimated
// seconds left in the running Train() call, A: the AUC of those steps' training batches when
// the model names a prediction) and after each epoch
//   epoch E mean loss L samples S samples/s S' seconds T
// to Options::log. Evaluate() runs only the forward ops that compute the loss and the
// prediction (a pruned clone of the main program, see ForwardProgram) and returns the mean loss
// and, when the model names a prediction, the AUC.
//
// Not thread-safe. The registry passed to Create must outlive the trainer.
#ifndef TESSERA_TRAINER_LOCAL_TRAINER_H_
#define TESSERA_TRAINER_LOCAL_TRAINER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/notification.h"
#include "common/base/thread_pool.h"
#include "common/data/example.h"
#include "common/data/stream.h"
#include "common/framework/executor.h"
#include "common/framework/model_spec.h"
#include "common/framework/op_registry.h"
#include "common/framework/scope.h"
#include "proto/program.pb.h"
#include "trainer/evaluation.h"
#include "trainer/feeder.h"
#include "trainer/lookup_riders.h"
#include "trainer/pending_requests.h"
#include "trainer/places.h"

namespace tessera {

// Where training stands: steps run so far, and the epoch and the step within it that run next
// (the data position: every epoch's order depends only on seed + epoch).
struct TrainPosition {
  int64_t global_step = 0;
  int64_t epoch = 0;
  int64_t step_in_epoch = 0;
};

struct LocalTrainerOptions {
  int64_t batch_size = 32;        // >= 1
  int epochs = 1;                 // epochs Train() runs (>= 0)
  int64_t log_every_steps = 100;  // 0: no per-step lines
  uint64_t seed = 0;              // shuffle seed (epoch e uses seed + e)
  bool shuffle = true;
  std::ostream* log = nullptr;  // where progress lines go; nullptr: std::cout
  // Distributed training: batch_size is the global batch; every replica visits the same global
  // order and trains on its share (data::BatchSharder) of each global batch, so N replicas of a
  // sync job together see exactly what one single-machine trainer sees. Global batches smaller
  // than num_replicas are skipped (a replica would get no example).
  int num_replicas = 1;
  int rank = 0;
  // Places (threads) each step's local batch is split across (see trainer/places.h): each runs
  // the forward and backward ops on its share, their gradients are combined weighted by the
  // shares, and the rest of the program runs once, so any K trains like K = 1. >= 1.
  int cpu_places = 1;
  // Device places (several GPUs in one trainer, trainer/device_setup.h): one placed registry
  // per place (they must outlive the trainer). Non-empty: the step runs on these places as on
  // cpu_places of the same count (cpu_places must be 1), each place with its own copy of the
  // parameters; place_after_run runs in each place's thread after its part of the step.
  std::vector<const OpRegistry*> place_registries;
  std::function<absl::Status(int place, Scope* place_scope)> place_after_run;
  // Combines the places' gradients, loss and fetches (cpu_places > 1 or place_registries);
  // nullptr: a CpuPlaceReducer. Device placement sets an NcclPlaceReducer for several GPUs in
  // a --config=cuda build (trainer/device_setup.h). Shared: the trainer keeps it alive.
  std::shared_ptr<PlaceReducer> place_reducer;
  // Called before each step with the 0-based global step (e.g. to stamp RPC requests).
  std::function<void(int64_t)> before_step;
  // Called after each step with the 0-based global step, its loss and its (local) samples.
  std::function<void(int64_t, double, int64_t)> after_step;
  // Called after each step (and after_step) with the position after it (e.g. to checkpoint);
  // an error stops training with that error.
  std::function<absl::Status(const TrainPosition&)> on_step_end;
  // Called after every program run (startup, each training and evaluation step), before the
  // host reads the loss or prediction. Device placement uses it to bring fetched variables to
  // the host and to release the feeds there (trainer/device_setup.h); empty: nothing.
  std::function<absl::Status(Scope*)> after_run;
  // Streamed data in sync mode (Train(StreamFactory)): called before each step with whether
  // this trainer has no batch after it, and after the step's run: whether some trainer had
  // none, which ends the epoch for every trainer. Empty: a trainer's epoch ends with its data.
  std::function<void(bool last)> before_stream_step;
  std::function<bool()> stream_epoch_ends;
  // Double buffering (PS mode). While a step's trailing recv / fetch_barrier ops run, the next
  // batch is fed into a second scope and the block's leading prefetch ops (the distributed
  // table lookups) run for it on another thread; the next step swaps that batch in and starts
  // at its compute. The lookups start only after the step's send (and its barrier) returned,
  // i.e. after every pserver applied the step, which is when they would start at the next
  // step anyway: a sync job trains exactly as without it. Inert unless the main block starts
  // with prefetch ops that read only fed variables and ends with recv ops (perhaps followed by
  // the concats of sliced parameters), cpu_places is 1 and after_run is empty. A traced step shows
  // the next step's prefetch beside its recv.
  bool prefetch_ahead = false;
  // Gradients out as backward produces them (sync PS mode, one place; 0: off). The step's send
  // (the sync send carrying the send barrier) is split in two: the dense gradient blocks that
  // backward completes first, once they reach this many bytes, go out at that point in an
  // early send (one request per pserver holding some of them) while backward goes on; the
  // step's send carries the rest and waits for them to have been received. Nothing else
  // changes (a sync job trains exactly as without it). Inert when backward completes its dense
  // gradients only at its end or they are fewer bytes, with several places and with after_run
  // (a GPU place). One more request per pserver and step (more where those gradients exceed
  // the client's chunk size).
  int64_t send_early_bytes = 0;
  // Async: fold each step's receive into its push (a send without barrier followed by a recv;
  // one request per pserver, SendGetBatch, answered once the pserver applied the gradients).
  // Only for a trainer that reads its own writes (its step waits for its push anyway); the push
  // then bypasses the RPC context's communicator.
  bool fold_async_receive = false;
  // Pipelined prefetch_ahead with the step's receive folded into its send, one lookup op and
  // num_replicas > 1: where the next batch's lookups meet that send, which carries them (one
  // request per pserver and step). Must be the RpcContext::lookup_riders of the registry's RPC
  // ops. nullptr: the lookups go in their own requests.
  LookupRiders* lookup_riders = nullptr;
  // Pipelined prefetch_ahead whose lookups do not ride on the send: the RpcContext::
  // deferred_lookups of the registry's RPC ops. The lookups' op then returns once its requests
  // are out (attr complete_later) and the thread of the last reply stores the rows; the step
  // waits for them here before it ends, so no look-ahead thread wakes only to copy them and
  // then wake the step. nullptr: the look-ahead thread waits for the rows.
  PendingRequests* deferred_lookups = nullptr;
};

struct EpochStats {
  int64_t epoch = 0;  // 0-based
  int64_t steps = 0;
  int64_t samples = 0;
  double mean_loss = 0;  // sample-weighted mean of the batch losses
  double seconds = 0;
  double samples_per_sec = 0;
};

// The forward part of block 0 of `main` needed to compute `targets`: the ops without a backward,
// optimize, RPC, distributed or LR-schedule role on which a target depends, in program order,
// and the variables they use, with every op that behaves differently in inference (dropout,
// batch_norm) switched to it (attr is_test). NotFound if a target is not produced by any such op.
absl::StatusOr<ProgramDesc> ForwardProgram(const ProgramDesc& main,
                                           const std::vector<std::string>& targets);

class LocalTrainer {
 public:
  using Options = LocalTrainerOptions;

  // Checks the options and the feed spec against the main program, prepares the main and
  // evaluation programs and runs the startup program in a fresh scope. InvalidArgument names
  // the bad option or variable; a failing startup op is reported as the executor reports it.
  static absl::StatusOr<std::unique_ptr<LocalTrainer>> Create(const OpRegistry* registry,
                                                              ModelSpec model, Options options);

  // Streamed data (common/data/stream.h): the stream this trainer reads in epoch `epoch`.
  using StreamFactory =
      std::function<absl::StatusOr<std::unique_ptr<data::ExampleStream>>(int64_t epoch)>;

  // Runs Options::epochs epochs (continuing from the epochs already run) and returns their
  // statistics. Stops at the first error, e.g. a failing op or a non-finite loss (which names
  // the step and suggests a lower learning rate).
  absl::StatusOr<std::vector<EpochStats>> Train(const data::Dataset& train);
  // Runs the next epoch.
  absl::StatusOr<EpochStats> TrainEpoch(const data::Dataset& train);
  // The same over streamed data: each step takes this trainer's share of a global batch
  // (data::BatchSharder) from the epoch's stream, reading one batch ahead. The epoch ends when
  // the stream does, or (sync, Options::stream_epoch_ends) when any trainer's does; a step known
  // to end it reports position (epoch + 1, 0) to on_step_end. FailedPrecondition when the
  // stream has no example at the start of an epoch.
  absl::StatusOr<std::vector<EpochStats>> Train(const StreamFactory& streams);
  absl::StatusOr<EpochStats> TrainEpoch(const StreamFactory& streams);
  // Mean loss (and AUC) of the current parameters on `dataset` (in order, batch_size at a
  // time). Does not change any parameter. InvalidArgument if `dataset` is empty.
  absl::StatusOr<EvalResult> Evaluate(const data::Dataset& dataset);
  // This trainer's share of a distributed evaluation: examples [begin, end) of `dataset`
  // scored as Evaluate does, with the AUC as a histogram (EvalPartial). An empty range gives an
  // empty partial (a trainer with no share still takes part in the sum). `on_prediction` (may
  // be empty) sees each example with its score when the prediction is [B, 1], in order
  // (tessera_predict writes them out).
  absl::StatusOr<EvalPartial> EvaluatePartial(
      const data::Dataset& dataset, int64_t begin, int64_t end,
      const std::function<void(const data::Example&, double)>& on_prediction = nullptr);

  // The variables (parameters, optimizer state, last step's activations).
  Scope* scope() { return &scope_; }
  // Whether steps run with prefetch_ahead (the option is set and the program has its shape).
  bool prefetching_ahead() const { return head_end_ > 0; }
  const ModelSpec& model() const { return model_; }
  const ProgramDesc& eval_program() const { return eval_program_; }
  int64_t global_step() const { return global_step_; }
  int64_t epochs_done() const { return epoch_; }
  // Continues from `position` (a restored checkpoint): the next epoch run is position.epoch,
  // starting at its step position.step_in_epoch (the steps before it are skipped unfed).
  void ResumeAt(const TrainPosition& position);

 private:
  LocalTrainer(const OpRegistry* registry, ModelSpec model, Options options);
  // Runs the evaluation program over `examples` in batches; `binary_score(example, probability)`
  // sees each example's score when the prediction is [B, 1] (not called otherwise). Sums the
  // loss (batch mean x batch size) into *loss_sum and counts correct top-1 / rounded predictions
  // into *correct; *classes is the prediction's width (0 without one).
  absl::Status Score(absl::Span<const data::Example> examples, double* loss_sum,
                     int64_t* correct, int64_t* classes,
                     const std::function<void(const data::Example&, double)>& binary_score);
  // Whether the model names a prediction and lists `metric` among its metrics.
  bool ReportsMetric(const char* metric) const;
  struct EpochRun;
  // Options::epochs epochs of TrainEpoch(data).
  template <typename Data>
  absl::StatusOr<std::vector<EpochStats>> TrainEpochs(const Data& data);
  using FeedFn = std::function<absl::Status(int64_t begin, int64_t count, Scope* scope)>;
  EpochRun BeginEpoch();
  // One step on a local batch of `size` examples, fed by `feed`, and its bookkeeping; `ends`
  // (may be empty) tells after the run whether the step ends the epoch.
  // `next_feed` (may be empty) feeds the local batch of the step after it, of `next_size`
  // examples, for prefetch_ahead.
  absl::Status RunStep(int64_t size, FeedFn feed, const std::function<bool()>& ends,
                       EpochRun* run, int64_t next_size = 0, FeedFn next_feed = nullptr);
  // The main block with prefetch_ahead: its lookups unless this batch was staged, the compute
  // and send, then the receives while the next batch (if any, and if the epoch goes on) is fed
  // into staging_ and looked up.
  absl::Status RunAhead(int64_t next_size, const FeedFn& next_feed,
                        const std::function<bool()>& ends);
  // RunAhead when pipelined_ (and the epoch's length is known): the next batch is fed and its
  // lookups sent during the compute, the receives together with the send (folded_: in the
  // send's own requests), both answered by the pservers once they applied the step.
  absl::Status RunPipelined(int64_t next_size, const FeedFn& next_feed);
  // Runs ops [begin, end) of `block` (main_block_ or pipelined_block_: run_program_'s op
  // indices) but the folded recv.
  absl::Status RunSteps(const PreparedBlock& block, int begin, int end, Scope* scope);
  EpochStats EndEpoch(EpochRun* run);
  // Value of the loss variable after a run; error if it is missing or not finite.
  absl::StatusOr<double> ReadLoss() const;
  std::ostream& log() const;

  Executor executor_;
  ModelSpec model_;
  Options options_;
  Feeder feeder_;
  ProgramDesc eval_program_;
  // The main program as steps run it (model_.main, the receive folded into the send when
  // folded_recv_ >= 0), and its prepared block 0.
  ProgramDesc run_program_;
  PreparedBlock main_block_;
  PreparedBlock eval_block_;
  Scope scope_;
  int64_t epoch_ = 0;
  int64_t epochs_target_ = 0;  // epoch_ at the end of the running Train() call (for the ETA)
  int64_t global_step_ = 0;
  int64_t skip_steps_ = 0;               // steps of the next epoch already run (ResumeAt)
  std::unique_ptr<PlaceRunner> places_;  // cpu_places > 1 or place_registries only
  std::vector<std::unique_ptr<Executor>> place_executors_;  // one per place_registries entry
  // prefetch_ahead: ops [0, head_end_) are the lookups and [tail_begin_, n) the receives (and
  // the concats of sliced parameters after them); head_end_ == 0 when off. staging_ holds the next
  // batch (fed, looked up) when staged_.
  int head_end_ = 0;
  int tail_begin_ = 0;
  Scope staging_;
  bool staged_ = false;
  std::vector<std::string> staged_names_;  // staging_'s variables at staged_version_
  uint64_t staged_version_ = ~uint64_t{0};
  // Pipelined prefetch_ahead (sync sends with barriers, or async pushes whose receives take the
  // next batch's lookups): main with (sync) attr after_update on its leading lookups and
  // trailing receives; the requests of the running step, kept past a failed one (they end when
  // the job fails).
  bool pipelined_ = false;
  // Pipelined async: the step's push, then its receive (attr takes_lookups), which carries the
  // next batch's lookups (ride_, always); or, folded (folded_recv_), the push carrying both.
  bool async_ = false;
  // Not on device places, a send and a recv carrying the barriers one after the other (async,
  // with fold_async_receive: carrying none): the index of the recv, folded into the send (its
  // outputs on the send op of run_program_ and pipelined_program_: one request per pserver and
  // step, PServerClient::SendGetBatchAsync; no step runs the recv op itself, and the places'
  // runner gets the program without it), or -1.
  int folded_recv_ = -1;
  // Pipelined, one lookup op and Options::lookup_riders set; sync: several trainers and
  // folded_recv_ right after the send: the next batch's lookups ride on the step's send (sync)
  // or receive (async) (attr ride_on_step on the lookup op).
  bool ride_ = false;
  // Pipelined, not riding, Options::deferred_lookups set: attr complete_later on the lookups.
  bool defer_ = false;
  ProgramDesc pipelined_program_;
  PreparedBlock pipelined_block_;
  struct InFlight {
    absl::Status lookups, received;
    absl::Notification lookups_done, received_done;
  };
  std::shared_ptr<InFlight> in_flight_;
  // The next batch's lookups (and, pipelined, the receives). Joined before the rest goes.
  std::unique_ptr<ThreadPool> ahead_;
  // defer_: lookups in flight store into staging_; waited for before anything goes.
  struct DeferredWait {
    PendingRequests* pending = nullptr;
    ~DeferredWait() {
      if (pending != nullptr) pending->Wait().IgnoreError();
    }
  } deferred_wait_;
};

}  // namespace tessera

#endif  // TESSERA_TRAINER_LOCAL_TRAINER_H_
