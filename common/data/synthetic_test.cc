#include "common/data/synthetic.h"

#include <cmath>
#include <cstdint>
#include <unordered_map>
#include <utility>
#include <vector>

#include "common/data/auc.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tessera {
namespace data {
namespace {

using ::testing::HasSubstr;

TEST(RegressionDataTest, FeaturesAndTarget) {
  absl::StatusOr<Dataset> data = MakeRegressionData(20000, 7);
  ASSERT_TRUE(data.ok()) << data.status();
  EXPECT_EQ(data->num_dense, 10);
  EXPECT_EQ(data->num_sparse, 0);
  ASSERT_EQ(data->examples.size(), 20000u);
  double noise_sum = 0, noise_sq = 0;
  for (const Example& ex : data->examples) {
    ASSERT_EQ(ex.dense.size(), 10u);
    EXPECT_TRUE(ex.sparse.empty());
    double cubes = 0;
    for (float x : ex.dense) {
      ASSERT_GE(x, 1.0f);
      ASSERT_LE(x, 2.0f);
      cubes += static_cast<double>(x) * x * x;
    }
    const double noise = ex.label - cubes;
    ASSERT_LE(std::abs(noise), 1.0 + 1e-4);
    noise_sum += noise;
    noise_sq += noise * noise;
  }
  // sin(2*pi*u): mean 0, variance 1/2.
  EXPECT_NEAR(noise_sum / 20000, 0.0, 0.02);
  EXPECT_NEAR(noise_sq / 20000, 0.5, 0.02);

  absl::StatusOr<Dataset> again = MakeRegressionData(20000, 7);
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE(*again == *data);
  absl::StatusOr<Dataset> other = MakeRegressionData(20000, 8);
  ASSERT_TRUE(other.ok());
  EXPECT_FALSE(*other == *data);
  EXPECT_TRUE(MakeRegressionData(0, 1)->examples.empty());
  EXPECT_EQ(MakeRegressionData(-1, 1).status().code(), absl::StatusCode::kInvalidArgument);
}

// P(rank r) for r in [0, n), proportional to (r + 1)^-alpha.
std::vector<double> ZipfPmf(int64_t n, double alpha) {
  std::vector<double> p(n);
  double total = 0;
  for (int64_t r = 0; r < n; ++r) total += p[r] = std::pow(static_cast<double>(r + 1), -alpha);
  for (double& v : p) v /= total;
  return p;
}

TEST(ZipfSamplerTest, MatchesExactDistributionOnSmallN) {
  constexpr int kDraws = 400000;
  for (double alpha : {0.3, 0.99, 1.0, 1.1, 2.0, 4.0}) {
    for (int64_t n : {1, 2, 7, 50}) {
      absl::StatusOr<ZipfSampler> zipf = ZipfSampler::Create(n, alpha, 17);
      ASSERT_TRUE(zipf.ok());
      std::vector<int64_t> counts(n, 0);
      for (int i = 0; i < kDraws; ++i) {
        const int64_t r = zipf->Next();
        ASSERT_GE(r, 0);
        ASSERT_LT(r, n);
        ++counts[r];
      }
      const std::vector<double> p = ZipfPmf(n, alpha);
      for (int64_t r = 0; r < n; ++r) {
        const double expected = p[r] * kDraws;
        const double sigma = std::sqrt(expected * (1 - p[r])) + 1;
        EXPECT_NEAR(counts[r], expected, 5 * sigma)
            << "alpha " << alpha << " n " << n << " rank " << r;
      }
    }
  }
}

TEST(ZipfSamplerTest, PowerLawOverHugeRange) {
  constexpr double kAlpha = 1.1;
  absl::StatusOr<ZipfSampler> zipf = ZipfSampler::Create(1000000000, kAlpha, 5);
  ASSERT_TRUE(zipf.ok());
  int64_t rank1 = 0, rank10 = 0, beyond_million = 0;
  for (int i = 0; i < 1000000; ++i) {
    const int64_t r = zipf->Next();
    ASSERT_GE(r, 0);
    ASSERT_LT(r, 1000000000);
    rank1 += r == 0;
    rank10 += r == 9;
    beyond_million += r >= 1000000;
  }
  // P(rank 1) / P(rank 10) = 10^alpha = 12.59; rank 10 gets ~8500 draws (1.1% noise).
  EXPECT_NEAR(static_cast<double>(rank1) / rank10, std::pow(10.0, kAlpha),
              0.06 * std::pow(10.0, kAlpha));
  // The tail is reached. With S(N) = sum_{k<=N} k^-1.1 ~ zeta(1.1) - 10 N^-0.1
  // = 10.5844 - 10 N^-0.1: P(rank >= 10^6) = (S(1e9) - S(1e6)) / S(1e9)
  // = (2.5119 - 1.2589) / 9.3255 = 0.1344, and P(rank 1) = 1 / S(1e9).
  EXPECT_NEAR(static_cast<double>(beyond_million) / 1000000, 0.1344, 0.003);
  EXPECT_NEAR(static_cast<double>(rank1) / 1000000, 1 / 9.3255, 0.003);
}

TEST(ZipfSamplerTest, DeterministicAndValidated) {
  absl::StatusOr<ZipfSampler> a = ZipfSampler::Create(1000, 1.1, 3);
  absl::StatusOr<ZipfSampler> b = ZipfSampler::Create(1000, 1.1, 3);
  absl::StatusOr<ZipfSampler> c = ZipfSampler::Create(1000, 1.1, 4);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  std::vector<int64_t> da, db, dc;
  for (int i = 0; i < 1000; ++i) {
    da.push_back(a->Next());
    db.push_back(b->Next());
    dc.push_back(c->Next());
  }
  EXPECT_EQ(da, db);
  EXPECT_NE(da, dc);
  std::mt19937_64 rng(3);
  for (int i = 0; i < 1000; ++i) EXPECT_EQ(a->Sample(rng), da[i]);

  absl::Status s = ZipfSampler::Create(0, 1.1).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("got 0"));
  s = ZipfSampler::Create(10, 0.0).status();
  EXPECT_THAT(std::string(s.message()), HasSubstr("alpha must be finite and > 0, got 0"));
  EXPECT_FALSE(ZipfSampler::Create(10, std::nan("")).ok());
  EXPECT_FALSE(ZipfSampler::Create(10, INFINITY).ok());
}

TEST(CtrIdTest, BijectiveAndSpread) {
  int64_t negatives = 0, huge = 0;
  for (int slot : {0, 1, 25, 65535}) {
    for (int64_t rank :
         {int64_t{0}, int64_t{1}, int64_t{999}, int64_t{99999999}, (int64_t{1} << 40) - 1}) {
      const int64_t id = CtrId(slot, rank);
      EXPECT_NE(id, 0);
      int64_t back = -1;
      ASSERT_TRUE(CtrRank(slot, id, &back));
      EXPECT_EQ(back, rank);
      EXPECT_FALSE(CtrRank(slot + 1, id, &back));
      EXPECT_NE(CtrId(slot + 1, rank), id);
    }
  }
  for (int64_t rank = 0; rank < 10000; ++rank) {
    const int64_t id = CtrId(3, rank);
    negatives += id < 0;
    huge += id > (int64_t{1} << 62) || id < -(int64_t{1} << 62);
  }
  EXPECT_NEAR(negatives, 5000, 300);
  EXPECT_NEAR(huge, 5000, 300);
  int64_t rank;
  EXPECT_FALSE(CtrRank(3, 12345, &rank));
}

TEST(CtrDataTest, DeterministicPerSeed) {
  CtrDataOptions o;
  o.seed = 1;
  absl::StatusOr<Dataset> a = MakeCtrData(500, o);
  absl::StatusOr<Dataset> b = MakeCtrData(500, o);
  ASSERT_TRUE(a.ok() && b.ok()) << a.status();
  EXPECT_TRUE(*a == *b);
  EXPECT_EQ(a->num_dense, 13);
  EXPECT_EQ(a->num_sparse, 26);
  o.seed = 2;
  absl::StatusOr<Dataset> c = MakeCtrData(500, o);
  ASSERT_TRUE(c.ok());
  EXPECT_FALSE(*c == *a);
  // The first n examples do not depend on how many are generated.
  o.seed = 1;
  absl::StatusOr<Dataset> longer = MakeCtrData(600, o);
  ASSERT_TRUE(longer.ok());
  longer->examples.resize(500);
  EXPECT_TRUE(*longer == *a);
}

TEST(CtrDataTest, FeaturesLookLikeCriteo) {
  CtrDataOptions o;
  o.seed = 9;
  absl::StatusOr<CtrGenerator> gen = CtrGenerator::Create(o);
  ASSERT_TRUE(gen.ok()) << gen.status();
  constexpr int kN = 20000;
  int64_t positives = 0, negative_ids = 0, zeros = 0, big_counts = 0;
  Example ex;
  for (int i = 0; i < kN; ++i) {
    double logit;
    gen->Next(&ex, &logit);
    ASSERT_EQ(ex.dense.size(), 13u);
    ASSERT_EQ(ex.sparse.size(), 26u);
    EXPECT_DOUBLE_EQ(gen->TrueLogit(ex), logit);
    positives += ex.label == 1.0f;
    ASSERT_TRUE(ex.label == 0.0f || ex.label == 1.0f);
    for (float v : ex.dense) {
      // log1p of a non-negative integer count below 10^6.
      const double count = std::round(std::expm1(static_cast<double>(v)));
      ASSERT_GE(count, 0);
      ASSERT_LT(count, 1e6);
      ASSERT_EQ(static_cast<float>(std::log1p(count)), v);
      zeros += v == 0.0f;
      big_counts += count >= 100;
    }
    for (int s = 0; s < 26; ++s) {
      int64_t rank;
      ASSERT_TRUE(CtrRank(s, ex.sparse[s], &rank));
      ASSERT_LT(rank, o.vocab_per_slot);
      negative_ids += ex.sparse[s] < 0;
    }
  }
  const double rate = static_cast<double>(positives) / kN;
  EXPECT_GT(rate, 0.15);
  EXPECT_LT(rate, 0.35);
  EXPECT_NEAR(static_cast<double>(negative_ids) / (26.0 * kN), 0.5, 0.1);
  EXPECT_GT(zeros, kN);           // Sparse counts, as in Criteo ...
  EXPECT_GT(big_counts, kN / 4);  // ... with a heavy tail.
}

TEST(CtrDataTest, PlantedModelDependsOnModelSeedOnly) {
  CtrDataOptions o;
  o.seed = 1;
  absl::StatusOr<CtrGenerator> a = CtrGenerator::Create(o);
  o.seed = 2;
  absl::StatusOr<CtrGenerator> b = CtrGenerator::Create(o);
  o.model_seed = 1;
  absl::StatusOr<CtrGenerator> c = CtrGenerator::Create(o);
  ASSERT_TRUE(a.ok() && b.ok() && c.ok());
  int differ = 0;
  double head_sq = 0, tail_sq = 0;
  for (int64_t rank = 0; rank < 200; ++rank) {
    EXPECT_EQ(a->SlotWeight(5, rank), b->SlotWeight(5, rank));
    differ += a->SlotWeight(5, rank) != c->SlotWeight(5, rank);
    head_sq += std::pow(a->SlotWeight(5, rank), 2);
    tail_sq += std::pow(a->SlotWeight(5, 100000000 + rank), 2);
  }
  EXPECT_EQ(differ, 200);
  // Frequent ranks carry the signal, rare ranks almost none.
  EXPECT_GT(head_sq / 200, 0.1);
  EXPECT_LT(tail_sq / 200, 1e-5);
}

TEST(CtrDataTest, PlantedSignalIsLearnable) {
  CtrDataOptions o;
  o.seed = 1;
  constexpr int kTrain = 100000, kTest = 50000;
  absl::StatusOr<CtrGenerator> train_gen = CtrGenerator::Create(o);
  o.seed = 2;
  absl::StatusOr<CtrGenerator> test_gen = CtrGenerator::Create(o);
  ASSERT_TRUE(train_gen.ok() && test_gen.ok());

  std::vector<Example> test(kTest);
  std::vector<double> logits(kTest);
  std::vector<float> labels(kTest);
  for (int i = 0; i < kTest; ++i) {
    test_gen->Next(&test[i], &logits[i]);
    labels[i] = test[i].label;
  }
  absl::StatusOr<double> true_auc = ExactAuc(logits, labels);
  ASSERT_TRUE(true_auc.ok());
  EXPECT_GT(*true_auc, 0.75);

  // A model that learns one weight per id (smoothed per-id log odds, i.e. naive Bayes, which
  // is the right form here: slots are drawn independently and enter the logit additively) on
  // the training set generalizes to the held-out set.
  std::vector<std::unordered_map<int64_t, std::pair<double, double>>> counts(o.num_sparse);
  double pos = 0, neg = 0;
  Example ex;
  for (int i = 0; i < kTrain; ++i) {
    train_gen->Next(&ex);
    for (int s = 0; s < o.num_sparse; ++s) {
      auto& c = counts[s][ex.sparse[s]];
      (ex.label == 1.0f ? c.first : c.second) += 1;
    }
    (ex.label == 1.0f ? pos : neg) += 1;
  }
  constexpr double kPrior = 5;  // Pseudo-examples at the base rate.
  const double base = pos / (pos + neg);
  std::vector<double> scores(kTest, 0.0);
  for (int i = 0; i < kTest; ++i) {
    for (int s = 0; s < o.num_sparse; ++s) {
      auto it = counts[s].find(test[i].sparse[s]);
      const double p = it == counts[s].end() ? 0 : it->second.first;
      const double n = it == counts[s].end() ? 0 : it->second.second;
      scores[i] += std::log((p + kPrior * base) / (n + kPrior * (1 - base)));
    }
  }
  absl::StatusOr<double> learned_auc = ExactAuc(scores, labels);
  ASSERT_TRUE(learned_auc.ok());
  EXPECT_GT(*learned_auc, 0.72);
  EXPECT_LT(*learned_auc, *true_auc);
}

TEST(CtrDataTest, LargeVocabularyAndOptionChecks) {
  CtrDataOptions o;
  o.vocab_per_slot = 100000000;
  o.num_dense = 2;
  o.num_sparse = 3;
  absl::StatusOr<Dataset> data = MakeCtrData(2000, o);
  ASSERT_TRUE(data.ok()) << data.status();
  int64_t max_rank = 0;
  for (const Example& ex : data->examples) {
    ASSERT_EQ(ex.dense.size(), 2u);
    for (int s = 0; s < 3; ++s) {
      int64_t rank;
      ASSERT_TRUE(CtrRank(s, ex.sparse[s], &rank));
      max_rank = std::max(max_rank, rank);
    }
  }
  EXPECT_GT(max_rank, 1000000);  // Reaches deep into the vocabulary.
  EXPECT_LT(max_rank, 100000000);

  auto error = [](CtrDataOptions bad) {
    return std::string(MakeCtrData(1, bad).status().message());
  };
  CtrDataOptions bad;
  bad.vocab_per_slot = 0;
  EXPECT_THAT(error(bad), HasSubstr("vocab_per_slot must be in [1, 2^40], got 0"));
  bad = CtrDataOptions();
  bad.vocab_per_slot = (int64_t{1} << 40) + 1;
  EXPECT_THAT(error(bad), HasSubstr("vocab_per_slot"));
  bad = CtrDataOptions();
  bad.alpha = -1;
  EXPECT_THAT(error(bad), HasSubstr("alpha must be finite and > 0, got -1"));
  bad = CtrDataOptions();
  bad.num_sparse = -2;
  EXPECT_THAT(error(bad), HasSubstr("num_sparse must be in [0, 65536], got -2"));
  bad = CtrDataOptions();
  bad.num_dense = -1;
  EXPECT_THAT(error(bad), HasSubstr("num_dense must be >= 0, got -1"));
  EXPECT_EQ(MakeCtrData(-5, CtrDataOptions()).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace data
}  // namespace tessera
