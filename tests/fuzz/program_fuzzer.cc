// Fuzz target: program files, the way the daemons read them (--program / --startup_program):
// parse, resolve every op's kernel, transpile for a 2-pserver / 2-trainer job (and for
// collective mode), and print the result back as text.
//
// Input: byte 0 holds options (bit 0: binary ProgramDesc instead of text; bit 1: async mode);
// the rest is the main program, optionally followed by kStartupSeparator and the startup
// program (without one, the main program is its own startup).
// Invariants (a violation aborts, which the fuzzer reports as a crash):
//   - a text parse error is INVALID_ARGUMENT with one line naming the file, line and column;
//   - whatever parses prints to text that parses back (programs travel as text files);
//   - Prepare and the transpilers either succeed or return a one-line error; their programs
//     print to text that parses back.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/string_view.h"
#include "common/framework/executor.h"
#include "common/ops/ops.h"
#include "common/framework/program_io.h"
#include "google/protobuf/stubs/logging.h"
#include "transpiler/distribute_transpiler.h"

namespace tessera {
namespace {

constexpr absl::string_view kStartupSeparator = "\n#startup\n";
constexpr absl::string_view kSource = "fuzz.pbtxt";

void Require(bool ok, const char* what) {
  if (ok) return;
  std::fprintf(stderr, "program_fuzzer: invariant violated: %s\n", what);
  std::abort();
}

void RequireOneLine(const absl::Status& s) {
  Require(!s.ok() && !s.message().empty(), "error has a message");
  Require(s.message().find('\n') == absl::string_view::npos, "error message is one line");
}

void RequireReparses(const ProgramDesc& program) {
  auto back = ParseProgramText(ProgramToText(program), "printed.pbtxt");
  if (!back.ok() && program.blocks_size() > 0) {
    std::fprintf(stderr, "%s\n", std::string(back.status().message()).c_str());
  }
  Require(back.ok() || program.blocks_size() == 0, "printed program parses back");
}

// Parses one program; false (after checking the error) when it does not parse.
bool Parse(absl::string_view bytes, bool binary, ProgramDesc* out) {
  if (binary) {
    if (!out->ParseFromArray(bytes.data(), static_cast<int>(bytes.size()))) return false;
    out->DiscardUnknownFields();  // the text form has no syntax for them
    absl::Status names = CheckProgramStrings(*out, kSource);  // what ParseProgramText checks
    if (!names.ok()) {
      RequireOneLine(names);
      return false;
    }
    return true;
  }
  auto parsed = ParseProgramText(bytes, kSource);
  if (!parsed.ok()) {
    RequireOneLine(parsed.status());
    Require(parsed.status().code() == absl::StatusCode::kInvalidArgument,
            "parse error is INVALID_ARGUMENT");
    Require(absl::StartsWith(parsed.status().message(), absl::StrCat(kSource, ":")),
            "parse error names the file");
    return false;
  }
  *out = *std::move(parsed);
  return true;
}

void PrepareAll(const Executor& executor, const ProgramDesc& program) {
  for (int b = 0; b < program.blocks_size(); ++b) {
    auto prepared = executor.Prepare(program, b);
    if (!prepared.ok()) RequireOneLine(prepared.status());
  }
}

}  // namespace
}  // namespace tessera

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tessera;  // NOLINT: a fuzz entry point outside the namespace
  static const std::unique_ptr<OpRegistry> registry = NewStandardOpRegistry();
  // Protobuf logs every string field with invalid UTF-8 it refuses; the fuzzer makes many.
  static const bool quiet = (google::protobuf::SetLogHandler(nullptr), true);
  (void)quiet;
  if (size == 0 || size > (1 << 16)) return 0;
  const bool binary = (data[0] & 1) != 0;
  const bool async = (data[0] & 2) != 0;
  absl::string_view input(reinterpret_cast<const char*>(data) + 1, size - 1);
  absl::string_view main_bytes = input, startup_bytes = input;
  size_t sep = input.find(kStartupSeparator);
  if (sep != absl::string_view::npos) {
    main_bytes = input.substr(0, sep);
    startup_bytes = input.substr(sep + kStartupSeparator.size());
  }
  ProgramDesc main, startup;
  if (!Parse(main_bytes, binary, &main) || !Parse(startup_bytes, binary, &startup)) return 0;
  RequireReparses(main);

  Executor executor(registry.get());
  PrepareAll(executor, main);
  PrepareAll(executor, startup);

  TranspilerConfig config;
  config.pservers = {"127.0.0.1:6170", "127.0.0.1:6171"};
  config.trainers = 2;
  config.trainer_id = 1;
  config.sync_mode = !async;
  config.min_block_size = 4;  // slice small parameters too
  auto t = DistributeTranspiler::Transpile(main, startup, config);
  if (!t.ok()) {
    RequireOneLine(t.status());
  } else {
    RequireReparses(t->trainer_program());
    RequireReparses(t->trainer_startup_program());
    PrepareAll(executor, t->trainer_startup_program());
    for (const auto& ep : config.pservers) {
      auto p = t->GetPserverProgram(ep);
      Require(p.ok(), "every pserver has a program");
      RequireReparses(*p);
      auto s = t->GetPserverStartupProgram(ep);
      Require(s.ok(), "every pserver has a startup program");
      RequireReparses(*s);
    }
  }
  auto collective = TranspileCollective(main, startup);
  if (!collective.ok()) {
    RequireOneLine(collective.status());
  } else {
    RequireReparses(collective->trainer);
  }
  return 0;
}
