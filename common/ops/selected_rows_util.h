// Helpers for SelectedRows (sparse rows of a conceptual [height, ...] tensor): validation and
// merging of duplicate rows. Used by sparse optimizer kernels and by the pserver when it
// combines sparse gradients. Pure functions, thread-compatible.
#ifndef TESSERA_COMMON_OPS_SELECTED_ROWS_UTIL_H_
#define TESSERA_COMMON_OPS_SELECTED_ROWS_UTIL_H_

#include <cstdint>

#include "absl/status/status.h"
#include "common/framework/tensor.h"

namespace tessera {

// OK when `sr` is well formed for MergeRows: value is an initialized float32/float64 tensor of
// rank >= 1 whose dim(0) equals rows.size(), or there are no rows and no (uninitialized) value.
// The error describes what is wrong.
absl::Status ValidateSelectedRows(const SelectedRows& sr);

// Elements per row of sr.value (product of its dims after the first; 0 for an empty value).
int64_t RowWidth(const SelectedRows& sr);

// The same sparse tensor with each row id once: rows sorted ascending, the values of repeated
// ids summed (in their order of appearance), height kept. The result owns a new value buffer.
// Precondition: ValidateSelectedRows(in).ok() (violations abort: a programming error).
SelectedRows MergeRows(const SelectedRows& in);

}  // namespace tessera

#endif  // TESSERA_COMMON_OPS_SELECTED_ROWS_UTIL_H_
