#include "common/config/daemon_flags.h"

#include <cstdlib>
#include <iostream>
#include <set>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/status.h"

namespace tessera {

namespace {
// A boolean setting (its default is true or false) may be given bare: --verbose, --noverbose.
bool IsBoolFlag(const std::string& flag) {
  for (const auto& s : AllSettings()) {
    if (s.flag == flag) return s.default_value == "true" || s.default_value == "false";
  }
  return false;
}
bool Known(const std::string& flag) {
  for (const auto& s : AllSettings()) {
    if (s.flag == flag) return true;
  }
  return false;
}
}  // namespace

std::string DaemonUsage(const std::string& program) {
  std::string out = absl::StrCat("Usage: ", program, " [--flag=value ...]\n");
  absl::StrAppend(&out,
                  "Each flag can also come from its environment variables (a flag wins over them, "
                  "TESSERA_* over PADDLE_*).\n");
  for (const auto& s : AllSettings()) {
    absl::StrAppend(&out, "  --", s.flag, "\n      ", s.help, " [default: ",
                    s.default_value.empty() ? "\"\"" : s.default_value, "]  (env: ",
                    absl::StrJoin(s.env, ", "), ")\n");
  }
  return out;
}

absl::StatusOr<ClusterConfig> ParseDaemonArgs(int argc, char** argv, const EnvLookup& env,
                                              const std::string& role_default) {
  ClusterConfig config;
  std::set<std::string> explicit_flags;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") return absl::NotFoundError(DaemonUsage(argv[0]));
    if (!absl::StartsWith(arg, "--")) {
      return absl::InvalidArgumentError(absl::StrCat("unexpected argument '", arg,
                                                     "' (flags look like --name=value)"));
    }
    std::string body = arg.substr(2);
    std::string name, value;
    auto eq = body.find('=');
    if (eq != std::string::npos) {
      name = body.substr(0, eq);
      value = body.substr(eq + 1);
    } else if (IsBoolFlag(body)) {
      name = body;
      value = "true";
    } else if (absl::StartsWith(body, "no") && IsBoolFlag(body.substr(2))) {
      name = body.substr(2);
      value = "false";
    } else {
      name = body;
      if (!Known(name)) return absl::InvalidArgumentError(absl::StrCat("unknown flag --", name));
      if (i + 1 >= argc) {
        return absl::InvalidArgumentError(absl::StrCat("flag --", name, " needs a value"));
      }
      value = argv[++i];
    }
    if (!Known(name)) return absl::InvalidArgumentError(absl::StrCat("unknown flag --", name));
    absl::Status s = SetFromString(name, value, &config);
    if (!s.ok()) return s;
    explicit_flags.insert(name);
  }
  absl::Status s = ApplyEnvironment(explicit_flags, env, &config);
  if (!s.ok()) return s;
  if (config.role.empty()) config.role = role_default;
  s = Validate(config);
  if (!s.ok()) return s;
  return config;
}

int DaemonMain(int argc, char** argv, const std::string& program, const std::string& role,
               const DaemonRun& run) {
  const EnvLookup env = ProcessEnvironment();
  auto config = ParseDaemonArgs(argc, argv, env, role);
  if (!config.ok()) {
    if (config.status().code() == absl::StatusCode::kNotFound) {  // --help
      std::cout << config.status().message();
      return 0;
    }
    std::cerr << program << ": " << config.status().message() << std::endl;
    return 2;
  }
  if (config->role != role) {
    std::cerr << program << ": --role=" << config->role << " (this binary is the " << role << ")"
              << std::endl;
    return 2;
  }
  DaemonPhase phase;
  absl::Status s = run(*config, std::cerr, &phase);
  if (!s.ok()) {
    std::cerr << program << ": " << s.message() << std::endl;
    const std::string detail = ErrorDetail(s);
    if (config->verbose && !detail.empty()) {
      std::cerr << program << ": in full: " << detail << std::endl;
    }
    return phase.started() ? 1 : 2;
  }
  return 0;
}

}  // namespace tessera
