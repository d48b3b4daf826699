#include "common/device/caching_allocator.h"

#include <cstdint>
#include <cstdlib>
#include <map>
#include <memory>
#include <set>
#include <vector>

#include "gtest/gtest.h"

namespace tessera {
namespace {

// A raw allocator over malloc that counts its calls.
struct CountingRaw {
  int allocs = 0, frees = 0;
  int64_t limit = -1;  // bytes outstanding allowed; -1 = unlimited
  int64_t outstanding = 0;
  std::map<void*, size_t> sizes;
  CachingAllocator Make() {
    return CachingAllocator(
        [this](size_t n) -> void* {
          if (limit >= 0 && outstanding + static_cast<int64_t>(n) > limit) return nullptr;
          ++allocs;
          outstanding += n;
          void* p = std::malloc(n);
          sizes[p] = n;
          return p;
        },
        [this](void* p) {
          ++frees;
          outstanding -= sizes[p];
          sizes.erase(p);
          std::free(p);
        });
  }
};

TEST(CachingAllocatorTest, SizeClassesRoundUpWithBoundedWaste) {
  EXPECT_EQ(CachingAllocator::SizeClass(0), 512u);
  EXPECT_EQ(CachingAllocator::SizeClass(1), 512u);
  EXPECT_EQ(CachingAllocator::SizeClass(513), 1024u);
  EXPECT_EQ(CachingAllocator::SizeClass(4096), 4096u);
  EXPECT_EQ(CachingAllocator::SizeClass(4097), 5120u);  // 4096 + 1024
  EXPECT_EQ(CachingAllocator::SizeClass(8192), 8192u);
  for (size_t n = 1; n < (size_t{1} << 26); n = n * 3 + 7) {
    size_t c = CachingAllocator::SizeClass(n);
    EXPECT_GE(c, n);
    EXPECT_LE(c, n + n / 4 + 512) << n;
    EXPECT_EQ(CachingAllocator::SizeClass(c), c) << n;  // a class is its own class
  }
}

TEST(CachingAllocatorTest, ReusesFreedBlocksOfTheSameClass) {
  CountingRaw raw;
  CachingAllocator a = raw.Make();
  void* p = a.Allocate(1000);
  ASSERT_NE(p, nullptr);
  a.Free(p);
  void* q = a.Allocate(900);  // same class (1024)
  EXPECT_EQ(q, p);
  EXPECT_EQ(raw.allocs, 1);
  AllocatorStats s = a.stats();
  EXPECT_EQ(s.hits, 1);
  EXPECT_EQ(s.misses, 1);
  EXPECT_EQ(s.bytes_in_use, 1024);
  EXPECT_EQ(s.bytes_cached, 0);
  void* r = a.Allocate(100000);  // another class: a new block
  EXPECT_NE(r, q);
  EXPECT_EQ(raw.allocs, 2);
  a.Free(q);
  a.Free(r);
  s = a.stats();
  EXPECT_EQ(s.bytes_in_use, 0);
  EXPECT_EQ(s.bytes_cached, static_cast<int64_t>(1024 + CachingAllocator::SizeClass(100000)));
  a.EmptyCache();
  EXPECT_EQ(raw.frees, 2);
  EXPECT_EQ(a.stats().bytes_cached, 0);
}

// A training loop's allocation pattern: after the first step, no raw allocation and no growth.
TEST(CachingAllocatorTest, NoGrowthAcrossSteps) {
  CountingRaw raw;
  CachingAllocator a = raw.Make();
  const std::vector<size_t> step_sizes = {128 * 784 * 4, 784 * 512 * 4, 128 * 512 * 4, 512 * 4,
                                          128 * 10 * 4,  512 * 10 * 4,  4,             128 * 4};
  int64_t after_first = 0, peak_first = 0;
  for (int step = 0; step < 20; ++step) {
    std::vector<std::shared_ptr<char>> live;
    for (size_t n : step_sizes) live.push_back(a.AllocateShared(n));
    for (size_t n : step_sizes) live.push_back(a.AllocateShared(n));  // gradients
    live.clear();
    if (step == 0) {
      after_first = raw.allocs;
      peak_first = a.stats().peak_bytes_in_use;
    }
  }
  EXPECT_EQ(raw.allocs, after_first);
  EXPECT_EQ(a.stats().peak_bytes_in_use, peak_first);
  EXPECT_EQ(a.stats().misses, static_cast<int64_t>(2 * step_sizes.size()));
  EXPECT_EQ(a.stats().hits, static_cast<int64_t>(19 * 2 * step_sizes.size()));
  EXPECT_EQ(a.stats().bytes_in_use, 0);
}

TEST(CachingAllocatorTest, OutOfMemoryEmptiesTheCacheAndRetries) {
  CountingRaw raw;
  raw.limit = 3 * 1024 * 1024;
  CachingAllocator a = raw.Make();
  void* p = a.Allocate(2 * 1024 * 1024);
  ASSERT_NE(p, nullptr);
  a.Free(p);  // cached: 2 MiB outstanding in the raw allocator
  void* q = a.Allocate(2 * 1024 * 1024 + 600 * 1024);  // another class: needs the cache emptied
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(raw.frees, 1);
  EXPECT_EQ(a.stats().raw_frees, 1);
  EXPECT_EQ(a.Allocate(8 * 1024 * 1024), nullptr);  // beyond the limit: nullptr, no crash
  a.Free(q);
}

TEST(CachingAllocatorTest, IgnoresForeignPointers) {
  CountingRaw raw;
  CachingAllocator a = raw.Make();
  int x = 0;
  a.Free(&x);
  a.Free(nullptr);
  EXPECT_EQ(a.stats().bytes_cached, 0);
}

}  // namespace
}  // namespace tessera
