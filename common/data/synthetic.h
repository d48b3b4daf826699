// Synthetic data sets, deterministic given their seeds (the same bytes on every platform: only
// raw std::mt19937_64 outputs are used, see rng.h).
//
//  - MakeRegressionData: the classic perceptron regression task (10 dense features).
//  - ZipfSampler: power-law ranks over up to ~1e12 values in O(1) memory.
//  - CtrGenerator / MakeCtrData: Criteo-like click data (13 dense counts, 26 categorical slots
//    with Zipf-distributed ids spread over all of int64) with a planted, learnable signal.
#ifndef TESSERA_COMMON_DATA_SYNTHETIC_H_
#define TESSERA_COMMON_DATA_SYNTHETIC_H_

#include <cstdint>
#include <random>
#include <vector>

#include "absl/status/statusor.h"
#include "common/data/example.h"

namespace tessera {
namespace data {

// n examples with 10 dense features x_i uniform in [1, 2) and label
// sum_i x_i^3 + sin(2*pi*u), u uniform in [0, 1) (noise); num_sparse = 0.
// InvalidArgument if n < 0.
absl::StatusOr<Dataset> MakeRegressionData(int64_t n, uint64_t seed);

// Draws ranks r in [0, n) with P(r) proportional to (r + 1)^-alpha, by rejection-inversion
// (Hormann & Derflinger 1996): O(1) memory and O(1) expected time per draw for any n.
// Thread-compatible: Sample() is const; Next() uses the sampler's own generator.
class ZipfSampler {
 public:
  // InvalidArgument unless 1 <= n <= 2^53 and alpha is finite and > 0.
  static absl::StatusOr<ZipfSampler> Create(int64_t n, double alpha, uint64_t seed = 0);

  // One draw from the sampler's own std::mt19937_64(seed).
  int64_t Next() { return Sample(rng_); }
  // One draw using `rng`.
  int64_t Sample(std::mt19937_64& rng) const;

  int64_t n() const { return n_; }
  double alpha() const { return alpha_; }

 private:
  ZipfSampler(int64_t n, double alpha, uint64_t seed);
  // h(x) = x^-alpha, and H(x) = (x^(1-alpha) - 1) / (1 - alpha) (log x when alpha = 1), an
  // antiderivative of h; HInverse is its inverse.
  double h(double x) const;
  double H(double x) const;
  double HInverse(double y) const;

  int64_t n_;
  double alpha_;
  double u_low_;   // H(3/2) - h(1)
  double u_high_;  // H(n + 1/2)
  double s_;       // 2 - H^-1(H(5/2) - h(2)), see Sample().
  std::mt19937_64 rng_;
};

struct CtrDataOptions {
  int num_dense = 13;   // >= 0
  int num_sparse = 26;  // 0 .. 65536
  // Multi-hot slots (Example::multi), each a list of 0..max_multi_ids ids (length uniform),
  // drawn like a categorical slot's; num_sparse + num_multi <= 65536.
  int num_multi = 0;
  int max_multi_ids = 4;  // 0 .. 1000
  // Distinct ids per categorical slot, 1 .. 2^40; Zipf-distributed with exponent alpha > 0.
  int64_t vocab_per_slot = 1000000;
  double alpha = 1.1;
  // Seeds the draws: which examples are generated.
  uint64_t seed = 0;
  // Seeds the planted model (the weight of every id, the dense feature parameters). Use the
  // same model_seed, and different seeds, for a training set and its held-out test set.
  uint64_t model_seed = 0;

  // The planted model: logit = bias + sum over slots of w_slot(rank) + dense term, where
  // (a multi-hot slot adds the mean of its ids' weights), where
  // w_slot(rank) = slot_weight_std * z(slot, rank) * head_ranks / (head_ranks + rank), z a fixed
  // pseudo-random N(0, 1) per (model_seed, slot, rank): frequent ranks carry the signal, rare
  // ones almost none. The first min(informative_dense, num_dense) dense features add
  // +-dense_weight per standard deviation of their log count; the others are noise.
  double bias = -1.8;
  double slot_weight_std = 0.6;
  double head_ranks = 300;
  int informative_dense = 3;
  double dense_weight = 0.4;
};

// The id of (slot, rank): a fixed bijection of (slot, rank) onto int64, spread over the whole
// range (negative and huge ids included), independent of the seeds. Never 0 for valid inputs.
int64_t CtrId(int slot, int64_t rank);
// The inverse of CtrId: false when `id` is not the id of `slot` for any rank < 2^40.
bool CtrRank(int slot, int64_t id, int64_t* rank);

// Generates Criteo-like examples one at a time. Example::dense holds log1p of non-negative
// integer counts (below 10^6, as the Criteo reader stores them), Example::sparse one id per
// slot, label ~ Bernoulli(sigmoid(logit)). Not thread-safe.
class CtrGenerator {
 public:
  // InvalidArgument naming the bad option.
  static absl::StatusOr<CtrGenerator> Create(const CtrDataOptions& options);

  // The next example; `logit`, if not null, receives its true logit.
  void Next(Example* example, double* logit = nullptr);

  // The planted logit of any example with this generator's shape (e.g. one read back from a
  // file): the model is a function of the observed features only.
  double TrueLogit(const Example& example) const;
  // w_slot(rank) of the planted model.
  double SlotWeight(int slot, int64_t rank) const;

  const CtrDataOptions& options() const { return options_; }

 private:
  explicit CtrGenerator(const CtrDataOptions& options, ZipfSampler zipf);

  CtrDataOptions options_;
  ZipfSampler zipf_;
  std::mt19937_64 rng_;
  uint64_t weight_key_;
  std::vector<double> dense_mean_;    // Mean of the latent log count of each dense feature.
  std::vector<double> dense_weight_;  // 0 for the noise features.
};

// The first n examples of CtrGenerator(options), as a Dataset.
absl::StatusOr<Dataset> MakeCtrData(int64_t n, const CtrDataOptions& options);

}  // namespace data
}  // namespace tessera

#endif  // TESSERA_COMMON_DATA_SYNTHETIC_H_
