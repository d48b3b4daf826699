#include "common/device/cuda/cuda_device.h"

#include <cstring>
#include <map>

#include <cuda_runtime.h>

#include "absl/strings/str_cat.h"
#include "common/base/status.h"

namespace tessera {

int CudaDeviceCount() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky error of a missing driver
    return 0;
  }
  return n;
}

absl::Status CudaError(cudaError_t e, const std::string& what) {
  if (e == cudaSuccess) return absl::OkStatus();
  return absl::InternalError(
      absl::StrCat(what, ": ", cudaGetErrorName(e), ": ", cudaGetErrorString(e)));
}

absl::Status CublasError(cublasStatus_t e, const std::string& what) {
  if (e == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  return absl::InternalError(absl::StrCat(what, ": cuBLAS status ", static_cast<int>(e)));
}

namespace {

// The CUDA error of the calling thread's last failed raw device allocation: the caching
// allocator only sees nullptr, TryAllocate tells out of memory from a broken device with it.
thread_local cudaError_t t_last_alloc_error = cudaSuccess;

void* RawDeviceAlloc(int ordinal, size_t bytes) {
  void* p = nullptr;
  cudaError_t e = cudaSetDevice(ordinal);
  if (e == cudaSuccess) e = cudaMalloc(&p, bytes);
  if (e != cudaSuccess) {
    t_last_alloc_error = e;
    cudaGetLastError();  // out of memory is not sticky: clear it for the next call
    return nullptr;
  }
  return p;
}

void* RawPinnedAlloc(size_t bytes) {
  void* p = nullptr;
  if (cudaHostAlloc(&p, bytes, cudaHostAllocDefault) != cudaSuccess) {
    cudaGetLastError();
    return nullptr;
  }
  return p;
}

// `s` (its code kept) prefixed with what the backend was doing: "gpu:0: copying 48 bytes to the
// host: cudaMemcpyAsync(device to host): cudaErrorIllegalAddress: ...".
absl::Status Doing(const absl::Status& s, const std::string& what) {
  if (s.ok()) return s;
  return absl::Status(s.code(), absl::StrCat(what, ": ", s.message()));
}

// Every failure is returned, never fatal: Tensor's Try forms and placement pass it on as the
// failing op's Status (see DeviceBackend in common/framework/place.h).
class CudaBackend : public DeviceBackend {
 public:
  absl::StatusOr<std::shared_ptr<char>> Allocate(const Place& place, size_t bytes) override {
    TS_ASSIGN_OR_RETURN(CudaDevice * d, CudaDevice::Get(place.device));
    return d->TryAllocate(bytes);
  }
  absl::Status Copy(void* dst, const Place& dst_place, const void* src, const Place& src_place,
                    size_t bytes) override {
    const std::string copying = absl::StrCat(": copying ", bytes, " bytes");
    if (dst_place.is_cpu()) {
      TS_ASSIGN_OR_RETURN(CudaDevice * from, CudaDevice::Get(src_place.device));
      return Doing(from->CopyToHost(dst, src, bytes),
                   absl::StrCat(src_place.DebugString(), copying, " to the host"));
    }
    TS_ASSIGN_OR_RETURN(CudaDevice * to, CudaDevice::Get(dst_place.device));
    if (src_place.is_cpu()) {
      return Doing(to->CopyToDevice(dst, src, bytes),
                   absl::StrCat(dst_place.DebugString(), copying, " from the host"));
    }
    if (src_place == dst_place) {
      return Doing(to->CopyOnDevice(dst, src, bytes),
                   absl::StrCat(dst_place.DebugString(), copying, " on the device"));
    }
    // Between GPUs: order after the source's work, then a peer copy.
    const std::string what =
        absl::StrCat(dst_place.DebugString(), copying, " from ", src_place.DebugString());
    TS_ASSIGN_OR_RETURN(CudaDevice * from, CudaDevice::Get(src_place.device));
    TS_RETURN_IF_ERROR(Doing(from->Synchronize(), what));
    return Doing(CudaError(cudaMemcpyPeerAsync(dst, to->ordinal(), src, from->ordinal(), bytes,
                                               to->stream()),
                           "cudaMemcpyPeerAsync"),
                 what);
  }
  absl::Status SetZero(const Place& place, void* p, size_t bytes) override {
    TS_ASSIGN_OR_RETURN(CudaDevice * d, CudaDevice::Get(place.device));
    return Doing(d->SetZero(p, bytes),
                 absl::StrCat(place.DebugString(), ": zeroing ", bytes, " bytes"));
  }
  absl::Status Available(const Place& place) override {
    return CudaDevice::Get(place.device).status();
  }
  std::string MemoryReport(const Place& place) override {
    auto d = CudaDevice::Get(place.device);
    if (!d.ok()) return d.status().ToString();
    const AllocatorStats s = (*d)->device_stats(), p = (*d)->pinned_stats();
    constexpr double kMiB = 1024.0 * 1024.0;
    return absl::StrCat(place.DebugString(), " memory: in use ", s.bytes_in_use / kMiB,
                        " MiB (peak ", s.peak_bytes_in_use / kMiB, "), cached ",
                        s.bytes_cached / kMiB, " MiB, cudaMalloc ", s.misses, " / reuses ",
                        s.hits, "; pinned staging ", (p.bytes_in_use + p.bytes_cached) / kMiB,
                        " MiB");
  }
  absl::Status Synchronize(const Place& place) override {
    TS_ASSIGN_OR_RETURN(CudaDevice * d, CudaDevice::Get(place.device));
    return d->Synchronize();
  }
};

}  // namespace

CudaDevice::CudaDevice(int ordinal)
    : ordinal_(ordinal),
      device_alloc_([ordinal](size_t n) { return RawDeviceAlloc(ordinal, n); },
                    [ordinal](void* p) {
                      cudaSetDevice(ordinal);
                      cudaFree(p);
                    }),
      pinned_alloc_(RawPinnedAlloc, [](void* p) { cudaFreeHost(p); }) {}

absl::StatusOr<CudaDevice*> CudaDevice::Get(int ordinal) {
  static absl::Mutex mu(absl::kConstInit);
  static auto* devices = new std::map<int, CudaDevice*>();  // never destroyed
  absl::MutexLock lock(&mu);
  auto it = devices->find(ordinal);
  if (it != devices->end()) return it->second;
  const int count = CudaDeviceCount();
  if (ordinal < 0 || ordinal >= count) {
    return absl::FailedPreconditionError(absl::StrCat(
        "GPU ", ordinal, " does not exist: CUDA reports ", count, " device(s)"));
  }
  auto* d = new CudaDevice(ordinal);
  absl::Status s = d->Init();
  if (!s.ok()) {
    delete d;
    return s;
  }
  (*devices)[ordinal] = d;
  return d;
}

absl::Status CudaDevice::Init() {
  TS_RETURN_IF_ERROR(Activate());
  TS_RETURN_IF_ERROR(CudaError(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking),
                               absl::StrCat("cudaStreamCreate on GPU ", ordinal_)));
  TS_RETURN_IF_ERROR(CublasError(cublasCreate(&cublas_), "cublasCreate"));
  return CublasError(cublasSetStream(cublas_, stream_), "cublasSetStream");
}

absl::Status CudaDevice::Activate() const {
  return CudaError(cudaSetDevice(ordinal_), absl::StrCat("cudaSetDevice(", ordinal_, ")"));
}

std::shared_ptr<char> CudaDevice::Allocate(size_t bytes) {
  return device_alloc_.AllocateShared(bytes);
}

absl::StatusOr<std::shared_ptr<char>> CudaDevice::TryAllocate(size_t bytes) {
  t_last_alloc_error = cudaSuccess;
  std::shared_ptr<char> p = Allocate(bytes);
  if (p != nullptr) return p;
  const cudaError_t e = t_last_alloc_error;
  const std::string where = place().DebugString();
  if (e != cudaErrorMemoryAllocation) {
    return CudaError(e == cudaSuccess ? cudaErrorUnknown : e,
                     absl::StrCat(where, ": cudaMalloc of ", bytes, " bytes"));
  }
  constexpr double kMiB = 1024.0 * 1024.0;
  const AllocatorStats s = device_stats();
  std::string device_free;
  size_t free = 0, total = 0;
  if (Activate().ok() && cudaMemGetInfo(&free, &total) == cudaSuccess) {
    device_free = absl::StrCat("; the device has ", free / kMiB, " of ", total / kMiB, " MiB free");
  }
  cudaGetLastError();
  return absl::ResourceExhaustedError(absl::StrCat(
      "out of memory on ", where, " allocating ", bytes, " bytes (this process holds ",
      s.bytes_in_use / kMiB, " MiB, peak ", s.peak_bytes_in_use / kMiB, " MiB", device_free, ")"));
}

void CudaDevice::RecycleStagingLocked() {
  while (!staging_.empty() && cudaEventQuery(staging_.front().first) == cudaSuccess) {
    cudaEventDestroy(staging_.front().first);
    staging_.pop_front();  // the pinned block returns to its cache
  }
}

absl::Status CudaDevice::CopyToDevice(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return absl::OkStatus();
  TS_RETURN_IF_ERROR(Activate());
  std::shared_ptr<char> staged = pinned_alloc_.AllocateShared(bytes);
  if (staged == nullptr) {  // no pinned memory: a synchronous pageable copy still works
    TS_RETURN_IF_ERROR(CudaError(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream_),
                                 "cudaMemcpyAsync(host to device)"));
    return Synchronize();
  }
  std::memcpy(staged.get(), src, bytes);
  TS_RETURN_IF_ERROR(
      CudaError(cudaMemcpyAsync(dst, staged.get(), bytes, cudaMemcpyHostToDevice, stream_),
                "cudaMemcpyAsync(host to device)"));
  cudaEvent_t done;
  TS_RETURN_IF_ERROR(
      CudaError(cudaEventCreateWithFlags(&done, cudaEventDisableTiming), "cudaEventCreate"));
  TS_RETURN_IF_ERROR(CudaError(cudaEventRecord(done, stream_), "cudaEventRecord"));
  absl::MutexLock lock(&mu_);
  RecycleStagingLocked();
  staging_.emplace_back(done, std::move(staged));
  return absl::OkStatus();
}

absl::Status CudaDevice::CopyToHost(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return absl::OkStatus();
  TS_RETURN_IF_ERROR(Activate());
  std::shared_ptr<char> staged = pinned_alloc_.AllocateShared(bytes);
  void* to = staged == nullptr ? dst : staged.get();
  TS_RETURN_IF_ERROR(CudaError(cudaMemcpyAsync(to, src, bytes, cudaMemcpyDeviceToHost, stream_),
                               "cudaMemcpyAsync(device to host)"));
  TS_RETURN_IF_ERROR(Synchronize());
  if (staged != nullptr) std::memcpy(dst, staged.get(), bytes);
  return absl::OkStatus();
}

absl::Status CudaDevice::CopyOnDevice(void* dst, const void* src, size_t bytes) {
  if (bytes == 0) return absl::OkStatus();
  TS_RETURN_IF_ERROR(Activate());
  return CudaError(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice, stream_),
                   "cudaMemcpyAsync(device to device)");
}

absl::Status CudaDevice::SetZero(void* p, size_t bytes) {
  if (bytes == 0) return absl::OkStatus();
  TS_RETURN_IF_ERROR(Activate());
  return CudaError(cudaMemsetAsync(p, 0, bytes, stream_), "cudaMemsetAsync");
}

absl::StatusOr<std::shared_ptr<char>> CudaDevice::Upload(const void* src, size_t bytes) {
  TS_ASSIGN_OR_RETURN(std::shared_ptr<char> p, TryAllocate(bytes));
  TS_RETURN_IF_ERROR(CopyToDevice(p.get(), src, bytes));
  return p;
}

absl::Status CudaDevice::Synchronize() {
  TS_RETURN_IF_ERROR(Activate());
  TS_RETURN_IF_ERROR(CudaError(cudaStreamSynchronize(stream_),
                               absl::StrCat("cudaStreamSynchronize on GPU ", ordinal_)));
  absl::MutexLock lock(&mu_);
  RecycleStagingLocked();
  return absl::OkStatus();
}

void RegisterCudaBackend() {
  static CudaBackend* backend = [] {
    auto* b = new CudaBackend();
    SetDeviceBackend(b);
    return b;
  }();
  (void)backend;
}

}  // namespace tessera
