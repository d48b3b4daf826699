#include "common/collective/nccl/nccl_communicator.h"

#include <cuda_runtime.h>
#include <nccl.h>

#include <algorithm>
#include <cstring>
#include <functional>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"

namespace tessera {
namespace collective {

struct NcclCommunicator::Impl {
  int device = 0;
  absl::Duration timeout;
  ncclComm_t comm = nullptr;
  cudaStream_t stream = nullptr;      // collectives (only touched by operations, in order)
  cudaStream_t p2p_stream = nullptr;  // point-to-point
  absl::Mutex p2p_mu;                 // serializes issuing point-to-point operations
  void* scratch = nullptr;            // device staging for host buffers of collectives
  size_t scratch_bytes = 0;
  int* barrier_word = nullptr;  // one device int for Barrier()
};

namespace {

constexpr char kUniqueIdKey[] = "nccl_unique_id";
// Pause between polls of a stream or of a non-blocking NCCL call.
constexpr absl::Duration kPoll = absl::Microseconds(50);

absl::Status CudaError(const std::string& what, cudaError_t e) {
  return absl::UnavailableError(
      absl::StrCat(what, ": CUDA error ", cudaGetErrorName(e), " (", cudaGetErrorString(e), ")"));
}

absl::Status NcclError(const std::string& what, ncclResult_t r, ncclComm_t comm) {
  std::string detail = ncclGetErrorString(r);
  if (comm != nullptr) {
    const char* last = ncclGetLastError(comm);
    if (last != nullptr && *last != '\0') detail = absl::StrCat(detail, ": ", last);
  }
  return absl::UnavailableError(absl::StrCat(what, ": NCCL error ", detail));
}

ncclDataType_t NcclType(ElementType type) {
  switch (type) {
    case ElementType::kFloat16:
      return ncclFloat16;
    case ElementType::kFloat32:
      return ncclFloat32;
    case ElementType::kFloat64:
      return ncclFloat64;
    case ElementType::kInt32:
      return ncclInt32;
    case ElementType::kInt64:
      return ncclInt64;
    case ElementType::kUint8:
      return ncclUint8;
  }
  return ncclUint8;
}

ncclRedOp_t NcclOp(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      return ncclSum;
    case ReduceOp::kAvg:
      return ncclAvg;
    case ReduceOp::kMax:
      return ncclMax;
    case ReduceOp::kMin:
      return ncclMin;
  }
  return ncclSum;
}

bool IsDevicePointer(const void* p) {
  cudaPointerAttributes attr;
  if (cudaPointerGetAttributes(&attr, p) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky-free error of an unknown pointer
    return false;
  }
  return attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged;
}

size_t AlignUp(size_t n) { return (n + 255) / 256 * 256; }

// Completes a call on a non-blocking communicator: ncclInProgress means "poll the async error
// until it settles". Aborts the communicator past the deadline.
absl::Status Settle(NcclCommunicator::Impl* impl, ncclResult_t r, const std::string& what,
                    absl::Time deadline) {
  while (r == ncclInProgress) {
    if (absl::Now() > deadline) {
      ncclCommAbort(impl->comm);
      impl->comm = nullptr;
      return absl::DeadlineExceededError(absl::StrCat(what, ": NCCL did not finish in time"));
    }
    absl::SleepFor(kPoll);
    ncclCommGetAsyncError(impl->comm, &r);
  }
  if (r != ncclSuccess) return NcclError(what, r, impl->comm);
  return absl::OkStatus();
}

// Waits for `stream` (or `event` when given) up to the deadline, watching NCCL's async error.
absl::Status WaitFor(NcclCommunicator::Impl* impl, cudaStream_t stream, cudaEvent_t event,
                     const std::string& what, absl::Time deadline) {
  while (true) {
    const cudaError_t e = event != nullptr ? cudaEventQuery(event) : cudaStreamQuery(stream);
    if (e == cudaSuccess) return absl::OkStatus();
    if (e != cudaErrorNotReady) return CudaError(what, e);
    if (impl->comm != nullptr) {
      ncclResult_t async = ncclSuccess;
      ncclCommGetAsyncError(impl->comm, &async);
      if (async != ncclSuccess && async != ncclInProgress) {
        absl::Status s = NcclError(what, async, impl->comm);
        ncclCommAbort(impl->comm);
        impl->comm = nullptr;
        return s;
      }
    }
    if (absl::Now() > deadline) {
      if (impl->comm != nullptr) ncclCommAbort(impl->comm);
      impl->comm = nullptr;
      return absl::DeadlineExceededError(
          absl::StrCat(what, ": not finished within ", absl::FormatDuration(impl->timeout),
                       " (a rank missing or stuck?); the NCCL communicator was aborted"));
    }
    absl::SleepFor(kPoll);
  }
}

// A point-to-point operation in flight on the p2p stream.
class NcclP2PRequest : public Request {
 public:
  NcclP2PRequest(NcclCommunicator::Impl* impl, cudaEvent_t event, void* staging, std::string what)
      : impl_(impl), event_(event), staging_(staging), what_(std::move(what)) {}
  ~NcclP2PRequest() override { Wait().IgnoreError(); }

  absl::Status Wait() override {
    absl::MutexLock lock(&mu_);
    if (!done_) {
      done_ = true;
      cudaSetDevice(impl_->device);
      status_ = WaitFor(impl_, nullptr, event_, what_, absl::Now() + impl_->timeout);
      cudaEventDestroy(event_);
      if (staging_ != nullptr) cudaFree(staging_);
    }
    return status_;
  }

 private:
  absl::Mutex mu_;
  NcclCommunicator::Impl* const impl_;
  const cudaEvent_t event_;
  void* const staging_;
  const std::string what_;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
};

}  // namespace

absl::StatusOr<std::unique_ptr<NcclCommunicator>> NcclCommunicator::Create(
    std::shared_ptr<Store> store, int rank, int size, const NcclOptions& options) {
  if (store == nullptr) return absl::InvalidArgumentError("nccl: no rendezvous store");
  if (size < 1 || rank < 0 || rank >= size) {
    return absl::InvalidArgumentError(
        absl::StrCat("nccl: rank ", rank, " is not in [0, world_size ", size, ")"));
  }
  if (options.timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("nccl: timeout must be positive");
  }
  int devices = 0;
  cudaError_t e = cudaGetDeviceCount(&devices);
  if (e != cudaSuccess) return CudaError("nccl: no usable CUDA device", e);
  if (options.device_id < 0 || options.device_id >= devices) {
    return absl::InvalidArgumentError(absl::StrCat("nccl: device ", options.device_id,
                                                   " does not exist (", devices,
                                                   " CUDA devices; check max_devices_per_node)"));
  }
  return Connect(std::make_shared<PrefixStore>("world", store), store, rank, size, options);
}

absl::StatusOr<std::unique_ptr<NcclCommunicator>> NcclCommunicator::Connect(
    std::shared_ptr<Store> rendezvous, std::shared_ptr<Store> group_store, int rank, int size,
    const NcclOptions& options) {
  const absl::Time deadline = absl::Now() + options.timeout;
  const std::string what =
      absl::StrCat("nccl init of rank ", rank, "/", size, " on device ", options.device_id);
  auto impl = std::make_unique<Impl>();
  impl->device = options.device_id;
  impl->timeout = options.timeout;
  cudaError_t e = cudaSetDevice(options.device_id);
  if (e != cudaSuccess) return CudaError(what, e);

  ncclUniqueId id;
  if (rank == 0) {
    ncclResult_t r = ncclGetUniqueId(&id);
    if (r != ncclSuccess) return NcclError(what, r, nullptr);
    absl::Status s = rendezvous->Set(kUniqueIdKey, std::string(id.internal, sizeof(id.internal)));
    if (!s.ok()) return s;
  } else {
    auto value = rendezvous->Get(kUniqueIdKey, options.timeout);
    if (!value.ok()) return value.status();
    if (value->size() != sizeof(id.internal)) {
      return absl::DataLossError(absl::StrCat(what, ": the unique id in ", rendezvous->DebugName(),
                                              " has ", value->size(), " bytes, expected ",
                                              sizeof(id.internal)));
    }
    std::memcpy(id.internal, value->data(), sizeof(id.internal));
  }
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  config.blocking = 0;  // so that a missing rank ends in a timeout, not a hang
  ncclResult_t r = ncclCommInitRankConfig(&impl->comm, size, id, rank, &config);
  if (r != ncclSuccess && r != ncclInProgress) return NcclError(what, r, impl->comm);
  absl::Status settled = Settle(impl.get(), r, what, deadline);
  if (!settled.ok()) return settled;

  e = cudaStreamCreateWithFlags(&impl->stream, cudaStreamNonBlocking);
  if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&impl->p2p_stream, cudaStreamNonBlocking);
  if (e == cudaSuccess) e = cudaMalloc(reinterpret_cast<void**>(&impl->barrier_word), sizeof(int));
  if (e != cudaSuccess) {
    ncclCommAbort(impl->comm);
    impl->comm = nullptr;
    return CudaError(what, e);
  }
  return std::unique_ptr<NcclCommunicator>(
      new NcclCommunicator(rank, size, options, std::move(group_store), std::move(impl)));
}

NcclCommunicator::NcclCommunicator(int rank, int size, const NcclOptions& options,
                                   std::shared_ptr<Store> store, std::unique_ptr<Impl> impl)
    : Communicator(rank, size),
      options_(options),
      store_(std::move(store)),
      impl_(std::move(impl)) {}

NcclCommunicator::~NcclCommunicator() {
  ShutdownExecutor();
  cudaSetDevice(impl_->device);
  if (impl_->comm != nullptr) {
    if (impl_->stream != nullptr) cudaStreamSynchronize(impl_->stream);
    if (impl_->p2p_stream != nullptr) cudaStreamSynchronize(impl_->p2p_stream);
    ncclCommDestroy(impl_->comm);
  }
  if (impl_->scratch != nullptr) cudaFree(impl_->scratch);
  if (impl_->barrier_word != nullptr) cudaFree(impl_->barrier_word);
  if (impl_->stream != nullptr) cudaStreamDestroy(impl_->stream);
  if (impl_->p2p_stream != nullptr) cudaStreamDestroy(impl_->p2p_stream);
}

namespace {

// Runs one collective on the collective stream: host buffers are staged through the scratch
// buffer (copied in before, the result copied out after), then the stream is waited for.
absl::Status RunCollective(NcclCommunicator::Impl* impl, const std::string& what, const void* send,
                           size_t send_bytes, void* recv, size_t recv_bytes,
                           const std::function<ncclResult_t(const void*, void*)>& call) {
  const absl::Time deadline = absl::Now() + impl->timeout;
  if (impl->comm == nullptr) return absl::FailedPreconditionError(what + ": communicator aborted");
  cudaError_t e = cudaSetDevice(impl->device);
  if (e != cudaSuccess) return CudaError(what, e);
  const bool in_place = send == recv;
  const bool staged = !IsDevicePointer(recv) || (!in_place && !IsDevicePointer(send));
  const void* dsend = send;
  void* drecv = recv;
  if (staged) {
    const size_t need = in_place ? AlignUp(recv_bytes) : AlignUp(send_bytes) + AlignUp(recv_bytes);
    if (need > impl->scratch_bytes) {
      if (impl->scratch != nullptr) cudaFree(impl->scratch);
      impl->scratch = nullptr;
      impl->scratch_bytes = 0;
      e = cudaMalloc(&impl->scratch, need);
      if (e != cudaSuccess) return CudaError(absl::StrCat(what, ": staging ", need, " bytes"), e);
      impl->scratch_bytes = need;
    }
    char* base = static_cast<char*>(impl->scratch);
    drecv = in_place ? base : base + AlignUp(send_bytes);
    dsend = in_place ? drecv : base;
    if (send_bytes > 0) {
      e = cudaMemcpyAsync(const_cast<void*>(dsend), send, send_bytes, cudaMemcpyDefault,
                          impl->stream);
      if (e != cudaSuccess) return CudaError(what, e);
    }
  }
  absl::Status s = Settle(impl, call(dsend, drecv), what, deadline);
  if (!s.ok()) return s;
  if (staged) {
    e = cudaMemcpyAsync(recv, drecv, recv_bytes, cudaMemcpyDefault, impl->stream);
    if (e != cudaSuccess) return CudaError(what, e);
  }
  return WaitFor(impl, impl->stream, nullptr, what, deadline);
}

}  // namespace

absl::Status NcclCommunicator::DoAllReduce(const void* send, void* recv, size_t count,
                                           ElementType type, ReduceOp op) {
  const size_t bytes = count * ElementSize(type);
  Impl* impl = impl_.get();
  return RunCollective(impl, absl::StrCat("all_reduce on ", DebugName()), send, bytes, recv, bytes,
                       [&](const void* s, void* r) {
                         return ncclAllReduce(s, r, count, NcclType(type), NcclOp(op), impl->comm,
                                              impl->stream);
                       });
}

absl::Status NcclCommunicator::DoBroadcast(void* buf, size_t count, ElementType type, int root) {
  const size_t bytes = count * ElementSize(type);
  Impl* impl = impl_.get();
  return RunCollective(impl, absl::StrCat("broadcast from rank ", root, " on ", DebugName()), buf,
                       bytes, buf, bytes, [&](const void* s, void* r) {
                         return ncclBroadcast(s, r, count, NcclType(type), root, impl->comm,
                                              impl->stream);
                       });
}

absl::Status NcclCommunicator::DoAllGather(const void* send, void* recv, size_t count,
                                           ElementType type) {
  const size_t bytes = count * ElementSize(type);
  Impl* impl = impl_.get();
  return RunCollective(impl, absl::StrCat("all_gather on ", DebugName()), send, bytes, recv,
                       bytes * size(), [&](const void* s, void* r) {
                         return ncclAllGather(s, r, count, NcclType(type), impl->comm,
                                              impl->stream);
                       });
}

absl::Status NcclCommunicator::DoReduceScatter(const void* send, void* recv, size_t recv_count,
                                               ElementType type, ReduceOp op) {
  const size_t bytes = recv_count * ElementSize(type);
  Impl* impl = impl_.get();
  return RunCollective(impl, absl::StrCat("reduce_scatter on ", DebugName()), send, bytes * size(),
                       recv, bytes, [&](const void* s, void* r) {
                         return ncclReduceScatter(s, r, recv_count, NcclType(type), NcclOp(op),
                                                  impl->comm, impl->stream);
                       });
}

absl::Status NcclCommunicator::DoBarrier() {
  Impl* impl = impl_.get();
  int* word = impl->barrier_word;
  return RunCollective(impl, absl::StrCat("barrier on ", DebugName()), word, sizeof(int), word,
                       sizeof(int), [&](const void* s, void* r) {
                         return ncclAllReduce(s, r, 1, ncclInt32, ncclSum, impl->comm,
                                              impl->stream);
                       });
}

namespace {

// Issues a send or receive on the p2p stream; host buffers go through a private device buffer.
std::unique_ptr<Request> IssueP2P(NcclCommunicator::Impl* impl, bool is_send, void* buf,
                                  size_t bytes, int peer, const std::string& what) {
  absl::MutexLock lock(&impl->p2p_mu);
  if (impl->comm == nullptr) {
    return CompletedRequest(absl::FailedPreconditionError(what + ": communicator aborted"));
  }
  cudaError_t e = cudaSetDevice(impl->device);
  if (e != cudaSuccess) return CompletedRequest(CudaError(what, e));
  void* dbuf = buf;
  void* staging = nullptr;
  if (!IsDevicePointer(buf)) {
    e = cudaMalloc(&staging, bytes);
    if (e != cudaSuccess) return CompletedRequest(CudaError(what, e));
    dbuf = staging;
    if (is_send) {
      e = cudaMemcpyAsync(dbuf, buf, bytes, cudaMemcpyDefault, impl->p2p_stream);
      if (e != cudaSuccess) {
        cudaFree(staging);
        return CompletedRequest(CudaError(what, e));
      }
    }
  }
  const absl::Time deadline = absl::Now() + impl->timeout;
  ncclResult_t r = is_send ? ncclSend(dbuf, bytes, ncclUint8, peer, impl->comm, impl->p2p_stream)
                           : ncclRecv(dbuf, bytes, ncclUint8, peer, impl->comm, impl->p2p_stream);
  absl::Status s = Settle(impl, r, what, deadline);
  if (s.ok() && !is_send && staging != nullptr) {
    e = cudaMemcpyAsync(buf, dbuf, bytes, cudaMemcpyDefault, impl->p2p_stream);
    if (e != cudaSuccess) s = CudaError(what, e);
  }
  cudaEvent_t event = nullptr;
  if (s.ok()) {
    e = cudaEventCreateWithFlags(&event, cudaEventDisableTiming);
    if (e == cudaSuccess) e = cudaEventRecord(event, impl->p2p_stream);
    if (e != cudaSuccess) s = CudaError(what, e);
  }
  if (!s.ok()) {
    cudaStreamSynchronize(impl->p2p_stream);
    if (event != nullptr) cudaEventDestroy(event);
    if (staging != nullptr) cudaFree(staging);
    return CompletedRequest(s);
  }
  return std::make_unique<NcclP2PRequest>(impl, event, staging, what);
}

}  // namespace

std::unique_ptr<Request> NcclCommunicator::DoISend(const void* buf, size_t bytes, int peer,
                                                   uint32_t tag) {
  return IssueP2P(impl_.get(), /*is_send=*/true, const_cast<void*>(buf), bytes, peer,
                  absl::StrCat("send to rank ", peer, " (tag ", tag, ") on ", DebugName()));
}

std::unique_ptr<Request> NcclCommunicator::DoIRecv(void* buf, size_t bytes, int peer,
                                                   uint32_t tag) {
  return IssueP2P(impl_.get(), /*is_send=*/false, buf, bytes, peer,
                  absl::StrCat("recv from rank ", peer, " (tag ", tag, ") on ", DebugName()));
}

absl::StatusOr<std::unique_ptr<Communicator>> NcclCommunicator::DoNewGroup(
    const std::vector<int>& ranks, const std::string& group_key) {
  const int new_rank =
      static_cast<int>(std::find(ranks.begin(), ranks.end(), rank()) - ranks.begin());
  auto group = Connect(std::make_shared<PrefixStore>(group_key, store_), store_, new_rank,
                       static_cast<int>(ranks.size()), options_);
  if (!group.ok()) return group.status();
  return std::unique_ptr<Communicator>(std::move(*group));
}

}  // namespace collective
}  // namespace tessera
