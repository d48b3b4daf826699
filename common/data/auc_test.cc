#include "common/data/auc.h"

#include <cmath>
#include <random>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tessera {
namespace data {
namespace {

using ::testing::HasSubstr;

double Exact(const std::vector<double>& scores, const std::vector<float>& labels) {
  absl::StatusOr<double> auc = ExactAuc(scores, labels);
  EXPECT_TRUE(auc.ok()) << auc.status();
  return auc.ok() ? *auc : -1;
}

TEST(ExactAucTest, HandComputedValues) {
  // Pairs (pos, neg): (0.35, 0.1) yes, (0.35, 0.4) no, (0.8, 0.1) yes, (0.8, 0.4) yes: 3/4.
  EXPECT_DOUBLE_EQ(Exact({0.1, 0.4, 0.35, 0.8}, {0, 0, 1, 1}), 0.75);
  // A tie counts one half: (0.5, 0.1) 1, (0.5, 0.5) 1/2, (0.9, 0.1) 1, (0.9, 0.5) 1: 3.5/4.
  EXPECT_DOUBLE_EQ(Exact({0.1, 0.5, 0.5, 0.9}, {0, 1, 0, 1}), 0.875);
  EXPECT_DOUBLE_EQ(Exact({0.5, 0.5}, {0, 1}), 0.5);
  EXPECT_DOUBLE_EQ(Exact({1, 2, 3, 4}, {0, 0, 1, 1}), 1.0);
  EXPECT_DOUBLE_EQ(Exact({1, 2, 3, 4}, {1, 1, 0, 0}), 0.0);
  // Scores need not be probabilities; order only matters.
  EXPECT_DOUBLE_EQ(Exact({-7, 100, 3}, {0, 1, 1}), 1.0);
  // 2 positives, 3 negatives: pos 0.6 beats 0.2, 0.4 and ties 0.6 (2.5); pos 0.3 beats 0.2 (1).
  EXPECT_DOUBLE_EQ(Exact({0.2, 0.6, 0.4, 0.3, 0.6}, {0, 1, 0, 1, 0}), 3.5 / 6);

  std::vector<float> fscores = {0.1f, 0.4f, 0.35f, 0.8f};
  std::vector<int64_t> ilabels = {0, 0, 1, 1};
  EXPECT_DOUBLE_EQ(*ExactAuc(fscores, ilabels), 0.75);
  EXPECT_DOUBLE_EQ(*ExactAuc(fscores, std::vector<float>{0, 0, 1, 1}), 0.75);
  EXPECT_DOUBLE_EQ(*ExactAuc(std::vector<double>{0.1, 0.4, 0.35, 0.8}, ilabels), 0.75);
}

TEST(ExactAucTest, Errors) {
  absl::Status s = ExactAuc(std::vector<double>{0.1, 0.2}, std::vector<float>{0}).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("2 scores but 1 labels"));
  s = ExactAuc(std::vector<double>{0.1, 0.2}, std::vector<float>{0, 2}).status();
  EXPECT_THAT(std::string(s.message()), HasSubstr("label[1] = 2 is not 0 or 1"));
  s = ExactAuc(std::vector<double>{NAN, 0.2}, std::vector<float>{0, 1}).status();
  EXPECT_THAT(std::string(s.message()), HasSubstr("score[0] is NaN"));
  s = ExactAuc(std::vector<double>{0.1, 0.2}, std::vector<float>{1, 1}).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(s.message()), HasSubstr("2 positives and 0 negatives"));
  EXPECT_FALSE(ExactAuc(std::vector<double>{}, std::vector<float>{}).ok());
}

TEST(StreamingAucTest, HandComputedValues) {
  absl::StatusOr<StreamingAuc> auc = StreamingAuc::Create(4);
  ASSERT_TRUE(auc.ok());
  EXPECT_EQ(auc->Compute(), 0.5);  // Nothing yet.
  // Buckets 0, 1, 2, 3 (and 4 for score 1.0): the same order as the scores, 3/4.
  ASSERT_TRUE(
      auc->Update(std::vector<double>{0.1, 0.3, 0.6, 0.9}, std::vector<float>{0, 1, 0, 1}).ok());
  EXPECT_DOUBLE_EQ(auc->Compute(), 0.75);
  // 0.55 shares bucket 2 with the negative 0.6: a tie with it, above 0.1: adds 1 + 1/2 of 2 more
  // pairs. (3 + 1.5) / (3 * 2).
  ASSERT_TRUE(auc->Update(std::vector<double>{0.55}, std::vector<float>{1}).ok());
  EXPECT_DOUBLE_EQ(auc->Compute(), 4.5 / 6);
  EXPECT_EQ(auc->num_positives(), 3);
  EXPECT_EQ(auc->num_negatives(), 2);
  // Scores 0 and 1 are in range.
  ASSERT_TRUE(auc->Update(std::vector<double>{0.0, 1.0}, std::vector<float>{0, 1}).ok());
  // The new negative is below the 3 positives, the new positive above the 3 negatives.
  EXPECT_DOUBLE_EQ(auc->Compute(), (4.5 + 3 + 3) / 12);

  auc->Reset();
  EXPECT_EQ(auc->Compute(), 0.5);
  EXPECT_EQ(auc->num_positives(), 0);

  // One threshold: everything below 1.0 is one tie.
  absl::StatusOr<StreamingAuc> coarse = StreamingAuc::Create(1);
  ASSERT_TRUE(coarse.ok());
  ASSERT_TRUE(coarse->Update(std::vector<double>{0.1, 0.9}, std::vector<float>{0, 1}).ok());
  EXPECT_DOUBLE_EQ(coarse->Compute(), 0.5);
}

TEST(StreamingAucTest, EqualsExactOnBucketAlignedScores) {
  // A power of two, so that bucket / kThresholds is exact and lands in its own bucket.
  constexpr int kThresholds = 128;
  absl::StatusOr<StreamingAuc> auc = StreamingAuc::Create(kThresholds);
  ASSERT_TRUE(auc.ok());
  std::mt19937_64 rng(1);
  std::vector<double> all_scores;
  std::vector<float> all_labels;
  for (int batch = 0; batch < 10; ++batch) {
    std::vector<double> scores;
    std::vector<float> labels;
    for (int i = 0; i < 300; ++i) {
      const int bucket = static_cast<int>(rng() % (kThresholds + 1));
      scores.push_back(static_cast<double>(bucket) / kThresholds);
      labels.push_back(rng() % 3 < static_cast<uint64_t>(1 + bucket % 2) ? 1.0f : 0.0f);
    }
    ASSERT_TRUE(auc->Update(scores, labels).ok());
    all_scores.insert(all_scores.end(), scores.begin(), scores.end());
    all_labels.insert(all_labels.end(), labels.begin(), labels.end());
  }
  EXPECT_NEAR(auc->Compute(), Exact(all_scores, all_labels), 1e-12);
}

TEST(StreamingAucTest, CloseToExactOnContinuousScores) {
  StreamingAuc auc;  // 4095 thresholds.
  std::mt19937_64 rng(2);
  std::vector<float> scores;
  std::vector<int64_t> labels;
  for (int i = 0; i < 100000; ++i) {
    const double u = static_cast<double>(rng() >> 11) * 0x1.0p-53;
    const int64_t label = static_cast<double>(rng() >> 11) * 0x1.0p-53 < u ? 1 : 0;
    scores.push_back(static_cast<float>(u));
    labels.push_back(label);
  }
  ASSERT_TRUE(auc.Update(scores, labels).ok());
  absl::StatusOr<double> exact = ExactAuc(scores, labels);
  ASSERT_TRUE(exact.ok());
  // P(label = 1 | u) = u: positives have density 2u, negatives 2(1 - u), and the population
  // AUC is 4 * integral_0^1 a (a - a^2 / 2) da = 5/6.
  EXPECT_NEAR(*exact, 0.8333, 0.01);
  EXPECT_NEAR(auc.Compute(), *exact, 1e-3);
  EXPECT_NE(auc.Compute(), *exact);  // Bucketing does change the value slightly.
}

TEST(StreamingAucTest, MergeAndErrors) {
  StreamingAuc a, b, both;
  std::vector<double> s1 = {0.1, 0.7, 0.4}, s2 = {0.9, 0.2};
  std::vector<float> l1 = {0, 1, 1}, l2 = {1, 0};
  ASSERT_TRUE(a.Update(s1, l1).ok());
  ASSERT_TRUE(b.Update(s2, l2).ok());
  ASSERT_TRUE(both.Update(s1, l1).ok());
  ASSERT_TRUE(both.Update(s2, l2).ok());
  ASSERT_TRUE(a.Merge(b).ok());
  EXPECT_EQ(a.Compute(), both.Compute());
  EXPECT_EQ(a.positives(), both.positives());
  EXPECT_EQ(a.negatives(), both.negatives());

  absl::StatusOr<StreamingAuc> other = StreamingAuc::Create(10);
  ASSERT_TRUE(other.ok());
  absl::Status s = a.Merge(*other);
  EXPECT_THAT(std::string(s.message()), HasSubstr("num_thresholds 10 differs from 4095"));

  // A bad batch adds nothing.
  const double before = a.Compute();
  s = a.Update(std::vector<double>{0.5, 1.5}, std::vector<float>{0, 1});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("score[1] = 1.5 is outside [0, 1]"));
  s = a.Update(std::vector<double>{0.5, -0.1}, std::vector<float>{0, 1});
  EXPECT_THAT(std::string(s.message()), HasSubstr("score[1] = -0.1"));
  s = a.Update(std::vector<double>{0.5, NAN}, std::vector<float>{0, 1});
  EXPECT_THAT(std::string(s.message()), HasSubstr("score[1] is NaN"));
  s = a.Update(std::vector<float>{0.5f}, std::vector<int64_t>{3});
  EXPECT_THAT(std::string(s.message()), HasSubstr("label[0] = 3 is not 0 or 1"));
  s = a.Update(std::vector<float>{0.5f}, std::vector<float>{});
  EXPECT_THAT(std::string(s.message()), HasSubstr("1 scores but 0 labels"));
  EXPECT_EQ(a.Compute(), before);
  EXPECT_EQ(a.num_positives() + a.num_negatives(), 5);

  EXPECT_FALSE(StreamingAuc::Create(0).ok());
  EXPECT_THAT(std::string(StreamingAuc::Create(-3).status().message()), HasSubstr("got -3"));
}

}  // namespace
}  // namespace data
}  // namespace tessera
