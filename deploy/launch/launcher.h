// Launcher: starts Tessera's pserver and trainer daemons as child processes, supervises them and
// stops them.
//
// Two shapes of job:
//  - local: `pservers` and `trainers` processes on this machine, ports picked free;
//  - multi-host: `pserver_endpoints` (and `trainer_endpoints`) name every process of the job,
//    and each host's launcher starts its share: the processes picked by `role`/`rank`, else
//    those whose endpoint host is this machine.
//
// Each child gets role/endpoint flags, its devices in its environment (CUDA_VISIBLE_DEVICES or
// TESSERA_CPU_PLACES), its stdout+stderr in <log_dir>/<role>.<i>.log, and dies with the
// launcher (PR_SET_PDEATHSIG). Trainer 0's output is also streamed to the launcher's output.
// A child that exits non-zero (or is killed) is restarted, with the same flags, up to
// `restart_failed` times; when the daemons get --checkpoint_dir=D (extra_args), all of this
// host's processes are restarted instead, with --init_from=<the newest complete checkpoint
// under D> (a sync job cannot take back a single process); past that every other child is stopped
// (SIGTERM, then SIGKILL after `stop_grace`) and Run() returns that child's exit code (128+signal
// when killed). When all local trainers have finished, pservers get `pserver_exit_grace` to exit on
// their own. At the end trainer 0's "step N loss L samples/s S" lines become <log_dir>/metrics.csv
// and, when gnuplot is installed, <log_dir>/training.png; the launcher prints where the logs and
// the plot are.
//
// Thread-safety: one Run() per Launcher; RequestStop() may be called from a signal handler.
#ifndef TESSERA_DEPLOY_LAUNCH_LAUNCHER_H_
#define TESSERA_DEPLOY_LAUNCH_LAUNCHER_H_

#include <sys/types.h>

#include <ostream>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace tessera {

struct LaunchOptions {
  // Local job.
  int pservers = 2;
  int trainers = 2;
  std::string host = "127.0.0.1";  // IPv4 address local pservers listen on
  // Multi-host job: every endpoint (host:port) of the job; non-empty pserver_endpoints (or
  // trainer_endpoints in collective mode) selects this shape. `trainers` counts the trainers
  // when trainer_endpoints is empty.
  std::vector<std::string> pserver_endpoints;
  std::vector<std::string> trainer_endpoints;
  std::string role;              // "" (both) | "pserver" | "trainer": start only that role
  int rank = -1;                 // >= 0 (needs `role`): start only this index of the role
  std::string mode = "pserver";  // "pserver" | "collective" (no pservers; passed as --mode)
  // This host's trainers' devices: "" | "0,1,2,3" (divided evenly, in trainer order) |
  // "0,1/2,3" (one group per trainer) | "gpu:..." (the same) | "cpu:N" (TESSERA_CPU_PLACES=N).
  // GPUs set CUDA_VISIBLE_DEVICES to the group, TESSERA_DEVICE=gpu and TESSERA_DEVICES to the
  // group's ordinals after it (0,1,...); a trainer's own --device / --devices flags win.
  std::string devices;
  int restart_failed = 0;  // restarts allowed per process
  std::string log_dir;     // "" = a fresh directory under /tmp
  bool plot = true;        // metrics.csv + training.png from trainer 0's log at the end
  std::string gnuplot;     // gnuplot binary; "" = "gnuplot" from $PATH
  std::string pserver_bin;
  std::string trainer_bin;
  std::vector<std::string> extra_args;  // passed to every daemon (e.g. --example=ctr)
  // Trainer 0's --trace (Chrome-trace JSON path); each pserver k started here gets
  // PserverTracePath(trace, k). No other trainer traces.
  std::string trace;
  // "auto": when this host starts as many pservers as trainers, two or more of each, trainer k
  // and pserver k are bound to the k-th of that many equal shares of the CPUs the launcher may
  // use (BindCpus); "none": the OS places every process.
  std::string bind_cpus = "auto";
  // Daemons run under SCHED_BATCH: a woken daemon thread does not preempt the running one, so a
  // step's chain of wake-ups on shared cores costs fewer context switches; false: they keep the
  // launcher's own policy (normally the default one).
  bool sched_batch = true;
  absl::Duration stop_grace = absl::Seconds(5);
  absl::Duration pserver_exit_grace = absl::Seconds(30);
};

// One process the launcher starts.
struct ProcessSpec {
  std::string name;  // "pserver.0", "trainer.1"
  bool trainer = false;
  int index = 0;                                         // pserver index or trainer id
  std::vector<std::string> argv;                         // argv[0] is the binary
  std::vector<std::pair<std::string, std::string>> env;  // set on top of the launcher's own
  std::vector<int> cpus;  // the CPUs it runs on (sched_setaffinity); empty: not bound
};

// --bind_cpus=auto: when `specs` hold as many pservers as trainers, two or more of each, the
// j-th trainer and the j-th pserver (in start order) share the j-th of that many equal parts of
// `allowed` (CPU numbers, ascending; with fewer CPUs than pairs, pair j gets CPU j mod their
// count); otherwise nothing is bound. Why pairs: a sync step alternates between the trainers'
// compute and the pservers' update, so a part holding one of each is busy in both phases, while
// the OS scheduler, which moves a woken process next to the one that woke it, keeps pulling the
// processes that exchange a step onto the same cores (tests/bench/RESULTS.md).
void BindCpus(const std::vector<int>& allowed, std::vector<ProcessSpec>* specs);

// Where pserver `index` of a launch with --trace=`trace` writes its timeline: `trace` with
// ".pserver<index>" before its ".json" ending (appended, with ".json", when it has none).
std::string PserverTracePath(const std::string& trace, int index);

// The CPUs this process may run on (its affinity mask), ascending.
std::vector<int> AllowedCpus();

// The processes this launcher starts, in start order (pservers first), with their flags and
// environment. A local job picks free ports here. InvalidArgument names the bad option.
absl::StatusOr<std::vector<ProcessSpec>> PlanLaunch(const LaunchOptions& options);

// True when `host` (a name or an address) is this machine: one of its interface addresses,
// its hostname, or a name that resolves to one of those.
bool IsLocalHost(const std::string& host);

// Picks a free TCP port on `host` (bind to port 0).
absl::StatusOr<int> PickFreePort(const std::string& host);

class Launcher {
 public:
  Launcher(LaunchOptions options, std::ostream& out) : options_(std::move(options)), out_(out) {}
  ~Launcher();

  // Starts this host's share of the job and supervises it; returns the exit code the launcher
  // should exit with (0 when every process succeeded, 130 when stopped by RequestStop()).
  // Errors before any process runs (bad options, binaries, log directory) are a Status.
  absl::StatusOr<int> Run();
  // Asks a running Run() to stop every child (async-signal-safe: only sets a flag).
  static void RequestStop();

  const std::string& log_dir() const { return log_dir_; }

 private:
  struct Child {
    ProcessSpec spec;
    pid_t pid = -1;
    bool exited = false;
    int status = 0;
    int restarts = 0;
    std::thread streamer;  // trainer 0: copies its output to the log and to out_
  };
  absl::Status Spawn(Child* child, bool restart);
  // Supervises until the job ends; returns the exit code.
  int Supervise();
  void StopAll();
  void JoinStreamers();
  // Writes metrics.csv / training.png and prints where they and the logs are.
  void Finish();
  void Say(const std::string& line);

  LaunchOptions options_;
  std::ostream& out_;
  absl::Mutex out_mu_;  // out_ is written by Run() and trainer 0's streamer
  std::string log_dir_;
  std::vector<Child> children_;
};

}  // namespace tessera

#endif  // TESSERA_DEPLOY_LAUNCH_LAUNCHER_H_
