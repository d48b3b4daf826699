#include "pserver/chunk_arena.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <set>
#include <thread>
#include <vector>

#include "gtest/gtest.h"

namespace tessera {
namespace {

// Every chunk: 64-byte aligned, zero when handed out, disjoint from every other chunk and
// keeping what was written into it while later chunks (and regions) are handed out.
void CheckChunks(bool prefault, size_t chunk_bytes, int count) {
  ChunkArena arena(ChunkArenaOptions{chunk_bytes, prefault});
  const size_t bytes = (chunk_bytes + 63) & ~size_t{63};
  std::vector<char*> chunks;
  for (int i = 0; i < count; ++i) {
    char* c = arena.Allocate();
    ASSERT_NE(c, nullptr) << "chunk " << i;
    ASSERT_EQ(reinterpret_cast<uintptr_t>(c) % 64, 0u) << "chunk " << i;
    ASSERT_TRUE(std::all_of(c, c + bytes, [](char b) { return b == 0; })) << "chunk " << i;
    std::memset(c, static_cast<int>(i % 251) + 1, bytes);
    chunks.push_back(c);
  }
  std::vector<char*> sorted = chunks;
  std::sort(sorted.begin(), sorted.end());
  for (size_t i = 1; i < sorted.size(); ++i) {
    ASSERT_GE(static_cast<size_t>(sorted[i] - sorted[i - 1]), bytes) << "overlapping chunks";
  }
  for (int i = 0; i < count; ++i) {
    const char want = static_cast<char>(i % 251 + 1);
    ASSERT_TRUE(std::all_of(chunks[i], chunks[i] + bytes, [&](char b) { return b == want; }))
        << "chunk " << i << " was overwritten";
  }
  // The regions: 2 MiB, then doubling; what is mapped stays within one region (the spare) of
  // what was handed out, whether or not memory is faulted ahead.
  const size_t used = bytes * static_cast<size_t>(count);
  EXPECT_GE(arena.MappedBytes(), used);
  EXPECT_LE(arena.MappedBytes(), 2 * used + (size_t{70} << 20));
}

TEST(ChunkArenaTest, ChunksAreAlignedZeroedAndDisjointAcrossRegions) {
  // 64 KiB chunks over ~200 MiB: the 2 MiB region, then 4, 8, ... 64 MiB regions.
  for (bool prefault : {false, true}) {
    SCOPED_TRACE(prefault ? "prefault" : "no prefault");
    CheckChunks(prefault, 64 << 10, 3200);
  }
}

TEST(ChunkArenaTest, OddChunkSizesAndChunksLargerThanARegion) {
  for (bool prefault : {false, true}) {
    CheckChunks(prefault, 1000, 5000);         // rounded up to 1024
    CheckChunks(prefault, (3 << 20) + 1, 12);  // 3 MiB + 1: larger than the first region
  }
}

TEST(ChunkArenaTest, ConcurrentAllocationsGetDistinctChunks) {
  ChunkArena arena(ChunkArenaOptions{4096, true});
  constexpr int kThreads = 4, kPerThread = 6000;  // ~94 MiB: several prefaulted regions
  std::vector<std::vector<char*>> got(kThreads);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kPerThread; ++i) {
        char* c = arena.Allocate();
        if (c == nullptr) return;
        c[0] = static_cast<char>(t + 1);  // written while others allocate (and prefault)
        c[4095] = static_cast<char>(t + 1);
        got[t].push_back(c);
      }
    });
  }
  for (auto& th : threads) th.join();
  std::set<char*> all;
  for (int t = 0; t < kThreads; ++t) {
    ASSERT_EQ(got[t].size(), static_cast<size_t>(kPerThread));
    for (char* c : got[t]) {
      EXPECT_EQ(c[0], t + 1);
      EXPECT_EQ(c[4095], t + 1);
      all.insert(c);
    }
  }
  EXPECT_EQ(all.size(), static_cast<size_t>(kThreads * kPerThread));
}

// Pages of [p, p + bytes) that are resident.
size_t ResidentPages(const char* p, size_t bytes) {
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  const uintptr_t start = reinterpret_cast<uintptr_t>(p) & ~(page - 1);
  const size_t n = (reinterpret_cast<uintptr_t>(p) + bytes - start + page - 1) / page;
  std::vector<unsigned char> v(n);
  if (mincore(reinterpret_cast<void*>(start), n * page, v.data()) != 0) return 0;
  return static_cast<size_t>(
      std::count_if(v.begin(), v.end(), [](unsigned char c) { return c & 1; }));
}

bool KernelCanPopulate() {
#ifdef MADV_POPULATE_WRITE
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  void* p = mmap(nullptr, page, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return false;
  const bool ok = madvise(p, page, MADV_POPULATE_WRITE) == 0;
  munmap(p, page);
  return ok;
#else
  return false;
#endif
}

TEST(ChunkArenaTest, MemoryAheadOfTheChunksIsFaultedInOnlyWithPrefault) {
  // 64 KiB chunks: 32 fill the 2 MiB first region, the 33rd starts the 4 MiB second one,
  // whose window (1 MiB) ahead of the chunks handed out gets faulted in by the thread.
  constexpr size_t kChunk = 64 << 10;
  for (bool prefault : {false, true}) {
    ChunkArena arena(ChunkArenaOptions{kChunk, prefault});
    char* last = nullptr;
    for (int i = 0; i < 34; ++i) last = arena.Allocate();
    ASSERT_NE(last, nullptr);
    const char* ahead = last + kChunk;  // not handed out, never written
    const size_t ahead_bytes = 512 << 10;
    size_t resident = ResidentPages(ahead, ahead_bytes);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (prefault && resident == 0 && std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
      resident = ResidentPages(ahead, ahead_bytes);
    }
    if (prefault && !KernelCanPopulate()) {
      GTEST_SKIP() << "this kernel has no MADV_POPULATE_WRITE (Linux < 5.14): nothing to test";
    }
    if (prefault) {
      EXPECT_GT(resident, 0u) << "nothing faulted in ahead of the chunks within 10 s";
    } else {
      EXPECT_EQ(resident, 0u) << "memory ahead of the chunks is resident without prefault";
    }
    EXPECT_TRUE(std::all_of(ahead, ahead + ahead_bytes, [](char b) { return b == 0; }));
  }
}

TEST(ChunkArenaTest, FirstBytesAreMappedAndResidentBeforeAnyChunk) {
  constexpr size_t kChunk = 64 << 10;
  ChunkArena lazy(ChunkArenaOptions{kChunk, /*prefault=*/true});
  EXPECT_EQ(lazy.MappedBytes(), 0u);  // mapped at the first Allocate()

  ChunkArenaOptions o{kChunk, /*prefault=*/true};
  o.first_bytes = 5 * kChunk;
  ChunkArena arena(o);
  EXPECT_EQ(arena.MappedBytes(), ChunkArena::FirstRegionBytes());
  char* first = arena.Allocate();  // the first region's start: the faulted bytes
  ASSERT_NE(first, nullptr);
  const size_t page = static_cast<size_t>(sysconf(_SC_PAGESIZE));
  EXPECT_EQ(ResidentPages(first, o.first_bytes), o.first_bytes / page);
  // Handed out zero, as every chunk, and still one region.
  for (int i = 1; i < 5; ++i) ASSERT_NE(arena.Allocate(), nullptr);
  EXPECT_TRUE(std::all_of(first, first + o.first_bytes, [](char b) { return b == 0; }));
  EXPECT_EQ(arena.MappedBytes(), ChunkArena::FirstRegionBytes());

  // Asking for more than the first region faults in that region only.
  o.first_bytes = 64 << 20;
  ChunkArena capped(o);
  EXPECT_EQ(capped.MappedBytes(), ChunkArena::FirstRegionBytes());
}

TEST(ChunkArenaTest, DestroyedWhilePrefaultingAhead) {
  // The destructor stops the thread before unmapping; run it right after the work is queued.
  for (int round = 0; round < 20; ++round) {
    ChunkArena arena(ChunkArenaOptions{64 << 10, true});
    for (int i = 0; i < 40 + round; ++i) ASSERT_NE(arena.Allocate(), nullptr);
  }
}

}  // namespace
}  // namespace tessera
