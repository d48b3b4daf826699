#include "common/framework/params_io.h"

#include "absl/strings/str_cat.h"
#include "common/base/status.h"
#include "common/framework/program_io.h"
#include "proto/tensor.pb.h"

namespace tessera {

absl::StatusOr<std::string> SerializeVariables(const Scope& scope,
                                               const std::vector<std::string>& names) {
  TensorMap map;
  for (const auto& name : names) {
    const Variable* v = scope.FindVar(name);
    if (v == nullptr || !v->Is<Tensor>()) {
      return absl::NotFoundError(absl::StrCat("no dense variable '", name, "' to save"));
    }
    TensorToProto(v->Get<Tensor>(), &(*map.mutable_tensors())[name]);
  }
  std::string bytes;
  if (!map.SerializeToString(&bytes)) return absl::InternalError("cannot serialize tensors");
  return bytes;
}

absl::StatusOr<std::map<std::string, Tensor>> ParseVariables(const std::string& bytes,
                                                             const std::string& source) {
  TensorMap map;
  if (!map.ParseFromString(bytes)) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": not a tensor file"));
  }
  std::map<std::string, Tensor> out;
  for (const auto& [name, proto] : map.tensors()) {
    absl::Status s = TensorFromProto(proto, &out[name]);
    if (!s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(source, ": ", name, ": ", s.message()));
    }
  }
  return out;
}

absl::Status SaveVariables(const Scope& scope, const std::vector<std::string>& names,
                           const std::string& path) {
  TS_ASSIGN_OR_RETURN(std::string bytes, SerializeVariables(scope, names));
  return WriteStringToFileAtomic(path, bytes);
}

absl::StatusOr<std::map<std::string, Tensor>> LoadVariables(const std::string& path) {
  TS_ASSIGN_OR_RETURN(std::string bytes, ReadFileToString(path));
  return ParseVariables(bytes, path);
}

}  // namespace tessera
