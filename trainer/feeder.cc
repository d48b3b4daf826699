#include "trainer/feeder.h"

#include <cmath>
#include <string>
#include <type_traits>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/base/status.h"
#include "common/framework/op_desc.h"
#include "common/framework/tensor.h"

namespace tessera {

namespace {

absl::Status CheckDeclared(const BlockDesc& block, const std::string& name, DataType dtype,
                           int64_t width, absl::string_view what) {
  const VarDesc* v = FindVarDesc(block, name);
  std::string want = absl::StrCat(DataTypeName(dtype), "[-1, ", width, "]");
  if (v == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(what, " feed '", name,
                                                   "' is not declared in the main program "
                                                   "(expected ",
                                                   want, ")"));
  }
  Shape shape(v->shape().begin(), v->shape().end());
  bool shape_ok = shape.size() == 2 && (shape[1] == width || shape[1] < 0);
  if (v->dtype() != dtype || !shape_ok) {
    return absl::InvalidArgumentError(absl::StrCat(what, " feed '", name, "' is declared as ",
                                                   DataTypeName(v->dtype()), ShapeString(shape),
                                                   " but the feed spec gives ", want));
  }
  return absl::OkStatus();
}

// The dense tensor of variable `name` in `scope` (created if absent), resized to `shape`.
Tensor* FeedTensor(Scope* scope, const std::string& name, DataType dtype, Shape shape) {
  Tensor* t = scope->Var(name)->GetMutable<Tensor>();
  t->Resize(dtype, std::move(shape));
  return t;
}

}  // namespace

absl::Status Feeder::Validate(const ProgramDesc& program) const {
  if (program.blocks_size() == 0) {
    return absl::InvalidArgumentError("the main program has no blocks");
  }
  const BlockDesc& block = program.blocks(0);
  if (!spec_.dense.empty()) {
    if (spec_.num_dense <= 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "dense feed '", spec_.dense, "' has num_dense ", spec_.num_dense, "; it must be >= 1"));
    }
    TS_RETURN_IF_ERROR(CheckDeclared(block, spec_.dense, FLOAT32, spec_.num_dense, "dense"));
  }
  for (size_t i = 0; i < spec_.slots.size(); ++i) {
    const SlotFeed& slot = spec_.slots[i];
    if (slot.dict_size < 0) {
      return absl::InvalidArgumentError(absl::StrCat("slot feed '", slot.name, "' has dict_size ",
                                                     slot.dict_size, "; it must be >= 0"));
    }
    TS_RETURN_IF_ERROR(CheckDeclared(block, slot.name, INT64, 1, "slot"));
  }
  for (const SlotFeed& slot : spec_.multi_slots) {
    if (slot.dict_size < 0) {
      return absl::InvalidArgumentError(absl::StrCat("multi-hot feed '", slot.name,
                                                     "' has dict_size ", slot.dict_size,
                                                     "; it must be >= 0"));
    }
    TS_RETURN_IF_ERROR(CheckDeclared(block, slot.name, INT64, 1, "multi-hot slot"));
  }
  if (spec_.label.empty()) return absl::InvalidArgumentError("the feed spec names no label");
  if (spec_.label_dtype != FLOAT32 && spec_.label_dtype != FLOAT64 && spec_.label_dtype != INT64) {
    return absl::InvalidArgumentError(absl::StrCat("label feed '", spec_.label, "' has dtype ",
                                                   DataTypeName(spec_.label_dtype),
                                                   "; use float32, float64 or int64"));
  }
  return CheckDeclared(block, spec_.label, spec_.label_dtype, 1, "label");
}

absl::Status Feeder::Feed(absl::Span<const data::Example> batch, Scope* scope) const {
  return FeedImpl(
      static_cast<int64_t>(batch.size()),
      [&](int64_t i) -> const data::Example* { return &batch[static_cast<size_t>(i)]; }, scope);
}

absl::Status Feeder::Feed(absl::Span<const data::Example> all, absl::Span<const int64_t> indices,
                          Scope* scope) const {
  const int64_t n = static_cast<int64_t>(all.size());
  for (size_t i = 0; i < indices.size(); ++i) {
    if (indices[i] < 0 || indices[i] >= n) {
      return absl::InvalidArgumentError(absl::StrCat(
          "feed: batch position ", i, " selects example ", indices[i], " of a data set of ", n));
    }
  }
  return FeedImpl(
      static_cast<int64_t>(indices.size()),
      [&](int64_t i) -> const data::Example* {
        return &all[static_cast<size_t>(indices[static_cast<size_t>(i)])];
      },
      scope);
}

namespace {

// Examples sit at random places of a large data set (an epoch's shuffled order), and their
// vectors' buffers elsewhere still: FeedImpl asks for the example kPrefetchAhead * 2 positions
// ahead, and for the buffers of the one kPrefetchAhead ahead (whose example is then cached).
constexpr int64_t kPrefetchAhead = 8;

// Asks the cache for `ex`'s ids and dense values.
void PrefetchBuffers(const data::Example& ex) {
  const char* ids = reinterpret_cast<const char*>(ex.sparse.data());
  const size_t bytes = ex.sparse.size() * sizeof(int64_t);
  for (size_t b = 0; b < bytes; b += 64) __builtin_prefetch(ids + b);
  __builtin_prefetch(ex.dense.data());
}

}  // namespace

template <typename GetExample>
absl::Status Feeder::FeedImpl(int64_t n, const GetExample& get, Scope* scope) const {
  if (n <= 0) {
    return absl::InvalidArgumentError("feed: the batch is empty (it needs at least one example)");
  }
  const int64_t width = spec_.num_dense;
  float* dense = spec_.dense.empty()
                     ? nullptr
                     : FeedTensor(scope, spec_.dense, FLOAT32, {n, width})->data<float>();
  const size_t num_slots = spec_.slots.size();
  struct SlotOut {
    int64_t* ids;
    int64_t dict_size;
  };
  thread_local std::vector<SlotOut> slot_out;
  slot_out.resize(num_slots);
  for (size_t s = 0; s < num_slots; ++s) {
    slot_out[s] = {FeedTensor(scope, spec_.slots[s].name, INT64, {n, 1})->data<int64_t>(),
                   spec_.slots[s].dict_size};
  }
  // Example by example, each read once (slot by slot, every slot visited every example again).
  for (int64_t i = 0; i < n; ++i) {
    if (i + 2 * kPrefetchAhead < n) __builtin_prefetch(get(i + 2 * kPrefetchAhead));
    if (i + kPrefetchAhead < n) PrefetchBuffers(*get(i + kPrefetchAhead));
    const data::Example& ex = *get(i);
    if (dense != nullptr) {
      if (static_cast<int64_t>(ex.dense.size()) != width) {
        return absl::InvalidArgumentError(
            absl::StrCat("feed '", spec_.dense, "': example ", i, " of the batch has ",
                         ex.dense.size(), " dense values but the feed is [", n, ", ", width, "]"));
      }
      for (int64_t j = 0; j < width; ++j) {
        const float v = ex.dense[static_cast<size_t>(j)];
        if (!std::isfinite(v)) {
          return absl::InvalidArgumentError(absl::StrCat("feed '", spec_.dense, "': example ", i,
                                                         " of the batch has dense value ", j, " = ",
                                                         v));
        }
        dense[i * width + j] = v;
      }
    }
    if (num_slots == 0) continue;
    if (ex.sparse.size() != num_slots) {
      return absl::InvalidArgumentError(absl::StrCat(
          "feed '", spec_.slots[0].name, "': example ", i, " of the batch has ", ex.sparse.size(),
          " sparse ids but the feed spec has ", num_slots, " slots"));
    }
    const int64_t* ids = ex.sparse.data();
    for (size_t s = 0; s < num_slots; ++s) slot_out[s].ids[i] = ids[s];
  }
  // Ids of local tables mapped into their rows, slot by slot.
  for (const SlotOut& out : slot_out) {
    if (out.dict_size <= 0) continue;
    for (int64_t i = 0; i < n; ++i) out.ids[i] = ModuloId(out.ids[i], out.dict_size);
  }
  const size_t num_multi = spec_.multi_slots.size();
  for (size_t m = 0; m < num_multi; ++m) {
    const SlotFeed& slot = spec_.multi_slots[m];
    std::vector<int64_t> lod(static_cast<size_t>(n) + 1, 0);
    for (int64_t i = 0; i < n; ++i) {
      const data::Example& ex = *get(i);
      if (ex.multi.size() != num_multi) {
        return absl::InvalidArgumentError(absl::StrCat(
            "feed '", slot.name, "': example ", i, " of the batch has ", ex.multi.size(),
            " multi-hot id lists but the feed spec has ", num_multi, " multi-hot slots"));
      }
      lod[i + 1] = lod[i] + static_cast<int64_t>(ex.multi[m].size());
    }
    Tensor* t = FeedTensor(scope, slot.name, INT64, {lod.back(), 1});
    int64_t* out = t->data<int64_t>();
    for (int64_t i = 0; i < n; ++i) {
      for (int64_t id : get(i)->multi[m]) {
        *out++ = slot.dict_size > 0 ? ModuloId(id, slot.dict_size) : id;
      }
    }
    t->set_lod(std::move(lod));
  }
  Tensor* t = FeedTensor(scope, spec_.label, spec_.label_dtype, {n, 1});
  auto write_labels = [&](auto* out) -> absl::Status {
    using T = std::remove_pointer_t<decltype(out)>;
    for (int64_t i = 0; i < n; ++i) {
      const float v = get(i)->label;
      if (!std::isfinite(v)) {
        return absl::InvalidArgumentError(
            absl::StrCat("feed '", spec_.label, "': example ", i, " of the batch has label ", v));
      }
      if constexpr (std::is_integral_v<T>) {
        if (v < 0 || std::floor(v) != v) {
          return absl::InvalidArgumentError(
              absl::StrCat("feed '", spec_.label, "': example ", i, " of the batch has label ", v,
                           "; an int64 label must be a non-negative integer class index"));
        }
      }
      out[i] = static_cast<T>(v);
    }
    return absl::OkStatus();
  };
  switch (spec_.label_dtype) {
    case FLOAT32:
      return write_labels(t->data<float>());
    case FLOAT64:
      return write_labels(t->data<double>());
    case INT64:
      return write_labels(t->data<int64_t>());
    default:
      return absl::InvalidArgumentError(absl::StrCat("label feed '", spec_.label, "' has dtype ",
                                                     DataTypeName(spec_.label_dtype),
                                                     "; use float32, float64 or int64"));
  }
}

}  // namespace tessera
