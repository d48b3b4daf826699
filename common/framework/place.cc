#include "common/framework/place.h"

#include <atomic>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace tessera {

std::string Place::DebugString() const {
  return is_cpu() ? std::string("cpu") : absl::StrCat("gpu:", device);
}

absl::StatusOr<Place> ParsePlace(absl::string_view text) {
  if (text == "cpu") return Place::Cpu();
  if (text == "gpu") return Place::Gpu(0);
  int id = 0;
  absl::string_view rest = text;
  if (absl::ConsumePrefix(&rest, "gpu:") && absl::SimpleAtoi(rest, &id) && id >= 0) {
    return Place::Gpu(id);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("place '", text, "' must be cpu, gpu or gpu:N (N >= 0)"));
}

namespace {
std::atomic<DeviceBackend*> g_backend{nullptr};
}  // namespace

DeviceBackend* GetDeviceBackend() { return g_backend.load(std::memory_order_acquire); }
void SetDeviceBackend(DeviceBackend* backend) {
  g_backend.store(backend, std::memory_order_release);
}

}  // namespace tessera
