// RunPserver: the whole life of a pserver process, given its configuration: build the model's
// single-machine program, transpile it, take this endpoint's pserver program, initialize its
// blocks, serve until every trainer completed (or a barrier fails), then shut down.
#ifndef TESSERA_PSERVER_PSERVER_DAEMON_H_
#define TESSERA_PSERVER_PSERVER_DAEMON_H_

#include <ostream>

#include "absl/status/status.h"
#include "common/config/cluster_config.h"
#include "common/config/daemon_flags.h"

namespace tessera {

// Progress goes to `log`. Returns OK when training completed; the error otherwise.
absl::Status RunPserver(const ClusterConfig& config, std::ostream& log, DaemonPhase* phase);

}  // namespace tessera

#endif  // TESSERA_PSERVER_PSERVER_DAEMON_H_
