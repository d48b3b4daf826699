// Gradient compression for collective mode: the options and the local (communication-free)
// halves of sparsification — choosing which entries of a gradient a rank sends and turning the
// (index, value) pairs of every rank back into a dense sum. reducer.h does the communication.
#ifndef TESSERA_COMMON_COLLECTIVE_COMPRESSION_H_
#define TESSERA_COMMON_COLLECTIVE_COMPRESSION_H_

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"

namespace tessera {
namespace collective {

enum class Compression {
  kNone,       // dense all-reduce in the gradient's own type
  kFp16,       // dense all-reduce of fp16 values (half the bytes; ~3 significant digits)
  kTopK,       // each rank sends its ceil(topk_fraction * n) largest-magnitude entries
  kThreshold,  // each rank sends the entries with |value| >= threshold
};

std::string CompressionName(Compression c);

struct CompressionOptions {
  Compression kind = Compression::kNone;
  // kTopK: fraction of the entries each rank sends, in (0, 1]; at least one entry is sent.
  double topk_fraction = 0.01;
  // kThreshold: magnitude at or above which an entry is sent (>= 0).
  double threshold = 1e-3;
};

// InvalidArgument naming the bad field.
absl::Status ValidateCompression(const CompressionOptions& options);

// Number of entries top-k sends for a buffer of n entries: min(n, max(1, ceil(fraction * n))),
// 0 for n = 0.
size_t TopKCount(size_t n, double fraction);

// Ascending indices of k entries of largest |v| (ties broken towards lower indices).
template <typename T>
std::vector<uint32_t> TopKIndices(const T* v, size_t n, size_t k);
// Ascending indices of the entries with |v| >= threshold.
template <typename T>
std::vector<uint32_t> ThresholdIndices(const T* v, size_t n, double threshold);

// Wire form of one (index, value) pair: uint32 index then the value, packed (8 bytes for
// float, 12 for double). Index kPadIndex marks padding.
inline constexpr uint32_t kPadIndex = 0xffffffffu;
template <typename T>
constexpr size_t SparseEntryBytes() {
  return sizeof(uint32_t) + sizeof(T);
}
// Appends entries (idx[i], v[idx[i]]) to `out`, then `pad_to - idx.size()` padding entries.
template <typename T>
void PackSparse(const T* v, const std::vector<uint32_t>& idx, size_t pad_to,
                std::vector<uint8_t>* out);
// out[index] += value for every non-padding entry of `entries` (num_entries of them);
// InvalidArgument if an index is >= n (a rank sent a longer buffer).
template <typename T>
absl::Status AccumulateSparse(const uint8_t* entries, size_t num_entries, T* out, size_t n);

}  // namespace collective
}  // namespace tessera

#endif  // TESSERA_COMMON_COLLECTIVE_COMPRESSION_H_
