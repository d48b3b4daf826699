#include "common/collective/types.h"

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace tessera {
namespace collective {

size_t ElementSize(ElementType type) {
  switch (type) {
    case ElementType::kFloat16:
      return 2;
    case ElementType::kFloat32:
      return 4;
    case ElementType::kFloat64:
      return 8;
    case ElementType::kInt32:
      return 4;
    case ElementType::kInt64:
      return 8;
    case ElementType::kUint8:
      return 1;
  }
  return 0;
}

std::string ElementTypeName(ElementType type) {
  switch (type) {
    case ElementType::kFloat16:
      return "float16";
    case ElementType::kFloat32:
      return "float32";
    case ElementType::kFloat64:
      return "float64";
    case ElementType::kInt32:
      return "int32";
    case ElementType::kInt64:
      return "int64";
    case ElementType::kUint8:
      return "uint8";
  }
  return "unknown";
}

std::string ReduceOpName(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return "sum";
    case ReduceOp::kAvg:
      return "avg";
    case ReduceOp::kMax:
      return "max";
    case ReduceOp::kMin:
      return "min";
  }
  return "unknown";
}

std::string BackendName(BackendType backend) {
  switch (backend) {
    case BackendType::kNone:
      return "none";
    case BackendType::kGloo:
      return "gloo";
    case BackendType::kNccl:
      return "nccl";
  }
  return "unknown";
}

std::string InitMethodName(InitMethod method) {
  switch (method) {
    case InitMethod::kTcp:
      return "tcp";
    case InitMethod::kFileSystem:
      return "file_system";
    case InitMethod::kMpi:
      return "mpi";
  }
  return "unknown";
}

absl::StatusOr<BackendType> ParseBackend(const std::string& name) {
  if (name == "gloo") return BackendType::kGloo;
  if (name == "nccl") return BackendType::kNccl;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown collective backend '", name, "' (expected gloo or nccl)"));
}

absl::StatusOr<InitMethod> ParseInitMethod(const std::string& name) {
  if (name == "tcp") return InitMethod::kTcp;
  if (name == "file_system" || name == "file") return InitMethod::kFileSystem;
  if (name == "mpi") return InitMethod::kMpi;
  return absl::InvalidArgumentError(absl::StrCat("unknown collective init method '", name,
                                                 "' (expected tcp, file_system or mpi)"));
}

ElementType ElementTypeOf(DataType dtype) {
  switch (dtype) {
    case FLOAT32:
      return ElementType::kFloat32;
    case FLOAT64:
      return ElementType::kFloat64;
    case INT64:
      return ElementType::kInt64;
    case INT32:
      return ElementType::kInt32;
    default:
      break;
  }
  return ElementType::kUint8;
}

}  // namespace collective
}  // namespace tessera
