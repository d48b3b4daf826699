// ChunkArena: fixed-size, 64-byte aligned, zero-filled memory chunks for the row slots of a
// SparseTable, carved in order from large anonymous mappings ("regions") that the arena owns
// until it is destroyed (chunks are never returned one by one).
//
// Regions. The first is 2 MiB of ordinary pages, so that a small table pins little memory;
// later ones double up to 64 MiB, are 2 MiB aligned and madvise(MADV_HUGEPAGE)d: with THP in
// "madvise" mode the kernel faults them 2 MiB at a time (fewer, cheaper faults per byte than
// 4 KiB pages, and fewer TLB misses on lookups). Untouched parts of a region are not resident.
//
// Prefaulting (options.prefault, on by default). Creating rows writes fresh memory, and the
// page faults that zero it (2 MiB at a time) are a large part of the cost of new rows: on a
// VM, where the host also backs each new page, about 10% of a pserver's CPU in
// tests/bench/sparse_rpc. From the second region on, a background thread of the arena faults
// memory in a window ahead of the chunks handed out (madvise(MADV_POPULATE_WRITE), which maps
// and zeroes pages without writing their contents, so it is safe on memory in use) and maps the
// next region before the current one runs out, so that Allocate() rarely waits for the kernel.
// Cost: RSS runs ahead of use by at most two windows (window = a quarter of the region, at most
// 4 MiB); the thread is started only when a table outgrows its first region, runs at the lowest
// CPU priority, and does nothing where the kernel lacks MADV_POPULATE_WRITE (Linux < 5.14).
//
// Expected rows (options.first_bytes). A table that knows how many rows it will hold (its
// declared vocabulary) has that much of its first region mapped and faulted in when the arena
// is made, in one call (at most the region: 2 MiB), so that its first rows do not fault page
// by page while training: on this project's VM the first steps of a CTR job ran 10-15% slower
// for that.
//
// Thread-safe: Allocate() may be called concurrently.
#ifndef TESSERA_PSERVER_CHUNK_ARENA_H_
#define TESSERA_PSERVER_CHUNK_ARENA_H_

#include <cstddef>
#include <thread>
#include <utility>
#include <vector>

#include "absl/synchronization/mutex.h"

namespace tessera {

struct ChunkArenaOptions {
  // Bytes per chunk; rounded up to a multiple of 64.
  size_t chunk_bytes = 64 << 10;
  // Fault memory in ahead of use on a background thread (see above).
  bool prefault = true;
  // Bytes of the first region to map and fault in at construction (see "Expected rows");
  // 0: the first region is mapped at the first Allocate() and faulted as it is written.
  size_t first_bytes = 0;
};

class ChunkArena {
 public:
  explicit ChunkArena(ChunkArenaOptions options);
  ~ChunkArena();
  ChunkArena(const ChunkArena&) = delete;
  ChunkArena& operator=(const ChunkArena&) = delete;

  // A new chunk (64-byte aligned, zero-filled), or nullptr when no memory could be mapped.
  char* Allocate();

  // Bytes mapped so far (regions, including a region mapped ahead of use).
  size_t MappedBytes() const;
  // The size of the first region: the most options.first_bytes faults in.
  static size_t FirstRegionBytes();

 private:
  struct Region {
    char* base = nullptr;
    size_t bytes = 0;
  };

  // Maps a region of `bytes` (2 MiB aligned and MADV_HUGEPAGE when `huge`); false when mmap
  // fails.
  static bool Map(size_t bytes, bool huge, Region* out);
  size_t NextRegionBytes() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Moves to a new region (the spare one if mapped ahead); false when out of memory.
  bool NewRegion() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // Queues prefault work when the chunks handed out come within a window of what was faulted.
  void MaybePrefault() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  void PrefaultLoop();

  const size_t chunk_bytes_;
  const bool prefault_;
  mutable absl::Mutex mu_;
  std::vector<Region> regions_ ABSL_GUARDED_BY(mu_);
  char* next_ ABSL_GUARDED_BY(mu_) = nullptr;  // in regions_.back()
  size_t left_ ABSL_GUARDED_BY(mu_) = 0;
  // Prefaulting: [next_, faulted_end_) of the current region was queued or faulted; the spare
  // region (mapped ahead, its first window queued) becomes the next current one.
  char* faulted_end_ ABSL_GUARDED_BY(mu_) = nullptr;
  Region spare_ ABSL_GUARDED_BY(mu_);
  bool map_spare_ ABSL_GUARDED_BY(mu_) = false;  // the thread should map spare_
  std::vector<std::pair<char*, size_t>> work_ ABSL_GUARDED_BY(mu_);
  bool populate_works_ ABSL_GUARDED_BY(mu_) = true;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;  // started at the first prefault request
};

}  // namespace tessera

#endif  // TESSERA_PSERVER_CHUNK_ARENA_H_
