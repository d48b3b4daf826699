#include "common/framework/op_desc.h"

#include "absl/strings/match.h"
#include "absl/strings/strip.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace tessera {

namespace {
constexpr absl::string_view kGradSuffix = "@GRAD";

std::vector<std::string> SlotArgs(const google::protobuf::RepeatedPtrField<OpDesc::Var>& slots,
                                  absl::string_view slot) {
  for (const auto& s : slots) {
    if (s.parameter() == slot) return {s.arguments().begin(), s.arguments().end()};
  }
  return {};
}

void SetSlot(google::protobuf::RepeatedPtrField<OpDesc::Var>* slots, absl::string_view slot,
             std::vector<std::string> args) {
  for (auto& s : *slots) {
    if (s.parameter() == slot) {
      s.clear_arguments();
      for (auto& a : args) s.add_arguments(std::move(a));
      return;
    }
  }
  auto* s = slots->Add();
  s->set_parameter(std::string(slot));
  for (auto& a : args) s->add_arguments(std::move(a));
}

std::vector<std::string> AllArgs(const google::protobuf::RepeatedPtrField<OpDesc::Var>& slots) {
  std::vector<std::string> out;
  for (const auto& s : slots) out.insert(out.end(), s.arguments().begin(), s.arguments().end());
  return out;
}

void RenameIn(google::protobuf::RepeatedPtrField<OpDesc::Var>* slots, absl::string_view from,
              absl::string_view to) {
  for (auto& s : *slots) {
    for (auto& a : *s.mutable_arguments()) {
      if (a == from) a = std::string(to);
    }
  }
}

OpDesc::Attr* MutableAttr(OpDesc* op, absl::string_view name) {
  for (auto& a : *op->mutable_attrs()) {
    if (a.name() == name) {
      a.Clear();
      a.set_name(std::string(name));
      return &a;
    }
  }
  auto* a = op->add_attrs();
  a->set_name(std::string(name));
  return a;
}

void Mismatch(bool* ok) {
  if (ok != nullptr) *ok = false;
}
}  // namespace

std::string GradVarName(absl::string_view var) { return absl::StrCat(var, kGradSuffix); }
bool IsGradVarName(absl::string_view var) { return absl::EndsWith(var, kGradSuffix); }
std::string OriginalVarName(absl::string_view grad_var) {
  absl::string_view v = grad_var;
  absl::ConsumeSuffix(&v, kGradSuffix);
  return std::string(v);
}

OpDesc MakeOp(absl::string_view type, const Slots& inputs, const Slots& outputs) {
  OpDesc op;
  op.set_type(std::string(type));
  for (const auto& [slot, args] : inputs) SetOpInputs(&op, slot, args);
  for (const auto& [slot, args] : outputs) SetOpOutputs(&op, slot, args);
  return op;
}

std::vector<std::string> OpInputs(const OpDesc& op, absl::string_view slot) {
  return SlotArgs(op.inputs(), slot);
}
std::vector<std::string> OpOutputs(const OpDesc& op, absl::string_view slot) {
  return SlotArgs(op.outputs(), slot);
}
std::string OpInput(const OpDesc& op, absl::string_view slot) {
  auto args = OpInputs(op, slot);
  return args.empty() ? "" : args[0];
}
std::string OpOutput(const OpDesc& op, absl::string_view slot) {
  auto args = OpOutputs(op, slot);
  return args.empty() ? "" : args[0];
}
void SetOpInputs(OpDesc* op, absl::string_view slot, std::vector<std::string> args) {
  SetSlot(op->mutable_inputs(), slot, std::move(args));
}
void SetOpOutputs(OpDesc* op, absl::string_view slot, std::vector<std::string> args) {
  SetSlot(op->mutable_outputs(), slot, std::move(args));
}
std::vector<std::string> AllInputArgs(const OpDesc& op) { return AllArgs(op.inputs()); }
std::vector<std::string> AllOutputArgs(const OpDesc& op) { return AllArgs(op.outputs()); }
void RenameOpInput(OpDesc* op, absl::string_view from, absl::string_view to) {
  RenameIn(op->mutable_inputs(), from, to);
}
void RenameOpOutput(OpDesc* op, absl::string_view from, absl::string_view to) {
  RenameIn(op->mutable_outputs(), from, to);
}

const OpDesc::Attr* FindAttr(const OpDesc& op, absl::string_view name) {
  for (const auto& a : op.attrs()) {
    if (SameName(a.name(), name)) return &a;
  }
  return nullptr;
}

void SetAttr(OpDesc* op, absl::string_view name, int64_t v) { MutableAttr(op, name)->set_i(v); }
void SetAttr(OpDesc* op, absl::string_view name, float v) { MutableAttr(op, name)->set_f(v); }
void SetAttr(OpDesc* op, absl::string_view name, double v) { MutableAttr(op, name)->set_d(v); }
void SetAttr(OpDesc* op, absl::string_view name, bool v) { MutableAttr(op, name)->set_b(v); }
void SetAttr(OpDesc* op, absl::string_view name, absl::string_view v) {
  MutableAttr(op, name)->set_s(std::string(v));
}
void SetAttr(OpDesc* op, absl::string_view name, const std::vector<int64_t>& v) {
  auto* ints = MutableAttr(op, name)->mutable_ints();
  for (int64_t x : v) ints->add_v(x);
}
void SetAttr(OpDesc* op, absl::string_view name, const std::vector<float>& v) {
  auto* fs = MutableAttr(op, name)->mutable_floats();
  for (float x : v) fs->add_v(x);
}
void SetAttr(OpDesc* op, absl::string_view name, const std::vector<std::string>& v) {
  auto* ss = MutableAttr(op, name)->mutable_strings();
  for (const auto& x : v) ss->add_v(x);
}
void SetBlockAttr(OpDesc* op, absl::string_view name, int32_t block_idx) {
  MutableAttr(op, name)->set_block(block_idx);
}

int64_t GetIntAttr(const OpDesc& op, absl::string_view name, int64_t dflt, bool* ok) {
  const auto* a = FindAttr(op, name);
  if (a == nullptr) return dflt;
  switch (a->value_case()) {
    case OpDesc::Attr::kI:
      return a->i();
    case OpDesc::Attr::kB:
      return a->b() ? 1 : 0;
    default:
      Mismatch(ok);
      return dflt;
  }
}

double GetFloatAttr(const OpDesc& op, absl::string_view name, double dflt, bool* ok) {
  const auto* a = FindAttr(op, name);
  if (a == nullptr) return dflt;
  switch (a->value_case()) {
    case OpDesc::Attr::kF:
      return a->f();
    case OpDesc::Attr::kD:
      return a->d();
    case OpDesc::Attr::kI:
      return static_cast<double>(a->i());
    default:
      Mismatch(ok);
      return dflt;
  }
}

bool GetBoolAttr(const OpDesc& op, absl::string_view name, bool dflt, bool* ok) {
  const auto* a = FindAttr(op, name);
  if (a == nullptr) return dflt;
  if (a->value_case() == OpDesc::Attr::kB) return a->b();
  if (a->value_case() == OpDesc::Attr::kI) return a->i() != 0;
  Mismatch(ok);
  return dflt;
}

std::string GetStringAttr(const OpDesc& op, absl::string_view name, absl::string_view dflt,
                          bool* ok) {
  const auto* a = FindAttr(op, name);
  if (a == nullptr) return std::string(dflt);
  if (a->value_case() == OpDesc::Attr::kS) return a->s();
  Mismatch(ok);
  return std::string(dflt);
}

std::vector<int64_t> GetIntsAttr(const OpDesc& op, absl::string_view name, bool* ok) {
  const auto* a = FindAttr(op, name);
  if (a == nullptr) return {};
  if (a->value_case() == OpDesc::Attr::kInts) return {a->ints().v().begin(), a->ints().v().end()};
  Mismatch(ok);
  return {};
}

std::vector<float> GetFloatsAttr(const OpDesc& op, absl::string_view name, bool* ok) {
  const auto* a = FindAttr(op, name);
  if (a == nullptr) return {};
  if (a->value_case() == OpDesc::Attr::kFloats) {
    return {a->floats().v().begin(), a->floats().v().end()};
  }
  Mismatch(ok);
  return {};
}

std::vector<std::string> GetStringsAttr(const OpDesc& op, absl::string_view name, bool* ok) {
  const auto* a = FindAttr(op, name);
  if (a == nullptr) return {};
  if (a->value_case() == OpDesc::Attr::kStrings) {
    return {a->strings().v().begin(), a->strings().v().end()};
  }
  Mismatch(ok);
  return {};
}

int32_t GetBlockAttr(const OpDesc& op, absl::string_view name, int32_t dflt) {
  const auto* a = FindAttr(op, name);
  if (a == nullptr || a->value_case() != OpDesc::Attr::kBlock) return dflt;
  return a->block();
}

int64_t OpRoleOf(const OpDesc& op) { return GetIntAttr(op, kOpRoleAttr, kRoleForward); }

const VarDesc* FindVarDesc(const BlockDesc& block, absl::string_view name) {
  for (const auto& v : block.vars()) {
    if (v.name() == name) return &v;
  }
  return nullptr;
}

VarDesc* FindMutableVarDesc(BlockDesc* block, absl::string_view name) {
  for (auto& v : *block->mutable_vars()) {
    if (v.name() == name) return &v;
  }
  return nullptr;
}

std::string OpSignature(const OpDesc& op) {
  auto slots = [](const google::protobuf::RepeatedPtrField<OpDesc::Var>& vs) {
    std::vector<std::string> parts;
    for (const auto& s : vs) {
      parts.push_back(absl::StrCat(s.parameter(), "=", absl::StrJoin(s.arguments(), ",")));
    }
    return absl::StrJoin(parts, ", ");
  };
  return absl::StrCat(op.type(), "(", slots(op.inputs()), ") -> (", slots(op.outputs()), ")");
}

std::string OpBrief(const OpDesc& op, int max_args) {
  std::vector<std::string> parts;
  int shown = 0, total = 0;
  for (const auto& slot : op.inputs()) {
    std::vector<std::string> args;
    for (const auto& a : slot.arguments()) {
      ++total;
      if (shown < max_args) {
        args.push_back(a);
        ++shown;
      }
    }
    if (args.empty()) continue;
    parts.push_back(absl::StrCat(slot.parameter(), "=", absl::StrJoin(args, ",")));
  }
  std::string more = total > shown ? absl::StrCat(" ... and ", total - shown, " more") : "";
  return absl::StrCat(op.type(), "(", absl::StrJoin(parts, ", "), more, ")");
}

}  // namespace tessera
