#include "trainer/device_setup.h"

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/device/placement.h"
#include "common/base/status.h"
#include "trainer/places.h"
#ifdef TESSERA_WITH_CUDA
#include "common/device/cuda/gpu_ops.h"
#endif
#ifdef TESSERA_WITH_NCCL
#include "trainer/nccl_place_reducer.h"
#endif

namespace tessera {

namespace {

// The variables the feeder writes.
std::vector<std::string> FeedNames(const ModelSpec& model) {
  std::vector<std::string> feeds;
  if (!model.feeds.dense.empty()) feeds.push_back(model.feeds.dense);
  for (const SlotFeed& slot : model.feeds.slots) feeds.push_back(slot.name);
  for (const SlotFeed& slot : model.feeds.multi_slots) feeds.push_back(slot.name);
  return feeds;
}

// The plan's GPU kernels: setup.register_kernels, else the CUDA ones where linked.
absl::Status FillKernels(const DeviceSetupOptions& setup, DeviceKernelTable* table) {
  if (setup.register_kernels) return setup.register_kernels(table);
#ifdef TESSERA_WITH_CUDA
  return RegisterGpuKernels(table);
#else
  return absl::OkStatus();  // CheckPlaceAvailable refused a GPU unless a fake backend is set
#endif
}

// Several GPUs: the NCCL reducer over their ordinals, or null for the host reducer.
absl::StatusOr<std::shared_ptr<PlaceReducer>> MakePlaceReducer(const std::vector<Place>& places,
                                                               const DeviceSetupOptions& setup) {
#ifdef TESSERA_WITH_NCCL
  if (setup.reduce_on_devices) {
    std::vector<int> ordinals;
    for (const Place& p : places) ordinals.push_back(p.device);
    TS_ASSIGN_OR_RETURN(std::unique_ptr<NcclPlaceReducer> nccl,
                        NcclPlaceReducer::Create(std::move(ordinals)));
    return std::shared_ptr<PlaceReducer>(std::move(nccl));
  }
#endif
  (void)places;
  (void)setup;
  return std::shared_ptr<PlaceReducer>();
}

}  // namespace

absl::StatusOr<DevicePlan> PlanTrainerDevices(absl::string_view device, absl::string_view devices,
                                              const OpRegistry& cpu, const ModelSpec& model,
                                              LocalTrainerOptions* options,
                                              const DeviceSetupOptions& setup) {
  DevicePlan plan;
  TS_ASSIGN_OR_RETURN(plan.places, ParseDevices(device, devices));
  const Place place = plan.places[0];
  if (place.is_cpu()) return plan;
  for (const Place& p : plan.places) TS_RETURN_IF_ERROR(CheckPlaceAvailable(p));
  if (plan.places.size() > 1 && options->cpu_places != 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--devices=", devices, " with --cpu_places=", options->cpu_places,
                     ": a trainer runs on GPUs or on CPU places, not both"));
  }
  plan.kernels = std::make_unique<DeviceKernelTable>();
  TS_RETURN_IF_ERROR(FillKernels(setup, plan.kernels.get()));
  if (plan.places.size() > 1) {
    // One place per GPU: each runs forward and backward on its share of the local batch on its
    // device with its own copy of the parameters; the place reducer combines the gradients the
    // rest of the program reads (on the devices or on the host: see the file comment), and the
    // rest (send/recv, all-reduce, optimizer) runs once on the host.
    for (const Place& p : plan.places) {
      TS_ASSIGN_OR_RETURN(std::unique_ptr<OpRegistry> r, MakePlacedRegistry(cpu, p, *plan.kernels));
      options->place_registries.push_back(r.get());
      plan.place_registries.push_back(std::move(r));
    }
    TS_ASSIGN_OR_RETURN(PlacePrograms split, SplitForPlaces(model.main));
    TS_ASSIGN_OR_RETURN(plan.place_reducer, MakePlaceReducer(plan.places, setup));
    options->place_reducer = plan.place_reducer;
    std::vector<std::string> fetched = {model.loss};
    if (!model.prediction.empty()) fetched.push_back(model.prediction);
    if (!model.feeds.label.empty()) fetched.push_back(model.feeds.label);
    const std::vector<std::string> feeds = FeedNames(model);
    if (plan.place_reducer == nullptr) {
      // The host reducer reads every gradient on the host.
      std::vector<std::string> to_host = split.reduced;
      to_host.insert(to_host.end(), fetched.begin(), fetched.end());
      options->place_after_run = [to_host, feeds](int, Scope* scope) -> absl::Status {
        // Waits for the place's work on its device.
        TS_RETURN_IF_ERROR(MoveVarsToHost(scope, to_host));
        ReleaseVarsToHost(scope, feeds);
        return absl::OkStatus();
      };
    } else {
      // The dense gradients stay on the device for the NCCL reduce (ordered after this
      // place's kernels by its stream); the sparse ones are concatenated on the host, so they
      // come down here, in the place's thread, beside the fetches.
      const std::vector<std::string> reduced = split.reduced;
      options->place_after_run = [fetched, reduced, feeds](int, Scope* scope) -> absl::Status {
        TS_RETURN_IF_ERROR(MoveVarsToHost(scope, fetched));
        for (const std::string& name : reduced) {
          Variable* v = scope->FindVar(name);
          if (v != nullptr && v->Is<SelectedRows>()) {
            TS_RETURN_IF_ERROR(MoveToPlace(v, Place::Cpu()));
          }
        }
        ReleaseVarsToHost(scope, feeds);
        return absl::OkStatus();
      };
    }
    return plan;
  }
  TS_ASSIGN_OR_RETURN(plan.registry, MakePlacedRegistry(cpu, place, *plan.kernels));

  std::vector<std::string> fetched = {model.loss};
  if (!model.prediction.empty()) fetched.push_back(model.prediction);
  if (!model.feeds.label.empty()) fetched.push_back(model.feeds.label);
  const std::vector<std::string> feeds = FeedNames(model);
  auto previous = std::move(options->after_run);
  options->after_run = [fetched, feeds, previous](Scope* scope) -> absl::Status {
    // Waits for the step's work on the device.
    TS_RETURN_IF_ERROR(MoveVarsToHost(scope, fetched));
    ReleaseVarsToHost(scope, feeds);
    return previous ? previous(scope) : absl::OkStatus();
  };
  return plan;
}

}  // namespace tessera
