// Automatic differentiation over a program: appends the gradient ops of every op on the path
// from the trainable parameters to a loss.
#ifndef TESSERA_COMMON_LAYERS_BACKWARD_H_
#define TESSERA_COMMON_LAYERS_BACKWARD_H_

#include <set>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/framework/op_registry.h"
#include "proto/program.pb.h"

namespace tessera {

struct ParamGrad {
  std::string param;
  std::string grad;
};

// Appends backward ops for `loss` (a [1] variable of block 0) to block 0 of `program`:
//  - loss@GRAD = 1 (op role Backward|Loss);
//  - for each forward op that lies on a path from a trainable parameter to the loss (in reverse
//    order), the ops its registered gradient maker builds; gradients of variables that need
//    none (stop_gradient, data, `no_grad`) are pruned to kEmptyVarName; a variable used by
//    several ops gets each contribution under a renamed variable and one `sum`;
//  - VarDescs for every gradient (SELECTED_ROWS for sparse embedding tables);
//  - op_role Backward on every added op and op_role_var [param, grad] on the op that finally
//    writes each parameter gradient.
// Returns the (param, grad) pairs in parameter declaration order. Fails if `loss` is not
// produced by any op, or an op on the path has no gradient maker (named in the error).
absl::StatusOr<std::vector<ParamGrad>> AppendBackward(ProgramDesc* program,
                                                      const OpRegistry& registry,
                                                      const std::string& loss,
                                                      const std::set<std::string>& no_grad = {});

}  // namespace tessera

#endif  // TESSERA_COMMON_LAYERS_BACKWARD_H_
