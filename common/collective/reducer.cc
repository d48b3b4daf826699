#include "common/collective/reducer.h"

#include <algorithm>
#include <cstring>
#include <map>
#include <type_traits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/collective/half.h"

namespace tessera {
namespace collective {
namespace {

double ScaleOf(const Communicator* comm, const ReduceOptions& options) {
  return options.scale.has_value() ? *options.scale : 1.0 / comm->size();
}

template <typename T>
void Scale(T* data, size_t n, double scale) {
  if (scale == 1.0) return;
  const T s = static_cast<T>(scale);
  for (size_t i = 0; i < n; ++i) data[i] *= s;
}

template <typename T>
absl::Status DenseSum(Communicator* comm, T* data, size_t n, double scale) {
  absl::Status s = comm->AllReduce(data, data, n, ElementTypeFor<T>::value, ReduceOp::kSum);
  if (s.ok()) Scale(data, n, scale);
  return s;
}

template <typename T>
absl::Status Fp16Sum(Communicator* comm, T* data, size_t n, double scale) {
  std::vector<uint16_t> half(n);
  if constexpr (std::is_same_v<T, float>) {
    FloatToHalf(data, half.data(), n);
  } else {
    DoubleToHalf(data, half.data(), n);
  }
  absl::Status s =
      comm->AllReduce(half.data(), half.data(), n, ElementType::kFloat16, ReduceOp::kSum);
  if (!s.ok()) return s;
  if constexpr (std::is_same_v<T, float>) {
    HalfToFloat(half.data(), data, n);
  } else {
    HalfToDouble(half.data(), data, n);
  }
  Scale(data, n, scale);
  return absl::OkStatus();
}

// All-gathers every rank's `per_rank` (index, value) entries and sums them into `data`.
template <typename T>
absl::Status SparseSum(Communicator* comm, T* data, size_t n, const std::vector<uint32_t>& idx,
                       size_t per_rank, double scale) {
  constexpr size_t kEntry = SparseEntryBytes<T>();
  std::vector<uint8_t> mine;
  mine.reserve(per_rank * kEntry);
  PackSparse(data, idx, per_rank, &mine);
  std::vector<uint8_t> all(mine.size() * comm->size());
  absl::Status s = comm->AllGather(mine.data(), all.data(), mine.size(), ElementType::kUint8);
  if (!s.ok()) return s;
  std::fill(data, data + n, T(0));
  s = AccumulateSparse(all.data(), per_rank * comm->size(), data, n);
  if (!s.ok()) return s;
  Scale(data, n, scale);
  return absl::OkStatus();
}

// Error feedback: adds the residual to the data before entries are chosen; afterwards keeps
// what was not sent (`idx`: the sent entries; nullptr: everything was sent).
template <typename T>
void AddResidual(T* data, size_t n, const T* residual) {
  if (residual == nullptr) return;
  for (size_t i = 0; i < n; ++i) data[i] += residual[i];
}
template <typename T>
void KeepUnsent(const T* data, size_t n, const std::vector<uint32_t>* idx, T* residual) {
  if (residual == nullptr) return;
  if (idx == nullptr) {
    std::fill(residual, residual + n, T(0));
    return;
  }
  std::copy(data, data + n, residual);
  for (uint32_t i : *idx) residual[i] = T(0);
}

// Reduces n values in place: result = scale * sum over ranks, compressed as asked. Must run in
// the communicator's operation order (callers wrap it in RunInOrder / Submit). `residual` (n
// values, or nullptr): error feedback for sparsification (see ErrorFeedback).
template <typename T>
absl::Status ReduceBuffer(Communicator* comm, T* data, size_t n, double scale,
                          const CompressionOptions& c, T* residual = nullptr) {
  if (n > kPadIndex && (c.kind == Compression::kTopK || c.kind == Compression::kThreshold)) {
    return absl::InvalidArgumentError(
        absl::StrCat("sparsified all-reduce of ", n, " elements: at most 2^32 - 1 supported"));
  }
  constexpr size_t kEntry = SparseEntryBytes<T>();
  switch (c.kind) {
    case Compression::kNone:
      return DenseSum(comm, data, n, scale);
    case Compression::kFp16:
      return Fp16Sum(comm, data, n, scale);
    case Compression::kTopK: {
      AddResidual(data, n, static_cast<const T*>(residual));
      const size_t k = TopKCount(n, c.topk_fraction);
      if (k * kEntry >= n * sizeof(T)) {
        KeepUnsent(data, n, nullptr, residual);
        return DenseSum(comm, data, n, scale);
      }
      const std::vector<uint32_t> idx = TopKIndices(data, n, k);
      KeepUnsent(data, n, &idx, residual);
      return SparseSum(comm, data, n, idx, k, scale);
    }
    case Compression::kThreshold: {
      AddResidual(data, n, static_cast<const T*>(residual));
      std::vector<uint32_t> idx = ThresholdIndices(data, n, c.threshold);
      int64_t most = static_cast<int64_t>(idx.size());
      absl::Status s = comm->AllReduce(&most, &most, 1, ElementType::kInt64, ReduceOp::kMax);
      if (!s.ok()) return s;
      if (static_cast<size_t>(most) * kEntry >= n * sizeof(T)) {
        KeepUnsent(data, n, nullptr, residual);
        return DenseSum(comm, data, n, scale);
      }
      KeepUnsent(data, n, &idx, residual);
      return SparseSum(comm, data, n, idx, static_cast<size_t>(most), scale);
    }
  }
  return absl::InternalError("unknown compression");
}

absl::Status CheckTensor(const Tensor* t, size_t position) {
  if (t == nullptr || !t->initialized()) {
    return absl::InvalidArgumentError(
        absl::StrCat("all-reduce: tensor #", position, " is null or uninitialized"));
  }
  if (t->dtype() != FLOAT32 && t->dtype() != FLOAT64) {
    return absl::InvalidArgumentError(absl::StrCat(
        "all-reduce: tensor #", position, " (", t->DebugString(), ") must be float32 or float64"));
  }
  return absl::OkStatus();
}

absl::Status ReduceTensor(Communicator* comm, Tensor* t, double scale,
                          const CompressionOptions& c) {
  if (t->dtype() == FLOAT32) {
    return ReduceBuffer(comm, t->data<float>(), static_cast<size_t>(t->numel()), scale, c);
  }
  return ReduceBuffer(comm, t->data<double>(), static_cast<size_t>(t->numel()), scale, c);
}

// Packs tensors (all of dtype T) into one buffer, reduces it, unpacks.
template <typename T>
absl::Status ReduceCoalesced(Communicator* comm, const std::vector<Tensor*>& tensors, double scale,
                             const CompressionOptions& c, ErrorFeedback* feedback) {
  size_t total = 0;
  for (const Tensor* t : tensors) total += static_cast<size_t>(t->numel());
  T* residual = nullptr;
  if (feedback != nullptr) {
    std::vector<T>* r;
    if constexpr (std::is_same_v<T, float>) {
      r = &feedback->residual_f32;
    } else {
      r = &feedback->residual_f64;
    }
    if (r->empty()) r->assign(total, T(0));
    if (r->size() != total) {
      return absl::InvalidArgumentError(absl::StrCat(
          "all-reduce with error feedback: the ", sizeof(T) == 4 ? "float32" : "float64",
          " buffer has ", total, " elements, the residual ", r->size(),
          " (reduce the same tensors every call)"));
    }
    residual = r->data();
  }
  std::vector<T> packed(total);
  size_t offset = 0;
  for (const Tensor* t : tensors) {
    std::memcpy(packed.data() + offset, t->data<T>(), t->nbytes());
    offset += static_cast<size_t>(t->numel());
  }
  absl::Status s = ReduceBuffer(comm, packed.data(), total, scale, c, residual);
  if (!s.ok()) return s;
  offset = 0;
  for (Tensor* t : tensors) {
    std::memcpy(t->data<T>(), packed.data() + offset, t->nbytes());
    offset += static_cast<size_t>(t->numel());
  }
  return absl::OkStatus();
}

absl::Status ReduceCoalescedAnyType(Communicator* comm, const std::vector<Tensor*>& tensors,
                                    double scale, const CompressionOptions& c,
                                    ErrorFeedback* feedback) {
  std::vector<Tensor*> f32, f64;
  for (Tensor* t : tensors) (t->dtype() == FLOAT32 ? f32 : f64).push_back(t);
  if (!f32.empty()) {
    absl::Status s = ReduceCoalesced<float>(comm, f32, scale, c, feedback);
    if (!s.ok()) return s;
  }
  if (!f64.empty()) return ReduceCoalesced<double>(comm, f64, scale, c, feedback);
  return absl::OkStatus();
}

}  // namespace

absl::Status AllReduce(Communicator* comm, Tensor* t, const ReduceOptions& options) {
  absl::Status s = CheckTensor(t, 0);
  if (s.ok()) s = ValidateCompression(options.compression);
  if (!s.ok()) return s;
  const double scale = ScaleOf(comm, options);
  return comm->RunInOrder([=] { return ReduceTensor(comm, t, scale, options.compression); });
}

PendingReduce::~PendingReduce() {
  if (request_ != nullptr) request_->Wait().IgnoreError();
}

absl::Status PendingReduce::Sync() { return request_->Wait(); }

std::unique_ptr<PendingReduce> AllReduceAsync(Communicator* comm, Tensor* t,
                                              const ReduceOptions& options) {
  absl::Status s = CheckTensor(t, 0);
  if (s.ok()) s = ValidateCompression(options.compression);
  if (!s.ok()) return std::make_unique<PendingReduce>(CompletedRequest(s));
  const double scale = ScaleOf(comm, options);
  return std::make_unique<PendingReduce>(
      comm->Submit([=] { return ReduceTensor(comm, t, scale, options.compression); }));
}

absl::Status AllReduceMultiple(Communicator* comm, const std::vector<Tensor*>& tensors,
                               const MultiReduceOptions& options) {
  for (size_t i = 0; i < tensors.size(); ++i) {
    absl::Status s = CheckTensor(tensors[i], i);
    if (!s.ok()) return s;
  }
  absl::Status s = ValidateCompression(options.compression);
  if (!s.ok()) return s;
  const double scale = ScaleOf(comm, options);
  if (options.coalesce) {
    return comm->RunInOrder([&] {
      return ReduceCoalescedAnyType(comm, tensors, scale, options.compression,
                                    options.error_feedback);
    });
  }
  if (options.error_feedback != nullptr) {
    return absl::InvalidArgumentError("all-reduce: error feedback needs coalesce=true");
  }
  std::vector<std::unique_ptr<Request>> requests;
  for (Tensor* t : tensors) {
    requests.push_back(
        comm->Submit([=] { return ReduceTensor(comm, t, scale, options.compression); }));
  }
  return WaitAll(requests);
}

absl::Status BroadcastParameters(Communicator* comm, const std::vector<Tensor*>& tensors,
                                 int root) {
  int64_t total = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (tensors[i] == nullptr || !tensors[i]->initialized()) {
      return absl::InvalidArgumentError(
          absl::StrCat("broadcast_parameters: tensor #", i, " is null or uninitialized"));
    }
    total += static_cast<int64_t>(tensors[i]->nbytes());
  }
  if (root < 0 || root >= comm->size()) {
    return absl::InvalidArgumentError(absl::StrCat("broadcast_parameters: root ", root,
                                                   " is not a rank in [0, ", comm->size(), ")"));
  }
  return comm->RunInOrder([&]() -> absl::Status {
    // Every rank learns whether all ranks hold as many bytes as the root, before the payload.
    int64_t root_total = total;
    absl::Status s = comm->Broadcast(&root_total, 1, ElementType::kInt64, root);
    if (!s.ok()) return s;
    int64_t mismatch = root_total != total ? 1 : 0;
    s = comm->AllReduce(&mismatch, &mismatch, 1, ElementType::kInt64, ReduceOp::kMax);
    if (!s.ok()) return s;
    if (mismatch != 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "broadcast_parameters: ranks hold different parameter sizes (this rank ", total,
          " bytes, root ", root_total, " bytes): do all ranks build the same model?"));
    }
    std::vector<uint8_t> packed(static_cast<size_t>(total));
    size_t offset = 0;
    if (comm->rank() == root) {
      for (const Tensor* t : tensors) {
        std::memcpy(packed.data() + offset, t->raw_data(), t->nbytes());
        offset += t->nbytes();
      }
    }
    s = comm->Broadcast(packed.data(), packed.size(), ElementType::kUint8, root);
    if (!s.ok()) return s;
    offset = 0;
    for (Tensor* t : tensors) {
      std::memcpy(t->raw_data(), packed.data() + offset, t->nbytes());
      offset += t->nbytes();
    }
    return absl::OkStatus();
  });
}

// ---------------------------------------------------------------------------------------------

InlineReducer::~InlineReducer() { Finalize().IgnoreError(); }

absl::Status InlineReducer::Add(Tensor* grad) {
  pending_.push_back(AllReduceAsync(comm_, grad, options_));
  return absl::OkStatus();
}

absl::Status InlineReducer::Finalize() {
  absl::Status first = first_error_;
  for (auto& p : pending_) {
    absl::Status s = p->Sync();
    if (first.ok() && !s.ok()) first = s;
  }
  pending_.clear();
  first_error_ = absl::OkStatus();
  return first;
}

CoalescingReducer::~CoalescingReducer() { Finalize().IgnoreError(); }

absl::Status CoalescingReducer::Add(Tensor* grad) {
  absl::Status s = CheckTensor(grad, bucket_.size());
  if (!s.ok()) {
    if (first_error_.ok()) first_error_ = s;
    return s;
  }
  const bool other_dtype = !bucket_.empty() && bucket_.front()->dtype() != grad->dtype();
  if (!bucket_.empty() && (other_dtype || bucket_size_ + grad->nbytes() > options_.bucket_bytes)) {
    Flush();
  }
  bucket_.push_back(grad);
  bucket_size_ += grad->nbytes();
  if (bucket_size_ >= options_.bucket_bytes) Flush();
  return absl::OkStatus();
}

void CoalescingReducer::Flush() {
  if (bucket_.empty()) return;
  absl::Status valid = ValidateCompression(options_.compression);
  if (!valid.ok()) {
    pending_.push_back(std::make_unique<PendingReduce>(CompletedRequest(valid)));
  } else {
    const double scale = ScaleOf(comm_, options_);
    Communicator* comm = comm_;
    const CompressionOptions c = options_.compression;
    pending_.push_back(
        std::make_unique<PendingReduce>(comm_->Submit([comm, tensors = bucket_, scale, c] {
          return ReduceCoalescedAnyType(comm, tensors, scale, c, nullptr);
        })));
  }
  ++buckets_flushed_;
  bucket_.clear();
  bucket_size_ = 0;
}

absl::Status CoalescingReducer::Finalize() {
  Flush();
  absl::Status first = first_error_;
  for (auto& p : pending_) {
    absl::Status s = p->Sync();
    if (first.ok() && !s.ok()) first = s;
  }
  pending_.clear();
  first_error_ = absl::OkStatus();
  return first;
}

// ---------------------------------------------------------------------------------------------

PartialSynchronizer::PartialSynchronizer(Communicator* comm, int num_chunks)
    : comm_(comm), num_chunks_(std::max(1, num_chunks)) {}

std::pair<int64_t, int64_t> PartialSynchronizer::ChunkRange(int64_t total, int num_chunks,
                                                            int chunk) {
  return {total * chunk / num_chunks, total * (chunk + 1) / num_chunks};
}

namespace {

// Averages elements [begin, end) of the concatenation of `tensors` (all of dtype T).
template <typename T>
absl::Status AverageRange(Communicator* comm, const std::vector<Tensor*>& tensors, int64_t begin,
                          int64_t end) {
  std::vector<T> packed(static_cast<size_t>(end - begin));
  auto for_each_piece = [&](auto&& fn) {
    int64_t offset = 0;
    for (Tensor* t : tensors) {
      const int64_t lo = std::max(begin, offset), hi = std::min(end, offset + t->numel());
      if (lo < hi) fn(t->data<T>() + (lo - offset), packed.data() + (lo - begin), hi - lo);
      offset += t->numel();
    }
  };
  for_each_piece([](T* src, T* dst, int64_t n) { std::memcpy(dst, src, n * sizeof(T)); });
  absl::Status s = comm->AllReduce(packed.data(), packed.data(), packed.size(),
                                   ElementTypeFor<T>::value, ReduceOp::kAvg);
  if (!s.ok()) return s;
  for_each_piece([](T* dst, T* src, int64_t n) { std::memcpy(dst, src, n * sizeof(T)); });
  return absl::OkStatus();
}

}  // namespace

absl::Status PartialSynchronizer::Step(const std::vector<Tensor*>& params) {
  std::vector<Tensor*> f32, f64;
  for (size_t i = 0; i < params.size(); ++i) {
    absl::Status s = CheckTensor(params[i], i);
    if (!s.ok()) return s;
    (params[i]->dtype() == FLOAT32 ? f32 : f64).push_back(params[i]);
  }
  const int chunk = static_cast<int>(step_ % num_chunks_);
  absl::Status status = comm_->RunInOrder([&]() -> absl::Status {
    int64_t total = 0;
    for (const Tensor* t : f32) total += t->numel();
    auto [b32, e32] = ChunkRange(total, num_chunks_, chunk);
    absl::Status s = AverageRange<float>(comm_, f32, b32, e32);
    if (!s.ok()) return s;
    total = 0;
    for (const Tensor* t : f64) total += t->numel();
    auto [b64, e64] = ChunkRange(total, num_chunks_, chunk);
    return AverageRange<double>(comm_, f64, b64, e64);
  });
  if (status.ok()) ++step_;
  return status;
}

}  // namespace collective
}  // namespace tessera
