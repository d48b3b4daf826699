// tessera_launch's configuration: its command line, and the LaunchConfig text proto
// (proto/launch.proto) that --config=FILE names. The file is applied first, then the flags, so
// a flag overrides the file. Arguments the launcher does not know go to every daemon.
#ifndef TESSERA_DEPLOY_LAUNCH_LAUNCH_FLAGS_H_
#define TESSERA_DEPLOY_LAUNCH_LAUNCH_FLAGS_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "deploy/launch/launcher.h"
#include "proto/launch.pb.h"

namespace tessera {

// Reads a LaunchConfig text proto. Errors name the file (and TextFormat's line:column).
absl::StatusOr<LaunchConfig> ReadLaunchConfig(const std::string& path);

// Copies the fields set in `config` onto `options`. InvalidArgument names a bad field.
absl::Status ApplyLaunchConfig(const LaunchConfig& config, LaunchOptions* options);

// Parses `args` (argv without the program name) onto `options`, which holds the defaults.
// NotFound carries the usage text for --help; InvalidArgument names the bad flag and value.
absl::Status ParseLaunchArgs(const std::vector<std::string>& args, LaunchOptions* options);

std::string LaunchUsage();

}  // namespace tessera

#endif  // TESSERA_DEPLOY_LAUNCH_LAUNCH_FLAGS_H_
