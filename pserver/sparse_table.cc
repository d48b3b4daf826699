#include "pserver/sparse_table.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

#ifdef __SSE4_2__
#include <nmmintrin.h>
#endif

#include "Eigen/Core"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "common/base/status.h"
#include "common/ops/counter_rng.h"
#include "common/ops/optimizer_rows.h"
#include "common/ops/optimizer_rules.h"
#include "pserver/chunk_arena.h"

static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
              "the export format is written in host byte order, which must be little-endian");

namespace tessera {

namespace sparse_table_format {

namespace {

// The byte-at-a-time table of the reflected CRC-32C polynomial.
struct Crc32cTable {
  uint32_t t[256];
  constexpr Crc32cTable() : t() {
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
      t[i] = c;
    }
  }
};
[[maybe_unused]] constexpr Crc32cTable kCrcTable;

}  // namespace

uint32_t Crc32c(const void* data, size_t n, uint32_t crc) {
  const uint8_t* p = static_cast<const uint8_t*>(data);
  crc = ~crc;
#ifdef __SSE4_2__
  uint64_t c = crc;
  for (; n >= 8; n -= 8, p += 8) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    c = _mm_crc32_u64(c, v);
  }
  crc = static_cast<uint32_t>(c);
  for (; n > 0; --n) crc = _mm_crc32_u8(crc, *p++);
#else
  for (; n > 0; --n) crc = kCrcTable.t[(crc ^ *p++) & 0xFF] ^ (crc >> 8);
#endif
  return ~crc;
}

}  // namespace sparse_table_format

namespace {

namespace fmt = sparse_table_format;

constexpr uint32_t kNoSlot = 0xFFFFFFFFu;
constexpr uint64_t kMaxRowsPerShard = uint64_t{1} << 31;
constexpr uint64_t kInitialCapacity = 16;
constexpr size_t kRowHeaderBytes = 16;
constexpr size_t kChunkTargetBytes = size_t{64} << 10;
constexpr uint32_t kImportedEpoch = 1;
constexpr int64_t kMaxDim = int64_t{1} << 20;

// A hash map bucket: the row's slot (kNoSlot = empty) and the low 32 bits of its id's hash,
// which also give the bucket's home position (tag & mask) when the map is rebuilt.
struct Bucket {
  uint32_t slot;
  uint32_t tag;
};
static_assert(sizeof(Bucket) == 8, "Bucket must stay 8 bytes");

// The first 16 bytes of a slot. A free slot has epoch 0 and keeps the next free slot in `seen`.
struct RowHeader {
  int64_t id;
  uint32_t seen;   // step clock (low 32 bits) or seconds since the table's creation
  uint32_t epoch;  // export epoch of the last change
};
static_assert(sizeof(RowHeader) == kRowHeaderBytes, "RowHeader must stay 16 bytes");

struct Pending {
  uint32_t count = 0;
  uint32_t seen = 0;
};

// An id EvictStale removed, with epoch_ at its removal.
struct Tombstone {
  int64_t id;
  uint32_t epoch;
};

// Where a batch starts its walk over the shards: different per call and thread, so that
// concurrent batches do not queue behind each other on the same shard locks in lockstep.
int StartShardBits() {
  thread_local uint64_t state = reinterpret_cast<uintptr_t>(&state);
  state = counter_rng_internal::Mix64(state + counter_rng_internal::kGolden);
  return static_cast<int>(state >> 40);
}

// out = in[0, n) * scale. Not inlined, so that the products are rounded to float before the
// caller sums them (no fused multiply-add across the two).
__attribute__((noinline)) void ScaleInto(const float* in, size_t n, float scale, float* out) {
  for (size_t i = 0; i < n; ++i) out[i] = in[i] * scale;
}

inline uint64_t HashId(int64_t id) {
  return counter_rng_internal::Mix64(static_cast<uint64_t>(id) + counter_rng_internal::kGolden);
}

using ArrayMap = Eigen::Map<Eigen::Array<float, Eigen::Dynamic, 1>>;
using ConstArrayMap = Eigen::Map<const Eigen::Array<float, Eigen::Dynamic, 1>>;

uint32_t OptCode(const std::string& name) { return name == "adagrad" ? 1 : name == "adam" ? 2 : 0; }

std::string ErrnoText() { return std::strerror(errno); }

// write() all of [p, p + n).
bool WriteAll(int fd, const char* p, size_t n) {
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

// pread() exactly n bytes at `offset`; false on error or early end of file (errno 0).
bool ReadAllAt(int fd, char* p, size_t n, uint64_t offset) {
  while (n > 0) {
    const ssize_t r = ::pread(fd, p, n, static_cast<off_t>(offset));
    if (r < 0) {
      if (errno == EINTR) continue;
      return false;
    }
    if (r == 0) {
      errno = 0;
      return false;
    }
    p += r;
    n -= static_cast<size_t>(r);
    offset += static_cast<uint64_t>(r);
  }
  return true;
}

template <typename T>
void Put(char* p, T v) {
  std::memcpy(p, &v, sizeof(T));
}
template <typename T>
T Get(const char* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}

// Closes a file descriptor on scope exit.
class FdCloser {
 public:
  explicit FdCloser(int fd) : fd_(fd) {}
  ~FdCloser() {
    if (fd_ >= 0) ::close(fd_);
  }
  // Closes now; false (errno set) on failure.
  bool Close() {
    const int fd = fd_;
    fd_ = -1;
    return ::close(fd) == 0;
  }

 private:
  int fd_;
};

}  // namespace

struct alignas(64) SparseTable::Shard {
  mutable absl::Mutex mu;
  std::unique_ptr<Bucket[]> buckets ABSL_GUARDED_BY(mu);
  uint64_t capacity ABSL_GUARDED_BY(mu) = 0;      // buckets, a power of two
  // The address of `buckets` and capacity - 1, published under mu whenever they change and read
  // without it: a batch prefetches the buckets of all its ids before it locks any shard. They
  // are only ever prefetch hints (a stale pair prefetches a useless line, which is harmless).
  std::atomic<uintptr_t> bucket_hint{0};
  std::atomic<uint64_t> mask_hint{0};
  uint64_t size ABSL_GUARDED_BY(mu) = 0;          // live rows
  std::vector<char*> chunks ABSL_GUARDED_BY(mu);  // owned by the table's ChunkArena
  uint32_t used_slots ABSL_GUARDED_BY(mu) = 0;    // slots [0, used_slots) were handed out
  uint32_t free_head ABSL_GUARDED_BY(mu) = kNoSlot;
  // Rows ever removed (RemoveRow): a remembered lookup's slots of this shard are still the rows
  // of its ids while this has not moved (a freed slot may hold another id by now).
  uint64_t removals ABSL_GUARDED_BY(mu) = 0;
  absl::flat_hash_map<int64_t, Pending> pending ABSL_GUARDED_BY(mu);
  int64_t created ABSL_GUARDED_BY(mu) = 0;
  int64_t evicted ABSL_GUARDED_BY(mu) = 0;
  int64_t dropped ABSL_GUARDED_BY(mu) = 0;
  int64_t refused ABSL_GUARDED_BY(mu) = 0;
  // Ids evicted since the delta cut (some perhaps older, or with a row again; see "Deltas").
  std::vector<Tombstone> tombstones ABSL_GUARDED_BY(mu);
  // Why the last CreateRow of this shard returned kNoSlot (read by ShardFull).
  enum class Failure { kNone, kFull, kBudget, kMemory };
  Failure failure ABSL_GUARDED_BY(mu) = Failure::kNone;
};

// A batch of ids with duplicates linked to their first occurrence, first occurrences grouped
// by shard.
struct SparseTable::Partition {
  static constexpr uint32_t kEnd = 0xFFFFFFFFu;
  std::vector<uint64_t> hash;   // per first occurrence
  std::vector<uint32_t> next;   // per position: the next position with the same id, or kEnd
  std::vector<uint32_t> count;  // per first occurrence: occurrences of its id in the batch
  std::vector<uint32_t> order;  // first occurrences grouped by shard, ascending within a shard
  std::vector<uint32_t> begin;  // shard s owns order[begin[s], begin[s + 1])
  std::vector<uint32_t> slot;   // parallel to order: the row's slot, or kNoSlot (FindSlots)
  // Scratch of PartitionIds, kept so that a thread's next batch allocates nothing.
  std::vector<uint32_t> first, tail, firsts, cursor;
};

struct SparseTable::Remembered {
  std::vector<int64_t> ids;        // the lookup's batch
  Partition part;                  // its partition, with every first occurrence's slot
  std::vector<uint64_t> removals;  // per shard: Shard::removals when its slots were found

  // Bytes held (capacities).
  size_t Bytes() const {
    auto bytes = [](const auto& v) { return v.capacity() * sizeof(v[0]); };
    const Partition& p = part;
    return sizeof(*this) + bytes(ids) + bytes(removals) + bytes(p.hash) + bytes(p.next) +
           bytes(p.count) + bytes(p.order) + bytes(p.begin) + bytes(p.slot) + bytes(p.first) +
           bytes(p.tail) + bytes(p.firsts) + bytes(p.cursor);
  }
};

namespace {
// Remembered lookups hold about 50 bytes per id: a lookup of more ids than this is not
// remembered, and a table's remembered lookups hold at most kRememberedIdsBudget ids in all
// (the oldest go first) and keep at most kSpareRemembered emptied ones for reuse.
constexpr size_t kMaxRememberedIds = size_t{1} << 16;
constexpr size_t kRememberedIdsBudget = size_t{1} << 18;
constexpr size_t kSpareRemembered = 2;
}  // namespace

absl::StatusOr<std::unique_ptr<SparseTable>> SparseTable::Create(const SparseTableOptions& o) {
  auto bad = [](const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat("SparseTableOptions.", what));
  };
  if (o.dim < 1 || o.dim > kMaxDim) {
    return bad(absl::StrCat("dim is ", o.dim, "; it must be in [1, ", kMaxDim, "]"));
  }
  // An initializer's parameters; `who` prefixes the message ("" or "members[m] ").
  auto check_init = [&](const SparseTableInitializer& init,
                        const std::string& who) -> absl::Status {
    switch (init.kind) {
      case SparseTableInitializer::kUniform:
        if (!std::isfinite(init.min) || !std::isfinite(init.max) || !(init.min <= init.max)) {
          return bad(absl::StrCat(who, "initializer min ", init.min, " and max ", init.max,
                                  " must be finite with min <= max"));
        }
        return absl::OkStatus();
      case SparseTableInitializer::kGaussian:
        if (!std::isfinite(init.mean) || !std::isfinite(init.std) || init.std < 0) {
          return bad(absl::StrCat(who, "initializer mean ", init.mean, " and std ", init.std,
                                  " must be finite with std >= 0"));
        }
        return absl::OkStatus();
      case SparseTableInitializer::kConstant:
        if (!std::isfinite(init.value)) {
          return bad(absl::StrCat(who, "initializer value ", init.value, " must be finite"));
        }
        return absl::OkStatus();
    }
    return bad(absl::StrCat(who, "initializer kind ", static_cast<int>(init.kind),
                            " is not kUniform, kGaussian or kConstant"));
  };
  if (o.members.empty()) {
    TS_RETURN_IF_ERROR(check_init(o.initializer, ""));
  } else {
    int64_t sum = 0;
    for (size_t m = 0; m < o.members.size(); ++m) {
      const SparseTableMember& member = o.members[m];
      const std::string who = absl::StrCat("members[", m, "] (", member.name, ") ");
      if (member.dim < 1 || member.dim > o.dim) {
        return bad(absl::StrCat(who, "dim is ", member.dim, "; it must be in [1, ", o.dim, "]"));
      }
      TS_RETURN_IF_ERROR(check_init(member.initializer, who));
      sum += member.dim;
    }
    if (sum != o.dim) {
      return bad(absl::StrCat("members' dims sum to ", sum, ", not to dim ", o.dim));
    }
  }
  Opt opt;
  if (o.optimizer == "sgd") {
    opt = Opt::kSgd;
  } else if (o.optimizer == "adagrad") {
    opt = Opt::kAdagrad;
  } else if (o.optimizer == "adam") {
    opt = Opt::kAdam;
  } else {
    return bad(absl::StrCat("optimizer is '", o.optimizer, "'; expected sgd, adagrad or adam"));
  }
  if (!std::isfinite(o.l2)) return bad(absl::StrCat("l2 is ", o.l2, "; it must be finite"));
  if (!(o.adagrad_epsilon >= 0) || !std::isfinite(o.adagrad_epsilon)) {
    return bad(absl::StrCat("adagrad_epsilon is ", o.adagrad_epsilon, "; it must be >= 0"));
  }
  if (!(o.adam_beta1 >= 0 && o.adam_beta1 < 1) || !(o.adam_beta2 >= 0 && o.adam_beta2 < 1)) {
    return bad(absl::StrCat("adam_beta1 ", o.adam_beta1, " and adam_beta2 ", o.adam_beta2,
                            " must be in [0, 1)"));
  }
  if (!(o.adam_epsilon >= 0) || !std::isfinite(o.adam_epsilon)) {
    return bad(absl::StrCat("adam_epsilon is ", o.adam_epsilon, "; it must be >= 0"));
  }
  if (o.num_shards < 1 || o.num_shards > 4096 || (o.num_shards & (o.num_shards - 1)) != 0) {
    return bad(
        absl::StrCat("num_shards is ", o.num_shards, "; it must be a power of two in [1, 4096]"));
  }
  constexpr int64_t kMaxAge = std::numeric_limits<int32_t>::max();
  if (o.admission_threshold < 0 || o.admission_threshold > kMaxAge) {
    return bad(absl::StrCat("admission_threshold is ", o.admission_threshold,
                            "; it must be in [0, ", kMaxAge, "] (0 = off)"));
  }
  if (o.evict_after_steps < 0 || o.evict_after_steps > kMaxAge || o.evict_after_seconds < 0 ||
      o.evict_after_seconds > kMaxAge) {
    return bad(absl::StrCat("evict_after_steps ", o.evict_after_steps, " and evict_after_seconds ",
                            o.evict_after_seconds, " must be in [0, ", kMaxAge, "] (0 = off)"));
  }
  if (o.max_rows < 0) return bad(absl::StrCat("max_rows is ", o.max_rows, "; it must be >= 0"));
  if (o.remember_lookups < 0 || o.remember_lookups > 64) {
    return bad(absl::StrCat("remember_lookups is ", o.remember_lookups, "; it must be in [0, 64]"));
  }
  if (o.evict_after_steps > 0 && o.evict_after_seconds > 0) {
    return bad(absl::StrCat("evict_after_steps (", o.evict_after_steps,
                            ") and evict_after_seconds (", o.evict_after_seconds,
                            ") are both set; use at most one"));
  }
  return std::unique_ptr<SparseTable>(new SparseTable(o, opt));
}

namespace {
int64_t StateMultiple(const std::string& optimizer) {
  return optimizer == "adagrad" ? 1 : optimizer == "adam" ? 2 : 0;
}
size_t SlotStride(int64_t dim, int64_t state_width) {
  const size_t bytes = kRowHeaderBytes + sizeof(float) * static_cast<size_t>(dim + state_width);
  return (bytes + 7) / 8 * 8;
}
// The rows each internal shard of `o` expects, as far as the first region of row memory holds
// them (stride: bytes per row); 0 when unknown.
int64_t ExpectedRowsPerShard(const SparseTableOptions& o, size_t stride) {
  if (o.expected_rows <= 0) return 0;
  const int64_t shards = o.num_shards;
  const int64_t in_first_region =
      static_cast<int64_t>(ChunkArena::FirstRegionBytes() / stride) / shards;
  return std::min((o.expected_rows + shards - 1) / shards, in_first_region);
}

// The arena of a table of `o` whose rows take `stride` bytes, 2^chunk_shift rows a chunk.
ChunkArenaOptions ArenaOptions(const SparseTableOptions& o, size_t stride, int chunk_shift) {
  ChunkArenaOptions a;
  a.chunk_bytes = stride << chunk_shift;
  a.prefault = o.prefault;
  // Every shard takes whole chunks: the chunks its expected rows fill, for every shard.
  const size_t rows_per_chunk = size_t{1} << chunk_shift;
  const size_t rows = static_cast<size_t>(ExpectedRowsPerShard(o, stride));
  a.first_bytes = (rows + rows_per_chunk - 1) / rows_per_chunk * a.chunk_bytes *
                  static_cast<size_t>(o.num_shards);
  return a;
}
int ChunkShift(size_t stride) {
  int shift = 0;
  while ((stride << (shift + 1)) <= kChunkTargetBytes) ++shift;
  return shift;
}
// A row is `blocks` blocks of `row_dim` floats (values, then each optimizer state); a record
// holds columns [offset, offset + width) of each, back to back. Gather copies row -> record,
// Scatter record -> row.
void GatherColumns(const float* row, int64_t row_dim, int64_t offset, int64_t width, int64_t blocks,
                   char* rec) {
  const size_t bytes = sizeof(float) * static_cast<size_t>(width);
  for (int64_t b = 0; b < blocks; ++b)
    std::memcpy(rec + b * bytes, row + b * row_dim + offset, bytes);
}
void ScatterColumns(const char* rec, int64_t row_dim, int64_t offset, int64_t width, int64_t blocks,
                    float* row) {
  const size_t bytes = sizeof(float) * static_cast<size_t>(width);
  for (int64_t b = 0; b < blocks; ++b)
    std::memcpy(row + b * row_dim + offset, rec + b * bytes, bytes);
}
}  // namespace

std::vector<SparseTable::Column> SparseTable::ColumnsOf(const SparseTableOptions& o) {
  if (o.members.empty()) return {{0, o.dim, o.initializer}};
  std::vector<Column> columns;
  int64_t offset = 0;
  for (const SparseTableMember& m : o.members) {
    columns.push_back({offset, m.dim, m.initializer});
    offset += m.dim;
  }
  return columns;
}

SparseTable::SparseTable(const SparseTableOptions& options, Opt opt)
    : options_(options),
      opt_(opt),
      dim_(options.dim),
      state_width_(StateMultiple(options.optimizer) * options.dim),
      columns_(ColumnsOf(options)),
      stride_(SlotStride(dim_, state_width_)),
      chunk_shift_(ChunkShift(stride_)),
      shard_mask_(options.num_shards - 1),
      pending_cap_(static_cast<size_t>(
          std::max<int64_t>(1, options.max_rows / std::max(1, options.num_shards)))),
      created_(options.clock ? options.clock() : absl::Now()),
      arena_(new ChunkArena(ArenaOptions(options, stride_, chunk_shift_))),
      shards_(new Shard[options.num_shards]),
      remember_(options.remember_lookups > 0 && options.admission_threshold <= 1) {
  // Each shard's map sized for its share of the expected rows that the first region holds (a
  // load factor <= 3/4, as CreateRow keeps it), so that they are inserted without rehashing.
  const uint64_t expected = static_cast<uint64_t>(ExpectedRowsPerShard(options, stride_));
  uint64_t capacity = kInitialCapacity;
  while (expected * 4 > capacity * 3) capacity *= 2;
  for (int s = 0; s < options.num_shards; ++s) {
    Shard& shard = shards_[s];
    absl::MutexLock lock(&shard.mu);
    shard.capacity = capacity;
    shard.buckets.reset(new Bucket[capacity]);
    std::memset(shard.buckets.get(), 0xFF, sizeof(Bucket) * capacity);
    PublishBuckets(shard);
  }
}

SparseTable::~SparseTable() = default;

char* SparseTable::SlotPtr(const Shard& shard, uint32_t slot) const ABSL_NO_THREAD_SAFETY_ANALYSIS {
  const uint32_t mask = (uint32_t{1} << chunk_shift_) - 1;
  return shard.chunks[slot >> chunk_shift_] + static_cast<size_t>(slot & mask) * stride_;
}

void SparseTable::InitValues(int64_t id, float* values) const {
  for (const Column& c : columns_) {
    const SparseTableInitializer& init = c.initializer;
    const uint64_t first = static_cast<uint64_t>(id) * static_cast<uint64_t>(c.dim);
    float* v = values + c.offset;
    switch (init.kind) {
      case SparseTableInitializer::kUniform:
        FillCounterUniform<float>(init.seed, first, init.min, init.max, v, c.dim);
        break;
      case SparseTableInitializer::kGaussian:
        FillCounterGaussian<float>(init.seed, first, init.mean, init.std, v, c.dim);
        break;
      case SparseTableInitializer::kConstant:
        std::fill(v, v + c.dim, static_cast<float>(init.value));
        break;
    }
  }
}

SparseTableOptions SparseTable::MemberOptions(int member) const {
  SparseTableOptions o = options_;
  o.members.clear();
  const Column& c = columns_[static_cast<size_t>(member)];
  o.dim = c.dim;
  o.initializer = c.initializer;
  return o;
}

void SparseTable::PartitionIds(absl::Span<const int64_t> ids, Partition* p) const {
  constexpr uint32_t kEnd = Partition::kEnd;
  const size_t n = ids.size();
  // Scratch is per thread and kept between batches; a thread that once saw a huge batch gives
  // the memory back rather than holding it for ever.
  constexpr size_t kKeepIds = size_t{1} << 20;
  if (n <= kKeepIds && p->next.capacity() > kKeepIds) *p = Partition();
  const int num_shards = shard_mask_ + 1;
  p->hash.resize(n);
  p->next.assign(n, kEnd);
  p->count.resize(n);
  p->begin.assign(num_shards + 1, 0);
  // First occurrences by open addressing on the id hash (a small, cache-resident table).
  size_t cap = 16;
  while (cap < 2 * n) cap *= 2;
  const size_t mask = cap - 1;
  std::vector<uint32_t>& first = p->first;
  std::vector<uint32_t>& tail = p->tail;
  std::vector<uint32_t>& firsts = p->firsts;
  first.assign(cap, kEnd);
  tail.resize(n);
  firsts.clear();
  firsts.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    const int64_t id = ids[i];
    const uint64_t h = HashId(id);
    for (size_t j = h & mask;; j = (j + 1) & mask) {
      const uint32_t f = first[j];
      if (f == kEnd) {
        first[j] = static_cast<uint32_t>(i);
        p->hash[i] = h;
        p->count[i] = 1;
        tail[i] = static_cast<uint32_t>(i);
        firsts.push_back(static_cast<uint32_t>(i));
        ++p->begin[((h >> 32) & shard_mask_) + 1];
        break;
      }
      if (ids[f] == id) {
        p->next[tail[f]] = static_cast<uint32_t>(i);
        tail[f] = static_cast<uint32_t>(i);
        ++p->count[f];
        break;
      }
    }
  }
  for (int s = 0; s < num_shards; ++s) p->begin[s + 1] += p->begin[s];
  p->order.resize(firsts.size());
  p->slot.resize(firsts.size());
  std::vector<uint32_t>& cursor = p->cursor;
  cursor.assign(p->begin.begin(), p->begin.end() - 1);
  for (uint32_t i : firsts) p->order[cursor[(p->hash[i] >> 32) & shard_mask_]++] = i;
}

void SparseTable::PublishBuckets(Shard& shard) const ABSL_NO_THREAD_SAFETY_ANALYSIS {
  shard.bucket_hint.store(reinterpret_cast<uintptr_t>(shard.buckets.get()),
                          std::memory_order_relaxed);
  shard.mask_hint.store(shard.capacity - 1, std::memory_order_relaxed);
}

void SparseTable::PrefetchBuckets(const Partition& part) const {
  for (int s = 0; s <= shard_mask_; ++s) {
    const uint32_t b = part.begin[s], e = part.begin[s + 1];
    if (b == e) continue;
    const Shard& shard = shards_[s];
    const uintptr_t base = shard.bucket_hint.load(std::memory_order_relaxed);
    const uint64_t mask = shard.mask_hint.load(std::memory_order_relaxed);
    for (uint32_t k = b; k < e; ++k) {
      // Integer arithmetic: the array may have been replaced since (a prefetch never faults).
      __builtin_prefetch(
          reinterpret_cast<const void*>(base + (part.hash[part.order[k]] & mask) * sizeof(Bucket)));
    }
  }
}

void SparseTable::FindSlots(const Shard& shard, absl::Span<const int64_t> ids, Partition* part,
                            uint32_t b, uint32_t e) const ABSL_NO_THREAD_SAFETY_ANALYSIS {
  // First the rows whose bucket tag matches (the buckets are cached by now), so that their
  // misses overlap; then the exact search, which compares each row's id.
  const uint64_t mask = shard.capacity - 1;
  const Bucket* buckets = shard.buckets.get();
  for (uint32_t k = b; k < e; ++k) {
    const uint32_t tag = static_cast<uint32_t>(part->hash[part->order[k]]);
    for (uint64_t i = tag & mask;; i = (i + 1) & mask) {
      const Bucket bucket = buckets[i];
      if (bucket.slot == kNoSlot) break;
      if (bucket.tag == tag) {
        const char* row = SlotPtr(shard, bucket.slot);
        for (size_t line = 0; line < stride_; line += 64) __builtin_prefetch(row + line);
        break;
      }
    }
  }
  for (uint32_t k = b; k < e; ++k) {
    const uint32_t pos = part->order[k];
    part->slot[k] = FindSlot(shard, ids[pos], part->hash[pos]);
  }
}

uint32_t SparseTable::FindSlot(const Shard& shard, int64_t id,
                               uint64_t hash) const ABSL_NO_THREAD_SAFETY_ANALYSIS {
  const uint32_t tag = static_cast<uint32_t>(hash);
  const uint64_t mask = shard.capacity - 1;
  const Bucket* buckets = shard.buckets.get();
  for (uint64_t i = tag & mask;; i = (i + 1) & mask) {
    const Bucket b = buckets[i];
    if (b.slot == kNoSlot) return kNoSlot;
    if (b.tag == tag && reinterpret_cast<const RowHeader*>(SlotPtr(shard, b.slot))->id == id) {
      return b.slot;
    }
  }
}

uint32_t SparseTable::CreateRow(Shard& shard, int64_t id, uint64_t hash, uint32_t seen,
                                uint32_t epoch,
                                bool initialize) const ABSL_NO_THREAD_SAFETY_ANALYSIS {
  if (shard.size >= kMaxRowsPerShard) {
    shard.failure = Shard::Failure::kFull;
    return kNoSlot;
  }
  if (options_.max_rows > 0 &&
      budget_used_.fetch_add(1, std::memory_order_relaxed) >= options_.max_rows) {
    budget_used_.fetch_sub(1, std::memory_order_relaxed);
    shard.failure = Shard::Failure::kBudget;
    ++shard.refused;
    return kNoSlot;
  }
  // Grow the map first so that the load factor stays <= 3/4.
  if ((shard.size + 1) * 4 > shard.capacity * 3) {
    const uint64_t cap = shard.capacity * 2;
    const uint64_t mask = cap - 1;
    std::unique_ptr<Bucket[]> next(new Bucket[cap]);
    std::memset(next.get(), 0xFF, sizeof(Bucket) * cap);
    for (uint64_t i = 0; i < shard.capacity; ++i) {
      const Bucket b = shard.buckets[i];
      if (b.slot == kNoSlot) continue;
      uint64_t j = b.tag & mask;
      while (next[j].slot != kNoSlot) j = (j + 1) & mask;
      next[j] = b;
    }
    shard.buckets = std::move(next);
    shard.capacity = cap;
    PublishBuckets(shard);
  }
  uint32_t slot;
  if (shard.free_head != kNoSlot) {
    slot = shard.free_head;
    shard.free_head = reinterpret_cast<RowHeader*>(SlotPtr(shard, slot))->seen;
  } else {
    if (static_cast<uint64_t>(shard.used_slots) == static_cast<uint64_t>(shard.chunks.size())
                                                       << chunk_shift_) {
      char* chunk = arena_->Allocate();
      if (chunk == nullptr) {  // out of memory for new rows
        if (options_.max_rows > 0) budget_used_.fetch_sub(1, std::memory_order_relaxed);
        shard.failure = Shard::Failure::kMemory;
        return kNoSlot;
      }
      shard.chunks.push_back(chunk);
    }
    slot = shard.used_slots++;
  }
  char* p = SlotPtr(shard, slot);
  RowHeader* h = reinterpret_cast<RowHeader*>(p);
  h->id = id;
  h->seen = seen;
  h->epoch = epoch;
  if (initialize) {
    float* values = reinterpret_cast<float*>(p + kRowHeaderBytes);
    InitValues(id, values);
    if (state_width_ > 0) std::memset(values + dim_, 0, sizeof(float) * state_width_);
  }
  const uint32_t tag = static_cast<uint32_t>(hash);
  const uint64_t mask = shard.capacity - 1;
  uint64_t i = tag & mask;
  while (shard.buckets[i].slot != kNoSlot) i = (i + 1) & mask;
  shard.buckets[i] = Bucket{slot, tag};
  ++shard.size;
  ++shard.created;
  return slot;
}

void SparseTable::RemoveRow(Shard& shard, uint32_t slot) const ABSL_NO_THREAD_SAFETY_ANALYSIS {
  RowHeader* h = reinterpret_cast<RowHeader*>(SlotPtr(shard, slot));
  const uint64_t mask = shard.capacity - 1;
  Bucket* buckets = shard.buckets.get();
  uint64_t i = static_cast<uint32_t>(HashId(h->id)) & mask;
  while (buckets[i].slot != slot) i = (i + 1) & mask;
  // Backward-shift deletion: move later entries of the probe run into the hole unless their
  // home position lies cyclically in (hole, j].
  for (uint64_t j = i;;) {
    j = (j + 1) & mask;
    if (buckets[j].slot == kNoSlot) break;
    const uint64_t home = buckets[j].tag & mask;
    const bool stays = i <= j ? (i < home && home <= j) : (i < home || home <= j);
    if (!stays) {
      buckets[i] = buckets[j];
      i = j;
    }
  }
  buckets[i].slot = kNoSlot;
  h->epoch = 0;
  h->seen = shard.free_head;
  shard.free_head = slot;
  --shard.size;
  ++shard.removals;
  if (options_.max_rows > 0) budget_used_.fetch_sub(1, std::memory_order_relaxed);
}

void SparseTable::ApplyOptimizer(char* slot, const float* grad, float lr, float lr_t) const {
  float* p = reinterpret_cast<float*>(slot + kRowHeaderBytes);
  const float c = static_cast<float>(options_.l2);
  // The rules of common/ops/optimizer_rules.h eight elements at a time, as the dense kernels
  // (common/ops/optimizer_ops.cc) apply them: results match bit for bit.
  switch (opt_) {
    case Opt::kSgd:
      optimizer_rows::SgdRow(p, grad, dim_, lr, c);
      break;
    case Opt::kAdagrad:
      optimizer_rows::AdagradRow(p, p + dim_, grad, dim_, lr,
                                 static_cast<float>(options_.adagrad_epsilon), c);
      break;
    case Opt::kAdam:
      optimizer_rows::AdamRow(
          p, p + dim_, p + 2 * dim_, grad, dim_, lr_t, static_cast<float>(options_.adam_beta1),
          static_cast<float>(options_.adam_beta2), static_cast<float>(options_.adam_epsilon), c);
      break;
  }
}

int SparseTable::StartShard() const { return StartShardBits() & shard_mask_; }

uint32_t SparseTable::NowSeconds() const {
  const absl::Time now = options_.clock ? options_.clock() : absl::Now();
  const int64_t s = absl::ToInt64Seconds(now - created_);
  return static_cast<uint32_t>(std::clamp<int64_t>(s, 0, std::numeric_limits<uint32_t>::max()));
}

uint32_t SparseTable::SeenStamp() const {
  if (options_.evict_after_seconds > 0) return NowSeconds();
  return static_cast<uint32_t>(step_.load(std::memory_order_relaxed));
}

absl::Status SparseTable::ShardFull(int shard_index) const ABSL_NO_THREAD_SAFETY_ANALYSIS {
  // Called with the shard's lock held, after CreateRow failed: the shard hit its row limit, or
  // no memory could be mapped for a new chunk.
  const Shard& shard = shards_[shard_index];
  if (shard.failure == Shard::Failure::kBudget) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "sparse table holds its budget of ", options_.max_rows,
        " rows (--table_max_rows): a new id was refused and no row was dropped (raise the budget, "
        "add pservers, or use --table_admission_threshold / --table_evict_after_steps)"));
  }
  if (shard.failure == Shard::Failure::kMemory) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "sparse table shard ", shard_index, ": out of memory for new rows (mmap failed) after ",
        shard.size, " rows in this shard"));
  }
  return absl::ResourceExhaustedError(absl::StrCat("sparse table shard ", shard_index, " is full (",
                                                   kMaxRowsPerShard,
                                                   " rows); use more shards or pservers"));
}

void SparseTable::AdvanceStep(int64_t step) {
  int64_t cur = step_.load(std::memory_order_relaxed);
  while (step > cur && !step_.compare_exchange_weak(cur, step, std::memory_order_relaxed)) {
  }
}

absl::Status SparseTable::Lookup(absl::Span<const int64_t> ids, float* out) {
  if (ids.empty()) return absl::OkStatus();
  if (out == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("SparseTable::Lookup of ", ids.size(), " ids with a null output"));
  }
  if (ids.size() >= Partition::kEnd) {
    return absl::InvalidArgumentError(
        absl::StrCat("SparseTable::Lookup batch of ", ids.size(), " ids is too large"));
  }
  // The same ids looked up again (the pserver's look-ahead, then its lookup after the update)
  // only copy the rows.
  std::unique_ptr<Remembered> remembered;
  bool reused = false;
  Partition& part =
      PartitionFor(ids, /*remember=*/ids.size() <= kMaxRememberedIds, &remembered, &reused);
  const uint32_t seen = SeenStamp();
  const int64_t threshold = options_.admission_threshold;
  const size_t row_bytes = sizeof(float) * dim_;
  for (ShardWalk walk(this, part); walk.Next();) {
    const int s = walk.shard();
    Shard& shard = shards_[s];
    const uint32_t b = part.begin[s], e = part.begin[s + 1];
    const uint32_t epoch = epoch_.load(std::memory_order_relaxed);
    ShardSlots(shard, s, ids, &part, remembered.get(), reused);
    for (uint32_t k = b; k < e; ++k) {
      const uint32_t pos = part.order[k];
      const int64_t id = ids[pos];
      const uint64_t hash = part.hash[pos];
      float* dst = out + static_cast<size_t>(pos) * dim_;
      uint32_t slot = part.slot[k];
      if (slot == kNoSlot) {
        if (threshold > 1) {
          // Every occurrence counts; all occurrences of this batch get the initial value.
          if (options_.max_rows > 0 && shard.pending.size() >= pending_cap_ &&
              shard.pending.find(id) == shard.pending.end()) {
            ++shard.refused;  // the waiting room is full: not counted, not stored
            InitValues(id, dst);
            continue;
          }
          Pending& pending = shard.pending[id];
          pending.seen = seen;
          pending.count = static_cast<uint32_t>(
              std::min<int64_t>(threshold, int64_t{pending.count} + part.count[pos]));
          if (pending.count < threshold) {
            InitValues(id, dst);
            continue;
          }
          shard.pending.erase(id);
        }
        slot = CreateRow(shard, id, hash, seen, epoch);
        if (slot == kNoSlot) return ShardFull(s);
        part.slot[k] = slot;
      }
      char* p = SlotPtr(shard, slot);
      reinterpret_cast<RowHeader*>(p)->seen = seen;
      std::memcpy(dst, p + kRowHeaderBytes, row_bytes);
    }
  }
  // Repeated ids: copies of their first occurrence.
  for (uint32_t pos : part.order) {
    const float* src = out + static_cast<size_t>(pos) * dim_;
    for (uint32_t j = part.next[pos]; j != Partition::kEnd; j = part.next[j]) {
      std::memcpy(out + static_cast<size_t>(j) * dim_, src, row_bytes);
    }
  }
  if (remembered != nullptr) {
    if (reused) {
      repeated_lookups_.fetch_add(1, std::memory_order_relaxed);
    } else {
      remembered->ids.assign(ids.begin(), ids.end());
    }
    Remember(std::move(remembered));
  }
  return absl::OkStatus();
}

SparseTable::Partition& SparseTable::PartitionFor(absl::Span<const int64_t> ids, bool remember,
                                                  std::unique_ptr<Remembered>* remembered,
                                                  bool* reused) {
  thread_local Partition scratch;  // reused: a batch allocates nothing once warm
  *remembered = TakeRemembered(ids);
  *reused = *remembered != nullptr;
  if (*reused) return (*remembered)->part;
  if (remember) *remembered = NewRemembered();
  Partition& part = *remembered != nullptr ? (*remembered)->part : scratch;
  PartitionIds(ids, &part);
  PrefetchBuckets(part);
  return part;
}

void SparseTable::ShardSlots(const Shard& shard, int s, absl::Span<const int64_t> ids,
                             Partition* part, Remembered* remembered,
                             bool reused) const ABSL_NO_THREAD_SAFETY_ANALYSIS {
  const uint32_t b = part->begin[s], e = part->begin[s + 1];
  if (reused && remembered->removals[s] == shard.removals) {
    for (uint32_t k = b; k < e; ++k) {
      const char* row = SlotPtr(shard, part->slot[k]);
      for (size_t line = 0; line < stride_; line += 64) __builtin_prefetch(row + line);
    }
    return;
  }
  FindSlots(shard, ids, part, b, e);
  if (remembered != nullptr) remembered->removals[s] = shard.removals;
}

std::unique_ptr<SparseTable::Remembered> SparseTable::NewRemembered() {
  if (!remember_) return nullptr;
  std::unique_ptr<Remembered> r;
  {
    absl::MutexLock lock(&remembered_mu_);
    if (!spare_remembered_.empty()) {
      r = std::move(spare_remembered_.back());
      spare_remembered_.pop_back();
    }
  }
  if (r == nullptr) r = std::make_unique<Remembered>();
  r->ids.clear();
  r->removals.assign(static_cast<size_t>(shard_mask_) + 1, 0);
  return r;
}

void SparseTable::Remember(std::unique_ptr<Remembered> r) {
  absl::MutexLock lock(&remembered_mu_);
  remembered_ids_ += r->ids.size();
  remembered_.push_front(std::move(r));
  while (remembered_.size() > static_cast<size_t>(options_.remember_lookups) ||
         (remembered_.size() > 1 && remembered_ids_ > kRememberedIdsBudget)) {
    std::unique_ptr<Remembered> oldest = std::move(remembered_.back());
    remembered_.pop_back();
    remembered_ids_ -= oldest->ids.size();
    if (spare_remembered_.size() < kSpareRemembered) spare_remembered_.push_back(std::move(oldest));
  }
}

std::unique_ptr<SparseTable::Remembered> SparseTable::TakeRemembered(
    absl::Span<const int64_t> ids) {
  if (!remember_ || ids.empty()) return nullptr;
  absl::MutexLock lock(&remembered_mu_);
  for (auto it = remembered_.begin(); it != remembered_.end(); ++it) {
    const std::vector<int64_t>& r = (*it)->ids;
    if (r.size() == ids.size() &&
        std::memcmp(r.data(), ids.data(), sizeof(int64_t) * ids.size()) == 0) {
      std::unique_ptr<Remembered> found = std::move(*it);
      remembered_.erase(it);
      remembered_ids_ -= found->ids.size();
      return found;
    }
  }
  return nullptr;
}

void SparseTable::Recycle(std::unique_ptr<Remembered> r) {
  absl::MutexLock lock(&remembered_mu_);
  if (spare_remembered_.size() < kSpareRemembered) spare_remembered_.push_back(std::move(r));
}

absl::Status SparseTable::LookupReadOnly(absl::Span<const int64_t> ids, float* out) const {
  if (ids.empty()) return absl::OkStatus();
  if (out == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("SparseTable::LookupReadOnly of ", ids.size(), " ids with a null output"));
  }
  if (ids.size() >= Partition::kEnd) {
    return absl::InvalidArgumentError(
        absl::StrCat("SparseTable::LookupReadOnly batch of ", ids.size(), " ids is too large"));
  }
  thread_local Partition part;
  thread_local std::vector<uint32_t> missing;  // first occurrences without a row
  PartitionIds(ids, &part);
  PrefetchBuckets(part);
  constexpr size_t kKeepIds = size_t{1} << 20;  // as PartitionIds: huge batches give it back
  if (ids.size() <= kKeepIds && missing.capacity() > kKeepIds) missing = {};
  missing.clear();
  const size_t row_bytes = sizeof(float) * dim_;
  for (ShardWalk walk(this, part, /*shared=*/true); walk.Next();) {
    const int s = walk.shard();
    const Shard& shard = shards_[s];
    const uint32_t b = part.begin[s], e = part.begin[s + 1];
    FindSlots(shard, ids, &part, b, e);
    for (uint32_t k = b; k < e; ++k) {
      const uint32_t pos = part.order[k];
      if (part.slot[k] == kNoSlot) {
        missing.push_back(pos);
        continue;
      }
      std::memcpy(out + static_cast<size_t>(pos) * dim_,
                  SlotPtr(shard, part.slot[k]) + kRowHeaderBytes, row_bytes);
    }
  }
  // Initial values outside the locks.
  for (uint32_t pos : missing) InitValues(ids[pos], out + static_cast<size_t>(pos) * dim_);
  for (uint32_t pos : part.order) {
    const float* src = out + static_cast<size_t>(pos) * dim_;
    for (uint32_t j = part.next[pos]; j != Partition::kEnd; j = part.next[j]) {
      std::memcpy(out + static_cast<size_t>(j) * dim_, src, row_bytes);
    }
  }
  return absl::OkStatus();
}

absl::Status SparseTable::ApplyGradients(absl::Span<const int64_t> ids, const float* grads,
                                         float lr, int64_t step, float scale) {
  if (opt_ == Opt::kAdam && step < 1) {
    return absl::InvalidArgumentError(absl::StrCat("SparseTable::ApplyGradients step is ", step,
                                                   "; adam needs the 1-based step (>= 1)"));
  }
  AdvanceStep(step);
  if (ids.empty()) return absl::OkStatus();
  if (grads == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("SparseTable::ApplyGradients of ", ids.size(), " ids with null gradients"));
  }
  if (ids.size() >= Partition::kEnd) {
    return absl::InvalidArgumentError(
        absl::StrCat("SparseTable::ApplyGradients batch of ", ids.size(), " ids is too large"));
  }
  float lr_t = 0;
  if (opt_ == Opt::kAdam) {
    // The beta powers of step `step` in double. The dense adam op instead reads them from its
    // Beta1Pow/Beta2Pow inputs, advanced by one multiplication per run and rounded to their
    // dtype (float32 in practice): the two agree exactly only where the powers are exact
    // (dyadic betas, as OptimizerMatchTest uses); with betas 0.9f/0.999f lr_t differs by up to
    // 7e-6 relative (1.4e-5 with the double options 0.9/0.999), far above float rounding. Kept
    // as it is: the table stores no beta powers (they follow from `step`).
    const double b1pow = std::pow(options_.adam_beta1, static_cast<double>(step));
    const double b2pow = std::pow(options_.adam_beta2, static_cast<double>(step));
    lr_t = static_cast<float>(
        optimizer_rules::AdamBiasCorrectedLr(static_cast<double>(lr), b1pow, b2pow));
  }
  // The lookup of these very ids, if remembered (a trainer's gradient of the batch it looked
  // up): its partition, and its slots where no row of their shard was removed since.
  std::unique_ptr<Remembered> remembered;
  bool reused = false;
  Partition& part = PartitionFor(ids, /*remember=*/false, &remembered, &reused);
  const uint32_t seen = SeenStamp();
  const bool admission = options_.admission_threshold > 1;
  // Per-thread scratch, kept between batches; a thread that once saw a huge batch gives the
  // memory back at its next ordinary one (as PartitionIds does).
  constexpr size_t kKeepFloats = size_t{1} << 24;
  auto fit = [](auto& v, size_t n) {
    if (n <= kKeepFloats && v.capacity() > kKeepFloats) v = {};
    v.resize(n);
  };
  if (scale != 1.0f) {
    // Scaled rows, rounded before any sum: the same bits as gradients scaled by the caller.
    thread_local std::vector<float> scaled;
    const size_t n = ids.size() * static_cast<size_t>(dim_);
    fit(scaled, n);
    ScaleInto(grads, n, scale, scaled.data());
    grads = scaled.data();
  }
  // The gradient of each distinct id (indexed like part.order): duplicates summed in their
  // order of appearance (as MergeRows does), all before any lock.
  thread_local std::vector<float> sums;
  thread_local std::vector<const float*> row_grads;
  const size_t distinct = part.order.size();
  fit(sums, distinct * dim_);
  fit(row_grads, distinct);
  for (size_t k = 0; k < distinct; ++k) {
    const uint32_t pos = part.order[k];
    const float* g = grads + static_cast<size_t>(pos) * dim_;
    if (part.next[pos] != Partition::kEnd) {
      float* sum = sums.data() + k * dim_;
      ArrayMap acc(sum, dim_);
      acc = ConstArrayMap(g, dim_);
      for (uint32_t j = part.next[pos]; j != Partition::kEnd; j = part.next[j]) {
        acc += ConstArrayMap(grads + static_cast<size_t>(j) * dim_, dim_);
      }
      g = sum;
    }
    row_grads[k] = g;
  }
  for (ShardWalk walk(this, part); walk.Next();) {
    const int s = walk.shard();
    Shard& shard = shards_[s];
    const uint32_t b = part.begin[s], e = part.begin[s + 1];
    const uint32_t epoch = epoch_.load(std::memory_order_relaxed);
    ShardSlots(shard, s, ids, &part, remembered.get(), reused);
    for (uint32_t k = b; k < e; ++k) {
      const uint32_t pos = part.order[k];
      const int64_t id = ids[pos];
      uint32_t slot = part.slot[k];
      if (slot == kNoSlot) {
        if (admission) {
          shard.dropped += part.count[pos];
          continue;
        }
        slot = CreateRow(shard, id, part.hash[pos], seen, epoch);
        if (slot == kNoSlot) return ShardFull(s);
      }
      char* p = SlotPtr(shard, slot);
      RowHeader* h = reinterpret_cast<RowHeader*>(p);
      h->seen = seen;
      h->epoch = epoch;
      ApplyOptimizer(p, row_grads[k], lr, lr_t);
    }
  }
  if (remembered != nullptr) {
    updates_taking_lookups_.fetch_add(1, std::memory_order_relaxed);
    Recycle(std::move(remembered));
  }
  return absl::OkStatus();
}

SparseTable::ShardWalk::ShardWalk(const SparseTable* table, const Partition& part, bool shared)
    : table_(table), part_(part), first_(table->StartShard()), shared_(shared) {
  thread_local std::vector<int> busy;
  busy.clear();
  busy_ = &busy;
}

SparseTable::ShardWalk::~ShardWalk() { Release(); }

void SparseTable::ShardWalk::Release() ABSL_NO_THREAD_SAFETY_ANALYSIS {
  if (shard_ >= 0) {
    absl::Mutex& mu = table_->shards_[shard_].mu;
    if (shared_) {
      mu.ReaderUnlock();
    } else {
      mu.Unlock();
    }
  }
  shard_ = -1;
}

bool SparseTable::ShardWalk::Next() ABSL_NO_THREAD_SAFETY_ANALYSIS {
  Release();
  const int num_shards = table_->shard_mask_ + 1;
  while (i_ < num_shards) {
    const int s = (first_ + i_++) & table_->shard_mask_;
    if (part_.begin[s] == part_.begin[s + 1]) continue;
    absl::Mutex& mu = table_->shards_[s].mu;
    if (shared_ ? mu.ReaderTryLock() : mu.TryLock()) {
      shard_ = s;
      return true;
    }
    busy_->push_back(s);  // another batch holds it: come back after the others
  }
  if (next_busy_ < busy_->size()) {
    shard_ = (*busy_)[next_busy_++];
    absl::Mutex& mu = table_->shards_[shard_].mu;
    if (shared_) {
      mu.ReaderLock();
    } else {
      mu.Lock();
    }
    return true;
  }
  return false;
}

int64_t SparseTable::EvictStale() {
  int64_t limit = options_.evict_after_steps;
  if (limit == 0) limit = options_.evict_after_seconds;
  if (limit == 0) return 0;
  const uint32_t now = SeenStamp();
  const uint32_t max_age = static_cast<uint32_t>(limit);
  // Ages of stamps newer than `now` (written concurrently) wrap to >= 2^31: not stale.
  auto stale = [&](uint32_t stamp) {
    const uint32_t age = now - stamp;
    return age >= max_age && age < (uint32_t{1} << 31);
  };
  int64_t removed = 0;
  for (int s = 0; s <= shard_mask_; ++s) {
    Shard& shard = shards_[s];
    absl::MutexLock lock(&shard.mu);
    // Read under the lock: an export that visited this shard before has moved both already.
    const bool keep = tombstones_.load(std::memory_order_relaxed);
    const uint32_t epoch = epoch_.load(std::memory_order_relaxed);
    for (uint32_t slot = 0; slot < shard.used_slots; ++slot) {
      const RowHeader* h = reinterpret_cast<const RowHeader*>(SlotPtr(shard, slot));
      if (h->epoch != 0 && stale(h->seen)) {
        if (keep) shard.tombstones.push_back({h->id, epoch});
        RemoveRow(shard, slot);
        ++shard.evicted;
        ++removed;
      }
    }
    absl::erase_if(shard.pending, [&](const auto& kv) { return stale(kv.second.seen); });
  }
  return removed;
}

int64_t SparseTable::WriteExport(const SparseTableExportOptions& export_options, uint32_t since,
                                 const Column& col,
                                 const std::function<bool(const char*, size_t)>& append,
                                 char* header) {
  const bool with_state = export_options.with_optimizer_state && state_width_ > 0;
  const int64_t state_width = with_state ? state_width_ / dim_ * col.dim : 0;
  const int64_t blocks = 1 + state_width / col.dim;
  const bool whole = col.dim == dim_;
  const size_t record_bytes = 8 + sizeof(float) * (col.dim + state_width) + 4;
  const bool only_changed = export_options.only_changed;
  uint64_t count = 0;
  std::vector<char> buffer;
  // The trailer: uint64 n, then the ids (from offset 8), then the checksum.
  std::string trailer(only_changed ? 8 : 0, '\0');
  std::vector<int64_t> dead;
  for (int s = 0; s <= shard_mask_; ++s) {
    buffer.clear();
    {
      Shard& shard = shards_[s];
      absl::MutexLock lock(&shard.mu);
      if (only_changed) {
        // Ids evicted since the cut without a row now (a row again is a record, if changed).
        dead.clear();
        for (const Tombstone& t : shard.tombstones) {
          if (t.epoch > since && FindSlot(shard, t.id, HashId(t.id)) == kNoSlot) {
            dead.push_back(t.id);
          }
        }
        std::sort(dead.begin(), dead.end());
        dead.erase(std::unique(dead.begin(), dead.end()), dead.end());
        trailer.append(reinterpret_cast<const char*>(dead.data()), sizeof(int64_t) * dead.size());
      }
      buffer.reserve(record_bytes * shard.size);
      for (uint32_t slot = 0; slot < shard.used_slots; ++slot) {
        const char* p = SlotPtr(shard, slot);
        const RowHeader* h = reinterpret_cast<const RowHeader*>(p);
        if (h->epoch == 0) continue;
        if (only_changed && h->epoch <= since) continue;
        const size_t at = buffer.size();
        buffer.resize(at + record_bytes);
        char* r = buffer.data() + at;
        Put<int64_t>(r, h->id);
        if (whole) {
          std::memcpy(r + 8, p + kRowHeaderBytes, record_bytes - 12);
        } else {
          GatherColumns(reinterpret_cast<const float*>(p + kRowHeaderBytes), dim_, col.offset,
                        col.dim, blocks, r + 8);
        }
        Put<uint32_t>(r + record_bytes - 4, fmt::Crc32c(r, record_bytes - 4));
      }
    }
    count += buffer.size() / record_bytes;
    if (!append(buffer.data(), buffer.size())) return -1;
  }
  if (only_changed) {
    Put<uint64_t>(trailer.data(), (trailer.size() - 8) / sizeof(int64_t));
    char crc[4];
    Put<uint32_t>(crc, fmt::Crc32c(trailer.data(), trailer.size()));
    trailer.append(crc, sizeof(crc));
    if (!append(trailer.data(), trailer.size())) return -1;
  }
  std::memset(header, 0, fmt::kHeaderBytes);
  std::memcpy(header, fmt::kMagic, 8);
  Put<uint32_t>(header + 8, fmt::kVersion);
  Put<uint32_t>(header + 12,
                only_changed ? fmt::kFlagOnlyChanged | fmt::kFlagTombstones : uint32_t{0});
  Put<uint32_t>(header + 16, static_cast<uint32_t>(col.dim));
  Put<uint32_t>(header + 20, static_cast<uint32_t>(state_width));
  Put<uint64_t>(header + 24, count);
  Put<uint32_t>(header + 32, OptCode(options_.optimizer));
  Put<uint32_t>(header + 36, fmt::Crc32c(header, 36));
  return static_cast<int64_t>(count);
}

uint32_t SparseTable::BeginExport(const SparseTableExportOptions& export_options) {
  if (export_options.keep_delta_cut) return 0;
  // Deltas begin (from here on, a row evicted after this export copied it needs a tombstone),
  // and rows changed from here on record epoch + 1, so the next only_changed export sees them.
  // Both are stored before any shard is copied, so a shard's writers see them after its copy.
  tombstones_.store(true, std::memory_order_relaxed);
  return epoch_.fetch_add(1);
}

void SparseTable::EndExport(const SparseTableExportOptions& export_options, uint32_t epoch) {
  if (export_options.keep_delta_cut) return;
  last_export_epoch_ = epoch;
  for (int s = 0; s <= shard_mask_; ++s) {
    Shard& shard = shards_[s];
    absl::MutexLock lock(&shard.mu);
    std::vector<Tombstone>& t = shard.tombstones;
    t.erase(std::remove_if(t.begin(), t.end(),
                           [epoch](const Tombstone& x) { return x.epoch <= epoch; }),
            t.end());
  }
}

absl::StatusOr<int64_t> SparseTable::WriteExportFile(const std::string& path,
                                                     const SparseTableExportOptions& export_options,
                                                     uint32_t since, const Column& col) {
  static std::atomic<uint64_t> temp_counter{0};
  const std::string temp = absl::StrCat(path, ".tmp.", ::getpid(), ".", temp_counter.fetch_add(1));
  const int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    return absl::UnavailableError(absl::StrCat(
        "sparse table export to ", path, ": cannot create temp file ", temp, ": ", ErrnoText()));
  }
  FdCloser closer(fd);
  auto fail = [&](const std::string& what) {
    const std::string err = ErrnoText();
    ::unlink(temp.c_str());
    return absl::UnavailableError(
        absl::StrCat("sparse table export to ", path, ": ", what, " ", temp, ": ", err));
  };
  char header[fmt::kHeaderBytes] = {};
  if (!WriteAll(fd, header, sizeof(header))) return fail("cannot write");
  const int64_t count = WriteExport(
      export_options, since, col, [&](const char* p, size_t n) { return WriteAll(fd, p, n); },
      header);
  if (count < 0) return fail("cannot write");
  if (::pwrite(fd, header, sizeof(header), 0) != static_cast<ssize_t>(sizeof(header))) {
    return fail("cannot write the header of");
  }
  if (::fsync(fd) != 0) return fail("cannot fsync");
  if (!closer.Close()) return fail("cannot close");
  if (::rename(temp.c_str(), path.c_str()) != 0) return fail("cannot rename to the target");
  // Make the rename durable: fsync the directory (best effort; some file systems refuse).
  const size_t slash = path.rfind('/');
  const std::string dir = slash == std::string::npos ? "."
                          : slash == 0               ? "/"
                                                     : path.substr(0, slash);
  const int dir_fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir_fd >= 0) {
    ::fsync(dir_fd);
    ::close(dir_fd);
  }
  return count;
}

absl::StatusOr<int64_t> SparseTable::Export(const std::string& path,
                                            const SparseTableExportOptions& export_options) {
  absl::MutexLock export_lock(&export_mu_);
  const uint32_t since = last_export_epoch_;
  const uint32_t epoch = BeginExport(export_options);
  TS_ASSIGN_OR_RETURN(int64_t count, WriteExportFile(path, export_options, since, Whole()));
  EndExport(export_options, epoch);
  return count;
}

absl::StatusOr<int64_t> SparseTable::ExportMembers(const std::vector<std::string>& paths,
                                                   const SparseTableExportOptions& export_options) {
  if (paths.size() != columns_.size()) {
    return absl::InvalidArgumentError(absl::StrCat("sparse table export: ", paths.size(),
                                                   " paths for ", columns_.size(), " members"));
  }
  absl::MutexLock export_lock(&export_mu_);
  const uint32_t since = last_export_epoch_;
  const uint32_t epoch = BeginExport(export_options);
  int64_t count = 0;
  for (size_t m = 0; m < paths.size(); ++m) {
    TS_ASSIGN_OR_RETURN(int64_t n, WriteExportFile(paths[m], export_options, since, columns_[m]));
    count += n;
  }
  EndExport(export_options, epoch);
  return count;
}

namespace {
// An export in memory: the header, then what `write` appends.
std::string ExportToString(
    const std::function<int64_t(const std::function<bool(const char*, size_t)>&, char*)>& write) {
  std::string out(fmt::kHeaderBytes, '\0');
  char header[fmt::kHeaderBytes];
  write(
      [&](const char* p, size_t n) {
        out.append(p, n);
        return true;
      },
      header);
  std::memcpy(out.data(), header, sizeof(header));
  return out;
}
}  // namespace

std::string SparseTable::ExportBytes(const SparseTableExportOptions& export_options) {
  std::vector<std::string> whole = ExportMembersBytes(export_options, /*whole=*/true);
  return std::move(whole[0]);
}

std::vector<std::string> SparseTable::ExportMembersBytes(
    const SparseTableExportOptions& export_options, bool whole) {
  absl::MutexLock export_lock(&export_mu_);
  const uint32_t since = last_export_epoch_;
  const uint32_t epoch = BeginExport(export_options);
  std::vector<std::string> out;
  for (const Column& col : whole ? std::vector<Column>{Whole()} : columns_) {
    out.push_back(ExportToString([&](const auto& append, char* header) {
      return WriteExport(export_options, since, col, append, header);
    }));
  }
  EndExport(export_options, epoch);
  return out;
}

absl::StatusOr<int64_t> SparseTable::Import(const std::string& path,
                                            const std::function<bool(int64_t)>& keep) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    return absl::NotFoundError(
        absl::StrCat("sparse table file ", path, ": cannot open: ", ErrnoText()));
  }
  FdCloser closer(fd);
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    return absl::UnavailableError(
        absl::StrCat("sparse table file ", path, ": cannot stat: ", ErrnoText()));
  }
  return ImportFrom(
      path, static_cast<uint64_t>(st.st_size),
      [fd](char* dst, size_t n, uint64_t offset) { return ReadAllAt(fd, dst, n, offset); }, keep,
      Whole());
}

absl::StatusOr<int64_t> SparseTable::ImportBytes(absl::string_view bytes, const std::string& name,
                                                 const std::function<bool(int64_t)>& keep,
                                                 int member) {
  if (member < -1 || member >= num_members()) {
    return absl::InvalidArgumentError(absl::StrCat("sparse table file ", name, ": member ", member,
                                                   " of a table of ", num_members()));
  }
  return ImportFrom(
      name, bytes.size(),
      [bytes](char* dst, size_t n, uint64_t offset) {
        if (offset > bytes.size() || n > bytes.size() - offset) {
          errno = 0;  // "unexpected end of file"
          return false;
        }
        std::memcpy(dst, bytes.data() + offset, n);
        return true;
      },
      keep, member < 0 ? Whole() : columns_[static_cast<size_t>(member)]);
}

absl::StatusOr<int64_t> SparseTable::ImportFrom(
    const std::string& path, uint64_t size,
    const std::function<bool(char*, size_t, uint64_t)>& read_at,
    const std::function<bool(int64_t)>& keep, const Column& col) {
  auto corrupt = [&](uint64_t offset, const std::string& what) {
    return absl::DataLossError(
        absl::StrCat("sparse table file ", path, ": ", what, " at offset ", offset));
  };
  if (size < fmt::kHeaderBytes) {
    return corrupt(
        size, absl::StrCat("truncated header (", size, " bytes, need ", fmt::kHeaderBytes, ")"));
  }
  char header[fmt::kHeaderBytes];
  auto read_error = [&](uint64_t offset) {
    const std::string err = errno == 0 ? "unexpected end of file" : ErrnoText();
    return absl::UnavailableError(
        absl::StrCat("sparse table file ", path, ": cannot read at offset ", offset, ": ", err));
  };
  if (!read_at(header, sizeof(header), 0)) return read_error(0);
  if (std::memcmp(header, fmt::kMagic, 8) != 0) {
    return corrupt(0, "bad magic (not a sparse table export)");
  }
  const uint32_t version = Get<uint32_t>(header + 8);
  if (version != fmt::kVersion) {
    return corrupt(
        8, absl::StrCat("unsupported version ", version, " (expected ", fmt::kVersion, ")"));
  }
  if (Get<uint32_t>(header + 36) != fmt::Crc32c(header, 36)) {
    return corrupt(36, "header checksum mismatch");
  }
  const uint32_t flags = Get<uint32_t>(header + 12);
  if ((flags & ~(fmt::kFlagOnlyChanged | fmt::kFlagTombstones)) != 0) {
    return corrupt(12, absl::StrCat("unsupported flags ", flags, " (known: bits 0 and 1)"));
  }
  const uint32_t dim = Get<uint32_t>(header + 16);
  if (dim != col.dim) {
    return corrupt(16, absl::StrCat("dim ", dim, " does not match the table's dim ", col.dim));
  }
  const uint32_t state_width = Get<uint32_t>(header + 20);
  const uint32_t opt_code = Get<uint32_t>(header + 32);
  const int64_t col_state_width = state_width_ / dim_ * col.dim;
  if (state_width != 0 &&
      (state_width != col_state_width || opt_code != OptCode(options_.optimizer))) {
    return corrupt(20, absl::StrCat("optimizer state of ", state_width, " floats (optimizer ",
                                    opt_code, ") does not match the table's ", col_state_width,
                                    " floats of ", options_.optimizer));
  }
  // A member's columns (not the whole row): new rows start with the other members' initial
  // values, held rows keep them.
  const bool whole = col.dim == dim_;
  const uint64_t count = Get<uint64_t>(header + 24);
  const uint64_t record_bytes = 8 + sizeof(float) * (dim + uint64_t{state_width}) + 4;
  const uint64_t max_count = (size - fmt::kHeaderBytes) / record_bytes;
  if (count > max_count) {
    return corrupt(fmt::kHeaderBytes + max_count * record_bytes,
                   absl::StrCat("truncated: record ", max_count, " of ", count, " is incomplete (",
                                size, " bytes)"));
  }
  const uint64_t records_end = fmt::kHeaderBytes + count * record_bytes;
  // The tombstone trailer, checked whole (and the ids that pass `keep` kept) before any row.
  std::vector<int64_t> dead;
  if ((flags & fmt::kFlagTombstones) == 0) {
    if (size != records_end) {
      return corrupt(records_end,
                     absl::StrCat(size - records_end, " unexpected bytes after the last of ", count,
                                  " records"));
    }
  } else {
    const uint64_t rest = size - records_end;
    if (rest < fmt::kTrailerFixedBytes) {
      return corrupt(
          records_end,
          absl::StrCat("truncated tombstone trailer (", rest, " bytes after the last of ", count,
                       " records, need at least ", fmt::kTrailerFixedBytes, ")"));
    }
    char n_bytes[8];
    if (!read_at(n_bytes, sizeof(n_bytes), records_end)) return read_error(records_end);
    const uint64_t n = Get<uint64_t>(n_bytes);
    const uint64_t max_n = (rest - fmt::kTrailerFixedBytes) / sizeof(int64_t);
    if (n > max_n) {
      return corrupt(records_end,
                     absl::StrCat("truncated tombstone trailer: its count of ", n,
                                  " ids does not fit in the ", rest, " bytes after the records"));
    }
    const uint64_t ids_bytes = n * sizeof(int64_t);
    const uint64_t expected = records_end + fmt::kTrailerFixedBytes + ids_bytes;
    if (size != expected) {
      return corrupt(expected,
                     absl::StrCat(size - expected,
                                  " unexpected bytes after the tombstone trailer of ", n, " ids"));
    }
    std::string trailer(static_cast<size_t>(rest), '\0');
    if (!read_at(trailer.data(), trailer.size(), records_end)) return read_error(records_end);
    if (Get<uint32_t>(trailer.data() + 8 + ids_bytes) !=
        fmt::Crc32c(trailer.data(), 8 + ids_bytes)) {
      return corrupt(records_end + 8 + ids_bytes,
                     absl::StrCat("tombstone trailer checksum mismatch (", n, " ids from offset ",
                                  records_end, ")"));
    }
    dead.reserve(static_cast<size_t>(n));
    for (uint64_t i = 0; i < n; ++i) {
      const int64_t id = Get<int64_t>(trailer.data() + 8 + i * sizeof(int64_t));
      if (!keep || keep(id)) dead.push_back(id);
    }
  }

  // Whole records per read.
  const uint64_t per_read = std::max<uint64_t>(1, (uint64_t{4} << 20) / record_bytes);
  std::vector<char> buffer(per_read * record_bytes);
  std::vector<int64_t> ids;     // the records of a read that pass `keep`
  std::vector<uint32_t> which;  // parallel to ids: the record's index in the read
  int64_t loaded = 0;
  // Pass 0 validates every record; then the tombstones are applied (first, so that the rows
  // they free make room under max_rows); pass 1 loads the records (re-checking the checksums).
  for (int pass = 0; pass < 2; ++pass) {
    if (pass == 1) RemoveIds(dead);
    for (uint64_t first = 0; first < count; first += per_read) {
      const uint64_t n = std::min(per_read, count - first);
      const uint64_t offset = fmt::kHeaderBytes + first * record_bytes;
      if (!read_at(buffer.data(), n * record_bytes, offset)) return read_error(offset);
      ids.clear();
      which.clear();
      for (uint64_t k = 0; k < n; ++k) {
        const char* r = buffer.data() + k * record_bytes;
        const int64_t id = Get<int64_t>(r);
        if (Get<uint32_t>(r + record_bytes - 4) != fmt::Crc32c(r, record_bytes - 4)) {
          return corrupt(offset + k * record_bytes,
                         absl::StrCat("record ", first + k, " (id ", id, ") checksum mismatch",
                                      pass == 1 ? " (file changed)" : ""));
        }
        if (pass == 1 && (!keep || keep(id))) {
          ids.push_back(id);
          which.push_back(static_cast<uint32_t>(k));
        }
      }
      if (pass == 0 || ids.empty()) continue;
      loaded += static_cast<int64_t>(ids.size());
      Partition part;
      PartitionIds(ids, &part);
      PrefetchBuckets(part);
      const uint32_t seen = SeenStamp();
      for (int s = 0; s <= shard_mask_; ++s) {
        const uint32_t b = part.begin[s], e = part.begin[s + 1];
        if (b == e) continue;
        Shard& shard = shards_[s];
        absl::MutexLock lock(&shard.mu);
        FindSlots(shard, ids, &part, b, e);
        for (uint32_t k = b; k < e; ++k) {
          const uint32_t pos = part.order[k];
          const int64_t id = ids[pos];
          uint32_t last = pos;  // a repeated id (not written by Export): the last record wins
          while (part.next[last] != Partition::kEnd) last = part.next[last];
          uint32_t slot = part.slot[k];
          if (slot == kNoSlot) {
            shard.pending.erase(id);
            slot = CreateRow(shard, id, part.hash[pos], seen, kImportedEpoch,
                             /*initialize=*/!whole);
            if (slot == kNoSlot) return ShardFull(s);
          }
          char* p = SlotPtr(shard, slot);
          RowHeader* h = reinterpret_cast<RowHeader*>(p);
          h->seen = seen;
          h->epoch = kImportedEpoch;
          float* values = reinterpret_cast<float*>(p + kRowHeaderBytes);
          const char* r = buffer.data() + static_cast<size_t>(which[last]) * record_bytes;
          if (whole) {
            std::memcpy(values, r + 8, sizeof(float) * (dim_ + state_width));
            if (state_width == 0 && state_width_ > 0) {
              std::memset(values + dim_, 0, sizeof(float) * state_width_);
            }
          } else {
            const int64_t state_blocks = state_width_ / dim_;
            ScatterColumns(r + 8, dim_, col.offset, col.dim, 1 + state_width / col.dim, values);
            for (int64_t b = state_width == 0 ? 1 : state_blocks + 1; b <= state_blocks; ++b) {
              std::fill_n(values + b * dim_ + col.offset, col.dim, 0.0f);
            }
          }
        }
      }
    }
  }
  return loaded;
}

void SparseTable::RemoveIds(absl::Span<const int64_t> ids) {
  // In batches that a Partition indexes with 32 bits, each shard locked once per batch.
  constexpr size_t kBatch = size_t{1} << 20;
  Partition part;
  for (size_t first = 0; first < ids.size(); first += kBatch) {
    const absl::Span<const int64_t> batch = ids.subspan(first, kBatch);
    PartitionIds(batch, &part);
    PrefetchBuckets(part);
    for (int s = 0; s <= shard_mask_; ++s) {
      const uint32_t b = part.begin[s], e = part.begin[s + 1];
      if (b == e) continue;
      Shard& shard = shards_[s];
      absl::MutexLock lock(&shard.mu);
      FindSlots(shard, batch, &part, b, e);  // rows never move: the slots stay valid
      for (uint32_t k = b; k < e; ++k) {
        if (part.slot[k] != kNoSlot) RemoveRow(shard, part.slot[k]);
      }
    }
  }
}

void SparseTable::ExportLifecycle(std::vector<SparseTableLifecycleRecord>* out) const {
  for (int s = 0; s <= shard_mask_; ++s) {
    const Shard& shard = shards_[s];
    absl::ReaderMutexLock lock(&shard.mu);
    for (uint32_t slot = 0; slot < shard.used_slots; ++slot) {
      const RowHeader* h = reinterpret_cast<const RowHeader*>(SlotPtr(shard, slot));
      if (h->epoch == 0) continue;
      out->push_back({h->id, h->seen, 0, false});
    }
    for (const auto& [id, p] : shard.pending) out->push_back({id, p.seen, p.count, true});
  }
}

void SparseTable::ImportLifecycle(absl::Span<const SparseTableLifecycleRecord> records) {
  const int64_t threshold = options_.admission_threshold;
  for (const auto& r : records) {
    const uint64_t hash = HashId(r.id);
    Shard& shard = shards_[(hash >> 32) & shard_mask_];
    absl::MutexLock lock(&shard.mu);
    const uint32_t slot = FindSlot(shard, r.id, hash);
    if (!r.pending) {
      if (slot != kNoSlot) reinterpret_cast<RowHeader*>(SlotPtr(shard, slot))->seen = r.seen;
      continue;
    }
    if (slot != kNoSlot || threshold <= 1) continue;
    Pending& p = shard.pending[r.id];
    p.seen = r.seen;
    p.count = static_cast<uint32_t>(std::min<int64_t>(threshold - 1, r.count));
  }
}

bool SparseTable::PeekRow(int64_t id, float* values, float* state) const {
  const uint64_t hash = HashId(id);
  const Shard& shard = shards_[(hash >> 32) & shard_mask_];
  absl::ReaderMutexLock lock(&shard.mu);
  const uint32_t slot = FindSlot(shard, id, hash);
  if (slot == kNoSlot) return false;
  const float* p = reinterpret_cast<const float*>(SlotPtr(shard, slot) + kRowHeaderBytes);
  if (values != nullptr) std::memcpy(values, p, sizeof(float) * dim_);
  if (state != nullptr && state_width_ > 0) {
    std::memcpy(state, p + dim_, sizeof(float) * state_width_);
  }
  return true;
}

int64_t SparseTable::Size() const {
  int64_t n = 0;
  for (int s = 0; s <= shard_mask_; ++s) {
    absl::ReaderMutexLock lock(&shards_[s].mu);
    n += static_cast<int64_t>(shards_[s].size);
  }
  return n;
}

int64_t SparseTable::MemoryBytes() const { return Stats().memory_bytes; }

SparseTableStats SparseTable::Stats() const {
  SparseTableStats st;
  st.memory_bytes = sizeof(*this) + sizeof(Shard) * (shard_mask_ + 1);
  const int64_t chunk_bytes = static_cast<int64_t>(stride_) << chunk_shift_;
  for (int s = 0; s <= shard_mask_; ++s) {
    const Shard& shard = shards_[s];
    absl::ReaderMutexLock lock(&shard.mu);
    st.rows += static_cast<int64_t>(shard.size);
    st.pending_ids += static_cast<int64_t>(shard.pending.size());
    st.created_rows += shard.created;
    st.evicted_rows += shard.evicted;
    st.dropped_gradients += shard.dropped;
    st.refused_rows += shard.refused;
    st.memory_bytes +=
        static_cast<int64_t>(shard.chunks.size()) * chunk_bytes +
        static_cast<int64_t>(shard.chunks.capacity() * sizeof(void*)) +
        static_cast<int64_t>(shard.capacity * sizeof(Bucket)) +
        static_cast<int64_t>(shard.pending.capacity() * (sizeof(std::pair<int64_t, Pending>) + 1)) +
        static_cast<int64_t>(shard.tombstones.capacity() * sizeof(Tombstone));
  }
  {
    absl::MutexLock lock(&remembered_mu_);
    for (const auto& r : remembered_) st.memory_bytes += static_cast<int64_t>(r->Bytes());
    for (const auto& r : spare_remembered_) st.memory_bytes += static_cast<int64_t>(r->Bytes());
  }
  st.updates_taking_lookups = updates_taking_lookups_.load(std::memory_order_relaxed);
  st.repeated_lookups = repeated_lookups_.load(std::memory_order_relaxed);
  return st;
}

std::string MemberExports::Take(SparseTable* table, int member) {
  if (member < 0) return table->ExportBytes(options_);
  auto it = done_.find(table);
  if (it == done_.end()) it = done_.emplace(table, table->ExportMembersBytes(options_)).first;
  return std::move(it->second[static_cast<size_t>(member)]);
}

}  // namespace tessera
