// Place: where a tensor's buffer lives (host memory or one GPU), and the hook through which
// Tensor reaches device memory.
//
// The CPU build has no device code: nothing registers a DeviceBackend, no tensor is ever placed
// on a GPU, and Tensor behaves exactly as before. The CUDA runtime (common/device/cuda, built
// only with --config=cuda) registers its backend when it is linked in.
//
// The backend is the one process-wide piece of device state, on purpose: a Tensor (which has
// no context argument) must reach device memory from anywhere, and what it wraps is
// process-wide anyway — a CUDA context, its streams and its allocators belong to the process
// and the device. Everything above it is a value its owner passes on: the GPU kernels are a
// DeviceKernelTable a trainer's DevicePlan owns (placement.h), the NCCL communicators of
// several GPUs belong to that plan's place reducer (trainer/nccl_place_reducer.h).
#ifndef TESSERA_COMMON_FRAMEWORK_PLACE_H_
#define TESSERA_COMMON_FRAMEWORK_PLACE_H_

#include <cstddef>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace tessera {

struct Place {
  enum class Kind { kCpu, kGpu };
  Kind kind = Kind::kCpu;
  int device = 0;  // GPU ordinal; 0 for the CPU

  static Place Cpu() { return Place(); }
  static Place Gpu(int device) { return Place{Kind::kGpu, device}; }
  bool is_cpu() const { return kind == Kind::kCpu; }
  bool is_gpu() const { return kind == Kind::kGpu; }
  bool operator==(const Place& o) const { return kind == o.kind && device == o.device; }
  bool operator!=(const Place& o) const { return !(*this == o); }
  // "cpu", "gpu:0".
  std::string DebugString() const;
};

// "cpu", "gpu" (= gpu:0) or "gpu:N"; the error names the bad text.
absl::StatusOr<Place> ParsePlace(absl::string_view text);

// Device memory for Tensor. Implementations are thread-safe and live for the whole process.
// All operations are ordered on the device's stream; Copy returns once the bytes are readable
// at `dst` (a copy to the host waits for the stream).
//
// Every failure is a Status whose message names the device, so that it reaches whoever has an
// error path (placement, device kernels: an op's Status) instead of ending the process; the
// Tensor methods without a Status are the only callers left that abort on one (common/framework/tensor.h).
class DeviceBackend {
 public:
  virtual ~DeviceBackend() = default;
  // A buffer of at least `bytes` on `place` (a GPU); the deleter returns it to the backend.
  // ResourceExhausted naming the device and the size when it has no memory left; another code
  // (FailedPrecondition, Internal) naming the device when it cannot be used at all.
  virtual absl::StatusOr<std::shared_ptr<char>> Allocate(const Place& place, size_t bytes) = 0;
  // Copies `bytes` from src (on src_place) to dst (on dst_place); at least one is a GPU. On
  // failure (the device runtime's error, naming both places) the bytes at `dst` are unspecified.
  virtual absl::Status Copy(void* dst, const Place& dst_place, const void* src,
                            const Place& src_place, size_t bytes) = 0;
  // Sets `bytes` bytes at `p` (on the GPU `place`) to zero; the error names the device.
  virtual absl::Status SetZero(const Place& place, void* p, size_t bytes) = 0;
  // OK when `place` can be used; the error names the device and why it cannot.
  virtual absl::Status Available(const Place& place) { return absl::OkStatus(); }
  // Waits for the work enqueued on `place`.
  virtual absl::Status Synchronize(const Place& place) { return absl::OkStatus(); }
  // One line about the device memory of `place` (allocator bytes in use/cached, hits/misses).
  virtual std::string MemoryReport(const Place& place) { return ""; }
};

// The registered backend, or nullptr (always in the CPU build). Set once, at static
// initialization of the CUDA runtime library; never unset.
DeviceBackend* GetDeviceBackend();
void SetDeviceBackend(DeviceBackend* backend);

}  // namespace tessera

#endif  // TESSERA_COMMON_FRAMEWORK_PLACE_H_
