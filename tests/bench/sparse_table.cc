// SparseTable (pserver/sparse_table.h) in process:
//  (a) lookups + updates per second at dim 16 (Adagrad), ids drawn from a Zipf(alpha 1.1)
//      distribution, 4096 ids per batch, with 1 and 2 threads (each thread: Lookup(batch) then
//      ApplyGradients(batch) on one shared table); --tables, --batch, --dim, --optimizer and
//      --vocab give other shapes, e.g. the CTR job's pserver step (52 tables of 10^4 ids, 256
//      ids per table and step, Adam; a step looks up every table, then updates every table):
//        --tables=52 --batch=256 --vocab=10000 --dim=8 --optimizer=adam
//  (c) resident memory per row for 10^7 rows at dim 16 with Adagrad (RSS growth from
//      /proc/self/statm divided by rows), as a ratio to the raw 136 bytes (8 id + 16 * 4 values
//      + 16 * 4 moments).
// Part (b), prefetch + push over gRPC, belongs to the ParameterServer integration.
//
//   bazel build //tests/bench:sparse_table
//   bazel-bin/tests/bench/sparse_table [--part=all|a|c] [--seconds=3] [--repeats=3]
//       [--threads=1,2] [--vocab=100000000] [--rows=10000000] [--export_path=/tmp/t.tbl]
//       [--tables=1] [--batch=4096] [--dim=16] [--optimizer=adagrad] [--remember_lookups=0]
#include "pserver/sparse_table.h"

#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "common/data/synthetic.h"

ABSL_FLAG(std::string, part, "all", "Which part to run: a, c or all.");
ABSL_FLAG(double, seconds, 3.0, "(a) Duration of one timed repeat.");
ABSL_FLAG(int, repeats, 3, "(a) Timed repeats per thread count (the median is reported).");
ABSL_FLAG(std::string, threads, "1,2", "(a) Thread counts to measure.");
ABSL_FLAG(int64_t, vocab, 100000000, "(a) Zipf range: ids are ranks in [0, vocab), scrambled.");
ABSL_FLAG(int, batches, 512,
          "(a) Pre-drawn batches, cycled over by all threads (each from its own offset), so the "
          "table is the same for every thread count.");
ABSL_FLAG(int, tables, 1,
          "(a) Tables; a step looks up one batch in every table, then updates every table (each "
          "table draws its own batches).");
ABSL_FLAG(int, batch, 4096, "(a) Ids per batch (per table and step).");
ABSL_FLAG(int64_t, dim, 16, "(a) Floats per row.");
ABSL_FLAG(std::string, optimizer, "adagrad", "(a) The tables' optimizer: sgd, adagrad or adam.");
ABSL_FLAG(int64_t, rows, 10000000, "(c) Rows to create.");
ABSL_FLAG(std::string, export_path, "",
          "(c) If set, also time Export (values only) and Import of the (c) table to this file.");
ABSL_FLAG(int, shards, 64, "Internal shards of the table.");
ABSL_FLAG(int, remember_lookups, 0,
          "(a) SparseTableOptions::remember_lookups: an update takes the rows of its batch's "
          "lookup (as a pserver with one sync trainer, or async, sets it); 0 = off.");
ABSL_FLAG(bool, mutex_deadlock_detection, true,
          "false: turn off absl::Mutex deadlock detection (Debian's Abseil runs it by default).");

namespace tessera {
namespace {

using Clock = std::chrono::steady_clock;
constexpr int64_t kDim = 16;
constexpr int kBatch = 4096;
constexpr double kRawRowBytes = 8 + kDim * 4 + kDim * 4;  // 136

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// CPU time of the calling thread (less sensitive than wall time to other load on the machine).
double ThreadCpuSeconds() {
  timespec ts;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec + 1e-9 * ts.tv_nsec;
}

// Spreads ranks over all of int64 (a bijection), as real feature ids are.
int64_t Scramble(int64_t rank) {
  return static_cast<int64_t>(static_cast<uint64_t>(rank) * 0x9E3779B97F4A7C15ULL);
}

int64_t ResidentBytes() {
  std::ifstream statm("/proc/self/statm");
  int64_t size = 0, resident = 0;
  statm >> size >> resident;
  return resident * sysconf(_SC_PAGESIZE);
}

std::unique_ptr<SparseTable> NewTable(int64_t dim = kDim, const std::string& optimizer = "adagrad") {
  SparseTableOptions o;
  o.dim = dim;
  o.optimizer = optimizer;
  o.initializer.min = -0.01;
  o.initializer.max = 0.01;
  o.num_shards = absl::GetFlag(FLAGS_shards);
  o.remember_lookups = absl::GetFlag(FLAGS_remember_lookups);
  absl::StatusOr<std::unique_ptr<SparseTable>> t = SparseTable::Create(o);
  if (!t.ok()) {
    std::fprintf(stderr, "%s\n", std::string(t.status().message()).c_str());
    std::exit(1);
  }
  return std::move(t).value();
}

void Check(const absl::Status& s) {
  if (!s.ok()) {
    std::fprintf(stderr, "%s\n", std::string(s.message()).c_str());
    std::exit(1);
  }
}

// (a)
void PartA() {
  std::vector<int> thread_counts;
  for (absl::string_view t : absl::StrSplit(absl::GetFlag(FLAGS_threads), ',')) {
    int n;
    if (!absl::SimpleAtoi(t, &n) || n < 1) {
      std::fprintf(stderr, "--threads: bad count '%s'\n", std::string(t).c_str());
      std::exit(2);
    }
    thread_counts.push_back(n);
  }
  const int num_batches = absl::GetFlag(FLAGS_batches);
  const int64_t vocab = absl::GetFlag(FLAGS_vocab);
  const int num_tables = absl::GetFlag(FLAGS_tables);
  const int batch = absl::GetFlag(FLAGS_batch);
  const int64_t dim = absl::GetFlag(FLAGS_dim);
  const std::string optimizer = absl::GetFlag(FLAGS_optimizer);
  if (num_tables < 1 || batch < 1 || dim < 1 || num_batches < 1) {
    std::fprintf(stderr, "--tables, --batch, --dim and --batches must be >= 1\n");
    std::exit(2);
  }
  // Pre-drawn batches (drawing is not timed): batches[b][t] is table t's ids at step b.
  std::vector<std::vector<std::vector<int64_t>>> batches(
      num_batches, std::vector<std::vector<int64_t>>(num_tables));
  absl::StatusOr<data::ZipfSampler> zipf = data::ZipfSampler::Create(vocab, 1.1, 0);
  Check(zipf.status());
  std::mt19937_64 rng(42);
  size_t distinct_total = 0;
  for (auto& step : batches) {
    for (auto& b : step) {
      b.resize(batch);
      for (int64_t& id : b) id = Scramble(zipf->Sample(rng));
      std::vector<int64_t> sorted = b;
      std::sort(sorted.begin(), sorted.end());
      distinct_total += std::unique(sorted.begin(), sorted.end()) - sorted.begin();
    }
  }
  std::vector<float> grads(static_cast<size_t>(batch) * dim);
  for (float& g : grads) g = std::uniform_real_distribution<float>(-1, 1)(rng);
  const int64_t ids_per_step = static_cast<int64_t>(batch) * num_tables;

  std::printf(
      "(a) %d table(s), dim %lld, %s, Zipf alpha 1.1 over %lld ids, %d ids per batch "
      "(%.0f distinct per batch on average), %d shards, %d pre-drawn steps\n",
      num_tables, static_cast<long long>(dim), optimizer.c_str(), static_cast<long long>(vocab),
      batch, static_cast<double>(distinct_total) / (num_batches * num_tables),
      absl::GetFlag(FLAGS_shards), num_batches);
  for (int threads : thread_counts) {
    std::vector<std::unique_ptr<SparseTable>> tables;
    for (int t = 0; t < num_tables; ++t) tables.push_back(NewTable(dim, optimizer));
    // Warm-up: one pass over the batches creates the rows they touch.
    {
      std::vector<float> out(static_cast<size_t>(batch) * dim);
      for (const auto& step : batches) {
        for (int t = 0; t < num_tables; ++t) Check(tables[t]->Lookup(step[t], out.data()));
      }
    }
    std::vector<double> rates;
    for (int rep = 0; rep < absl::GetFlag(FLAGS_repeats); ++rep) {
      std::atomic<bool> stop{false};
      std::vector<int64_t> done(threads, 0);
      std::vector<double> lookup_s(threads, 0), update_s(threads, 0), cpu_s(threads, 0);
      std::vector<std::thread> workers;
      const Clock::time_point start = Clock::now();
      for (int w = 0; w < threads; ++w) {
        workers.emplace_back([&, w] {
          std::vector<float> out(static_cast<size_t>(batch) * dim);
          int64_t step = 1;
          const double cpu0 = ThreadCpuSeconds();
          while (!stop.load(std::memory_order_relaxed)) {
            const auto& ids = batches[(w * num_batches / threads + step) % num_batches];
            const Clock::time_point t0 = Clock::now();
            for (int t = 0; t < num_tables; ++t) Check(tables[t]->Lookup(ids[t], out.data()));
            const Clock::time_point t1 = Clock::now();
            for (int t = 0; t < num_tables; ++t) {
              Check(tables[t]->ApplyGradients(ids[t], grads.data(), 0.01f, step));
            }
            const Clock::time_point t2 = Clock::now();
            lookup_s[w] += Seconds(t0, t1);
            update_s[w] += Seconds(t1, t2);
            ++done[w];
            ++step;
          }
          cpu_s[w] = ThreadCpuSeconds() - cpu0;
        });
      }
      std::this_thread::sleep_for(std::chrono::duration<double>(absl::GetFlag(FLAGS_seconds)));
      stop = true;
      for (auto& w : workers) w.join();
      const double elapsed = Seconds(start, Clock::now());
      int64_t total = 0;
      double ls = 0, us = 0, cs = 0;
      for (int w = 0; w < threads; ++w) {
        total += done[w];
        ls += lookup_s[w];
        us += update_s[w];
        cs += cpu_s[w];
      }
      const double rate = static_cast<double>(total) * ids_per_step / elapsed;
      rates.push_back(rate);
      std::printf(
          "  threads %d repeat %d: %.2f M ids/s (each id looked up and updated once), "
          "%.2f M ids per CPU-second; per step (all tables): Lookup %.0f us, ApplyGradients "
          "%.0f us (wall)\n",
          threads, rep, rate / 1e6, static_cast<double>(total) * ids_per_step / cs / 1e6,
          1e6 * ls / total, 1e6 * us / total);
    }
    std::sort(rates.begin(), rates.end());
    int64_t rows = 0;
    double bytes = 0;
    for (const auto& table : tables) {
      rows += table->Size();
      bytes += static_cast<double>(table->MemoryBytes());
    }
    std::printf(
        "(a) threads %d: median %.2f M ids/s (min %.2f, max %.2f), table rows %lld, "
        "%.1f MB\n",
        threads, rates[rates.size() / 2] / 1e6, rates.front() / 1e6, rates.back() / 1e6,
        static_cast<long long>(rows), bytes / 1e6);
    std::fflush(stdout);
  }
}

// (c)
void PartC() {
  const int64_t rows = absl::GetFlag(FLAGS_rows);
  std::unique_ptr<SparseTable> table = NewTable();
  std::vector<int64_t> ids(kBatch);
  std::vector<float> out(kBatch * kDim);
  const int64_t rss0 = ResidentBytes();
  const Clock::time_point start = Clock::now();
  const std::clock_t cpu0 = std::clock();
  for (int64_t first = 0; first < rows; first += kBatch) {
    const int64_t n = std::min<int64_t>(kBatch, rows - first);
    ids.resize(n);
    for (int64_t i = 0; i < n; ++i) ids[i] = Scramble(first + i);
    Check(table->Lookup(ids, out.data()));
  }
  const double fill_s = Seconds(start, Clock::now());
  const double fill_cpu_s = static_cast<double>(std::clock() - cpu0) / CLOCKS_PER_SEC;
  const int64_t rss1 = ResidentBytes();
  const double per_row = static_cast<double>(rss1 - rss0) / rows;
  std::printf(
      "(c) %lld rows, dim %lld, adagrad, %d shards: RSS +%.1f MB = %.1f B/row = %.3fx "
      "raw %.0f B; MemoryBytes %.1f B/row; created at %.2f M rows/s (%.2f M per CPU-second)\n",
      static_cast<long long>(table->Size()), static_cast<long long>(kDim),
      absl::GetFlag(FLAGS_shards), (rss1 - rss0) / 1e6, per_row, per_row / kRawRowBytes,
      kRawRowBytes, static_cast<double>(table->MemoryBytes()) / rows, rows / fill_s / 1e6,
      rows / fill_cpu_s / 1e6);
  std::fflush(stdout);

  const std::string path = absl::GetFlag(FLAGS_export_path);
  if (path.empty()) return;
  Clock::time_point t0 = Clock::now();
  absl::StatusOr<int64_t> n = table->Export(path, {});
  Check(n.status());
  const double export_s = Seconds(t0, Clock::now());
  table.reset();
  std::unique_ptr<SparseTable> fresh = NewTable();
  t0 = Clock::now();
  absl::StatusOr<int64_t> m = fresh->Import(path);
  Check(m.status());
  const double import_s = Seconds(t0, Clock::now());
  std::printf(
      "(c) Export %lld rows (values only, fsync'd) %.2f s = %.2f M rows/s; Import "
      "(validate + load) %.2f s = %.2f M rows/s\n",
      static_cast<long long>(*n), export_s, *n / export_s / 1e6, import_s, *m / import_s / 1e6);
  ::unlink(path.c_str());
}

}  // namespace
}  // namespace tessera

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  if (!absl::GetFlag(FLAGS_mutex_deadlock_detection)) {
    absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  }
  const std::string part = absl::GetFlag(FLAGS_part);
  if (part != "all" && part != "a" && part != "c") {
    std::fprintf(stderr, "--part must be all, a or c, not '%s'\n", part.c_str());
    return 2;
  }
  // (c) first: its RSS baseline must not include memory freed by (a) and kept by malloc.
  if (part == "all" || part == "c") tessera::PartC();
  if (part == "all" || part == "a") tessera::PartA();
  return 0;
}
