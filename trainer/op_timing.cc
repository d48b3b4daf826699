#include "trainer/op_timing.h"

#include "absl/strings/match.h"
#include "common/status.h"

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
    Histogram* wait = type == "send_barrier"    ? options.send_barrier_wait
                      : type == "fetch_barrier" ? options.fetch_barrier_wait
                                                : nullptr;
    StepTracer* tracer = options.tracer;
    if (info->kernel && (wait != nullptr || tracer != nullptr)) {
      timed.kernel = [kernel = info->kernel, phase, wait, tracer](OpContext& ctx) {
        const bool trace = tracer != nullptr && tracer->recording();
        if (!trace && wait == nullptr) return kernel(ctx);
        const int64_t start = Tracer::NowMicros();
        absl::Status s = kernel(ctx);
        const int64_t end = Tracer::NowMicros();
        if (wait != nullptr) wait->Observe(static_cast<double>(end - start) * 1e-6);
        if (trace) tracer->Phase(phase, start, end);
        return s;
      };
    }
    TS_RETURN_IF_ERROR(out->Register(type, std::move(timed)));
  }
  return absl::OkStatus();
}

}  // namespace tessera
