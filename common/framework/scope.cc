#include "common/framework/scope.h"

#include <algorithm>

namespace tessera {

uint64_t Scope::NextId() {
  static std::atomic<uint64_t> next{1};
  return next.fetch_add(1, std::memory_order_relaxed);
}

uint64_t Scope::ChainVersion() const {
  uint64_t v = 0;
  for (const Scope* s = this; s != nullptr; s = s->parent_) {
    v += s->version_.load(std::memory_order_acquire);
  }
  return v;
}

Variable* Scope::Var(absl::string_view name) {
  absl::MutexLock lock(&mu_);
  auto& slot = vars_[name];
  if (slot == nullptr) {
    slot = std::make_unique<Variable>();
    version_.fetch_add(1, std::memory_order_release);
  }
  return slot.get();
}

Variable* Scope::FindLocalVar(absl::string_view name) const {
  absl::MutexLock lock(&mu_);
  auto it = vars_.find(name);
  return it == vars_.end() ? nullptr : it->second.get();
}

Variable* Scope::FindVar(absl::string_view name) const {
  for (const Scope* s = this; s != nullptr; s = s->parent_) {
    if (Variable* v = s->FindLocalVar(name)) return v;
  }
  return nullptr;
}

Scope* Scope::NewScope() {
  absl::MutexLock lock(&mu_);
  kids_.push_back(std::unique_ptr<Scope>(new Scope(this)));
  return kids_.back().get();
}

void Scope::DeleteScope(Scope* kid) {
  absl::MutexLock lock(&mu_);
  kids_.erase(std::remove_if(kids_.begin(), kids_.end(),
                             [kid](const std::unique_ptr<Scope>& s) { return s.get() == kid; }),
              kids_.end());
}

void Scope::EraseVars(const std::vector<std::string>& names) {
  absl::MutexLock lock(&mu_);
  for (const auto& n : names) {
    if (vars_.erase(n) > 0) version_.fetch_add(1, std::memory_order_release);
  }
}

std::vector<std::string> Scope::LocalVarNames() const {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> names;
  names.reserve(vars_.size());
  for (const auto& kv : vars_) names.push_back(kv.first);
  std::sort(names.begin(), names.end());
  return names;
}

}  // namespace tessera
