#include "trainer/device_setup.h"

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/device/placement.h"
#include "common/status.h"

namespace tessera {

absl::StatusOr<DevicePlan> PlanTrainerDevices(absl::string_view device,
                                              absl::string_view devices, const OpRegistry& cpu,
                                              const ModelSpec& model,
                                              LocalTrainerOptions* options) {
  DevicePlan plan;
  TS_ASSIGN_OR_RETURN(plan.places, ParseDevices(device, devices));
  if (plan.places.size() > 1) {
    return absl::UnimplementedError(absl::StrCat(
        "--devices=", devices, ": one trainer process drives one GPU; several GPUs per trainer "
        "need the multi-place trainer (trainer/places). Run one trainer per GPU instead"));
  }
  const Place place = plan.places[0];
  if (place.is_cpu()) return plan;
  TS_RETURN_IF_ERROR(CheckPlaceAvailable(place));
  TS_ASSIGN_OR_RETURN(plan.registry, MakePlacedRegistry(cpu, place, *GpuKernelTable()));

  std::vector<std::string> fetched = {model.loss};
  if (!model.prediction.empty()) fetched.push_back(model.prediction);
  if (!model.feeds.label.empty()) fetched.push_back(model.feeds.label);
  std::vector<std::string> feeds;
  if (!model.feeds.dense.empty()) feeds.push_back(model.feeds.dense);
  for (const SlotFeed& slot : model.feeds.slots) feeds.push_back(slot.name);
  for (const SlotFeed& slot : model.feeds.multi_slots) feeds.push_back(slot.name);
  auto previous = std::move(options->after_run);
  options->after_run = [fetched, feeds, previous](Scope* scope) -> absl::Status {
    MoveVarsToHost(scope, fetched);  // waits for the step's work on the device
    ReleaseVarsToHost(scope, feeds);
    return previous ? previous(scope) : absl::OkStatus();
  };
  return plan;
}

}  // namespace tessera
