// Finite-difference gradient checking for op kernels (tests only).
//
// For a forward op and float64 inputs, the checked loss is L = sum_k w_k * out_k over the
// chosen outputs, with fixed pseudo-random weights w. The analytic gradient comes from running
// the op's registered gradient ops with out@GRAD = w; the numeric one from central differences.
#ifndef TESSERA_COMMON_OPS_GRAD_CHECK_H_
#define TESSERA_COMMON_OPS_GRAD_CHECK_H_

#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "common/framework/executor.h"

namespace tessera {

struct GradCheckOptions {
  // Variables whose gradients are checked (must be float64 inputs of the op).
  std::vector<std::string> wrt;
  // Output variables that form the loss; empty: the first argument of slot "Out".
  std::vector<std::string> outputs;
  double delta = 1e-6;
  double rtol = 1e-5;
  double atol = 1e-7;
};

// Runs the check; on mismatch the error names the variable, element index and both values.
// `inputs` maps variable names to values (non-float inputs such as labels or ids allowed).
absl::Status CheckGradient(const OpRegistry& registry, const OpDesc& forward,
                           const std::map<std::string, Tensor>& inputs,
                           const GradCheckOptions& options);

// A float64 tensor of `shape` with values uniform in [lo, hi) from a fixed-seed generator.
Tensor RandomTensor(const Shape& shape, double lo, double hi, uint64_t seed);

}  // namespace tessera

#endif  // TESSERA_COMMON_OPS_GRAD_CHECK_H_
