#include "trainer/op_timing.h"

#include "absl/strings/match.h"
#include "common/base/status.h"

namespace tessera {

const char* TracePhaseOf(absl::string_view op_type) {
  for (const char* rpc : {"send", "send_barrier", "recv", "fetch_barrier", "prefetch"}) {
    if (op_type == rpc) return rpc;
  }
  if (absl::StartsWith(op_type, "c_allreduce")) return "allreduce";
  return "compute";
}

absl::Status RegisterTimedOps(const OpRegistry& base, const OpTimingOptions& options,
                              OpRegistry* out) {
  for (const std::string& type : base.Types()) {
    const OpInfo* info = base.Find(type);
    OpInfo timed = *info;
    const char* phase = TracePhaseOf(type);
    // A barrier op's time is its wait; a send or recv that carries the barrier (attr
    // barrier_endpoints / fetch_barrier_endpoints) blocks for the transfer and the wait together.
    Histogram* wait = type == "send_barrier" || type == "send"    ? options.send_barrier_wait
                      : type == "fetch_barrier" || type == "recv" ? options.fetch_barrier_wait
                                                                  : nullptr;
    const char* carried = type == "send"   ? "barrier_endpoints"
                          : type == "recv" ? "fetch_barrier_endpoints"
                                           : nullptr;
    // A send with the step's receive folded in (attr recv_folded) carries both barriers: its
    // time counts as both waits.
    Histogram* folded_wait = type == "send" ? options.fetch_barrier_wait : nullptr;
    StepTracer* tracer = options.tracer;
    if (info->kernel && (wait != nullptr || tracer != nullptr)) {
      timed.kernel = [kernel = info->kernel, phase, wait, folded_wait, carried,
                      tracer](OpContext& ctx) {
        const bool trace = tracer != nullptr && tracer->recording();
        Histogram* observed =
            carried == nullptr || !ctx.StringsAttr(carried).empty() ? wait : nullptr;
        Histogram* also = folded_wait != nullptr && ctx.BoolAttr("recv_folded", false)
                              ? folded_wait
                              : nullptr;
        if (!trace && observed == nullptr && also == nullptr) return kernel(ctx);
        const int64_t start = Tracer::NowMicros();
        absl::Status s = kernel(ctx);
        const int64_t end = Tracer::NowMicros();
        if (observed != nullptr) observed->Observe(static_cast<double>(end - start) * 1e-6);
        if (also != nullptr) also->Observe(static_cast<double>(end - start) * 1e-6);
        if (trace) tracer->Phase(phase, start, end);
        return s;
      };
    }
    TS_RETURN_IF_ERROR(out->Register(type, std::move(timed)));
  }
  return absl::OkStatus();
}

}  // namespace tessera
