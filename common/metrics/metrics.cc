#include "common/metrics/metrics.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace tessera {

namespace {

void AtomicAdd(std::atomic<double>* target, double amount) {
  double old = target->load(std::memory_order_relaxed);
  while (!target->compare_exchange_weak(old, old + amount, std::memory_order_relaxed)) {
  }
}

// [a-zA-Z_:][a-zA-Z0-9_:]* for metric names; label names have no ':' and no leading "__".
bool ValidName(const std::string& name, bool label) {
  if (name.empty()) return false;
  if (label && name.size() >= 2 && name[0] == '_' && name[1] == '_') return false;
  for (size_t i = 0; i < name.size(); ++i) {
    char c = name[i];
    bool ok = absl::ascii_isalpha(c) || c == '_' || (!label && c == ':') ||
              (i > 0 && absl::ascii_isdigit(c));
    if (!ok) return false;
  }
  return true;
}

std::string FormatValue(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  if (v == std::floor(v) && std::fabs(v) < 1e15) return absl::StrFormat("%.0f", v);
  for (int precision : {15, 16}) {  // the shortest form that reads back as the same double
    std::string s = absl::StrFormat("%.*g", precision, v);
    if (std::strtod(s.c_str(), nullptr) == v) return s;
  }
  return absl::StrFormat("%.17g", v);
}

std::string EscapeLabelValue(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '"') {
      out += "\\\"";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

std::string EscapeHelp(const std::string& v) {
  std::string out;
  for (char c : v) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out;
}

// "{a="x",b="y"}" (empty when there are no labels); `extra` is appended last (the le label).
std::string FormatLabels(const Labels& labels, const std::string& extra_name = "",
                         const std::string& extra_value = "") {
  if (labels.empty() && extra_name.empty()) return "";
  std::string out = "{";
  bool first = true;
  for (const auto& [k, v] : labels) {
    absl::StrAppend(&out, first ? "" : ",", k, "=\"", EscapeLabelValue(v), "\"");
    first = false;
  }
  if (!extra_name.empty()) {
    absl::StrAppend(&out, first ? "" : ",", extra_name, "=\"", extra_value, "\"");
  }
  return out + "}";
}

}  // namespace

void Counter::Increment(double amount) {
  if (!(amount > 0)) return;  // negative, zero or NaN
  AtomicAdd(&value_, amount);
}

void Gauge::Increment(double amount) { AtomicAdd(&value_, amount); }

Histogram::Histogram(std::vector<double> bounds)
    : bounds_(std::move(bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::Observe(double value) {
  if (std::isnan(value)) return;
  size_t bucket = std::lower_bound(bounds_.begin(), bounds_.end(), value) - bounds_.begin();
  absl::MutexLock lock(&mu_);
  ++counts_[bucket];
  sum_ += value;
  ++count_;
}

Histogram::Snapshot Histogram::Get() const {
  absl::MutexLock lock(&mu_);
  return Snapshot{bounds_, counts_, sum_, count_};
}

std::vector<double> ExponentialBuckets(double start, double factor, int n) {
  std::vector<double> out;
  if (n < 1 || !(start > 0) || !(factor > 1)) return out;
  double b = start;
  for (int i = 0; i < n; ++i, b *= factor) out.push_back(b);
  return out;
}

absl::StatusOr<MetricsRegistry::Series*> MetricsRegistry::FindOrAdd(
    const std::string& name, const std::string& help, Type type, const std::vector<double>& bounds,
    const Labels& labels) {
  if (!ValidName(name, /*label=*/false)) {
    return absl::InvalidArgumentError(
        absl::StrCat("metric name '", name, "' is not [a-zA-Z_:][a-zA-Z0-9_:]*"));
  }
  Labels sorted = labels;
  std::sort(sorted.begin(), sorted.end());
  for (size_t i = 0; i < sorted.size(); ++i) {
    const std::string& label = sorted[i].first;
    if (!ValidName(label, /*label=*/true) || (type == Type::kHistogram && label == "le")) {
      return absl::InvalidArgumentError(
          absl::StrCat("metric ", name, ": label name '", label, "' is not allowed"));
    }
    if (i > 0 && sorted[i - 1].first == label) {
      return absl::InvalidArgumentError(
          absl::StrCat("metric ", name, ": label '", label, "' given twice"));
    }
  }
  auto it = families_.find(name);
  if (it == families_.end()) {
    it = families_.emplace(name, Family{type, help, bounds, {}}).first;
  } else if (it->second.type != type) {
    return absl::InvalidArgumentError(
        absl::StrCat("metric ", name, " already exists with another type"));
  } else if (it->second.bounds != bounds) {
    return absl::InvalidArgumentError(
        absl::StrCat("histogram ", name, " already exists with other bucket bounds"));
  }
  Family& family = it->second;
  auto [sit, inserted] = family.series.try_emplace(sorted);
  Series& series = sit->second;
  if (inserted) {
    switch (type) {
      case Type::kCounter:
        series.counter = std::make_unique<Counter>();
        break;
      case Type::kGauge:
        series.gauge = std::make_unique<Gauge>();
        break;
      case Type::kHistogram:
        series.histogram = std::make_unique<Histogram>(bounds);
        break;
    }
  }
  return &series;
}

absl::StatusOr<Counter*> MetricsRegistry::GetCounter(const std::string& name,
                                                     const std::string& help,
                                                     const Labels& labels) {
  absl::MutexLock lock(&mu_);
  auto series = FindOrAdd(name, help, Type::kCounter, {}, labels);
  if (!series.ok()) return series.status();
  return (*series)->counter.get();
}

absl::StatusOr<Gauge*> MetricsRegistry::GetGauge(const std::string& name, const std::string& help,
                                                 const Labels& labels) {
  absl::MutexLock lock(&mu_);
  auto series = FindOrAdd(name, help, Type::kGauge, {}, labels);
  if (!series.ok()) return series.status();
  return (*series)->gauge.get();
}

absl::StatusOr<Histogram*> MetricsRegistry::GetHistogram(const std::string& name,
                                                         const std::string& help,
                                                         std::vector<double> bounds,
                                                         const Labels& labels) {
  for (size_t i = 0; i < bounds.size(); ++i) {
    if (!std::isfinite(bounds[i]) || (i > 0 && !(bounds[i] > bounds[i - 1]))) {
      return absl::InvalidArgumentError(absl::StrCat(
          "histogram ", name, ": bucket bounds must be finite and strictly ascending (bound ", i,
          " is ", FormatValue(bounds[i]), ")"));
    }
  }
  absl::MutexLock lock(&mu_);
  auto series = FindOrAdd(name, help, Type::kHistogram, bounds, labels);
  if (!series.ok()) return series.status();
  return (*series)->histogram.get();
}

void MetricsRegistry::AddCollector(std::function<void()> collect) {
  absl::MutexLock lock(&collectors_mu_);
  collectors_.push_back(std::move(collect));
}

void MetricsRegistry::Collect() const {
  std::vector<std::function<void()>> collectors;
  {
    absl::MutexLock lock(&collectors_mu_);
    collectors = collectors_;
  }
  for (const auto& collect : collectors) collect();
}

std::string MetricsRegistry::Exposition() const {
  Collect();
  absl::MutexLock lock(&mu_);
  std::string out;
  for (const auto& [name, family] : families_) {
    const char* type = family.type == Type::kCounter ? "counter"
                       : family.type == Type::kGauge ? "gauge"
                                                     : "histogram";
    if (!family.help.empty())
      absl::StrAppend(&out, "# HELP ", name, " ", EscapeHelp(family.help), "\n");
    absl::StrAppend(&out, "# TYPE ", name, " ", type, "\n");
    for (const auto& [labels, series] : family.series) {
      if (series.counter != nullptr) {
        absl::StrAppend(&out, name, FormatLabels(labels), " ", FormatValue(series.counter->Value()),
                        "\n");
      } else if (series.gauge != nullptr) {
        absl::StrAppend(&out, name, FormatLabels(labels), " ", FormatValue(series.gauge->Value()),
                        "\n");
      } else {
        Histogram::Snapshot h = series.histogram->Get();
        uint64_t cumulative = 0;
        for (size_t b = 0; b < h.counts.size(); ++b) {
          cumulative += h.counts[b];
          std::string le = b < h.bounds.size() ? FormatValue(h.bounds[b]) : "+Inf";
          absl::StrAppend(&out, name, "_bucket", FormatLabels(labels, "le", le), " ", cumulative,
                          "\n");
        }
        absl::StrAppend(&out, name, "_sum", FormatLabels(labels), " ", FormatValue(h.sum), "\n");
        absl::StrAppend(&out, name, "_count", FormatLabels(labels), " ", h.count, "\n");
      }
    }
  }
  return out;
}

std::map<std::string, double> MetricsRegistry::Snapshot() const {
  Collect();
  absl::MutexLock lock(&mu_);
  std::map<std::string, double> out;
  for (const auto& [name, family] : families_) {
    for (const auto& [labels, series] : family.series) {
      std::string l = FormatLabels(labels);
      if (series.counter != nullptr) {
        out[name + l] = series.counter->Value();
      } else if (series.gauge != nullptr) {
        out[name + l] = series.gauge->Value();
      } else {
        Histogram::Snapshot h = series.histogram->Get();
        out[name + "_count" + l] = static_cast<double>(h.count);
        out[name + "_sum" + l] = h.sum;
      }
    }
  }
  return out;
}

}  // namespace tessera
