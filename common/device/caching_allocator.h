// CachingAllocator: size-class free lists over a raw allocator (cudaMalloc, cudaHostAlloc, or
// malloc in tests). Freed blocks are kept and handed out again for requests of the same size
// class, so a training loop whose step allocates the same shapes calls the raw allocator only
// during its first (warm-up) step. Thread-safe.
//
// Size classes: requests round up to a multiple of 512 bytes below 4 KiB, and above that to
// the next of 4 steps per power of two (2^k, 1.25 2^k, 1.5 2^k, 1.75 2^k), which wastes at most
// 25% of a block. A block serves only requests of its own class (no splitting), so reuse is
// exact and fragmentation bounded. For a device allocator, reuse is safe without events as long
// as every kernel and copy runs on the device's one stream (work is ordered on it).
#ifndef TESSERA_COMMON_DEVICE_CACHING_ALLOCATOR_H_
#define TESSERA_COMMON_DEVICE_CACHING_ALLOCATOR_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <unordered_map>
#include <vector>

#include "absl/synchronization/mutex.h"

namespace tessera {

struct AllocatorStats {
  int64_t bytes_in_use = 0;       // handed out (rounded sizes)
  int64_t peak_bytes_in_use = 0;
  int64_t bytes_cached = 0;       // freed, kept for reuse
  int64_t hits = 0;               // requests served from the cache
  int64_t misses = 0;             // requests that called the raw allocator
  int64_t raw_frees = 0;          // blocks given back to the raw allocator (EmptyCache, OOM)
};

class CachingAllocator {
 public:
  // raw_alloc returns nullptr when out of memory; raw_free releases what it returned.
  using RawAlloc = std::function<void*(size_t bytes)>;
  using RawFree = std::function<void(void* p)>;

  CachingAllocator(RawAlloc raw_alloc, RawFree raw_free);
  // Releases the cached blocks. Blocks still in use must not outlive the allocator (process-wide
  // allocators are never destroyed).
  ~CachingAllocator();
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  // A block of at least `bytes` (of SizeClass(bytes) bytes), or nullptr when the raw allocator
  // fails even after the cache was emptied.
  void* Allocate(size_t bytes);
  // Returns a block from Allocate to the cache; nullptr is ignored.
  void Free(void* p);
  // Allocate wrapped in a shared_ptr whose deleter calls Free (nullptr on failure).
  std::shared_ptr<char> AllocateShared(size_t bytes);
  // Gives every cached block back to the raw allocator.
  void EmptyCache();
  AllocatorStats stats() const;

  // The rounded size served for a request of `bytes` (>= 1 byte of request; 0 counts as 1).
  static size_t SizeClass(size_t bytes);

 private:
  void EmptyCacheLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  RawAlloc raw_alloc_;
  RawFree raw_free_;
  mutable absl::Mutex mu_;
  std::map<size_t, std::vector<void*>> free_ ABSL_GUARDED_BY(mu_);    // class -> blocks
  std::unordered_map<void*, size_t> in_use_ ABSL_GUARDED_BY(mu_);     // block -> class
  AllocatorStats stats_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tessera

#endif  // TESSERA_COMMON_DEVICE_CACHING_ALLOCATOR_H_
