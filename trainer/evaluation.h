// EvalPartial: what one trainer's share of an evaluation adds up to (examples, summed loss,
// correct predictions, the AUC histogram), so that trainers can score their shares of the test
// data apart and the job's result is computed once from the sum: AUC from the merged histograms
// (not an average of AUCs), the loss and the accuracy from summed counts. On the wire it is a
// float64 vector (counts are exact below 2^53), summed element by element: a pserver adds the
// trainers' vectors (pserver/eval_reducer.h), a collective job all-reduces them.
#ifndef TESSERA_TRAINER_EVALUATION_H_
#define TESSERA_TRAINER_EVALUATION_H_

#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "common/data/auc.h"
#include "common/framework/tensor.h"

namespace tessera {

struct EvalResult {
  int64_t samples = 0;
  double mean_loss = 0;  // sample-weighted mean of the batch losses
  // true when the model names a prediction and the data set has both labels 0 and 1
  bool has_auc = false;
  double auc = 0;
  // true when the model names a prediction and either its rows have C >= 2 class scores (top-1:
  // the label's score is the highest, TopKCorrect) or it is [B, 1] with the metric "accuracy"
  // (the prediction rounded at 0.5 equals the label)
  bool has_accuracy = false;
  double accuracy = 0;
};

struct EvalPartial {
  int64_t samples = 0;
  double loss_sum = 0;  // sum over batches of batch mean loss x batch size
  int64_t correct = 0;
  bool has_accuracy = false;
  bool has_auc_histogram = false;  // a [B, 1] prediction: `auc` holds its scores
  data::StreamingAuc auc;
  int64_t shares = 1;  // shares merged into this one

  // [samples, loss_sum, correct, partials, partials with accuracy, partials with an AUC,
  // buckets x partials, positives..., negatives...] as float64: each value a sum over the
  // partials merged, so that the element-wise sum of two vectors is their merge's vector.
  Tensor ToTensor() const;
  // InvalidArgument naming what is wrong for a vector ToTensor did not make (a negative or
  // fractional count, a bucket count that does not fit the length).
  static absl::StatusOr<EvalPartial> FromTensor(const Tensor& t);
  // Adds `other` (InvalidArgument when the two disagree on what they measure).
  absl::Status Merge(const EvalPartial& other);
  // The job's result: AUC from the histogram (StreamingAuc: scores sharing a bucket tie).
  EvalResult Result() const;
};

// "loss 0.4321 auc 0.7654 accuracy 0.8123 on N examples" (the parts a result has).
std::string FormatEval(const EvalResult& r);

}  // namespace tessera

#endif  // TESSERA_TRAINER_EVALUATION_H_
