// Transport security for the pserver gRPC service: optional mutual TLS and a per-job token.
//
// RpcSecurity is what a GrpcServer and every GrpcPServerClient of one job are configured with
// (GrpcServerOptions::security, GrpcClientOptions::security):
//   - TLS (all three PEM strings set): the server presents `cert_pem`/`key_pem` and requires and
//     verifies a client certificate signed by `ca_pem`; clients present the same kind of pair
//     and verify the server's certificate against `ca_pem` and the endpoint's host name (the
//     certificate needs a SAN for the host or IP the endpoints use). Unset: plaintext.
//   - job token (non-empty): clients send it as the `tessera-job-token` metadata of every call;
//     the server compares it in constant time before decoding a request and answers
//     UNAUTHENTICATED (without echoing any token) when it is missing or wrong. Empty: no check.
// The standard gRPC health service shares the server's TLS but does not need the token (it tells
// only whether the pserver is serving).
//
// LoadRpcSecurity() turns the daemons' settings (--tls_cert/--tls_key/--tls_ca file paths,
// --job_token or --job_token_file) into an RpcSecurity, with one-line errors naming the missing
// setting or the unreadable file.
#ifndef TESSERA_COMMON_RPC_GRPC_CREDENTIALS_H_
#define TESSERA_COMMON_RPC_GRPC_CREDENTIALS_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace grpc {
class ChannelCredentials;
class ServerCredentials;
}  // namespace grpc

namespace tessera {

// Metadata key carrying the job token (gRPC metadata keys are lower case).
inline constexpr char kJobTokenMetadataKey[] = "tessera-job-token";

struct RpcSecurity {
  // PEM contents (not paths). TLS is on when cert_pem is set; the server needs all three, a
  // client without cert/key (tests only) presents no certificate.
  std::string cert_pem;
  std::string key_pem;
  std::string ca_pem;
  std::string job_token;  // "" = requests carry no token and the server checks none

  bool tls() const { return !cert_pem.empty() || !ca_pem.empty(); }
};

// Reads the TLS files (all three paths or none) and the job token (`token`, or the first line of
// `token_file`, trailing whitespace removed; not both). InvalidArgument names the missing or
// conflicting setting; NotFound / PermissionDenied name an unreadable or empty file.
absl::StatusOr<RpcSecurity> LoadRpcSecurity(const std::string& tls_cert, const std::string& tls_key,
                                            const std::string& tls_ca, const std::string& token,
                                            const std::string& token_file);

// Server credentials: mutual TLS (client certificate requested, required and verified against
// ca_pem) when security.tls(), else insecure.
std::shared_ptr<grpc::ServerCredentials> MakeServerCredentials(const RpcSecurity& security);
// Channel credentials: TLS with ca_pem as the only root and cert/key as the client's identity
// when security.tls(), else insecure.
std::shared_ptr<grpc::ChannelCredentials> MakeChannelCredentials(const RpcSecurity& security);

// True iff `presented` equals the expected token (constant time in the expected token's
// contents). Always true when `expected` is empty (no token configured).
bool JobTokenMatches(absl::string_view expected, absl::string_view presented);

}  // namespace tessera

#endif  // TESSERA_COMMON_RPC_GRPC_CREDENTIALS_H_
