// tessera_pserver: a parameter server daemon. Configuration comes from flags or the
// environment (TESSERA_* / PADDLE_*), see common/config/cluster_config.h; --help lists them.
#include <cstdlib>
#include <iostream>

#include "common/config/daemon_flags.h"
#include "common/malloc_tuning.h"
#include "pserver/pserver_daemon.h"

int main(int argc, char** argv) {
  tessera::TuneMallocForLargeBuffers();
  auto env = [](const std::string& name) -> std::optional<std::string> {
    const char* v = std::getenv(name.c_str());
    if (v == nullptr) return std::nullopt;
    return std::string(v);
  };
  auto config = tessera::ParseDaemonArgs(argc, argv, env, "pserver");
  if (!config.ok()) {
    if (config.status().code() == absl::StatusCode::kNotFound) {  // --help
      std::cout << config.status().message();
      return 0;
    }
    std::cerr << "tessera_pserver: " << config.status().message() << std::endl;
    return 2;
  }
  if (config->role != "pserver") {
    std::cerr << "tessera_pserver: --role=" << config->role << " (this binary is the pserver)"
              << std::endl;
    return 2;
  }
  absl::Status s = tessera::RunPserver(*config, std::cerr);
  if (!s.ok()) {
    std::cerr << "tessera_pserver: " << s.message() << std::endl;
    return 1;
  }
  return 0;
}
