#include "common/metrics/trace.h"

#include <cstdio>
#include <cstring>
#include <fstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"

namespace tessera {

namespace {

// A small id per thread, in the order threads first record a span (1, 2, ...).
int ThreadTrack() {
  static std::atomic<int> next{1};
  thread_local int id = next.fetch_add(1, std::memory_order_relaxed);
  return id;
}

std::string JsonString(const std::string& s) {
  std::string out = "\"";
  for (unsigned char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c < 0x20) {
      out += absl::StrFormat("\\u%04x", c);
    } else {
      out += static_cast<char>(c);
    }
  }
  return out + "\"";
}

}  // namespace

Tracer::Tracer(TracerOptions options) : options_(std::move(options)) {}

int64_t Tracer::NowMicros() { return absl::ToUnixMicros(absl::Now()); }

void Tracer::AddSpan(std::string name, int64_t start_us, int64_t dur_us, TraceArgs args) {
  Event e{std::move(name), start_us, dur_us < 0 ? 0 : dur_us, ThreadTrack(), std::move(args)};
  absl::MutexLock lock(&mu_);
  if (static_cast<int64_t>(events_.size()) >= options_.max_events) {
    ++dropped_;
    return;
  }
  events_.push_back(std::move(e));
}

int64_t Tracer::size() const {
  absl::MutexLock lock(&mu_);
  return static_cast<int64_t>(events_.size());
}

int64_t Tracer::dropped() const {
  absl::MutexLock lock(&mu_);
  return dropped_;
}

std::string Tracer::ToJson() const {
  absl::MutexLock lock(&mu_);
  std::string out = "{\"traceEvents\":[";
  bool first = true;
  if (!options_.process_name.empty()) {
    absl::StrAppend(&out, "\n{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":", options_.pid,
                    ",\"tid\":0,\"args\":{\"name\":", JsonString(options_.process_name), "}}");
    first = false;
  }
  for (const Event& e : events_) {
    absl::StrAppend(&out, first ? "\n" : ",\n", "{\"name\":", JsonString(e.name),
                    ",\"ph\":\"X\",\"ts\":", e.ts, ",\"dur\":", e.dur, ",\"pid\":", options_.pid,
                    ",\"tid\":", e.tid, ",\"args\":{");
    for (size_t i = 0; i < e.args.size(); ++i) {
      absl::StrAppend(&out, i ? "," : "", JsonString(e.args[i].first), ":", e.args[i].second);
    }
    out += "}}";
    first = false;
  }
  absl::StrAppend(
      &out, "\n],\"displayTimeUnit\":\"ms\",\"otherData\":{\"dropped_events\":", dropped_, "}}\n");
  return out;
}

absl::Status Tracer::WriteFile(const std::string& path) const {
  std::string json = ToJson();
  std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::binary | std::ios::trunc);
    if (!f) {
      return absl::InvalidArgumentError(
          absl::StrCat("trace file ", path, ": cannot write ", tmp, ": ", std::strerror(errno)));
    }
    f << json;
    f.flush();
    if (!f) {
      return absl::InternalError(
          absl::StrCat("trace file ", path, ": writing ", tmp, " failed: ", std::strerror(errno)));
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    std::string why = std::strerror(errno);
    std::remove(tmp.c_str());
    return absl::InternalError(
        absl::StrCat("trace file ", path, ": cannot rename ", tmp, ": ", why));
  }
  return absl::OkStatus();
}

StepTracer::StepTracer(Tracer* tracer, int64_t first_step, int64_t num_steps)
    : tracer_(tracer), first_step_(first_step), num_steps_(num_steps) {}

void StepTracer::BeginStep(int64_t step) {
  absl::MutexLock lock(&mu_);
  if (step_ >= 0) CloseStep(/*complete=*/false);
  bool record = step >= first_step_ && (num_steps_ < 0 || step - first_step_ < num_steps_);
  if (!record) return;
  step_ = step;
  step_start_ = Tracer::NowMicros();
  recording_.store(true, std::memory_order_release);
}

void StepTracer::EndStep() {
  absl::MutexLock lock(&mu_);
  if (step_ >= 0) CloseStep(/*complete=*/true);
}

void StepTracer::Finish() {
  absl::MutexLock lock(&mu_);
  if (step_ >= 0) CloseStep(/*complete=*/false);
}

void StepTracer::Phase(const char* name, int64_t start_us, int64_t end_us) {
  absl::MutexLock lock(&mu_);
  if (step_ < 0) return;
  if (std::strcmp(name, "compute") == 0) {
    if (compute_start_ < 0) {
      compute_start_ = start_us;
      compute_ops_ = 0;
    }
    compute_end_ = end_us;
    ++compute_ops_;
    return;
  }
  FlushCompute();
  tracer_->AddSpan(name, start_us, end_us - start_us, {{"step", step_}});
}

void StepTracer::FlushCompute() {
  if (compute_start_ < 0) return;
  tracer_->AddSpan("compute", compute_start_, compute_end_ - compute_start_,
                   {{"step", step_}, {"ops", compute_ops_}});
  compute_start_ = -1;
}

void StepTracer::CloseStep(bool complete) {
  FlushCompute();
  int64_t end = Tracer::NowMicros();
  TraceArgs args = {{"step", step_}};
  if (!complete) args.emplace_back("incomplete", 1);
  tracer_->AddSpan("step", step_start_, end - step_start_, std::move(args));
  step_ = -1;
  recording_.store(false, std::memory_order_release);
}

}  // namespace tessera
