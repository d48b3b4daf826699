// SparseTable: one pserver's shard of a distributed sparse embedding table (ids are any int64),
// with rows created on first touch, a per-row optimizer, and optional feature admission, row
// eviction and export to files a serving system can load.
//
// Initial values. Row `id` starts as row `id` of the dense [V, dim] tensor that uniform_random
// (or gaussian_random) with the same seed/min/max (mean/std) would produce: element (id, j) is
// FillCounterUniform(seed, uint64_t(id) * dim + j) (common/ops/counter_rng.h, wrapping
// arithmetic). A row's initial value therefore depends neither on the number of pservers nor on
// the order in which ids are touched.
//
// Optimizers (per distinct id, after summing duplicate ids of a batch in their order of
// appearance, exactly as the sparse-gradient branch of the sgd/adagrad/adam kernels in
// common/ops/optimizer_ops.cc; g' = g + l2 * p):
//   sgd      p -= lr * g'
//   adagrad  m += g'^2;  p -= lr * g' / (sqrt(m) + epsilon)
//   adam     m1 = b1 m1 + (1 - b1) g';  m2 = b2 m2 + (1 - b2) g'^2;
//            p -= lr_t m1 / (sqrt(m2) + epsilon),  lr_t = lr sqrt(1 - b2^t) / (1 - b1^t)
// Adam's beta powers are per table, not per row: t is the `step` passed to ApplyGradients
// (1-based), which is what the dense adam op computes for every touched row at its t-th run
// (its Beta1Pow starts at beta1 and advances once per run, touched or not). Rows touched for
// the first time late in training thus get the same bias correction as in local training
// ("lazy" Adam: untouched rows keep their moments unchanged). No beta powers are stored.
//
// Memory layout. The table is split into `num_shards` shards by id hash, each with its own
// mutex, open-addressing hash map (linear probing, 8-byte buckets: slot index + 32 hash bits,
// load factor <= 3/4, backward-shift deletion) and an arena of fixed-size chunks (a power of two
// slots, at most 64 KiB) of row slots (growth never moves a row, nothing is allocated per row).
// The chunks of all shards are carved from the table's own large anonymous mappings: 2 MiB of
// ordinary pages first, then regions doubling to 64 MiB with madvise(MADV_HUGEPAGE), so fresh
// rows fault 2 MiB at a time where the kernel's THP mode allows it, and (options.prefault) a
// background thread faults memory in ahead of the rows (pserver/chunk_arena.h). A slot holds,
// contiguously:
//   int64 id | uint32 last seen (step or seconds) | uint32 change epoch | float values[dim] |
//   float state[k * dim]   (k = 0 sgd, 1 adagrad, 2 adam)
// Evicted slots go to a free list and are reused (arenas and maps never shrink). For dim 16
// with Adagrad a slot is 144 bytes and the map adds 11-21 bytes per row: 10^7 rows measured
// 158 bytes of RSS per row, 1.16x the raw 136 bytes (tests/bench/RESULTS.md).
// A batch is first deduplicated (repeated ids are looked up once and copied; their gradients
// are summed), then processed shard by shard. The buckets of all its ids are prefetched before
// the first shard is locked, and within a shard every row is found and prefetched before any is
// touched, so that a batch spread thinly over the shards (a few ids each) still overlaps its
// cache misses.
//
// Lifecycle options (each off by default):
//  - admission_threshold K: a row is created only at the K-th Lookup of its id (occurrences
//    counted across calls, repeats within one call included). Before that, Lookup returns the
//    initial values without storing them and gradients for the id are dropped (counted in
//    Stats().dropped_gradients). Pending counts cost an absl::flat_hash_map entry per id.
//  - evict_after_steps T / evict_after_seconds T: EvictStale() removes rows (and pending
//    admission counts) not looked up or updated during the last T steps of the table's step
//    clock (the largest `step` given to ApplyGradients or AdvanceStep), or the last T seconds
//    of options.clock. At most one of the two may be set.
//
// Deltas. A row records the export epoch of its last change; an export without keep_delta_cut
// (the start of a serving export chain: full, then only_changed ones) moves the "delta cut", and
// an only_changed export lists the rows changed since the cut plus, as tombstones, the ids
// evicted since the cut that hold no row now. From the first export without keep_delta_cut on,
// EvictStale keeps each id it removes with its epoch (16 bytes, in the shard) until an export
// without keep_delta_cut has passed it; a table that is never exported that way keeps none.
//
// Thread safety: every method is thread-safe. Lookups and updates of ids in different shards
// run in parallel; a batch locks each shard it touches once, and visits a shard that another
// batch holds after its other shards rather than waiting for it. Export copies one shard at a time
// under its lock (rows are consistent per shard, not across shards).
#ifndef TESSERA_PSERVER_SPARSE_TABLE_H_
#define TESSERA_PSERVER_SPARSE_TABLE_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "absl/types/span.h"

namespace tessera {

class ChunkArena;

// How a row's values start (mirrors the uniform_random / gaussian_random / fill_constant ops).
struct SparseTableInitializer {
  enum Kind { kUniform, kGaussian, kConstant };
  Kind kind = kUniform;
  double min = -1.0, max = 1.0;  // kUniform: values in [min, max)
  double mean = 0.0, std = 1.0;  // kGaussian
  double value = 0.0;            // kConstant
  uint64_t seed = 0;             // kUniform, kGaussian (the op's "seed" attribute)
};

// One of the tables a SparseTable holds side by side (SparseTableOptions::members).
struct SparseTableMember {
  std::string name;  // for messages
  int64_t dim = 1;
  SparseTableInitializer initializer;
};

struct SparseTableOptions {
  int64_t dim = 8;  // float32 values per row, 1 .. 2^20
  SparseTableInitializer initializer;

  // Member tables: tables that are always looked up and updated with the same ids (a slot's deep
  // and wide embeddings), held side by side in one row so that an id is found once for all of
  // them. Member m's values are columns [offset_m, offset_m + dim_m) of the row (members in
  // order, their dims summing to `dim`; `initializer` is then unused), each initialized as a
  // table of its own: element (id, j) of member m is its initializer's value at counter
  // id * dim_m + j. Its optimizer state is the same columns of each state block. Exporting or
  // importing member m reads and writes exactly the file that member alone, as a table of dim_m,
  // would (ExportMembersBytes, ImportBytes with `member`). Empty: one table (dim, initializer).
  std::vector<SparseTableMember> members;

  // "sgd", "adagrad" or "adam"; hyper-parameters as the ops' attributes (the learning rate is
  // given to each ApplyGradients call).
  std::string optimizer = "sgd";
  double l2 = 0.0;  // the ops' regularization_coeff
  double adagrad_epsilon = 1e-6;
  double adam_beta1 = 0.9, adam_beta2 = 0.999, adam_epsilon = 1e-8;

  // Internal shards (each with its own lock, map and arena); a power of two in 1 .. 4096.
  int num_shards = 64;

  int64_t admission_threshold = 0;  // 0 = off (1 too); at most 2^31 - 1
  int64_t evict_after_steps = 0;    // 0 = off; at most 2^31 - 1
  int64_t evict_after_seconds = 0;  // 0 = off; at most 2^31 - 1
  // Time source for evict_after_seconds; null means absl::Now.
  std::function<absl::Time()> clock;

  // Row budget: at most max_rows rows (0 = no budget). A new id beyond it is refused: Lookup,
  // ApplyGradients and Import fail with ResourceExhausted saying so, and it is counted
  // (Stats().refused_rows). Rows already held are never dropped to make room. With admission
  // on, the ids waiting for admission are bounded too (max_rows / num_shards per shard, at
  // least 1); an id beyond that is not counted (it gets initial values, and counts as refused).
  int64_t max_rows = 0;

  // Fault row memory in ahead of use on a background thread once the table outgrows its first
  // 2 MiB (see pserver/chunk_arena.h): new rows then rarely wait for the kernel to zero pages.
  bool prefault = true;

  // Lookups remembered for an update of the same ids (0 = none, at most 64): the table keeps
  // where the rows of its last `remember_lookups` Lookup calls are, and an ApplyGradients whose
  // ids equal one of them (a trainer's gradient of the batch it looked up: the pserver's sync
  // step with one trainer, an async push), or a Lookup of the same ids again (the pserver's
  // look-ahead, then the lookup after the step's update), takes that lookup's hashing and row
  // search instead of doing them again. Each new Lookup then costs a copy of its ids, and the
  // remembered lookups about 50 bytes per id (counted in MemoryBytes): a lookup of over 2^16
  // ids is not remembered, and a table's remembered lookups hold at most 2^18 ids in all (the
  // oldest are forgotten first). Ignored with admission on (a lookup may leave an id without a
  // row that a later one creates).
  int remember_lookups = 0;

  // Rows the table expects to hold (a model's declared vocabulary; 0 = unknown): memory and
  // maps for that many rows, up to the first 2 MiB of row memory, are made when the table is,
  // instead of while its first rows are created. Only a hint: any number of rows still fits.
  int64_t expected_rows = 0;
};

struct SparseTableStats {
  int64_t rows = 0;               // rows held now
  int64_t pending_ids = 0;        // ids counted for admission, not yet admitted
  int64_t created_rows = 0;       // rows ever created (Lookup, ApplyGradients, Import)
  int64_t evicted_rows = 0;       // rows removed by EvictStale
  int64_t dropped_gradients = 0;  // gradient rows (occurrences) dropped: id not admitted
  int64_t refused_rows = 0;       // new ids refused for the row budget (max_rows)
  // With remember_lookups: ApplyGradients calls that took a remembered lookup's rows, and Lookup
  // calls of a remembered lookup's ids, which only copied the rows.
  int64_t updates_taking_lookups = 0;
  int64_t repeated_lookups = 0;
  int64_t memory_bytes = 0;       // as MemoryBytes()
};

struct SparseTableExportOptions {
  // Only rows created or updated since the last successful export without keep_delta_cut (of
  // either kind), then the ids evicted since then that hold no row now (tombstones).
  bool only_changed = false;
  // Also write each row's optimizer state (to resume training; serving needs values only).
  bool with_optimizer_state = false;
  // This export does not start the next delta: a later only_changed export still lists
  // everything changed since the previous export without it (checkpoints set it).
  bool keep_delta_cut = false;
};

// Export file format (version 1, little-endian, no padding):
//   header, 40 bytes:
//     char[8]  magic "TSSPTBL\0"
//     uint32   version = 1
//     uint32   flags: bit 0 = only rows changed since the previous export,
//                     bit 1 = a tombstone trailer follows the records (only_changed exports)
//     uint32   dim
//     uint32   state_width: floats of optimizer state per record (0 = values only)
//     uint64   count: number of records
//     uint32   optimizer: 0 sgd, 1 adagrad, 2 adam (the meaning of the state)
//     uint32   CRC-32C of the preceding 36 bytes
//   count records of 8 + 4 * (dim + state_width) + 4 bytes:
//     int64 id | float32 values[dim] | float32 state[state_width] | uint32 CRC-32C of the rest
//   with flag bit 1, a tombstone trailer of 12 + 8 * n bytes: the ids whose rows a reader removes
//     uint64 n | int64 ids[n] | uint32 CRC-32C of the trailer's preceding 8 + 8 * n bytes
// Ids are unique within a file (records and tombstones are disjoint); the file size is exactly
// 40 + count * record size, plus 12 + 8 * n with the trailer. Other flag bits are refused.
namespace sparse_table_format {
inline constexpr char kMagic[8] = {'T', 'S', 'S', 'P', 'T', 'B', 'L', '\0'};
inline constexpr uint32_t kVersion = 1;
inline constexpr size_t kHeaderBytes = 40;
inline constexpr uint32_t kFlagOnlyChanged = 1;
inline constexpr uint32_t kFlagTombstones = 2;
inline constexpr size_t kTrailerFixedBytes = 12;  // uint64 n + uint32 CRC-32C
// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), as in iSCSI / ext4; extends `crc`.
uint32_t Crc32c(const void* data, size_t n, uint32_t crc = 0);
}  // namespace sparse_table_format

// Row bookkeeping that export files do not carry (checkpoints save it beside an export): a
// row's last-seen stamp, or a pending id's admission count and stamp.
struct SparseTableLifecycleRecord {
  int64_t id = 0;
  uint32_t seen = 0;   // step clock or seconds, as the table records it
  uint32_t count = 0;  // pending: occurrences counted so far
  bool pending = false;
};

class SparseTable {
 public:
  // InvalidArgument naming the bad option value.
  static absl::StatusOr<std::unique_ptr<SparseTable>> Create(const SparseTableOptions& options);
  ~SparseTable();
  SparseTable(const SparseTable&) = delete;
  SparseTable& operator=(const SparseTable&) = delete;

  // Writes the values of the rows of `ids` to out[i * dim, (i + 1) * dim), creating missing
  // rows (subject to admission) and marking rows seen. ResourceExhausted if a shard is full
  // (2^31 rows) or a new id meets the row budget (rows of the batch before it stay created);
  // InvalidArgument if out is null for a non-empty batch.
  absl::Status Lookup(absl::Span<const int64_t> ids, float* out);

  // Applies grads (ids.size() x dim, row i for ids[i]) times `scale` with learning rate `lr`
  // at optimizer step `step` (1-based; Adam needs step >= 1): each row is scaled, duplicate
  // ids are summed, then each distinct id is updated once. Missing rows are created first,
  // unless admission is on (then their gradients are dropped and counted). Advances the step
  // clock to `step`.
  absl::Status ApplyGradients(absl::Span<const int64_t> ids, const float* grads, float lr,
                              int64_t step, float scale = 1.0f);

  // Advances the step clock (used by evict_after_steps) to `step` if it is larger.
  void AdvanceStep(int64_t step);
  int64_t step() const { return step_.load(std::memory_order_relaxed); }

  // Writes the values of the rows of `ids` to out[i * dim, (i + 1) * dim), and the initial
  // values for ids the table does not hold, without creating, marking seen or counting anything
  // (serving). InvalidArgument if out is null for a non-empty batch.
  absl::Status LookupReadOnly(absl::Span<const int64_t> ids, float* out) const;

  // Removes the rows and pending admission counts not seen within the last evict_after_steps
  // steps (clock - last seen >= T) or evict_after_seconds seconds. Returns the rows removed;
  // 0 when eviction is off. Freed slots are reused by later rows. Once deltas have begun (see
  // "Deltas" above) each removed id is kept for the next only_changed export's tombstones.
  int64_t EvictStale();

  // Writes the table (or the rows changed, and the ids evicted, since the delta cut) to `path`
  // atomically (temp file in the same directory, fsync, rename). Returns the number of rows
  // written; an error naming the file on I/O failure (the previous file, if any, is then left
  // as it was, and the delta cut does not move).
  absl::StatusOr<int64_t> Export(const std::string& path,
                                 const SparseTableExportOptions& export_options);

  // Loads every record of an export file into the table (overwriting existing rows; rows are
  // admitted regardless of admission_threshold and do not count as changed for the next
  // only_changed export), and removes the rows of its tombstones (ids without a row are
  // skipped; removals are neither evictions nor tombstones of this table). State is loaded if
  // the file has it, else it starts at zero. With `keep`, only the records and tombstones whose
  // id passes are applied. The file is validated completely before any row is touched: errors
  // name the file and the byte offset of the problem. Returns the number of records loaded.
  absl::StatusOr<int64_t> Import(const std::string& path,
                                 const std::function<bool(int64_t)>& keep = nullptr);

  // The same export and import in memory, so that callers write and read the bytes through their
  // own io::FileSystem (checkpoints). ExportBytes moves the delta cut as Export does (unless
  // keep_delta_cut); errors of ImportBytes name `name` and the byte offset, exactly as Import
  // names its file.
  std::string ExportBytes(const SparseTableExportOptions& export_options);
  // With `member` >= 0, the records are member `member`'s columns and the file is the one that
  // member alone would load (its dim and state): into a new row the other members' initial
  // values go, into a held row only the member's columns. InvalidArgument for a member out of
  // range.
  absl::StatusOr<int64_t> ImportBytes(absl::string_view bytes, const std::string& name,
                                      const std::function<bool(int64_t)>& keep = nullptr,
                                      int member = -1);

  // One export of each member (options.members; the whole table when it has none), in member
  // order, under one delta cut: an export without keep_delta_cut moves it once for all. With
  // `whole`, one export of whole rows instead (ExportBytes).
  std::vector<std::string> ExportMembersBytes(const SparseTableExportOptions& export_options,
                                              bool whole = false);
  // The same written to `paths` (one per member), each as Export writes its file; returns the
  // records written, all files together. The delta cut moves only when every file was written
  // (after a failure, the files of the members before it may already be the new ones).
  absl::StatusOr<int64_t> ExportMembers(const std::vector<std::string>& paths,
                                        const SparseTableExportOptions& export_options);
  // Members (1 for a table without options.members) and member m's options as a table of its
  // own (its dim and initializer; the rest as this table's).
  int num_members() const { return static_cast<int>(columns_.size()); }
  SparseTableOptions MemberOptions(int member) const;

  // Appends the last-seen stamp of every row, and every pending admission count, to `out`.
  void ExportLifecycle(std::vector<SparseTableLifecycleRecord>* out) const;
  // Sets the stamps of the records' rows that exist, and the counts of pending records whose
  // id has no row (capped below admission_threshold). Other records are ignored.
  void ImportLifecycle(absl::Span<const SparseTableLifecycleRecord> records);

  // Copies the values (and, if `state` is not null, the k * dim optimizer state floats) of row
  // `id` without creating or touching it. False if the table holds no such row.
  bool PeekRow(int64_t id, float* values, float* state = nullptr) const;

  int64_t Size() const;
  // Bytes allocated by the table: arenas (whole chunks), hash maps, pending admission counts,
  // kept tombstones, remembered lookups.
  int64_t MemoryBytes() const;
  SparseTableStats Stats() const;
  // Optimizer state floats per row (0, dim or 2 * dim).
  int64_t state_width() const { return state_width_; }
  const SparseTableOptions& options() const { return options_; }

 private:
  struct Shard;
  struct Partition;
  // A Lookup's partition and rows, kept for an update of the same ids (remember_lookups).
  struct Remembered;
  enum class Opt { kSgd, kAdagrad, kAdam };
  // A member's columns of the row (the whole row for a table without members).
  struct Column {
    int64_t offset = 0, dim = 0;
    SparseTableInitializer initializer;
  };

  explicit SparseTable(const SparseTableOptions& options, Opt opt);

  // The row slot layout.
  char* SlotPtr(const Shard& shard, uint32_t slot) const;
  void InitValues(int64_t id, float* values) const;
  // Links repeated ids to their first occurrence and groups first occurrences by shard.
  void PartitionIds(absl::Span<const int64_t> ids, Partition* p) const;
  // Publishes a shard's bucket array for PrefetchBuckets (with its lock held).
  void PublishBuckets(Shard& shard) const;
  // Prefetches the bucket of every first occurrence of a partition, before any shard is locked:
  // a batch of a few ids per shard then pays one memory latency for all its buckets, not one
  // per id.
  void PrefetchBuckets(const Partition& part) const;
  // With the shard's lock held: part->slot[k] = the slot of order[k] (kNoSlot if absent) for k
  // in [b, e), prefetching each row found, before the caller touches any of them.
  void FindSlots(const Shard& shard, absl::Span<const int64_t> ids, Partition* part, uint32_t b,
                 uint32_t e) const;
  // Visits the shards that hold ids of a partition, each once, with its lock held (a reader
  // lock if `shared`):
  //   for (ShardWalk walk(this, part); walk.Next();) { ... shards_[walk.shard()] ... }
  // From a per-call first shard on; a shard whose lock another batch holds is visited after
  // the others rather than waited for, so that concurrent batches (a trainer's lookup and
  // another's update) do not queue behind each other shard after shard. Next() and the
  // destructor release the shard visited last. One walk per thread at a time.
  class ShardWalk {
   public:
    ShardWalk(const SparseTable* table, const Partition& part, bool shared = false);
    ~ShardWalk();
    ShardWalk(const ShardWalk&) = delete;
    ShardWalk& operator=(const ShardWalk&) = delete;
    // Locks the next shard; false when every shard was visited.
    bool Next();
    int shard() const { return shard_; }

   private:
    void Release();
    const SparseTable* const table_;
    const Partition& part_;
    const int first_;
    const bool shared_;
    int i_ = 0;
    int shard_ = -1;
    std::vector<int>* busy_;  // thread-local
    size_t next_busy_ = 0;
  };
  // An emptied Remembered sized for this table (a spare one when there is one), or null when
  // lookups are not remembered.
  std::unique_ptr<Remembered> NewRemembered();
  // Keeps `r` (a successful Lookup's) as the newest remembered lookup, forgetting the oldest
  // beyond remember_lookups or the ids budget (kRememberedIdsBudget).
  void Remember(std::unique_ptr<Remembered> r);
  // The remembered lookup of exactly `ids` (taken out of the list), or null.
  std::unique_ptr<Remembered> TakeRemembered(absl::Span<const int64_t> ids);
  // Gives a used Remembered back for a later Lookup.
  void Recycle(std::unique_ptr<Remembered> r);
  // The partition of a batch: a remembered lookup's of the same ids (*remembered, *reused
  // true), else the ids partitioned (and their buckets prefetched) into a new Remembered
  // (`remember`, when lookups are remembered) or the thread's scratch.
  Partition& PartitionFor(absl::Span<const int64_t> ids, bool remember,
                          std::unique_ptr<Remembered>* remembered, bool* reused);
  // With shard s's lock held: the slots of part's ids in shard s, as FindSlots, but taken from
  // `remembered` when `reused` and no row of the shard was removed since; noted in
  // `remembered` (nullable) when found.
  void ShardSlots(const Shard& shard, int s, absl::Span<const int64_t> ids, Partition* part,
                  Remembered* remembered, bool reused) const;
  // Slot of `id` in `shard`, or kNoSlot.
  uint32_t FindSlot(const Shard& shard, int64_t id, uint64_t hash) const;
  // A new row for `id` (not present) with initial values and zero state; kNoSlot if full.
  // With `initialize` false the caller writes values and state.
  uint32_t CreateRow(Shard& shard, int64_t id, uint64_t hash, uint32_t seen, uint32_t epoch,
                     bool initialize = true) const;
  // Frees a row's slot and map entry (size, row budget and free list follow); counts nothing.
  void RemoveRow(Shard& shard, uint32_t slot) const;
  // Removes the rows of `ids` (an id without a row is skipped), as Import does for tombstones.
  void RemoveIds(absl::Span<const int64_t> ids);
  void ApplyOptimizer(char* slot, const float* grad, float lr, float lr_t) const;
  // The current "last seen" stamp (step or seconds) to record for rows touched now.
  uint32_t SeenStamp() const;
  uint32_t NowSeconds() const;
  // A pseudo-random first shard for a batch's walk over the shards.
  int StartShard() const;
  absl::Status ShardFull(int shard_index) const;
  // Export's records of columns `col` (after a kHeaderBytes header the caller reserves) go to
  // `append`, shard by shard, then (only_changed) the tombstone trailer; returns the record
  // count, or -1 when `append` failed. Fills `header` last. Needs export_mu_.
  int64_t WriteExport(const SparseTableExportOptions& export_options, uint32_t since,
                      const Column& col, const std::function<bool(const char*, size_t)>& append,
                      char* header) ABSL_EXCLUSIVE_LOCKS_REQUIRED(export_mu_);
  // Writes one export file of columns `col` atomically (temp file, fsync, rename); the record
  // count, or an error naming `path`. Needs export_mu_ (the caller moves the delta cut).
  absl::StatusOr<int64_t> WriteExportFile(const std::string& path,
                                          const SparseTableExportOptions& export_options,
                                          uint32_t since, const Column& col)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(export_mu_);
  static std::vector<Column> ColumnsOf(const SparseTableOptions& options);
  // The whole row as one column.
  Column Whole() const { return Column{0, dim_, options_.initializer}; }
  // Starts an export: returns the epoch to pass to EndExport (moving the epoch and turning
  // tombstones on unless keep_delta_cut).
  uint32_t BeginExport(const SparseTableExportOptions& export_options)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(export_mu_);
  // After a successful export without keep_delta_cut: moves the delta cut to `epoch` and drops
  // the tombstones it passed.
  void EndExport(const SparseTableExportOptions& export_options, uint32_t epoch)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(export_mu_);
  // Import from `size` bytes that `read_at(dst, n, offset)` reads (false: a read error, errno
  // set); messages name `name`.
  absl::StatusOr<int64_t> ImportFrom(const std::string& name, uint64_t size,
                                     const std::function<bool(char*, size_t, uint64_t)>& read_at,
                                     const std::function<bool(int64_t)>& keep, const Column& col);

  const SparseTableOptions options_;
  const Opt opt_;
  const int64_t dim_;
  const int64_t state_width_;
  const std::vector<Column> columns_;  // the members' (one: the whole row)
  const size_t stride_;    // bytes per slot, a multiple of 8
  const int chunk_shift_;  // slots per chunk = 1 << chunk_shift_
  const int shard_mask_;
  const size_t pending_cap_;  // ids waiting for admission per shard, when max_rows is set
  const absl::Time created_;
  // Owns the memory of every shard's row chunks (shards keep plain pointers into it).
  std::unique_ptr<ChunkArena> arena_;
  std::unique_ptr<Shard[]> shards_;

  std::atomic<int64_t> step_{0};
  const bool remember_;  // remember_lookups > 0, admission off
  mutable absl::Mutex remembered_mu_;
  // Newest first; their ids in all.
  std::deque<std::unique_ptr<Remembered>> remembered_ ABSL_GUARDED_BY(remembered_mu_);
  size_t remembered_ids_ ABSL_GUARDED_BY(remembered_mu_) = 0;
  std::vector<std::unique_ptr<Remembered>> spare_remembered_ ABSL_GUARDED_BY(remembered_mu_);
  std::atomic<int64_t> updates_taking_lookups_{0};
  std::atomic<int64_t> repeated_lookups_{0};
  // Rows held, counted against options_.max_rows (kept only when it is set).
  mutable std::atomic<int64_t> budget_used_{0};
  // Export epochs: a row records the epoch of its last change; an export without
  // keep_delta_cut advances epoch_, and after success rows with epoch > last_export_epoch_ (the
  // delta cut, guarded by export_mu_) are "changed". Imported rows get epoch 1, which never
  // counts as changed; epoch 0 marks free slots. Evicted ids are kept with the epoch_ of their
  // removal once tombstones_ is set (by the first export without keep_delta_cut).
  std::atomic<uint32_t> epoch_{2};
  std::atomic<bool> tombstones_{false};
  absl::Mutex export_mu_;
  uint32_t last_export_epoch_ ABSL_GUARDED_BY(export_mu_) = 1;
};

// Export bytes of tables named member by member (checkpoints, serving exports): a table of
// several members is exported once, all members under one delta cut, when its first member is
// asked for; Take(table, -1) is a whole-table export. Not thread-safe.
class MemberExports {
 public:
  explicit MemberExports(const SparseTableExportOptions& options) : options_(options) {}
  std::string Take(SparseTable* table, int member);

 private:
  const SparseTableExportOptions options_;
  std::map<SparseTable*, std::vector<std::string>> done_;
};

}  // namespace tessera

#endif  // TESSERA_PSERVER_SPARSE_TABLE_H_
