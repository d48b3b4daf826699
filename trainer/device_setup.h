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
// Several GPUs per trainer (--devices=0,1,...): the multi-place trainer (trainer/places.h) with
// one place per GPU. Each place's executor runs over MakePlacedRegistry(cpu, Place::Gpu(i),
// *GpuKernelTable()) on its child scope, with its own copy of the parameters (refreshed from
// the host each step: a device kernel moves what it reads). After its forward and backward, a
// place's gradients, loss and fetches come to the host (MoveVarsToHost in place_after_run),
// the CpuPlaceReducer combines them weighted by the places' shares, and the rest of the
// program (send/recv, all-reduce, optimizer) runs once on the host. An NCCL PlaceReducer that
// reduces on the devices is the next step; the host reduction gives the same result.
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
  std::vector<Place> places;             // the trainer's places
  std::unique_ptr<OpRegistry> registry;  // one GPU: the placed registry; else null
  // Several GPUs: one placed registry per place (LocalTrainerOptions::place_registries).
  std::vector<std::unique_ptr<OpRegistry>> place_registries;

  bool on_gpu() const { return registry != nullptr || !place_registries.empty(); }
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
