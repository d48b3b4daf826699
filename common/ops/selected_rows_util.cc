#include "common/ops/selected_rows_util.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <numeric>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"

namespace tessera {

namespace {

template <typename T>
void MergeTyped(const SelectedRows& in, const std::vector<int64_t>& order, int64_t width,
                SelectedRows* out) {
  const T* src = in.value.data<T>();
  T* dst = out->value.data<T>();
  int64_t u = -1;
  for (size_t k = 0; k < order.size(); ++k) {
    const int64_t i = order[k];
    const T* row = src + i * width;
    if (k == 0 || in.rows[i] != out->rows[u]) {
      ++u;
      out->rows[u] = in.rows[i];
      std::memcpy(dst + u * width, row, sizeof(T) * width);
    } else {
      T* acc = dst + u * width;
      for (int64_t j = 0; j < width; ++j) acc[j] += row[j];
    }
  }
}

}  // namespace

absl::Status ValidateSelectedRows(const SelectedRows& sr) {
  const Tensor& v = sr.value;
  if (sr.rows.empty() && !v.initialized()) return absl::OkStatus();  // no rows, no value
  if (!v.initialized() || v.rank() < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("sparse rows have value ", v.DebugString(), "; need a tensor of rank >= 1"));
  }
  if (v.dtype() != FLOAT32 && v.dtype() != FLOAT64) {
    return absl::InvalidArgumentError(absl::StrCat("sparse rows have value ", v.DebugString(),
                                                   "; only float32/float64 are supported"));
  }
  if (v.dim(0) != static_cast<int64_t>(sr.rows.size())) {
    return absl::InvalidArgumentError(absl::StrCat("sparse rows list ", sr.rows.size(),
                                                   " ids but the value is ", v.DebugString()));
  }
  return absl::OkStatus();
}

int64_t RowWidth(const SelectedRows& sr) {
  const Tensor& v = sr.value;
  if (!v.initialized() || v.rank() < 1) return 0;
  int64_t width = 1;
  for (int i = 1; i < v.rank(); ++i) width *= v.dim(i);
  return width;
}

SelectedRows MergeRows(const SelectedRows& in) {
  absl::Status valid = ValidateSelectedRows(in);
  if (!valid.ok()) {
    std::fprintf(stderr, "tessera: MergeRows precondition violated: %s\n",
                 std::string(valid.message()).c_str());
    std::abort();
  }
  const int64_t n = static_cast<int64_t>(in.rows.size());
  const int64_t width = RowWidth(in);
  // Positions sorted by (id, position): duplicates are summed in their order of appearance.
  // Sorting (id, position) pairs in place is several times faster than an indirect stable sort,
  // and rows that are already strictly increasing (as split_by_shard sends them) skip the sort.
  std::vector<int64_t> order(n);
  if (std::adjacent_find(in.rows.begin(), in.rows.end(), std::greater_equal<int64_t>()) ==
      in.rows.end()) {
    std::iota(order.begin(), order.end(), 0);
  } else {
    std::vector<std::pair<int64_t, int64_t>> keyed(n);
    for (int64_t i = 0; i < n; ++i) keyed[i] = {in.rows[i], i};
    std::sort(keyed.begin(), keyed.end());
    for (int64_t i = 0; i < n; ++i) order[i] = keyed[i].second;
  }
  int64_t unique = n == 0 ? 0 : 1;
  for (int64_t k = 1; k < n; ++k) unique += in.rows[order[k]] != in.rows[order[k - 1]];

  SelectedRows out;
  out.height = in.height;
  if (!in.value.initialized()) return out;  // no rows at all
  out.rows.resize(unique);
  Shape shape = in.value.shape();
  shape[0] = unique;
  out.value.Resize(in.value.dtype(), shape);
  if (in.value.dtype() == FLOAT32) {
    MergeTyped<float>(in, order, width, &out);
  } else {
    MergeTyped<double>(in, order, width, &out);
  }
  return out;
}

}  // namespace tessera
