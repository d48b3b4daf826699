// Strings from outside (request fields, program files) are echoed in errors and logs; one with
// a control character (a newline...) would split or forge lines there, and no program declares
// such a name. These checks refuse them with the value shown escaped, so every error stays one
// line.
#ifndef TESSERA_COMMON_BASE_PRINTABLE_H_
#define TESSERA_COMMON_BASE_PRINTABLE_H_

#include <algorithm>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace tessera {

inline bool HasControlChar(absl::string_view s) {
  return std::any_of(s.begin(), s.end(),
                     [](char c) { return static_cast<unsigned char>(c) < 0x20 || c == 0x7f; });
}

// INVALID_ARGUMENT `<what> "<value, escaped, at most 80 bytes>" contains a control character`
// when `value` holds one; OK otherwise.
inline absl::Status CheckPrintable(absl::string_view what, absl::string_view value) {
  if (!HasControlChar(value)) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(what, " \"", absl::CHexEscape(value.substr(0, 80)),
                                                 "\" contains a control character"));
}

}  // namespace tessera

#endif  // TESSERA_COMMON_BASE_PRINTABLE_H_
