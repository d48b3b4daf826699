#include "common/layers/backward.h"

#include <algorithm>
#include <map>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "common/layers/program_builder.h"

namespace tessera {

namespace {

bool IsReal(const std::string& a) { return !a.empty() && a != kEmptyVarName; }

// Forward variables that carry a gradient: trainable parameters and everything computed from
// them, minus stop_gradient variables and `no_grad`.
absl::flat_hash_set<std::string> VarsNeedingGrad(const BlockDesc& block, int last_op,
                                                 const std::set<std::string>& no_grad) {
  absl::flat_hash_set<std::string> needs;
  auto blocked = [&](const std::string& name) {
    const VarDesc* v = FindVarDesc(block, name);
    return no_grad.count(name) > 0 || (v != nullptr && v->stop_gradient());
  };
  for (const auto& v : block.vars()) {
    if (v.trainable() && !blocked(v.name())) needs.insert(v.name());
  }
  for (int i = 0; i <= last_op; ++i) {
    const OpDesc& op = block.ops(i);
    bool any = false;
    for (const auto& a : AllInputArgs(op)) any |= needs.contains(a);
    if (!any) continue;
    for (const auto& a : AllOutputArgs(op)) {
      if (IsReal(a) && !blocked(a)) needs.insert(a);
    }
  }
  return needs;
}

// The only argument of `slot`, or "" unless there is exactly one.
std::string OnlyArg(const std::vector<std::string>& args) {
  return args.size() == 1 ? args[0] : std::string();
}

// elementwise_add_grad computes X@GRAD = Out@GRAD, and skips the copy when both are one variable.
// The name X@GRAD may then be bound to Out@GRAD's variable when that changes no value anybody
// reads: this op is X@GRAD's only producer (no accumulation), X is a dense temporary computed by
// a forward op (not a parameter, not fed: nobody asks for X@GRAD by name), Out too, and X and
// Out have one declared type and shape. Returns Out@GRAD's name then, else "".
std::string InPlaceAddGrad(const OpDesc& g, const BlockDesc& block,
                           const absl::flat_hash_set<std::string>& computed,
                           const std::map<std::string, int>& producers) {
  if (g.type() != "elementwise_add_grad") return "";
  const std::string x = OnlyArg(OpInputs(g, "X")), out = OnlyArg(OpInputs(g, "Out"));
  const std::string dx = OnlyArg(OpOutputs(g, "X@GRAD"));
  const std::string dout = OnlyArg(OpInputs(g, "Out@GRAD"));
  if (!IsReal(x) || !IsReal(out) || !IsReal(dx) || !IsReal(dout) || x == out || dx == dout) {
    return "";
  }
  auto p = producers.find(dx);
  if (p == producers.end() || p->second != 1) return "";
  if (!computed.contains(x) || !computed.contains(out)) return "";
  const VarDesc* xv = FindVarDesc(block, x);
  const VarDesc* ov = FindVarDesc(block, out);
  if (xv == nullptr || ov == nullptr) return "";
  for (const VarDesc* v : {xv, ov}) {
    if (v->persistable() || v->trainable() || v->is_sparse() || v->is_distributed() ||
        v->type() != DENSE_TENSOR) {
      return "";
    }
  }
  if (xv->dtype() != ov->dtype() ||
      !std::equal(xv->shape().begin(), xv->shape().end(), ov->shape().begin(), ov->shape().end())) {
    return "";
  }
  const VarDesc* gv = FindVarDesc(block, dout);
  if (gv != nullptr && gv->type() != DENSE_TENSOR) return "";
  return dout;
}

}  // namespace

absl::StatusOr<std::vector<ParamGrad>> AppendBackward(ProgramDesc* program,
                                                      const OpRegistry& registry,
                                                      const std::string& loss,
                                                      const std::set<std::string>& no_grad) {
  BlockDesc* block = program->mutable_blocks(0);
  int loss_op = -1;
  for (int i = 0; i < block->ops_size(); ++i) {
    for (const auto& a : AllOutputArgs(block->ops(i))) {
      if (a == loss) loss_op = i;
    }
  }
  if (loss_op < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("loss variable '", loss, "' is not produced by any op of block 0"));
  }
  SetAttr(block->mutable_ops(loss_op), kOpRoleAttr,
          OpRoleOf(block->ops(loss_op)) | int64_t{kRoleLoss});

  absl::flat_hash_set<std::string> needs = VarsNeedingGrad(*block, loss_op, no_grad);
  // Variables from which the loss is reachable, and the ops on the path.
  absl::flat_hash_set<std::string> reaches = {loss};
  std::vector<int> path;  // forward op indices, in reverse order
  for (int i = loss_op; i >= 0; --i) {
    const OpDesc& op = block->ops(i);
    bool feeds_loss = false, has_grad_input = false;
    for (const auto& a : AllOutputArgs(op)) feeds_loss |= reaches.contains(a);
    if (!feeds_loss) continue;
    for (const auto& a : AllInputArgs(op)) has_grad_input |= needs.contains(a);
    if (!has_grad_input) continue;
    for (const auto& a : AllInputArgs(op)) reaches.insert(a);
    path.push_back(i);
  }

  // The gradient ops of every path op, with gradients nobody needs pruned.
  absl::flat_hash_map<std::string, std::string> grad_to_var;  // x@GRAD -> x
  for (const auto& v : block->vars()) grad_to_var[GradVarName(v.name())] = v.name();
  std::vector<OpDesc> grads;
  std::vector<int> grads_fwd;  // forward op index of each grad op
  for (int i : path) {
    const OpDesc& fwd = block->ops(i);
    const OpInfo* info = registry.Find(fwd.type());
    if (info == nullptr) {
      return absl::NotFoundError(absl::StrCat("unknown op type '", fwd.type(), "'"));
    }
    if (!info->grad_maker) {
      return absl::InvalidArgumentError(absl::StrCat(
          "op #", i, " ", OpSignature(fwd), " lies between a parameter and loss '", loss,
          "' but has no gradient"));
    }
    for (OpDesc g : info->grad_maker(fwd)) {
      for (auto& slot : *g.mutable_outputs()) {
        for (auto& a : *slot.mutable_arguments()) {
          auto it = grad_to_var.find(a);
          if (it != grad_to_var.end() &&
              !(needs.contains(it->second) && reaches.contains(it->second))) {
            a = kEmptyVarName;
          }
        }
      }
      grads.push_back(std::move(g));
      grads_fwd.push_back(i);
    }
  }

  // Count producers of each gradient; multiply produced ones are renamed and summed.
  std::map<std::string, int> producers;
  for (const auto& g : grads) {
    for (const auto& a : AllOutputArgs(g)) {
      if (IsReal(a)) ++producers[a];
    }
  }
  // Variables the forward ops compute (up to the loss).
  absl::flat_hash_set<std::string> computed;
  for (int i = 0; i <= loss_op; ++i) {
    for (const auto& a : AllOutputArgs(block->ops(i))) {
      if (IsReal(a)) computed.insert(a);
    }
  }
  std::map<std::string, std::vector<std::string>> renamed;
  auto declare_grad = [&](const std::string& grad, const std::string& like) {
    if (FindVarDesc(*block, grad) != nullptr) return;
    auto it = grad_to_var.find(like);
    const VarDesc* fwd = it == grad_to_var.end() ? nullptr : FindVarDesc(*block, it->second);
    Shape shape;
    DataType dtype = FLOAT32;
    if (fwd != nullptr) {
      shape.assign(fwd->shape().begin(), fwd->shape().end());
      dtype = fwd->dtype();
    }
    VarDesc* v = DeclareVar(block, grad, shape, dtype);
    if (fwd != nullptr && fwd->is_sparse()) v->set_type(SELECTED_ROWS);
  };

  // Emit: loss@GRAD = 1, then each grad op (with zero-filled missing output gradients and
  // accumulation sums placed right after the last contribution).
  absl::flat_hash_set<std::string> produced;
  std::vector<OpDesc> emitted;
  {
    const VarDesc* lv = FindVarDesc(*block, loss);
    OpDesc fill = MakeOp("fill_constant", {}, {{"Out", {GradVarName(loss)}}});
    std::vector<int64_t> shape = {1};
    if (lv != nullptr && lv->shape_size() > 0) shape.assign(lv->shape().begin(), lv->shape().end());
    SetAttr(&fill, "shape", shape);
    SetAttr(&fill, "value", 1.0f);
    SetAttr(&fill, "dtype", static_cast<int64_t>(lv != nullptr ? lv->dtype() : FLOAT32));
    SetAttr(&fill, kOpRoleAttr, int64_t{kRoleBackward | kRoleLoss});
    emitted.push_back(fill);
    produced.insert(GradVarName(loss));
    declare_grad(GradVarName(loss), GradVarName(loss));
  }
  std::map<std::string, int> seen;
  for (size_t k = 0; k < grads.size(); ++k) {
    OpDesc& g = grads[k];
    const OpDesc& fwd = block->ops(grads_fwd[k]);
    // X@GRAD of an elementwise_add_grad in place of its Out@GRAD where that is safe: no copy,
    // one buffer less. Later grad ops read Out@GRAD instead.
    const std::string in_place = InPlaceAddGrad(g, *block, computed, producers);
    if (!in_place.empty()) {
      const std::string dx = OpOutput(g, "X@GRAD");
      SetOpOutputs(&g, "X@GRAD", {in_place});
      for (size_t later = k + 1; later < grads.size(); ++later) {
        RenameOpInput(&grads[later], dx, in_place);
      }
    }
    // Output gradients of the forward op that nothing produced are zero.
    for (const auto& out : AllOutputArgs(fwd)) {
      std::string dout = GradVarName(out);
      bool used = false;
      for (const auto& a : AllInputArgs(g)) used |= (a == dout);
      if (used && !produced.contains(dout)) {
        OpDesc zeros = MakeOp("fill_zeros_like", {{"X", {out}}}, {{"Out", {dout}}});
        SetAttr(&zeros, kOpRoleAttr, int64_t{kRoleBackward});
        emitted.push_back(zeros);
        produced.insert(dout);
        declare_grad(dout, dout);
      }
    }
    std::vector<std::string> finished;
    for (auto& slot : *g.mutable_outputs()) {
      for (auto& a : *slot.mutable_arguments()) {
        if (!IsReal(a) || a == in_place) continue;  // in place: produced already
        std::string original = a;
        declare_grad(original, original);
        if (producers[original] > 1) {
          int n = seen[original]++;
          a = absl::StrCat(original, "@RENAME@", n);
          declare_grad(a, original);
          if (FindVarDesc(*block, original)->type() == SELECTED_ROWS) {
            FindMutableVarDesc(block, a)->set_type(SELECTED_ROWS);
          }
          renamed[original].push_back(a);
          if (n + 1 == producers[original]) finished.push_back(original);
        } else {
          finished.push_back(original);
        }
      }
    }
    SetAttr(&g, kOpRoleAttr, int64_t{kRoleBackward});
    emitted.push_back(g);
    for (const auto& f : finished) {
      if (renamed.count(f) > 0) {
        OpDesc sum = MakeOp("sum", {{"X", renamed[f]}}, {{"Out", {f}}});
        SetAttr(&sum, kOpRoleAttr, int64_t{kRoleBackward});
        emitted.push_back(sum);
      }
      produced.insert(f);
    }
  }

  // Parameter gradients, in declaration order, tagged on the op that finally writes them.
  std::vector<ParamGrad> pairs;
  for (const auto& v : block->vars()) {
    if (!v.trainable() || !produced.contains(GradVarName(v.name()))) continue;
    pairs.push_back({v.name(), GradVarName(v.name())});
  }
  for (const auto& pg : pairs) {
    for (auto it = emitted.rbegin(); it != emitted.rend(); ++it) {
      bool writes = false;
      for (const auto& a : AllOutputArgs(*it)) writes |= (a == pg.grad);
      if (writes) {
        std::vector<std::string> role_var = GetStringsAttr(*it, kOpRoleVarAttr);
        role_var.push_back(pg.param);
        role_var.push_back(pg.grad);
        SetAttr(&*it, kOpRoleVarAttr, role_var);
        break;
      }
    }
  }
  for (auto& op : emitted) *block->add_ops() = std::move(op);
  return pairs;
}

}  // namespace tessera
