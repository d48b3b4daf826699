// CudaDevice: one GPU as Tessera uses it — one stream (every kernel and copy of the process on
// this device is ordered on it), one cuBLAS handle bound to the stream, a caching allocator for
// device memory and one for pinned host staging buffers. Built only with --config=cuda.
//
// Synchronization points are explicit: a copy to the host waits for the stream (the host reads
// the bytes next); Synchronize() waits for everything enqueued. Copies to the device are
// asynchronous: the host bytes are staged into a pinned buffer, which is recycled once an event
// recorded after the copy has completed.
#ifndef TESSERA_COMMON_DEVICE_CUDA_CUDA_DEVICE_H_
#define TESSERA_COMMON_DEVICE_CUDA_CUDA_DEVICE_H_

#include <cstddef>
#include <deque>
#include <memory>
#include <string>
#include <utility>

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/device/caching_allocator.h"
#include "common/framework/place.h"

namespace tessera {

// The number of CUDA devices; 0 when the driver reports none or fails (no GPU, no driver).
int CudaDeviceCount();
// "cudaErrorNoDevice: no CUDA-capable device is detected" style text for a failed call.
absl::Status CudaError(cudaError_t e, const std::string& what);
absl::Status CublasError(cublasStatus_t e, const std::string& what);

class CudaDevice {
 public:
  // The process-wide device `ordinal`, initialized on first use (stream, cuBLAS handle).
  // FailedPrecondition names the ordinal when there is no such device.
  static absl::StatusOr<CudaDevice*> Get(int ordinal);

  int ordinal() const { return ordinal_; }
  Place place() const { return Place::Gpu(ordinal_); }
  cudaStream_t stream() const { return stream_; }
  cublasHandle_t cublas() const { return cublas_; }

  // Makes this device current for the calling thread.
  absl::Status Activate() const;
  // Device memory from the caching allocator (nullptr when out of memory).
  std::shared_ptr<char> Allocate(size_t bytes);
  // The same, with the reason on failure: ResourceExhausted naming the device, the size and
  // the memory in use when the device has none left; Internal with the CUDA error otherwise.
  absl::StatusOr<std::shared_ptr<char>> TryAllocate(size_t bytes);
  AllocatorStats device_stats() const { return device_alloc_.stats(); }
  AllocatorStats pinned_stats() const { return pinned_alloc_.stats(); }

  // Asynchronous host -> device copy through a pinned staging buffer (`src` may be reused as
  // soon as this returns).
  absl::Status CopyToDevice(void* dst, const void* src, size_t bytes);
  // Device -> host copy; returns when the bytes are at `dst` (a synchronization point).
  absl::Status CopyToHost(void* dst, const void* src, size_t bytes);
  // Device -> device, asynchronous.
  absl::Status CopyOnDevice(void* dst, const void* src, size_t bytes);
  absl::Status SetZero(void* p, size_t bytes);
  // A device copy of `bytes` host bytes (for small index arrays: ids, rows, labels).
  absl::StatusOr<std::shared_ptr<char>> Upload(const void* src, size_t bytes);
  // Waits for all work enqueued on the stream.
  absl::Status Synchronize();

 private:
  explicit CudaDevice(int ordinal);
  absl::Status Init();
  // Drops staging buffers whose copies completed. Requires mu_.
  void RecycleStagingLocked();

  const int ordinal_;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
  CachingAllocator device_alloc_;
  CachingAllocator pinned_alloc_;
  absl::Mutex mu_;
  std::deque<std::pair<cudaEvent_t, std::shared_ptr<char>>> staging_ ABSL_GUARDED_BY(mu_);
};

// Registers the CUDA DeviceBackend (idempotent); done when this library is linked in. Its
// failures are Statuses naming the device (see DeviceBackend); it never ends the process.
void RegisterCudaBackend();

}  // namespace tessera

#endif  // TESSERA_COMMON_DEVICE_CUDA_CUDA_DEVICE_H_
