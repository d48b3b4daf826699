// Command-line parsing for the tessera daemons: --flag=value / --flag value / --flag (booleans)
// / --noflag over the settings of ClusterConfig, then the environment (see cluster_config.h),
// then Validate(). Used only by the daemons' main.cc.
#ifndef TESSERA_COMMON_CONFIG_DAEMON_FLAGS_H_
#define TESSERA_COMMON_CONFIG_DAEMON_FLAGS_H_

#include <string>

#include "absl/status/statusor.h"
#include "common/config/cluster_config.h"

namespace tessera {

// `role_default` fills --role when neither a flag nor the environment gives one. Returns
// NotFound with the usage text when --help is given.
absl::StatusOr<ClusterConfig> ParseDaemonArgs(int argc, char** argv, const EnvLookup& env,
                                              const std::string& role_default);

// "Usage: ..." with every flag and its environment variables.
std::string DaemonUsage(const std::string& program);

}  // namespace tessera

#endif  // TESSERA_COMMON_CONFIG_DAEMON_FLAGS_H_
