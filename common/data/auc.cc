#include "common/data/auc.h"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "absl/strings/str_cat.h"
#include "common/base/status.h"

namespace tessera {
namespace data {
namespace {

template <typename S, typename L>
absl::Status CheckInputs(absl::string_view who, absl::Span<const S> scores,
                         absl::Span<const L> labels) {
  if (scores.size() != labels.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat(who, ": ", scores.size(), " scores but ", labels.size(), " labels"));
  }
  for (size_t i = 0; i < labels.size(); ++i) {
    if (labels[i] != L{0} && labels[i] != L{1}) {
      return absl::InvalidArgumentError(
          absl::StrCat(who, ": label[", i, "] = ", labels[i], " is not 0 or 1"));
    }
    if (std::isnan(static_cast<double>(scores[i]))) {
      return absl::InvalidArgumentError(absl::StrCat(who, ": score[", i, "] is NaN"));
    }
  }
  return absl::OkStatus();
}

template <typename S, typename L>
absl::StatusOr<double> ExactAucImpl(absl::Span<const S> scores, absl::Span<const L> labels) {
  absl::Status s = CheckInputs("ExactAuc", scores, labels);
  if (!s.ok()) return s;
  const size_t n = scores.size();
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), size_t{0});
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return scores[a] < scores[b]; });
  // Mann-Whitney: sum of the (1-based, tie-averaged) ranks of the positives.
  double positive_rank_sum = 0;
  int64_t num_pos = 0;
  for (size_t i = 0; i < n;) {
    size_t j = i;
    int64_t group_pos = 0;
    while (j < n && scores[order[j]] == scores[order[i]]) {
      if (labels[order[j]] == L{1}) ++group_pos;
      ++j;
    }
    const double mean_rank = 0.5 * static_cast<double>(i + 1 + j);  // Ranks i+1 .. j.
    positive_rank_sum += mean_rank * static_cast<double>(group_pos);
    num_pos += group_pos;
    i = j;
  }
  const int64_t num_neg = static_cast<int64_t>(n) - num_pos;
  if (num_pos == 0 || num_neg == 0) {
    return absl::FailedPreconditionError(absl::StrCat("ExactAuc: undefined with ", num_pos,
                                                      " positives and ", num_neg, " negatives"));
  }
  const double p = static_cast<double>(num_pos);
  return (positive_rank_sum - p * (p + 1) / 2) / (p * static_cast<double>(num_neg));
}

}  // namespace

absl::StatusOr<double> ExactAuc(absl::Span<const double> scores, absl::Span<const float> labels) {
  return ExactAucImpl(scores, labels);
}
absl::StatusOr<double> ExactAuc(absl::Span<const float> scores, absl::Span<const float> labels) {
  return ExactAucImpl(scores, labels);
}
absl::StatusOr<double> ExactAuc(absl::Span<const double> scores, absl::Span<const int64_t> labels) {
  return ExactAucImpl(scores, labels);
}
absl::StatusOr<double> ExactAuc(absl::Span<const float> scores, absl::Span<const int64_t> labels) {
  return ExactAucImpl(scores, labels);
}

StreamingAuc::StreamingAuc(int num_thresholds)
    : num_thresholds_(num_thresholds), pos_(num_thresholds + 1, 0), neg_(num_thresholds + 1, 0) {}

absl::StatusOr<StreamingAuc> StreamingAuc::Create(int num_thresholds) {
  if (num_thresholds < 1 || num_thresholds > (1 << 26)) {
    return absl::InvalidArgumentError(
        absl::StrCat("StreamingAuc: num_thresholds must be in [1, 2^26], got ", num_thresholds));
  }
  return StreamingAuc(num_thresholds);
}

absl::StatusOr<StreamingAuc> StreamingAuc::FromCounts(std::vector<int64_t> positives,
                                                      std::vector<int64_t> negatives) {
  if (positives.size() != negatives.size() || positives.size() < 2) {
    return absl::InvalidArgumentError(absl::StrCat("StreamingAuc: ", positives.size(),
                                                   " positive and ", negatives.size(),
                                                   " negative bucket counts"));
  }
  TS_ASSIGN_OR_RETURN(StreamingAuc auc, Create(static_cast<int>(positives.size() - 1)));
  for (size_t b = 0; b < positives.size(); ++b) {
    if (positives[b] < 0 || negatives[b] < 0) {
      return absl::InvalidArgumentError(absl::StrCat("StreamingAuc: bucket ", b, " has counts ",
                                                     positives[b], " / ", negatives[b]));
    }
    auc.total_pos_ += positives[b];
    auc.total_neg_ += negatives[b];
  }
  auc.pos_ = std::move(positives);
  auc.neg_ = std::move(negatives);
  return auc;
}

template <typename S, typename L>
absl::Status StreamingAuc::UpdateImpl(absl::Span<const S> scores, absl::Span<const L> labels) {
  absl::Status s = CheckInputs("StreamingAuc::Update", scores, labels);
  if (!s.ok()) return s;
  for (size_t i = 0; i < scores.size(); ++i) {
    const double v = static_cast<double>(scores[i]);
    if (!(v >= 0.0 && v <= 1.0)) {
      return absl::InvalidArgumentError(
          absl::StrCat("StreamingAuc::Update: score[", i, "] = ", v, " is outside [0, 1]"));
    }
  }
  for (size_t i = 0; i < scores.size(); ++i) {
    const size_t bucket = static_cast<size_t>(static_cast<double>(scores[i]) * num_thresholds_);
    if (labels[i] == L{1}) {
      ++pos_[bucket];
      ++total_pos_;
    } else {
      ++neg_[bucket];
      ++total_neg_;
    }
  }
  return absl::OkStatus();
}

absl::Status StreamingAuc::Update(absl::Span<const double> scores, absl::Span<const float> labels) {
  return UpdateImpl(scores, labels);
}
absl::Status StreamingAuc::Update(absl::Span<const float> scores, absl::Span<const float> labels) {
  return UpdateImpl(scores, labels);
}
absl::Status StreamingAuc::Update(absl::Span<const double> scores,
                                  absl::Span<const int64_t> labels) {
  return UpdateImpl(scores, labels);
}
absl::Status StreamingAuc::Update(absl::Span<const float> scores,
                                  absl::Span<const int64_t> labels) {
  return UpdateImpl(scores, labels);
}

double StreamingAuc::Compute() const {
  if (total_pos_ == 0 || total_neg_ == 0) return 0.5;
  // Walk the thresholds from the highest bucket down: each bucket moves the ROC point by
  // (neg, pos); the trapezoid under that step counts its own pairs as ties.
  double area = 0;
  double pos_above = 0;
  for (int b = num_thresholds_; b >= 0; --b) {
    const double p = static_cast<double>(pos_[b]);
    const double n = static_cast<double>(neg_[b]);
    area += n * (pos_above + 0.5 * p);
    pos_above += p;
  }
  return area / (static_cast<double>(total_pos_) * static_cast<double>(total_neg_));
}

void StreamingAuc::Reset() {
  std::fill(pos_.begin(), pos_.end(), 0);
  std::fill(neg_.begin(), neg_.end(), 0);
  total_pos_ = 0;
  total_neg_ = 0;
}

absl::Status StreamingAuc::Merge(const StreamingAuc& other) {
  if (other.num_thresholds_ != num_thresholds_) {
    return absl::InvalidArgumentError(absl::StrCat("StreamingAuc::Merge: num_thresholds ",
                                                   other.num_thresholds_, " differs from ",
                                                   num_thresholds_));
  }
  for (size_t b = 0; b < pos_.size(); ++b) {
    pos_[b] += other.pos_[b];
    neg_[b] += other.neg_[b];
  }
  total_pos_ += other.total_pos_;
  total_neg_ += other.total_neg_;
  return absl::OkStatus();
}

}  // namespace data
}  // namespace tessera
