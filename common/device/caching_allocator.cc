#include "common/device/caching_allocator.h"

#include <algorithm>
#include <utility>

namespace tessera {

CachingAllocator::CachingAllocator(RawAlloc raw_alloc, RawFree raw_free)
    : raw_alloc_(std::move(raw_alloc)), raw_free_(std::move(raw_free)) {}

CachingAllocator::~CachingAllocator() {
  absl::MutexLock lock(&mu_);
  EmptyCacheLocked();
}

size_t CachingAllocator::SizeClass(size_t bytes) {
  constexpr size_t kSmall = 512, kSmallLimit = 4096;
  if (bytes == 0) bytes = 1;
  if (bytes <= kSmallLimit) return (bytes + kSmall - 1) / kSmall * kSmall;
  size_t pow2 = kSmallLimit;
  while (pow2 * 2 <= bytes) pow2 *= 2;  // pow2 <= bytes < 2 pow2
  const size_t step = pow2 / 4;
  return (bytes + step - 1) / step * step;
}

void* CachingAllocator::Allocate(size_t bytes) {
  const size_t cls = SizeClass(bytes);
  absl::MutexLock lock(&mu_);
  void* p = nullptr;
  auto it = free_.find(cls);
  if (it != free_.end() && !it->second.empty()) {
    p = it->second.back();
    it->second.pop_back();
    stats_.bytes_cached -= static_cast<int64_t>(cls);
    ++stats_.hits;
  } else {
    p = raw_alloc_(cls);
    if (p == nullptr && stats_.bytes_cached > 0) {  // out of memory: retry with an empty cache
      EmptyCacheLocked();
      p = raw_alloc_(cls);
    }
    if (p == nullptr) return nullptr;
    ++stats_.misses;
  }
  in_use_[p] = cls;
  stats_.bytes_in_use += static_cast<int64_t>(cls);
  stats_.peak_bytes_in_use = std::max(stats_.peak_bytes_in_use, stats_.bytes_in_use);
  return p;
}

void CachingAllocator::Free(void* p) {
  if (p == nullptr) return;
  absl::MutexLock lock(&mu_);
  auto it = in_use_.find(p);
  if (it == in_use_.end()) return;  // not ours: ignore rather than corrupt the cache
  const size_t cls = it->second;
  in_use_.erase(it);
  free_[cls].push_back(p);
  stats_.bytes_in_use -= static_cast<int64_t>(cls);
  stats_.bytes_cached += static_cast<int64_t>(cls);
}

std::shared_ptr<char> CachingAllocator::AllocateShared(size_t bytes) {
  void* p = Allocate(bytes);
  if (p == nullptr) return nullptr;
  return std::shared_ptr<char>(static_cast<char*>(p), [this](char* q) { Free(q); });
}

void CachingAllocator::EmptyCache() {
  absl::MutexLock lock(&mu_);
  EmptyCacheLocked();
}

void CachingAllocator::EmptyCacheLocked() {
  for (auto& [cls, blocks] : free_) {
    for (void* p : blocks) {
      raw_free_(p);
      ++stats_.raw_frees;
    }
    stats_.bytes_cached -= static_cast<int64_t>(cls * blocks.size());
    blocks.clear();
  }
  free_.clear();
}

AllocatorStats CachingAllocator::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

}  // namespace tessera
