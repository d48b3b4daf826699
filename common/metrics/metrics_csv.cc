#include "common/metrics/metrics_csv.h"

#include <cerrno>
#include <cstring>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace tessera {

namespace {
// RFC 4180: a cell with a comma or a quote is quoted, its quotes doubled.
std::string CsvCell(const std::string& s) {
  if (s.find_first_of(",\"") == std::string::npos) return s;
  std::string out = "\"";
  for (char c : s) {
    if (c == '"') out += '"';
    out += c;
  }
  return out + "\"";
}
}  // namespace

absl::StatusOr<std::unique_ptr<MetricsCsvWriter>> MetricsCsvWriter::Open(
    const std::string& path, std::vector<std::string> columns) {
  if (columns.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("CSV ", path, ": no columns"));
  }
  std::set<std::string> seen;
  for (const auto& c : columns) {
    if (c.empty() || c.find_first_of("\r\n") != std::string::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("CSV ", path, ": column name '", c, "' is empty or has a newline"));
    }
    if (!seen.insert(c).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("CSV ", path, ": column '", c, "' given twice"));
    }
  }
  std::string header = absl::StrJoin(
      columns, ",", [](std::string* out, const std::string& c) { out->append(CsvCell(c)); });
  FILE* f = std::fopen(path.c_str(), "a+e");  // append, read the existing header; close-on-exec
  if (f == nullptr) {
    return absl::UnavailableError(
        absl::StrCat("cannot open CSV ", path, ": ", std::strerror(errno)));
  }
  std::fseek(f, 0, SEEK_SET);
  std::string first;
  int ch;
  while ((ch = std::fgetc(f)) != EOF && ch != '\n') first.push_back(static_cast<char>(ch));
  if (!first.empty() && first.back() == '\r') first.pop_back();
  bool empty = first.empty() && ch == EOF;
  if (!empty && first != header) {
    std::fclose(f);
    return absl::FailedPreconditionError(
        absl::StrCat("CSV ", path, " has header '", first, "', not '", header, "'"));
  }
  auto writer = std::unique_ptr<MetricsCsvWriter>(new MetricsCsvWriter(path, columns, f));
  if (empty) {
    absl::MutexLock lock(&writer->mu_);
    if (std::fprintf(f, "%s\n", header.c_str()) < 0 || std::fflush(f) != 0) {
      return absl::UnavailableError(
          absl::StrCat("cannot write CSV ", path, ": ", std::strerror(errno)));
    }
  }
  return writer;
}

MetricsCsvWriter::~MetricsCsvWriter() {
  absl::MutexLock lock(&mu_);
  if (file_ != nullptr) std::fclose(file_);
}

absl::Status MetricsCsvWriter::WriteRow(const std::vector<std::string>& cells) {
  std::string line = absl::StrCat(absl::StrJoin(cells, ","), "\n");
  absl::MutexLock lock(&mu_);
  if (std::fwrite(line.data(), 1, line.size(), file_) != line.size() || std::fflush(file_) != 0) {
    return absl::UnavailableError(
        absl::StrCat("cannot write CSV ", path_, ": ", std::strerror(errno)));
  }
  return absl::OkStatus();
}

absl::Status MetricsCsvWriter::Append(const std::vector<std::pair<std::string, double>>& values) {
  std::vector<std::string> cells(columns_.size());
  std::vector<bool> filled(columns_.size(), false);
  for (const auto& [name, value] : values) {
    size_t i = 0;
    while (i < columns_.size() && columns_[i] != name) ++i;
    if (i == columns_.size()) {
      return absl::InvalidArgumentError(
          absl::StrCat("CSV ", path_, ": '", name,
                       "' is not a column (columns: ", absl::StrJoin(columns_, ","), ")"));
    }
    if (filled[i]) {
      return absl::InvalidArgumentError(
          absl::StrCat("CSV ", path_, ": '", name, "' given twice in one row"));
    }
    filled[i] = true;
    cells[i] = absl::StrFormat("%.9g", value);
  }
  return WriteRow(cells);
}

absl::Status MetricsCsvWriter::AppendSnapshot(const MetricsRegistry& registry) {
  std::map<std::string, double> snapshot = registry.Snapshot();
  std::vector<std::string> cells(columns_.size());
  for (size_t i = 0; i < columns_.size(); ++i) {
    auto it = snapshot.find(columns_[i]);
    if (it != snapshot.end()) cells[i] = absl::StrFormat("%.9g", it->second);
  }
  return WriteRow(cells);
}

}  // namespace tessera
