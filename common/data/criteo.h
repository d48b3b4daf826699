// Criteo-format text files: one example per line, tab-separated:
//
//   label \t I1 ... I<num_dense> \t C1 ... C<num_sparse> [\t M1 ... M<num_multi>]
//
// (13 dense and 26 categorical fields in the Criteo Display Advertising data set; the multi-hot
// fields M are Tessera's extension, absent unless num_multi > 0).
//   label        "0" or "1".
//   dense Ij     a decimal integer count (negative counts are allowed and read as 0); stored in
//                Example::dense as log(1 + max(x, 0)). An empty field means missing and reads
//                as count 0, i.e. value 0.
//   categorical  1 to 16 hexadecimal digits, either case; the id is the 64-bit value
//                reinterpreted as int64, so every int64 is representable (FormatId writes all
//                16 digits: "ffffffffffffffff" is -1). An empty field means missing and reads as
//                id 0; the writer never writes an empty field, so id 0 round-trips.
//   multi-hot Mj a list of ids, each written as a categorical id, separated by ','; an empty
//                field is an empty list.
// A trailing '\r' (CRLF files) is ignored, and so are empty lines; a UTF-8 byte-order mark and
// CR-only line ends (a '\r' inside a line) are errors that say so. gzip-compressed files are
// read transparently (zlib; any file, whatever its name). A line longer than the
// reader's max_line_bytes (default 1 MiB; a Criteo line is ~200-400 bytes) is an error naming
// path:line, found after reading at most that many bytes of it: /dev/zero or a binary file
// cannot make a reader grow without bound.
//
// Errors are one line each, e.g. "<path>:<line>: field 3 (I2): dense value is not an integer:
// 'x7'", fields numbered from 1 (field 1 is the label, then I1.., then C1..); bad text is
// escaped and cut to 60 characters; M fields are named M1.. after the C fields.
//
// Writing inverts the dense transform (count = round(exp(value) - 1)); that reproduces the
// count exactly for counts below 10^6 and to float precision above.
#ifndef TESSERA_COMMON_DATA_CRITEO_H_
#define TESSERA_COMMON_DATA_CRITEO_H_

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/data/example.h"
#include "common/data/formats.h"

struct gzFile_s;  // zlib's file handle (zlib.h: gzFile)

namespace tessera {
namespace data {

inline constexpr int kCriteoNumDense = 13;
inline constexpr int kCriteoNumSparse = 26;
inline constexpr int64_t kDefaultMaxLineBytes = int64_t{1} << 20;

// The 16 lowercase hex digits of the id's 64 bits (two's complement).
std::string FormatId(int64_t id);
// 1 to 16 hex digits (either case) -> the int64 with those bits; InvalidArgument otherwise.
absl::StatusOr<int64_t> ParseId(absl::string_view text);

// log(1 + max(count, 0)), the value stored for a dense count.
float DenseFromCount(int64_t count);
// The count a dense value stands for: round(exp(value) - 1).
int64_t CountFromDense(float value);

// Parses one line (without its '\n') into *example, reusing its vectors. On error returns
// InvalidArgument "field <f> (<name>): ..." and leaves *example unspecified.
// float_dense: dense fields are finite decimal floats, stored as they are (empty = 0).
absl::Status ParseCriteoLine(absl::string_view line, int num_dense, int num_sparse,
                             Example* example, int num_multi = 0, bool float_dense = false);
absl::StatusOr<Example> ParseCriteoLine(absl::string_view line, int num_dense = kCriteoNumDense,
                                        int num_sparse = kCriteoNumSparse);

// Reads a Criteo file (plain or gzip) one example at a time. Not thread-safe.
//
// A reader may be restricted to a part of its file, so that several trainers share one file:
// Restrict() to the lines that start in a byte range (plain files: a seek), or SetStride() to
// every k-th line (any file; the others are read but not parsed). Errors then name a line by
// its byte offset ("<path>: line at byte N") where its number is unknown.
class CriteoReader {
 public:
  // NotFound / PermissionDenied etc. naming the path when it cannot be opened.
  // max_line_bytes (>= 1) bounds one line, without its line end.
  static absl::StatusOr<std::unique_ptr<CriteoReader>> Open(
      const std::string& path, int num_dense = kCriteoNumDense, int num_sparse = kCriteoNumSparse,
      int64_t max_line_bytes = kDefaultMaxLineBytes, int num_multi = 0);
  // A file of any format of formats.h (`schema.format`): the same reader, the lines parsed by
  // NewLineParser(schema); a header line (CSV) is read first, whatever the range or stride.
  static absl::StatusOr<std::unique_ptr<CriteoReader>> Open(
      const std::string& path, const DataSchema& schema,
      int64_t max_line_bytes = kDefaultMaxLineBytes);
  ~CriteoReader();
  CriteoReader(const CriteoReader&) = delete;
  CriteoReader& operator=(const CriteoReader&) = delete;

  // Reads the next example: true, or false at the end of the file. A malformed line gives
  // InvalidArgument "<path>:<line>: field ..." (or "...: line is longer than N bytes");
  // reading may not continue after an error.
  absl::StatusOr<bool> Next(Example* example);
  // 1-based number of the line last read (counted from the range's first line after
  // Restrict() with begin > 0).
  int64_t line_number() const { return line_number_; }
  // Whether the file is gzip-compressed.
  bool gzip() const { return gzip_; }
  // The uncompressed byte offset of the next line.
  int64_t offset() const { return offset_; }

  // Only the lines whose first byte lies in [begin, end) are read (end < 0: to the end of the
  // file). Call before the first Next(). For a gzip file the seek decompresses the bytes before
  // `begin`. InvalidArgument if begin < 0 or end < begin; an I/O error names the path.
  absl::Status Restrict(int64_t begin, int64_t end);
  // Only lines l (1-based) with (l - 1) % stride == offset are parsed, the others skipped
  // unparsed (and not counted as bad). 1 <= stride, 0 <= offset < stride.
  absl::Status SetStride(int64_t stride, int64_t offset);

  // Up to `n` malformed lines are skipped (counted, the first one's error kept) instead of
  // failing; the next one fails, saying that more than n were seen. 0 (the default): the first
  // fails. A byte-order mark, an over-long line or unreadable gzip data always fails. The
  // count may start at `already` skipped lines, the first of them `first` (a budget for several
  // files).
  void set_max_bad_lines(int64_t n, int64_t already = 0, std::string first = "") {
    max_bad_lines_ = n;
    bad_lines_ = already;
    first_bad_line_ = std::move(first);
  }
  // Skipped lines, those of set_max_bad_lines' `already` included.
  int64_t bad_lines() const { return bad_lines_; }
  // The error of the first skipped line ("" if none).
  const std::string& first_bad_line() const { return first_bad_line_; }

 private:
  CriteoReader(std::string path, ::gzFile_s* file, std::unique_ptr<LineParser> parser,
               int64_t max_line_bytes);
  // The line just read is the file's header: hands it to the parser.
  absl::Status ReadHeader();
  // Reads the next line (without '\n') into line_: true, false at the end of the file, or an
  // error when it exceeds max_line_bytes_ (stops reading there) or the file cannot be read.
  absl::StatusOr<bool> ReadLine();
  // "<path>:<line>" for line `line` (1-based), or "<path>: line at byte <start>" after a seek.
  std::string Where(int64_t line, int64_t start) const;

  std::string path_;
  ::gzFile_s* file_;
  bool gzip_ = false;
  std::unique_ptr<LineParser> parser_;
  bool header_read_ = false;
  int64_t max_line_bytes_;
  int64_t line_number_ = 0;
  bool numbered_ = true;  // line numbers are the file's (no seek happened)
  std::string line_;
  int64_t line_start_ = 0;  // offset of line_'s first byte
  // Read-ahead: buffer_[buffer_pos_, buffer_end_) are the bytes at offset_ on.
  std::string buffer_;
  size_t buffer_pos_ = 0;
  size_t buffer_end_ = 0;
  bool eof_ = false;
  absl::Status read_error_;  // met after the buffered bytes: returned once they are used up
  int64_t offset_ = 0;
  int64_t end_ = -1;  // Restrict()'s end
  int64_t stride_ = 1;
  int64_t stride_offset_ = 0;
  bool failed_ = false;
  int64_t max_bad_lines_ = 0;
  int64_t bad_lines_ = 0;
  std::string first_bad_line_;
};

// The whole file as a Dataset with the given field counts.
absl::StatusOr<Dataset> ReadCriteoFile(const std::string& path, int num_dense = kCriteoNumDense,
                                       int num_sparse = kCriteoNumSparse,
                                       int64_t max_line_bytes = kDefaultMaxLineBytes,
                                       int num_multi = 0);

// The files a data flag names (--train_data, --test_data, ctr --train): a comma-separated list
// of files, directories (their regular files not starting with '.' or '_' (Hadoop / Spark
// markers such as _SUCCESS), sorted by name) and glob
// patterns (sorted matches), in the order given. An item that names nothing (an empty
// directory, a pattern without a match) is an error naming it; a missing plain file fails when
// it is opened.
absl::StatusOr<std::vector<std::string>> ExpandDataPaths(const std::string& spec);

// How data files are read: their schema (format, field counts, float_dense, CSV columns;
// Criteo's layout by default) and the reader's bounds.
struct CriteoDataOptions : DataSchema {
  int64_t max_line_bytes = kDefaultMaxLineBytes;
  // Malformed lines skipped over all the files together (CriteoReader::set_max_bad_lines).
  int64_t max_bad_lines = 0;
};

// What ReadCriteoData skipped.
struct CriteoReadStats {
  int64_t files = 0;
  int64_t bad_lines = 0;
  std::string first_bad_line;  // its error ("" if none)
};

// Every file of `spec` (ExpandDataPaths), plain or gzip, one after the other, as one Dataset.
absl::StatusOr<Dataset> ReadCriteoData(const std::string& spec, const CriteoDataOptions& options,
                                       CriteoReadStats* stats = nullptr);

// Writes a Criteo file atomically: lines go to a temporary file beside `path`, and Close()
// flushes, fsyncs and renames it onto `path`. Until Close() succeeds `path` is untouched; a
// writer destroyed without a successful Close() removes its temporary file. Not thread-safe.
class CriteoWriter {
 public:
  static absl::StatusOr<std::unique_ptr<CriteoWriter>> Open(const std::string& path, int num_dense,
                                                            int num_sparse, int num_multi = 0);
  ~CriteoWriter();
  CriteoWriter(const CriteoWriter&) = delete;
  CriteoWriter& operator=(const CriteoWriter&) = delete;

  // Appends one line. InvalidArgument naming the example's 0-based index and the field when
  // the example does not fit the format (field counts, label not 0/1, dense value negative,
  // non-finite or above log1p(2^62)); nothing is written then and the writer stays usable.
  absl::Status Write(const Example& example);
  // Commits the file; an I/O error names the path.
  absl::Status Close();
  int64_t num_written() const { return num_written_; }

 private:
  CriteoWriter(std::string path, std::string temp_path, FILE* file, int num_dense, int num_sparse,
               int num_multi);
  absl::Status Flush();
  void Abandon();

  std::string path_;
  std::string temp_path_;
  FILE* file_;
  int num_dense_;
  int num_sparse_;
  int num_multi_;
  int64_t num_written_ = 0;
  std::string buffer_;
};

// Writes `dataset` with CriteoWriter (atomically).
absl::Status WriteCriteoFile(const std::string& path, const Dataset& dataset);

}  // namespace data
}  // namespace tessera

#endif  // TESSERA_COMMON_DATA_CRITEO_H_
