#include "common/data/criteo.h"

#include "common/data/idx.h"

#include <dirent.h>
#include <fcntl.h>
#include <glob.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <utility>
#include <vector>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/data/text_fields.h"
#include "common/base/status.h"

namespace tessera {
namespace data {
namespace {

constexpr char kHexDigits[] = "0123456789abcdef";
constexpr size_t kWriteBufferBytes = 1 << 20;
constexpr unsigned kReadBufferBytes = 1 << 18;
// log1p(2^62): larger dense values stand for counts that do not fit an int64.
constexpr float kMaxDense = 42.97f;

using text_fields::Quote;

// "label", "I3", "C12", "M1" for a 0-based field index.
std::string FieldName(int field, int num_dense, int num_sparse) {
  if (field == 0) return "label";
  if (field <= num_dense) return absl::StrCat("I", field);
  if (field <= num_dense + num_sparse) return absl::StrCat("C", field - num_dense);
  return absl::StrCat("M", field - num_dense - num_sparse);
}

absl::Status FieldError(int field, int num_dense, int num_sparse, absl::string_view what,
                        absl::string_view text) {
  return absl::InvalidArgumentError(absl::StrCat("field ", field + 1, " (",
                                                 FieldName(field, num_dense, num_sparse),
                                                 "): ", what, " ", Quote(text)));
}

// The value of each hex digit, 0xff for any other byte.
struct HexTable {
  unsigned char value[256];
  constexpr HexTable() : value() {
    for (int c = 0; c < 256; ++c) {
      value[c] = c >= '0' && c <= '9'   ? static_cast<unsigned char>(c - '0')
                 : c >= 'a' && c <= 'f' ? static_cast<unsigned char>(c - 'a' + 10)
                 : c >= 'A' && c <= 'F' ? static_cast<unsigned char>(c - 'A' + 10)
                                        : 0xff;
    }
  }
};
constexpr HexTable kHex;

bool ParseHex(absl::string_view text, uint64_t* out) {
  if (text.empty() || text.size() > 16) return false;
  uint64_t v = 0;
  unsigned bad = 0;  // any digit's 0xff marks the text invalid; no branch per digit
  for (char c : text) {
    const unsigned d = kHex.value[static_cast<unsigned char>(c)];
    bad |= d;
    v = (v << 4) | (d & 0xf);
  }
  if (bad > 0xf) return false;
  *out = v;
  return true;
}

// log1p of the small counts most dense fields hold, computed once with DenseFromCount's formula.
constexpr int64_t kDenseTableSize = 1 << 12;
const float* DenseTable() {
  static const float* table = [] {
    float* t = new float[kDenseTableSize];
    for (int64_t c = 0; c < kDenseTableSize; ++c) {
      t[c] = static_cast<float>(std::log1p(static_cast<double>(c)));
    }
    return t;
  }();
  return table;
}

void AppendHex(uint64_t v, std::string* out) {
  char buf[16];
  for (int i = 15; i >= 0; --i) {
    buf[i] = kHexDigits[v & 0xf];
    v >>= 4;
  }
  out->append(buf, 16);
}

absl::Status CheckCounts(int num_dense, int num_sparse, int num_multi = 0) {
  if (num_dense < 0 || num_sparse < 0 || num_multi < 0) {
    return absl::InvalidArgumentError(absl::StrCat("Criteo format: num_dense=", num_dense,
                                                   ", num_sparse=", num_sparse, " and num_multi=",
                                                   num_multi, " must be >= 0"));
  }
  return absl::OkStatus();
}

absl::Status ErrnoError(absl::string_view what, const std::string& path) {
  const int err = errno;
  const std::string msg = absl::StrCat(what, " ", path, ": ", std::strerror(err));
  switch (err) {
    case ENOENT:
      return absl::NotFoundError(msg);
    case EACCES:
    case EPERM:
      return absl::PermissionDeniedError(msg);
    default:
      return absl::UnavailableError(msg);
  }
}

}  // namespace

std::string FormatId(int64_t id) {
  std::string s;
  AppendHex(static_cast<uint64_t>(id), &s);
  return s;
}

absl::StatusOr<int64_t> ParseId(absl::string_view text) {
  uint64_t v;
  if (!ParseHex(text, &v)) {
    return absl::InvalidArgumentError(
        absl::StrCat("id ", Quote(text), " is not 1 to 16 hex digits"));
  }
  return static_cast<int64_t>(v);
}

float DenseFromCount(int64_t count) {
  if (count < kDenseTableSize) return DenseTable()[std::max<int64_t>(count, 0)];
  return static_cast<float>(std::log1p(static_cast<double>(count)));
}

int64_t CountFromDense(float value) { return std::llround(std::expm1(static_cast<double>(value))); }

absl::Status ParseCriteoLine(absl::string_view line, int num_dense, int num_sparse,
                             Example* example, int num_multi, bool float_dense) {
  TS_RETURN_IF_ERROR(CheckCounts(num_dense, num_sparse, num_multi));
  const int64_t expected = 1 + int64_t{num_dense} + num_sparse + num_multi;
  const int64_t got = 1 + std::count(line.begin(), line.end(), '\t');
  if (got != expected) {
    return absl::InvalidArgumentError(absl::StrCat(
        "expected ", expected, " tab-separated fields (label, ", num_dense, " dense, ", num_sparse,
        " categorical", num_multi > 0 ? absl::StrCat(", ", num_multi, " multi-hot") : "",
        "), got ", got, " in ", Quote(line)));
  }
  example->dense.resize(static_cast<size_t>(num_dense));
  example->sparse.resize(static_cast<size_t>(num_sparse));
  example->multi.resize(static_cast<size_t>(num_multi));
  size_t pos = 0;
  for (int f = 0; f < expected; ++f) {
    size_t tab = line.find('\t', pos);
    if (tab == absl::string_view::npos) tab = line.size();
    const absl::string_view text = line.substr(pos, tab - pos);
    pos = tab + 1;
    if (f == 0) {
      if (text == "0") {
        example->label = 0;
      } else if (text == "1") {
        example->label = 1;
      } else {
        return FieldError(f, num_dense, num_sparse, "label is not 0 or 1:", text);
      }
    } else if (f <= num_dense && float_dense) {
      if (!text_fields::ParseFinite(text, /*empty_is_zero=*/true, &example->dense[f - 1])) {
        return FieldError(f, num_dense, num_sparse, "dense value is not a finite number:", text);
      }
    } else if (f <= num_dense) {
      int64_t count = 0;
      if (!text.empty() && !text_fields::ParseInt64(text, &count)) {
        return FieldError(f, num_dense, num_sparse, "dense value is not an integer:", text);
      }
      example->dense[f - 1] = DenseFromCount(count);
    } else if (f <= num_dense + num_sparse) {
      uint64_t id = 0;
      if (!text.empty() && !ParseHex(text, &id)) {
        return FieldError(f, num_dense, num_sparse, "categorical id is not 1 to 16 hex digits:",
                          text);
      }
      example->sparse[f - 1 - num_dense] = static_cast<int64_t>(id);
    } else {
      std::vector<int64_t>& ids = example->multi[f - 1 - num_dense - num_sparse];
      ids.clear();
      for (size_t start = 0; !text.empty() && start <= text.size();) {
        size_t comma = text.find(',', start);
        if (comma == absl::string_view::npos) comma = text.size();
        uint64_t id = 0;
        if (!ParseHex(text.substr(start, comma - start), &id)) {
          return FieldError(f, num_dense, num_sparse,
                            "multi-hot ids are not ','-separated 1 to 16 hex digits:", text);
        }
        ids.push_back(static_cast<int64_t>(id));
        start = comma + 1;
      }
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<Example> ParseCriteoLine(absl::string_view line, int num_dense, int num_sparse) {
  Example example;
  TS_RETURN_IF_ERROR(ParseCriteoLine(line, num_dense, num_sparse, &example));
  return example;
}

// ---------------------------------------------------------------------------------------------
// CriteoReader

CriteoReader::CriteoReader(std::string path, gzFile file, std::unique_ptr<LineParser> parser,
                           int64_t max_line_bytes)
    : path_(std::move(path)),
      file_(file),
      parser_(std::move(parser)),
      max_line_bytes_(max_line_bytes) {}

CriteoReader::~CriteoReader() { gzclose(file_); }

absl::StatusOr<std::unique_ptr<CriteoReader>> CriteoReader::Open(const std::string& path,
                                                                 int num_dense, int num_sparse,
                                                                 int64_t max_line_bytes, int num_multi) {
  TS_RETURN_IF_ERROR(CheckCounts(num_dense, num_sparse, num_multi));
  DataSchema schema;
  schema.num_dense = num_dense;
  schema.num_sparse = num_sparse;
  schema.num_multi = num_multi;
  return Open(path, schema, max_line_bytes);
}

absl::StatusOr<std::unique_ptr<CriteoReader>> CriteoReader::Open(const std::string& path,
                                                                 const DataSchema& schema,
                                                                 int64_t max_line_bytes) {
  TS_ASSIGN_OR_RETURN(std::unique_ptr<LineParser> parser, NewLineParser(schema));
  if (max_line_bytes < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("max_line_bytes=", max_line_bytes, " for ", path, ": must be >= 1"));
  }
  struct stat st;
  if (::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
    return absl::InvalidArgumentError(
        absl::StrCat("cannot read Criteo file ", path, ": it is a directory"));
  }
  errno = 0;
  // zlib reads a gzip stream, and any other file as it is.
  gzFile file = gzopen(path.c_str(), "rb");
  if (file == nullptr) {
    if (errno == 0) errno = ENOMEM;
    return ErrnoError("cannot open Criteo file", path);
  }
  gzbuffer(file, kReadBufferBytes);
  std::unique_ptr<CriteoReader> reader(
      new CriteoReader(path, file, std::move(parser), max_line_bytes));
  reader->gzip_ = gzdirect(file) == 0;  // reads the header
  reader->buffer_.resize(kReadBufferBytes);
  return reader;
}

std::string CriteoReader::Where(int64_t line, int64_t start) const {
  return numbered_ ? absl::StrCat(path_, ":", line)
                   : absl::StrCat(path_, ": line at byte ", start);
}

absl::Status CriteoReader::Restrict(int64_t begin, int64_t end) {
  if (begin < 0 || (end >= 0 && end < begin)) {
    return absl::InvalidArgumentError(
        absl::StrCat(path_, ": bad byte range [", begin, ", ", end, ")"));
  }
  end_ = end;
  if (begin == 0) return absl::OkStatus();
  if (parser_->has_header() && !header_read_) {
    // The header comes first, whatever the range.
    absl::StatusOr<bool> got = ReadLine();
    if (!got.ok()) return got.status();
    TS_RETURN_IF_ERROR(ReadHeader());
    if (offset_ >= begin) {
      // The range starts inside the header line: its first line is the one after it.
      numbered_ = false;
      return absl::OkStatus();
    }
  }
  // The line that holds byte begin - 1 belongs to the range before: skip through its end.
  errno = 0;
  if (gzseek(file_, static_cast<z_off_t>(begin - 1), SEEK_SET) < 0) {
    if (errno == 0) errno = EINVAL;
    return ErrnoError(absl::StrCat("cannot seek to byte ", begin - 1, " of"), path_);
  }
  offset_ = begin - 1;
  buffer_pos_ = buffer_end_ = 0;  // what was read ahead (a header) is not at the new offset
  eof_ = false;
  numbered_ = false;
  const int64_t saved_end = end_;
  end_ = -1;
  absl::StatusOr<bool> skipped = ReadLine();
  end_ = saved_end;
  return skipped.status();
}

absl::Status CriteoReader::ReadHeader() {
  header_read_ = true;
  absl::string_view line(line_);
  if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
  if (absl::StartsWith(line, "\xEF\xBB\xBF")) {
    return absl::InvalidArgumentError(
        absl::StrCat(path_, ":1: the file starts with a UTF-8 byte-order mark (EF BB BF); "
                     "save it without one"));
  }
  absl::Status s = parser_->Header(line);
  if (!s.ok()) return absl::InvalidArgumentError(absl::StrCat(path_, ":1: ", s.message()));
  return absl::OkStatus();
}

absl::Status CriteoReader::SetStride(int64_t stride, int64_t offset) {
  if (stride < 1 || offset < 0 || offset >= stride) {
    return absl::InvalidArgumentError(
        absl::StrCat(path_, ": bad line stride ", stride, " offset ", offset));
  }
  stride_ = stride;
  stride_offset_ = offset;
  return absl::OkStatus();
}

absl::StatusOr<bool> CriteoReader::ReadLine() {
  line_.clear();
  line_start_ = offset_;
  if (end_ >= 0 && offset_ >= end_) return false;
  // One line end past the limit is allowed for: "...\r\n" of a line of exactly the limit.
  const size_t limit = static_cast<size_t>(max_line_bytes_) + 1;
  while (true) {
    if (buffer_pos_ == buffer_end_) {
      // A read error comes after the lines completed before it (zlib hands out what it could
      // decompress of a truncated stream).
      if (!read_error_.ok()) {
        return absl::DataLossError(absl::StrCat(Where(line_number_ + 1, line_start_), ": ",
                                                read_error_.message()));
      }
      if (eof_) return !line_.empty();  // a last line without '\n'
      errno = 0;
      const int n = gzread(file_, &buffer_[0], static_cast<unsigned>(buffer_.size()));
      int err = Z_OK;
      const char* message = gzerror(file_, &err);
      if (err == Z_ERRNO) {
        return ErrnoError(absl::StrCat("error reading line ", line_number_ + 1, " of"), path_);
      }
      if (n < 0 || (err != Z_OK && err != Z_STREAM_END)) {
        read_error_ = absl::DataLossError(
            absl::StrCat("gzip data truncated or corrupt (zlib: ", message, ")"));
      }
      buffer_pos_ = 0;
      buffer_end_ = static_cast<size_t>(std::max(n, 0));
      if (n == 0 && read_error_.ok()) eof_ = true;
      continue;
    }
    const char* start = buffer_.data() + buffer_pos_;
    const size_t avail = buffer_end_ - buffer_pos_;
    const char* newline = static_cast<const char*>(std::memchr(start, '\n', avail));
    const size_t take = newline != nullptr ? static_cast<size_t>(newline - start) : avail;
    if (line_.size() + take > limit) {
      line_.append(start, limit - line_.size());
      const bool cr = line_.find('\r') != std::string::npos;
      return absl::InvalidArgumentError(absl::StrCat(
          Where(line_number_ + 1, line_start_), ": line is longer than ", max_line_bytes_,
          " bytes",
          cr ? " and holds CR characters: CR-only line ends (classic Mac)? convert them to LF"
             : " (--max_line_bytes; is this a Criteo text file?)"));
    }
    line_.append(start, take);
    buffer_pos_ += take;
    offset_ += static_cast<int64_t>(take);
    if (newline != nullptr) {
      ++buffer_pos_;
      ++offset_;
      return true;
    }
  }
}

absl::StatusOr<bool> CriteoReader::Next(Example* example) {
  if (failed_) {
    return absl::FailedPreconditionError(absl::StrCat(
        Where(line_number_, line_start_), ": reading stopped at an earlier error"));
  }
  while (true) {
    errno = 0;
    absl::StatusOr<bool> more = ReadLine();
    if (!more.ok()) {
      failed_ = true;
      return more.status();
    }
    if (!*more) return false;
    ++line_number_;
    absl::string_view line(line_);
    if (line_start_ == 0 && absl::StartsWith(line, "\xEF\xBB\xBF")) {
      failed_ = true;
      return absl::InvalidArgumentError(
          absl::StrCat(path_, ":1: the file starts with a UTF-8 byte-order mark (EF BB BF); "
                       "save it without one"));
    }
    if (line_start_ == 0 && parser_->has_header()) {
      absl::Status header = ReadHeader();
      if (!header.ok()) {
        failed_ = true;
        return header;
      }
      continue;
    }
    if (stride_ > 1 && (line_number_ - 1) % stride_ != stride_offset_) continue;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.size() > static_cast<size_t>(max_line_bytes_)) {
      failed_ = true;
      return absl::InvalidArgumentError(
          absl::StrCat(Where(line_number_, line_start_), ": line is longer than ", max_line_bytes_,
                       " bytes (--max_line_bytes; is this a Criteo text file?)"));
    }
    if (line.empty()) continue;
    absl::Status s =
        line.find('\r') != absl::string_view::npos
            ? absl::InvalidArgumentError(
                  "a CR (\\r) inside the line: CR-only line ends (classic Mac)? convert them to LF")
            : parser_->Parse(line, example);
    if (!s.ok()) {
      const std::string error = absl::StrCat(Where(line_number_, line_start_), ": ", s.message());
      if (bad_lines_ < max_bad_lines_) {
        if (bad_lines_++ == 0) first_bad_line_ = error;
        continue;
      }
      failed_ = true;
      return absl::InvalidArgumentError(
          max_bad_lines_ == 0
              ? error
              : absl::StrCat(error, " (more than --max_bad_lines=", max_bad_lines_,
                             " bad lines; the first: ", first_bad_line_, ")"));
    }
    return true;
  }
}

namespace {
// Appends every remaining example of `reader` to `dataset`.
absl::Status AppendExamples(CriteoReader* reader, Dataset* dataset) {
  while (true) {
    dataset->examples.emplace_back();
    absl::StatusOr<bool> more = reader->Next(&dataset->examples.back());
    if (!more.ok() || !*more) {
      dataset->examples.pop_back();
      return more.status();
    }
  }
}
}  // namespace

absl::StatusOr<Dataset> ReadCriteoFile(const std::string& path, int num_dense, int num_sparse,
                                       int64_t max_line_bytes, int num_multi) {
  TS_ASSIGN_OR_RETURN(std::unique_ptr<CriteoReader> reader,
                      CriteoReader::Open(path, num_dense, num_sparse, max_line_bytes, num_multi));
  Dataset dataset;
  dataset.num_dense = num_dense;
  dataset.num_sparse = num_sparse;
  dataset.num_multi = num_multi;
  TS_RETURN_IF_ERROR(AppendExamples(reader.get(), &dataset));
  return dataset;
}

absl::StatusOr<std::vector<std::string>> ExpandDataPaths(const std::string& spec) {
  std::vector<std::string> paths;
  for (absl::string_view item : absl::StrSplit(spec, ',')) {
    const std::string path(item);
    if (path.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("data '", spec, "' has an empty item (a list is file,dir,pattern,...)"));
    }
    std::vector<std::string> found;
    struct stat st;
    if (::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode)) {
      DIR* dir = ::opendir(path.c_str());
      if (dir == nullptr) return ErrnoError("cannot list data directory", path);
      while (const struct dirent* e = ::readdir(dir)) {
        // Hidden files, and Hadoop / Spark markers such as _SUCCESS, hold no data.
        if (e->d_name[0] == '.' || e->d_name[0] == '_') continue;
        const std::string file = absl::StrCat(path, "/", e->d_name);
        struct stat fst;
        if (::stat(file.c_str(), &fst) == 0 && S_ISREG(fst.st_mode)) found.push_back(file);
      }
      ::closedir(dir);
      if (found.empty()) {
        return absl::NotFoundError(absl::StrCat("data directory ", path, " holds no file"));
      }
    } else if (path.find_first_of("*?[") != std::string::npos) {
      glob_t g;
      const int rc = ::glob(path.c_str(), 0, nullptr, &g);
      if (rc == 0) {
        for (size_t i = 0; i < g.gl_pathc; ++i) {
          struct stat fst;  // files only, as in a directory
          if (::stat(g.gl_pathv[i], &fst) == 0 && S_ISREG(fst.st_mode)) {
            found.push_back(g.gl_pathv[i]);
          }
        }
      }
      ::globfree(&g);
      if (rc != 0 && rc != GLOB_NOMATCH) {
        return absl::UnavailableError(absl::StrCat(
            "cannot expand data pattern '", path, "' (",
            rc == GLOB_ABORTED ? "a directory could not be read" : "out of memory", ")"));
      }
      if (found.empty()) {
        return absl::NotFoundError(absl::StrCat("data pattern '", path, "' matches no file"));
      }
    } else {
      found.push_back(path);
    }
    std::sort(found.begin(), found.end());
    paths.insert(paths.end(), found.begin(), found.end());
  }
  return paths;
}

absl::StatusOr<Dataset> ReadCriteoData(const std::string& spec, const CriteoDataOptions& options,
                                       CriteoReadStats* stats) {
  if (options.format == DataFormat::kIdx) {
    if (options.num_sparse > 0 || options.num_multi > 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "idx data holds images and labels only; the model feeds ", options.num_sparse,
          " categorical and ", options.num_multi, " multi-hot slots"));
    }
    if (stats != nullptr) *stats = CriteoReadStats{2, 0, ""};
    return ReadIdxData(spec, options.num_dense);
  }
  TS_ASSIGN_OR_RETURN(std::vector<std::string> paths, ExpandDataPaths(spec));
  Dataset dataset;
  dataset.num_dense = options.num_dense;
  dataset.num_sparse = options.num_sparse;
  dataset.num_multi = options.num_multi;
  CriteoReadStats seen;
  for (const std::string& path : paths) {
    TS_ASSIGN_OR_RETURN(std::unique_ptr<CriteoReader> reader,
                        CriteoReader::Open(path, options, options.max_line_bytes));
    // The budget is for all the files together.
    reader->set_max_bad_lines(options.max_bad_lines, seen.bad_lines, seen.first_bad_line);
    TS_RETURN_IF_ERROR(AppendExamples(reader.get(), &dataset));
    seen.first_bad_line = reader->first_bad_line();
    seen.bad_lines = reader->bad_lines();
    ++seen.files;
  }
  if (stats != nullptr) *stats = seen;
  return dataset;
}

// ---------------------------------------------------------------------------------------------
// CriteoWriter

CriteoWriter::CriteoWriter(std::string path, std::string temp_path, FILE* file, int num_dense,
                           int num_sparse, int num_multi)
    : path_(std::move(path)),
      temp_path_(std::move(temp_path)),
      file_(file),
      num_dense_(num_dense),
      num_sparse_(num_sparse),
      num_multi_(num_multi) {
  buffer_.reserve(kWriteBufferBytes + 4096);
}

CriteoWriter::~CriteoWriter() { Abandon(); }

void CriteoWriter::Abandon() {
  if (file_ == nullptr) return;
  std::fclose(file_);
  file_ = nullptr;
  std::remove(temp_path_.c_str());
}

absl::StatusOr<std::unique_ptr<CriteoWriter>> CriteoWriter::Open(const std::string& path,
                                                                 int num_dense, int num_sparse,
                                                                 int num_multi) {
  TS_RETURN_IF_ERROR(CheckCounts(num_dense, num_sparse, num_multi));
  std::string temp_path = absl::StrCat(path, ".tmp.XXXXXX");
  const int fd = mkstemp(temp_path.data());
  if (fd < 0) return ErrnoError("cannot create a temporary file beside", path);
  fchmod(fd, 0644);  // mkstemp creates 0600; a data file is normally world-readable.
  FILE* file = fdopen(fd, "w");
  if (file == nullptr) {
    absl::Status s = ErrnoError("cannot open temporary file for", path);
    close(fd);
    std::remove(temp_path.c_str());
    return s;
  }
  return std::unique_ptr<CriteoWriter>(
      new CriteoWriter(path, std::move(temp_path), file, num_dense, num_sparse, num_multi));
}

absl::Status CriteoWriter::Write(const Example& example) {
  if (file_ == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("CriteoWriter for ", path_, " is closed or failed"));
  }
  auto where = [&] { return absl::StrCat("writing ", path_, ": example ", num_written_); };
  if (example.dense.size() != static_cast<size_t>(num_dense_) ||
      example.sparse.size() != static_cast<size_t>(num_sparse_) ||
      example.multi.size() != static_cast<size_t>(num_multi_)) {
    return absl::InvalidArgumentError(absl::StrCat(
        where(), " has ", example.dense.size(), " dense values, ", example.sparse.size(),
        " ids and ", example.multi.size(), " id lists, the file has ", num_dense_, ", ",
        num_sparse_, " and ", num_multi_));
  }
  if (example.label != 0.0f && example.label != 1.0f) {
    return absl::InvalidArgumentError(
        absl::StrCat(where(), ": label ", example.label, " is not 0 or 1"));
  }
  for (int j = 0; j < num_dense_; ++j) {
    const float v = example.dense[j];
    if (!(v >= 0.0f && v <= kMaxDense)) {  // Also rejects NaN.
      return absl::InvalidArgumentError(absl::StrCat(where(), ": dense value I", j + 1, "=", v,
                                                     " is not log1p of a count in [0, 2^62]"));
    }
  }
  buffer_.push_back(example.label == 1.0f ? '1' : '0');
  for (int j = 0; j < num_dense_; ++j) {
    absl::StrAppend(&buffer_, "\t", CountFromDense(example.dense[j]));
  }
  for (int j = 0; j < num_sparse_; ++j) {
    buffer_.push_back('\t');
    AppendHex(static_cast<uint64_t>(example.sparse[j]), &buffer_);
  }
  for (const std::vector<int64_t>& ids : example.multi) {
    buffer_.push_back('\t');
    for (size_t i = 0; i < ids.size(); ++i) {
      if (i > 0) buffer_.push_back(',');
      AppendHex(static_cast<uint64_t>(ids[i]), &buffer_);
    }
  }
  buffer_.push_back('\n');
  ++num_written_;
  if (buffer_.size() >= kWriteBufferBytes) return Flush();
  return absl::OkStatus();
}

absl::Status CriteoWriter::Flush() {
  if (buffer_.empty()) return absl::OkStatus();
  if (std::fwrite(buffer_.data(), 1, buffer_.size(), file_) != buffer_.size()) {
    absl::Status s = ErrnoError("cannot write temporary file for", path_);
    Abandon();
    return s;
  }
  buffer_.clear();
  return absl::OkStatus();
}

absl::Status CriteoWriter::Close() {
  if (file_ == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("CriteoWriter for ", path_, " is closed or failed"));
  }
  TS_RETURN_IF_ERROR(Flush());
  if (std::fflush(file_) != 0 || fsync(fileno(file_)) != 0) {
    absl::Status s = ErrnoError("cannot write temporary file for", path_);
    Abandon();
    return s;
  }
  const int rc = std::fclose(file_);
  file_ = nullptr;
  if (rc != 0) {
    absl::Status s = ErrnoError("cannot close temporary file for", path_);
    std::remove(temp_path_.c_str());
    return s;
  }
  if (std::rename(temp_path_.c_str(), path_.c_str()) != 0) {
    absl::Status s = ErrnoError(absl::StrCat("cannot rename ", temp_path_, " to"), path_);
    std::remove(temp_path_.c_str());
    return s;
  }
  return absl::OkStatus();
}

absl::Status WriteCriteoFile(const std::string& path, const Dataset& dataset) {
  TS_ASSIGN_OR_RETURN(std::unique_ptr<CriteoWriter> writer,
                      CriteoWriter::Open(path, dataset.num_dense, dataset.num_sparse,
                                         dataset.num_multi));
  for (const Example& example : dataset.examples) TS_RETURN_IF_ERROR(writer->Write(example));
  return writer->Close();
}

}  // namespace data
}  // namespace tessera
