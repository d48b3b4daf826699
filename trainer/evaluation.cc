#include "trainer/evaluation.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/base/status.h"

namespace tessera {

namespace {
// samples, loss_sum, correct, partials, partials with accuracy, partials with an AUC histogram,
// buckets x partials: every value is a sum over the partials added, so that an element-wise sum
// of vectors is the vector of the merged partial.
constexpr int64_t kHeader = 7;

bool IsCount(double v) { return v >= 0 && v <= 9007199254740992.0 && std::floor(v) == v; }
}  // namespace

Tensor EvalPartial::ToTensor() const {
  const int64_t buckets = has_auc_histogram ? auc.num_thresholds() + 1 : 0;
  const double partials = static_cast<double>(std::max<int64_t>(1, shares));
  Tensor t(FLOAT64, {kHeader + 2 * buckets});
  double* d = t.data<double>();
  d[0] = static_cast<double>(samples);
  d[1] = loss_sum;
  d[2] = static_cast<double>(correct);
  d[3] = partials;
  d[4] = has_accuracy ? partials : 0;
  d[5] = has_auc_histogram ? partials : 0;
  d[6] = static_cast<double>(buckets) * partials;
  for (int64_t b = 0; b < buckets; ++b) {
    d[kHeader + b] = static_cast<double>(auc.positives()[static_cast<size_t>(b)]);
    d[kHeader + buckets + b] = static_cast<double>(auc.negatives()[static_cast<size_t>(b)]);
  }
  return t;
}

absl::StatusOr<EvalPartial> EvalPartial::FromTensor(const Tensor& t) {
  if (!t.initialized() || t.dtype() != FLOAT64 || t.rank() != 1 || t.numel() < kHeader) {
    return absl::InvalidArgumentError(absl::StrCat(
        "an evaluation partial must be a float64 vector of at least ", kHeader,
        " values, got ", t.DebugString()));
  }
  const double* d = t.data<double>();
  const int64_t n = t.numel();
  const double partials = d[3];
  const double buckets = partials >= 1 ? d[6] / partials : -1;
  if (!IsCount(d[0]) || !IsCount(d[2]) || !std::isfinite(d[1]) || !IsCount(partials) ||
      partials < 1 || (d[4] != 0 && d[4] != partials) || (d[5] != 0 && d[5] != partials) ||
      !IsCount(buckets) || n != kHeader + 2 * static_cast<int64_t>(buckets) ||
      (d[5] != 0) != (buckets > 0)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "malformed evaluation partial of %d values: samples %g, loss sum %g, correct %g, "
        "partials %g (%g with accuracy, %g with an AUC), buckets x partials %g",
        n, d[0], d[1], d[2], partials, d[4], d[5], d[6]));
  }
  EvalPartial p;
  p.samples = static_cast<int64_t>(d[0]);
  p.loss_sum = d[1];
  p.correct = static_cast<int64_t>(d[2]);
  p.shares = static_cast<int64_t>(partials);
  p.has_accuracy = d[4] != 0;
  p.has_auc_histogram = d[5] != 0;
  if (p.has_auc_histogram) {
    const int64_t b = static_cast<int64_t>(buckets);
    std::vector<int64_t> pos(static_cast<size_t>(b)), neg(static_cast<size_t>(b));
    for (int64_t k = 0; k < b; ++k) {
      const double np = d[kHeader + k], nn = d[kHeader + b + k];
      if (!IsCount(np) || !IsCount(nn)) {
        return absl::InvalidArgumentError(
            absl::StrFormat("evaluation partial bucket %d has counts %g / %g", k, np, nn));
      }
      pos[static_cast<size_t>(k)] = static_cast<int64_t>(np);
      neg[static_cast<size_t>(k)] = static_cast<int64_t>(nn);
    }
    TS_ASSIGN_OR_RETURN(p.auc, data::StreamingAuc::FromCounts(std::move(pos), std::move(neg)));
  }
  return p;
}

absl::Status EvalPartial::Merge(const EvalPartial& other) {
  if (other.has_accuracy != has_accuracy || other.has_auc_histogram != has_auc_histogram) {
    return absl::InvalidArgumentError(
        "evaluation partials of different models (accuracy or AUC on one side only)");
  }
  samples += other.samples;
  shares = std::max<int64_t>(1, shares) + std::max<int64_t>(1, other.shares);
  loss_sum += other.loss_sum;
  correct += other.correct;
  if (has_auc_histogram) TS_RETURN_IF_ERROR(auc.Merge(other.auc));
  return absl::OkStatus();
}

EvalResult EvalPartial::Result() const {
  EvalResult r;
  r.samples = samples;
  if (samples == 0) return r;
  r.mean_loss = loss_sum / static_cast<double>(samples);
  if (has_accuracy) {
    r.has_accuracy = true;
    r.accuracy = static_cast<double>(correct) / static_cast<double>(samples);
  }
  if (has_auc_histogram && auc.num_positives() > 0 && auc.num_negatives() > 0) {
    r.has_auc = true;
    r.auc = auc.Compute();
  }
  return r;
}

std::string FormatEval(const EvalResult& r) {
  std::string s = absl::StrFormat("loss %.6f", r.mean_loss);
  if (r.has_auc) absl::StrAppendFormat(&s, " auc %.6f", r.auc);
  if (r.has_accuracy) absl::StrAppendFormat(&s, " accuracy %.6f", r.accuracy);
  absl::StrAppend(&s, " on ", r.samples, " examples");
  return s;
}

}  // namespace tessera
