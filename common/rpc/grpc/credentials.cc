#include "common/rpc/grpc/credentials.h"

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "common/base/secure_compare.h"
#include "grpcpp/security/credentials.h"
#include "grpcpp/security/server_credentials.h"

namespace tessera {

namespace {

// The whole file, or an error naming `what` (the setting) and the path.
absl::StatusOr<std::string> ReadSecretFile(const std::string& what, const std::string& path) {
  errno = 0;
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    const int err = errno;
    std::string why = err != 0 ? std::strerror(err) : "cannot open";
    if (err == EACCES) {
      return absl::PermissionDeniedError(absl::StrCat("--", what, " file '", path, "': ", why));
    }
    return absl::NotFoundError(absl::StrCat("--", what, " file '", path, "': ", why));
  }
  std::ostringstream buf;
  buf << in.rdbuf();
  if (in.bad()) {
    return absl::DataLossError(absl::StrCat("--", what, " file '", path, "': read failed"));
  }
  std::string text = buf.str();
  if (absl::StripAsciiWhitespace(text).empty()) {
    return absl::InvalidArgumentError(absl::StrCat("--", what, " file '", path, "' is empty"));
  }
  return text;
}

// A token travels as a gRPC metadata value, which must be printable ASCII (gRPC aborts the
// process on anything else). The message names the position, never the bytes: a token is a
// secret and error lines end up in logs.
absl::Status CheckTokenBytes(absl::string_view token) {
  for (size_t i = 0; i < token.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(token[i]);
    if (c < 0x20 || c > 0x7e) {
      return absl::InvalidArgumentError(absl::StrCat(
          "byte ", i + 1, " of the token is not printable ASCII (a token must be text, e.g. "
          "head -c 32 /dev/urandom | base64)"));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<RpcSecurity> LoadRpcSecurity(const std::string& tls_cert, const std::string& tls_key,
                                            const std::string& tls_ca, const std::string& token,
                                            const std::string& token_file) {
  RpcSecurity out;
  const bool any_tls = !tls_cert.empty() || !tls_key.empty() || !tls_ca.empty();
  if (any_tls) {
    const char* missing = tls_cert.empty()  ? "tls_cert"
                          : tls_key.empty() ? "tls_key"
                          : tls_ca.empty()  ? "tls_ca"
                                            : nullptr;
    if (missing != nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", missing,
                       " is not set: TLS needs all of --tls_cert, --tls_key and --tls_ca "
                       "(or none of them)"));
    }
    auto cert = ReadSecretFile("tls_cert", tls_cert);
    if (!cert.ok()) return cert.status();
    auto key = ReadSecretFile("tls_key", tls_key);
    if (!key.ok()) return key.status();
    auto ca = ReadSecretFile("tls_ca", tls_ca);
    if (!ca.ok()) return ca.status();
    out.cert_pem = std::move(*cert);
    out.key_pem = std::move(*key);
    out.ca_pem = std::move(*ca);
  }
  if (!token.empty() && !token_file.empty()) {
    return absl::InvalidArgumentError(
        "--job_token and --job_token_file are both set: give one of them");
  }
  if (!token_file.empty()) {
    auto text = ReadSecretFile("job_token_file", token_file);
    if (!text.ok()) return text.status();
    std::string first = text->substr(0, text->find('\n'));
    out.job_token = std::string(absl::StripAsciiWhitespace(first));
    if (out.job_token.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--job_token_file '", token_file, "': its first line is empty"));
    }
  } else {
    out.job_token = token;
  }
  absl::Status printable = CheckTokenBytes(out.job_token);
  if (!printable.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(
        token_file.empty() ? "--job_token" : absl::StrCat("--job_token_file '", token_file, "'"),
        ": ", printable.message()));
  }
  return out;
}

std::shared_ptr<grpc::ServerCredentials> MakeServerCredentials(const RpcSecurity& security) {
  if (!security.tls()) return grpc::InsecureServerCredentials();
  grpc::SslServerCredentialsOptions options(
      GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
  options.pem_root_certs = security.ca_pem;
  options.pem_key_cert_pairs.push_back({security.key_pem, security.cert_pem});
  return grpc::SslServerCredentials(options);
}

std::shared_ptr<grpc::ChannelCredentials> MakeChannelCredentials(const RpcSecurity& security) {
  if (!security.tls()) return grpc::InsecureChannelCredentials();
  grpc::SslCredentialsOptions options;
  options.pem_root_certs = security.ca_pem;
  options.pem_private_key = security.key_pem;
  options.pem_cert_chain = security.cert_pem;
  return grpc::SslCredentials(options);
}

bool JobTokenMatches(absl::string_view expected, absl::string_view presented) {
  if (expected.empty()) return true;
  return ConstantTimeEquals(expected, presented);
}

}  // namespace tessera
