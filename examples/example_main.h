// Command-line set-up shared by the example binaries: Abseil flags whose --help lists every flag
// of the binary (Abseil's default lists only flags defined in a file named like the binary, and
// the examples' mains are main.cc, so it printed "No flags matched").
#ifndef TESSERA_EXAMPLES_EXAMPLE_MAIN_H_
#define TESSERA_EXAMPLES_EXAMPLE_MAIN_H_

#include <cstdlib>
#include <iostream>

#include "absl/flags/internal/parse.h"
#include "absl/flags/internal/usage.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/flags/usage_config.h"
#include "absl/strings/match.h"
#include "absl/strings/string_view.h"

namespace tessera {
namespace examples {

// Sets the usage line, makes --help/--helpshort list the flags defined under examples/, then
// parses the command line: exits 1 on a bad flag, and 0 after printing --help to stdout (as the
// daemons do; Abseil's own handling exits 1, which scripts read as a failure).
inline void ParseExampleFlags(int argc, char** argv, absl::string_view usage) {
  absl::SetProgramUsageMessage(usage);
  absl::FlagsUsageConfig config;
  auto ours = [](absl::string_view file) { return absl::StrContains(file, "examples/"); };
  config.contains_help_flags = ours;
  config.contains_helpshort_flags = ours;
  absl::SetFlagsUsageConfig(config);
  namespace fi = absl::flags_internal;
  fi::ParseCommandLineImpl(argc, argv, fi::ArgvListAction::kRemoveParsedArgs,
                           fi::UsageFlagsAction::kIgnoreUsage,
                           fi::OnUndefinedFlag::kAbortIfUndefined);
  if (fi::HandleUsageFlags(std::cout, absl::ProgramUsageMessage()) >= 0) std::exit(0);
}

}  // namespace examples
}  // namespace tessera

#endif  // TESSERA_EXAMPLES_EXAMPLE_MAIN_H_
