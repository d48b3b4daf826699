// Status helpers used across Tessera. Every API boundary returns absl::Status or
// absl::StatusOr<T>; these macros keep the propagation short.
#ifndef TESSERA_COMMON_BASE_STATUS_H_
#define TESSERA_COMMON_BASE_STATUS_H_

#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/cord.h"
#include "absl/strings/string_view.h"

namespace tessera {

// An error's detail for a verbose log, carried beside its one-line message as a payload (e.g.
// the failed op in full, with every input: common/framework/executor.h). The daemons log it with
// --verbose.
inline constexpr absl::string_view kErrorDetailPayload = "type.tessera/error_detail";

// The detail of `error`, or "" when it carries none.
inline std::string ErrorDetail(const absl::Status& error) {
  auto detail = error.GetPayload(kErrorDetailPayload);  // an absl::optional<absl::Cord>
  return detail.has_value() ? std::string(*detail) : std::string();
}

}  // namespace tessera

#define TS_CONCAT_IMPL(a, b) a##b
#define TS_CONCAT(a, b) TS_CONCAT_IMPL(a, b)

// Returns from the current function if `expr` (an absl::Status) is not OK.
#define TS_RETURN_IF_ERROR(expr)                 \
  do {                                           \
    ::absl::Status _ts_status = (expr);          \
    if (!_ts_status.ok()) return _ts_status;     \
  } while (0)

// `lhs = value of expr` where expr is an absl::StatusOr<T>; returns its status on error.
#define TS_ASSIGN_OR_RETURN(lhs, expr) \
  TS_ASSIGN_OR_RETURN_IMPL(TS_CONCAT(_ts_statusor_, __LINE__), lhs, expr)
#define TS_ASSIGN_OR_RETURN_IMPL(tmp, lhs, expr) \
  auto tmp = (expr);                             \
  if (!tmp.ok()) return tmp.status();            \
  lhs = std::move(tmp).value()

#endif  // TESSERA_COMMON_BASE_STATUS_H_
