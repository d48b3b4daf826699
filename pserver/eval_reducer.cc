#include "pserver/eval_reducer.h"

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace tessera {

bool EvalReducer::IsEvalVariable(const std::string& name) {
  return absl::string_view(name).substr(0, sizeof(kPrefix) - 1) == kPrefix;
}

std::string EvalReducer::VariableName(int64_t round) { return absl::StrCat(kPrefix, round); }

EvalReducer::Round& EvalReducer::RoundOf(const std::string& name) {
  Round& r = rounds_[name];
  if (r.added.empty()) r.added.assign(static_cast<size_t>(num_trainers_), false);
  return r;
}

absl::StatusOr<Variable*> EvalReducer::Prepare(int trainer, const VariableHeader& h) {
  int64_t round;
  const bool numbered =
      absl::SimpleAtoi(absl::string_view(h.name).substr(sizeof(kPrefix) - 1), &round) &&
      round >= 0;
  if (!numbered || h.type != DENSE_TENSOR || h.dtype != FLOAT64 || h.dims.size() != 1 ||
      h.dims[0] < 1 || h.dims[0] > kMaxValues || h.total_bytes != h.dims[0] * 8 ||
      h.chunk_offset < 0 || h.chunk_bytes < 0 || h.chunk_offset > h.total_bytes ||
      h.chunk_bytes > h.total_bytes - h.chunk_offset) {
    return absl::InvalidArgumentError(
        absl::StrCat("evaluation partial '", h.name, "' must be a float64 vector of 1 to ",
                     kMaxValues, " values named ", kPrefix, "<round> (its chunks within it), got ",
                     DataTypeName(h.dtype), ShapeString(h.dims), " bytes [", h.chunk_offset, ", +",
                     h.chunk_bytes, ") of ", h.total_bytes, " on pserver ", endpoint_));
  }
  absl::MutexLock lock(&mu_);
  Round& r = RoundOf(h.name);
  if (r.added[static_cast<size_t>(trainer)]) {
    return absl::InvalidArgumentError(absl::StrCat("trainer ", trainer,
                                                   " sent evaluation partial '", h.name,
                                                   "' twice to pserver ", endpoint_));
  }
  // std::map nodes are stable: the buffer stays put while other trainers' partials arrive.
  auto in_flight = r.received.find(trainer);
  if (in_flight != r.received.end()) {  // a further chunk of the partial
    if (in_flight->second.Get<Tensor>().shape() != h.dims) {
      return absl::InvalidArgumentError(
          absl::StrCat("trainer ", trainer, " sent chunks of evaluation partial '", h.name, "' of ",
                       ShapeString(in_flight->second.Get<Tensor>().shape()), " and ",
                       ShapeString(h.dims), " to pserver ", endpoint_));
    }
    ++r.landing[trainer];
    return &in_flight->second;
  }
  Tensor* t = r.received[trainer].GetMutable<Tensor>();
  t->Resize(FLOAT64, h.dims);
  ++r.landing[trainer];
  return &r.received[trainer];
}

absl::Status EvalReducer::Add(int trainer, const VariableHeader& h,
                              std::vector<std::function<void()>>* run_after) {
  const std::string& name = h.name;
  absl::MutexLock lock(&mu_);
  auto it = rounds_.find(name);
  if (it == rounds_.end() || it->second.received.count(trainer) == 0) {
    return absl::InternalError(absl::StrCat("evaluation partial '", name, "' of trainer ",
                                            trainer, " was not prepared"));
  }
  Round& r = it->second;
  int64_t& bytes = r.bytes[trainer];
  bytes += h.chunk_bytes;
  // More chunks to come, or one still landing in the buffer (a peer that repeats a chunk must
  // not have the buffer freed under another).
  if (--r.landing[trainer] > 0 || bytes < h.total_bytes) return absl::OkStatus();
  r.bytes.erase(trainer);
  r.landing.erase(trainer);
  const Tensor& got = r.received[trainer].Get<Tensor>();
  if (!r.sum.initialized()) {
    r.sum = Tensor(FLOAT64, got.shape());
    r.sum.SetZero();
  }
  if (got.shape() != r.sum.shape()) {
    absl::Status bad = absl::InvalidArgumentError(
        absl::StrCat("trainer ", trainer, " sent evaluation partial '", name, "' of ",
                     got.numel(), " values, another trainer ", r.sum.numel(),
                     " (the same model and metrics on every trainer?)"));
    r.received.erase(trainer);
    return bad;
  }
  double* sum = r.sum.data<double>();
  const double* add = got.data<double>();
  for (int64_t i = 0; i < got.numel(); ++i) sum[i] += add[i];
  r.received.erase(trainer);
  r.added[static_cast<size_t>(trainer)] = true;
  MaybeAnswer(name, run_after);
  return absl::OkStatus();
}

void EvalReducer::Get(const std::string& name, RequestHandler::GetDone done,
                      std::vector<std::function<void()>>* run_after) {
  absl::MutexLock lock(&mu_);
  Round& r = RoundOf(name);
  r.waiting.push_back(std::move(done));
  MaybeAnswer(name, run_after);
}

void EvalReducer::MaybeAnswer(const std::string& name,
                              std::vector<std::function<void()>>* run_after) {
  auto it = rounds_.find(name);
  if (it == rounds_.end() || it->second.waiting.empty()) return;
  for (int k = 0; k < num_trainers_; ++k) {
    const bool gone = !gone_.empty() && gone_[static_cast<size_t>(k)];
    if (!it->second.added[static_cast<size_t>(k)] && !gone) return;
  }
  if (!it->second.sum.initialized()) {  // nobody sent one: every trainer left
    const std::string missing = absl::StrCat("evaluation '", name, "': every trainer left the job on pserver ", endpoint_);
    for (auto& done : it->second.waiting) {
      run_after->push_back([done = std::move(done), missing] {
        done(absl::FailedPreconditionError(missing));
      });
    }
    rounds_.erase(it);
    return;
  }
  Variable sum;
  *sum.GetMutable<Tensor>() = std::move(it->second.sum);
  for (auto& done : it->second.waiting) {
    run_after->push_back([done = std::move(done), sum] { done(sum); });
  }
  rounds_.erase(it);
}

void EvalReducer::Leave(int trainer, std::vector<std::function<void()>>* run_after) {
  absl::MutexLock lock(&mu_);
  if (gone_.empty()) gone_.assign(static_cast<size_t>(num_trainers_), false);
  gone_[static_cast<size_t>(trainer)] = true;
  std::vector<std::string> names;
  for (const auto& [name, r] : rounds_) names.push_back(name);
  for (const std::string& name : names) MaybeAnswer(name, run_after);
}

void EvalReducer::FailAll(const absl::Status& reason,
                          std::vector<std::function<void()>>* run_after) {
  absl::MutexLock lock(&mu_);
  for (auto& [name, r] : rounds_) {
    for (auto& done : r.waiting) {
      run_after->push_back([done = std::move(done), reason] { done(reason); });
    }
    r.waiting.clear();
  }
}

}  // namespace tessera
