// Timelines in the Chrome Trace Event Format (load the file in chrome://tracing or
// https://ui.perfetto.dev):
//   {"traceEvents":[{"name":"send","ph":"X","ts":<us>,"dur":<us>,"pid":0,"tid":1,
//                    "args":{"step":3}}, ...]}
//
// Tracer keeps complete ("X") events in memory, at most Options::max_events of them (later ones
// are counted as dropped), and writes them as JSON. StepTracer builds on it the timeline of a
// training loop: a "step" span per recorded step and, inside it, one span per phase (compute,
// send, send_barrier, recv, fetch_barrier, prefetch, allreduce), consecutive compute ops merged.
// Timestamps are microseconds since the Unix epoch, so traces of several processes line up.
//
// Thread-safety: both classes are thread-safe. StepTracer::recording() is one atomic load, so
// callers can skip taking timestamps when the current step is not traced.
#ifndef TESSERA_COMMON_METRICS_TRACE_H_
#define TESSERA_COMMON_METRICS_TRACE_H_

#include <atomic>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"

namespace tessera {

// Integer arguments of an event ("args" in the JSON), e.g. {{"step", 3}}.
using TraceArgs = std::vector<std::pair<std::string, int64_t>>;

struct TracerOptions {
  int pid = 0;               // the "pid" of every event (e.g. the trainer id)
  std::string process_name;  // shown for pid by trace viewers; "" = none
  int64_t max_events = 1 << 20;
};

class Tracer {
 public:
  explicit Tracer(TracerOptions options);
  Tracer(const Tracer&) = delete;
  Tracer& operator=(const Tracer&) = delete;

  // Microseconds since the Unix epoch.
  static int64_t NowMicros();

  // Records span `name` starting at `start_us` and lasting `dur_us` (negative: 0) on the calling
  // thread's track. Past max_events the span is dropped and counted.
  void AddSpan(std::string name, int64_t start_us, int64_t dur_us, TraceArgs args = {});

  int64_t size() const;     // spans held
  int64_t dropped() const;  // spans dropped for max_events

  // The JSON document (traceEvents: a process_name metadata event when one is set, then the
  // spans in the order they were added).
  std::string ToJson() const;
  // Writes ToJson() to `path` atomically (a temporary file renamed over it). Error names the
  // path and the reason.
  absl::Status WriteFile(const std::string& path) const;

 private:
  struct Event {
    std::string name;
    int64_t ts = 0;
    int64_t dur = 0;
    int tid = 0;
    TraceArgs args;
  };
  const TracerOptions options_;
  mutable absl::Mutex mu_;
  std::vector<Event> events_ ABSL_GUARDED_BY(mu_);
  int64_t dropped_ ABSL_GUARDED_BY(mu_) = 0;
};

// The steps of a training loop on a Tracer. Steps first_step .. first_step + num_steps - 1 are
// recorded (num_steps < 0: all); others cost one atomic load per op.
class StepTracer {
 public:
  // `tracer` must outlive this object.
  StepTracer(Tracer* tracer, int64_t first_step, int64_t num_steps);

  // Opens the span of `step` when it is to be recorded (closing a step left open first).
  void BeginStep(int64_t step);
  // Closes the current step's span (and its pending compute span). No-op when none is open.
  void EndStep();
  // Whether the current step is recorded.
  bool recording() const { return recording_.load(std::memory_order_acquire); }
  // A phase of the current step ran [start_us, end_us). Phases named "compute" that follow each
  // other merge into one span (args: step, ops); any other phase is its own span (args: step).
  // Ignored when no recorded step is open.
  void Phase(const char* name, int64_t start_us, int64_t end_us);
  // Closes a step left open (e.g. the step that failed): its span ends now, with arg
  // incomplete=1. Call before writing the trace.
  void Finish();

 private:
  void FlushCompute() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void CloseStep(bool complete) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  Tracer* const tracer_;
  const int64_t first_step_;
  const int64_t num_steps_;
  std::atomic<bool> recording_{false};
  absl::Mutex mu_;
  int64_t step_ ABSL_GUARDED_BY(mu_) = -1;
  int64_t step_start_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t compute_start_ ABSL_GUARDED_BY(mu_) = -1;  // -1: no pending compute span
  int64_t compute_end_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t compute_ops_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace tessera

#endif  // TESSERA_COMMON_METRICS_TRACE_H_
