#include "deploy/launch/launch_flags.h"

#include <algorithm>
#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "google/protobuf/io/tokenizer.h"
#include "google/protobuf/text_format.h"

namespace tessera {

namespace {

// Collects TextFormat's parse errors ("line:column: message").
class ErrorCollector : public google::protobuf::io::ErrorCollector {
 public:
  void AddError(int line, google::protobuf::io::ColumnNumber column,
                const std::string& message) override {
    if (first_.empty()) first_ = absl::StrCat(line + 1, ":", column + 1, ": ", message);
  }
  const std::string& first() const { return first_; }

 private:
  std::string first_;
};

std::vector<std::string> List(absl::string_view v) {
  std::vector<std::string> out;
  for (absl::string_view s : absl::StrSplit(v, ',', absl::SkipWhitespace())) {
    out.push_back(std::string(absl::StripAsciiWhitespace(s)));
  }
  return out;
}

absl::Status BadFlag(const std::string& name, absl::string_view value, absl::string_view why) {
  return absl::InvalidArgumentError(absl::StrCat("--", name, "='", value, "': ", why));
}

absl::Status Int(const std::string& name, absl::string_view v, int min, int* out) {
  if (!absl::SimpleAtoi(v, out)) return BadFlag(name, v, "not an integer");
  if (*out < min) return BadFlag(name, v, absl::StrCat("must be >= ", min));
  return absl::OkStatus();
}

absl::Status Seconds(const std::string& name, absl::string_view v, absl::Duration* out) {
  double s;
  if (!absl::SimpleAtod(v, &s) || !(s >= 0))
    return BadFlag(name, v, "not a number of seconds >= 0");
  *out = absl::Seconds(s);
  return absl::OkStatus();
}

// Daemon flags the launcher sets differently for each process: passing one to all of them
// would be a mistake.
bool PerProcessFlag(const std::string& name) {
  return name == "trainer_id" || name == "current_endpoint";
}

// The launcher's own flags that take a value (and the daemons' --role, which it sets).
bool LauncherFlag(const std::string& name) {
  static const char* const kNames[] = {"config",
                                       "pservers",
                                       "trainers",
                                       "pserver_endpoints",
                                       "trainer_endpoints",
                                       "role",
                                       "rank",
                                       "mode",
                                       "host",
                                       "devices",
                                       "log_dir",
                                       "restart_failed",
                                       "gnuplot",
                                       "stop_grace_s",
                                       "pserver_exit_grace_s",
                                       "pserver_bin",
                                       "trainer_bin",
                                       "trace",
                                       "bind_cpus",
                                       "trainer_id",
                                       "current_endpoint"};
  for (const char* n : kNames) {
    if (name == n) return true;
  }
  return false;
}

}  // namespace

std::string LaunchUsage() {
  return R"(Usage: tessera_launch [launcher flags] [daemon flags...]

A local cluster (ports picked free, one log per process):
  tessera_launch --pservers=2 --trainers=2 --example=ctr
A multi-host cluster: run on every host with the same endpoint lists; each starts its share
(--role/--rank, else the processes whose endpoint host is this machine):
  tessera_launch --pserver_endpoints=h1:6170,h2:6170 --role=trainer --rank=0 --trainers=2 ...

Launcher flags (also fields of the --config text proto, see proto/launch.proto):
  --config=FILE               LaunchConfig text proto; flags given here override it
  --pservers=N --trainers=M   local cluster shape (default 2 and 2)
  --host=ADDR                 IPv4 address for local pservers (default 127.0.0.1)
  --pserver_endpoints=LIST    host:port,... of every pserver of a multi-host job
  --trainer_endpoints=LIST    host:port,... of every trainer (collective mode)
  --role=pserver|trainer      start only this role; --rank=K only its K-th process
  --mode=pserver|collective|hybrid
                              collective: no pservers; hybrid: tables on the pservers, dense
                              gradients all-reduced (also passed to the daemons)
  --devices=D                 this host's trainers' devices: 0,1,2,3 (divided evenly) or
                              0,1/2,3 (per trainer) -> CUDA_VISIBLE_DEVICES, TESSERA_DEVICE=gpu
                              and TESSERA_DEVICES; cpu:N -> TESSERA_CPU_PLACES=N (default: none)
  --restart_failed=K          restart a failed process up to K times (same flags, from the
                              start: resuming from a checkpoint comes with checkpoints)
  --log_dir=DIR               <role>.<i>.log per process, metrics.csv, training.png
  --[no]plot                  trainer 0's loss/throughput as metrics.csv + training.png (gnuplot)
  --gnuplot=PATH              gnuplot binary (default: from $PATH)
  --stop_grace_s=S            SIGTERM to SIGKILL when stopping (default 5)
  --pserver_exit_grace_s=S    pservers' time to exit after the trainers finished (default 30)
  --pserver_bin=P --trainer_bin=T   daemon binaries (default: next to tessera_launch)
  --trace=FILE                trainer 0 writes a Chrome-trace JSON timeline of its steps here,
                              and pserver k its barriers, prefetches and optimizes next to
                              it (t.json: t.pserver0.json, ...), on the same clock
  --bind_cpus=auto|none       auto (default): with as many pservers as trainers on this host,
                              two or more of each, trainer k and pserver k share the k-th equal
                              part of the launcher's CPUs; none: the OS places every process
  --[no]sched_batch           run the daemons under SCHED_BATCH (default true): a woken daemon
                              thread waits for the running one's slice instead of preempting it
Every other flag (or everything after --) goes to every daemon, e.g. --example=mlp_regression
--epochs=3; tessera_pserver --help lists them. Ctrl-C stops every process.
)";
}

absl::StatusOr<LaunchConfig> ReadLaunchConfig(const std::string& path) {
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot read --config ", path));
  std::stringstream text;
  text << in.rdbuf();
  LaunchConfig config;
  google::protobuf::TextFormat::Parser parser;
  ErrorCollector errors;
  parser.RecordErrorsTo(&errors);
  if (!parser.ParseFromString(text.str(), &config)) {
    return absl::InvalidArgumentError(absl::StrCat("--config ", path, ":", errors.first()));
  }
  return config;
}

absl::Status ApplyLaunchConfig(const LaunchConfig& c, LaunchOptions* o) {
  if (c.has_pservers()) o->pservers = c.pservers();
  if (c.has_trainers()) o->trainers = c.trainers();
  if (c.has_host()) o->host = c.host();
  if (c.pserver_endpoints_size() > 0) {
    o->pserver_endpoints.assign(c.pserver_endpoints().begin(), c.pserver_endpoints().end());
  }
  if (c.trainer_endpoints_size() > 0) {
    o->trainer_endpoints.assign(c.trainer_endpoints().begin(), c.trainer_endpoints().end());
  }
  if (c.has_role()) o->role = c.role();
  if (c.has_rank()) o->rank = c.rank();
  if (c.has_mode()) o->mode = c.mode();
  if (c.has_devices()) o->devices = c.devices();
  if (c.has_bind_cpus()) o->bind_cpus = c.bind_cpus();
  if (c.has_sched_batch()) o->sched_batch = c.sched_batch();
  if (c.has_restart_failed()) o->restart_failed = c.restart_failed();
  if (c.has_stop_grace_s()) {
    if (!(c.stop_grace_s() >= 0)) return absl::InvalidArgumentError("stop_grace_s must be >= 0");
    o->stop_grace = absl::Seconds(c.stop_grace_s());
  }
  if (c.has_pserver_exit_grace_s()) {
    if (!(c.pserver_exit_grace_s() >= 0)) {
      return absl::InvalidArgumentError("pserver_exit_grace_s must be >= 0");
    }
    o->pserver_exit_grace = absl::Seconds(c.pserver_exit_grace_s());
  }
  if (c.has_log_dir()) o->log_dir = c.log_dir();
  if (c.has_plot()) o->plot = c.plot();
  if (c.has_pserver_bin()) o->pserver_bin = c.pserver_bin();
  if (c.has_trainer_bin()) o->trainer_bin = c.trainer_bin();
  for (const auto& a : c.daemon_args()) o->extra_args.push_back(a);
  return absl::OkStatus();
}

absl::Status ParseLaunchArgs(const std::vector<std::string>& args, LaunchOptions* o) {
  // The config file first, wherever --config is, so that every flag overrides it.
  for (const auto& a : args) {
    if (a == "--") break;
    if (absl::StartsWith(a, "--config=")) {
      auto config = ReadLaunchConfig(a.substr(9));
      if (!config.ok()) return absl::InvalidArgumentError(config.status().message());
      absl::Status s = ApplyLaunchConfig(*config, o);
      if (!s.ok())
        return absl::InvalidArgumentError(
            absl::StrCat("--config ", a.substr(9), ": ", s.message()));
    }
  }
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--help" || a == "-h") return absl::NotFoundError(LaunchUsage());
    if (a == "--") {
      o->extra_args.insert(o->extra_args.end(), args.begin() + i + 1, args.end());
      break;
    }
    if (a == "--plot" || a == "--noplot") {
      o->plot = a == "--plot";
      continue;
    }
    if (a == "--sched_batch" || a == "--nosched_batch") {
      o->sched_batch = a == "--sched_batch";
      continue;
    }
    if (!absl::StartsWith(a, "--") || a.find('=') == std::string::npos) {
      if (LauncherFlag(a.substr(std::min<size_t>(2, a.size())))) {
        return absl::InvalidArgumentError(
            absl::StrCat(a, " needs a value: write ", a, "=VALUE (a space is not enough)"));
      }
      o->extra_args.push_back(a);
      continue;
    }
    std::string name = a.substr(2, a.find('=') - 2);
    std::string v = a.substr(a.find('=') + 1);
    absl::Status s;
    if (name == "config") {
      continue;  // applied above
    } else if (name == "pservers") {
      if (absl::StrContains(v, ':')) {  // the daemons' form: a list of endpoints
        o->pserver_endpoints = List(v);
      } else {
        s = Int(name, v, 0, &o->pservers);
      }
    } else if (name == "trainers") {
      s = Int(name, v, 1, &o->trainers);
    } else if (name == "pserver_endpoints") {
      o->pserver_endpoints = List(v);
    } else if (name == "trainer_endpoints") {
      o->trainer_endpoints = List(v);
    } else if (name == "role") {
      o->role = absl::AsciiStrToLower(v);
    } else if (name == "rank") {
      s = Int(name, v, 0, &o->rank);
    } else if (name == "mode") {
      o->mode = v;
    } else if (name == "host") {
      o->host = v;
    } else if (name == "devices") {
      o->devices = v;
    } else if (name == "restart_failed") {
      s = Int(name, v, 0, &o->restart_failed);
    } else if (name == "log_dir") {
      o->log_dir = v;
    } else if (name == "plot") {
      if (!absl::SimpleAtob(v, &o->plot)) s = BadFlag(name, v, "not a boolean");
    } else if (name == "gnuplot") {
      o->gnuplot = v;
    } else if (name == "stop_grace_s") {
      s = Seconds(name, v, &o->stop_grace);
    } else if (name == "pserver_exit_grace_s") {
      s = Seconds(name, v, &o->pserver_exit_grace);
    } else if (name == "pserver_bin") {
      o->pserver_bin = v;
    } else if (name == "trainer_bin") {
      o->trainer_bin = v;
    } else if (name == "trace") {
      o->trace = v;
    } else if (name == "bind_cpus") {
      o->bind_cpus = v;
    } else if (name == "sched_batch") {
      if (!absl::SimpleAtob(v, &o->sched_batch)) s = BadFlag(name, v, "not a boolean");
    } else if (PerProcessFlag(name)) {
      s = BadFlag(name, v, "the launcher sets it for each process; use --role/--rank to pick one");
    } else {
      o->extra_args.push_back(a);
    }
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

}  // namespace tessera
