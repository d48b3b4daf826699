// RunTrainer: the whole life of a trainer process: build the model, transpile it for this
// trainer, pull the initial parameters from the pservers, train on this trainer's share of every
// global batch (the same shuffled order on every trainer), report held-out loss/AUC (trainer 0),
// tell the pservers it completed, and optionally dump the final parameters.
#ifndef TESSERA_TRAINER_TRAINER_DAEMON_H_
#define TESSERA_TRAINER_TRAINER_DAEMON_H_

#include <ostream>

#include "absl/status/status.h"
#include "common/config/cluster_config.h"
#include "common/config/daemon_flags.h"

namespace tessera {

absl::Status RunTrainer(const ClusterConfig& config, std::ostream& log, DaemonPhase* phase);

}  // namespace tessera

#endif  // TESSERA_TRAINER_TRAINER_DAEMON_H_
