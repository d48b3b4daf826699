#include "tests/cluster_util.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <set>
#include <sstream>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "deploy/launch/launcher.h"

namespace tessera {

ProcessGroup::~ProcessGroup() {
  for (pid_t pid : pids_) {
    if (reaped_.count(pid) > 0) continue;
    ::kill(pid, SIGKILL);
    int status;
    ::waitpid(pid, &status, 0);
  }
}

absl::StatusOr<pid_t> ProcessGroup::Start(const std::vector<std::string>& argv,
                                          const std::string& log_path) {
  int fd = ::open(log_path.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
  if (fd < 0) return absl::UnavailableError(absl::StrCat("cannot open ", log_path));
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = ::fork();
  if (pid < 0) {
    ::close(fd);
    return absl::UnavailableError("fork failed");
  }
  if (pid == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    ::dup2(fd, STDOUT_FILENO);
    ::dup2(fd, STDERR_FILENO);
    ::execv(args[0], args.data());
    std::fprintf(stderr, "cannot exec %s: %s\n", args[0], std::strerror(errno));
    _exit(127);
  }
  ::close(fd);
  pids_.push_back(pid);
  return pid;
}

absl::StatusOr<int> ProcessGroup::Wait(pid_t pid, absl::Duration timeout) {
  auto it = reaped_.find(pid);
  if (it != reaped_.end()) return it->second;
  absl::Time deadline = absl::Now() + timeout;
  while (true) {
    int status;
    pid_t r = ::waitpid(pid, &status, WNOHANG);
    if (r == pid) {
      reaped_[pid] = status;
      return status;
    }
    if (r < 0) return absl::NotFoundError(absl::StrCat("pid ", pid, " is not a child"));
    if (absl::Now() > deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("pid ", pid, " still running after ", absl::FormatDuration(timeout)));
    }
    absl::SleepFor(absl::Milliseconds(20));
  }
}

void ProcessGroup::Kill(pid_t pid, int signal) {
  if (reaped_.count(pid) == 0) ::kill(pid, signal);
}

bool ProcessGroup::Running(pid_t pid) {
  if (reaped_.count(pid) > 0) return false;
  int status;
  pid_t r = ::waitpid(pid, &status, WNOHANG);
  if (r == pid) {
    reaped_[pid] = status;
    return false;
  }
  return r == 0;
}

std::string RunfilePath(const std::string& relative) {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  std::string base = srcdir != nullptr ? srcdir : ".";
  return absl::StrCat(base, "/tessera/", relative);
}

std::string MakeTempDir(const std::string& prefix) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  std::string tmpl = absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/", prefix, "_XXXXXX");
  std::vector<char> buf(tmpl.begin(), tmpl.end());
  buf.push_back('\0');
  char* dir = ::mkdtemp(buf.data());
  return dir == nullptr ? std::string("/tmp") : std::string(dir);
}

std::string ReadFileOrEmpty(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

absl::StatusOr<std::vector<std::string>> FreeEndpoints(int n) {
  std::vector<std::string> out;
  std::set<int> seen;
  for (int tries = 0; static_cast<int>(out.size()) < n && tries < 100; ++tries) {
    auto port = PickFreePort("127.0.0.1");
    if (!port.ok()) return port.status();
    if (seen.insert(*port).second) out.push_back(absl::StrCat("127.0.0.1:", *port));
  }
  if (static_cast<int>(out.size()) < n) return absl::UnavailableError("no free ports");
  return out;
}

int64_t SumAfter(const std::string& text, const std::string& key) {
  int64_t total = 0;
  for (size_t pos = text.find(key); pos != std::string::npos; pos = text.find(key, pos + 1)) {
    total += std::strtoll(text.c_str() + pos + key.size(), nullptr, 10);
  }
  return total;
}

absl::StatusOr<int64_t> ResidentKiB(pid_t pid) {
  const std::string path = absl::StrCat("/proc/", pid, "/status");
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("VmRSS:", 0) == 0) return std::strtoll(line.c_str() + 6, nullptr, 10);
  }
  return absl::NotFoundError(absl::StrCat("no VmRSS in ", path, " (process gone?)"));
}

std::string HttpGet(int port, const std::string& path) {
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return "";
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  ::inet_pton(AF_INET, "127.0.0.1", &addr.sin_addr);
  timeval tv{5, 0};
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    ::close(fd);
    return "";
  }
  std::string req = absl::StrCat("GET ", path, " HTTP/1.0\r\nHost: localhost\r\n\r\n");
  (void)!::write(fd, req.data(), req.size());
  std::string out;
  char buf[4096];
  ssize_t n;
  while ((n = ::read(fd, buf, sizeof(buf))) > 0) out.append(buf, static_cast<size_t>(n));
  ::close(fd);
  return out;
}

double Sample(const std::string& text, const std::string& metric) {
  for (absl::string_view line : absl::StrSplit(text, '\n')) {
    if (!absl::StartsWith(line, metric)) continue;
    char next = line.size() > metric.size() ? line[metric.size()] : '\0';
    if (next != '{' && next != ' ') continue;
    double v;
    if (absl::SimpleAtod(line.substr(line.rfind(' ') + 1), &v)) return v;
  }
  return -1;
}

}  // namespace tessera
