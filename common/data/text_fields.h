// Helpers the text-format parsers (criteo.cc, formats.cc) share: the numbers of a field, with
// exactly what absl accepts (absl::SimpleAtoi / SimpleAtod) but std::from_chars's speed on the
// common case, and how a bad field is quoted in an error. Internal to common/data.
#ifndef TESSERA_COMMON_DATA_TEXT_FIELDS_H_
#define TESSERA_COMMON_DATA_TEXT_FIELDS_H_

#include <charconv>
#include <cmath>
#include <cstdint>
#include <string>
#include <system_error>

#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace tessera {
namespace data {
namespace text_fields {

// absl::SimpleAtoi's value for an int64: std::from_chars when it takes the whole text, absl for
// anything else (spaces, '+').
inline bool ParseInt64(absl::string_view text, int64_t* out) {
  const std::from_chars_result r = std::from_chars(text.data(), text.data() + text.size(), *out);
  if (r.ec == std::errc() && r.ptr == text.data() + text.size()) return true;
  return absl::SimpleAtoi(text, out);
}

// absl::SimpleAtod's value, likewise (absl also takes spaces, '+' and hex floats).
inline bool ParseDouble(absl::string_view text, double* out) {
  const std::from_chars_result r = std::from_chars(text.data(), text.data() + text.size(), *out);
  if (r.ec == std::errc() && r.ptr == text.data() + text.size()) return true;
  return absl::SimpleAtod(text, out);
}

// A finite decimal number that fits a float ("" -> 0 when `empty_is_zero`, else refused).
inline bool ParseFinite(absl::string_view text, bool empty_is_zero, float* out) {
  if (text.empty()) {
    *out = 0;
    return empty_is_zero;
  }
  double v = 0;
  if (!ParseDouble(text, &v) || !std::isfinite(v) || std::fabs(v) > 3.4e38) return false;
  *out = static_cast<float>(v);
  return true;
}

// The bad text, escaped and shortened so that a message stays one readable line.
inline std::string Quote(absl::string_view text) {
  constexpr size_t kMax = 60;
  const bool cut = text.size() > kMax;
  return absl::StrCat("'", absl::CHexEscape(text.substr(0, kMax)), cut ? "...'" : "'");
}

}  // namespace text_fields
}  // namespace data
}  // namespace tessera

#endif  // TESSERA_COMMON_DATA_TEXT_FIELDS_H_
