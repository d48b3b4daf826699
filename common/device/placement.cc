#include "common/device/placement.h"

#include <atomic>
#include <set>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/status.h"

namespace tessera {

absl::Status DeviceKernelTable::Register(absl::string_view type, DeviceKernelFn fn) {
  if (!kernels_.emplace(std::string(type), std::move(fn)).second) {
    return absl::AlreadyExistsError(absl::StrCat("device kernel '", type, "' is registered twice"));
  }
  return absl::OkStatus();
}

const DeviceKernelFn* DeviceKernelTable::Find(absl::string_view type) const {
  auto it = kernels_.find(type);
  return it == kernels_.end() ? nullptr : &it->second;
}

std::vector<std::string> DeviceKernelTable::Types() const {
  std::vector<std::string> out;
  for (const auto& [type, fn] : kernels_) out.push_back(type);
  return out;
}

namespace {

struct AtomicCounters {
  std::atomic<int64_t> copies_to_device{0}, bytes_to_device{0}, copies_to_host{0},
      bytes_to_host{0}, ops_on_device{0}, ops_on_host{0};
};
AtomicCounters& Counters() {
  static auto* c = new AtomicCounters();
  return *c;
}

void MoveTensor(Tensor* t, const Place& place) {
  if (t->place() == place) return;
  if (!t->initialized()) {
    t->ResetPlace(place);
    return;
  }
  Tensor moved;
  moved.ResetPlace(place);
  moved.CopyFrom(*t);
  AtomicCounters& c = Counters();
  if (place.is_cpu()) {
    c.copies_to_host.fetch_add(1, std::memory_order_relaxed);
    c.bytes_to_host.fetch_add(static_cast<int64_t>(t->nbytes()), std::memory_order_relaxed);
  } else {
    c.copies_to_device.fetch_add(1, std::memory_order_relaxed);
    c.bytes_to_device.fetch_add(static_cast<int64_t>(t->nbytes()), std::memory_order_relaxed);
  }
  *t = std::move(moved);
}

Variable* MutableVar(const OpContext& ctx, const std::string& name) {
  if (name.empty() || name == kEmptyVarName) return nullptr;
  return ctx.scope()->FindVar(name);
}

// The CPU kernel, with what it reads on the host and what it writes released there.
absl::Status RunOnHost(const KernelFn& kernel, OpContext& ctx) {
  const std::vector<std::string> in_args = AllInputArgs(ctx.op());
  const std::set<std::string> ins(in_args.begin(), in_args.end());
  for (const std::string& name : ins) {
    if (Variable* v = MutableVar(ctx, name)) MoveToPlace(v, Place::Cpu());
  }
  for (const std::string& name : AllOutputArgs(ctx.op())) {
    if (ins.count(name) > 0) continue;
    if (Variable* v = MutableVar(ctx, name)) ReleaseToPlace(v, Place::Cpu());
  }
  return kernel(ctx);
}

}  // namespace

PlacementCounters GetPlacementCounters() {
  AtomicCounters& c = Counters();
  PlacementCounters out;
  out.copies_to_device = c.copies_to_device.load();
  out.bytes_to_device = c.bytes_to_device.load();
  out.copies_to_host = c.copies_to_host.load();
  out.bytes_to_host = c.bytes_to_host.load();
  out.ops_on_device = c.ops_on_device.load();
  out.ops_on_host = c.ops_on_host.load();
  return out;
}

void MoveToPlace(Variable* var, const Place& place) {
  if (Tensor* t = var->GetIf<Tensor>()) {
    MoveTensor(t, place);
  } else if (SelectedRows* sr = var->GetIf<SelectedRows>()) {
    MoveTensor(&sr->value, place);
  }
}

void ReleaseToPlace(Variable* var, const Place& place) {
  if (Tensor* t = var->GetIf<Tensor>()) {
    t->ResetPlace(place);
  } else if (SelectedRows* sr = var->GetIf<SelectedRows>()) {
    sr->value.ResetPlace(place);
  }
}

absl::StatusOr<const Tensor*> PlacedInput(OpContext& ctx, absl::string_view slot,
                                          const Place& place, int i) {
  TS_ASSIGN_OR_RETURN(const Tensor* t, ctx.Input(slot, i));
  if (t->place() != place) MoveTensor(const_cast<Tensor*>(t), place);
  return t;
}

absl::StatusOr<const Variable*> PlacedInputVar(OpContext& ctx, absl::string_view slot,
                                               const Place& place, int i) {
  TS_ASSIGN_OR_RETURN(const Variable* v, ctx.InputVar(slot, i));
  MoveToPlace(const_cast<Variable*>(v), place);
  return v;
}

absl::StatusOr<Tensor*> PlacedOutput(OpContext& ctx, absl::string_view slot, const Place& place,
                                     int i) {
  TS_ASSIGN_OR_RETURN(Tensor * t, ctx.Output(slot, i));
  t->ResetPlace(place);
  return t;
}

absl::StatusOr<std::unique_ptr<OpRegistry>> MakePlacedRegistry(const OpRegistry& cpu,
                                                               const Place& place,
                                                               const DeviceKernelTable& table) {
  auto placed = std::make_unique<OpRegistry>();
  for (const std::string& type : cpu.Types()) {
    OpInfo info = *cpu.Find(type);
    if (place.is_gpu()) {
      KernelFn host = info.kernel;
      const DeviceKernelFn* device = table.Find(type);
      if (device != nullptr) {
        DeviceKernelFn dev = *device;
        info.kernel = [host, dev, place](OpContext& ctx) -> absl::Status {
          TS_ASSIGN_OR_RETURN(bool ran, dev(ctx, place));
          if (ran) {
            Counters().ops_on_device.fetch_add(1, std::memory_order_relaxed);
            return absl::OkStatus();
          }
          Counters().ops_on_host.fetch_add(1, std::memory_order_relaxed);
          return RunOnHost(host, ctx);
        };
      } else {
        info.kernel = [host](OpContext& ctx) -> absl::Status {
          Counters().ops_on_host.fetch_add(1, std::memory_order_relaxed);
          return RunOnHost(host, ctx);
        };
      }
    }
    TS_RETURN_IF_ERROR(placed->Register(type, std::move(info)));
  }
  return placed;
}

void MoveVarsToHost(Scope* scope, const std::vector<std::string>& names) {
  for (const std::string& name : names) {
    if (Variable* v = scope->FindVar(name)) MoveToPlace(v, Place::Cpu());
  }
}

void ReleaseVarsToHost(Scope* scope, const std::vector<std::string>& names) {
  for (const std::string& name : names) {
    if (Variable* v = scope->FindVar(name)) ReleaseToPlace(v, Place::Cpu());
  }
}

void MoveScopeToHost(Scope* scope) { MoveVarsToHost(scope, scope->LocalVarNames()); }

absl::Status CheckPlaceAvailable(const Place& place) {
  if (place.is_cpu()) return absl::OkStatus();
  DeviceBackend* b = GetDeviceBackend();
  if (b == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "--device=gpu (", place.DebugString(),
        "): this binary was built without CUDA; rebuild with bazel build --config=cuda"));
  }
  return b->Available(place);
}

absl::Status SynchronizePlace(const Place& place) {
  if (place.is_cpu()) return absl::OkStatus();
  DeviceBackend* b = GetDeviceBackend();
  return b == nullptr ? absl::OkStatus() : b->Synchronize(place);
}

std::string PlaceMemoryReport(const Place& place) {
  DeviceBackend* b = place.is_cpu() ? nullptr : GetDeviceBackend();
  return b == nullptr ? std::string() : b->MemoryReport(place);
}

absl::StatusOr<std::vector<Place>> ParseDevices(absl::string_view device,
                                                absl::string_view devices) {
  if (device == "cpu") {
    if (!devices.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--devices=", devices, " needs --device=gpu (--device is cpu)"));
    }
    return std::vector<Place>{Place::Cpu()};
  }
  if (device != "gpu") {
    return absl::InvalidArgumentError(absl::StrCat("--device='", device, "' must be cpu or gpu"));
  }
  std::vector<Place> out;
  if (devices.empty()) return std::vector<Place>{Place::Gpu(0)};
  std::set<int> seen;
  for (absl::string_view part : absl::StrSplit(devices, ',')) {
    int id = -1;
    if (!absl::SimpleAtoi(part, &id) || id < 0 || !seen.insert(id).second) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--devices=", devices, ": entry '", part,
          "' is not a distinct GPU ordinal (give a list such as 0,1)"));
    }
    out.push_back(Place::Gpu(id));
  }
  return out;
}

}  // namespace tessera
