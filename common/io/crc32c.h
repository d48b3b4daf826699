// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), as in iSCSI / ext4 / leveldb. Debian's
// Abseil 20220623 has no absl/crc, so this is a small table-driven (slicing-by-8) version.
#ifndef TESSERA_COMMON_IO_CRC32C_H_
#define TESSERA_COMMON_IO_CRC32C_H_

#include <cstddef>
#include <cstdint>

#include "absl/strings/string_view.h"

namespace tessera {
namespace io {

// Extends `crc` (the CRC-32C of some prefix, 0 for none) with `n` bytes at `data`.
uint32_t Crc32cExtend(uint32_t crc, const void* data, size_t n);
inline uint32_t Crc32c(absl::string_view bytes) {
  return Crc32cExtend(0, bytes.data(), bytes.size());
}

}  // namespace io
}  // namespace tessera

#endif  // TESSERA_COMMON_IO_CRC32C_H_
