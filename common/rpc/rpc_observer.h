// RpcObserver: an optional hook through which an RPC transport reports every finished call
// (method, status code, latency, message bytes each way). The transports take a plain pointer
// (GrpcServerOptions::observer, GrpcClientOptions::observer; nullptr: nothing is reported) and
// know nothing about metrics; RpcMetrics (rpc_metrics.h) records calls into a MetricsRegistry.
#ifndef TESSERA_COMMON_RPC_RPC_OBSERVER_H_
#define TESSERA_COMMON_RPC_RPC_OBSERVER_H_

#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/time/time.h"

namespace tessera {

// The methods of the pserver service (proto/pserver.proto).
enum class RpcMethod {
  kSend = 0,
  kGet,
  kPrefetch,
  kBarrier,
  kCheckpoint,
  kRegister,
  kSendBatch,
  kGetBatch,
  kPrefetchBatch,
  kSendGetBatch
};
inline constexpr int kNumRpcMethods = 10;

// The metric label of a method: "Send", "Get", "Prefetch", "Barrier", "Checkpoint", "Register",
// "SendBatch", "GetBatch", "PrefetchBatch", "SendGetBatch".
inline const char* RpcMethodLabel(RpcMethod method) {
  switch (method) {
    case RpcMethod::kSend:
      return "Send";
    case RpcMethod::kGet:
      return "Get";
    case RpcMethod::kPrefetch:
      return "Prefetch";
    case RpcMethod::kBarrier:
      return "Barrier";
    case RpcMethod::kCheckpoint:
      return "Checkpoint";
    case RpcMethod::kRegister:
      return "Register";
    case RpcMethod::kSendBatch:
      return "SendBatch";
    case RpcMethod::kGetBatch:
      return "GetBatch";
    case RpcMethod::kPrefetchBatch:
      return "PrefetchBatch";
    case RpcMethod::kSendGetBatch:
      return "SendGetBatch";
  }
  return "Unknown";
}

// The method of a wire method name ("SendVariable", "GetVariable", "Prefetch", "Barrier",
// "Checkpoint", "Register", "SendBatch", "GetBatch", "PrefetchBatch", "SendGetBatch"); false for
// any other name.
inline bool RpcMethodFromWireName(absl::string_view name, RpcMethod* method) {
  if (name == "SendVariable") {
    *method = RpcMethod::kSend;
  } else if (name == "GetVariable") {
    *method = RpcMethod::kGet;
  } else if (name == "Prefetch") {
    *method = RpcMethod::kPrefetch;
  } else if (name == "Barrier") {
    *method = RpcMethod::kBarrier;
  } else if (name == "Checkpoint") {
    *method = RpcMethod::kCheckpoint;
  } else if (name == "Register") {
    *method = RpcMethod::kRegister;
  } else if (name == "SendBatch") {
    *method = RpcMethod::kSendBatch;
  } else if (name == "GetBatch") {
    *method = RpcMethod::kGetBatch;
  } else if (name == "PrefetchBatch") {
    *method = RpcMethod::kPrefetchBatch;
  } else if (name == "SendGetBatch") {
    *method = RpcMethod::kSendGetBatch;
  } else {
    return false;
  }
  return true;
}

// One finished call, seen from the side that reports it. Bytes are those of the serialized
// messages (request and response), not counting gRPC/HTTP2 framing.
struct RpcCallInfo {
  RpcMethod method = RpcMethod::kSend;
  absl::StatusCode code = absl::StatusCode::kOk;
  absl::Duration latency;      // server: arrival to Finish; client: issue to completion
  int64_t bytes_received = 0;  // server: the request; client: the response
  int64_t bytes_sent = 0;      // server: the response; client: the request
};

class RpcObserver {
 public:
  virtual ~RpcObserver() = default;
  // Called once per finished call on an RPC thread. Must be thread-safe and must not block.
  virtual void OnCall(const RpcCallInfo& call) = 0;
};

}  // namespace tessera

#endif  // TESSERA_COMMON_RPC_RPC_OBSERVER_H_
