// Timing of a trainer's op kernels, for observability: RegisterTimedOps copies the ops of a
// registry into another with each kernel wrapped, so that
//   - the ops of a traced step report their phase to a StepTracer (common/metrics/trace.h):
//     send, send_barrier, recv, fetch_barrier, prefetch, allreduce (c_allreduce_*), and compute
//     for every other op (forward, backward, split/concat, local optimizer...);
//   - send_barrier and fetch_barrier observe the time they blocked into histograms, and so do a
//     send / recv that carry the barrier (transpiled sync programs: the wait and the transfer
//     in one request, so the observation includes the transfer).
// When neither applies to an op (no traced step open, not a barrier), the wrapper costs one
// atomic load and an extra std::function call.
#ifndef TESSERA_TRAINER_OP_TIMING_H_
#define TESSERA_TRAINER_OP_TIMING_H_

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "common/metrics/metrics.h"
#include "common/metrics/trace.h"
#include "common/framework/op_registry.h"

namespace tessera {

struct OpTimingOptions {
  StepTracer* tracer = nullptr;             // null: no trace
  Histogram* send_barrier_wait = nullptr;   // seconds; null: not observed
  Histogram* fetch_barrier_wait = nullptr;  // seconds; null: not observed
};

// The trace phase of an op type ("compute" for all but the RPC and collective ops).
const char* TracePhaseOf(absl::string_view op_type);

// Registers every op of `base` into `out` with its kernel timed as `options` says (the gradient
// makers are copied as they are). The tracer and histograms must outlive `out`; `base` need not.
// Fails (AlreadyExists) if `out` has one of the types already.
absl::Status RegisterTimedOps(const OpRegistry& base, const OpTimingOptions& options,
                              OpRegistry* out);

}  // namespace tessera

#endif  // TESSERA_TRAINER_OP_TIMING_H_
