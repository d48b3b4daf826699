// Op kernels and their registry.
//
// An op type maps to an OpInfo: a CPU kernel (runs the op on a Scope) and, for differentiable
// ops, a gradient maker (builds the gradient OpDescs that AppendBackward inserts). A registry is
// an ordinary object: build one, register op families into it (RegisterStandardOps), then share
// it read-only; daemons add their own ops (send, recv, listen_and_serv) to their registry.
#ifndef TESSERA_COMMON_FRAMEWORK_OP_REGISTRY_H_
#define TESSERA_COMMON_FRAMEWORK_OP_REGISTRY_H_

#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/framework/op_desc.h"
#include "common/framework/scope.h"
#include "proto/program.pb.h"

namespace tessera {

// Placeholder argument for a gradient output nobody needs; kernels skip such outputs.
inline constexpr char kEmptyVarName[] = "@EMPTY@";

// The variables an op's arguments name in one scope, resolved ahead of its runs (the
// Executor's cache): parallel to the op's input (output) arguments, slot after slot in the
// OpDesc's order; null where an argument is empty or the scope had no such variable then.
// The slot tables let a kernel find a slot's arguments without reading the OpDesc.
struct OpArgs {
  // One slot of the op: its name (a view into the OpDesc, which must outlive this), where its
  // arguments start in `inputs` (`outputs`), how many there are, and whether any is real (not
  // empty, not kEmptyVarName).
  struct Slot {
    absl::string_view parameter;
    int begin = 0;
    int size = 0;
    bool any_real = false;
  };
  std::vector<Slot> input_slots;
  std::vector<Slot> output_slots;
  std::vector<Variable*> inputs;
  std::vector<Variable*> outputs;
};
// Resolves `op`'s arguments in `scope` (FindVar).
OpArgs ResolveOpArgs(const OpDesc& op, const Scope& scope);

// What a kernel sees while it runs one op. Created per op run; not thread-safe.
class OpContext {
 public:
  // `args` (may be null) are the op's arguments resolved in `scope` beforehand; an argument
  // without one is looked up by name.
  OpContext(const OpDesc& op, Scope* scope, const OpArgs* args = nullptr)
      : op_(op), scope_(scope), args_(args) {}

  const OpDesc& op() const { return op_; }
  Scope* scope() const { return scope_; }

  // True if the slot binds at least one real (non-empty) variable.
  bool HasInput(absl::string_view slot) const;
  bool HasOutput(absl::string_view slot) const;
  // Name bound to a slot (first argument), "" if none.
  std::string InputName(absl::string_view slot, int i = 0) const;
  std::string OutputName(absl::string_view slot, int i = 0) const;

  // The initialized dense tensor bound to `slot` (argument i). Error names the op, slot and
  // variable when it is missing, uninitialized or not dense.
  absl::StatusOr<const Tensor*> Input(absl::string_view slot, int i = 0) const;
  // All tensors bound to `slot`.
  absl::StatusOr<std::vector<const Tensor*>> Inputs(absl::string_view slot) const;
  // The variable bound to `slot` (argument i), which must exist and be initialized.
  absl::StatusOr<const Variable*> InputVar(absl::string_view slot, int i = 0) const;
  // The dense output tensor (variable created in the scope if absent). Caller Resize()s it.
  absl::StatusOr<Tensor*> Output(absl::string_view slot, int i = 0);
  absl::StatusOr<std::vector<Tensor*>> Outputs(absl::string_view slot);
  absl::StatusOr<Variable*> OutputVar(absl::string_view slot, int i = 0);

  // Attribute reads with defaults; a present attribute of the wrong type is recorded and
  // reported by the executor after the kernel returns.
  int64_t IntAttr(absl::string_view name, int64_t dflt) const;
  float FloatAttr(absl::string_view name, float dflt) const;
  bool BoolAttr(absl::string_view name, bool dflt) const;
  std::string StringAttr(absl::string_view name, absl::string_view dflt = "") const;
  std::vector<int64_t> IntsAttr(absl::string_view name) const;
  std::vector<float> FloatsAttr(absl::string_view name) const;
  std::vector<std::string> StringsAttr(absl::string_view name) const;
  absl::Status attr_status() const { return attr_status_; }

  // InvalidArgument whose message the executor prefixes with the op's signature.
  absl::Status Error(absl::string_view message) const;
  // Checks dtype of `t` (bound to `slot`); error names slot, variable and both types.
  absl::Status CheckDType(absl::string_view slot, const Tensor& t, DataType want) const;

 private:
  void NoteAttrType(absl::string_view name, bool ok) const;

  const OpDesc& op_;
  Scope* scope_;
  const OpArgs* args_;
  mutable absl::Status attr_status_;
};

using KernelFn = std::function<absl::Status(OpContext&)>;
// Builds the gradient ops of a forward op. Conventions: an input gradient is named
// GradVarName(input), an output gradient GradVarName(output); AppendBackward renames,
// prunes (kEmptyVarName) and accumulates them as needed.
using GradMakerFn = std::function<std::vector<OpDesc>(const OpDesc& forward)>;

struct OpInfo {
  KernelFn kernel;
  GradMakerFn grad_maker;  // empty: no gradient flows through this op
};

class OpRegistry {
 public:
  // Registers `type`; fails (AlreadyExists) if it is registered already.
  absl::Status Register(absl::string_view type, OpInfo info);
  // nullptr when `type` is unknown.
  const OpInfo* Find(absl::string_view type) const;
  std::vector<std::string> Types() const;

 private:
  std::map<std::string, OpInfo, std::less<>> ops_;
};

// Gradient maker for the common case: one grad op "<type>_grad" whose inputs are the forward
// op's inputs, its outputs and the output gradients, and whose outputs are the input gradients
// of `grad_inputs` slots. Attributes are copied.
GradMakerFn DefaultGradMaker(std::vector<std::string> grad_inputs);

}  // namespace tessera

#endif  // TESSERA_COMMON_FRAMEWORK_OP_REGISTRY_H_
