#include "common/data/synthetic.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/data/rng.h"

namespace tessera {
namespace data {
namespace {

constexpr double kPi = 3.14159265358979323846264338327950288;
constexpr int kRankBits = 40;
constexpr int64_t kMaxVocab = int64_t{1} << kRankBits;
constexpr int kMaxSlots = 1 << 16;
// Added before mixing so that (slot 0, rank 0) does not map to id 0 (Mix64(0) == 0); with
// slot < 2^16 the key stays below 2^56 and never reaches -kIdOffset.
constexpr uint64_t kIdOffset = 0x9e3779b97f4a7c15ULL;
constexpr int64_t kMaxDenseCount = 999999;

// log(1 + t) / t, continuous at t = 0.
double LogRatio(double t) {
  if (std::abs(t) > 1e-8) return std::log1p(t) / t;
  return 1.0 - t * (0.5 - t / 3.0);
}

// (exp(t) - 1) / t, continuous at t = 0.
double ExpRatio(double t) {
  if (std::abs(t) > 1e-8) return std::expm1(t) / t;
  return 1.0 + t * (0.5 + t / 6.0);
}

// Distinct stream keys so that the model's pseudo-random values do not coincide.
uint64_t ModelKey(uint64_t model_seed, uint64_t stream) {
  return Mix64(Mix64(model_seed ^ 0x243f6a8885a308d3ULL) + stream);
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// Regression

absl::StatusOr<Dataset> MakeRegressionData(int64_t n, uint64_t seed) {
  if (n < 0) {
    return absl::InvalidArgumentError(absl::StrCat("MakeRegressionData: n must be >= 0, got ", n));
  }
  constexpr int kFeatures = 10;
  Dataset data;
  data.num_dense = kFeatures;
  data.num_sparse = 0;
  data.examples.resize(static_cast<size_t>(n));
  std::mt19937_64 rng(seed);
  for (Example& ex : data.examples) {
    ex.dense.resize(kFeatures);
    double target = 0;
    for (int i = 0; i < kFeatures; ++i) {
      const double x = 1.0 + UniformDouble(rng);
      ex.dense[i] = static_cast<float>(x);
      target += x * x * x;
    }
    target += std::sin(2.0 * kPi * UniformDouble(rng));
    ex.label = static_cast<float>(target);
  }
  return data;
}

// ---------------------------------------------------------------------------------------------
// ZipfSampler
//
// Rejection-inversion for a decreasing, convex h(x) = x^-alpha on the ranks k = 1..n. Rank k owns
// the interval [k - 1/2, k + 1/2]; by convexity its area under h, H(k + 1/2) - H(k - 1/2), is at
// least h(k). Draw u uniformly from [H(3/2) - h(1), H(n + 1/2)), set x = H^-1(u) and
// k = round(x), and accept k iff u >= H(k + 1/2) - h(k): the accepted u form an interval of length
// exactly h(k) for each k, so P(k) is proportional to h(k). Rank 1's interval starts at
// H(3/2) - h(1), so rank 1 is always accepted; the rejected part of each other rank's
// interval is small, so the expected number of tries is a small constant for every n and alpha.

absl::StatusOr<ZipfSampler> ZipfSampler::Create(int64_t n, double alpha, uint64_t seed) {
  if (n < 1 || n > (int64_t{1} << 53)) {
    return absl::InvalidArgumentError(absl::StrCat("ZipfSampler: n must be in [1, 2^53], got ", n));
  }
  if (!(alpha > 0) || !std::isfinite(alpha)) {
    return absl::InvalidArgumentError(
        absl::StrCat("ZipfSampler: alpha must be finite and > 0, got ", alpha));
  }
  return ZipfSampler(n, alpha, seed);
}

ZipfSampler::ZipfSampler(int64_t n, double alpha, uint64_t seed)
    : n_(n), alpha_(alpha), rng_(seed) {
  u_low_ = H(1.5) - 1.0;
  u_high_ = H(static_cast<double>(n) + 0.5);
  s_ = 2.0 - HInverse(H(2.5) - h(2.0));
}

double ZipfSampler::h(double x) const { return std::exp(-alpha_ * std::log(x)); }

double ZipfSampler::H(double x) const {
  const double log_x = std::log(x);
  return ExpRatio((1.0 - alpha_) * log_x) * log_x;
}

double ZipfSampler::HInverse(double y) const { return std::exp(y * LogRatio((1.0 - alpha_) * y)); }

int64_t ZipfSampler::Sample(std::mt19937_64& rng) const {
  while (true) {
    const double u = u_low_ + UniformDouble(rng) * (u_high_ - u_low_);
    const double x = HInverse(u);
    int64_t k = static_cast<int64_t>(x + 0.5);
    if (k < 1) {
      k = 1;
    } else if (k > n_) {
      k = n_;
    }
    if (k == 1 || static_cast<double>(k) - x <= s_ ||
        u >= H(static_cast<double>(k) + 0.5) - h(static_cast<double>(k))) {
      return k - 1;
    }
  }
}

// ---------------------------------------------------------------------------------------------
// CTR data

int64_t CtrId(int slot, int64_t rank) {
  const uint64_t key = (static_cast<uint64_t>(slot) << kRankBits) | static_cast<uint64_t>(rank);
  return static_cast<int64_t>(Mix64(key + kIdOffset));
}

bool CtrRank(int slot, int64_t id, int64_t* rank) {
  const uint64_t key = UnMix64(static_cast<uint64_t>(id)) - kIdOffset;
  if (slot < 0 || (key >> kRankBits) != static_cast<uint64_t>(slot)) return false;
  *rank = static_cast<int64_t>(key & (static_cast<uint64_t>(kMaxVocab) - 1));
  return true;
}

absl::StatusOr<CtrGenerator> CtrGenerator::Create(const CtrDataOptions& options) {
  auto bad = [](auto... parts) {
    return absl::InvalidArgumentError(absl::StrCat("CtrDataOptions: ", parts...));
  };
  if (options.num_dense < 0) return bad("num_dense must be >= 0, got ", options.num_dense);
  if (options.num_sparse < 0 || options.num_sparse > kMaxSlots) {
    return bad("num_sparse must be in [0, ", kMaxSlots, "], got ", options.num_sparse);
  }
  if (options.num_multi < 0 || options.num_sparse + options.num_multi > kMaxSlots) {
    return bad("num_multi must be in [0, ", kMaxSlots, " - num_sparse], got ", options.num_multi);
  }
  if (options.max_multi_ids < 0 || options.max_multi_ids > 1000) {
    return bad("max_multi_ids must be in [0, 1000], got ", options.max_multi_ids);
  }
  if (options.vocab_per_slot < 1 || options.vocab_per_slot > kMaxVocab) {
    return bad("vocab_per_slot must be in [1, 2^40], got ", options.vocab_per_slot);
  }
  if (!(options.alpha > 0) || !std::isfinite(options.alpha)) {
    return bad("alpha must be finite and > 0, got ", options.alpha);
  }
  if (!std::isfinite(options.bias) || !std::isfinite(options.slot_weight_std) ||
      !std::isfinite(options.dense_weight)) {
    return bad("bias, slot_weight_std and dense_weight must be finite");
  }
  if (!(options.head_ranks > 0) || !std::isfinite(options.head_ranks)) {
    return bad("head_ranks must be finite and > 0, got ", options.head_ranks);
  }
  absl::StatusOr<ZipfSampler> zipf = ZipfSampler::Create(options.vocab_per_slot, options.alpha);
  if (!zipf.ok()) return zipf.status();
  return CtrGenerator(options, *std::move(zipf));
}

CtrGenerator::CtrGenerator(const CtrDataOptions& options, ZipfSampler zipf)
    : options_(options),
      zipf_(std::move(zipf)),
      rng_(options.seed),
      weight_key_(ModelKey(options.model_seed, 0)) {
  dense_mean_.resize(options.num_dense);
  dense_weight_.resize(options.num_dense, 0.0);
  for (int j = 0; j < options.num_dense; ++j) {
    // Mean log count in [0.5, 4): most features have many zeros, some are large counts.
    dense_mean_[j] = 0.5 + 3.5 * HashToUnit(ModelKey(options.model_seed, 1 + 2 * j));
    if (j < options.informative_dense) {
      const bool negative = HashToUnit(ModelKey(options.model_seed, 2 + 2 * j)) < 0.5;
      dense_weight_[j] = negative ? -options.dense_weight : options.dense_weight;
    }
  }
}

double CtrGenerator::SlotWeight(int slot, int64_t rank) const {
  const uint64_t key = Mix64(static_cast<uint64_t>(CtrId(slot, rank)) ^ weight_key_);
  const double z = NormalFromUniforms(HashToUnit(key), HashToUnit(key + 1));
  return options_.slot_weight_std * z * options_.head_ranks /
         (options_.head_ranks + static_cast<double>(rank));
}

double CtrGenerator::TrueLogit(const Example& example) const {
  double logit = options_.bias;
  const int num_dense = std::min<int>(options_.num_dense, static_cast<int>(example.dense.size()));
  for (int j = 0; j < num_dense; ++j) {
    if (dense_weight_[j] != 0) logit += dense_weight_[j] * (example.dense[j] - dense_mean_[j]);
  }
  const int num_sparse =
      std::min<int>(options_.num_sparse, static_cast<int>(example.sparse.size()));
  for (int s = 0; s < num_sparse; ++s) {
    int64_t rank;
    if (CtrRank(s, example.sparse[s], &rank) && rank < options_.vocab_per_slot) {
      logit += SlotWeight(s, rank);
    }
  }
  const int num_multi = std::min<int>(options_.num_multi, static_cast<int>(example.multi.size()));
  for (int m = 0; m < num_multi; ++m) {
    const int slot = options_.num_sparse + m;
    const std::vector<int64_t>& ids = example.multi[m];
    double sum = 0;
    for (int64_t id : ids) {
      int64_t rank;
      if (CtrRank(slot, id, &rank) && rank < options_.vocab_per_slot) sum += SlotWeight(slot, rank);
    }
    if (!ids.empty()) logit += sum / static_cast<double>(ids.size());
  }
  return logit;
}

void CtrGenerator::Next(Example* example, double* logit) {
  example->dense.resize(options_.num_dense);
  example->sparse.resize(options_.num_sparse);
  for (int j = 0; j < options_.num_dense; ++j) {
    // A log-normal count: latent log count ~ N(mean, 1), floored; zero when below log 2.
    const double t = dense_mean_[j] + Normal(rng_);
    int64_t count = 0;
    if (t > 0) {
      count =
          std::min<int64_t>(static_cast<int64_t>(std::expm1(std::min(t, 20.0))), kMaxDenseCount);
    }
    example->dense[j] = static_cast<float>(std::log1p(static_cast<double>(count)));
  }
  for (int s = 0; s < options_.num_sparse; ++s) {
    example->sparse[s] = CtrId(s, zipf_.Sample(rng_));
  }
  example->multi.resize(options_.num_multi);
  for (int m = 0; m < options_.num_multi; ++m) {
    const int64_t n = std::min<int64_t>(
        static_cast<int64_t>(UniformDouble(rng_) * (options_.max_multi_ids + 1)),
        options_.max_multi_ids);
    example->multi[m].resize(static_cast<size_t>(n));
    for (int64_t& id : example->multi[m]) id = CtrId(options_.num_sparse + m, zipf_.Sample(rng_));
  }
  const double z = TrueLogit(*example);
  const double p = 1.0 / (1.0 + std::exp(-z));
  example->label = UniformDouble(rng_) < p ? 1.0f : 0.0f;
  if (logit != nullptr) *logit = z;
}

absl::StatusOr<Dataset> MakeCtrData(int64_t n, const CtrDataOptions& options) {
  if (n < 0)
    return absl::InvalidArgumentError(absl::StrCat("MakeCtrData: n must be >= 0, got ", n));
  absl::StatusOr<CtrGenerator> gen = CtrGenerator::Create(options);
  if (!gen.ok()) return gen.status();
  Dataset data;
  data.num_dense = options.num_dense;
  data.num_sparse = options.num_sparse;
  data.num_multi = options.num_multi;
  data.examples.resize(static_cast<size_t>(n));
  for (Example& ex : data.examples) gen->Next(&ex);
  return data;
}

}  // namespace data
}  // namespace tessera
