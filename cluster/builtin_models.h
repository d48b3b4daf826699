// The built-in examples as model files: `--example=ctr|mlp_regression|fashion_mnist_mlp|lenet` without --model loads
// cluster/builtin_models/<name>.pbtxt, compiled into the binary, so a daemon (the pserver in
// particular) links no example code. The files are written by
// `tessera_program --example=<name> --model_out=...` (examples/update_builtin_models.sh);
// //examples:builtin_models_test fails when they drift from the examples' C++ builders.
#ifndef TESSERA_CLUSTER_BUILTIN_MODELS_H_
#define TESSERA_CLUSTER_BUILTIN_MODELS_H_

#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "proto/model.pb.h"

namespace tessera {

std::vector<std::string> BuiltinModelNames();
// The parsed file; NotFound naming the known ones for any other name.
absl::StatusOr<ModelFile> BuiltinModelFile(absl::string_view name);

}  // namespace tessera

#endif  // TESSERA_CLUSTER_BUILTIN_MODELS_H_
