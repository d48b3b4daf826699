#include "common/framework/op_registry.h"

#include "absl/strings/str_cat.h"

namespace tessera {

namespace {
bool RealArg(const std::string& a) { return !a.empty() && a != kEmptyVarName; }

using Slots = google::protobuf::RepeatedPtrField<OpDesc::Var>;

// The arguments bound to `slot` (the first entry of that name, as OpInputs reads it), or null:
// kernels look their variables up every step, so this copies nothing.
const google::protobuf::RepeatedPtrField<std::string>* SlotArguments(const Slots& slots,
                                                                     absl::string_view slot) {
  for (const auto& s : slots) {
    if (s.parameter() == slot) return &s.arguments();
  }
  return nullptr;
}

// Argument i of `slot`; the empty string when there is none.
const std::string& ArgAt(const Slots& slots, absl::string_view slot, int i) {
  static const std::string* const kNone = new std::string();
  const auto* args = SlotArguments(slots, slot);
  return args != nullptr && i >= 0 && i < args->size() ? args->Get(i) : *kNone;
}

bool AnyRealArg(const Slots& slots, absl::string_view slot) {
  const auto* args = SlotArguments(slots, slot);
  if (args == nullptr) return false;
  for (const std::string& a : *args) {
    if (RealArg(a)) return true;
  }
  return false;
}

int ArgCount(const Slots& slots, absl::string_view slot) {
  const auto* args = SlotArguments(slots, slot);
  return args == nullptr ? 0 : args->size();
}

// Argument i of `slot` among all arguments of `slots` in order (as OpArgs holds them), or -1.
int FlatIndex(const Slots& slots, absl::string_view slot, int i) {
  int offset = 0;
  for (const auto& s : slots) {
    if (s.parameter() == slot) return i >= 0 && i < s.arguments_size() ? offset + i : -1;
    offset += s.arguments_size();
  }
  return -1;
}

// The resolved variable of argument i of `slot`, or null.
Variable* Resolved(const std::vector<Variable*>* resolved, const Slots& slots,
                   absl::string_view slot, int i) {
  if (resolved == nullptr) return nullptr;
  const int at = FlatIndex(slots, slot, i);
  return at >= 0 && at < static_cast<int>(resolved->size()) ? (*resolved)[at] : nullptr;
}

void ResolveSlots(const Slots& slots, const Scope& scope, std::vector<Variable*>* out) {
  for (const auto& s : slots) {
    for (const std::string& a : s.arguments()) {
      out->push_back(RealArg(a) ? scope.FindVar(a) : nullptr);
    }
  }
}
}  // namespace

OpArgs ResolveOpArgs(const OpDesc& op, const Scope& scope) {
  OpArgs args;
  ResolveSlots(op.inputs(), scope, &args.inputs);
  ResolveSlots(op.outputs(), scope, &args.outputs);
  return args;
}

bool OpContext::HasInput(absl::string_view slot) const { return AnyRealArg(op_.inputs(), slot); }

bool OpContext::HasOutput(absl::string_view slot) const {
  return AnyRealArg(op_.outputs(), slot);
}

std::string OpContext::InputName(absl::string_view slot, int i) const {
  return ArgAt(op_.inputs(), slot, i);
}
std::string OpContext::OutputName(absl::string_view slot, int i) const {
  return ArgAt(op_.outputs(), slot, i);
}

absl::StatusOr<const Variable*> OpContext::InputVar(absl::string_view slot, int i) const {
  const std::string& name = ArgAt(op_.inputs(), slot, i);
  if (!RealArg(name)) {
    return Error(absl::StrCat("input slot ", slot, "[", i, "] is not bound"));
  }
  const Variable* v = Resolved(args_ == nullptr ? nullptr : &args_->inputs, op_.inputs(), slot, i);
  if (v == nullptr) v = scope_->FindVar(name);
  if (v == nullptr || !v->IsInitialized()) {
    return Error(absl::StrCat("input ", slot, " variable '", name,
                              "' is absent from the scope (not fed or not computed yet)"));
  }
  return v;
}

absl::StatusOr<const Tensor*> OpContext::Input(absl::string_view slot, int i) const {
  auto v = InputVar(slot, i);
  if (!v.ok()) return v.status();
  const Tensor* t = (*v)->GetIf<Tensor>();
  if (t == nullptr || !t->initialized()) {
    return Error(absl::StrCat("input ", slot, " variable '", InputName(slot, i),
                              "' is not an initialized dense tensor"));
  }
  return t;
}

absl::StatusOr<std::vector<const Tensor*>> OpContext::Inputs(absl::string_view slot) const {
  std::vector<const Tensor*> out;
  const int n = ArgCount(op_.inputs(), slot);
  for (int i = 0; i < n; ++i) {
    auto t = Input(slot, i);
    if (!t.ok()) return t.status();
    out.push_back(*t);
  }
  return out;
}

absl::StatusOr<Variable*> OpContext::OutputVar(absl::string_view slot, int i) {
  const std::string& name = ArgAt(op_.outputs(), slot, i);
  if (!RealArg(name)) {
    return Error(absl::StrCat("output slot ", slot, "[", i, "] is not bound"));
  }
  Variable* v = Resolved(args_ == nullptr ? nullptr : &args_->outputs, op_.outputs(), slot, i);
  if (v == nullptr) v = scope_->FindVar(name);
  if (v == nullptr) v = scope_->Var(name);
  return v;
}

absl::StatusOr<Tensor*> OpContext::Output(absl::string_view slot, int i) {
  auto v = OutputVar(slot, i);
  if (!v.ok()) return v.status();
  return (*v)->GetMutable<Tensor>();
}

absl::StatusOr<std::vector<Tensor*>> OpContext::Outputs(absl::string_view slot) {
  std::vector<Tensor*> out;
  const int n = ArgCount(op_.outputs(), slot);
  for (int i = 0; i < n; ++i) {
    auto t = Output(slot, i);
    if (!t.ok()) return t.status();
    out.push_back(*t);
  }
  return out;
}

void OpContext::NoteAttrType(absl::string_view name, bool ok) const {
  if (!ok && attr_status_.ok()) {
    attr_status_ = absl::InvalidArgumentError(
        absl::StrCat("attribute '", name, "' has the wrong type"));
  }
}

int64_t OpContext::IntAttr(absl::string_view name, int64_t dflt) const {
  bool ok = true;
  int64_t v = GetIntAttr(op_, name, dflt, &ok);
  NoteAttrType(name, ok);
  return v;
}
float OpContext::FloatAttr(absl::string_view name, float dflt) const {
  bool ok = true;
  float v = static_cast<float>(GetFloatAttr(op_, name, dflt, &ok));
  NoteAttrType(name, ok);
  return v;
}
bool OpContext::BoolAttr(absl::string_view name, bool dflt) const {
  bool ok = true;
  bool v = GetBoolAttr(op_, name, dflt, &ok);
  NoteAttrType(name, ok);
  return v;
}
std::string OpContext::StringAttr(absl::string_view name, absl::string_view dflt) const {
  bool ok = true;
  std::string v = GetStringAttr(op_, name, dflt, &ok);
  NoteAttrType(name, ok);
  return v;
}
std::vector<int64_t> OpContext::IntsAttr(absl::string_view name) const {
  bool ok = true;
  auto v = GetIntsAttr(op_, name, &ok);
  NoteAttrType(name, ok);
  return v;
}
std::vector<float> OpContext::FloatsAttr(absl::string_view name) const {
  bool ok = true;
  auto v = GetFloatsAttr(op_, name, &ok);
  NoteAttrType(name, ok);
  return v;
}
std::vector<std::string> OpContext::StringsAttr(absl::string_view name) const {
  bool ok = true;
  auto v = GetStringsAttr(op_, name, &ok);
  NoteAttrType(name, ok);
  return v;
}

absl::Status OpContext::Error(absl::string_view message) const {
  return absl::InvalidArgumentError(message);
}

absl::Status OpContext::CheckDType(absl::string_view slot, const Tensor& t, DataType want) const {
  if (t.dtype() == want) return absl::OkStatus();
  return Error(absl::StrCat(slot, " '", InputName(slot), "' is ", DataTypeName(t.dtype()),
                            ", expected ", DataTypeName(want)));
}

absl::Status OpRegistry::Register(absl::string_view type, OpInfo info) {
  if (!info.kernel) {
    return absl::InvalidArgumentError(absl::StrCat("op '", type, "' registered without a kernel"));
  }
  auto [it, inserted] = ops_.emplace(std::string(type), std::move(info));
  if (!inserted) {
    return absl::AlreadyExistsError(absl::StrCat("op '", type, "' is already registered"));
  }
  return absl::OkStatus();
}

const OpInfo* OpRegistry::Find(absl::string_view type) const {
  auto it = ops_.find(type);
  return it == ops_.end() ? nullptr : &it->second;
}

std::vector<std::string> OpRegistry::Types() const {
  std::vector<std::string> out;
  for (const auto& kv : ops_) out.push_back(kv.first);
  return out;
}

GradMakerFn DefaultGradMaker(std::vector<std::string> grad_inputs) {
  return [grad_inputs = std::move(grad_inputs)](const OpDesc& fwd) {
    OpDesc g;
    g.set_type(fwd.type() + "_grad");
    for (const auto& s : fwd.inputs()) *g.add_inputs() = s;
    for (const auto& s : fwd.outputs()) {
      *g.add_inputs() = s;
      OpDesc::Var grad_slot;
      grad_slot.set_parameter(GradVarName(s.parameter()));
      for (const auto& a : s.arguments()) grad_slot.add_arguments(GradVarName(a));
      *g.add_inputs() = grad_slot;
    }
    for (const auto& slot : grad_inputs) {
      std::vector<std::string> args;
      for (const auto& a : OpInputs(fwd, slot)) args.push_back(GradVarName(a));
      SetOpOutputs(&g, GradVarName(slot), args);
    }
    *g.mutable_attrs() = fwd.attrs();
    return std::vector<OpDesc>{g};
  };
}

}  // namespace tessera
