// Abseil's mutex deadlock detector, on by default in Debian's Abseil, records every lock
// acquisition in a global lock-order graph: about 500 instructions per lock (most of a scope
// lookup, and a tenth of a pserver's CPU on the CTR job; tests/bench/RESULTS.md). The training
// binaries turn it off at the start of main(); tests and tools keep it, where it catches
// lock-order inversions before they deadlock a job.
#ifndef TESSERA_COMMON_BASE_MUTEX_TUNING_H_
#define TESSERA_COMMON_BASE_MUTEX_TUNING_H_

#include "absl/synchronization/mutex.h"

namespace tessera {

inline void DisableMutexDeadlockDetection() {
  absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
}

}  // namespace tessera

#endif  // TESSERA_COMMON_BASE_MUTEX_TUNING_H_
