// Checks on the fields of a pserver request that every transport applies before (or, for a
// byte range, right after) the RequestHandler sees the request: the gRPC server
// (common/rpc/grpc/grpc_server.cc) and the in-process client (common/rpc/inproc/) call the same
// functions, so a test over either covers them. Every check is exact for any int64 input: no
// arithmetic here can overflow, whatever a peer sends. Refusals are INVALID_ARGUMENT, one line,
// naming the field and its value.
#ifndef TESSERA_COMMON_RPC_REQUEST_CHECKS_H_
#define TESSERA_COMMON_RPC_REQUEST_CHECKS_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/rpc/rpc.h"

namespace tessera {

// The header common to all requests: a printable job id (it is echoed in refusals), a
// non-negative trainer id and step.
absl::Status CheckRequestMeta(const RequestMeta& meta);

// A variable or table name from a request: non-empty and printable.
absl::Status CheckRequestName(absl::string_view what, absl::string_view name);

// A byte range of a dense variable: [offset, offset + length).
struct ByteRange {
  int64_t offset = 0;
  int64_t length = 0;
};

// The range a GetVariable{offset, length} asks of variable `name` of `total` bytes (length 0:
// from offset to the end). Refused unless 0 <= offset <= total and offset + length <= total,
// evaluated without overflow (offset = 2^63-1 is refused, not wrapped).
absl::StatusOr<ByteRange> ResolveByteRange(absl::string_view name, int64_t offset, int64_t length,
                                           int64_t total);

// The fields of a job handshake: at most 64, each name and value printable and at most 1024
// bytes (names non-empty).
absl::Status CheckJobFields(const JobFields& fields);

// The reason an ABORT carries: printable, at most kMaxAbortReasonBytes bytes.
inline constexpr size_t kMaxAbortReasonBytes = 1024;
absl::Status CheckAbortReason(absl::string_view reason);

// The ids field of a Prefetch of `table`: a whole number of little-endian int64 ids.
absl::Status CheckPrefetchIds(absl::string_view table, size_t id_bytes);

// PrefetchBatchRequest.Table.ids_of_table of the table at 0-based `index`: 0, or 1 + the index
// of an earlier table (1..index) when the table comes without ids of its own.
absl::Status CheckIdsOfTable(absl::string_view table, int index, int32_t ids_of_table,
                             size_t id_bytes);

}  // namespace tessera

#endif  // TESSERA_COMMON_RPC_REQUEST_CHECKS_H_
