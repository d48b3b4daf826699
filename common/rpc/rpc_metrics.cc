#include "common/rpc/rpc_metrics.h"

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"

namespace tessera {

namespace {

constexpr char kRequests[] = "tessera_rpc_requests_total";
constexpr char kRequestsHelp[] = "Finished RPCs by method and status code.";
constexpr char kErrors[] = "tessera_rpc_errors_total";
constexpr char kErrorsHelp[] = "Failed RPCs (status code other than OK) by method and code.";

Labels With(Labels labels, const std::string& name, const std::string& value) {
  labels.emplace_back(name, value);
  return labels;
}

}  // namespace

std::vector<double> RpcLatencyBuckets() {
  return {50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3, 25e-3,
          50e-3, 100e-3, 250e-3, 500e-3, 1,    2.5,    5,    10};
}

absl::StatusOr<std::unique_ptr<RpcMetrics>> RpcMetrics::Create(MetricsRegistry* registry,
                                                               RpcSide side, Labels labels) {
  for (const auto& [name, value] : labels) {
    if (name == "side" || name == "method" || name == "code") {
      return absl::InvalidArgumentError(
          absl::StrCat("RPC metrics: label '", name, "' is set by RpcMetrics itself"));
    }
  }
  labels.emplace_back("side", side == RpcSide::kServer ? "server" : "client");
  std::unique_ptr<RpcMetrics> m(new RpcMetrics(registry, labels));
  for (int i = 0; i < kNumRpcMethods; ++i) {
    Labels l = With(labels, "method", RpcMethodLabel(static_cast<RpcMethod>(i)));
    PerMethod& pm = m->methods_[i];
    auto latency = registry->GetHistogram(
        "tessera_rpc_latency_seconds",
        "RPC latency by method (server: arrival to response; client: issue to completion).",
        RpcLatencyBuckets(), l);
    if (!latency.ok()) return latency.status();
    pm.latency = *latency;
    auto received = registry->GetCounter("tessera_rpc_received_bytes_total",
                                         "Message bytes received, by method.", l);
    if (!received.ok()) return received.status();
    pm.received = *received;
    auto sent =
        registry->GetCounter("tessera_rpc_sent_bytes_total", "Message bytes sent, by method.", l);
    if (!sent.ok()) return sent.status();
    pm.sent = *sent;
    // The OK series exist from the start so that scrapes see every method at 0.
    auto ok = registry->GetCounter(kRequests, kRequestsHelp, With(l, "code", "OK"));
    if (!ok.ok()) return ok.status();
    pm.requests[0].store(*ok);
  }
  return m;
}

Counter* RpcMetrics::CodeCounter(std::atomic<Counter*>* slot, const char* family, const char* help,
                                 RpcMethod method, absl::StatusCode code) {
  Counter* c = slot->load(std::memory_order_acquire);
  if (c != nullptr) return c;
  Labels l =
      With(With(labels_, "method", RpcMethodLabel(method)), "code", absl::StatusCodeToString(code));
  auto created = registry_->GetCounter(family, help, l);  // the same object on a race
  if (!created.ok()) return nullptr;
  slot->store(*created, std::memory_order_release);
  return *created;
}

void RpcMetrics::OnCall(const RpcCallInfo& call) {
  int m = static_cast<int>(call.method);
  if (m < 0 || m >= kNumRpcMethods) return;
  PerMethod& pm = methods_[m];
  int code = static_cast<int>(call.code);
  if (code < 0 || code >= kNumCodes) code = static_cast<int>(absl::StatusCode::kUnknown);
  absl::StatusCode status = static_cast<absl::StatusCode>(code);
  pm.latency->Observe(absl::ToDoubleSeconds(call.latency));
  pm.received->Increment(static_cast<double>(call.bytes_received));
  pm.sent->Increment(static_cast<double>(call.bytes_sent));
  if (Counter* c = CodeCounter(&pm.requests[code], kRequests, kRequestsHelp, call.method, status)) {
    c->Increment();
  }
  requests_.fetch_add(1, std::memory_order_relaxed);
  if (status != absl::StatusCode::kOk) {
    if (Counter* c = CodeCounter(&pm.errors[code], kErrors, kErrorsHelp, call.method, status)) {
      c->Increment();
    }
    errors_.fetch_add(1, std::memory_order_relaxed);
  }
  bytes_received_.fetch_add(call.bytes_received, std::memory_order_relaxed);
  bytes_sent_.fetch_add(call.bytes_sent, std::memory_order_relaxed);
}

RpcTotals RpcMetrics::Totals() const {
  RpcTotals t;
  t.requests = requests_.load(std::memory_order_relaxed);
  t.errors = errors_.load(std::memory_order_relaxed);
  t.bytes_received = bytes_received_.load(std::memory_order_relaxed);
  t.bytes_sent = bytes_sent_.load(std::memory_order_relaxed);
  return t;
}

}  // namespace tessera
