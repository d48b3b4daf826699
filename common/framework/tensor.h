// Tensor: a typed, shaped, contiguous (row-major) buffer; SelectedRows: a sparse set of rows.
//
// A Tensor object is a handle: copying it shares the buffer (like TensorFlow's Tensor). Use
// CopyFrom()/Clone() for a deep copy. Not thread-safe; callers synchronize access to one tensor.
#ifndef TESSERA_COMMON_FRAMEWORK_TENSOR_H_
#define TESSERA_COMMON_FRAMEWORK_TENSOR_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "Eigen/Core"
#include "absl/status/status.h"
#include "absl/types/span.h"
#include "common/framework/place.h"
#include "proto/tensor.pb.h"

namespace tessera {

using Shape = std::vector<int64_t>;

// Bytes of one element of `dtype`.
size_t SizeOf(DataType dtype);
// "float32", "float64", "int64", "int32".
std::string DataTypeName(DataType dtype);
// "[2, 3]".
std::string ShapeString(absl::Span<const int64_t> shape);
// Product of dims (1 for a scalar shape []).
int64_t NumElements(absl::Span<const int64_t> shape);
// A shape seen as [outer, dim(axis), inner] (concat and split along axis): the product of dims
// [0, axis) and of dims (axis, rank). axis in [0, rank).
int64_t OuterElements(absl::Span<const int64_t> shape, int64_t axis);
int64_t InnerElements(absl::Span<const int64_t> shape, int64_t axis);

template <typename T>
struct DataTypeOf;
template <>
struct DataTypeOf<float> { static constexpr DataType value = FLOAT32; };
template <>
struct DataTypeOf<double> { static constexpr DataType value = FLOAT64; };
template <>
struct DataTypeOf<int64_t> { static constexpr DataType value = INT64; };
template <>
struct DataTypeOf<int32_t> { static constexpr DataType value = INT32; };

template <typename T>
using EigenMatrix = Eigen::Map<Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>>;
template <typename T>
using ConstEigenMatrix =
    Eigen::Map<const Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>>;
template <typename T>
using EigenVector = Eigen::Map<Eigen::Array<T, Eigen::Dynamic, 1>>;
template <typename T>
using ConstEigenVector = Eigen::Map<const Eigen::Array<T, Eigen::Dynamic, 1>>;

class Tensor {
 public:
  Tensor() = default;
  // Allocates (uninitialized contents).
  Tensor(DataType dtype, Shape shape);

  DataType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  int rank() const { return static_cast<int>(shape_.size()); }
  int64_t dim(int i) const { return shape_[i]; }
  int64_t numel() const { return numel_; }
  size_t nbytes() const { return static_cast<size_t>(numel_) * SizeOf(dtype_); }
  // True once Resize() or the constructor gave the tensor a type and shape.
  bool initialized() const { return initialized_; }
  // Where the buffer lives: the CPU unless a device runtime placed it on a GPU (then data()
  // returns a device pointer, for device kernels only). Copies of the handle share the place.
  const Place& place() const { return place_; }
  // Moves future allocations to `place`. When the place changes, the buffer is replaced by an
  // uninitialized one there (contents lost; use CopyFrom to move contents). Needs a registered
  // DeviceBackend for a GPU place.
  void ResetPlace(const Place& place);

  // Sets type and shape. Reallocates only when the buffer is too small (then contents are
  // unspecified and any sharing with other tensors ends); otherwise keeps buffer and contents,
  // so in-place kernels (Out and X the same tensor) may Resize their output safely. Takes a
  // view (a Shape, `{2, 3}` or a shape()): a tensor resized to its own type and shape, as a
  // kernel's output is on every step, allocates nothing.
  void Resize(DataType dtype, absl::Span<const int64_t> shape);

  // Device failures. On the host, Resize, ResetPlace, CopyFrom and SetZero cannot fail (out of
  // host memory throws std::bad_alloc, as new does). On a GPU place they go through the
  // DeviceBackend, which can run out of memory or fail a copy; having no Status, they then end
  // the process with the backend's message. Code with an error path uses these forms instead:
  // the same operations, returning the backend's error (ResourceExhausted naming the device and
  // the size when out of memory; FailedPrecondition for a GPU place without a device runtime).
  // On an error, TryResize and TryResetPlace leave the tensor as it was; TryCopyFrom leaves it
  // typed and shaped like `other` with unspecified contents; TrySetZero, unspecified contents.
  // Placement (common/device/placement.h) and device kernels use them, so that an op on a GPU
  // that runs out of memory fails with a Status naming the device and the op.
  absl::Status TryResize(DataType dtype, absl::Span<const int64_t> shape);
  absl::Status TryResetPlace(const Place& place);
  absl::Status TryCopyFrom(const Tensor& other);
  absl::Status TrySetZero();

  // Changes the shape keeping the data; fails if the element count differs.
  absl::Status Reshape(Shape shape);

  // Typed access. CHECK-fails on a dtype mismatch (a programmer error: kernels check dtypes
  // and return a Status before touching data).
  template <typename T>
  T* data() {
    CheckType(DataTypeOf<T>::value);
    return reinterpret_cast<T*>(buffer_.get());
  }
  template <typename T>
  const T* data() const {
    CheckType(DataTypeOf<T>::value);
    return reinterpret_cast<const T*>(buffer_.get());
  }
  void* raw_data() { return buffer_.get(); }
  // The buffer, for holders that must keep it alive (e.g. zero-copy RPC slices).
  std::shared_ptr<char> shared_buffer() const { return buffer_; }
  // Whether anything else (another tensor, such a holder) shares this tensor's buffer.
  bool buffer_shared() const { return buffer_.use_count() > 1; }
  const void* raw_data() const { return buffer_.get(); }

  // Flat view of all elements.
  template <typename T>
  EigenVector<T> flat() {
    return EigenVector<T>(data<T>(), numel_);
  }
  template <typename T>
  ConstEigenVector<T> flat() const {
    return ConstEigenVector<T>(data<T>(), numel_);
  }
  // Row-major matrix view: dims [0, num_row_dims) form the rows, the rest the columns.
  template <typename T>
  EigenMatrix<T> matrix(int num_row_dims = 1) {
    auto [r, c] = MatrixDims(num_row_dims);
    return EigenMatrix<T>(data<T>(), r, c);
  }
  template <typename T>
  ConstEigenMatrix<T> matrix(int num_row_dims = 1) const {
    auto [r, c] = MatrixDims(num_row_dims);
    return ConstEigenMatrix<T>(data<T>(), r, c);
  }
  std::pair<int64_t, int64_t> MatrixDims(int num_row_dims) const;

  // Level-1 LoD: a batch of sequences stacked along dim 0, sequence i being rows
  // [lod[i], lod[i + 1]) (lod[0] == 0, non-decreasing, lod.back() == dim(0); one sequence per
  // example for multi-hot slots). Empty when the tensor is no sequence batch. Kept by CopyFrom
  // and ShareDataWith; Resize leaves it alone, so kernels producing sequences set it.
  const std::vector<int64_t>& lod() const { return lod_; }
  void set_lod(std::vector<int64_t> lod) { lod_ = std::move(lod); }

  // Deep copy of `other` into this tensor (reusing the buffer when large enough). The copy
  // stays on this tensor's place (a host<->device copy when the places differ).
  void CopyFrom(const Tensor& other);
  Tensor Clone() const;
  void SetZero();
  // Shares `other`'s buffer, type and shape.
  void ShareDataWith(const Tensor& other) { *this = other; }
  // "float32[2, 3]" ("float32[2, 3]@gpu:0" on a device).
  std::string DebugString() const;

 private:
  // CHECK-fails on a mismatch (inline: typed access is on every kernel's path).
  void CheckType(DataType t) const {
    if (t != dtype_ && initialized_) DieTypeMismatch(t);
  }
  [[noreturn]] void DieTypeMismatch(DataType t) const;

  DataType dtype_ = FLOAT32;
  Shape shape_;
  int64_t numel_ = 0;
  bool initialized_ = false;
  Place place_;
  size_t capacity_ = 0;  // bytes
  std::shared_ptr<char> buffer_;
  std::vector<int64_t> lod_;
};

// Rows of a conceptual [height, ...] tensor: value.dim(0) == rows.size(), value row i holds
// row rows[i]. Rows may repeat until merged. height 0 means unbounded (any int64 id).
struct SelectedRows {
  std::vector<int64_t> rows;
  int64_t height = 0;
  Tensor value;
};

// Tensor <-> TensorProto (copies the bytes; for checkpoints and small messages). A device
// tensor is serialized from a host copy (a device failure then ends the process, as for
// CopyFrom: move device tensors to the host first, as placement does before every CPU kernel);
// TensorFromProto leaves `t` on the host.
void TensorToProto(const Tensor& t, TensorProto* proto);
absl::Status TensorFromProto(const TensorProto& proto, Tensor* t);

}  // namespace tessera

#endif  // TESSERA_COMMON_FRAMEWORK_TENSOR_H_
