// print_settings: the daemons' configuration table, for scripts and tests that must agree with
// it (deploy/check_manifests.py checks the Kubernetes, Slurm and MPI files against it).
//
//   print_settings                 one line per setting: --flag ENV_NAME [ENV_NAME...]
//   print_settings --check [--default_role=R] [daemon flags...]
//                                  parses the flags and the environment exactly as a daemon
//                                  does and prints "ok" and the resolved cluster shape, or the
//                                  daemon's error (exit 2)
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_join.h"
#include "common/config/cluster_config.h"
#include "common/config/daemon_flags.h"

int main(int argc, char** argv) {
  if (argc == 1) {
    for (const auto& s : tessera::AllSettings()) {
      std::cout << "--" << s.flag << " " << absl::StrJoin(s.env, " ") << "\n";
    }
    return 0;
  }
  if (std::string(argv[1]) != "--check") {
    std::cerr << "usage: print_settings [--check [--default_role=R] [daemon flags...]]\n";
    return 2;
  }
  std::string role_default;
  std::vector<char*> args = {argv[0]};
  for (int i = 2; i < argc; ++i) {
    if (absl::StartsWith(argv[i], "--default_role=")) {
      role_default = std::string(argv[i]).substr(15);
    } else {
      args.push_back(argv[i]);
    }
  }
  const tessera::EnvLookup env = tessera::ProcessEnvironment();
  auto config =
      tessera::ParseDaemonArgs(static_cast<int>(args.size()), args.data(), env, role_default);
  if (!config.ok()) {
    std::cerr << "print_settings: " << config.status().message() << std::endl;
    return 2;
  }
  std::cout << "ok role=" << config->role << " mode=" << config->mode
            << " pservers=" << absl::StrJoin(config->pservers, ",")
            << " trainers=" << config->trainers << " trainer_id=" << config->trainer_id
            << " current_endpoint=" << config->current_endpoint
            << " trainer_endpoints=" << absl::StrJoin(config->trainer_endpoints, ",")
            << " job_id=" << config->job_id << " example=" << config->example << std::endl;
  return 0;
}
