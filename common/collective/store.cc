#include "common/collective/store.h"

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"

namespace tessera {
namespace collective {

absl::Status Store::Wait(const std::vector<std::string>& keys, absl::Duration timeout) {
  const absl::Time deadline = absl::Now() + timeout;
  for (const std::string& key : keys) {
    auto value = Get(key, std::max(absl::ZeroDuration(), deadline - absl::Now()));
    if (!value.ok()) return value.status();
  }
  return absl::OkStatus();
}

absl::Status HashStore::Set(const std::string& key, const std::string& value) {
  absl::MutexLock lock(&mu_);
  values_[key] = value;
  return absl::OkStatus();
}

absl::StatusOr<std::string> HashStore::Get(const std::string& key, absl::Duration timeout) {
  absl::MutexLock lock(&mu_);
  auto present = [this, &key]()
                     ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return values_.count(key) > 0; };
  if (!mu_.AwaitWithTimeout(absl::Condition(&present), timeout)) {
    return absl::DeadlineExceededError(absl::StrCat("key '", key, "' not set in ", DebugName(),
                                                    " within ", absl::FormatDuration(timeout)));
  }
  return values_[key];
}

absl::Status PrefixStore::Set(const std::string& key, const std::string& value) {
  return base_->Set(Key(key), value);
}

absl::StatusOr<std::string> PrefixStore::Get(const std::string& key, absl::Duration timeout) {
  return base_->Get(Key(key), timeout);
}

absl::Status PrefixStore::Wait(const std::vector<std::string>& keys, absl::Duration timeout) {
  std::vector<std::string> full;
  full.reserve(keys.size());
  for (const std::string& k : keys) full.push_back(Key(k));
  return base_->Wait(full, timeout);
}

std::string PrefixStore::DebugName() const {
  return absl::StrCat(base_->DebugName(), " (prefix '", prefix_, "')");
}

}  // namespace collective
}  // namespace tessera
