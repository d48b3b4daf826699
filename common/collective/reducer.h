// Gradient synchronization for collective mode: all-reduce of Tensors (float32/float64) with a
// scale factor, optional compression (fp16 on the wire, top-k or threshold sparsification),
// coalescing into one buffer, reducers that overlap communication with the backward pass,
// broadcast of the initial parameters and partial (rotating-chunk) parameter averaging.
//
// A trainer step in collective mode:
//
//   TS_RETURN_IF_ERROR(BroadcastParameters(ctx.world(), params));   // once, at start
//   ... forward, backward ...
//   TS_RETURN_IF_ERROR(AllReduceMultiple(ctx.world(), grads));      // mean over ranks
//   ... optimizer ops, locally ...
//
// or, to overlap: reducer.Add(grad) as each gradient is produced, reducer.Finalize() before
// the optimizer. Every rank must reduce tensors of the same shapes in the same order.
// Errors are those of the communicator (communicator.h) plus InvalidArgument for tensors of
// another dtype or an uninitialized tensor (naming it by position).
//
// Byte counts: the communicator's stats() count what each operation hands over, so
// compression shows up there: fp16 halves the all-reduce bytes; top-k at fraction f all-gathers
// 8 bytes (index + float32 value) per selected entry, 2f of the dense bytes; threshold the same
// per entry, padded to the largest count of any rank (plus an 8-byte all-reduce of that
// count). Sparsification falls back to a dense all-reduce whenever it would not send fewer
// bytes. Sparsified entries that are not sent are dropped, unless the caller passes an
// ErrorFeedback to AllReduceMultiple (residual accumulation, see below).
#ifndef TESSERA_COMMON_COLLECTIVE_REDUCER_H_
#define TESSERA_COMMON_COLLECTIVE_REDUCER_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/status.h"
#include "common/collective/communicator.h"
#include "common/collective/compression.h"
#include "common/framework/tensor.h"

namespace tessera {
namespace collective {

struct ReduceOptions {
  // The result is scale * (sum over ranks); unset: the mean (scale = 1 / number of ranks).
  std::optional<double> scale;
  CompressionOptions compression;
};

// Reduces `t` in place across the ranks of `comm`. Blocks.
absl::Status AllReduce(Communicator* comm, Tensor* t, const ReduceOptions& options = {});

// A reduction running in the background: Sync() waits for it; only then may the tensor be
// read or written. Sync() must be called before the handle is destroyed.
class PendingReduce {
 public:
  explicit PendingReduce(std::unique_ptr<Request> request) : request_(std::move(request)) {}
  ~PendingReduce();
  absl::Status Sync();

 private:
  std::unique_ptr<Request> request_;
};

// Starts reducing `t` in place; the returned handle's Sync() waits for it.
std::unique_ptr<PendingReduce> AllReduceAsync(Communicator* comm, Tensor* t,
                                              const ReduceOptions& options = {});

// Error feedback (residual accumulation) for sparsified reductions (top-k, threshold): the
// entries of a rank's coalesced buffer that it did not send in one call are kept and added to
// the buffer of its next call before the entries are chosen, so every gradient contribution is
// sent eventually (top-k at small fractions needs this to converge). A dense fallback sends
// everything and clears the residual; fp16 and uncompressed reductions leave it alone. Use one
// per sequence of AllReduceMultiple calls over tensors of the same sizes in the same order.
// Not thread-safe.
struct ErrorFeedback {
  std::vector<float> residual_f32;  // one entry per float32 element of the coalesced buffer
  std::vector<double> residual_f64;
  void Reset() {
    residual_f32.clear();
    residual_f64.clear();
  }
};

struct MultiReduceOptions : ReduceOptions {
  // Pack tensors of one dtype into one contiguous buffer and reduce it with one operation
  // (fewer, larger messages); otherwise one operation per tensor (all in flight at once).
  bool coalesce = true;
  // Not null: error feedback for sparsification (needs coalesce; InvalidArgument otherwise, or
  // when the buffer's size differs from the residual's of an earlier call).
  ErrorFeedback* error_feedback = nullptr;
};

// Reduces every tensor in place (for example all gradients of a step). Blocks.
absl::Status AllReduceMultiple(Communicator* comm, const std::vector<Tensor*>& tensors,
                               const MultiReduceOptions& options = {});

// Copies `root`'s tensors into every rank's tensors (same shapes and dtypes everywhere: checked
// first, InvalidArgument on every rank if any rank's total size differs). Any dtype. Blocks.
absl::Status BroadcastParameters(Communicator* comm, const std::vector<Tensor*>& tensors,
                                 int root = 0);

// Receives a step's gradients one at a time and reduces them in place. Use: Add() each gradient
// as soon as backward has produced it (the tensor must then be left alone), Finalize() before
// reading any of them; then the next step may begin. Not thread-safe (one trainer thread).
class GradientReducer {
 public:
  virtual ~GradientReducer() = default;
  virtual absl::Status Add(Tensor* grad) = 0;
  // Waits until every added gradient is reduced; the first error, if any.
  virtual absl::Status Finalize() = 0;
};

// Starts each gradient's all-reduce immediately when it is added.
class InlineReducer : public GradientReducer {
 public:
  InlineReducer(Communicator* comm, const ReduceOptions& options = {})
      : comm_(comm), options_(options) {}
  ~InlineReducer() override;
  absl::Status Add(Tensor* grad) override;
  absl::Status Finalize() override;

 private:
  Communicator* const comm_;
  const ReduceOptions options_;
  std::vector<std::unique_ptr<PendingReduce>> pending_;
  absl::Status first_error_;
};

struct CoalescingReducerOptions : ReduceOptions {
  // A bucket is reduced once adding the next gradient would take it past this many bytes (a
  // gradient larger than this forms a bucket alone), and at Finalize().
  size_t bucket_bytes = size_t{4} << 20;
};

// Collects gradients into buckets of about bucket_bytes and reduces each bucket as one
// contiguous buffer in the background (one operation per bucket). Gradients of different
// dtypes go into different buckets.
class CoalescingReducer : public GradientReducer {
 public:
  CoalescingReducer(Communicator* comm, const CoalescingReducerOptions& options = {})
      : comm_(comm), options_(options) {}
  ~CoalescingReducer() override;
  absl::Status Add(Tensor* grad) override;
  absl::Status Finalize() override;
  // Buckets handed to the communicator since creation.
  int64_t buckets_flushed() const { return buckets_flushed_; }

 private:
  void Flush();

  Communicator* const comm_;
  const CoalescingReducerOptions options_;
  std::vector<Tensor*> bucket_;
  size_t bucket_size_ = 0;  // bytes
  std::vector<std::unique_ptr<PendingReduce>> pending_;
  absl::Status first_error_;
  int64_t buckets_flushed_ = 0;
};

// Partial synchronization (for local-SGD style training): each Step() averages one of
// `num_chunks` equal slices of the parameters across ranks, rotating, so that every parameter
// is averaged once every num_chunks steps at 1/num_chunks of the traffic per step. The slices
// cut the concatenation of the float32 (and separately the float64) tensors in the order given;
// pass the same list every step. Not thread-safe.
class PartialSynchronizer {
 public:
  // num_chunks >= 1 (1 averages everything every step).
  PartialSynchronizer(Communicator* comm, int num_chunks);
  // Averages chunk step() mod num_chunks of `params` in place and advances step(). Blocks.
  absl::Status Step(const std::vector<Tensor*>& params);
  int64_t step() const { return step_; }
  // [begin, end) of chunk `chunk` in a concatenation of `total` elements.
  static std::pair<int64_t, int64_t> ChunkRange(int64_t total, int num_chunks, int chunk);

 private:
  Communicator* const comm_;
  const int num_chunks_;
  int64_t step_ = 0;
};

}  // namespace collective
}  // namespace tessera

#endif  // TESSERA_COMMON_COLLECTIVE_REDUCER_H_
