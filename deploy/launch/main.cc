// tessera_launch: starts and supervises a Tessera cluster (or this host's share of one).
//   tessera_launch --pservers=2 --trainers=2 --example=ctr [--log_dir=DIR] [daemon flags...]
//   tessera_launch --config=job.pbtxt      (a LaunchConfig text proto, see proto/launch.proto)
// --help lists the launcher's flags; every flag it does not know is passed to every daemon.
#include <signal.h>
#include <unistd.h>

#include <climits>
#include <iostream>

#include "deploy/launch/launch_flags.h"
#include "deploy/launch/launcher.h"

namespace {

std::string SelfDir() {
  char buf[PATH_MAX];
  ssize_t n = ::readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  if (n <= 0) return ".";
  std::string path(buf, static_cast<size_t>(n));
  return path.substr(0, path.rfind('/'));
}

// The daemon binary: in the Bazel output tree (deploy/launch/../../<package>/<name>), else next
// to tessera_launch (an installed bin/ directory, as in the container image).
std::string DefaultBinary(const std::string& package, const std::string& name) {
  std::string self = SelfDir();
  std::string in_tree = self + "/../../" + package + "/" + name;
  if (::access(in_tree.c_str(), X_OK) == 0) return in_tree;
  return self + "/" + name;
}

}  // namespace

int main(int argc, char** argv) {
  tessera::LaunchOptions options;
  options.pserver_bin = DefaultBinary("pserver", "tessera_pserver");
  options.trainer_bin = DefaultBinary("trainer", "tessera_trainer");
  absl::Status parsed =
      tessera::ParseLaunchArgs(std::vector<std::string>(argv + 1, argv + argc), &options);
  if (!parsed.ok()) {
    if (parsed.code() == absl::StatusCode::kNotFound) {  // --help
      std::cout << parsed.message();
      return 0;
    }
    std::cerr << "tessera_launch: " << parsed.message() << std::endl;
    return 2;
  }
  struct sigaction sa {};
  sa.sa_handler = [](int) { tessera::Launcher::RequestStop(); };
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGHUP, &sa, nullptr);
  tessera::Launcher launcher(options, std::cout);
  auto code = launcher.Run();
  if (!code.ok()) {
    std::cerr << "tessera_launch: " << code.status().message() << std::endl;
    return 2;
  }
  return *code;
}
