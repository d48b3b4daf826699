// Scope: name -> Variable, with an optional parent that lookups fall back to.
//
// Creating and finding variables is thread-safe; the variables themselves are not (callers
// synchronize access to a variable's contents). Variables live as long as their scope;
// pointers returned stay valid until the variable is erased or the scope destroyed.
#ifndef TESSERA_COMMON_FRAMEWORK_SCOPE_H_
#define TESSERA_COMMON_FRAMEWORK_SCOPE_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "common/framework/variable.h"

namespace tessera {

class Scope {
 public:
  Scope() = default;
  Scope(const Scope&) = delete;
  Scope& operator=(const Scope&) = delete;

  // The variable named `name` in this scope, created (empty) if absent here.
  Variable* Var(absl::string_view name);
  // Looks in this scope, then in the parents; nullptr if none has it.
  Variable* FindVar(absl::string_view name) const;
  // Looks in this scope only.
  Variable* FindLocalVar(absl::string_view name) const;
  // A child scope owned by this one; lookups in it fall back to this scope.
  Scope* NewScope();
  // Removes the child `kid` (and its variables). No-op if it is not a child.
  void DeleteScope(Scope* kid);
  // Removes the named local variables (missing names are ignored).
  void EraseVars(const std::vector<std::string>& names);
  // Sorted names of this scope's own variables.
  std::vector<std::string> LocalVarNames() const;
  const Scope* parent() const { return parent_; }

  // Unique among the scopes of the process (an address may be reused, an id is not).
  uint64_t id() const { return id_; }
  // Grows whenever a variable is created in or erased from this scope or an ancestor: what a
  // lookup finds stays the same while it does not change (the Executor caches lookups on it).
  uint64_t ChainVersion() const;

 private:
  explicit Scope(const Scope* parent) : parent_(parent) {}
  static uint64_t NextId();

  const Scope* parent_ = nullptr;
  const uint64_t id_ = NextId();
  std::atomic<uint64_t> version_{0};
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, std::unique_ptr<Variable>> vars_ ABSL_GUARDED_BY(mu_);
  std::vector<std::unique_ptr<Scope>> kids_ ABSL_GUARDED_BY(mu_);
};

}  // namespace tessera

#endif  // TESSERA_COMMON_FRAMEWORK_SCOPE_H_
