#include "trainer/device_setup.h"

#include <string>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/device/placement.h"
#include "common/status.h"
#include "trainer/places.h"

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

}  // namespace

absl::StatusOr<DevicePlan> PlanTrainerDevices(absl::string_view device,
                                              absl::string_view devices, const OpRegistry& cpu,
                                              const ModelSpec& model,
                                              LocalTrainerOptions* options) {
  DevicePlan plan;
  TS_ASSIGN_OR_RETURN(plan.places, ParseDevices(device, devices));
  const Place place = plan.places[0];
  if (place.is_cpu()) return plan;
  for (const Place& p : plan.places) TS_RETURN_IF_ERROR(CheckPlaceAvailable(p));
  if (plan.places.size() > 1) {
    // One place per GPU: each runs forward and backward on its share of the local batch on its
    // device with its own copy of the parameters; the gradients the rest of the program reads
    // come to the host after each place's part and are combined there (CpuPlaceReducer), and
    // the rest (send/recv, all-reduce, optimizer) runs once on the host.
    if (options->cpu_places != 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--devices=", devices, " with --cpu_places=", options->cpu_places,
          ": a trainer runs on GPUs or on CPU places, not both"));
    }
    for (const Place& p : plan.places) {
      TS_ASSIGN_OR_RETURN(std::unique_ptr<OpRegistry> r,
                          MakePlacedRegistry(cpu, p, *GpuKernelTable()));
      options->place_registries.push_back(r.get());
      plan.place_registries.push_back(std::move(r));
    }
    TS_ASSIGN_OR_RETURN(PlacePrograms split, SplitForPlaces(model.main));
    std::vector<std::string> to_host = split.reduced;
    to_host.push_back(model.loss);
    if (!model.prediction.empty()) to_host.push_back(model.prediction);
    if (!model.feeds.label.empty()) to_host.push_back(model.feeds.label);
    const std::vector<std::string> feeds = FeedNames(model);
    options->place_after_run = [to_host, feeds](int, Scope* scope) -> absl::Status {
      MoveVarsToHost(scope, to_host);  // waits for the place's work on its device
      ReleaseVarsToHost(scope, feeds);
      return absl::OkStatus();
    };
    return plan;
  }
  TS_ASSIGN_OR_RETURN(plan.registry, MakePlacedRegistry(cpu, place, *GpuKernelTable()));

  std::vector<std::string> fetched = {model.loss};
  if (!model.prediction.empty()) fetched.push_back(model.prediction);
  if (!model.feeds.label.empty()) fetched.push_back(model.feeds.label);
  const std::vector<std::string> feeds = FeedNames(model);
  auto previous = std::move(options->after_run);
  options->after_run = [fetched, feeds, previous](Scope* scope) -> absl::Status {
    MoveVarsToHost(scope, fetched);  // waits for the step's work on the device
    ReleaseVarsToHost(scope, feeds);
    return previous ? previous(scope) : absl::OkStatus();
  };
  return plan;
}

}  // namespace tessera
