// reader: how fast training data is parsed, and whether streaming keeps memory flat.
//
//   bazel run -c opt //tests/bench:reader -- [--lines=400000] [--dir=/tmp] [--repeat=3]
//
// Writes --lines synthetic Criteo lines (13 dense counts, 26 ids; the CTR demo's shape) to a
// plain and a gzip file under --dir, then reports for each:
//   - parse only: ParseCriteoLine over lines already in memory (one core), and the same
//     examples as csv, multislot and libsvm lines through their LineParsers;
//   - zlib inflate only: the gzip file decompressed and dropped (the floor for gzip input);
//   - read + parse: CriteoReader, one thread;
//   - stream: ExampleStream (background parse thread, queue, shuffle buffer) drained by the
//     caller, with the process's CPU seconds for both threads;
// as lines/s of wall time and per CPU-second ("per core"), each the fastest of --repeat runs.
// Then it streams the plain file
// through a queue of 4096 and a shuffle buffer of 4096 examples (the file holds ~50x more) and
// prints the process RSS after the first 5% of the lines and its peak afterwards: flat means
// memory does not grow with the data read.
#include <sys/resource.h>
#include <zlib.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/data/criteo.h"
#include "common/data/formats.h"
#include "common/data/stream.h"
#include "common/data/synthetic.h"
#include "common/base/status.h"

ABSL_FLAG(int64_t, lines, 400000, "Criteo lines to generate and read.");
ABSL_FLAG(std::string, dir, "/tmp", "Where the data files go (removed at the end).");
ABSL_FLAG(int, repeat, 3, "Runs of each measurement; the fastest is reported.");

namespace tessera {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point since) {
  return std::chrono::duration<double>(Clock::now() - since).count();
}

double CpuSeconds() {
  struct rusage u;
  getrusage(RUSAGE_SELF, &u);
  return u.ru_utime.tv_sec + u.ru_stime.tv_sec + 1e-6 * (u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

// Resident set size of this process, MB.
double RssMb() {
  std::ifstream status("/proc/self/status");
  std::string line;
  while (std::getline(status, line)) {
    if (line.rfind("VmRSS:", 0) == 0) {
      int64_t kb = 0;
      std::vector<std::string> parts = absl::StrSplit(line, ' ', absl::SkipEmpty());
      if (parts.size() >= 2 && absl::SimpleAtoi(parts[1], &kb)) return kb / 1024.0;
    }
  }
  return -1;
}

void Report(const std::string& what, int64_t lines, double wall, double cpu) {
  std::printf("%-34s %10.0f lines/s  %10.0f lines/s per core  (%.2f s wall, %.2f CPU-s)\n",
              what.c_str(), lines / wall, lines / cpu, wall, cpu);
}

// Runs `fn`, which returns the lines it read, --repeat times and reports its fastest run (the
// VM's neighbours make single runs differ by up to 2x).
template <typename Fn>
bool Measure(const std::string& what, Fn fn) {
  double best_wall = 1e30, best_cpu = 1e30;
  int64_t lines = 0;
  for (int r = 0; r < std::max(1, absl::GetFlag(FLAGS_repeat)); ++r) {
    const double cpu0 = CpuSeconds();
    const Clock::time_point t0 = Clock::now();
    absl::StatusOr<int64_t> got = fn();
    if (!got.ok()) {
      std::fprintf(stderr, "%s: %s\n", what.c_str(), std::string(got.status().message()).c_str());
      return false;
    }
    best_wall = std::min(best_wall, Seconds(t0));
    best_cpu = std::min(best_cpu, CpuSeconds() - cpu0);
    lines = *got;
  }
  Report(what, lines, best_wall, best_cpu);
  return true;
}

int Run() {
  const int64_t n = absl::GetFlag(FLAGS_lines);
  const std::string dir = absl::GetFlag(FLAGS_dir);
  const std::string plain = dir + "/tessera_reader_bench.txt";
  const std::string packed = dir + "/tessera_reader_bench.txt.gz";

  // The data: the CTR demo's synthetic examples, written as Criteo text.
  data::CtrDataOptions o;
  o.vocab_per_slot = 1000000;
  auto ds = data::MakeCtrData(n, o);
  if (!ds.ok()) {
    std::fprintf(stderr, "%s\n", std::string(ds.status().message()).c_str());
    return 1;
  }
  absl::Status written = data::WriteCriteoFile(plain, *ds);
  if (!written.ok()) {
    std::fprintf(stderr, "%s\n", std::string(written.message()).c_str());
    return 1;
  }
  // The same examples in the other formats, parsed alone: csv (the Criteo column names, ids in
  // decimal), multislot, and libsvm (the dense values and the 26 ids as indices of one
  // multi-hot slot).
  {
    const int64_t m = std::min<int64_t>(n, 200000);
    for (data::DataFormat format :
         {data::DataFormat::kCsv, data::DataFormat::kMultiSlot, data::DataFormat::kLibsvm}) {
      data::DataSchema schema;
      schema.format = format;
      if (format == data::DataFormat::kLibsvm) {
        schema.num_sparse = 0;
        schema.num_multi = 1;
      }
      auto parser = data::NewLineParser(schema);
      std::vector<std::string> lines;
      std::string header = "label";
      for (int i = 1; i <= 13; ++i) absl::StrAppend(&header, ",I", i);
      for (int i = 1; i <= 26; ++i) absl::StrAppend(&header, ",C", i);
      for (int64_t i = 0; i < m; ++i) {
        const data::Example& e = ds->examples[static_cast<size_t>(i)];
        std::string line;
        if (format == data::DataFormat::kCsv) {
          line = absl::StrCat(e.label);
          for (float v : e.dense) absl::StrAppend(&line, ",", v);
          for (int64_t id : e.sparse) absl::StrAppend(&line, ",", id);
        } else if (format == data::DataFormat::kMultiSlot) {
          line = absl::StrCat("1 ", e.label, " 13");
          for (float v : e.dense) absl::StrAppend(&line, " ", v);
          for (int64_t id : e.sparse) absl::StrAppend(&line, " 1 ", id);
        } else {
          line = absl::StrCat(e.label);
          for (int d = 0; d < 13; ++d) absl::StrAppend(&line, " ", d, ":", e.dense[d]);
          for (int64_t id : e.sparse) {
            absl::StrAppend(&line, " ", 13 + (static_cast<uint64_t>(id) >> 1), ":1");
          }
        }
        lines.push_back(std::move(line));
      }
      if (!(*parser)->Header(header).ok()) return 1;
      data::Example e;
      if (!Measure(absl::StrCat("parse only, ", data::DataFormatName(format)),
                   [&]() -> absl::StatusOr<int64_t> {
                     for (const std::string& line : lines) {
                       TS_RETURN_IF_ERROR((*parser)->Parse(line, &e));
                     }
                     return m;
                   })) {
        return 1;
      }
    }
  }
  ds->examples.clear();
  ds->examples.shrink_to_fit();
  std::string text;
  {
    std::ifstream in(plain, std::ios::binary);
    text.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  {
    gzFile gz = gzopen(packed.c_str(), "wb6");
    gzwrite(gz, text.data(), static_cast<unsigned>(text.size()));
    gzclose(gz);
  }
  std::printf("%lld lines, %.1f MB plain, %.1f MB gzip\n", static_cast<long long>(n),
              text.size() / 1e6,
              static_cast<double>(std::ifstream(packed, std::ios::ate | std::ios::binary).tellg()) /
                  1e6);

  // Parse only.
  {
    std::vector<absl::string_view> lines = absl::StrSplit(text, '\n', absl::SkipEmpty());
    data::Example e;
    if (!Measure("parse only (ParseCriteoLine)", [&]() -> absl::StatusOr<int64_t> {
          for (absl::string_view line : lines) {
            TS_RETURN_IF_ERROR(
                data::ParseCriteoLine(line, data::kCriteoNumDense, data::kCriteoNumSparse, &e));
          }
          return n;
        })) {
      return 1;
    }
  }
  text.clear();
  text.shrink_to_fit();

  // The floor for gzip: zlib's inflate alone, no line split and no parse.
  Measure("zlib inflate only (no parse), gzip", [&]() -> absl::StatusOr<int64_t> {
    gzFile gz = gzopen(packed.c_str(), "rb");
    gzbuffer(gz, 1 << 18);
    std::vector<char> buffer(1 << 18);
    while (gzread(gz, buffer.data(), static_cast<unsigned>(buffer.size())) > 0) {
    }
    gzclose(gz);
    return n;
  });

  for (const std::string& path : {plain, packed}) {
    const std::string kind = path == plain ? "plain" : "gzip";
    Measure("read + parse, " + kind, [&]() -> absl::StatusOr<int64_t> {
      TS_ASSIGN_OR_RETURN(std::unique_ptr<data::CriteoReader> reader,
                          data::CriteoReader::Open(path));
      data::Example e;
      int64_t got = 0;
      while (true) {
        TS_ASSIGN_OR_RETURN(bool more, reader->Next(&e));
        if (!more) return got;
        ++got;
      }
    });
    for (int64_t shuffle : {int64_t{0}, int64_t{10000}}) {
      Measure(absl::StrCat("stream (shuffle ", shuffle, "), ", kind),
              [&]() -> absl::StatusOr<int64_t> {
                data::ExampleStreamOptions so;
                so.shuffle_buffer = shuffle;
                TS_ASSIGN_OR_RETURN(std::unique_ptr<data::ExampleStream> stream,
                                    data::ExampleStream::Open({data::DataShard{path}}, so));
                std::vector<data::Example> batch;
                int64_t got = 0;
                while (true) {
                  TS_ASSIGN_OR_RETURN(int64_t count, stream->NextBatch(128, &batch));
                  if (count == 0) return got;
                  got += count;
                }
              });
    }
  }

  // Memory while streaming ~50x what the queue and the buffer hold.
  {
    data::ExampleStreamOptions so;
    so.shuffle_buffer = 4096;
    so.queue_examples = 4096;
    auto stream = data::ExampleStream::Open({data::DataShard{plain}}, so);
    std::vector<data::Example> batch;
    int64_t got = 0;
    double early = -1, peak = 0;
    while (true) {
      absl::StatusOr<int64_t> count = (*stream)->NextBatch(128, &batch);
      if (!count.ok() || *count == 0) break;
      got += *count;
      if (early < 0 && got >= n / 20) early = RssMb();
      if (early >= 0 && got % 4096 < 128) peak = std::max(peak, RssMb());
    }
    std::printf(
        "streaming RSS: %.1f MB after %lld lines, peak %.1f MB over the remaining %lld "
        "(queue 4096 + shuffle 4096 examples; %.0fx that many lines read)\n",
        early, static_cast<long long>(n / 20), peak, static_cast<long long>(got - n / 20),
        got / 8192.0);
  }
  std::remove(plain.c_str());
  std::remove(packed.c_str());
  return 0;
}

}  // namespace
}  // namespace tessera

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return tessera::Run();
}
