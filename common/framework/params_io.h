// Saving and loading named tensors (parameters) as one binary file: a serialized TensorMap proto.
// Writes are atomic (temporary file, fsync, rename).
#ifndef TESSERA_COMMON_FRAMEWORK_PARAMS_IO_H_
#define TESSERA_COMMON_FRAMEWORK_PARAMS_IO_H_

#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/framework/scope.h"

namespace tessera {

// Writes the dense variables `names` of `scope`; NotFound names a missing one.
absl::Status SaveVariables(const Scope& scope, const std::vector<std::string>& names,
                           const std::string& path);
absl::StatusOr<std::map<std::string, Tensor>> LoadVariables(const std::string& path);

// The same bytes in memory, for callers that write and read through their own file system
// (inference bundles). Errors of ParseVariables name `source`. Device tensors are copied to the
// host for serializing.
absl::StatusOr<std::string> SerializeVariables(const Scope& scope,
                                               const std::vector<std::string>& names);
absl::StatusOr<std::map<std::string, Tensor>> ParseVariables(const std::string& bytes,
                                                             const std::string& source);

}  // namespace tessera

#endif  // TESSERA_COMMON_FRAMEWORK_PARAMS_IO_H_
