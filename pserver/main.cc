// tessera_pserver: a pserver daemon. Configuration comes from flags or the environment
// (TESSERA_* / PADDLE_*), see common/config/cluster_config.h; --help lists them.
#include "common/config/daemon_flags.h"
#include "common/base/malloc_tuning.h"
#include "common/base/mutex_tuning.h"
#include "pserver/pserver_daemon.h"

int main(int argc, char** argv) {
  tessera::TuneMallocForLargeBuffers();
  tessera::DisableMutexDeadlockDetection();
  return tessera::DaemonMain(argc, argv, "tessera_pserver", "pserver", tessera::RunPserver);
}
