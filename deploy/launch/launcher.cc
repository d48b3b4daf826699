#include "deploy/launch/launcher.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "common/io/checkpoint_io.h"
#include "deploy/launch/training_plot.h"

extern char** environ;

namespace tessera {

namespace {

std::atomic<bool> g_stop{false};

int ExitCodeOf(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

std::string Describe(int status) {
  if (WIFEXITED(status)) return absl::StrCat("exited with status ", WEXITSTATUS(status));
  if (WIFSIGNALED(status)) return absl::StrCat("was killed by signal ", WTERMSIG(status));
  return "stopped";
}

absl::Status Bad(absl::string_view what) { return absl::InvalidArgumentError(what); }

// "host:port" -> host (brackets of "[::1]:6170" removed); "" when `ep` is not host:port.
std::string HostOf(const std::string& ep) {
  size_t colon = ep.rfind(':');
  if (colon == std::string::npos || colon == 0) return "";
  int port;
  if (!absl::SimpleAtoi(ep.substr(colon + 1), &port) || port <= 0 || port > 65535) return "";
  std::string host = ep.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  return host;
}

absl::Status CheckEndpoints(const std::vector<std::string>& eps, const std::string& flag) {
  for (const auto& ep : eps) {
    if (HostOf(ep).empty()) {
      return Bad(absl::StrCat("--", flag, " entry '", ep, "' is not host:port"));
    }
  }
  return absl::OkStatus();
}

// Device ids "0,1,2" -> {"0","1","2"}; InvalidArgument names `devices` on anything else.
absl::StatusOr<std::vector<std::string>> DeviceIds(absl::string_view list,
                                                   const std::string& devices) {
  std::vector<std::string> ids;
  for (absl::string_view id : absl::StrSplit(list, ',')) {
    int n;
    if (!absl::SimpleAtoi(id, &n) || n < 0) {
      return Bad(absl::StrCat("--devices='", devices, "': '", id,
                              "' is not a device number (use e.g. 0,1/2,3 or cpu:4)"));
    }
    ids.push_back(std::string(id));
  }
  return ids;
}

// The environment of each of `n` local trainers for --devices (see LaunchOptions::devices).
absl::StatusOr<std::vector<std::vector<std::pair<std::string, std::string>>>> DeviceEnv(
    const std::string& devices, int n) {
  std::vector<std::vector<std::pair<std::string, std::string>>> env(n);
  if (devices.empty() || n == 0) return env;
  if (absl::StartsWith(devices, "cpu:")) {
    int places;
    if (!absl::SimpleAtoi(devices.substr(4), &places) || places < 1) {
      return Bad(absl::StrCat("--devices='", devices, "': cpu:N needs N >= 1"));
    }
    for (auto& e : env) e.push_back({"TESSERA_CPU_PLACES", absl::StrCat(places)});
    return env;
  }
  absl::string_view list = devices;
  absl::ConsumePrefix(&list, "gpu:");
  std::vector<std::vector<std::string>> groups;
  if (absl::StrContains(list, '/')) {
    for (absl::string_view g : absl::StrSplit(list, '/')) {
      auto ids = DeviceIds(g, devices);
      if (!ids.ok()) return ids.status();
      groups.push_back(*ids);
    }
    if (static_cast<int>(groups.size()) != n) {
      return Bad(absl::StrCat("--devices='", devices, "' has ", groups.size(), " groups for the ",
                              n, " trainers of this host"));
    }
  } else {
    auto ids = DeviceIds(list, devices);
    if (!ids.ok()) return ids.status();
    if (static_cast<int>(ids->size()) < n || ids->size() % n != 0) {
      return Bad(absl::StrCat("--devices='", devices, "': ", ids->size(),
                              " devices cannot be divided evenly among the ", n,
                              " trainers of this host (or give one group per trainer: 0,1/2,3)"));
    }
    size_t per = ids->size() / n;
    for (int k = 0; k < n; ++k) {
      groups.emplace_back(ids->begin() + k * per, ids->begin() + (k + 1) * per);
    }
  }
  // A trainer given GPUs runs on them: --device=gpu, and the ordinals CUDA gives its visible
  // devices (0 .. k-1), so no trainer flag has to repeat what --devices said.
  for (int k = 0; k < n; ++k) {
    std::vector<std::string> ordinals;
    for (size_t i = 0; i < groups[k].size(); ++i) ordinals.push_back(absl::StrCat(i));
    env[k].push_back({"CUDA_VISIBLE_DEVICES", absl::StrJoin(groups[k], ",")});
    env[k].push_back({"TESSERA_DEVICE", "gpu"});
    env[k].push_back({"TESSERA_DEVICES", absl::StrJoin(ordinals, ",")});
  }
  return env;
}

std::string ShortName(const std::string& host) { return host.substr(0, host.find('.')); }

std::string Numeric(const sockaddr* sa) {
  char buf[INET6_ADDRSTRLEN] = {0};
  if (sa->sa_family == AF_INET) {
    ::inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(sa)->sin_addr, buf, sizeof(buf));
  } else if (sa->sa_family == AF_INET6) {
    ::inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6*>(sa)->sin6_addr, buf, sizeof(buf));
  }
  return buf;
}

bool Loopback(const std::string& addr) { return absl::StartsWith(addr, "127.") || addr == "::1"; }

}  // namespace

void Launcher::RequestStop() { g_stop = true; }

absl::StatusOr<int> PickFreePort(const std::string& host) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::UnavailableError(absl::StrCat("socket: ", std::strerror(errno)));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = 0;
  if (::inet_pton(AF_INET, host.c_str(), &addr.sin_addr) != 1) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat("host '", host, "' is not an IPv4 address"));
  }
  if (::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    std::string err = std::strerror(errno);
    ::close(fd);
    return absl::UnavailableError(absl::StrCat("bind ", host, ":0: ", err));
  }
  socklen_t len = sizeof(addr);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  ::close(fd);
  return static_cast<int>(ntohs(addr.sin_port));
}

bool IsLocalHost(const std::string& host) {
  if (host.empty()) return false;
  if (host == "localhost" || Loopback(host)) return true;
  char name[HOST_NAME_MAX + 1] = {0};
  if (::gethostname(name, sizeof(name) - 1) == 0 && name[0] != '\0') {
    std::string self = name;
    if (host == self || ShortName(host) == ShortName(self)) return true;
  }
  std::set<std::string> local;
  ifaddrs* ifs = nullptr;
  if (::getifaddrs(&ifs) == 0) {
    for (ifaddrs* i = ifs; i != nullptr; i = i->ifa_next) {
      if (i->ifa_addr != nullptr) local.insert(Numeric(i->ifa_addr));
    }
    ::freeifaddrs(ifs);
  }
  if (local.count(host) > 0) return true;
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (::getaddrinfo(host.c_str(), nullptr, &hints, &res) != 0) return false;
  bool found = false;
  for (addrinfo* a = res; a != nullptr && !found; a = a->ai_next) {
    std::string addr = Numeric(a->ai_addr);
    found = Loopback(addr) || local.count(addr) > 0;
  }
  ::freeaddrinfo(res);
  return found;
}

void BindCpus(const std::vector<int>& allowed, std::vector<ProcessSpec>* specs) {
  std::vector<ProcessSpec*> pservers, trainers;
  for (ProcessSpec& spec : *specs) (spec.trainer ? trainers : pservers).push_back(&spec);
  const size_t pairs = trainers.size();
  if (pairs < 2 || pservers.size() != pairs || allowed.empty()) return;
  for (size_t j = 0; j < pairs; ++j) {
    std::vector<int> part;
    if (allowed.size() >= pairs) {
      part.assign(allowed.begin() + j * allowed.size() / pairs,
                  allowed.begin() + (j + 1) * allowed.size() / pairs);
    } else {
      part.push_back(allowed[j % allowed.size()]);
    }
    trainers[j]->cpus = part;
    pservers[j]->cpus = part;
  }
}

std::vector<int> AllowedCpus() {
  std::vector<int> cpus;
  cpu_set_t set;
  CPU_ZERO(&set);
  if (::sched_getaffinity(0, sizeof(set), &set) != 0) return cpus;
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (CPU_ISSET(c, &set)) cpus.push_back(c);
  }
  return cpus;
}

absl::StatusOr<std::vector<ProcessSpec>> PlanLaunch(const LaunchOptions& o) {
  if (o.bind_cpus != "auto" && o.bind_cpus != "none") {
    return Bad(absl::StrCat("--bind_cpus='", o.bind_cpus, "' must be auto or none"));
  }
  if (o.mode != "pserver" && o.mode != "collective" && o.mode != "hybrid") {
    return Bad(absl::StrCat("--mode='", o.mode, "' must be pserver, collective or hybrid"));
  }
  if (!o.role.empty() && o.role != "pserver" && o.role != "trainer") {
    return Bad(absl::StrCat("--role='", o.role, "' must be pserver or trainer (or empty: both)"));
  }
  if (o.rank >= 0 && o.role.empty()) return Bad("--rank needs --role=pserver or --role=trainer");
  if (o.restart_failed < 0) {
    return Bad(absl::StrCat("--restart_failed=", o.restart_failed, " must be >= 0"));
  }
  const bool collective = o.mode == "collective";
  const bool hybrid = o.mode == "hybrid";  // pservers and trainer endpoints
  const bool multi = !o.pserver_endpoints.empty() || !o.trainer_endpoints.empty();
  std::vector<std::string> ps_eps, tr_eps;
  int trainers = o.trainers;
  if (!multi) {
    if (!collective && o.pservers < 1) {
      return Bad(absl::StrCat("--pservers=", o.pservers, " must be >= 1"));
    }
    if (o.trainers < 1) return Bad(absl::StrCat("--trainers=", o.trainers, " must be >= 1"));
    std::set<int> used;
    auto pick = [&](int n, std::vector<std::string>* eps) -> absl::Status {
      for (int tries = 0; static_cast<int>(eps->size()) < n; ++tries) {
        auto port = PickFreePort(o.host);
        if (!port.ok()) return port.status();
        if (tries > 100 * n) return absl::UnavailableError("no free ports on " + o.host);
        if (used.insert(*port).second) eps->push_back(absl::StrCat(o.host, ":", *port));
      }
      return absl::OkStatus();
    };
    absl::Status s = pick(collective ? 0 : o.pservers, &ps_eps);
    if (s.ok() && (collective || hybrid)) s = pick(o.trainers, &tr_eps);
    if (!s.ok()) return s;
  } else {
    absl::Status s = CheckEndpoints(o.pserver_endpoints, "pserver_endpoints");
    if (s.ok()) s = CheckEndpoints(o.trainer_endpoints, "trainer_endpoints");
    if (!s.ok()) return s;
    ps_eps = o.pserver_endpoints;
    tr_eps = o.trainer_endpoints;
    if (collective && !ps_eps.empty()) {
      return Bad("--pserver_endpoints given with --mode=collective, which has no pservers");
    }
    if ((collective || hybrid) && tr_eps.empty()) {
      return Bad(absl::StrCat("--mode=", o.mode, " needs --trainer_endpoints"));
    }
    if (!collective && ps_eps.empty()) return Bad("--trainer_endpoints needs --pserver_endpoints");
    if (!tr_eps.empty()) trainers = static_cast<int>(tr_eps.size());
    if (trainers < 1) return Bad(absl::StrCat("--trainers=", trainers, " must be >= 1"));
    if (tr_eps.empty() && o.role.empty()) {
      return Bad(
          "--pserver_endpoints without --trainer_endpoints: say what runs on this host with "
          "--role=pserver or --role=trainer (and --rank=K for one of them)");
    }
  }
  const int pservers = static_cast<int>(ps_eps.size());
  if (o.role == "pserver" && collective) return Bad("--role=pserver with --mode=collective");
  if (o.role == "pserver" && o.rank >= pservers) {
    return Bad(absl::StrCat("--rank=", o.rank, " but there are ", pservers, " pservers"));
  }
  if (o.role == "trainer" && o.rank >= trainers) {
    return Bad(absl::StrCat("--rank=", o.rank, " but there are ", trainers, " trainers"));
  }

  // This host's share.
  auto chosen = [&](const std::string& role, int i, const std::vector<std::string>& eps) {
    if (!o.role.empty() && o.role != role) return false;
    if (o.rank >= 0) return i == o.rank;
    if (!multi || eps.empty()) return true;  // local job, or trainers without endpoints
    return IsLocalHost(HostOf(eps[i]));
  };
  std::vector<int> local_ps, local_tr;
  for (int i = 0; i < pservers; ++i) {
    if (chosen("pserver", i, ps_eps)) local_ps.push_back(i);
  }
  for (int k = 0; k < trainers; ++k) {
    if (chosen("trainer", k, tr_eps)) local_tr.push_back(k);
  }
  if (local_ps.empty() && local_tr.empty()) {
    return Bad(absl::StrCat("nothing to start on this host: no endpoint in --pserver_endpoints=",
                            absl::StrJoin(ps_eps, ","),
                            " --trainer_endpoints=", absl::StrJoin(tr_eps, ","),
                            " is local (use --role and --rank to choose)"));
  }
  auto devices = DeviceEnv(o.devices, static_cast<int>(local_tr.size()));
  if (!devices.ok()) return devices.status();

  std::vector<std::string> common;
  if (!ps_eps.empty()) common.push_back("--pservers=" + absl::StrJoin(ps_eps, ","));
  common.push_back(absl::StrCat("--trainers=", trainers));
  if (!tr_eps.empty()) common.push_back("--trainer_endpoints=" + absl::StrJoin(tr_eps, ","));
  if (o.mode != "pserver") common.push_back("--mode=" + o.mode);
  if (!multi) common.push_back(absl::StrCat("--job_id=local-", ::getpid()));
  common.insert(common.end(), o.extra_args.begin(), o.extra_args.end());

  std::vector<ProcessSpec> specs;
  for (int i : local_ps) {
    ProcessSpec p;
    p.name = absl::StrCat("pserver.", i);
    p.index = i;
    p.argv = {o.pserver_bin, "--role=pserver", "--current_endpoint=" + ps_eps[i]};
    if (!o.trace.empty()) p.argv.push_back("--trace=" + PserverTracePath(o.trace, i));
    p.argv.insert(p.argv.end(), common.begin(), common.end());
    specs.push_back(std::move(p));
  }
  for (size_t j = 0; j < local_tr.size(); ++j) {
    int k = local_tr[j];
    ProcessSpec p;
    p.name = absl::StrCat("trainer.", k);
    p.trainer = true;
    p.index = k;
    p.argv = {o.trainer_bin, "--role=trainer", absl::StrCat("--trainer_id=", k)};
    if (!tr_eps.empty()) p.argv.push_back("--current_endpoint=" + tr_eps[k]);
    if (k == 0 && !o.trace.empty()) p.argv.push_back("--trace=" + o.trace);
    p.argv.insert(p.argv.end(), common.begin(), common.end());
    p.env = (*devices)[j];
    specs.push_back(std::move(p));
  }
  if (o.bind_cpus == "auto") BindCpus(AllowedCpus(), &specs);
  return specs;
}

std::string PserverTracePath(const std::string& trace, int index) {
  const std::string suffix = absl::StrCat(".pserver", index, ".json");
  if (absl::EndsWith(trace, ".json")) {
    return trace.substr(0, trace.size() - 5) + suffix;
  }
  return trace + suffix;
}

Launcher::~Launcher() { JoinStreamers(); }

void Launcher::Say(const std::string& line) {
  absl::MutexLock lock(&out_mu_);
  out_ << "tessera_launch: " << line << std::endl;
}

absl::Status Launcher::Spawn(Child* child, bool restart) {
  const ProcessSpec& spec = child->spec;
  std::string log_path = absl::StrCat(log_dir_, "/", spec.name, ".log");
  int flags = O_WRONLY | O_CREAT | O_CLOEXEC | (restart ? O_APPEND : O_TRUNC);
  int log_fd = ::open(log_path.c_str(), flags, 0644);
  if (log_fd < 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot create ", log_path, ": ", std::strerror(errno)));
  }
  if (restart) {
    std::string banner = absl::StrCat("==== tessera_launch: restart ", child->restarts, " of ",
                                      options_.restart_failed, " ====\n");
    (void)!::write(log_fd, banner.data(), banner.size());
  }
  const bool stream = spec.trainer && spec.index == 0;
  int pipe_fds[2] = {-1, -1};
  if (stream && ::pipe2(pipe_fds, O_CLOEXEC) != 0) {
    ::close(log_fd);
    return absl::UnavailableError(absl::StrCat("pipe: ", std::strerror(errno)));
  }
  // Everything the child needs is built before fork(): after it only async-signal-safe calls.
  std::vector<char*> argv;
  for (const auto& a : spec.argv) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  std::map<std::string, std::string> env_map;
  for (char** e = environ; e != nullptr && *e != nullptr; ++e) {
    std::string kv = *e;
    size_t eq = kv.find('=');
    if (eq != std::string::npos) env_map[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  for (const auto& [k, v] : spec.env) env_map[k] = v;
  std::vector<std::string> env_strings;
  for (const auto& [k, v] : env_map) env_strings.push_back(k + "=" + v);
  std::vector<char*> envp;
  for (auto& s : env_strings) envp.push_back(s.data());
  envp.push_back(nullptr);
  static const char kExecFailed[] = "tessera_launch: cannot exec the daemon binary\n";
  cpu_set_t cpus;
  CPU_ZERO(&cpus);
  for (int c : spec.cpus) CPU_SET(c, &cpus);
  static const char kBindFailed[] =
      "tessera_launch: cannot bind the daemon to its CPUs (--bind_cpus); it runs unbound\n";
  static const char kBatchFailed[] =
      "tessera_launch: cannot run the daemon under SCHED_BATCH (--sched_batch); it runs under the "
      "default policy\n";
  sched_param batch_param{};

  pid_t parent = ::getpid();
  pid_t pid = ::fork();
  if (pid < 0) {
    ::close(log_fd);
    if (stream) {
      ::close(pipe_fds[0]);
      ::close(pipe_fds[1]);
    }
    return absl::UnavailableError(absl::StrCat("fork: ", std::strerror(errno)));
  }
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) _exit(127);
    ::setpgid(0, 0);  // Ctrl-C reaches the launcher only; it stops the children in order
    int in = ::open("/dev/null", O_RDONLY);
    if (in >= 0) ::dup2(in, STDIN_FILENO);
    int out = stream ? pipe_fds[1] : log_fd;
    ::dup2(out, STDOUT_FILENO);
    ::dup2(out, STDERR_FILENO);
    if (!spec.cpus.empty() && ::sched_setaffinity(0, sizeof(cpus), &cpus) != 0) {
      (void)!::write(STDERR_FILENO, kBindFailed, sizeof(kBindFailed) - 1);
    }
    if (options_.sched_batch && ::sched_setscheduler(0, SCHED_BATCH, &batch_param) != 0) {
      (void)!::write(STDERR_FILENO, kBatchFailed, sizeof(kBatchFailed) - 1);
    }
    ::execve(argv[0], argv.data(), envp.data());
    (void)!::write(STDERR_FILENO, kExecFailed, sizeof(kExecFailed) - 1);
    _exit(127);
  }
  child->pid = pid;
  child->exited = false;
  child->status = 0;
  if (stream) {
    ::close(pipe_fds[1]);
    int in = pipe_fds[0];
    child->streamer = std::thread([this, in, log_fd] {
      char buf[4096];
      while (true) {
        ssize_t n = ::read(in, buf, sizeof(buf));
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        (void)!::write(log_fd, buf, static_cast<size_t>(n));
        absl::MutexLock lock(&out_mu_);
        out_.write(buf, n);
        out_.flush();
      }
      ::close(in);
      ::close(log_fd);
    });
  } else {
    ::close(log_fd);
  }
  return absl::OkStatus();
}

void Launcher::StopAll() {
  for (auto& c : children_) {
    if (!c.exited && c.pid > 0) ::kill(c.pid, SIGTERM);
  }
  absl::Time deadline = absl::Now() + options_.stop_grace;
  while (true) {
    bool all = true;
    for (auto& c : children_) {
      if (c.exited || c.pid <= 0) continue;
      pid_t r = ::waitpid(c.pid, &c.status, WNOHANG);
      if (r == c.pid || (r < 0 && errno == ECHILD)) {
        c.exited = true;
      } else {
        all = false;
      }
    }
    if (all || absl::Now() >= deadline) break;
    absl::SleepFor(absl::Milliseconds(20));
  }
  for (auto& c : children_) {
    if (c.exited || c.pid <= 0) continue;
    ::kill(c.pid, SIGKILL);
    ::waitpid(c.pid, &c.status, 0);
    c.exited = true;
  }
}

void Launcher::JoinStreamers() {
  for (auto& c : children_) {
    if (c.streamer.joinable()) c.streamer.join();
  }
}

namespace {

// "0-3,6": CPU numbers (ascending) with runs as ranges.
std::string CpuList(const std::vector<int>& cpus) {
  std::vector<std::string> parts;
  for (size_t i = 0; i < cpus.size();) {
    size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    parts.push_back(j == i ? absl::StrCat(cpus[i]) : absl::StrCat(cpus[i], "-", cpus[j]));
    i = j + 1;
  }
  return absl::StrJoin(parts, ",");
}

// The value of a --checkpoint_dir=D among the daemons' flags ("" if none).
std::string CheckpointDirOf(const std::vector<std::string>& args) {
  std::string dir;
  for (const auto& a : args) {
    if (absl::StartsWith(a, "--checkpoint_dir=")) dir = a.substr(sizeof("--checkpoint_dir=") - 1);
  }
  return dir;
}

// Whether the daemons run with --async_drop_silent_trainers (flag or inherited environment):
// then a trainer that fails does not take the job down; the pservers go on without it.
bool DropsSilentTrainers(const std::vector<std::string>& args) {
  std::string value;
  if (const char* env = std::getenv("TESSERA_ASYNC_DROP_SILENT_TRAINERS")) value = env;
  for (const auto& a : args) {
    constexpr absl::string_view kFlag = "--async_drop_silent_trainers=";
    if (absl::StartsWith(a, kFlag)) value = a.substr(kFlag.size());
  }
  return value == "true" || value == "1";
}

}  // namespace

int Launcher::Supervise() {
  bool has_trainers = false;
  for (const auto& c : children_) has_trainers |= c.spec.trainer;
  absl::Time trainers_done_at = absl::InfiniteFuture();
  std::vector<std::string> lost_trainers;  // failed, with --async_drop_silent_trainers
  while (true) {
    if (g_stop) {
      Say("interrupted; stopping every process");
      StopAll();
      return 130;
    }
    bool trainers_running = false, any_running = false, restarted_job = false;
    for (auto& c : children_) {
      if (c.exited) continue;
      int status;
      pid_t r = ::waitpid(c.pid, &status, WNOHANG);
      if (r == 0) {
        any_running = true;
        trainers_running |= c.spec.trainer;
        continue;
      }
      c.exited = true;
      c.status = status;
      const std::string log = absl::StrCat(log_dir_, "/", c.spec.name, ".log");
      if (r < 0) status = 0xff00;  // not our child any more: count it as a failure
      if (ExitCodeOf(status) == 0) continue;
      const std::string ckpt_root = CheckpointDirOf(options_.extra_args);
      if (c.restarts < options_.restart_failed && !g_stop && !ckpt_root.empty()) {
        // A sync job cannot take back one process: restart all of this host's processes from
        // the newest complete checkpoint (from the start when there is none yet).
        ++c.restarts;
        auto ckpt = io::ResolveCheckpoint(io::PosixFileSystem::Default(), ckpt_root);
        Say(absl::StrCat(c.spec.name, " (pid ", c.pid, ") ", Describe(status),
                         "; restarting the job (", c.restarts, " of ", options_.restart_failed,
                         ") ", ckpt.ok() ? "from " + *ckpt : "from the start: no checkpoint yet",
                         ". See ", log));
        StopAll();
        JoinStreamers();
        for (auto& other : children_) {
          std::vector<std::string>& argv = other.spec.argv;
          argv.erase(std::remove_if(
                         argv.begin(), argv.end(),
                         [](const std::string& a) { return absl::StartsWith(a, "--init_from="); }),
                     argv.end());
          if (ckpt.ok()) argv.push_back("--init_from=" + *ckpt);
          if (&other != &c) ++other.restarts;
          absl::Status sp = Spawn(&other, /*restart=*/true);
          if (!sp.ok()) {
            Say(absl::StrCat("cannot restart ", other.spec.name, ": ", sp.message(),
                             "; stopping the job"));
            StopAll();
            return 1;
          }
          Say(absl::StrCat(other.spec.name, " pid ", other.pid));
        }
        restarted_job = true;
        break;
      }
      if (c.restarts < options_.restart_failed && !g_stop) {
        ++c.restarts;
        Say(absl::StrCat(c.spec.name, " (pid ", c.pid, ") ", Describe(status), "; restarting it (",
                         c.restarts, " of ", options_.restart_failed,
                         ", same flags, from the start: no --checkpoint_dir). See ", log));
        if (c.streamer.joinable()) c.streamer.join();
        absl::Status s = Spawn(&c, /*restart=*/true);
        if (!s.ok()) {
          Say(absl::StrCat("cannot restart ", c.spec.name, ": ", s.message(),
                           "; stopping the job"));
          StopAll();
          return 1;
        }
        Say(absl::StrCat(c.spec.name, " pid ", c.pid, ", log ", log));
        any_running = true;
        trainers_running |= c.spec.trainer;
        continue;
      }
      if (c.spec.trainer && DropsSilentTrainers(options_.extra_args)) {
        lost_trainers.push_back(c.spec.name);
        Say(absl::StrCat(c.spec.name, " (pid ", c.pid, ") ", Describe(status),
                         "; the job goes on without it (--async_drop_silent_trainers). See ", log));
        continue;
      }
      Say(absl::StrCat(c.spec.name, " (pid ", c.pid, ") ", Describe(status),
                       c.restarts > 0 ? absl::StrCat(" after ", c.restarts, " restarts") : "",
                       "; stopping the job. See ", log));
      StopAll();
      return ExitCodeOf(status);
    }
    if (restarted_job) continue;
    if (!any_running) break;
    if (has_trainers && !trainers_running) {
      if (trainers_done_at == absl::InfiniteFuture()) trainers_done_at = absl::Now();
      if (absl::Now() - trainers_done_at > options_.pserver_exit_grace) {
        Say("pservers did not exit after the trainers finished; stopping them");
        StopAll();
        return 1;
      }
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
  if (!lost_trainers.empty()) {
    Say(absl::StrCat("all processes finished; the job went on without ",
                     absl::StrJoin(lost_trainers, ", "), " (--async_drop_silent_trainers)"));
    return 0;
  }
  Say("all processes finished");
  return 0;
}

void Launcher::Finish() {
  JoinStreamers();
  bool ran_trainer0 = false;
  for (const auto& c : children_) ran_trainer0 |= c.spec.trainer && c.spec.index == 0;
  if (options_.plot && ran_trainer0) {
    std::ifstream in(absl::StrCat(log_dir_, "/trainer.0.log"));
    std::stringstream text;
    text << in.rdbuf();
    std::vector<TrainingPoint> points = ParseTrainingLog(text.str());
    const std::string csv = log_dir_ + "/metrics.csv";
    const std::string png = log_dir_ + "/training.png";
    if (!points.empty()) {
      absl::Status s = WriteTrainingCsv(points, csv);
      std::string gnuplot = options_.gnuplot.empty() ? FindInPath("gnuplot") : options_.gnuplot;
      bool positive = true;
      for (const auto& p : points) positive &= p.eval ? !(p.eval_loss <= 0) : p.loss > 0;
      if (!s.ok()) {
        Say(absl::StrCat("no metrics: ", s.message()));
      } else if (gnuplot.empty()) {
        Say(absl::StrCat("training metrics in ", csv, " (install gnuplot for a plot)"));
      } else if (absl::Status p = PlotTraining(gnuplot, csv, png, positive); !p.ok()) {
        Say(absl::StrCat("no plot: ", p.message(), "; training metrics in ", csv));
      } else {
        Say(absl::StrCat("plot of loss, held-out loss and samples/s: ", png, " (data: ", csv,
                         ")"));
      }
    }
  }
  Say(absl::StrCat("logs in ", log_dir_));
}

absl::StatusOr<int> Launcher::Run() {
  g_stop = false;
  auto specs = PlanLaunch(options_);
  if (!specs.ok()) return specs.status();
  for (const auto& spec : *specs) {
    if (::access(spec.argv[0].c_str(), X_OK) != 0) {
      return absl::NotFoundError(absl::StrCat("daemon binary ", spec.argv[0],
                                              " is not executable: ", std::strerror(errno)));
    }
  }
  log_dir_ = options_.log_dir;
  if (log_dir_.empty()) {
    char tmpl[] = "/tmp/tessera_logs_XXXXXX";
    if (::mkdtemp(tmpl) == nullptr) return absl::UnavailableError("cannot create a log directory");
    log_dir_ = tmpl;
  } else if (::mkdir(log_dir_.c_str(), 0755) != 0 && errno != EEXIST) {
    return absl::UnavailableError(
        absl::StrCat("cannot create --log_dir ", log_dir_, ": ", std::strerror(errno)));
  }
  children_.clear();
  children_.resize(specs->size());
  std::vector<std::string> names;
  for (size_t i = 0; i < specs->size(); ++i) {
    children_[i].spec = (*specs)[i];
    names.push_back(children_[i].spec.name);
  }
  int pservers = 0, trainers = 0;
  for (const auto& c : children_) (c.spec.trainer ? trainers : pservers)++;
  std::string where;
  for (const auto& arg : children_.front().spec.argv) {
    if (absl::StartsWith(arg, "--pservers=")) where = " (" + arg.substr(11) + ")";
  }
  Say(absl::StrCat("starting ", pservers, " pservers", pservers > 0 ? where : "", " and ", trainers,
                   " trainers on this host: ", absl::StrJoin(names, " "), "; logs in ", log_dir_));
  std::vector<std::string> bound;
  for (const auto& c : children_) {
    if (!c.spec.cpus.empty()) {
      bound.push_back(absl::StrCat(c.spec.name, " on CPU ", CpuList(c.spec.cpus)));
    }
  }
  if (!bound.empty()) {
    Say(absl::StrCat(absl::StrJoin(bound, ", "), " (--bind_cpus=none leaves it to the OS)"));
  }
  for (auto& c : children_) {
    absl::Status s = Spawn(&c, /*restart=*/false);
    if (!s.ok()) {
      StopAll();
      JoinStreamers();
      return s;
    }
  }
  for (const auto& c : children_) {
    Say(absl::StrCat(c.spec.name, " pid ", c.pid, ", log ", log_dir_, "/", c.spec.name, ".log"));
  }
  int code = Supervise();
  Finish();
  return code;
}

}  // namespace tessera
