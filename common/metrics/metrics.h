// Metrics in the Prometheus data model: counters, gauges and histograms, each a family (a
// metric name with a help text) of series told apart by labels, kept in a MetricsRegistry
// object that a daemon owns (there is no global registry) and rendered as Prometheus text
// exposition format 0.0.4 by Exposition(). MetricsServer (metrics_server.h) serves that text
// over HTTP at /metrics.
//
//   MetricsRegistry registry;
//   TS_ASSIGN_OR_RETURN(Counter* sent, registry.GetCounter("tessera_rpc_sent_bytes_total",
//                                                          "Bytes sent.", {{"peer", ep}}));
//   sent->Increment(n);
//
// Thread-safety: everything here is thread-safe. Counter/Gauge/Histogram pointers stay valid
// for the registry's lifetime; updating them never takes the registry's lock.
#ifndef TESSERA_COMMON_METRICS_METRICS_H_
#define TESSERA_COMMON_METRICS_METRICS_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace tessera {

// Label names and values of one series, e.g. {{"role", "pserver"}, {"peer", "10.0.0.1:6170"}}.
// Order does not matter: series are keyed by the sorted labels.
using Labels = std::vector<std::pair<std::string, std::string>>;

// A value that only goes up (requests served, bytes sent).
class Counter {
 public:
  // Adds `amount`; negative or NaN amounts are ignored (a counter never goes down).
  void Increment(double amount = 1);
  double Value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0};
};

// A value that goes up and down (queue length, current loss).
class Gauge {
 public:
  void Set(double value) { value_.store(value, std::memory_order_relaxed); }
  void Increment(double amount = 1);
  void Decrement(double amount = 1) { Increment(-amount); }
  double Value() const { return value_.load(std::memory_order_relaxed); }

 private:
  std::atomic<double> value_{0};
};

// Observations counted into buckets by upper bound (cumulative in the exposition), with their
// sum and count (request latencies, message sizes).
class Histogram {
 public:
  struct Snapshot {
    std::vector<double> bounds;    // upper bounds, ascending, without +Inf
    std::vector<uint64_t> counts;  // per bucket (not cumulative); size bounds.size() + 1
    double sum = 0;
    uint64_t count = 0;
  };
  explicit Histogram(std::vector<double> bounds);
  // Counts `value` into the first bucket whose bound is >= value (+Inf otherwise). NaN is ignored.
  void Observe(double value);
  Snapshot Get() const;

 private:
  const std::vector<double> bounds_;
  mutable absl::Mutex mu_;
  std::vector<uint64_t> counts_ ABSL_GUARDED_BY(mu_);
  double sum_ ABSL_GUARDED_BY(mu_) = 0;
  uint64_t count_ ABSL_GUARDED_BY(mu_) = 0;
};

// Bucket bounds start, start*factor, ... (`n` of them): ExponentialBuckets(0.001, 2, 16) covers
// 1 ms to 33 s. Returns {} for n < 1, start <= 0 or factor <= 1.
std::vector<double> ExponentialBuckets(double start, double factor, int n);

class MetricsRegistry {
 public:
  MetricsRegistry() = default;
  MetricsRegistry(const MetricsRegistry&) = delete;
  MetricsRegistry& operator=(const MetricsRegistry&) = delete;

  // The series of family `name` with `labels`, created on first use (value 0); the same name and
  // labels return the same object. InvalidArgument when the name or a label name is not a valid
  // Prometheus name, a label repeats, or `name` is already a family of another type (or, for a
  // histogram, has other bucket bounds); the message names the metric. `help` of the first call
  // is kept.
  absl::StatusOr<Counter*> GetCounter(const std::string& name, const std::string& help,
                                      const Labels& labels = {});
  absl::StatusOr<Gauge*> GetGauge(const std::string& name, const std::string& help,
                                  const Labels& labels = {});
  // `bounds` must be strictly ascending and finite (+Inf is implicit).
  absl::StatusOr<Histogram*> GetHistogram(const std::string& name, const std::string& help,
                                          std::vector<double> bounds, const Labels& labels = {});

  // Runs `collect` at the start of every Exposition() and Snapshot(), before they read any value,
  // so that metrics mirroring another object's counters are current when read, with no thread
  // polling them. `collect` may call Get*() and must be thread-safe (scrapes may overlap); it
  // and what it reads must outlive the registry's last read.
  void AddCollector(std::function<void()> collect);

  // Every family in Prometheus text exposition format 0.0.4 (families sorted by name, series
  // by labels; "# HELP" and "# TYPE" lines; histograms as _bucket{le=...}, _sum, _count).
  std::string Exposition() const;

  // Current values of counters and gauges, and each histogram's _count and _sum, keyed like the
  // exposition's series: "name" or "name{a=\"x\",b=\"y\"}". Used to log metrics to CSV.
  std::map<std::string, double> Snapshot() const;

 private:
  enum class Type { kCounter, kGauge, kHistogram };
  struct Series {
    std::unique_ptr<Counter> counter;
    std::unique_ptr<Gauge> gauge;
    std::unique_ptr<Histogram> histogram;
  };
  struct Family {
    Type type;
    std::string help;
    std::vector<double> bounds;       // histograms
    std::map<Labels, Series> series;  // keyed by sorted labels
  };
  // The family's series for `labels`, creating both as needed.
  absl::StatusOr<Series*> FindOrAdd(const std::string& name, const std::string& help, Type type,
                                    const std::vector<double>& bounds, const Labels& labels)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Runs every collector (without mu_ held: they add series).
  void Collect() const;

  mutable absl::Mutex mu_;
  std::map<std::string, Family> families_ ABSL_GUARDED_BY(mu_);
  mutable absl::Mutex collectors_mu_;
  std::vector<std::function<void()>> collectors_ ABSL_GUARDED_BY(collectors_mu_);
};

}  // namespace tessera

#endif  // TESSERA_COMMON_METRICS_METRICS_H_
