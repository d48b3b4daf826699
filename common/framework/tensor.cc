#include "common/framework/tensor.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <new>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace tessera {

size_t SizeOf(DataType dtype) {
  switch (dtype) {
    case FLOAT32:
    case INT32:
      return 4;
    case FLOAT64:
    case INT64:
      return 8;
    default:
      return 0;
  }
}

std::string DataTypeName(DataType dtype) {
  switch (dtype) {
    case FLOAT32:
      return "float32";
    case FLOAT64:
      return "float64";
    case INT64:
      return "int64";
    case INT32:
      return "int32";
    default:
      return absl::StrCat("dtype(", static_cast<int>(dtype), ")");
  }
}

std::string ShapeString(absl::Span<const int64_t> shape) {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

int64_t NumElements(absl::Span<const int64_t> shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

int64_t OuterElements(absl::Span<const int64_t> shape, int64_t axis) {
  return NumElements(shape.subspan(0, static_cast<size_t>(axis)));
}

int64_t InnerElements(absl::Span<const int64_t> shape, int64_t axis) {
  return NumElements(shape.subspan(static_cast<size_t>(axis) + 1));
}

namespace {
constexpr size_t kAlignment = 64;

size_t Capacity(size_t bytes) {
  const size_t rounded = (bytes + kAlignment - 1) / kAlignment * kAlignment;
  return rounded == 0 ? kAlignment : rounded;
}

std::shared_ptr<char> HostAllocate(size_t bytes) {
  void* p = std::aligned_alloc(kAlignment, Capacity(bytes));
  if (p == nullptr) throw std::bad_alloc();
  return std::shared_ptr<char>(static_cast<char*>(p), [](char* q) { std::free(q); });
}

// The device runtime for a tensor on `place` (a GPU). Only the CUDA runtime places tensors on
// GPUs, and it registers its backend first, so an error here is a programming error; it is a
// Status all the same, for the Try forms.
absl::StatusOr<DeviceBackend*> BackendFor(const Place& place) {
  DeviceBackend* b = GetDeviceBackend();
  if (b == nullptr) {
    return absl::FailedPreconditionError(
        absl::StrCat("tensor on ", place.DebugString(), " but no device runtime is linked in"));
  }
  return b;
}

// A buffer of at least `bytes` on `place`: host memory, or the device backend's.
absl::StatusOr<std::shared_ptr<char>> AllocateOn(const Place& place, size_t bytes) {
  if (place.is_cpu()) return HostAllocate(bytes);
  absl::StatusOr<DeviceBackend*> b = BackendFor(place);
  if (!b.ok()) return b.status();
  return (*b)->Allocate(place, bytes);
}

// The only place where a device failure ends the process: under a Tensor method that has no
// Status to return (Resize, ResetPlace, CopyFrom and Clone, SetZero, and TensorToProto of a
// device tensor). A device kernel or placement reaches the device through the Try forms and
// gets a Status instead, so this is reached only when code that could have returned an error
// (see placement.h: PlacedOutput, PlacedInput, MoveToPlace) was bypassed, e.g. a kernel that
// Resize()s a device output itself instead of having PlacedOutput allocate it. Host tensors
// never get here: their operations cannot fail.
void DieIfFailed(const absl::Status& s, const char* method) {
  if (s.ok()) return;
  std::fprintf(stderr,
               "tessera: device failure under Tensor::%s, which has no error path (callers "
               "with one use Tensor::Try%s): %s\n",
               method, method, s.ToString().c_str());
  std::abort();
}
}  // namespace

Tensor::Tensor(DataType dtype, Shape shape) : shape_(std::move(shape)) { Resize(dtype, shape_); }

void Tensor::Resize(DataType dtype, absl::Span<const int64_t> shape) {
  // Unchanged (a kernel's output on every step after the first): nothing to do.
  if (initialized_ && dtype == dtype_ && buffer_ != nullptr &&
      absl::MakeConstSpan(shape_) == shape) {
    return;
  }
  DieIfFailed(TryResize(dtype, shape), "Resize");
}

absl::Status Tensor::TryResize(DataType dtype, absl::Span<const int64_t> shape) {
  const int64_t numel = NumElements(shape);
  const size_t need = static_cast<size_t>(numel) * SizeOf(dtype);
  if (buffer_ == nullptr || capacity_ < need) {
    absl::StatusOr<std::shared_ptr<char>> buffer = AllocateOn(place_, need);
    if (!buffer.ok()) return buffer.status();  // the tensor is left as it was
    buffer_ = *std::move(buffer);
    capacity_ = Capacity(need);
  }
  dtype_ = dtype;
  // Reuses shape_'s storage; `shape` may be shape_ itself.
  if (shape.data() != shape_.data()) shape_.assign(shape.begin(), shape.end());
  numel_ = numel;
  initialized_ = true;
  return absl::OkStatus();
}

absl::Status Tensor::Reshape(Shape shape) {
  if (NumElements(shape) != numel_) {
    return absl::InvalidArgumentError(absl::StrCat("cannot reshape ", DebugString(), " to ",
                                                   ShapeString(shape), ": element counts differ"));
  }
  shape_ = std::move(shape);
  return absl::OkStatus();
}

std::pair<int64_t, int64_t> Tensor::MatrixDims(int num_row_dims) const {
  int64_t rows = 1, cols = 1;
  for (int i = 0; i < rank(); ++i) (i < num_row_dims ? rows : cols) *= shape_[i];
  return {rows, cols};
}

void Tensor::ResetPlace(const Place& place) { DieIfFailed(TryResetPlace(place), "ResetPlace"); }

absl::Status Tensor::TryResetPlace(const Place& place) {
  if (place == place_) return absl::OkStatus();
  std::shared_ptr<char> buffer;
  size_t capacity = 0;
  if (initialized_) {
    absl::StatusOr<std::shared_ptr<char>> b = AllocateOn(place, nbytes());
    if (!b.ok()) return b.status();  // the tensor is left as it was
    buffer = *std::move(b);
    capacity = Capacity(nbytes());
  }
  place_ = place;
  buffer_ = std::move(buffer);
  capacity_ = capacity;
  return absl::OkStatus();
}

void Tensor::CopyFrom(const Tensor& other) { DieIfFailed(TryCopyFrom(other), "CopyFrom"); }

absl::Status Tensor::TryCopyFrom(const Tensor& other) {
  if (this == &other) return absl::OkStatus();
  absl::Status s = TryResize(other.dtype_, other.shape_);
  if (!s.ok()) return s;
  initialized_ = other.initialized_;
  lod_ = other.lod_;
  if (nbytes() == 0) return absl::OkStatus();
  if (place_.is_cpu() && other.place_.is_cpu()) {
    std::memcpy(buffer_.get(), other.buffer_.get(), nbytes());
    return absl::OkStatus();
  }
  absl::StatusOr<DeviceBackend*> b = BackendFor(place_.is_cpu() ? other.place_ : place_);
  if (!b.ok()) return b.status();
  return (*b)->Copy(buffer_.get(), place_, other.buffer_.get(), other.place_, nbytes());
}

Tensor Tensor::Clone() const {
  Tensor t;
  t.place_ = place_;
  t.CopyFrom(*this);
  return t;
}

void Tensor::SetZero() { DieIfFailed(TrySetZero(), "SetZero"); }

absl::Status Tensor::TrySetZero() {
  if (nbytes() == 0) return absl::OkStatus();
  if (place_.is_cpu()) {
    std::memset(buffer_.get(), 0, nbytes());
    return absl::OkStatus();
  }
  absl::StatusOr<DeviceBackend*> b = BackendFor(place_);
  if (!b.ok()) return b.status();
  return (*b)->SetZero(place_, buffer_.get(), nbytes());
}

std::string Tensor::DebugString() const {
  if (!initialized_) return "uninitialized";
  if (!place_.is_cpu()) {
    return absl::StrCat(DataTypeName(dtype_), ShapeString(shape_), "@", place_.DebugString());
  }
  return absl::StrCat(DataTypeName(dtype_), ShapeString(shape_));
}

void Tensor::DieTypeMismatch(DataType t) const {
  std::fprintf(stderr, "tessera: tensor of type %s accessed as %s\n", DataTypeName(dtype_).c_str(),
               DataTypeName(t).c_str());
  std::abort();
}

void TensorToProto(const Tensor& t, TensorProto* proto) {
  if (!t.place().is_cpu()) {  // serialize a host copy
    Tensor host;
    host.CopyFrom(t);
    TensorToProto(host, proto);
    return;
  }
  proto->Clear();
  proto->set_dtype(t.dtype());
  for (int64_t d : t.shape()) proto->add_dims(d);
  proto->set_data(static_cast<const char*>(t.raw_data()), t.nbytes());
}

absl::Status TensorFromProto(const TensorProto& proto, Tensor* t) {
  Shape shape(proto.dims().begin(), proto.dims().end());
  for (int64_t d : shape) {
    if (d < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("tensor proto has negative dimension in shape ", ShapeString(shape)));
    }
  }
  if (SizeOf(proto.dtype()) == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor proto has unknown dtype ", static_cast<int>(proto.dtype())));
  }
  size_t want = static_cast<size_t>(NumElements(shape)) * SizeOf(proto.dtype());
  if (proto.data().size() != want) {
    return absl::InvalidArgumentError(absl::StrCat(
        "tensor proto ", DataTypeName(proto.dtype()), ShapeString(shape), " needs ", want,
        " bytes of data, has ", proto.data().size()));
  }
  t->ResetPlace(Place::Cpu());  // the bytes land on the host (no-op for host tensors)
  t->Resize(proto.dtype(), shape);
  if (want > 0) std::memcpy(t->raw_data(), proto.data().data(), want);
  return absl::OkStatus();
}

}  // namespace tessera
