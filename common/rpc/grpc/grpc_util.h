// The one place where gRPC and absl statuses are converted.
#ifndef TESSERA_COMMON_RPC_GRPC_GRPC_UTIL_H_
#define TESSERA_COMMON_RPC_GRPC_GRPC_UTIL_H_

#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "grpcpp/support/status.h"

namespace tessera {

// A client-side status: same code (transport failures stay UNAVAILABLE, which callers may
// retry), message prefixed with the endpoint and method, e.g.
// "pserver 127.0.0.1:6170 GetVariable: failed to connect to all addresses".
absl::Status FromGrpcStatus(const grpc::Status& s, absl::string_view endpoint,
                            absl::string_view method);
// A server-side status to return to the client.
grpc::Status ToGrpcStatus(const absl::Status& s);

}  // namespace tessera

#endif  // TESSERA_COMMON_RPC_GRPC_GRPC_UTIL_H_
