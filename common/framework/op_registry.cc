#include "common/framework/op_registry.h"

#include "absl/base/attributes.h"
#include "absl/strings/str_cat.h"

namespace tessera {

namespace {
bool RealArg(absl::string_view a) { return !a.empty() && a != absl::string_view(kEmptyVarName); }

using Slots = google::protobuf::RepeatedPtrField<OpDesc::Var>;

// The arguments bound to `slot` (the first entry of that name, as OpInputs reads it), or null:
// kernels look their variables up every step, so this copies nothing.
const google::protobuf::RepeatedPtrField<std::string>* SlotArguments(const Slots& slots,
                                                                     absl::string_view slot) {
  for (const auto& s : slots) {
    if (SameName(s.parameter(), slot)) return &s.arguments();
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

void ResolveSlots(const Slots& slots, const Scope& scope, std::vector<OpArgs::Slot>* table,
                  std::vector<Variable*>* out) {
  for (const auto& s : slots) {
    OpArgs::Slot entry;
    entry.parameter = s.parameter();
    entry.begin = static_cast<int>(out->size());
    entry.size = s.arguments_size();
    for (const std::string& a : s.arguments()) {
      const bool real = RealArg(a);
      entry.any_real |= real;
      out->push_back(real ? scope.FindVar(a) : nullptr);
    }
    table->push_back(entry);
  }
}

// The first slot named `slot` in a resolved table (as SlotArguments finds it), or null.
const OpArgs::Slot* FindSlot(const std::vector<OpArgs::Slot>& table, absl::string_view slot) {
  for (const OpArgs::Slot& s : table) {
    if (SameName(s.parameter, slot)) return &s;
  }
  return nullptr;
}

// The resolved variable of argument i of `slot` (the fast path of InputVar/OutputVar), or null
// when there is none: the slow path then looks the name up and reports errors.
Variable* ResolvedVar(const std::vector<OpArgs::Slot>& table, const std::vector<Variable*>& vars,
                      absl::string_view slot, int i) {
  const OpArgs::Slot* s = FindSlot(table, slot);
  if (s == nullptr || i < 0 || i >= s->size) return nullptr;
  return vars[static_cast<size_t>(s->begin + i)];
}

// How many arguments `slot` binds: from the resolved table when there is one.
int ArgCount(const std::vector<OpArgs::Slot>* table, const Slots& slots, absl::string_view slot) {
  if (table != nullptr) {
    const OpArgs::Slot* s = FindSlot(*table, slot);
    return s == nullptr ? 0 : s->size;
  }
  const auto* args = SlotArguments(slots, slot);
  return args == nullptr ? 0 : args->size();
}

// The slow paths of InputVar, Input, OutputVar and Output: by name in the scope (an op run
// without resolved arguments, or a variable created since), and every error. Out of line, so
// that the fast paths stay small.
ABSL_ATTRIBUTE_NOINLINE absl::StatusOr<const Variable*> InputVarByName(const OpContext& ctx,
                                                                       absl::string_view slot,
                                                                       int i) {
  const std::string& name = ArgAt(ctx.op().inputs(), slot, i);
  if (!RealArg(name)) {
    return ctx.Error(absl::StrCat("input slot ", slot, "[", i, "] is not bound"));
  }
  const Variable* v = ctx.scope()->FindVar(name);
  if (v == nullptr || !v->IsInitialized()) {
    return ctx.Error(absl::StrCat("input ", slot, " variable '", name,
                                  "' is absent from the scope (not fed or not computed yet)"));
  }
  return v;
}

ABSL_ATTRIBUTE_NOINLINE absl::StatusOr<const Tensor*> InputByName(const OpContext& ctx,
                                                                  absl::string_view slot, int i) {
  auto v = ctx.InputVar(slot, i);
  if (!v.ok()) return v.status();
  const Tensor* t = (*v)->GetIf<Tensor>();
  if (t == nullptr || !t->initialized()) {
    return ctx.Error(absl::StrCat("input ", slot, " variable '", ctx.InputName(slot, i),
                                  "' is not an initialized dense tensor"));
  }
  return t;
}

ABSL_ATTRIBUTE_NOINLINE absl::StatusOr<Variable*> OutputVarByName(const OpContext& ctx,
                                                                  absl::string_view slot, int i) {
  const std::string& name = ArgAt(ctx.op().outputs(), slot, i);
  if (!RealArg(name)) {
    return ctx.Error(absl::StrCat("output slot ", slot, "[", i, "] is not bound"));
  }
  Variable* v = ctx.scope()->FindVar(name);
  if (v == nullptr) v = ctx.scope()->Var(name);
  return v;
}
}  // namespace

OpArgs ResolveOpArgs(const OpDesc& op, const Scope& scope) {
  OpArgs args;
  ResolveSlots(op.inputs(), scope, &args.input_slots, &args.inputs);
  ResolveSlots(op.outputs(), scope, &args.output_slots, &args.outputs);
  return args;
}

bool OpContext::HasInput(absl::string_view slot) const {
  if (args_ != nullptr) {
    const OpArgs::Slot* s = FindSlot(args_->input_slots, slot);
    return s != nullptr && s->any_real;
  }
  return AnyRealArg(op_.inputs(), slot);
}

bool OpContext::HasOutput(absl::string_view slot) const {
  if (args_ != nullptr) {
    const OpArgs::Slot* s = FindSlot(args_->output_slots, slot);
    return s != nullptr && s->any_real;
  }
  return AnyRealArg(op_.outputs(), slot);
}

std::string OpContext::InputName(absl::string_view slot, int i) const {
  return ArgAt(op_.inputs(), slot, i);
}
std::string OpContext::OutputName(absl::string_view slot, int i) const {
  return ArgAt(op_.outputs(), slot, i);
}

absl::StatusOr<const Variable*> OpContext::InputVar(absl::string_view slot, int i) const {
  if (args_ != nullptr) {
    const Variable* v = ResolvedVar(args_->input_slots, args_->inputs, slot, i);
    if (v != nullptr && v->IsInitialized()) return v;
  }
  return InputVarByName(*this, slot, i);
}

absl::StatusOr<const Tensor*> OpContext::Input(absl::string_view slot, int i) const {
  if (args_ != nullptr) {
    const Variable* v = ResolvedVar(args_->input_slots, args_->inputs, slot, i);
    const Tensor* t = v == nullptr ? nullptr : v->GetIf<Tensor>();
    if (t != nullptr && t->initialized()) return t;
  }
  return InputByName(*this, slot, i);
}

absl::StatusOr<std::vector<const Tensor*>> OpContext::Inputs(absl::string_view slot) const {
  std::vector<const Tensor*> out;
  const int n = ArgCount(args_ == nullptr ? nullptr : &args_->input_slots, op_.inputs(), slot);
  for (int i = 0; i < n; ++i) {
    auto t = Input(slot, i);
    if (!t.ok()) return t.status();
    out.push_back(*t);
  }
  return out;
}

absl::StatusOr<Variable*> OpContext::OutputVar(absl::string_view slot, int i) {
  if (args_ != nullptr) {
    Variable* v = ResolvedVar(args_->output_slots, args_->outputs, slot, i);
    if (v != nullptr) return v;
  }
  return OutputVarByName(*this, slot, i);
}

absl::StatusOr<Tensor*> OpContext::Output(absl::string_view slot, int i) {
  Variable* v =
      args_ == nullptr ? nullptr : ResolvedVar(args_->output_slots, args_->outputs, slot, i);
  if (v == nullptr) {
    auto by_name = OutputVarByName(*this, slot, i);
    if (!by_name.ok()) return by_name.status();
    v = *by_name;
  }
  return v->GetMutable<Tensor>();
}

absl::StatusOr<std::vector<Tensor*>> OpContext::Outputs(absl::string_view slot) {
  std::vector<Tensor*> out;
  const int n = ArgCount(args_ == nullptr ? nullptr : &args_->output_slots, op_.outputs(), slot);
  for (int i = 0; i < n; ++i) {
    auto t = Output(slot, i);
    if (!t.ok()) return t.status();
    out.push_back(*t);
  }
  return out;
}

void OpContext::NoteAttrType(absl::string_view name, bool ok) const {
  if (!ok && attr_status_.ok()) {
    attr_status_ =
        absl::InvalidArgumentError(absl::StrCat("attribute '", name, "' has the wrong type"));
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
