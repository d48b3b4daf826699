// Placement: running a program's ops on a device, with the CPU kernels as the fallback.
//
// Device kernels live in a DeviceKernelTable keyed by op type, beside the CPU OpRegistry. A
// table is a value its user owns — a trainer's DevicePlan (trainer/device_setup.h) fills its own
// with RegisterGpuKernels (common/device/cuda/gpu_ops.h) in a --config=cuda build; tests fill
// theirs with fakes — so there is no process-wide kernel table. (The device backend of place.h,
// memory and copies, is process-wide: CUDA contexts are.)
// MakePlacedRegistry(cpu, place, table) returns a registry with the same op types, gradient
// makers and order as `cpu`, whose kernels are:
//   - the device kernel, when the table has one for the type and it accepts the op (a device
//     kernel returns false for what it does not support — a dtype, an attribute, a shape it
//     would reject — and the CPU kernel then runs the op and reports any bad input with its
//     usual message);
//   - otherwise the CPU kernel, after every input variable was copied to the host and every
//     pure output variable (not also an input) was released to the host.
// Variables migrate lazily: a device kernel moves its inputs to its place (PlacedInput) and
// allocates its outputs there (PlacedOutput); a CPU kernel (send, recv, allreduce, feed...)
// pulls what it reads back to the host. So a trainer step on a GPU uploads the fed batch and
// the received parameters once, and copies each gradient to the host once, at its send op.
// Host code outside the executor (feeding, reading the loss) must call MoveVarsToHost /
// ReleaseVarsToHost on the variables it touches (see trainer/trainer_daemon.cc).
//
// Device failures are Statuses, never aborts: a device out of memory (ResourceExhausted) or a
// failed copy (the device runtime's error) while moving an input, allocating an output or
// bringing a CPU kernel's inputs to the host fails the op, with a message naming the device
// and the variable, to which the executor adds the op. Device kernels therefore allocate their
// outputs through PlacedOutput and use Tensor's Try forms (tensor.h), never the Tensor methods
// that abort on a device failure.
#ifndef TESSERA_COMMON_DEVICE_PLACEMENT_H_
#define TESSERA_COMMON_DEVICE_PLACEMENT_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/framework/place.h"
#include "common/framework/op_registry.h"
#include "common/framework/scope.h"
#include "common/framework/tensor.h"

namespace tessera {

// Runs the op on `place` and returns true, or returns false without side effects on the op's
// results to let the CPU kernel run it.
using DeviceKernelFn = std::function<absl::StatusOr<bool>(OpContext& ctx, const Place& place)>;

// Device kernels by op type. Thread-compatible: filled once, then only read.
class DeviceKernelTable {
 public:
  // AlreadyExists when `type` has a kernel.
  absl::Status Register(absl::string_view type, DeviceKernelFn fn);
  const DeviceKernelFn* Find(absl::string_view type) const;
  std::vector<std::string> Types() const;

 private:
  std::map<std::string, DeviceKernelFn, std::less<>> kernels_;
};

// Bytes moved by placement (process-wide, all devices), for tests and benchmarks.
struct PlacementCounters {
  int64_t copies_to_device = 0;
  int64_t bytes_to_device = 0;
  int64_t copies_to_host = 0;
  int64_t bytes_to_host = 0;
  int64_t ops_on_device = 0;
  int64_t ops_on_host = 0;  // CPU kernels run by a placed registry
};
PlacementCounters GetPlacementCounters();
// What placement did between two readings, per step: "per step: 109 ops on device kernels, 52 on
// CPU kernels; 80 copies to the device (30.5 KiB), 60 to the host (12.0 KiB)". Steps <= 0 count
// as one.
std::string PlacementPerStep(const PlacementCounters& before, const PlacementCounters& after,
                             int64_t steps);

// Moves the dense tensor or SelectedRows value held by `var` to `place`, copying its contents
// (no-op when already there or uninitialized). On a device failure (out of memory, a failed
// copy) `var` is left where it was, and the error names the device.
absl::Status MoveToPlace(Variable* var, const Place& place);
// Points `var`'s tensor (or SelectedRows value) at `place` without copying: contents are lost.
// ResourceExhausted when `place` is a device without memory left (`var` is left as it was);
// releasing to the host cannot fail.
absl::Status ReleaseToPlace(Variable* var, const Place& place);

// For device kernels: the dense input bound to `slot` (argument i), moved to `place`.
absl::StatusOr<const Tensor*> PlacedInput(OpContext& ctx, absl::string_view slot,
                                          const Place& place, int i = 0);
// The input variable (dense or SelectedRows) bound to `slot`, moved to `place`.
absl::StatusOr<const Variable*> PlacedInputVar(OpContext& ctx, absl::string_view slot,
                                               const Place& place, int i = 0);
// The dense output bound to `slot`, typed `dtype` and shaped `shape` on `place`, its buffer
// allocated there: the way device kernels allocate outputs. The buffer is kept when large
// enough, so an output that is also an input of the op (in place, moved by PlacedInput) keeps
// its contents. ResourceExhausted naming the device, the size and the variable when the device
// has no memory left; the output is then not sized, and the op must fail.
absl::StatusOr<Tensor*> PlacedOutput(OpContext& ctx, absl::string_view slot, const Place& place,
                                     DataType dtype, Shape shape, int i = 0);
// The dense output bound to `slot`, on `place`, not sized: for an output that may be one of
// the op's inputs and then keeps its type and shape (moved with its contents by PlacedInput).
// The caller sizes any other with Tensor::TryResize (a Status where Resize would abort). An
// output elsewhere gets an uninitialized buffer of its old size on `place`: ResourceExhausted
// when that does not fit.
absl::StatusOr<Tensor*> PlacedOutput(OpContext& ctx, absl::string_view slot, const Place& place,
                                     int i = 0);

// A registry for running programs on `place` (see the file comment). For a CPU place it holds
// the CPU kernels unchanged. `cpu` and `table` must outlive the result.
absl::StatusOr<std::unique_ptr<OpRegistry>> MakePlacedRegistry(const OpRegistry& cpu,
                                                               const Place& place,
                                                               const DeviceKernelTable& table);

// Copies the named variables of `scope` (missing ones skipped) to the host. Stops at the first
// device failure, whose error names the variable and the device (those not yet copied stay on
// their device).
absl::Status MoveVarsToHost(Scope* scope, const std::vector<std::string>& names);
// Releases the named variables to the host without copying (for variables the host is about to
// overwrite, such as feeds). Cannot fail: nothing is read from a device.
void ReleaseVarsToHost(Scope* scope, const std::vector<std::string>& names);
// Copies every variable of `scope` (its own, not its parents') to the host; errors as
// MoveVarsToHost.
absl::Status MoveScopeToHost(Scope* scope);

// OK for the CPU, and for a GPU the linked-in device runtime can use; FailedPrecondition
// otherwise (a binary built without --config=cuda, no such GPU, no driver).
absl::Status CheckPlaceAvailable(const Place& place);
// Waits for the work enqueued on `place` (no-op for the CPU).
absl::Status SynchronizePlace(const Place& place);
// The device runtime's one-line memory report for `place` ("" for the CPU or without one).
std::string PlaceMemoryReport(const Place& place);

// How a process runs its ops: the place of each device it drives. An empty list or a single
// CPU place means the plain CPU kernels. Several GPUs per process are the multi-place trainer's
// business (trainer/places.*); this layer drives one place per registry.
absl::StatusOr<std::vector<Place>> ParseDevices(absl::string_view device,
                                                absl::string_view devices);

}  // namespace tessera

#endif  // TESSERA_COMMON_DEVICE_PLACEMENT_H_
