// Which examples each trainer reads.
//
// DistributedSampler splits a data set of N examples among R replicas for one epoch with the
// semantics of PyTorch's torch.utils.data.DistributedSampler. BatchSharder splits one global
// batch among N trainers. Both are immutable after Create() except SetEpoch(); thread-compatible.
#ifndef TESSERA_COMMON_DATA_SAMPLER_H_
#define TESSERA_COMMON_DATA_SAMPLER_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/types/span.h"

namespace tessera {
namespace data {

// The permutation of [0, n) every replica agrees on: Fisher-Yates over std::mt19937_64(seed)
// (unlike std::shuffle, the same on every standard library).
std::vector<int64_t> SeededPermutation(int64_t n, uint64_t seed);

struct DistributedSamplerOptions {
  // Size of the data set (N >= 0).
  int64_t num_samples = 0;
  // Number of replicas R >= 1 and this replica's rank in [0, R).
  int num_replicas = 1;
  int rank = 0;
  // Visit the examples in a per-epoch permutation seeded by seed + epoch; else in order 0..N-1.
  bool shuffle = true;
  uint64_t seed = 0;
  // false: pad the order by wrapping around to ceil(N/R)*R, so every example is visited and
  // every rank gets ceil(N/R) indices (a few examples twice). true: truncate the order to
  // floor(N/R)*R, so every rank gets floor(N/R) indices and no example repeats.
  bool drop_last = false;
};

class DistributedSampler {
 public:
  using Options = DistributedSamplerOptions;

  // InvalidArgument (naming the values) unless N >= 0, R >= 1 and 0 <= rank < R.
  static absl::StatusOr<DistributedSampler> Create(const Options& options);

  // Selects the permutation of the epoch (no effect without shuffle). Every replica must set
  // the same epoch before Indices(), otherwise shards overlap.
  void SetEpoch(int64_t epoch) { epoch_ = epoch; }
  int64_t epoch() const { return epoch_; }

  // Number of indices each rank gets: ceil(N/R), or floor(N/R) with drop_last.
  int64_t num_samples_per_replica() const { return per_replica_; }
  // num_samples_per_replica() * R.
  int64_t total_size() const { return per_replica_ * options_.num_replicas; }

  // This rank's indices for the current epoch: positions rank, rank+R, rank+2R, ... of the
  // (padded or truncated) epoch order.
  std::vector<int64_t> Indices() const;

 private:
  explicit DistributedSampler(const Options& options);

  Options options_;
  int64_t per_replica_ = 0;
  int64_t epoch_ = 0;
};

// A half-open range [begin, end) of positions.
struct ShardRange {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
  bool operator==(const ShardRange& o) const { return begin == o.begin && end == o.end; }
};

// Splits every global batch of B examples among N trainers: trainer k gets a contiguous
// sub-range, the first B mod N trainers one example more than the others. The N sub-ranges are
// disjoint, in trainer order and cover the batch, so N trainers each fed their shard of every
// global batch see exactly the examples single-machine training sees. (Sync mode averages the N
// per-trainer mean gradients, which equals the mean over the whole batch when N divides B.)
class BatchSharder {
 public:
  // InvalidArgument unless num_trainers >= 1 and 0 <= trainer_id < num_trainers.
  static absl::StatusOr<BatchSharder> Create(int num_trainers, int trainer_id);

  int num_trainers() const { return num_trainers_; }
  int trainer_id() const { return trainer_id_; }

  // This trainer's positions in a global batch of `batch_size` >= 0 examples (empty when
  // batch_size < num_trainers leaves it nothing).
  ShardRange Shard(int64_t batch_size) const { return ShardOf(batch_size, trainer_id_); }
  // Any trainer's positions; `trainer` in [0, num_trainers).
  ShardRange ShardOf(int64_t batch_size, int trainer) const;

  // This trainer's part of a global batch.
  template <typename T>
  absl::Span<const T> Slice(absl::Span<const T> batch) const {
    const ShardRange r = Shard(static_cast<int64_t>(batch.size()));
    return batch.subspan(static_cast<size_t>(r.begin), static_cast<size_t>(r.size()));
  }

 private:
  BatchSharder(int num_trainers, int trainer_id)
      : num_trainers_(num_trainers), trainer_id_(trainer_id) {}

  int num_trainers_;
  int trainer_id_;
};

}  // namespace data
}  // namespace tessera

#endif  // TESSERA_COMMON_DATA_SAMPLER_H_
