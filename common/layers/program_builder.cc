#include "common/layers/program_builder.h"

#include <cmath>

#include "absl/strings/str_cat.h"

namespace tessera {

namespace {
constexpr int64_t kDefaultSeed = 20260101;

void EnsureBlock(ProgramDesc* p) {
  if (p->blocks_size() == 0) {
    BlockDesc* b = p->add_blocks();
    b->set_idx(0);
    b->set_parent_idx(-1);
  }
}
}  // namespace

uint64_t StableHash(absl::string_view s) {
  uint64_t h = 1469598103934665603ULL;
  for (unsigned char c : s) {
    h ^= c;
    h *= 1099511628211ULL;
  }
  return h;
}

VarDesc* DeclareVar(BlockDesc* block, absl::string_view name, const Shape& shape, DataType dtype) {
  VarDesc* v = FindMutableVarDesc(block, name);
  if (v == nullptr) {
    v = block->add_vars();
    v->set_name(std::string(name));
  }
  v->clear_shape();
  for (int64_t d : shape) v->add_shape(d);
  v->set_dtype(dtype);
  return v;
}

ProgramBuilder::ProgramBuilder(ProgramDesc* main, ProgramDesc* startup)
    : main_(main), startup_(startup) {
  EnsureBlock(main_);
  EnsureBlock(startup_);
  if (main_->random_seed() == 0) main_->set_random_seed(kDefaultSeed);
  startup_->set_random_seed(main_->random_seed());
}

std::string ProgramBuilder::UniqueName(absl::string_view prefix) {
  int& n = counters_[std::string(prefix)];
  return absl::StrCat(prefix, "_", n++);
}

VarDesc* ProgramBuilder::CreateVar(absl::string_view name, const Shape& shape, DataType dtype) {
  return DeclareVar(block(), name, shape, dtype);
}

uint64_t ProgramBuilder::SeedFor(absl::string_view var_name) const {
  return StableHash(var_name) ^ static_cast<uint64_t>(main_->random_seed());
}

VarDesc* ProgramBuilder::CreateParameter(absl::string_view name, const Shape& shape,
                                         Initializer init, DataType dtype) {
  VarDesc* v = DeclareVar(block(), name, shape, dtype);
  v->set_persistable(true);
  v->set_trainable(true);
  VarDesc* sv = DeclareVar(startup_->mutable_blocks(0), name, shape, dtype);
  sv->set_persistable(true);

  OpDesc op;
  if (init.kind == Initializer::kConstant) {
    op = MakeOp("fill_constant", {}, {{"Out", {std::string(name)}}});
    SetAttr(&op, "value", init.a);
  } else if (init.kind == Initializer::kGaussian) {
    op = MakeOp("gaussian_random", {}, {{"Out", {std::string(name)}}});
    SetAttr(&op, "mean", init.a);
    SetAttr(&op, "std", init.b);
  } else {
    float lo = init.a, hi = init.b;
    if (init.kind == Initializer::kXavierUniform) {
      // fan_in = first dim, fan_out = the rest (for [in, out] weights and [V, D] tables).
      double fan_in = shape.empty() ? 1 : static_cast<double>(shape[0]);
      double fan_out = shape.size() < 2 ? 1 : static_cast<double>(NumElements(shape)) / fan_in;
      hi = static_cast<float>(std::sqrt(6.0 / (fan_in + fan_out)));
      lo = -hi;
    }
    op = MakeOp("uniform_random", {}, {{"Out", {std::string(name)}}});
    SetAttr(&op, "min", lo);
    SetAttr(&op, "max", hi);
  }
  SetAttr(&op, "shape", std::vector<int64_t>(shape.begin(), shape.end()));
  SetAttr(&op, "dtype", static_cast<int64_t>(dtype));
  if (init.kind != Initializer::kConstant) {
    SetAttr(&op, "seed", static_cast<int64_t>(SeedFor(name) & 0x7fffffffffffffffULL));
  }
  *startup_->mutable_blocks(0)->add_ops() = op;
  return v;
}

VarDesc* ProgramBuilder::CreatePersistable(absl::string_view name, const Shape& shape, float value,
                                           DataType dtype) {
  VarDesc* v = DeclareVar(block(), name, shape, dtype);
  v->set_persistable(true);
  DeclareVar(startup_->mutable_blocks(0), name, shape, dtype)->set_persistable(true);
  OpDesc op = MakeOp("fill_constant", {}, {{"Out", {std::string(name)}}});
  SetAttr(&op, "shape", std::vector<int64_t>(shape.begin(), shape.end()));
  SetAttr(&op, "value", value);
  SetAttr(&op, "dtype", static_cast<int64_t>(dtype));
  *startup_->mutable_blocks(0)->add_ops() = op;
  return v;
}

const VarDesc* ProgramBuilder::FindVar(absl::string_view name) const {
  return FindVarDesc(main_->blocks(0), name);
}

OpDesc* ProgramBuilder::AppendOp(OpDesc op) {
  SetAttr(&op, kOpRoleAttr, role_);
  OpDesc* added = block()->add_ops();
  *added = std::move(op);
  return added;
}

}  // namespace tessera
