// Device placement of a trainer (--device=cpu|gpu, --devices=N[,M...]).
//
// How it works: the trainer's ops run through a placed registry (common/device/placement.h):
// GPU kernels where they exist and accept the op, the CPU kernels otherwise, with variables
// moving lazily between host and device. Parameters stay where they were: on the pservers,
// received into host tensors and uploaded by the first GPU op that reads them each step; each
// gradient is copied to the host once per step, by the send (or allreduce) op that reads it.
// After every program run the hook installed here copies the fetched variables (loss,
// prediction, label) to the host and releases the feed variables there, so LocalTrainer and the
// feeder only ever touch host tensors.
//
// Seam for several GPUs per trainer: ParseDevices() already returns every listed place; one
// LocalTrainer drives one place. The multi-place trainer (trainer/places.*, PlaceRunner, built
// separately) plugs in as: each place's executor over MakePlacedRegistry(cpu, Place::Gpu(i),
// *GpuKernelTable()), its child scope holding device tensors; a PlaceReducer for GPU places
// that all-reduces the `reduced` gradients with NCCL on the devices and copies the result to
// the host once (or, simplest, MoveVarsToHost on each place scope's `reduced` variables and
// the CpuPlaceReducer). Until then more than one device is refused with a clear message.
#ifndef TESSERA_TRAINER_DEVICE_SETUP_H_
#define TESSERA_TRAINER_DEVICE_SETUP_H_

#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/device/place.h"
#include "common/op_registry.h"
#include "trainer/local_trainer.h"
#include "common/model_spec.h"

namespace tessera {

struct DevicePlan {
  std::vector<Place> places;             // the trainer's places (one, for now)
  std::unique_ptr<OpRegistry> registry;  // placed registry; null when running on the CPU

  bool on_gpu() const { return registry != nullptr; }
  // The registry LocalTrainer should execute with.
  const OpRegistry* executor_registry(const OpRegistry* cpu) const {
    return registry != nullptr ? registry.get() : cpu;
  }
};

// Parses --device/--devices, checks the GPU is usable (a CPU-only build, a missing GPU or driver
// fail here with a message naming the flag and device), builds the placed registry over `cpu`
// and chains the host-sync hook into options->after_run. `cpu` must outlive the plan.
absl::StatusOr<DevicePlan> PlanTrainerDevices(absl::string_view device,
                                              absl::string_view devices, const OpRegistry& cpu,
                                              const ModelSpec& model,
                                              LocalTrainerOptions* options);

}  // namespace tessera

#endif  // TESSERA_TRAINER_DEVICE_SETUP_H_
