// Device placement of a trainer (--device=cpu|gpu, --devices=N[,M...]).
//
// How it works: the trainer's ops run through a placed registry (common/device/placement.h):
// GPU kernels where they exist and accept the op, the CPU kernels otherwise, with variables
// moving lazily between host and device. The GPU kernels are a table the plan owns, filled with
// RegisterGpuKernels (common/device/cuda/gpu_ops.h) in a --config=cuda build; the CPU build
// links no CUDA code and refuses --device=gpu. Parameters stay where they were: on the
// pservers, received into host tensors and uploaded by the first GPU op that reads them each
// step; each gradient is copied to the host once per step, by the send (or allreduce) op that
// reads it. After every program run the hook installed here copies the fetched variables (loss,
// prediction, label) to the host and releases the feed variables there, so LocalTrainer and the
// feeder only ever touch host tensors.
//
// Several GPUs per trainer (--devices=0,1,...): the multi-place trainer (trainer/places.h) with
// one place per GPU. Each place's executor runs over MakePlacedRegistry(cpu, Place::Gpu(i),
// plan's kernels) on its child scope, with its own copy of the parameters (refreshed from the
// host each step: a device kernel moves what it reads). After its forward and backward, a
// place's loss and fetches come to the host (place_after_run) and the rest of the program
// (send/recv, all-reduce, optimizer) runs once on the host, on the gradients the places'
// reducer combined weighted by the places' shares of the batch:
//   --config=cuda (NCCL): an NcclPlaceReducer (trainer/nccl_place_reducer.h) all of whose
//     communicators the plan owns. Dense gradients stay on their GPUs after a place's part; the
//     reducer sums them there with NCCL, on the devices' streams (ordered after the places'
//     kernels, with no synchronization in between), and brings only the sum to the host.
//     Sparse gradients come to the host in place_after_run and are concatenated there.
//   otherwise (or DeviceSetupOptions::reduce_on_devices = false): every gradient comes to the
//     host in place_after_run and a CpuPlaceReducer combines them there. Same result up to
//     float32 rounding.
#ifndef TESSERA_TRAINER_DEVICE_SETUP_H_
#define TESSERA_TRAINER_DEVICE_SETUP_H_

#include <functional>
#include <memory>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/framework/place.h"
#include "common/device/placement.h"
#include "common/framework/model_spec.h"
#include "common/framework/op_registry.h"
#include "trainer/local_trainer.h"
#include "trainer/places.h"

namespace tessera {

struct DeviceSetupOptions {
  // Fills the plan's GPU kernel table. Empty: the CUDA kernels (RegisterGpuKernels) in a
  // --config=cuda build, none in the CPU build. Tests over a fake device put fakes here.
  std::function<absl::Status(DeviceKernelTable*)> register_kernels;
  // Several GPUs in a --config=cuda build: reduce the dense gradients on the GPUs with NCCL
  // (default). false, and always in a build without NCCL: combine every gradient on the host.
  bool reduce_on_devices = true;
};

struct DevicePlan {
  std::vector<Place> places;  // the trainer's places
  // The GPU kernels the placed registries run (empty on the CPU). Owned here: the registries
  // must not outlive it.
  std::unique_ptr<DeviceKernelTable> kernels;
  std::unique_ptr<OpRegistry> registry;  // one GPU: the placed registry; else null
  // Several GPUs: one placed registry per place (LocalTrainerOptions::place_registries).
  std::vector<std::unique_ptr<OpRegistry>> place_registries;
  // Several GPUs with NCCL: the NcclPlaceReducer (also in LocalTrainerOptions::place_reducer),
  // holding the communicators of the GPUs; else null (the trainer's CpuPlaceReducer).
  std::shared_ptr<PlaceReducer> place_reducer;

  bool on_gpu() const { return registry != nullptr || !place_registries.empty(); }
  // The registry LocalTrainer should execute with.
  const OpRegistry* executor_registry(const OpRegistry* cpu) const {
    return registry != nullptr ? registry.get() : cpu;
  }
};

// Parses --device/--devices, checks the GPU is usable (a CPU-only build, a missing GPU or driver
// fail here with a message naming the flag and device), fills the plan's kernel table, builds
// the placed registries over `cpu` and chains the host-sync hook into options->after_run (one
// GPU) or sets options->place_registries, place_after_run and place_reducer (several GPUs).
// An NCCL failure setting up the reducer is Unavailable. `cpu` must outlive the plan, and the
// plan the trainer built with `options`.
absl::StatusOr<DevicePlan> PlanTrainerDevices(absl::string_view device, absl::string_view devices,
                                              const OpRegistry& cpu, const ModelSpec& model,
                                              LocalTrainerOptions* options,
                                              const DeviceSetupOptions& setup = {});

}  // namespace tessera

#endif  // TESSERA_TRAINER_DEVICE_SETUP_H_
