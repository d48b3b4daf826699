#include "common/ops/tensor_ops.h"

#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/ops/kernel_util.h"

namespace tessera {

namespace {

bool IsBound(const std::string& name) { return !name.empty() && name != kEmptyVarName; }

// Normalizes `axis` (negative counts from the back) for a tensor of `rank`.
absl::Status NormalizeAxis(const OpContext& ctx, absl::string_view slot, const Tensor& t,
                           int64_t* axis) {
  int64_t a = *axis < 0 ? *axis + t.rank() : *axis;
  if (a < 0 || a >= t.rank()) {
    return ctx.Error(absl::StrCat("axis ", *axis, " is out of range for ", slot, " '",
                                  ctx.InputName(slot), "' ", ShapeString(t.shape())));
  }
  *axis = a;
  return absl::OkStatus();
}

// Copies `rows` rows of `Bytes` bytes, `src_stride` apart, to rows `dst_stride` apart: a copy of
// a size known at compile time is a few moves, where memcpy of a run-time size is a library call
// per row (concatenating or splitting embeddings by columns copies rows of one to 16 floats).
template <size_t Bytes>
void CopyFixedRows(char* dst, size_t dst_stride, const char* src, size_t src_stride, int64_t rows) {
  for (int64_t r = 0; r < rows; ++r) std::memcpy(dst + r * dst_stride, src + r * src_stride, Bytes);
}

// Copies `rows` rows of `row` bytes from `src` (rows `src_stride` apart) to `dst` (rows
// `dst_stride` apart).
void CopyRows(char* dst, size_t dst_stride, const char* src, size_t src_stride, size_t row,
              int64_t rows) {
  switch (row) {
    case 4:
      return CopyFixedRows<4>(dst, dst_stride, src, src_stride, rows);
    case 8:
      return CopyFixedRows<8>(dst, dst_stride, src, src_stride, rows);
    case 16:
      return CopyFixedRows<16>(dst, dst_stride, src, src_stride, rows);
    case 32:
      return CopyFixedRows<32>(dst, dst_stride, src, src_stride, rows);
    case 64:
      return CopyFixedRows<64>(dst, dst_stride, src, src_stride, rows);
    default:
      for (int64_t r = 0; r < rows; ++r)
        std::memcpy(dst + r * dst_stride, src + r * src_stride, row);
  }
}

// Copies the pieces `parts` (same dtype, equal dims except `axis`) into `out`, already sized to
// their concatenation along `axis`.
void ConcatInto(const std::vector<const Tensor*>& parts, int64_t axis, Tensor* out) {
  const size_t es = SizeOf(out->dtype());
  const int64_t outer = OuterElements(out->shape(), axis);
  const int64_t inner = InnerElements(out->shape(), axis);
  const size_t out_row = static_cast<size_t>(out->dim(axis) * inner) * es;
  char* dst = static_cast<char*>(out->raw_data());
  size_t offset = 0;
  for (const Tensor* p : parts) {
    const size_t row = static_cast<size_t>(p->dim(axis) * inner) * es;
    const char* src = static_cast<const char*>(p->raw_data());
    if (row > 0) CopyRows(dst + offset, out_row, src, row, row, outer);
    offset += row;
  }
}

// Copies consecutive slices of `in` along `axis`, of sizes `sizes`, into outs[i] (already
// sized); null entries are skipped.
void SplitInto(const Tensor& in, int64_t axis, const std::vector<int64_t>& sizes,
               const std::vector<Tensor*>& outs) {
  const size_t es = SizeOf(in.dtype());
  const int64_t outer = OuterElements(in.shape(), axis);
  const int64_t inner = InnerElements(in.shape(), axis);
  const size_t in_row = static_cast<size_t>(in.dim(axis) * inner) * es;
  const char* src = static_cast<const char*>(in.raw_data());
  size_t offset = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    const size_t row = static_cast<size_t>(sizes[i] * inner) * es;
    if (outs[i] != nullptr && row > 0) {
      CopyRows(static_cast<char*>(outs[i]->raw_data()), row, src + offset, in_row, row, outer);
    }
    offset += row;
  }
}

// The inputs X of concat / concat_grad, checked to match except along `axis` (normalized). Read
// through pointers: a step's concat of a few dozen embeddings copies no tensor handle.
absl::StatusOr<std::vector<const Tensor*>> ConcatInputs(const OpContext& ctx, int64_t* axis) {
  TS_ASSIGN_OR_RETURN(std::vector<const Tensor*> xs, ctx.Inputs("X"));
  if (xs.empty()) return ctx.Error("needs at least one input X");
  TS_RETURN_IF_ERROR(NormalizeAxis(ctx, "X", *xs[0], axis));
  for (size_t i = 0; i < xs.size(); ++i) {
    const Tensor& x = *xs[i];
    bool ok = x.dtype() == xs[0]->dtype() && x.rank() == xs[0]->rank();
    for (int d = 0; ok && d < x.rank(); ++d) ok = d == *axis || x.dim(d) == xs[0]->dim(d);
    if (!ok) {
      return ctx.Error(absl::StrCat("X[", i, "] '", ctx.InputName("X", i), "' is ", x.DebugString(),
                                    " but X[0] '", ctx.InputName("X", 0), "' is ",
                                    xs[0]->DebugString(), "; inputs must match except ",
                                    "along axis ", *axis));
    }
  }
  return xs;
}

// concat: Out = X[0], X[1], ... joined along attr axis (default 0; negative from the back).
absl::Status Concat(OpContext& ctx) {
  int64_t axis = ctx.IntAttr("axis", 0);
  TS_ASSIGN_OR_RETURN(std::vector<const Tensor*> parts, ConcatInputs(ctx, &axis));
  TS_ASSIGN_OR_RETURN(Tensor * out, ctx.Output("Out"));
  // An input that is also the output (in place) is read through a handle that keeps its data.
  std::optional<Tensor> held;
  for (const Tensor*& p : parts) {
    if (p != out) continue;
    if (!held.has_value()) held = *out;
    p = &*held;
  }
  Shape shape = parts[0]->shape();
  shape[axis] = 0;
  for (const Tensor* p : parts) shape[axis] += p->dim(axis);
  out->Resize(parts[0]->dtype(), shape);
  ConcatInto(parts, axis, out);
  return absl::OkStatus();
}

// concat_grad: X@GRAD[i] = the slice of Out@GRAD that X[i] contributed; unbound entries skipped.
absl::Status ConcatGrad(OpContext& ctx) {
  const std::string dout_slot = GradVarName("Out");
  const std::string dx_slot = GradVarName("X");
  int64_t axis = ctx.IntAttr("axis", 0);
  TS_ASSIGN_OR_RETURN(std::vector<const Tensor*> xs, ConcatInputs(ctx, &axis));
  // Everything read from X before any output is resized (an output may alias an input).
  std::vector<int64_t> sizes(xs.size());
  for (size_t i = 0; i < xs.size(); ++i) sizes[i] = xs[i]->dim(axis);
  const DataType dtype = xs[0]->dtype();
  Shape want = xs[0]->shape();
  want[axis] = 0;
  for (int64_t n : sizes) want[axis] += n;
  TS_ASSIGN_OR_RETURN(const Tensor* dout_ptr, ctx.Input(dout_slot));
  Tensor dout = *dout_ptr;  // a handle: keeps the data if a gradient output aliases it
  if (dout.shape() != want || dout.dtype() != dtype) {
    return ctx.Error(absl::StrCat(dout_slot, " '", ctx.InputName(dout_slot), "' is ",
                                  dout.DebugString(), " but the concatenated inputs form ",
                                  DataTypeName(dtype), ShapeString(want)));
  }
  const int n_out = static_cast<int>(OpOutputs(ctx.op(), dx_slot).size());
  std::vector<Tensor*> outs(xs.size(), nullptr);
  for (size_t i = 0; i < xs.size(); ++i) {
    if (static_cast<int>(i) < n_out && IsBound(ctx.OutputName(dx_slot, i))) {
      TS_ASSIGN_OR_RETURN(outs[i], ctx.Output(dx_slot, i));
    }
  }
  // X[i]'s shape: Out@GRAD's with X[i]'s size along the axis (the inputs match elsewhere).
  Shape part = want;
  for (size_t i = 0; i < xs.size(); ++i) {
    if (outs[i] == nullptr) continue;
    part[axis] = sizes[i];
    outs[i]->Resize(dtype, part);
  }
  SplitInto(dout, axis, sizes, outs);
  return absl::OkStatus();
}

// split: Out[i] = consecutive slices of X along attr axis. Sizes come from attr sections (one
// entry may be -1: the rest) or attr num (equal parts); neither: equal parts, one per output.
// Along an axis other than 0 (the same rows) every output keeps X's sequences (LoD).
absl::Status Split(OpContext& ctx) {
  TS_ASSIGN_OR_RETURN(const Tensor* x_ptr, ctx.Input("X"));
  Tensor x = *x_ptr;  // a handle: keeps the data if an output aliases X
  int64_t axis = ctx.IntAttr("axis", 0);
  TS_RETURN_IF_ERROR(NormalizeAxis(ctx, "X", x, &axis));
  const int64_t dim = x.dim(axis);
  const int n_out = static_cast<int>(OpOutputs(ctx.op(), "Out").size());
  if (n_out == 0) return ctx.Error("needs at least one output Out");
  std::vector<int64_t> sizes = ctx.IntsAttr("sections");
  const int64_t num = ctx.IntAttr("num", 0);
  const std::string where =
      absl::StrCat("X '", ctx.InputName("X"), "' ", ShapeString(x.shape()), " along axis ", axis);
  if (!sizes.empty()) {
    const std::string given = ShapeString(sizes);
    if (static_cast<int>(sizes.size()) != n_out) {
      return ctx.Error(absl::StrCat("sections ", given, " has ", sizes.size(), " entries but ",
                                    n_out, " outputs Out are bound"));
    }
    int infer = -1;
    int64_t known = 0;
    for (int i = 0; i < n_out; ++i) {
      if (sizes[i] == -1 && infer < 0) {
        infer = i;
      } else if (sizes[i] < 0) {
        return ctx.Error(
            absl::StrCat("sections ", given, " may hold one -1 and otherwise sizes >= 0"));
      } else {
        known += sizes[i];
      }
    }
    if (infer >= 0 ? known > dim : known != dim) {
      return ctx.Error(
          absl::StrCat("sections ", given, " sum to ", known, " but ", where, " has size ", dim));
    }
    if (infer >= 0) sizes[infer] = dim - known;
  } else {
    if (num < 0 || (num > 0 && num != n_out)) {
      return ctx.Error(
          absl::StrCat("num ", num, " does not match the ", n_out, " outputs Out that are bound"));
    }
    if (dim % n_out != 0) {
      return ctx.Error(
          absl::StrCat(where, " has size ", dim, ", not divisible into ", n_out, " equal parts"));
    }
    sizes.assign(n_out, dim / n_out);
  }
  std::vector<Tensor*> outs(n_out, nullptr);
  for (int i = 0; i < n_out; ++i) {
    if (!IsBound(ctx.OutputName("Out", i))) continue;
    TS_ASSIGN_OR_RETURN(outs[i], ctx.Output("Out", i));
  }
  for (int i = 0; i < n_out; ++i) {
    if (outs[i] == nullptr) continue;
    Shape shape = x.shape();
    shape[axis] = sizes[i];
    outs[i]->Resize(x.dtype(), shape);
    if (axis > 0) outs[i]->set_lod(x.lod());  // the same rows: X's sequences
  }
  SplitInto(x, axis, sizes, outs);
  return absl::OkStatus();
}

// The shape attr of reshape resolved against X: 0 copies X's dim, one -1 is inferred.
absl::StatusOr<Shape> ResolveReshape(const OpContext& ctx, const Tensor& x) {
  std::vector<int64_t> attr = ctx.IntsAttr("shape");
  Shape shape = attr;
  const std::string given = ShapeString(attr);
  const std::string xdesc = absl::StrCat("X '", ctx.InputName("X"), "' ", ShapeString(x.shape()));
  int infer = -1;
  int64_t known = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == -1) {
      if (infer >= 0) return ctx.Error(absl::StrCat("shape ", given, " has more than one -1"));
      infer = static_cast<int>(i);
      continue;
    }
    if (shape[i] == 0) {
      if (static_cast<int>(i) >= x.rank()) {
        return ctx.Error(absl::StrCat("shape ", given, " has 0 (copy the input dim) at index ", i,
                                      " but ", xdesc, " has rank ", x.rank()));
      }
      shape[i] = x.dim(i);
    } else if (shape[i] < 0) {
      return ctx.Error(absl::StrCat("shape ", given, " has negative entry ", shape[i]));
    }
    known *= shape[i];
  }
  if (infer >= 0) {
    if (known == 0 || x.numel() % known != 0) {
      return ctx.Error(absl::StrCat("cannot infer the -1 of shape ", given, " for ", xdesc, " (",
                                    x.numel(), " elements)"));
    }
    shape[infer] = x.numel() / known;
  } else if (known != x.numel()) {
    return ctx.Error(
        absl::StrCat("shape ", given, " has ", known, " elements but ", xdesc, " has ", x.numel()));
  }
  return shape;
}

// reshape: Out = X with attr shape (copies the data unless Out is X).
absl::Status ReshapeOp(OpContext& ctx) {
  TS_ASSIGN_OR_RETURN(const Tensor* x, ctx.Input("X"));
  TS_ASSIGN_OR_RETURN(Shape shape, ResolveReshape(ctx, *x));
  TS_ASSIGN_OR_RETURN(Tensor * out, ctx.Output("Out"));
  if (out != x) out->CopyFrom(*x);
  return out->Reshape(std::move(shape));
}

// reshape_grad: X@GRAD = Out@GRAD with X's shape.
absl::Status ReshapeGrad(OpContext& ctx) {
  const std::string dout_slot = GradVarName("Out");
  const std::string dx_slot = GradVarName("X");
  if (!ctx.HasOutput(dx_slot)) return absl::OkStatus();
  TS_ASSIGN_OR_RETURN(const Tensor* x, ctx.Input("X"));
  TS_ASSIGN_OR_RETURN(const Tensor* dout, ctx.Input(dout_slot));
  if (dout->numel() != x->numel()) {
    return ctx.Error(absl::StrCat(dout_slot, " '", ctx.InputName(dout_slot), "' ",
                                  ShapeString(dout->shape()), " and X '", ctx.InputName("X"), "' ",
                                  ShapeString(x->shape()), " differ in element count"));
  }
  Shape shape = x->shape();
  TS_ASSIGN_OR_RETURN(Tensor * dx, ctx.Output(dx_slot));
  if (dx != dout) dx->CopyFrom(*dout);
  return dx->Reshape(std::move(shape));
}

// Out = X converted element by element to `to` (C++ conversion rules: floats truncate to ints).
absl::Status CastTensor(const OpContext& ctx, absl::string_view slot, const Tensor& x, DataType to,
                        Tensor* out) {
  Tensor src = x;  // a handle: keeps the data when out is x
  out->Resize(to, src.shape());
  return DispatchNumeric(ctx, slot, src.dtype(), [&](auto in_tag) {
    using In = typename decltype(in_tag)::type;
    return DispatchNumeric(ctx, slot, to, [&](auto out_tag) {
      using O = typename decltype(out_tag)::type;
      const In* s = src.data<In>();
      O* d = out->data<O>();
      const int64_t n = src.numel();
      for (int64_t i = 0; i < n; ++i) d[i] = static_cast<O>(s[i]);
      return absl::OkStatus();
    });
  });
}

// cast: Out = X converted to attr out_dtype (a DataType number).
absl::Status Cast(OpContext& ctx) {
  TS_ASSIGN_OR_RETURN(const Tensor* x, ctx.Input("X"));
  const int64_t to = ctx.IntAttr("out_dtype", FLOAT32);
  if (!DataType_IsValid(static_cast<int>(to)) || SizeOf(static_cast<DataType>(to)) == 0) {
    return ctx.Error(absl::StrCat("out_dtype ", to, " is not a DataType (float32=0, float64=1, ",
                                  "int64=2, int32=3)"));
  }
  TS_ASSIGN_OR_RETURN(Tensor * out, ctx.Output("Out"));
  return CastTensor(ctx, "X", *x, static_cast<DataType>(to), out);
}

// cast_grad: X@GRAD = Out@GRAD converted back to X's dtype (X must be float).
absl::Status CastGrad(OpContext& ctx) {
  const std::string dout_slot = GradVarName("Out");
  const std::string dx_slot = GradVarName("X");
  if (!ctx.HasOutput(dx_slot)) return absl::OkStatus();
  TS_ASSIGN_OR_RETURN(const Tensor* x, ctx.Input("X"));
  if (x->dtype() != FLOAT32 && x->dtype() != FLOAT64) {
    return ctx.Error(absl::StrCat("X '", ctx.InputName("X"), "' is ", DataTypeName(x->dtype()),
                                  "; no gradient flows into an integer input of cast"));
  }
  TS_ASSIGN_OR_RETURN(const Tensor* dout, ctx.Input(dout_slot));
  TS_RETURN_IF_ERROR(CheckSameShape(ctx, dout_slot, *dout, "X", *x));
  TS_ASSIGN_OR_RETURN(Tensor * dx, ctx.Output(dx_slot));
  return CastTensor(ctx, dout_slot, *dout, x->dtype(), dx);
}

std::vector<std::string> GradNames(const std::vector<std::string>& vars) {
  std::vector<std::string> out;
  for (const auto& v : vars) out.push_back(GradVarName(v));
  return out;
}

std::vector<OpDesc> ConcatGradMaker(const OpDesc& fwd) {
  OpDesc g =
      MakeOp("concat_grad",
             {{"X", OpInputs(fwd, "X")}, {GradVarName("Out"), {GradVarName(OpOutput(fwd, "Out"))}}},
             {{GradVarName("X"), GradNames(OpInputs(fwd, "X"))}});
  *g.mutable_attrs() = fwd.attrs();
  return {g};
}

std::vector<OpDesc> SplitGradMaker(const OpDesc& fwd) {
  OpDesc g = MakeOp("concat", {{"X", GradNames(OpOutputs(fwd, "Out"))}},
                    {{"Out", {GradVarName(OpInput(fwd, "X"))}}});
  SetAttr(&g, "axis", GetIntAttr(fwd, "axis", 0));
  return {g};
}

// X and Out@GRAD -> X@GRAD, attributes copied.
GradMakerFn UnaryGradMaker(std::string grad_type) {
  return [grad_type = std::move(grad_type)](const OpDesc& fwd) {
    OpDesc g = MakeOp(
        grad_type,
        {{"X", {OpInput(fwd, "X")}}, {GradVarName("Out"), {GradVarName(OpOutput(fwd, "Out"))}}},
        {{GradVarName("X"), {GradVarName(OpInput(fwd, "X"))}}});
    *g.mutable_attrs() = fwd.attrs();
    return std::vector<OpDesc>{g};
  };
}

}  // namespace

absl::Status RegisterTensorOps(OpRegistry* r) {
  TS_RETURN_IF_ERROR(r->Register("concat", {Concat, ConcatGradMaker}));
  TS_RETURN_IF_ERROR(r->Register("concat_grad", {ConcatGrad, nullptr}));
  TS_RETURN_IF_ERROR(r->Register("split", {Split, SplitGradMaker}));
  TS_RETURN_IF_ERROR(r->Register("reshape", {ReshapeOp, UnaryGradMaker("reshape_grad")}));
  TS_RETURN_IF_ERROR(r->Register("reshape_grad", {ReshapeGrad, nullptr}));
  TS_RETURN_IF_ERROR(r->Register("cast", {Cast, UnaryGradMaker("cast_grad")}));
  TS_RETURN_IF_ERROR(r->Register("cast_grad", {CastGrad, nullptr}));
  return absl::OkStatus();
}

}  // namespace tessera
