// Which pserver shard owns a row of a distributed table. Stable across processes and runs.
#ifndef TESSERA_COMMON_OPS_SHARDING_H_
#define TESSERA_COMMON_OPS_SHARDING_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "common/base/splitmix64.h"

namespace tessera {

enum class ShardMethod { kHash, kMod };

// "hash" (default: a 64-bit mix of the id, spreads skewed and clustered ids) or "mod"
// (non-negative id mod n). Unknown names fall back to hash; ParseShardMethod reports them.
inline bool ParseShardMethod(const std::string& s, ShardMethod* out) {
  if (s == "hash" || s.empty()) {
    *out = ShardMethod::kHash;
    return true;
  }
  if (s == "mod") {
    *out = ShardMethod::kMod;
    return true;
  }
  return false;
}

inline int ShardOf(int64_t id, int num_shards, ShardMethod method) {
  uint64_t u = static_cast<uint64_t>(id);
  if (method == ShardMethod::kHash) {
    u = SplitMix64Next(u);
    return static_cast<int>(u % static_cast<uint64_t>(num_shards));
  }
  int64_t m = id % num_shards;
  return static_cast<int>(m < 0 ? m + num_shards : m);
}

// A small open-addressing table over a batch's ids (deduplication on a hot path): at least
// twice as many slots as ids, a power of two, and each id's home slot by Fibonacci hashing;
// probe with (slot + 1) & mask.
struct IdHashSlots {
  explicit IdHashSlots(size_t ids) {
    while (capacity < 2 * ids) capacity <<= 1;
    for (size_t c = capacity; c > 1; c >>= 1) --shift;
  }
  size_t Home(int64_t id) const {
    return static_cast<size_t>((static_cast<uint64_t>(id) * 0x9E3779B97F4A7C15ull) >> shift);
  }
  size_t mask() const { return capacity - 1; }

  size_t capacity = 16;
  int shift = 64;
};

}  // namespace tessera

#endif  // TESSERA_COMMON_OPS_SHARDING_H_
