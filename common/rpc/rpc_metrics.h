// RpcMetrics: an RpcObserver that records every call into a MetricsRegistry, as
//   tessera_rpc_latency_seconds{side,method}        histogram, 50 us .. 10 s (RpcLatencyBuckets)
//   tessera_rpc_requests_total{side,method,code}    finished calls by status code ("OK", ...)
//   tessera_rpc_errors_total{side,method,code}      the non-OK ones
//   tessera_rpc_received_bytes_total{side,method}   message bytes in
//   tessera_rpc_sent_bytes_total{side,method}       message bytes out
// where side is "server" or "client", method one of Send, Get, Prefetch, Barrier, Checkpoint,
// plus the extra labels given to Create() (e.g. the endpoint). A daemon creates one per side and
// passes it to its transport; Totals() feeds the pserver's per-interval stats line.
//
// Thread-safe; OnCall never takes the registry's lock after the first call with a given code.
#ifndef TESSERA_COMMON_RPC_RPC_METRICS_H_
#define TESSERA_COMMON_RPC_RPC_METRICS_H_

#include <array>
#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "common/metrics/metrics.h"
#include "common/rpc/rpc_observer.h"

namespace tessera {

enum class RpcSide { kServer, kClient };

// Bucket bounds (seconds) for RPC latencies and barrier waits: 50 us, 100 us, 250 us, 500 us,
// 1 ms, ... 5 s, 10 s (a 1-2.5-5 series).
std::vector<double> RpcLatencyBuckets();

// Cumulative counts over all methods since the RpcMetrics was created.
struct RpcTotals {
  int64_t requests = 0;
  int64_t errors = 0;
  int64_t bytes_received = 0;
  int64_t bytes_sent = 0;
};

class RpcMetrics : public RpcObserver {
 public:
  // Registers the families in `registry`, which must outlive the returned object. Fails
  // (InvalidArgument) when a label name of `labels` is invalid or clashes with side/method/code.
  static absl::StatusOr<std::unique_ptr<RpcMetrics>> Create(MetricsRegistry* registry, RpcSide side,
                                                            Labels labels = {});

  void OnCall(const RpcCallInfo& call) override;
  RpcTotals Totals() const;

 private:
  static constexpr int kNumCodes = 17;  // absl::StatusCode 0..16
  struct PerMethod {
    Histogram* latency = nullptr;
    Counter* received = nullptr;
    Counter* sent = nullptr;
    std::array<std::atomic<Counter*>, kNumCodes> requests{};
    std::array<std::atomic<Counter*>, kNumCodes> errors{};
  };
  RpcMetrics(MetricsRegistry* registry, Labels labels) : registry_(registry), labels_(labels) {}
  // The counter of `family` for (method, code), created on first use.
  Counter* CodeCounter(std::atomic<Counter*>* slot, const char* family, const char* help,
                       RpcMethod method, absl::StatusCode code);

  MetricsRegistry* registry_;
  const Labels labels_;  // side + the caller's labels
  std::array<PerMethod, kNumRpcMethods> methods_;
  std::atomic<int64_t> requests_{0}, errors_{0}, bytes_received_{0}, bytes_sent_{0};
};

}  // namespace tessera

#endif  // TESSERA_COMMON_RPC_RPC_METRICS_H_
