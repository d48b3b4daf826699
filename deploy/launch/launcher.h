// Launcher: starts a local Tessera cluster (pserver and trainer daemons as separate processes),
// supervises it and stops it.
//
// Each child gets role/endpoint flags, its stdout+stderr in <log_dir>/<role>.<i>.log, and dies
// with the launcher (PR_SET_PDEATHSIG). Trainer 0's output is also streamed to the launcher's
// stdout. If any child exits non-zero (or is killed), every other child is stopped (SIGTERM,
// then SIGKILL after a grace period) and Run() returns that child's exit status. When all
// trainers have finished, pservers get `pserver_exit_grace` to exit on their own.
#ifndef TESSERA_DEPLOY_LAUNCH_LAUNCHER_H_
#define TESSERA_DEPLOY_LAUNCH_LAUNCHER_H_

#include <ostream>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace tessera {

struct LaunchOptions {
  int pservers = 2;
  int trainers = 2;
  std::string host = "127.0.0.1";
  std::string log_dir;  // "" = a fresh directory under /tmp
  std::string pserver_bin;
  std::string trainer_bin;
  std::vector<std::string> extra_args;  // passed to every daemon (e.g. --example=ctr)
  absl::Duration stop_grace = absl::Seconds(5);
  absl::Duration pserver_exit_grace = absl::Seconds(30);
};

// Picks a free TCP port on `host` (bind to port 0).
absl::StatusOr<int> PickFreePort(const std::string& host);

class Launcher {
 public:
  explicit Launcher(LaunchOptions options, std::ostream& out)
      : options_(std::move(options)), out_(out) {}

  // Starts the cluster and supervises it; returns the exit code the launcher should exit with
  // (0 when every process succeeded). Errors starting processes are returned as a Status.
  absl::StatusOr<int> Run();
  // Asks a running Run() to stop every child (signal-safe: only sets a flag).
  static void RequestStop();

  const std::string& log_dir() const { return log_dir_; }

 private:
  struct Child {
    std::string name;  // "pserver.0"
    pid_t pid = -1;
    bool trainer = false;
    bool exited = false;
    int status = 0;
  };
  absl::Status Spawn(Child* child, const std::vector<std::string>& args, bool stream);
  void StopAll();

  LaunchOptions options_;
  std::ostream& out_;
  std::string log_dir_;
  std::vector<Child> children_;
};

}  // namespace tessera

#endif  // TESSERA_DEPLOY_LAUNCH_LAUNCHER_H_
