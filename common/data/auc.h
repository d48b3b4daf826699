// Area under the ROC curve of scores against 0/1 labels.
//
// ExactAuc sorts all scores (ties count one half), for tests and offline evaluation.
// StreamingAuc is the bucketed accumulator of Fluid's auc op for training loops: scores in
// [0, 1] (probabilities) fall into num_thresholds + 1 buckets and the curve is integrated over
// bucket boundaries by the trapezoid rule, so scores within one bucket count as ties. It equals
// ExactAuc when scores that share a bucket are equal (e.g. multiples of 1 / num_thresholds);
// otherwise it differs by at most half the fraction of positive-negative pairs sharing a bucket.
#ifndef TESSERA_COMMON_DATA_AUC_H_
#define TESSERA_COMMON_DATA_AUC_H_

#include <cstdint>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace tessera {
namespace data {

// Probability that a random positive scores above a random negative (ties: 1/2).
// InvalidArgument on a size mismatch, a label other than 0/1 or a NaN score (naming the index
// and value); FailedPrecondition when there is no positive or no negative.
absl::StatusOr<double> ExactAuc(absl::Span<const double> scores, absl::Span<const float> labels);
absl::StatusOr<double> ExactAuc(absl::Span<const float> scores, absl::Span<const float> labels);
absl::StatusOr<double> ExactAuc(absl::Span<const double> scores, absl::Span<const int64_t> labels);
absl::StatusOr<double> ExactAuc(absl::Span<const float> scores, absl::Span<const int64_t> labels);

// Accumulates bucketed positive/negative counts over many batches. Not thread-safe; merge
// per-thread (or per-trainer) accumulators with Merge().
class StreamingAuc {
 public:
  // Fluid's default: 4095 thresholds, 4096 buckets.
  static constexpr int kDefaultNumThresholds = (1 << 12) - 1;

  // kDefaultNumThresholds thresholds.
  StreamingAuc() : StreamingAuc(kDefaultNumThresholds) {}
  // A score s goes to bucket floor(s * num_thresholds); InvalidArgument unless
  // 1 <= num_thresholds <= 2^26.
  static absl::StatusOr<StreamingAuc> Create(int num_thresholds);
  // An accumulator holding these per-bucket counts (e.g. summed across trainers):
  // InvalidArgument unless both have the same size in [2, 2^26 + 1] and no count is negative.
  static absl::StatusOr<StreamingAuc> FromCounts(std::vector<int64_t> positives,
                                                 std::vector<int64_t> negatives);

  // Adds a batch. InvalidArgument (naming the index and value) on a size mismatch, a label other
  // than 0/1, or a score outside [0, 1] or NaN; nothing is added then.
  absl::Status Update(absl::Span<const double> scores, absl::Span<const float> labels);
  absl::Status Update(absl::Span<const float> scores, absl::Span<const float> labels);
  absl::Status Update(absl::Span<const double> scores, absl::Span<const int64_t> labels);
  absl::Status Update(absl::Span<const float> scores, absl::Span<const int64_t> labels);

  // The AUC of everything added since construction or Reset(); 0.5 (no information) while
  // there is no positive or no negative yet.
  double Compute() const;
  // Forgets everything added.
  void Reset();
  // Adds other's counts; InvalidArgument if the bucket counts differ.
  absl::Status Merge(const StreamingAuc& other);

  int num_thresholds() const { return num_thresholds_; }
  int64_t num_positives() const { return total_pos_; }
  int64_t num_negatives() const { return total_neg_; }
  // Per-bucket counts (num_thresholds + 1 buckets), e.g. to all-reduce across trainers.
  const std::vector<int64_t>& positives() const { return pos_; }
  const std::vector<int64_t>& negatives() const { return neg_; }

 private:
  explicit StreamingAuc(int num_thresholds);
  template <typename S, typename L>
  absl::Status UpdateImpl(absl::Span<const S> scores, absl::Span<const L> labels);

  int num_thresholds_;
  std::vector<int64_t> pos_;
  std::vector<int64_t> neg_;
  int64_t total_pos_ = 0;
  int64_t total_neg_ = 0;
};

}  // namespace data
}  // namespace tessera

#endif  // TESSERA_COMMON_DATA_AUC_H_
