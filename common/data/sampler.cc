#include "common/data/sampler.h"

#include <numeric>
#include <random>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/data/rng.h"

namespace tessera {
namespace data {

std::vector<int64_t> SeededPermutation(int64_t n, uint64_t seed) {
  std::vector<int64_t> perm(static_cast<size_t>(n < 0 ? 0 : n));
  std::iota(perm.begin(), perm.end(), int64_t{0});
  std::mt19937_64 rng(seed);
  for (int64_t i = n - 1; i > 0; --i) {
    const int64_t j = static_cast<int64_t>(UniformBelow(rng, static_cast<uint64_t>(i) + 1));
    std::swap(perm[i], perm[j]);
  }
  return perm;
}

absl::StatusOr<DistributedSampler> DistributedSampler::Create(const Options& options) {
  if (options.num_samples < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("DistributedSampler: num_samples must be >= 0, got ", options.num_samples));
  }
  if (options.num_replicas < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("DistributedSampler: num_replicas must be >= 1, got ", options.num_replicas));
  }
  if (options.rank < 0 || options.rank >= options.num_replicas) {
    return absl::InvalidArgumentError(
        absl::StrCat("DistributedSampler: rank ", options.rank,
                     " is outside [0, num_replicas=", options.num_replicas, ")"));
  }
  return DistributedSampler(options);
}

DistributedSampler::DistributedSampler(const Options& options) : options_(options) {
  const int64_t n = options.num_samples;
  const int64_t r = options.num_replicas;
  per_replica_ = options.drop_last ? n / r : (n + r - 1) / r;
}

std::vector<int64_t> DistributedSampler::Indices() const {
  const int64_t n = options_.num_samples;
  std::vector<int64_t> order;
  if (options_.shuffle) {
    order = SeededPermutation(n, options_.seed + static_cast<uint64_t>(epoch_));
  } else {
    order.resize(static_cast<size_t>(n));
    std::iota(order.begin(), order.end(), int64_t{0});
  }
  std::vector<int64_t> mine;
  mine.reserve(static_cast<size_t>(per_replica_));
  // Position p of the padded order is order[p mod n]; truncation just stops early.
  const int64_t total = total_size();
  for (int64_t p = options_.rank; p < total; p += options_.num_replicas) {
    mine.push_back(order[static_cast<size_t>(p % n)]);
  }
  return mine;
}

absl::StatusOr<BatchSharder> BatchSharder::Create(int num_trainers, int trainer_id) {
  if (num_trainers < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("BatchSharder: num_trainers must be >= 1, got ", num_trainers));
  }
  if (trainer_id < 0 || trainer_id >= num_trainers) {
    return absl::InvalidArgumentError(absl::StrCat("BatchSharder: trainer_id ", trainer_id,
                                                   " is outside [0, num_trainers=", num_trainers,
                                                   ")"));
  }
  return BatchSharder(num_trainers, trainer_id);
}

ShardRange BatchSharder::ShardOf(int64_t batch_size, int trainer) const {
  if (batch_size < 0) batch_size = 0;
  const int64_t base = batch_size / num_trainers_;
  const int64_t extra = batch_size % num_trainers_;
  const int64_t k = trainer;
  ShardRange r;
  r.begin = k * base + (k < extra ? k : extra);
  r.end = r.begin + base + (k < extra ? 1 : 0);
  return r;
}

}  // namespace data
}  // namespace tessera
