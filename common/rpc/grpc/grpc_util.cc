#include "common/rpc/grpc/grpc_util.h"

#include "absl/strings/str_cat.h"

namespace tessera {

absl::Status FromGrpcStatus(const grpc::Status& s, absl::string_view endpoint,
                            absl::string_view method) {
  if (s.ok()) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(s.error_code()),
                      absl::StrCat("pserver ", endpoint, " ", method, ": ", s.error_message()));
}

grpc::Status ToGrpcStatus(const absl::Status& s) {
  if (s.ok()) return grpc::Status::OK;
  return grpc::Status(static_cast<grpc::StatusCode>(s.code()), std::string(s.message()));
}

}  // namespace tessera
