// ProgramBuilder: appends variables and ops to a main program (block 0) and its startup program,
// the way a user describes a single-machine model once (like Fluid's default_main_program /
// default_startup_program pair, without globals).
//
// Parameters live in both programs: declared in main, initialized by ops in startup. Initializer
// seeds derive from the program seed and the parameter name (a stable hash), so a parameter's
// initial value does not depend on the order layers were added. Not thread-safe.
#ifndef TESSERA_COMMON_LAYERS_PROGRAM_BUILDER_H_
#define TESSERA_COMMON_LAYERS_PROGRAM_BUILDER_H_

#include <cstdint>
#include <map>
#include <string>

#include "absl/strings/string_view.h"
#include "common/framework/op_desc.h"
#include "common/framework/tensor.h"
#include "proto/program.pb.h"

namespace tessera {

// How a parameter is initialized in the startup program.
struct Initializer {
  enum Kind { kConstant, kUniform, kGaussian, kXavierUniform };
  Kind kind = kXavierUniform;
  float a = 0.0f;  // constant value | uniform min | gaussian mean
  float b = 0.0f;  // uniform max | gaussian std
  static Initializer Constant(float v) { return {kConstant, v, 0}; }
  static Initializer Uniform(float lo, float hi) { return {kUniform, lo, hi}; }
  static Initializer Gaussian(float mean, float std) { return {kGaussian, mean, std}; }
  static Initializer Xavier() { return {kXavierUniform, 0, 0}; }
};

// A stable 64-bit FNV-1a-style hash of a name (prime 1099511628211, offset basis
// 1469598103934665603): the same on every process and platform. The offset basis differs from
// the standard one; it is kept because initial values and HashName placement derive from it.
uint64_t StableHash(absl::string_view s);

class ProgramBuilder {
 public:
  // Both programs get a root block if they have none. `main->random_seed()` seeds initializers
  // (0 is replaced by a fixed default so that programs are reproducible).
  ProgramBuilder(ProgramDesc* main, ProgramDesc* startup);

  ProgramDesc* main() { return main_; }
  ProgramDesc* startup() { return startup_; }
  BlockDesc* block() { return main_->mutable_blocks(0); }

  // "prefix_0", "prefix_1", ... unique within this builder.
  std::string UniqueName(absl::string_view prefix);

  // A temporary (non-persistable) variable of the main program.
  VarDesc* CreateVar(absl::string_view name, const Shape& shape, DataType dtype = FLOAT32);
  // A trainable parameter initialized in startup with `init`.
  VarDesc* CreateParameter(absl::string_view name, const Shape& shape, Initializer init,
                           DataType dtype = FLOAT32);
  // A persistable, non-trainable variable (learning rate, optimizer state) filled with `value`
  // by the startup program.
  VarDesc* CreatePersistable(absl::string_view name, const Shape& shape, float value,
                             DataType dtype = FLOAT32);
  const VarDesc* FindVar(absl::string_view name) const;

  // Appends `op` to the main block with the current op role; returns it.
  OpDesc* AppendOp(OpDesc op);
  int64_t role() const { return role_; }
  void set_role(int64_t role) { role_ = role; }

  // Seed of the initializer of `var_name`.
  uint64_t SeedFor(absl::string_view var_name) const;

 private:
  ProgramDesc* main_;
  ProgramDesc* startup_;
  int64_t role_ = kRoleForward;
  std::map<std::string, int> counters_;
};

// Adds (or updates) a VarDesc in `block`.
VarDesc* DeclareVar(BlockDesc* block, absl::string_view name, const Shape& shape, DataType dtype);

}  // namespace tessera

#endif  // TESSERA_COMMON_LAYERS_PROGRAM_BUILDER_H_
