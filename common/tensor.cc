#include "common/tensor.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>

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

// Aborts: a GPU place without a device runtime is a programming error (only the CUDA runtime
// places tensors on GPUs, and it registers the backend first).
DeviceBackend* BackendFor(const Place& place) {
  DeviceBackend* b = GetDeviceBackend();
  if (b == nullptr) {
    std::fprintf(stderr, "tessera: tensor on %s but no device runtime is linked in\n",
                 place.DebugString().c_str());
    std::abort();
  }
  return b;
}

std::shared_ptr<char> Allocate(size_t bytes) {
  size_t rounded = (bytes + kAlignment - 1) / kAlignment * kAlignment;
  if (rounded == 0) rounded = kAlignment;
  void* p = std::aligned_alloc(kAlignment, rounded);
  if (p == nullptr) throw std::bad_alloc();
  return std::shared_ptr<char>(static_cast<char*>(p), [](char* q) { std::free(q); });
}
}  // namespace

Tensor::Tensor(DataType dtype, Shape shape) { Resize(dtype, std::move(shape)); }

void Tensor::Resize(DataType dtype, Shape shape) {
  dtype_ = dtype;
  shape_ = std::move(shape);
  numel_ = NumElements(shape_);
  initialized_ = true;
  size_t need = nbytes();
  if (buffer_ == nullptr || capacity_ < need) {
    buffer_ = place_.is_cpu() ? Allocate(need) : BackendFor(place_)->Allocate(place_, need);
    capacity_ = (need + kAlignment - 1) / kAlignment * kAlignment;
    if (capacity_ == 0) capacity_ = kAlignment;
  }
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

void Tensor::ResetPlace(const Place& place) {
  if (place == place_) return;
  place_ = place;
  buffer_.reset();
  capacity_ = 0;
  if (initialized_) Resize(dtype_, shape_);
}

void Tensor::CopyFrom(const Tensor& other) {
  if (this == &other) return;
  Resize(other.dtype_, other.shape_);
  initialized_ = other.initialized_;
  lod_ = other.lod_;
  if (nbytes() == 0) return;
  if (place_.is_cpu() && other.place_.is_cpu()) {
    std::memcpy(buffer_.get(), other.buffer_.get(), nbytes());
  } else {
    BackendFor(place_.is_cpu() ? other.place_ : place_)
        ->Copy(buffer_.get(), place_, other.buffer_.get(), other.place_, nbytes());
  }
}

Tensor Tensor::Clone() const {
  Tensor t;
  t.place_ = place_;
  t.CopyFrom(*this);
  return t;
}

void Tensor::SetZero() {
  if (nbytes() == 0) return;
  if (place_.is_cpu()) {
    std::memset(buffer_.get(), 0, nbytes());
  } else {
    BackendFor(place_)->SetZero(place_, buffer_.get(), nbytes());
  }
}

std::string Tensor::DebugString() const {
  if (!initialized_) return "uninitialized";
  if (!place_.is_cpu()) {
    return absl::StrCat(DataTypeName(dtype_), ShapeString(shape_), "@", place_.DebugString());
  }
  return absl::StrCat(DataTypeName(dtype_), ShapeString(shape_));
}

void Tensor::CheckType(DataType t) const {
  if (t != dtype_ && initialized_) {
    std::fprintf(stderr, "tessera: tensor of type %s accessed as %s\n",
                 DataTypeName(dtype_).c_str(), DataTypeName(t).c_str());
    std::abort();
  }
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
  t->Resize(proto.dtype(), std::move(shape));
  if (want > 0) std::memcpy(t->raw_data(), proto.data().data(), want);
  return absl::OkStatus();
}

}  // namespace tessera
