// Text formats of training data besides Criteo's, one example per line. Each fills an Example
// with the schema the model's feeds ask for: num_dense dense values, num_sparse categorical ids
// (one per slot), num_multi lists of ids, and a label.
//
//   criteo     label \t dense... \t hex ids... \t multi-hot lists (common/data/criteo.h); with
//              float_dense the dense fields are decimal floats taken as they are ("260.0",
//              "-1.5e3"; empty = 0) instead of counts stored as log(1 + count).
//   csv        comma-separated with a header line (the first line of every file). Columns are
//              picked by name (CsvColumns): the label (a finite decimal number), the dense
//              features (finite decimals, empty = 0), the categorical slots and the multi-hot
//              slots (ids separated by '|', empty = no id). An id that is a decimal int64 is
//              that id; any other text ("US", "android") is hashed to one (HashId). A field may
//              be double-quoted, with "" for a quote inside; a record is one line. Unused
//              columns are ignored.
//   libsvm     label index:value ..., separated by spaces or tabs. The label is a decimal
//              number; -1 reads as 0 (binary data written as -1/+1). Indices are 0-based:
//              index i < num_dense sets dense value i; every other index i is an id of
//              multi-hot slot 0 (the schema's only slot; its value must be 1).
//   multislot  Fluid's MultiSlot text: space-separated; per slot, its count and then that many
//              values, the slots in this order: the label (count 1), the dense features (count
//              num_dense), each categorical slot (count 1, a decimal int64 id), each multi-hot
//              slot (any count of decimal int64 ids).
// Errors are one line: InvalidArgument "field <f> (<name>): ..." or "expected ..." for the
// line (the reader prefixes path:line); a CSV header without a wanted column names it.
#ifndef TESSERA_COMMON_DATA_FORMATS_H_
#define TESSERA_COMMON_DATA_FORMATS_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/data/example.h"

namespace tessera {
namespace data {

// kIdx is not line-based: images and labels in IDX files (common/data/idx.h); it has no
// LineParser and cannot be streamed.
enum class DataFormat { kCriteo, kCsv, kLibsvm, kMultiSlot, kIdx };

// "criteo", "csv", "libsvm", "multislot", "idx" -> the format; InvalidArgument naming the text.
absl::StatusOr<DataFormat> ParseDataFormat(absl::string_view name);
const char* DataFormatName(DataFormat format);

// CSV: which header column feeds what. Empty lists take the Criteo names: I1..I<num_dense>,
// C1..C<num_sparse>, M1..M<num_multi>.
struct CsvColumns {
  std::string label = "label";
  std::vector<std::string> dense;
  std::vector<std::string> slots;
  std::vector<std::string> multi;
};

// "label=click;dense=age,income;slots=country,device;multi=tags" (any part may be left out)
// -> the columns; InvalidArgument naming a bad part.
absl::StatusOr<CsvColumns> ParseCsvColumns(absl::string_view spec);

// What a line must hold, and how to read it.
struct DataSchema {
  DataFormat format = DataFormat::kCriteo;
  int num_dense = 13;
  int num_sparse = 26;
  int num_multi = 0;
  bool float_dense = false;  // criteo: dense fields are floats as they are, not counts
  CsvColumns csv;
};

// The id of a categorical value that is not a decimal int64: a 64-bit hash of its bytes, the
// same on every machine.
int64_t HashId(absl::string_view text);

// Parses the lines of one file. Not thread-safe (a CSV parser learns its columns from the
// file's header); one per reader.
class LineParser {
 public:
  virtual ~LineParser() = default;
  // Whether the first line of a file is a header, given to Header() instead of Parse().
  virtual bool has_header() const { return false; }
  virtual absl::Status Header(absl::string_view line) { return absl::OkStatus(); }
  // One line (without its line end) into *example, reusing its vectors.
  virtual absl::Status Parse(absl::string_view line, Example* example) = 0;
};

// A parser of `schema.format` for `schema`; InvalidArgument for a schema the format cannot
// hold (negative counts, libsvm with categorical slots or more than one multi-hot slot, CSV
// column lists of the wrong length).
absl::StatusOr<std::unique_ptr<LineParser>> NewLineParser(const DataSchema& schema);

}  // namespace data
}  // namespace tessera

#endif  // TESSERA_COMMON_DATA_FORMATS_H_
