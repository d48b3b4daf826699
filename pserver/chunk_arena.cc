#include "pserver/chunk_arena.h"

#include <pthread.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <system_error>

namespace tessera {

namespace {

constexpr size_t kHugePage = size_t{2} << 20;
constexpr size_t kMaxRegion = size_t{64} << 20;
constexpr size_t kMaxWindow = size_t{4} << 20;

// How far ahead of use a region of `bytes` is faulted in.
size_t Window(size_t bytes) { return std::min(kMaxWindow, bytes / 4); }

}  // namespace

ChunkArena::ChunkArena(ChunkArenaOptions options)
    : chunk_bytes_((std::max<size_t>(options.chunk_bytes, 1) + 63) & ~size_t{63}),
      prefault_(options.prefault) {
  if (options.first_bytes == 0) return;
  absl::MutexLock lock(&mu_);
  if (!NewRegion()) return;  // no memory now: Allocate() tries again, and says so
  const Region& r = regions_.back();
  const size_t bytes = std::min(options.first_bytes, r.bytes);
  // Nothing is handed out yet, so writing the pages is as safe as populating them; populating
  // is one call for all (Linux >= 5.14), writing one fault per page.
#ifdef MADV_POPULATE_WRITE
  if (madvise(r.base, bytes, MADV_POPULATE_WRITE) == 0) return;
#endif
  std::memset(r.base, 0, bytes);
}

size_t ChunkArena::FirstRegionBytes() { return kHugePage; }

ChunkArena::~ChunkArena() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  // Joined before anything is unmapped: the thread never touches an address that was unmapped
  // (and perhaps mapped again by someone else).
  if (thread_.joinable()) thread_.join();
  for (const Region& r : regions_) munmap(r.base, r.bytes);
  if (spare_.base != nullptr) munmap(spare_.base, spare_.bytes);
}

bool ChunkArena::Map(size_t bytes, bool huge, Region* out) {
  const size_t map_bytes = huge ? bytes + kHugePage : bytes;
  void* m = mmap(nullptr, map_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (m == MAP_FAILED) return false;
  char* base = static_cast<char*>(m);
  if (huge) {  // keep the 2 MiB aligned part
    const uintptr_t at = reinterpret_cast<uintptr_t>(base);
    char* aligned = base + (((at + kHugePage - 1) & ~(kHugePage - 1)) - at);
    const size_t head = static_cast<size_t>(aligned - base);
    if (head > 0) munmap(base, head);
    if (map_bytes - head > bytes) munmap(aligned + bytes, map_bytes - head - bytes);
    base = aligned;
#ifdef MADV_HUGEPAGE
    madvise(base, bytes, MADV_HUGEPAGE);  // advice only: failure leaves 4 KiB pages
#endif
  }
  *out = Region{base, bytes};
  return true;
}

size_t ChunkArena::NextRegionBytes() const {
  size_t bytes = regions_.empty() ? kHugePage : std::min(regions_.back().bytes * 2, kMaxRegion);
  bytes = std::max(bytes, chunk_bytes_);
  return (bytes + kHugePage - 1) & ~(kHugePage - 1);
}

bool ChunkArena::NewRegion() {
  Region r;
  char* faulted = nullptr;
  if (spare_.base != nullptr && spare_.bytes >= chunk_bytes_) {
    r = spare_;
    spare_ = Region();
    faulted = r.base + Window(r.bytes);  // the thread faulted its first window
  } else if (!Map(NextRegionBytes(), !regions_.empty(), &r)) {
    return false;
  }
  regions_.push_back(r);
  next_ = r.base;
  left_ = r.bytes;
  faulted_end_ = faulted != nullptr ? faulted : r.base;
  return true;
}

char* ChunkArena::Allocate() {
  absl::MutexLock lock(&mu_);
  if (left_ < chunk_bytes_ && !NewRegion()) return nullptr;
  char* p = next_;
  next_ += chunk_bytes_;
  left_ -= chunk_bytes_;
  // The first region stays lazily faulted: small tables never start the thread.
  if (prefault_ && populate_works_ && regions_.size() >= 2) MaybePrefault();
  return p;
}

void ChunkArena::MaybePrefault() {
  const Region& cur = regions_.back();
  char* const end = cur.base + cur.bytes;
  const size_t window = Window(cur.bytes);
  bool wake = false;
  if (faulted_end_ < next_) faulted_end_ = next_;
  if (faulted_end_ < end && static_cast<size_t>(faulted_end_ - next_) < window) {
    char* to = next_ + std::min(static_cast<size_t>(end - next_), 2 * window);
    work_.emplace_back(faulted_end_, static_cast<size_t>(to - faulted_end_));
    faulted_end_ = to;
    wake = true;
  }
  if (spare_.base == nullptr && !map_spare_ && left_ < window) {
    map_spare_ = true;
    wake = true;
  }
  if (wake && !thread_.joinable()) {
    try {
      thread_ = std::thread([this] { PrefaultLoop(); });
    } catch (const std::system_error&) {  // no thread to be had: fault on demand, as without
      populate_works_ = false;
      work_.clear();
      map_spare_ = false;
    }
  }
}

void ChunkArena::PrefaultLoop() {
  // Background work: yields the CPU to everything else (per-thread nice on Linux).
  setpriority(PRIO_PROCESS, static_cast<id_t>(syscall(SYS_gettid)), 19);
  pthread_setname_np(pthread_self(), "table-prefault");
  while (true) {
    bool map;
    size_t map_bytes = 0;
    std::pair<char*, size_t> range{nullptr, 0};
    {
      absl::MutexLock lock(&mu_);
      auto has_work = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
        return stopping_ || map_spare_ || !work_.empty();
      };
      mu_.Await(absl::Condition(&has_work));
      if (stopping_) return;
      map = map_spare_;
      if (map) {
        map_bytes = NextRegionBytes();
      } else {
        range = work_.front();
        work_.erase(work_.begin());
      }
    }
    Region mapped;
    if (map && Map(map_bytes, /*huge=*/true, &mapped)) range = {mapped.base, Window(mapped.bytes)};
    int err = 0;
#ifdef MADV_POPULATE_WRITE
    if (range.first != nullptr && madvise(range.first, range.second, MADV_POPULATE_WRITE) != 0) {
      err = errno;
    }
#else
    err = EINVAL;
#endif
    absl::MutexLock lock(&mu_);
    if (map) {
      map_spare_ = false;
      spare_ = mapped;  // empty when mmap failed: NewRegion then maps on demand
    }
    if (err == EINVAL) {  // this kernel cannot populate: stop asking
      populate_works_ = false;
      work_.clear();
    }
  }
}

size_t ChunkArena::MappedBytes() const {
  absl::MutexLock lock(&mu_);
  size_t bytes = spare_.bytes;
  for (const Region& r : regions_) bytes += r.bytes;
  return bytes;
}

}  // namespace tessera
