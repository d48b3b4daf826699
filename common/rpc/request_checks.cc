#include "common/rpc/request_checks.h"

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "common/base/printable.h"

namespace tessera {

namespace {
// A name as echoed in a refusal: escaped and cut, so that the message stays one line whatever
// the request held (these checks may run before the name's own).
std::string Shown(absl::string_view name) { return absl::CHexEscape(name.substr(0, 80)); }
}  // namespace

absl::Status CheckRequestMeta(const RequestMeta& meta) {
  absl::Status printable = CheckPrintable("job id", meta.job_id);
  if (!printable.ok()) return printable;
  if (meta.trainer_id < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("request header: trainer_id ", meta.trainer_id, " is negative"));
  }
  if (meta.step < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("request header: step ", meta.step, " is negative"));
  }
  return absl::OkStatus();
}

absl::Status CheckRequestName(absl::string_view what, absl::string_view name) {
  if (name.empty()) return absl::InvalidArgumentError(absl::StrCat(what, " is empty"));
  return CheckPrintable(what, name);
}

absl::StatusOr<ByteRange> ResolveByteRange(absl::string_view name, int64_t offset, int64_t length,
                                           int64_t total) {
  // Each comparison keeps both sides in [0, total]: `total - offset` is computed only once
  // 0 <= offset <= total holds, and `length` is compared against it instead of adding.
  if (offset < 0 || length < 0 || total < 0 || offset > total ||
      (length != 0 && length > total - offset)) {
    return absl::InvalidArgumentError(absl::StrCat("byte range [", offset, ", +", length,
                                                   ") is outside variable ", Shown(name), " of ",
                                                   total, " bytes"));
  }
  return ByteRange{offset, length == 0 ? total - offset : length};
}

absl::Status CheckJobFields(const JobFields& fields) {
  constexpr size_t kMaxFields = 64, kMaxBytes = 1024;
  if (fields.size() > kMaxFields) {
    return absl::InvalidArgumentError(
        absl::StrCat("job handshake has ", fields.size(), " fields (at most ", kMaxFields, ")"));
  }
  for (const auto& [name, value] : fields) {
    if (name.size() > kMaxBytes || value.size() > kMaxBytes) {
      return absl::InvalidArgumentError(
          absl::StrCat("job handshake field ", Shown(name.substr(0, 64)), " is over ", kMaxBytes,
                       " bytes"));
    }
    absl::Status s = CheckRequestName("job handshake field name", name);
    if (s.ok() && !value.empty()) s = CheckPrintable("job handshake field value", value);
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status CheckPrefetchIds(absl::string_view table, size_t id_bytes) {
  if (id_bytes % sizeof(int64_t) == 0) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat("prefetch of ", Shown(table), ": ids field has ",
                                                 id_bytes, " bytes, not a multiple of 8"));
}

absl::Status CheckIdsOfTable(absl::string_view table, int index, int32_t ids_of_table,
                             size_t id_bytes) {
  if (ids_of_table == 0 || (ids_of_table >= 1 && ids_of_table <= index && id_bytes == 0)) {
    return absl::OkStatus();
  }
  return absl::InvalidArgumentError(absl::StrCat("prefetch of ", Shown(table), ": ids_of_table ",
                                                 ids_of_table, " must name an earlier table (1..",
                                                 index, ") and come without ids of its own"));
}

absl::Status CheckAbortReason(absl::string_view reason) {
  if (reason.size() > kMaxAbortReasonBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("abort reason of ", reason.size(), " bytes exceeds ", kMaxAbortReasonBytes));
  }
  return CheckPrintable("abort reason", reason);
}

}  // namespace tessera
