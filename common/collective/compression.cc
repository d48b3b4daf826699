#include "common/collective/compression.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

#include "absl/strings/str_cat.h"

namespace tessera {
namespace collective {

std::string CompressionName(Compression c) {
  switch (c) {
    case Compression::kNone:
      return "none";
    case Compression::kFp16:
      return "fp16";
    case Compression::kTopK:
      return "topk";
    case Compression::kThreshold:
      return "threshold";
  }
  return "unknown";
}

absl::Status ValidateCompression(const CompressionOptions& options) {
  if (options.kind == Compression::kTopK &&
      !(options.topk_fraction > 0 && options.topk_fraction <= 1)) {
    return absl::InvalidArgumentError(
        absl::StrCat("compression: topk_fraction must be in (0, 1], got ", options.topk_fraction));
  }
  if (options.kind == Compression::kThreshold && !(options.threshold >= 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("compression: threshold must be >= 0, got ", options.threshold));
  }
  return absl::OkStatus();
}

size_t TopKCount(size_t n, double fraction) {
  if (n == 0) return 0;
  const double k = std::ceil(fraction * static_cast<double>(n));
  return std::min(n, std::max<size_t>(1, static_cast<size_t>(k)));
}

template <typename T>
std::vector<uint32_t> TopKIndices(const T* v, size_t n, size_t k) {
  k = std::min(k, n);
  std::vector<uint32_t> idx(n);
  std::iota(idx.begin(), idx.end(), 0u);
  auto larger = [v](uint32_t a, uint32_t b) {
    const T fa = std::fabs(v[a]), fb = std::fabs(v[b]);
    return fa > fb || (fa == fb && a < b);
  };
  if (k < n) {
    std::nth_element(idx.begin(), idx.begin() + k, idx.end(), larger);
    idx.resize(k);
  }
  std::sort(idx.begin(), idx.end());
  return idx;
}

template <typename T>
std::vector<uint32_t> ThresholdIndices(const T* v, size_t n, double threshold) {
  std::vector<uint32_t> idx;
  for (size_t i = 0; i < n; ++i) {
    if (std::fabs(static_cast<double>(v[i])) >= threshold) idx.push_back(static_cast<uint32_t>(i));
  }
  return idx;
}

template <typename T>
void PackSparse(const T* v, const std::vector<uint32_t>& idx, size_t pad_to,
                std::vector<uint8_t>* out) {
  constexpr size_t kEntry = SparseEntryBytes<T>();
  const size_t entries = std::max(pad_to, idx.size());
  const size_t start = out->size();
  out->resize(start + entries * kEntry);
  uint8_t* p = out->data() + start;
  for (uint32_t i : idx) {
    std::memcpy(p, &i, sizeof(uint32_t));
    std::memcpy(p + sizeof(uint32_t), &v[i], sizeof(T));
    p += kEntry;
  }
  const T zero = 0;
  for (size_t e = idx.size(); e < entries; ++e) {
    std::memcpy(p, &kPadIndex, sizeof(uint32_t));
    std::memcpy(p + sizeof(uint32_t), &zero, sizeof(T));
    p += kEntry;
  }
}

template <typename T>
absl::Status AccumulateSparse(const uint8_t* entries, size_t num_entries, T* out, size_t n) {
  constexpr size_t kEntry = SparseEntryBytes<T>();
  for (size_t e = 0; e < num_entries; ++e) {
    uint32_t i;
    T value;
    std::memcpy(&i, entries + e * kEntry, sizeof(uint32_t));
    if (i == kPadIndex) continue;
    if (i >= n) {
      return absl::InvalidArgumentError(
          absl::StrCat("sparse all-reduce: a rank sent index ", i, " for a buffer of ", n,
                       " entries (do all ranks reduce tensors of the same sizes?)"));
    }
    std::memcpy(&value, entries + e * kEntry + sizeof(uint32_t), sizeof(T));
    out[i] += value;
  }
  return absl::OkStatus();
}

template std::vector<uint32_t> TopKIndices<float>(const float*, size_t, size_t);
template std::vector<uint32_t> TopKIndices<double>(const double*, size_t, size_t);
template std::vector<uint32_t> ThresholdIndices<float>(const float*, size_t, double);
template std::vector<uint32_t> ThresholdIndices<double>(const double*, size_t, double);
template void PackSparse<float>(const float*, const std::vector<uint32_t>&, size_t,
                                std::vector<uint8_t>*);
template void PackSparse<double>(const double*, const std::vector<uint32_t>&, size_t,
                                 std::vector<uint8_t>*);
template absl::Status AccumulateSparse<float>(const uint8_t*, size_t, float*, size_t);
template absl::Status AccumulateSparse<double>(const uint8_t*, size_t, double*, size_t);

}  // namespace collective
}  // namespace tessera
