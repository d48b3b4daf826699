// Test helpers: N ranks as threads of one process, each with its own Context joined through a
// shared in-memory store (Gloo over loopback TCP).
#ifndef TESSERA_COMMON_COLLECTIVE_TEST_UTIL_H_
#define TESSERA_COMMON_COLLECTIVE_TEST_UTIL_H_

#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "common/collective/context.h"

namespace tessera {
namespace collective {

// Default parameters for thread ranks: gloo on 127.0.0.1, 30 s timeout.
InitParams ThreadRankParams();

// Runs fn(ctx) on `world` threads, one per rank, after every rank's Context joined (through a
// fresh HashStore). Init failures are reported as gtest failures. Returns when every thread is
// done; contexts are shut down after fn returns on every rank.
void RunRanks(int world, const std::function<void(Context& ctx)>& fn,
              const InitParams& params = ThreadRankParams());

// "127.0.0.1:<port>" with a port that was free a moment ago.
absl::StatusOr<std::string> FreeLoopbackEndpoint();

}  // namespace collective
}  // namespace tessera

#endif  // TESSERA_COMMON_COLLECTIVE_TEST_UTIL_H_
