// Daemon-wide glibc malloc settings for moving large tensors over gRPC.
//
// With glibc's defaults every large buffer gRPC reads into is returned to the kernel and the
// next one page-faults again (~130 faults per MB moved); keeping freed memory in one arena
// removes that and makes push/pull 4-5x faster on loopback (tests/bench/RESULTS.md, ps_dense).
// Call once at the start of main(), before any thread starts.
#ifndef TESSERA_COMMON_BASE_MALLOC_TUNING_H_
#define TESSERA_COMMON_BASE_MALLOC_TUNING_H_

#include <malloc.h>

namespace tessera {

inline void TuneMallocForLargeBuffers() {
  mallopt(M_ARENA_MAX, 1);
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  mallopt(M_TOP_PAD, 64 << 20);
}

}  // namespace tessera

#endif  // TESSERA_COMMON_BASE_MALLOC_TUNING_H_
