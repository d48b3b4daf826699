// GrpcServer: serves the PServer gRPC service (proto/pserver.proto) for a RequestHandler, plus
// the standard gRPC health service.
//
// Lifecycle: construct, Start() (binds; fails naming the address if it cannot), then requests
// flow to the handler on gRPC's callback threads, which only decode, dispatch and encode.
// Shutdown() stops accepting and waits (bounded) for in-flight calls; Wait() blocks until
// Shutdown() has completed. Thread-safe.
#ifndef TESSERA_COMMON_RPC_GRPC_GRPC_SERVER_H_
#define TESSERA_COMMON_RPC_GRPC_GRPC_SERVER_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "common/rpc/grpc/credentials.h"
#include "common/rpc/rpc_observer.h"
#include "common/rpc/server.h"

namespace grpc {
class Server;
}  // namespace grpc

namespace tessera {

struct GrpcServerOptions {
  std::string address = "127.0.0.1:0";  // host:port; port 0 picks a free port
  int64_t max_message_bytes = int64_t{1} << 30;
  absl::Duration shutdown_grace = absl::Seconds(5);
  // Mutual TLS and the job token (see credentials.h); default: plaintext, no token.
  RpcSecurity security;
  // Told about every finished PServer call (may be null); must outlive the server.
  RpcObserver* observer = nullptr;
};

class GrpcServer {
 public:
  // `handler` must outlive the server.
  GrpcServer(GrpcServerOptions options, RequestHandler* handler);
  ~GrpcServer();

  absl::Status Start();
  // The bound port (after Start()).
  int port() const { return port_; }
  // PServer requests refused for a missing or wrong job token (after Start()).
  int64_t unauthenticated_requests() const;
  void Shutdown();
  void Wait();

 private:
  class Service;
  GrpcServerOptions options_;
  RequestHandler* handler_;
  std::unique_ptr<Service> service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
};

}  // namespace tessera

#endif  // TESSERA_COMMON_RPC_GRPC_GRPC_SERVER_H_
