// EvalPartial: the wire form round-trips and refuses malformed vectors; trainers' partials of
// their shares of a test set sum to the partial of the whole set (AUC histograms exactly, the
// loss to rounding), whatever the split, an empty share included.
#include "trainer/evaluation.h"

#include "common/ops/ops.h"
#include "examples/registry.h"
#include "gtest/gtest.h"
#include "trainer/local_trainer.h"

namespace tessera {
namespace {

TEST(EvalPartialTest, TensorRoundTripAndRefusals) {
  EvalPartial p;
  p.samples = 5;
  p.loss_sum = 2.5;
  p.correct = 3;
  p.has_accuracy = true;
  p.has_auc_histogram = true;
  ASSERT_TRUE(p.auc.Update(std::vector<double>{0.1, 0.9, 0.4}, std::vector<float>{0, 1, 1}).ok());
  auto back = EvalPartial::FromTensor(p.ToTensor());
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->samples, 5);
  EXPECT_EQ(back->loss_sum, 2.5);
  EXPECT_EQ(back->correct, 3);
  EXPECT_EQ(back->auc.positives(), p.auc.positives());
  EXPECT_EQ(back->auc.negatives(), p.auc.negatives());
  EXPECT_EQ(back->Result().auc, p.Result().auc);

  Tensor bad = p.ToTensor();
  bad.data<double>()[0] = 1.5;  // fractional count
  EXPECT_EQ(EvalPartial::FromTensor(bad).status().code(), absl::StatusCode::kInvalidArgument);
  Tensor short_one(FLOAT64, {p.ToTensor().numel() - 1});
  std::copy(p.ToTensor().data<double>(), p.ToTensor().data<double>() + short_one.numel(),
            short_one.data<double>());
  EXPECT_FALSE(EvalPartial::FromTensor(short_one).ok());
  EXPECT_FALSE(EvalPartial::FromTensor(Tensor(FLOAT32, {8})).ok());

  EvalPartial other;  // no histogram: a different model
  EXPECT_FALSE(p.Merge(other).ok());
}

TEST(EvalPartialTest, SharesSumToTheWholeSet) {
  auto registry = NewStandardOpRegistry();
  examples::ExampleOptions eo;
  eo.name = "ctr";
  eo.num_examples = 64;
  eo.num_test_examples = 301;
  eo.vocab_per_slot = 500;
  auto model = examples::BuildExampleModel(*registry, eo);
  ASSERT_TRUE(model.ok()) << model.status();
  auto data = examples::LoadExampleData(eo);
  ASSERT_TRUE(data.ok()) << data.status();
  LocalTrainerOptions o;
  o.batch_size = 32;
  auto trainer = LocalTrainer::Create(registry.get(), *model, o);
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  ASSERT_TRUE((*trainer)->Train(data->train).ok());
  const data::Dataset& test = data->test;
  const int64_t n = static_cast<int64_t>(test.examples.size());
  auto whole = (*trainer)->EvaluatePartial(test, 0, n);
  ASSERT_TRUE(whole.ok()) << whole.status();
  ASSERT_TRUE(whole->has_auc_histogram);
  for (const std::vector<int64_t>& cuts :
       {std::vector<int64_t>{0, 100, 200, n}, std::vector<int64_t>{0, 0, 150, n}}) {
    // As a pserver or an all-reduce sums them: element by element, in the wire form.
    Tensor vector_sum;
    for (size_t k = 0; k + 1 < cuts.size(); ++k) {
      auto share = (*trainer)->EvaluatePartial(test, cuts[k], cuts[k + 1]);
      ASSERT_TRUE(share.ok()) << share.status();
      const Tensor v = share->ToTensor();
      if (k == 0) {
        vector_sum = v.Clone();
        continue;
      }
      ASSERT_EQ(v.numel(), vector_sum.numel());
      for (int64_t i = 0; i < v.numel(); ++i) vector_sum.data<double>()[i] += v.data<double>()[i];
    }
    auto summed = EvalPartial::FromTensor(vector_sum);
    ASSERT_TRUE(summed.ok()) << summed.status();
    const EvalPartial& sum = *summed;
    EXPECT_EQ(sum.samples, n);
    EXPECT_EQ(sum.auc.positives(), whole->auc.positives());
    EXPECT_EQ(sum.auc.negatives(), whole->auc.negatives());
    // Batch losses are float32 means: other batch boundaries round differently.
    EXPECT_NEAR(sum.loss_sum, whole->loss_sum, 1e-7 * std::abs(whole->loss_sum));
    EXPECT_EQ(sum.Result().auc, whole->Result().auc);
  }
  // The histogram AUC is within its bucketing of the exact one.
  auto exact = (*trainer)->Evaluate(test);
  ASSERT_TRUE(exact.ok());
  EXPECT_NEAR(whole->Result().auc, exact->auc, 2e-3);
  EXPECT_NEAR(whole->Result().mean_loss, exact->mean_loss, 1e-9);
  auto bad = (*trainer)->EvaluatePartial(test, 10, n + 1);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tessera
