// Fuzz target: the CSV, libsvm and MultiSlot line parsers (common/data/formats.h).
//
// Input: byte 0 picks the format (bits 0-1: criteo with float dense values, csv, libsvm,
// multislot) and the schema (bits 2-3: dense count 0-3; bit 4: one categorical slot; bit 5: one
// multi-hot slot); the rest is lines, the first of which is the CSV header.
// Invariants (a violation aborts, which the fuzzer reports as a crash):
//   - a line parses or fails with INVALID_ARGUMENT and a one-line message; a header likewise;
//   - a parsed line has the schema's counts and finite values;
//   - parsing is a function of the line: the same line parsed again gives the same example;
//   - a parsed libsvm or multislot line holds the values of a slow reference parse of its
//     words (absl::SimpleAtod / SimpleAtoi, which the fast std::from_chars paths must match).
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "common/data/formats.h"

namespace {

void Require(bool ok, const char* what) {
  if (ok) return;
  std::fprintf(stderr, "formats_fuzzer: invariant violated: %s\n", what);
  std::abort();
}

// The reference for a number: absl's parse (what the parsers accepted before their fast paths).
float RefFloat(absl::string_view text) {
  double v = 0;
  Require(absl::SimpleAtod(text, &v), "an accepted number is absl::SimpleAtod's");
  return static_cast<float>(v);
}
int64_t RefInt(absl::string_view text) {
  int64_t v = 0;
  Require(absl::SimpleAtoi(text, &v), "an accepted integer is absl::SimpleAtoi's");
  return v;
}

// Checks a parsed libsvm / multislot line against its words parsed the slow way.
void CheckAgainstReference(tessera::data::DataFormat format, absl::string_view line,
                           const tessera::data::Example& e) {
  using tessera::data::DataFormat;
  std::vector<absl::string_view> w =
      absl::StrSplit(line, absl::ByAnyChar(" \t"), absl::SkipEmpty());
  if (format == DataFormat::kLibsvm) {
    float label = RefFloat(w[0]);
    if (label == -1) label = 0;
    Require(e.label == label, "libsvm label is the reference's");
    std::vector<float> dense(e.dense.size(), 0.0f);
    std::vector<int64_t> ids;
    for (size_t i = 1; i < w.size(); ++i) {
      const size_t colon = w[i].find(':');
      const int64_t index = RefInt(w[i].substr(0, colon));
      const float value = RefFloat(w[i].substr(colon + 1));
      if (index < static_cast<int64_t>(dense.size())) {
        dense[static_cast<size_t>(index)] = value;
      } else {
        ids.push_back(index);
      }
    }
    Require(e.dense == dense, "libsvm dense values are the reference's");
    Require(e.multi.empty() ? ids.empty() : e.multi[0] == ids, "libsvm ids are the reference's");
  } else if (format == DataFormat::kMultiSlot) {
    size_t pos = 1;  // w[0] is the label's count
    Require(e.label == RefFloat(w[pos++]), "multislot label is the reference's");
    if (!e.dense.empty()) ++pos;
    for (float v : e.dense) Require(v == RefFloat(w[pos++]), "multislot dense is the reference's");
    for (int64_t id : e.sparse) {
      ++pos;
      Require(id == RefInt(w[pos++]), "multislot id is the reference's");
    }
    for (const auto& ids : e.multi) {
      Require(RefInt(w[pos++]) == static_cast<int64_t>(ids.size()), "multislot count");
      for (int64_t id : ids) Require(id == RefInt(w[pos++]), "multislot id is the reference's");
    }
    Require(pos == w.size(), "multislot words all used");
  }
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
    CheckAgainstReference(schema.format, line, a);
  }
  return 0;
}
