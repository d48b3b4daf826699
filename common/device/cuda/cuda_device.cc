#include "common/device/cuda/cuda_device.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>

#include <cuda_runtime.h>

#include "absl/strings/str_cat.h"
#include "common/status.h"

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

void* RawDeviceAlloc(int ordinal, size_t bytes) {
  void* p = nullptr;
  if (cudaSetDevice(ordinal) != cudaSuccess || cudaMalloc(&p, bytes) != cudaSuccess) {
    cudaGetLastError();
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

// Tensor has no error path: a failing CUDA call under it is fatal, with the reason.
void Die(const absl::Status& s) {
  std::fprintf(stderr, "tessera: CUDA failure under a tensor operation: %s\n",
               s.ToString().c_str());
  std::abort();
}

class CudaBackend : public DeviceBackend {
 public:
  std::shared_ptr<char> Allocate(const Place& place, size_t bytes) override {
    CudaDevice* d = DeviceOrDie(place);
    std::shared_ptr<char> p = d->Allocate(bytes);
    if (p == nullptr) {
      Die(absl::ResourceExhaustedError(absl::StrCat("out of memory on ", place.DebugString(),
                                                    " allocating ", bytes, " bytes")));
    }
    return p;
  }
  void Copy(void* dst, const Place& dst_place, const void* src, const Place& src_place,
            size_t bytes) override {
    absl::Status s;
    if (dst_place.is_cpu()) {
      s = DeviceOrDie(src_place)->CopyToHost(dst, src, bytes);
    } else if (src_place.is_cpu()) {
      s = DeviceOrDie(dst_place)->CopyToDevice(dst, src, bytes);
    } else if (src_place == dst_place) {
      s = DeviceOrDie(dst_place)->CopyOnDevice(dst, src, bytes);
    } else {  // between GPUs: order after the source's work, then a peer copy
      CudaDevice* from = DeviceOrDie(src_place);
      CudaDevice* to = DeviceOrDie(dst_place);
      s = from->Synchronize();
      if (s.ok()) {
        s = CudaError(cudaMemcpyPeerAsync(dst, to->ordinal(), src, from->ordinal(), bytes,
                                          to->stream()),
                      "cudaMemcpyPeerAsync");
      }
    }
    if (!s.ok()) Die(s);
  }
  void SetZero(const Place& place, void* p, size_t bytes) override {
    absl::Status s = DeviceOrDie(place)->SetZero(p, bytes);
    if (!s.ok()) Die(s);
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

 private:
  static CudaDevice* DeviceOrDie(const Place& place) {
    auto d = CudaDevice::Get(place.device);
    if (!d.ok()) Die(d.status());
    return *d;
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
  std::shared_ptr<char> p = Allocate(bytes);
  if (p == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrCat("out of memory on GPU ", ordinal_, " allocating ", bytes, " bytes"));
  }
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
