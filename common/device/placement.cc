#include "common/device/placement.h"

#include <algorithm>
#include <atomic>
#include <set>
#include <utility>

#include "absl/strings/cord.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/base/status.h"

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

// `s` (its code and payloads) with what placement was doing when it failed: the cause first,
// which names the device, then the variable ("..., moving 'x' float32[3, 4] to gpu:0").
absl::Status WhileDoing(const absl::Status& s, absl::string_view doing) {
  absl::Status out(s.code(), absl::StrCat(s.message(), ", ", doing));
  s.ForEachPayload(
      [&out](absl::string_view url, const absl::Cord& payload) { out.SetPayload(url, payload); });
  return out;
}

std::string Named(absl::string_view name) {
  return name.empty() ? std::string() : absl::StrCat("'", name, "' ");
}

// Moves `t` (the tensor of variable `name`; "" when unknown) to `place` with its contents. On
// an error `t` is left as it was.
absl::Status MoveTensor(Tensor* t, const Place& place, absl::string_view name) {
  if (t->place() == place) return absl::OkStatus();
  if (!t->initialized()) return t->TryResetPlace(place);  // nothing to allocate or copy
  Tensor moved;
  absl::Status s = moved.TryResetPlace(place);
  if (s.ok()) s = moved.TryCopyFrom(*t);
  if (!s.ok()) {
    return WhileDoing(
        s, absl::StrCat("moving ", Named(name), t->DebugString(), " to ", place.DebugString()));
  }
  AtomicCounters& c = Counters();
  if (place.is_cpu()) {
    c.copies_to_host.fetch_add(1, std::memory_order_relaxed);
    c.bytes_to_host.fetch_add(static_cast<int64_t>(t->nbytes()), std::memory_order_relaxed);
  } else {
    c.copies_to_device.fetch_add(1, std::memory_order_relaxed);
    c.bytes_to_device.fetch_add(static_cast<int64_t>(t->nbytes()), std::memory_order_relaxed);
  }
  *t = std::move(moved);
  return absl::OkStatus();
}

// The tensor placement moves for `var`: its dense tensor or SelectedRows value (else null).
Tensor* PlacedTensorOf(Variable* var) {
  if (Tensor* t = var->GetIf<Tensor>()) return t;
  if (SelectedRows* sr = var->GetIf<SelectedRows>()) return &sr->value;
  return nullptr;
}

// MoveToPlace for a variable named `name` ("" when unknown).
absl::Status MoveVar(Variable* var, const Place& place, absl::string_view name) {
  Tensor* t = PlacedTensorOf(var);
  return t == nullptr ? absl::OkStatus() : MoveTensor(t, place, name);
}

// ReleaseToPlace for the host, which cannot fail (ResetPlace to the host allocates host memory
// only; no device is involved).
void ReleaseToHost(Variable* var) {
  if (Tensor* t = PlacedTensorOf(var)) t->ResetPlace(Place::Cpu());
}

Variable* MutableVar(const OpContext& ctx, const std::string& name) {
  if (name.empty() || name == kEmptyVarName) return nullptr;
  return ctx.scope()->FindVar(name);
}

// The CPU kernel, with what it reads on the host and what it writes released there. A device
// failure bringing an input to the host fails the op before the kernel runs.
absl::Status RunOnHost(const KernelFn& kernel, OpContext& ctx) {
  const std::vector<std::string> in_args = AllInputArgs(ctx.op());
  const std::set<std::string> ins(in_args.begin(), in_args.end());
  for (const std::string& name : ins) {
    if (Variable* v = MutableVar(ctx, name)) TS_RETURN_IF_ERROR(MoveVar(v, Place::Cpu(), name));
  }
  for (const std::string& name : AllOutputArgs(ctx.op())) {
    if (ins.count(name) > 0) continue;
    if (Variable* v = MutableVar(ctx, name)) ReleaseToHost(v);
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

std::string PlacementPerStep(const PlacementCounters& before, const PlacementCounters& after,
                             int64_t steps) {
  const double n = static_cast<double>(std::max<int64_t>(steps, 1));
  auto per = [n](int64_t a, int64_t b) { return absl::StrFormat("%.1f", (b - a) / n); };
  auto kib = [n](int64_t a, int64_t b) { return absl::StrFormat("%.1f", (b - a) / n / 1024); };
  return absl::StrCat("per step: ", per(before.ops_on_device, after.ops_on_device),
                      " ops on device kernels, ", per(before.ops_on_host, after.ops_on_host),
                      " on CPU kernels; ", per(before.copies_to_device, after.copies_to_device),
                      " copies to the device (", kib(before.bytes_to_device, after.bytes_to_device),
                      " KiB), ", per(before.copies_to_host, after.copies_to_host), " to the host (",
                      kib(before.bytes_to_host, after.bytes_to_host), " KiB)");
}

absl::Status MoveToPlace(Variable* var, const Place& place) { return MoveVar(var, place, ""); }

absl::Status ReleaseToPlace(Variable* var, const Place& place) {
  Tensor* t = PlacedTensorOf(var);
  return t == nullptr ? absl::OkStatus() : t->TryResetPlace(place);
}

absl::StatusOr<const Tensor*> PlacedInput(OpContext& ctx, absl::string_view slot,
                                          const Place& place, int i) {
  TS_ASSIGN_OR_RETURN(const Tensor* t, ctx.Input(slot, i));
  if (t->place() != place) {
    TS_RETURN_IF_ERROR(MoveTensor(const_cast<Tensor*>(t), place, ctx.InputName(slot, i)));
  }
  return t;
}

absl::StatusOr<const Variable*> PlacedInputVar(OpContext& ctx, absl::string_view slot,
                                               const Place& place, int i) {
  TS_ASSIGN_OR_RETURN(const Variable* v, ctx.InputVar(slot, i));
  Tensor* t = PlacedTensorOf(const_cast<Variable*>(v));
  if (t != nullptr && t->place() != place) {
    TS_RETURN_IF_ERROR(MoveTensor(t, place, ctx.InputName(slot, i)));
  }
  return v;
}

absl::StatusOr<Tensor*> PlacedOutput(OpContext& ctx, absl::string_view slot, const Place& place,
                                     DataType dtype, Shape shape, int i) {
  TS_ASSIGN_OR_RETURN(Tensor * t, ctx.Output(slot, i));
  if (t->place() != place) {
    // The contents are not moved: start from an empty tensor there rather than allocating the
    // old shape on `place` first (TryResetPlace would).
    Tensor fresh;
    TS_RETURN_IF_ERROR(fresh.TryResetPlace(place));  // uninitialized: allocates nothing
    fresh.set_lod(t->lod());
    *t = std::move(fresh);
  }
  absl::Status s = t->TryResize(dtype, shape);  // `shape` is kept for the message
  if (!s.ok()) {
    return WhileDoing(
        s, absl::StrCat("for output ", Named(ctx.OutputName(slot, i)), DataTypeName(dtype),
                        ShapeString(shape), " on ", place.DebugString()));
  }
  return t;
}

absl::StatusOr<Tensor*> PlacedOutput(OpContext& ctx, absl::string_view slot, const Place& place,
                                     int i) {
  TS_ASSIGN_OR_RETURN(Tensor * t, ctx.Output(slot, i));
  absl::Status s = t->TryResetPlace(place);
  if (!s.ok()) {
    return WhileDoing(s, absl::StrCat("for output ", Named(ctx.OutputName(slot, i)),
                                      t->DebugString(), " on ", place.DebugString()));
  }
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

absl::Status MoveVarsToHost(Scope* scope, const std::vector<std::string>& names) {
  for (const std::string& name : names) {
    if (Variable* v = scope->FindVar(name)) TS_RETURN_IF_ERROR(MoveVar(v, Place::Cpu(), name));
  }
  return absl::OkStatus();
}

void ReleaseVarsToHost(Scope* scope, const std::vector<std::string>& names) {
  for (const std::string& name : names) {
    if (Variable* v = scope->FindVar(name)) ReleaseToHost(v);
  }
}

absl::Status MoveScopeToHost(Scope* scope) { return MoveVarsToHost(scope, scope->LocalVarNames()); }

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
