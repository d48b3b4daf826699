// Value types shared by the collective API: element types, reduction operators, backends and
// initialization methods, with their names for messages.
#ifndef TESSERA_COMMON_COLLECTIVE_TYPES_H_
#define TESSERA_COMMON_COLLECTIVE_TYPES_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/statusor.h"
#include "proto/tensor.pb.h"

namespace tessera {
namespace collective {

// Element type of a buffer handed to a collective. kFloat16 is IEEE 754 binary16 stored as
// uint16_t (see half.h); it exists for fp16 gradients on the wire.
enum class ElementType { kFloat16, kFloat32, kFloat64, kInt32, kInt64, kUint8 };

// Reduction applied element-wise across ranks. kAvg is the sum divided by the number of ranks
// (integer division for integer types).
enum class ReduceOp { kSum, kAvg, kMax, kMin };

// Which library moves the bytes.
enum class BackendType { kNone, kGloo, kNccl };

// How ranks find each other (see context.h).
enum class InitMethod { kTcp, kFileSystem, kMpi };

// Bytes of one element.
size_t ElementSize(ElementType type);
// "float16", "float32", ...
std::string ElementTypeName(ElementType type);
// "sum", "avg", "max", "min".
std::string ReduceOpName(ReduceOp op);
// "none", "gloo", "nccl".
std::string BackendName(BackendType backend);
// "tcp", "file_system", "mpi".
std::string InitMethodName(InitMethod method);

// Parses "gloo" / "nccl"; InvalidArgument naming the value otherwise.
absl::StatusOr<BackendType> ParseBackend(const std::string& name);
// Parses "tcp" / "file_system" (or "file") / "mpi"; InvalidArgument naming the value otherwise.
absl::StatusOr<InitMethod> ParseInitMethod(const std::string& name);

// The element type of a Tensor dtype (all four Tensor dtypes have one).
ElementType ElementTypeOf(DataType dtype);

}  // namespace collective
}  // namespace tessera

#endif  // TESSERA_COMMON_COLLECTIVE_TYPES_H_
