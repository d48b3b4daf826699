#include "tests/bench/child_process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace tessera {
namespace bench {

using Clock = std::chrono::steady_clock;

void Die(const std::string& program, const std::string& message) {
  std::fprintf(stderr, "%s: %s\n", program.c_str(), message.c_str());
  std::exit(1);
}

Child StartChild(const std::string& program, const std::vector<std::string>& args) {
  char self[4096];
  ssize_t n = readlink("/proc/self/exe", self, sizeof(self) - 1);
  if (n <= 0) Die(program, "cannot read /proc/self/exe");
  self[n] = '\0';
  std::vector<char*> argv = {self};
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  // Close-on-exec: a later child must not inherit this one's stdin (it would never see the
  // end of input); dup2 onto 0 and 1 clears the flag for the child's own ends.
  int in[2], out[2];
  if (pipe2(in, O_CLOEXEC) != 0 || pipe2(out, O_CLOEXEC) != 0) Die(program, "pipe2 failed");
  pid_t pid = fork();
  if (pid < 0) Die(program, "fork failed");
  if (pid == 0) {
    dup2(in[0], 0);
    dup2(out[1], 1);
    close(in[1]);
    close(out[0]);
    execv(self, argv.data());
    _exit(127);
  }
  close(in[0]);
  close(out[1]);
  Child c;
  c.pid = pid;
  c.stdin_fd = in[1];
  const Clock::time_point deadline = Clock::now() + std::chrono::seconds(30);
  while (c.line.find('\n') == std::string::npos) {
    pollfd p{out[0], POLLIN, 0};
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0 || poll(&p, 1, static_cast<int>(left)) <= 0) {
      kill(pid, SIGKILL);
      waitpid(pid, nullptr, 0);
      Die(program, absl::StrCat("the server child ", self, " ", absl::StrJoin(args, " "),
                                " did not report in 30 s"));
    }
    char buf[64];
    ssize_t r = read(out[0], buf, sizeof(buf));
    if (r <= 0) {
      int status = 0;
      waitpid(pid, &status, 0);
      Die(program, absl::StrCat("the server child ", self, " ", absl::StrJoin(args, " "),
                                " exited before reporting (wait status ", status, ")"));
    }
    c.line.append(buf, static_cast<size_t>(r));
  }
  close(out[0]);
  c.line.resize(c.line.find('\n'));
  return c;
}

void StopChild(Child* c) {
  if (c->pid < 0) return;
  close(c->stdin_fd);
  const Clock::time_point deadline = Clock::now() + std::chrono::seconds(10);
  int status = 0;
  while (waitpid(c->pid, &status, WNOHANG) == 0) {
    if (Clock::now() > deadline) {
      kill(c->pid, SIGKILL);
      waitpid(c->pid, &status, 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  c->pid = -1;
  c->stdin_fd = -1;
}

Usage UsageOf(pid_t pid) {
  Usage u;
  if (pid == 0) {
    rusage r{};
    getrusage(RUSAGE_SELF, &r);
    u.cpu_seconds =
        r.ru_utime.tv_sec + r.ru_stime.tv_sec + 1e-6 * (r.ru_utime.tv_usec + r.ru_stime.tv_usec);
    u.minor_faults = static_cast<double>(r.ru_minflt);
    return u;
  }
  std::ifstream in(absl::StrCat("/proc/", pid, "/stat"));
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  size_t close_paren = stat.rfind(')');
  if (close_paren == std::string::npos) return u;
  std::vector<std::string> fields = absl::StrSplit(stat.substr(close_paren + 2), ' ');
  // Fields after the command: state(0) ... minflt(7) ... utime(11) stime(12).
  int64_t minflt = 0, utime = 0, stime = 0;
  if (fields.size() < 13 || !absl::SimpleAtoi(fields[7], &minflt) ||
      !absl::SimpleAtoi(fields[11], &utime) || !absl::SimpleAtoi(fields[12], &stime)) {
    return u;
  }
  u.cpu_seconds = static_cast<double>(utime + stime) / static_cast<double>(sysconf(_SC_CLK_TCK));
  u.minor_faults = static_cast<double>(minflt);
  return u;
}

}  // namespace bench
}  // namespace tessera
