// MetricsCsvWriter: appends one row of named values per interval to a CSV file, for plots
// (gnuplot, spreadsheets). The first line is the header of column names; each Append() writes
// one line and flushes it, so a crash loses at most the row being written.
//
//   TS_ASSIGN_OR_RETURN(auto csv, MetricsCsvWriter::Open(dir + "/metrics.csv",
//                                                         {"step", "loss", "samples_per_s"}));
//   TS_RETURN_IF_ERROR(csv->Append({{"step", 20}, {"loss", 0.53}}));  // samples_per_s left empty
//
// Thread-safe (rows from several threads are written whole, one after another).
#ifndef TESSERA_COMMON_METRICS_METRICS_CSV_H_
#define TESSERA_COMMON_METRICS_METRICS_CSV_H_

#include <cstdio>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/metrics/metrics.h"

namespace tessera {

class MetricsCsvWriter {
 public:
  // Opens `path` for appending, creating it. An empty file gets the header line; a non-empty
  // one must already start with exactly this header (FailedPrecondition naming the file
  // otherwise, so rows never land under the wrong columns). Column names must be unique,
  // non-empty and free of newlines (InvalidArgument); ones with commas or quotes are written
  // quoted (RFC 4180). Unavailable names the file when it cannot be opened or read.
  static absl::StatusOr<std::unique_ptr<MetricsCsvWriter>> Open(const std::string& path,
                                                                std::vector<std::string> columns);
  ~MetricsCsvWriter();
  MetricsCsvWriter(const MetricsCsvWriter&) = delete;
  MetricsCsvWriter& operator=(const MetricsCsvWriter&) = delete;

  // Writes one row: each value under its column (%.9g); columns without a value stay empty.
  // InvalidArgument (nothing written) when a name is not a column or appears twice;
  // Unavailable naming the file when writing fails.
  absl::Status Append(const std::vector<std::pair<std::string, double>>& values);

  // Writes one row from a registry: column c gets Snapshot()[c] (counters and gauges as
  // "name" or "name{label=\"value\"}", histograms as name_count / name_sum); columns the
  // registry lacks stay empty, so a fixed header can list metrics created later.
  absl::Status AppendSnapshot(const MetricsRegistry& registry);

  const std::vector<std::string>& columns() const { return columns_; }
  const std::string& path() const { return path_; }

 private:
  MetricsCsvWriter(std::string path, std::vector<std::string> columns, FILE* file)
      : path_(std::move(path)), columns_(std::move(columns)), file_(file) {}
  absl::Status WriteRow(const std::vector<std::string>& cells);

  const std::string path_;
  const std::vector<std::string> columns_;
  absl::Mutex mu_;
  FILE* file_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tessera

#endif  // TESSERA_COMMON_METRICS_METRICS_CSV_H_
