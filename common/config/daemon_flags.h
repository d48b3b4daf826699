// Command-line parsing for the tessera daemons: --flag=value / --flag value / --flag (booleans)
// / --noflag over the settings of ClusterConfig, then the environment (see cluster_config.h),
// then Validate(). Used only by the daemons' main.cc.
#ifndef TESSERA_COMMON_CONFIG_DAEMON_FLAGS_H_
#define TESSERA_COMMON_CONFIG_DAEMON_FLAGS_H_

#include <functional>
#include <ostream>
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

// Where a daemon's life is: its run function calls Started() once its configuration is checked,
// its files are read and its ports are bound, before it depends on any peer. A failure before
// that is a start-time failure.
class DaemonPhase {
 public:
  void Started() { started_ = true; }
  bool started() const { return started_; }

 private:
  bool started_ = false;
};

using DaemonRun = std::function<absl::Status(const ClusterConfig&, std::ostream&, DaemonPhase*)>;

// The whole main() of a daemon whose role is `role`: parses flags and the process environment,
// prints --help, checks the role, runs `run` (progress to stderr) and returns the exit code:
// 0 done; 2 bad configuration, or `run` failed before it started (unreadable files, a port in
// use, bad TLS files or token); 1 `run` failed afterwards. Every error is one line prefixed by
// `program`.
int DaemonMain(int argc, char** argv, const std::string& program, const std::string& role,
               const DaemonRun& run);

}  // namespace tessera

#endif  // TESSERA_COMMON_CONFIG_DAEMON_FLAGS_H_
