// Fuzz target: the CSV, libsvm and MultiSlot line parsers (common/data/formats.h).
//
// Input: byte 0 picks the format (bits 0-1: criteo with float dense values, csv, libsvm,
// multislot) and the schema (bits 2-3: dense count 0-3; bit 4: one categorical slot; bit 5: one
// multi-hot slot); the rest is lines, the first of which is the CSV header.
// Invariants (a violation aborts, which the fuzzer reports as a crash):
//   - a line parses or fails with INVALID_ARGUMENT and a one-line message; a header likewise;
//   - a parsed line has the schema's counts and finite values;
//   - parsing is a function of the line: the same line parsed again gives the same example.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "absl/strings/string_view.h"
#include "common/data/formats.h"

namespace {

void Require(bool ok, const char* what) {
  if (ok) return;
  std::fprintf(stderr, "formats_fuzzer: invariant violated: %s\n", what);
  std::abort();
}

void RequireOneLineError(const absl::Status& s, const char* what) {
  Require(s.code() == absl::StatusCode::kInvalidArgument, what);
  Require(!s.message().empty() && s.message().find('\n') == absl::string_view::npos, what);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tessera::data;  // NOLINT: a fuzz entry point outside the namespace
  if (size == 0 || size > (1 << 14)) return 0;
  DataSchema schema;
  const DataFormat formats[] = {DataFormat::kCriteo, DataFormat::kCsv, DataFormat::kLibsvm,
                                DataFormat::kMultiSlot};
  schema.format = formats[data[0] & 3];
  schema.float_dense = true;
  schema.num_dense = (data[0] >> 2) & 3;
  schema.num_sparse = (data[0] >> 4) & 1;
  schema.num_multi = (data[0] >> 5) & 1;
  if (schema.format == DataFormat::kLibsvm) schema.num_sparse = 0;
  auto parser = NewLineParser(schema);
  Require(parser.ok(), "the fuzzer's schemas are valid");
  absl::string_view text(reinterpret_cast<const char*>(data) + 1, size - 1);
  bool header = (*parser)->has_header();
  bool header_ok = false;
  Example a, b;
  for (size_t pos = 0; pos <= text.size();) {
    size_t nl = text.find('\n', pos);
    if (nl == absl::string_view::npos) nl = text.size();
    const absl::string_view line = text.substr(pos, nl - pos);
    pos = nl + 1;
    if (header) {
      header = false;
      absl::Status s = (*parser)->Header(line);
      if (!s.ok()) {
        RequireOneLineError(s, "a bad header is one INVALID_ARGUMENT line");
        return 0;
      }
      header_ok = true;
      continue;
    }
    absl::Status s = (*parser)->Parse(line, &a);
    if (!s.ok()) {
      RequireOneLineError(s, "a bad line is one INVALID_ARGUMENT line");
      continue;
    }
    Require(a.dense.size() == static_cast<size_t>(schema.num_dense), "dense count");
    Require(a.sparse.size() == static_cast<size_t>(schema.num_sparse), "slot count");
    Require(a.multi.size() == static_cast<size_t>(schema.num_multi), "multi-hot count");
    Require(std::isfinite(a.label), "label finite");
    for (float v : a.dense) Require(std::isfinite(v), "dense values finite");
    Require((*parser)->Parse(line, &b).ok() && a == b, "parsing is a function of the line");
  }
  (void)header_ok;
  return 0;
}
