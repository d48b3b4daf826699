// Fuzz target: Criteo-format data files (common/data/criteo.h), line by line and as a file.
//
// Input: byte 0 picks the field counts (high bit set: Criteo's 13 dense + 26 categorical;
// otherwise 0-3 of each from the low bits); the rest is the file's contents.
// Invariants (a violation aborts, which the fuzzer reports as a crash):
//   - a bad line gives INVALID_ARGUMENT with a one-line message ("field ..." / "expected ...");
//   - a parsed line has the configured field counts, finite non-negative dense values, and ids
//     that FormatId/ParseId round-trip;
//   - a parsed line's values are those of a slow reference parse (absl::SimpleAtoi and log1p
//     for dense counts, digit by digit for hex ids);
//   - reading the file gives exactly the examples of its non-empty lines, or fails at the first
//     bad line with "<path>:<line>: <the line's error>";
//   - a good file read as three byte ranges (CriteoReader::Restrict, cut anywhere) gives the same
//     examples, in order.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "common/data/criteo.h"

namespace tessera {
namespace data {
namespace {

void Require(bool ok, const char* what) {
  if (ok) return;
  std::fprintf(stderr, "criteo_fuzzer: invariant violated: %s\n", what);
  std::abort();
}

// A scratch file for this process, removed at exit.
const std::string& ScratchPath() {
  static const std::string* path = [] {
    const char* dir = std::getenv("TEST_TMPDIR");
    if (dir == nullptr) dir = std::getenv("TMPDIR");
    if (dir == nullptr) dir = "/tmp";
    std::string templ = absl::StrCat(dir, "/criteo_fuzzer.XXXXXX");
    int fd = ::mkstemp(templ.data());
    Require(fd >= 0, "scratch file can be created");
    ::close(fd);
    auto* p = new std::string(templ);
    std::atexit([] { ::unlink(ScratchPath().c_str()); });
    return p;
  }();
  return *path;
}

// The slow reference for a parsed line's values.
void CheckAgainstReference(absl::string_view line, int num_dense, const Example& ex) {
  std::vector<absl::string_view> fields = absl::StrSplit(line, '\t');
  for (int f = 0; f < num_dense; ++f) {
    const absl::string_view text = fields[1 + f];
    int64_t count = 0;
    if (!text.empty()) Require(absl::SimpleAtoi(text, &count), "an accepted count is SimpleAtoi's");
    const float want =
        static_cast<float>(std::log1p(static_cast<double>(std::max<int64_t>(count, 0))));
    Require(ex.dense[f] == want, "dense value is log1p(max(count, 0))");
  }
  for (size_t s = 0; s < ex.sparse.size(); ++s) {
    const absl::string_view text = fields[1 + num_dense + s];
    uint64_t id = 0;
    for (char c : text) {
      const char* digits = "0123456789abcdef";
      const char lower = static_cast<char>(c >= 'A' && c <= 'F' ? c - 'A' + 'a' : c);
      const char* at = std::strchr(digits, lower);
      Require(lower != 0 && at != nullptr, "an accepted id is hex digits");
      id = id << 4 | static_cast<uint64_t>(at - digits);
    }
    Require(static_cast<uint64_t>(ex.sparse[s]) == id, "id is the hex value's bits");
  }
}

void WriteScratch(absl::string_view contents) {
  FILE* f = std::fopen(ScratchPath().c_str(), "wb");
  Require(f != nullptr, "scratch file opens");
  Require(std::fwrite(contents.data(), 1, contents.size(), f) == contents.size(),
          "scratch file is written");
  Require(std::fclose(f) == 0, "scratch file closes");
}

}  // namespace
}  // namespace data
}  // namespace tessera

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace tessera::data;  // NOLINT: a fuzz entry point outside the namespace
  if (size == 0 || size > (1 << 16)) return 0;
  int num_dense = kCriteoNumDense, num_sparse = kCriteoNumSparse;
  if ((data[0] & 0x80) == 0) {
    num_dense = data[0] & 3;
    num_sparse = (data[0] >> 2) & 3;
  }
  absl::string_view contents(reinterpret_cast<const char*>(data) + 1, size - 1);
  if (absl::StartsWith(contents, "\x1f\x8b")) {
    // gzip magic: the reader decompresses (what comes out is another input); it reads the
    // examples or fails with one line, never crashing.
    WriteScratch(contents);
    auto read = ReadCriteoFile(ScratchPath(), num_dense, num_sparse);
    Require(read.ok() || (!read.status().message().empty() &&
                          read.status().message().find('\n') == absl::string_view::npos),
            "a gzip file reads or fails with one line");
    return 0;
  }

  // Line by line, the way CriteoReader splits a file.
  std::vector<Example> want;
  int64_t bad_line = 0;
  std::string bad_message;
  int64_t line_number = 0;
  for (size_t pos = 0; pos < contents.size();) {
    size_t nl = contents.find('\n', pos);
    size_t end = nl == absl::string_view::npos ? contents.size() : nl;
    absl::string_view line = contents.substr(pos, end - pos);
    pos = end + 1;
    ++line_number;
    if (line_number == 1 && absl::StartsWith(line, "\xEF\xBB\xBF")) {
      bad_line = 1;
      bad_message = "the file starts with a UTF-8 byte-order mark (EF BB BF); save it without one";
      break;
    }
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty()) continue;
    if (line.find('\r') != absl::string_view::npos) {
      bad_line = line_number;
      bad_message =
          "a CR (\\r) inside the line: CR-only line ends (classic Mac)? convert them to LF";
      break;
    }
    Example ex;
    absl::Status s = ParseCriteoLine(line, num_dense, num_sparse, &ex);
    if (!s.ok()) {
      Require(s.code() == absl::StatusCode::kInvalidArgument, "bad line is INVALID_ARGUMENT");
      Require(s.message().find('\n') == absl::string_view::npos, "line error is one line");
      Require(absl::StartsWith(s.message(), "field ") || absl::StartsWith(s.message(), "expected "),
              "line error names the field or the field count");
      bad_line = line_number;
      bad_message = std::string(s.message());
      break;
    }
    Require(ex.dense.size() == static_cast<size_t>(num_dense), "dense count");
    CheckAgainstReference(line, num_dense, ex);
    Require(ex.sparse.size() == static_cast<size_t>(num_sparse), "sparse count");
    Require(ex.label == 0 || ex.label == 1, "label is 0 or 1");
    for (float v : ex.dense) Require(std::isfinite(v) && v >= 0, "dense value finite, >= 0");
    for (int64_t id : ex.sparse) {
      auto back = ParseId(FormatId(id));
      Require(back.ok() && *back == id, "id round-trips through FormatId/ParseId");
    }
    want.push_back(std::move(ex));
  }

  // The whole file through the reader: the same examples, or the same error with file:line.
  WriteScratch(contents);
  auto read = ReadCriteoFile(ScratchPath(), num_dense, num_sparse);
  if (bad_line > 0) {
    Require(!read.ok(), "a file with a bad line fails");
    Require(read.status().code() == absl::StatusCode::kInvalidArgument,
            "bad file is INVALID_ARGUMENT");
    Require(
        read.status().message() == absl::StrCat(ScratchPath(), ":", bad_line, ": ", bad_message),
        "file error is <path>:<line>: <line error>");
  } else {
    Require(read.ok(), "a file of good lines reads");
    Require(read->num_dense == num_dense && read->num_sparse == num_sparse, "file field counts");
    Require(read->examples == want, "file examples are the lines' examples");
    // Three byte ranges, cut where the input's second byte says, read in order.
    const int64_t n = static_cast<int64_t>(contents.size());
    const int64_t a = size > 2 ? data[1] % (n + 1) : 0;
    const int64_t b = size > 3 ? a + data[2] % (n - a + 1) : n;
    std::vector<Example> ranged;
    for (const auto& [begin, end] : {std::make_pair(int64_t{0}, a), std::make_pair(a, b),
                                     std::make_pair(b, int64_t{-1})}) {
      auto reader = CriteoReader::Open(ScratchPath(), num_dense, num_sparse);
      Require(reader.ok() && (*reader)->Restrict(begin, end).ok(), "a range opens");
      Example ex;
      while (true) {
        absl::StatusOr<bool> more = (*reader)->Next(&ex);
        Require(more.ok(), "a range of a good file reads");
        if (!*more) break;
        ranged.push_back(ex);
      }
    }
    Require(ranged == want, "three byte ranges read the file's examples once, in order");
  }
  return 0;
}
