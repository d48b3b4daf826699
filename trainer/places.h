// Multi-device trainers: one trainer's step split across K places (CPU threads, or GPUs of one
// process: trainer/device_setup.h).
//
// SplitForPlaces cuts block 0 of a trainer program (single-machine, pserver-mode or
// collective-mode) in two at the first op after the backward pass whose role is not forward,
// backward or loss (the optimizer, the sends of pserver mode, the all-reduce of collective mode):
//   place program  feeds -> (distributed-table prefetch) -> forward -> loss -> backward; every
//                  place runs it on its own child scope of the trainer's scope: parameters are
//                  read from the trainer's scope (shared, read-only), activations and gradients
//                  are the place's own;
//   rest program   everything after the cut, run once on the trainer's scope after the places'
//                  gradients were combined into it.
// PlaceRunner runs a step that way: the local batch is split across the places by the rule
// that splits a global batch across trainers (data::BatchSharder: contiguous ranges, the first
// B mod K places one example more), each place feeds and runs its part in its own thread, and a
// PlaceReducer combines every gradient the rest program reads, weighted by the places' shares of
// the batch (the loss is a mean over examples, so the weighted sum of the places' gradients is
// the full batch's gradient): dense gradients are summed with weights n_p / n, sparse
// (SelectedRows) gradients are concatenated in place order with their rows scaled by n_p / n.
// The loss becomes the weighted mean of the places' losses; `concat` variables (prediction,
// label) the places' rows in order, so the trainer's scope looks as after a single-place step.
//
// The reducer is an interface: CpuPlaceReducer combines host memory; NcclPlaceReducer
// (trainer/nccl_place_reducer.h, --config=cuda only) sums the dense gradients of GPU places on
// the devices with NCCL, bringing only the sum to the host, and combines the rest on the host.
#ifndef TESSERA_TRAINER_PLACES_H_
#define TESSERA_TRAINER_PLACES_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/framework/executor.h"
#include "common/framework/scope.h"
#include "common/framework/variable.h"
#include "proto/program.pb.h"

namespace tessera {

struct PlacePrograms {
  ProgramDesc place;  // runs on every place
  ProgramDesc rest;   // runs once, on the trainer's scope
  // Index in the original block 0 of the first op of the rest program (ops_size if none).
  int boundary = 0;
  // Variables the place program writes (feeds excluded): each place holds its own copy.
  std::vector<std::string> place_locals;
  // Gradients the place program computes and the rest program reads: combined across places.
  std::vector<std::string> reduced;
};

// Splits block 0 of `main` (see the file comment). InvalidArgument, naming the op or the
// variable, when the program does not have the shape forward/backward-then-rest: no backward
// op; an op of another role (optimize, RPC, ...) before the cut; a forward or backward op after
// it; a place op writing a persistable variable (parameters are shared read-only); or a
// variable other than a gradient computed per place and read after the cut.
absl::StatusOr<PlacePrograms> SplitForPlaces(const ProgramDesc& main);

// The number of leading `prefetch` ops of `block` (distributed-table lookups) that read only
// variables no op of the block writes (fed ids) and write only variables no other op writes:
// they can run apart from the rest, for another batch (LocalTrainer's prefetch_ahead) or once
// for the batches of all places (PlaceRunner). 0 if there is none.
int LeadingLookupOps(const BlockDesc& block);

// Combines one variable's values on the places into the trainer's variable. Implementations:
// CpuPlaceReducer (host memory); NcclPlaceReducer (GPU places, trainer/nccl_place_reducer.h).
// Called from one thread. `out` is a variable of the trainer's scope: it ends up on the host.
class PlaceReducer {
 public:
  virtual ~PlaceReducer() = default;
  // out = sum_p weights[p] * values[p] for dense float tensors of one shape and dtype; for
  // SelectedRows of one height, the rows of every place in order with values scaled by
  // weights[p]. `out` gets its own buffer (it never shares one with a place). InvalidArgument
  // naming `name` and the place when the values disagree in kind, dtype or shape, or one is
  // missing or not a float tensor.
  virtual absl::Status WeightedSum(const std::string& name,
                                   const std::vector<const Variable*>& values,
                                   const std::vector<double>& weights, Variable* out) = 0;
  // out = the rows (dim 0) of every place's dense tensor in order (same dtype and row shape).
  virtual absl::Status ConcatRows(const std::string& name,
                                  const std::vector<const Variable*>& values, Variable* out) = 0;
};

class CpuPlaceReducer : public PlaceReducer {
 public:
  absl::Status WeightedSum(const std::string& name, const std::vector<const Variable*>& values,
                           const std::vector<double>& weights, Variable* out) override;
  absl::Status ConcatRows(const std::string& name, const std::vector<const Variable*>& values,
                          Variable* out) override;
};

struct PlaceRunnerOptions {
  int num_places = 2;  // >= 1
  // The loss variable ([1] float): the trainer's scope gets the weighted mean of the places'.
  std::string loss;
  // Variables whose rows are concatenated across places into the trainer's scope after a step
  // (e.g. the prediction and the label, for the training AUC). Absent ones are skipped.
  std::vector<std::string> concat;
  // nullptr: a CpuPlaceReducer owned by the runner. Shared so that its creator (e.g. a
  // trainer's DevicePlan, which owns the NCCL communicators of its GPUs) may keep it too.
  std::shared_ptr<PlaceReducer> reducer;
  // Device places (GPUs): place p runs the place program with place_executors[p] (a placed
  // registry's executor; empty: every place uses the runner's executor, on the CPU). Such a
  // place gets its own copy of every parameter the place program reads, refreshed from the
  // trainer's scope at each step, since a device kernel moves the variables it reads to its
  // device (the trainer's are shared by all places). after_place (if set) runs in the place's
  // thread after its program, e.g. to bring the gradients a host reducer reads to the host.
  std::vector<const Executor*> place_executors;
  std::function<absl::Status(int place, Scope* place_scope)> after_place;
};

// Runs trainer steps across places. Not thread-safe (one trainer thread calls Step); the places'
// threads live only inside Step.
class PlaceRunner {
 public:
  // Feeds examples [begin, begin + size) of the local batch into `place_scope`.
  using FeedFn = std::function<absl::Status(int64_t begin, int64_t size, Scope* place_scope)>;

  // Splits `main`, prepares both programs with `executor` (which must outlive the runner, as
  // must `scope`, the trainer's scope) and creates one child scope of `scope` per place.
  // InvalidArgument for num_places < 1 or a program SplitForPlaces rejects.
  static absl::StatusOr<std::unique_ptr<PlaceRunner>> Create(const Executor* executor,
                                                             const ProgramDesc& main,
                                                             PlaceRunnerOptions options,
                                                             Scope* scope);
  ~PlaceRunner();

  // One step on a local batch of batch_size >= 1 examples: places with no example (batch_size
  // < num_places) sit the step out. With two or more active places, the place program's
  // leading lookups (LeadingLookupOps) run once, on the places' ids in place order (one
  // request per pserver for the whole local batch), and each place gets its rows. Returns the first error of a place (prefixed "place p: "),
  // of the reduction, or of the rest program.
  absl::Status Step(int64_t batch_size, const FeedFn& feed);

  const PlacePrograms& programs() const { return programs_; }
  int num_places() const { return options_.num_places; }
  Scope* place_scope(int p) const { return place_scopes_[static_cast<size_t>(p)]; }

 private:
  PlaceRunner(const Executor* executor, PlaceRunnerOptions options, Scope* scope)
      : executor_(executor), options_(std::move(options)), scope_(scope) {}

  const Executor* executor_;
  PlaceRunnerOptions options_;
  Scope* scope_;
  PlacePrograms programs_;
  PreparedBlock place_block_;
  PreparedBlock rest_block_;
  // Device places: each place's executor and prepared place program, and the parameters each
  // place keeps a copy of (PlaceRunnerOptions::place_executors).
  std::vector<const Executor*> place_executors_;
  std::vector<PreparedBlock> place_blocks_;
  std::vector<std::string> replicated_;
  absl::Status Replicate(Scope* place_scope) const;
  std::vector<Scope*> place_scopes_;  // children of scope_
  // The shared lookups: ops [0, lookup_ops_) of the place program, run on lookup_scope_ (a
  // child of scope_) with every (ids, rows) argument pair of theirs.
  absl::Status LookUpForPlaces(const std::vector<int>& active);
  int lookup_ops_ = 0;
  std::vector<std::pair<std::string, std::string>> lookup_args_;
  Scope* lookup_scope_ = nullptr;
};

}  // namespace tessera

#endif  // TESSERA_TRAINER_PLACES_H_
