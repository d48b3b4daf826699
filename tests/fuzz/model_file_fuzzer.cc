// Fuzz target: model files, the way every runner reads them (--model): parse the text, apply
// the flag overrides, and check the structure (ops, feeds, def-before-use, loss, dims,
// initializers, optimizer) — everything CompileModel checks before its dry run, which runs
// kernels on declared shapes and is left to the unit tests.
//
// Invariants (a violation aborts, which the fuzzer reports as a crash):
//   - a refusal is INVALID_ARGUMENT (or the parser's error) in one line;
//   - whatever parses prints to text that parses back to the same text.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "absl/strings/string_view.h"
#include "common/layers/model_file.h"
#include "common/ops/ops.h"
#include "google/protobuf/stubs/logging.h"

namespace tessera {
namespace {

void Require(bool ok, const char* what) {
  if (ok) return;
  std::fprintf(stderr, "model_file_fuzzer: invariant violated: %s\n", what);
  std::abort();
}

void RequireOneLine(const absl::Status& s) {
  Require(!s.ok() && !s.message().empty(), "error has a message");
  Require(s.message().find('\n') == absl::string_view::npos, "error message is one line");
}

const OpRegistry& Registry() {
  static const OpRegistry* registry = NewStandardOpRegistry().release();
  return *registry;
}

}  // namespace
}  // namespace tessera

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tessera;
  static const bool quiet = [] {
    google::protobuf::SetLogHandler(nullptr);  // parse errors are expected; keep the log clean
    return true;
  }();
  (void)quiet;
  const absl::string_view text(reinterpret_cast<const char*>(data), size);
  absl::StatusOr<ModelFile> model = ParseModelText(text, "fuzz.pbtxt");
  if (!model.ok()) {
    RequireOneLine(model.status());
    return 0;
  }
  const std::string printed = ModelToText(*model);
  absl::StatusOr<ModelFile> back = ParseModelText(printed, "printed.pbtxt");
  Require(back.ok(), "printed model parses back");
  Require(ModelToText(*back) == printed, "printed model reprints the same");
  for (bool distributed : {false, true}) {
    ModelOverrides o;
    o.distributed_tables = distributed;
    o.learning_rate = distributed ? 0.5f : 0.0f;
    absl::Status s = CheckModelStructure(ApplyOverrides(*model, o), Registry(), "fuzz.pbtxt");
    if (!s.ok()) {
      RequireOneLine(s);
      Require(s.code() == absl::StatusCode::kInvalidArgument, "refusal is INVALID_ARGUMENT");
    }
  }
  return 0;
}
