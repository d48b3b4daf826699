// Helpers to build and read OpDesc / VarDesc / BlockDesc protos: slots, typed attributes,
// gradient names and op roles. Pure functions, thread-compatible.
#ifndef TESSERA_COMMON_FRAMEWORK_OP_DESC_H_
#define TESSERA_COMMON_FRAMEWORK_OP_DESC_H_

#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/string_view.h"
#include "proto/program.pb.h"

namespace tessera {

// a == b, inline: for the short slot and attribute names that kernels look up several times
// per op run. Names of up to 16 characters are compared with two loads per side (overlapping
// when shorter than 8 or 16), not byte by byte or through memcmp.
inline bool SameName(absl::string_view a, absl::string_view b) {
  const size_t n = a.size();
  if (n != b.size()) return false;
  const char* p = a.data();
  const char* q = b.data();
  auto load = [](const char* s, auto word) {
    std::memcpy(&word, s, sizeof(word));
    return word;
  };
  if (n >= 8 && n <= 16) {
    return load(p, uint64_t{0}) == load(q, uint64_t{0}) &&
           load(p + n - 8, uint64_t{0}) == load(q + n - 8, uint64_t{0});
  }
  if (n >= 4 && n < 8) {
    return load(p, uint32_t{0}) == load(q, uint32_t{0}) &&
           load(p + n - 4, uint32_t{0}) == load(q + n - 4, uint32_t{0});
  }
  if (n > 0 && n < 4) return p[0] == q[0] && p[n / 2] == q[n / 2] && p[n - 1] == q[n - 1];
  return n == 0 || std::memcmp(p, q, n) == 0;
}

// Name of the gradient of `var` ("x" -> "x@GRAD").
std::string GradVarName(absl::string_view var);
// True for names produced by GradVarName; OriginalVarName strips the suffix.
bool IsGradVarName(absl::string_view var);
std::string OriginalVarName(absl::string_view grad_var);

// Op roles (bit flags in the "op_role" attribute), as the transpiler reads them.
enum OpRole : int64_t {
  kRoleForward = 0,
  kRoleBackward = 1,
  kRoleOptimize = 2,
  kRoleRPC = 4,
  kRoleDist = 8,
  kRoleLRSched = 16,
  kRoleLoss = 256,
};
inline constexpr char kOpRoleAttr[] = "op_role";
// On backward ops producing a parameter gradient and on optimize ops: [param, grad].
inline constexpr char kOpRoleVarAttr[] = "op_role_var";

// A slot binding list for MakeOp: {{"X", {"a"}}, {"Y", {"b"}}}.
using Slots = std::vector<std::pair<std::string, std::vector<std::string>>>;

OpDesc MakeOp(absl::string_view type, const Slots& inputs, const Slots& outputs);

// Arguments bound to a slot (empty if the slot is absent).
std::vector<std::string> OpInputs(const OpDesc& op, absl::string_view slot);
std::vector<std::string> OpOutputs(const OpDesc& op, absl::string_view slot);
// First argument of a slot, or "" if absent/empty.
std::string OpInput(const OpDesc& op, absl::string_view slot);
std::string OpOutput(const OpDesc& op, absl::string_view slot);
void SetOpInputs(OpDesc* op, absl::string_view slot, std::vector<std::string> args);
void SetOpOutputs(OpDesc* op, absl::string_view slot, std::vector<std::string> args);
// Every argument of every input/output slot, in order.
std::vector<std::string> AllInputArgs(const OpDesc& op);
std::vector<std::string> AllOutputArgs(const OpDesc& op);
// Replaces every occurrence of variable `from` by `to` in inputs (and/or outputs).
void RenameOpInput(OpDesc* op, absl::string_view from, absl::string_view to);
void RenameOpOutput(OpDesc* op, absl::string_view from, absl::string_view to);

// Attributes. Setting replaces an attribute of the same name.
const OpDesc::Attr* FindAttr(const OpDesc& op, absl::string_view name);
void SetAttr(OpDesc* op, absl::string_view name, int64_t v);
inline void SetAttr(OpDesc* op, absl::string_view name, int v) {
  SetAttr(op, name, static_cast<int64_t>(v));
}
void SetAttr(OpDesc* op, absl::string_view name, float v);
void SetAttr(OpDesc* op, absl::string_view name, double v);
void SetAttr(OpDesc* op, absl::string_view name, bool v);
void SetAttr(OpDesc* op, absl::string_view name, absl::string_view v);
inline void SetAttr(OpDesc* op, absl::string_view name, const char* v) {
  SetAttr(op, name, absl::string_view(v));
}
void SetAttr(OpDesc* op, absl::string_view name, const std::vector<int64_t>& v);
void SetAttr(OpDesc* op, absl::string_view name, const std::vector<float>& v);
void SetAttr(OpDesc* op, absl::string_view name, const std::vector<std::string>& v);
void SetBlockAttr(OpDesc* op, absl::string_view name, int32_t block_idx);

// Typed reads; `ok` (if given) is set false when the attribute exists with another type.
// Numeric reads convert between int/float/double.
int64_t GetIntAttr(const OpDesc& op, absl::string_view name, int64_t dflt, bool* ok = nullptr);
double GetFloatAttr(const OpDesc& op, absl::string_view name, double dflt, bool* ok = nullptr);
bool GetBoolAttr(const OpDesc& op, absl::string_view name, bool dflt, bool* ok = nullptr);
std::string GetStringAttr(const OpDesc& op, absl::string_view name, absl::string_view dflt,
                          bool* ok = nullptr);
std::vector<int64_t> GetIntsAttr(const OpDesc& op, absl::string_view name, bool* ok = nullptr);
std::vector<float> GetFloatsAttr(const OpDesc& op, absl::string_view name, bool* ok = nullptr);
std::vector<std::string> GetStringsAttr(const OpDesc& op, absl::string_view name,
                                        bool* ok = nullptr);
int32_t GetBlockAttr(const OpDesc& op, absl::string_view name, int32_t dflt = -1);

int64_t OpRoleOf(const OpDesc& op);

// VarDesc lookup in a block (nullptr if absent).
const VarDesc* FindVarDesc(const BlockDesc& block, absl::string_view name);
VarDesc* FindMutableVarDesc(BlockDesc* block, absl::string_view name);

// "mul(X=a, Y=b) -> (Out=c)" for messages and summaries.
std::string OpSignature(const OpDesc& op);
// "send(X=a,b,c ... and 97 more)": the op's type and at most `max_args` of its input arguments,
// for error lines (an op of a big model can have hundreds).
std::string OpBrief(const OpDesc& op, int max_args = 3);

}  // namespace tessera

#endif  // TESSERA_COMMON_FRAMEWORK_OP_DESC_H_
