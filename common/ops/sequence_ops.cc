#include "common/ops/sequence_ops.h"

#include <cmath>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/ops/kernel_util.h"

namespace tessera {

namespace {

enum class PoolType { kSum, kAverage, kSqrt, kMax };

struct PoolArgs {
  const Tensor* x = nullptr;
  PoolType type = PoolType::kSum;
  int64_t width = 0;  // elements per row of X
  const std::vector<int64_t>* lod = nullptr;
};

// X [N, ...] float with sequences (level-1 LoD over dim 0) and a known pooltype.
absl::StatusOr<PoolArgs> GetPoolArgs(const OpContext& ctx) {
  PoolArgs a;
  TS_ASSIGN_OR_RETURN(a.x, ctx.Input("X"));
  const std::string type = ctx.StringAttr("pooltype", "SUM");
  if (type == "SUM") {
    a.type = PoolType::kSum;
  } else if (type == "AVERAGE") {
    a.type = PoolType::kAverage;
  } else if (type == "SQRT") {
    a.type = PoolType::kSqrt;
  } else if (type == "MAX") {
    a.type = PoolType::kMax;
  } else {
    return ctx.Error(absl::StrCat("pooltype '", type, "' is unknown (SUM, AVERAGE, SQRT, MAX)"));
  }
  if (a.x->rank() < 1) return ctx.Error("X must have a row dimension");
  const std::vector<int64_t>& lod = a.x->lod();
  const int64_t rows = a.x->dim(0);
  if (lod.empty()) {
    return ctx.Error(absl::StrCat("X '", ctx.InputName("X"), "' ", ShapeString(a.x->shape()),
                                  " holds no sequences (LoD); feed its ids from a multi-hot "
                                  "(MULTI_SLOT) feed"));
  }
  bool valid = lod.front() == 0 && lod.back() == rows;
  for (size_t i = 1; valid && i < lod.size(); ++i) valid = lod[i] >= lod[i - 1];
  if (!valid) {
    return ctx.Error(absl::StrCat("X '", ctx.InputName("X"), "' has ", rows,
                                  " rows but sequence offsets that do not cover them"));
  }
  a.lod = &lod;
  a.width = NumElements(Shape(a.x->shape().begin() + 1, a.x->shape().end()));
  return a;
}

Shape PooledShape(const PoolArgs& a) {
  Shape shape = a.x->shape();
  shape[0] = static_cast<int64_t>(a.lod->size()) - 1;
  return shape;
}

// Divisor of a sequence of `n` rows under AVERAGE / SQRT (1 otherwise, and for n == 0).
float Divisor(PoolType type, int64_t n) {
  if (n == 0) return 1.0f;
  if (type == PoolType::kAverage) return static_cast<float>(n);
  if (type == PoolType::kSqrt) return std::sqrt(static_cast<float>(n));
  return 1.0f;
}

// sequence_pool: Out[i] = pool over rows [lod[i], lod[i+1]) of X; an empty sequence gives 0.
absl::Status SequencePool(OpContext& ctx) {
  TS_ASSIGN_OR_RETURN(PoolArgs a, GetPoolArgs(ctx));
  TS_RETURN_IF_ERROR(ctx.CheckDType("X", *a.x, FLOAT32));
  TS_ASSIGN_OR_RETURN(Tensor * out, ctx.Output("Out"));
  if (out == a.x) return ctx.Error("Out must not be X");
  out->Resize(FLOAT32, PooledShape(a));
  out->set_lod({});
  const std::vector<int64_t>& lod = *a.lod;
  const float* x = a.x->data<float>();
  float* o = out->data<float>();
  const int64_t w = a.width;
  for (size_t s = 0; s + 1 < lod.size(); ++s) {
    float* dst = o + static_cast<int64_t>(s) * w;
    const int64_t begin = lod[s], end = lod[s + 1];
    for (int64_t j = 0; j < w; ++j) dst[j] = begin < end ? x[begin * w + j] : 0.0f;
    for (int64_t r = begin + 1; r < end; ++r) {
      const float* row = x + r * w;
      for (int64_t j = 0; j < w; ++j) {
        dst[j] = a.type == PoolType::kMax ? std::max(dst[j], row[j]) : dst[j] + row[j];
      }
    }
    const float d = Divisor(a.type, end - begin);
    if (d != 1.0f) {
      for (int64_t j = 0; j < w; ++j) dst[j] /= d;
    }
  }
  return absl::OkStatus();
}

// X@GRAD: each row of a sequence gets Out@GRAD of its sequence (divided for AVERAGE / SQRT);
// under MAX only the first row holding the maximum of a column gets it.
absl::Status SequencePoolGrad(OpContext& ctx) {
  if (!ctx.HasOutput("X@GRAD")) return absl::OkStatus();
  TS_ASSIGN_OR_RETURN(PoolArgs a, GetPoolArgs(ctx));
  TS_RETURN_IF_ERROR(ctx.CheckDType("X", *a.x, FLOAT32));
  const int64_t sequences = static_cast<int64_t>(a.lod->size()) - 1;
  TS_ASSIGN_OR_RETURN(const Tensor* dout,
                      GradInput(ctx, "Out@GRAD", FLOAT32, sequences * a.width));
  TS_ASSIGN_OR_RETURN(Tensor * dx, ctx.Output("X@GRAD"));
  if (dx == a.x || dx == dout) return ctx.Error("X@GRAD must not be X or Out@GRAD");
  dx->Resize(FLOAT32, a.x->shape());
  dx->set_lod(*a.lod);
  dx->SetZero();
  const std::vector<int64_t>& lod = *a.lod;
  const float* x = a.x->data<float>();
  const float* g = dout->data<float>();
  float* d = dx->data<float>();
  const int64_t w = a.width;
  for (int64_t s = 0; s < sequences; ++s) {
    const int64_t begin = lod[s], end = lod[s + 1];
    if (begin == end) continue;
    const float* gs = g + s * w;
    if (a.type == PoolType::kMax) {
      for (int64_t j = 0; j < w; ++j) {
        int64_t best = begin;
        for (int64_t r = begin + 1; r < end; ++r) {
          if (x[r * w + j] > x[best * w + j]) best = r;
        }
        d[best * w + j] = gs[j];
      }
      continue;
    }
    const float div = Divisor(a.type, end - begin);
    for (int64_t r = begin; r < end; ++r) {
      for (int64_t j = 0; j < w; ++j) d[r * w + j] = gs[j] / div;
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status RegisterSequenceOps(OpRegistry* r) {
  TS_RETURN_IF_ERROR(r->Register("sequence_pool", {SequencePool, DefaultGradMaker({"X"})}));
  TS_RETURN_IF_ERROR(r->Register("sequence_pool_grad", {SequencePoolGrad, nullptr}));
  return absl::OkStatus();
}

}  // namespace tessera
