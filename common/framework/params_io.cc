#include "common/framework/params_io.h"

#include "absl/strings/str_cat.h"
#include "common/framework/program_io.h"
#include "proto/tensor.pb.h"

namespace tessera {

absl::Status SaveVariables(const Scope& scope, const std::vector<std::string>& names,
                           const std::string& path) {
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
  return WriteStringToFileAtomic(path, bytes);
}

absl::StatusOr<std::map<std::string, Tensor>> LoadVariables(const std::string& path) {
  auto bytes = ReadFileToString(path);
  if (!bytes.ok()) return bytes.status();
  TensorMap map;
  if (!map.ParseFromString(*bytes)) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": not a tensor file"));
  }
  std::map<std::string, Tensor> out;
  for (const auto& [name, proto] : map.tensors()) {
    absl::Status s = TensorFromProto(proto, &out[name]);
    if (!s.ok()) return absl::InvalidArgumentError(absl::StrCat(path, ": ", name, ": ", s.message()));
  }
  return out;
}

}  // namespace tessera
