#include "deploy/launch/launcher.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"

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
}  // namespace

void Launcher::RequestStop() { g_stop = true; }

absl::StatusOr<int> PickFreePort(const std::string& host) {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
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

absl::Status Launcher::Spawn(Child* child, const std::vector<std::string>& args, bool stream) {
  std::string log_path = absl::StrCat(log_dir_, "/", child->name, ".log");
  int log_fd = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (log_fd < 0) {
    return absl::UnavailableError(absl::StrCat("cannot create ", log_path, ": ", std::strerror(errno)));
  }
  int pipe_fds[2] = {-1, -1};
  if (stream && ::pipe2(pipe_fds, O_CLOEXEC) != 0) {
    ::close(log_fd);
    return absl::UnavailableError(absl::StrCat("pipe: ", std::strerror(errno)));
  }
  std::vector<char*> argv;
  for (const auto& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  pid_t parent = ::getpid();
  pid_t pid = ::fork();
  if (pid < 0) return absl::UnavailableError(absl::StrCat("fork: ", std::strerror(errno)));
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (::getppid() != parent) _exit(127);
    int out = stream ? pipe_fds[1] : log_fd;
    ::dup2(out, STDOUT_FILENO);
    ::dup2(out, STDERR_FILENO);
    ::execv(argv[0], argv.data());
    std::fprintf(stderr, "tessera_launch: cannot exec %s: %s\n", argv[0], std::strerror(errno));
    _exit(127);
  }
  child->pid = pid;
  if (stream) {
    ::close(pipe_fds[1]);
    int in = pipe_fds[0];
    std::ostream* out = &out_;
    std::thread([in, log_fd, out] {
      char buf[4096];
      while (true) {
        ssize_t n = ::read(in, buf, sizeof(buf));
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        (void)!::write(log_fd, buf, static_cast<size_t>(n));
        out->write(buf, n);
        out->flush();
      }
      ::close(in);
      ::close(log_fd);
    }).detach();
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
  while (absl::Now() < deadline) {
    bool all = true;
    for (auto& c : children_) {
      if (c.exited) continue;
      if (::waitpid(c.pid, &c.status, WNOHANG) == c.pid) {
        c.exited = true;
      } else {
        all = false;
      }
    }
    if (all) return;
    absl::SleepFor(absl::Milliseconds(20));
  }
  for (auto& c : children_) {
    if (c.exited) continue;
    ::kill(c.pid, SIGKILL);
    ::waitpid(c.pid, &c.status, 0);
    c.exited = true;
  }
}

absl::StatusOr<int> Launcher::Run() {
  if (options_.pservers < 1 || options_.trainers < 1) {
    return absl::InvalidArgumentError(absl::StrCat("--pservers=", options_.pservers,
                                                   " and --trainers=", options_.trainers,
                                                   " must both be >= 1"));
  }
  for (const auto& bin : {options_.pserver_bin, options_.trainer_bin}) {
    if (::access(bin.c_str(), X_OK) != 0) {
      return absl::NotFoundError(absl::StrCat("daemon binary ", bin, " is not executable: ",
                                              std::strerror(errno)));
    }
  }
  log_dir_ = options_.log_dir;
  if (log_dir_.empty()) {
    char tmpl[] = "/tmp/tessera_logs_XXXXXX";
    if (::mkdtemp(tmpl) == nullptr) return absl::UnavailableError("cannot create a log directory");
    log_dir_ = tmpl;
  } else if (::mkdir(log_dir_.c_str(), 0755) != 0 && errno != EEXIST) {
    return absl::UnavailableError(absl::StrCat("cannot create --log_dir ", log_dir_, ": ",
                                               std::strerror(errno)));
  }
  std::vector<std::string> eps;
  for (int i = 0; i < options_.pservers; ++i) {
    auto port = PickFreePort(options_.host);
    if (!port.ok()) return port.status();
    eps.push_back(absl::StrCat(options_.host, ":", *port));
  }
  std::string ps_list = absl::StrJoin(eps, ",");
  std::string job = absl::StrCat("local-", ::getpid());
  auto common = [&](std::vector<std::string> args) {
    args.push_back("--pservers=" + ps_list);
    args.push_back(absl::StrCat("--trainers=", options_.trainers));
    args.push_back("--job_id=" + job);
    for (const auto& a : options_.extra_args) args.push_back(a);
    return args;
  };
  out_ << "tessera_launch: " << options_.pservers << " pservers (" << ps_list << "), "
       << options_.trainers << " trainers; logs in " << log_dir_ << std::endl;
  for (int i = 0; i < options_.pservers; ++i) {
    Child c;
    c.name = absl::StrCat("pserver.", i);
    children_.push_back(c);
    absl::Status s = Spawn(&children_.back(),
                           common({options_.pserver_bin, "--role=pserver",
                                   "--current_endpoint=" + eps[i]}),
                           false);
    if (!s.ok()) {
      StopAll();
      return s;
    }
  }
  for (int k = 0; k < options_.trainers; ++k) {
    Child c;
    c.name = absl::StrCat("trainer.", k);
    c.trainer = true;
    children_.push_back(c);
    absl::Status s = Spawn(&children_.back(),
                           common({options_.trainer_bin, "--role=trainer",
                                   absl::StrCat("--trainer_id=", k)}),
                           k == 0);
    if (!s.ok()) {
      StopAll();
      return s;
    }
  }
  for (const auto& c : children_) {
    out_ << "tessera_launch: " << c.name << " pid " << c.pid << ", log " << log_dir_ << "/"
         << c.name << ".log" << std::endl;
  }

  absl::Time trainers_done_at = absl::InfiniteFuture();
  while (true) {
    if (g_stop) {
      out_ << "tessera_launch: interrupted; stopping every process" << std::endl;
      StopAll();
      return 130;
    }
    bool trainers_running = false, any_running = false;
    for (auto& c : children_) {
      if (c.exited) continue;
      int status;
      pid_t r = ::waitpid(c.pid, &status, WNOHANG);
      if (r == c.pid) {
        c.exited = true;
        c.status = status;
        if (ExitCodeOf(status) != 0) {
          out_ << "tessera_launch: " << c.name << " (pid " << c.pid << ") " << Describe(status)
               << "; stopping the job. See " << log_dir_ << "/" << c.name << ".log" << std::endl;
          StopAll();
          return ExitCodeOf(status);
        }
        continue;
      }
      any_running = true;
      trainers_running |= c.trainer;
    }
    if (!any_running) break;
    if (!trainers_running) {
      if (trainers_done_at == absl::InfiniteFuture()) trainers_done_at = absl::Now();
      if (absl::Now() - trainers_done_at > options_.pserver_exit_grace) {
        out_ << "tessera_launch: pservers did not exit after the trainers finished; stopping them"
             << std::endl;
        StopAll();
        return 1;
      }
    }
    absl::SleepFor(absl::Milliseconds(50));
  }
  out_ << "tessera_launch: all processes finished; logs in " << log_dir_ << std::endl;
  return 0;
}

}  // namespace tessera
