// Small helpers shared by CPU kernels: dtype dispatch and common checks.
#ifndef TESSERA_COMMON_OPS_KERNEL_UTIL_H_
#define TESSERA_COMMON_OPS_KERNEL_UTIL_H_

#include "absl/strings/str_cat.h"
#include "common/framework/op_registry.h"
#include "common/base/status.h"

namespace tessera {

template <typename T>
struct TypeTag {
  using type = T;
};

// Calls fn(TypeTag<T>()) for T = float or double according to `dtype`; other dtypes produce an
// error naming the op's `slot`. Use as:
//   DispatchFloat(ctx, "X", x->dtype(), [&](auto tag) {
//     using T = typename decltype(tag)::type; ... });
template <typename Fn>
absl::Status DispatchFloat(const OpContext& ctx, absl::string_view slot, DataType dtype, Fn&& fn) {
  switch (dtype) {
    case FLOAT32:
      return fn(TypeTag<float>());
    case FLOAT64:
      return fn(TypeTag<double>());
    default:
      return ctx.Error(absl::StrCat(slot, " '", ctx.InputName(slot), "' has dtype ",
                                    DataTypeName(dtype), "; this op supports float32/float64"));
  }
}

// As DispatchFloat, plus int64 and int32.
template <typename Fn>
absl::Status DispatchNumeric(const OpContext& ctx, absl::string_view slot, DataType dtype,
                             Fn&& fn) {
  switch (dtype) {
    case INT64:
      return fn(TypeTag<int64_t>());
    case INT32:
      return fn(TypeTag<int32_t>());
    default:
      return DispatchFloat(ctx, slot, dtype, std::forward<Fn>(fn));
  }
}

// Error unless a and b have equal shapes; names both slots, variables and shapes.
inline absl::Status CheckSameShape(const OpContext& ctx, absl::string_view slot_a, const Tensor& a,
                                   absl::string_view slot_b, const Tensor& b) {
  if (a.shape() == b.shape()) return absl::OkStatus();
  return ctx.Error(absl::StrCat(slot_a, " '", ctx.InputName(slot_a), "' ", ShapeString(a.shape()),
                                " and ", slot_b, " '", ctx.InputName(slot_b), "' ",
                                ShapeString(b.shape()), " must have the same shape"));
}

// The output gradient bound to `slot` (e.g. "Out@GRAD") must have the forward output's dtype
// and `numel` elements; the error names the slot, the variable and both.
inline absl::StatusOr<const Tensor*> GradInput(const OpContext& ctx, absl::string_view slot,
                                               DataType dtype, int64_t numel) {
  TS_ASSIGN_OR_RETURN(const Tensor* g, ctx.Input(slot));
  if (g->dtype() != dtype || g->numel() != numel) {
    return ctx.Error(absl::StrCat(slot, " '", ctx.InputName(slot), "' is ", g->DebugString(),
                                  "; expected ", DataTypeName(dtype), " with ", numel,
                                  " elements"));
  }
  return g;
}

}  // namespace tessera

#endif  // TESSERA_COMMON_OPS_KERNEL_UTIL_H_
