// Comparison of secrets (job tokens) whose running time does not depend on where the values
// differ, so a peer cannot learn a secret byte by byte from response times.
#ifndef TESSERA_COMMON_BASE_SECURE_COMPARE_H_
#define TESSERA_COMMON_BASE_SECURE_COMPARE_H_

#include <cstddef>

#include "absl/strings/string_view.h"

namespace tessera {

// True iff `expected` == `presented`. The time taken depends only on presented.size() (the
// peer's own input), never on the contents of `expected` or on the first differing byte.
inline bool ConstantTimeEquals(absl::string_view expected, absl::string_view presented) {
  volatile unsigned char diff = expected.size() == presented.size() ? 0 : 1;
  if (expected.empty()) return presented.empty();
  for (size_t i = 0; i < presented.size(); ++i) {
    diff |= static_cast<unsigned char>(presented[i]) ^
            static_cast<unsigned char>(expected[i % expected.size()]);
  }
  return diff == 0;
}

}  // namespace tessera

#endif  // TESSERA_COMMON_BASE_SECURE_COMPARE_H_
