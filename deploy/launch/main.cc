// tessera_launch: runs a local Tessera cluster.
//   tessera_launch --pservers=2 --trainers=2 --example=ctr [--log_dir=DIR] [daemon flags...]
// Every flag it does not know is passed to every daemon (e.g. --epochs=2 --sync_mode=false).
#include <signal.h>
#include <unistd.h>

#include <climits>
#include <cstdlib>
#include <iostream>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "deploy/launch/launcher.h"

namespace {

std::string SelfDir() {
  char buf[PATH_MAX];
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return ".";
  std::string path(buf, static_cast<size_t>(n));
  return path.substr(0, path.rfind('/'));
}

bool TakeInt(const std::string& arg, const std::string& name, int* out, int* exit_code) {
  std::string prefix = "--" + name + "=";
  if (!absl::StartsWith(arg, prefix)) return false;
  if (!absl::SimpleAtoi(arg.substr(prefix.size()), out) || *out < 1) {
    std::cerr << "tessera_launch: " << arg << ": must be a positive integer" << std::endl;
    *exit_code = 2;
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  tessera::LaunchOptions o;
  // Binaries: next to this one in the Bazel output tree (deploy/launch/../../{pserver,trainer}).
  std::string root = SelfDir() + "/../..";
  o.pserver_bin = root + "/pserver/tessera_pserver";
  o.trainer_bin = root + "/trainer/tessera_trainer";
  int exit_code = 0;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--help" || a == "-h") {
      std::cout << "Usage: tessera_launch --pservers=N --trainers=M [--log_dir=DIR] "
                   "[--host=127.0.0.1] [--pserver_bin=P] [--trainer_bin=T] [daemon flags...]\n";
      return 0;
    }
    if (TakeInt(a, "pservers", &o.pservers, &exit_code)) continue;
    if (TakeInt(a, "trainers", &o.trainers, &exit_code)) continue;
    if (absl::StartsWith(a, "--log_dir=")) {
      o.log_dir = a.substr(10);
    } else if (absl::StartsWith(a, "--host=")) {
      o.host = a.substr(7);
    } else if (absl::StartsWith(a, "--pserver_bin=")) {
      o.pserver_bin = a.substr(14);
    } else if (absl::StartsWith(a, "--trainer_bin=")) {
      o.trainer_bin = a.substr(14);
    } else {
      o.extra_args.push_back(a);
    }
  }
  if (exit_code != 0) return exit_code;
  struct sigaction sa {};
  sa.sa_handler = [](int) { tessera::Launcher::RequestStop(); };
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  tessera::Launcher launcher(o, std::cout);
  auto code = launcher.Run();
  if (!code.ok()) {
    std::cerr << "tessera_launch: " << code.status().message() << std::endl;
    return 2;
  }
  return *code;
}
