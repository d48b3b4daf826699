// Benchmarks that run their servers in child processes: this binary started again with other
// flags, its first line of output read back (e.g. its ports), and its CPU time read from /proc.
// A child must be started before the parent holds any gRPC state (gRPC does not survive fork).
#ifndef TESSERA_TESTS_BENCH_CHILD_PROCESS_H_
#define TESSERA_TESTS_BENCH_CHILD_PROCESS_H_

#include <sys/types.h>

#include <string>
#include <vector>

namespace tessera {
namespace bench {

// Prints "<program>: <message>" to stderr and exits 1.
[[noreturn]] void Die(const std::string& program, const std::string& message);

struct Child {
  pid_t pid = -1;
  int stdin_fd = -1;  // the child's stdin: closing it tells the child to exit
  std::string line;   // the first line the child wrote to its stdout (without the newline)
};

// Starts /proc/self/exe with `args`; waits up to 30 s for its first line of output. Dies
// (naming `program`) if it cannot start or exits first.
Child StartChild(const std::string& program, const std::vector<std::string>& args);
// Closes the child's stdin and waits up to 10 s for it to exit, then kills it; a second call
// does nothing.
void StopChild(Child* c);

struct Usage {
  double cpu_seconds = 0;  // user + system
  double minor_faults = 0;
};
// CPU time and minor page faults of `pid` (from /proc), or of this process when pid == 0.
Usage UsageOf(pid_t pid);

}  // namespace bench
}  // namespace tessera

#endif  // TESSERA_TESTS_BENCH_CHILD_PROCESS_H_
