// Executor: runs the ops of one block of a ProgramDesc, in order, on a Scope.
//
// Prepare() resolves every op's kernel once (an unknown op type fails there, naming the op);
// Run() executes a prepared block. An error leads with its cause, then the failing op's index,
// type and at most 3 inputs, e.g.
//   X [4, 3] and Y [5, 2] disagree in the inner dimension (op #3 mul(X=x,Y=w))
// and carries the op in full (every input and output) as its ErrorDetail (common/base/status.h); the
// innermost failed op wins (a control-flow op running a sub-block keeps its inner op's).
// The Executor itself is stateless and thread-safe; concurrent Runs must use different scopes
// or touch disjoint variables.
#ifndef TESSERA_COMMON_FRAMEWORK_EXECUTOR_H_
#define TESSERA_COMMON_FRAMEWORK_EXECUTOR_H_

#include <cstdint>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/framework/op_registry.h"
#include "common/framework/scope.h"
#include "proto/program.pb.h"

namespace tessera {

// The arguments of a block's ops resolved to variables (OpArgs), per scope: a step then finds
// each op's variables without hashing a name or locking a scope. An entry stays valid while
// its scope's ChainVersion() does not change (no variable created or erased in the scope or an
// ancestor); a stale one is resolved again. Keeps the 64 most recently used scopes. Thread-safe.
class ArgCache {
 public:
  // The block's args in `scope`, and whether they were resolved before this call (with no
  // variable created or erased since).
  std::pair<std::shared_ptr<const std::vector<OpArgs>>, bool> For(const BlockDesc& block,
                                                                  const Scope& scope);

 private:
  struct Entry {
    uint64_t scope_id = 0;
    uint64_t version = 0;
    std::shared_ptr<const std::vector<OpArgs>> args;
  };
  static constexpr size_t kMaxScopes = 64;  // places, trainer scopes, staging: a few each
  absl::Mutex mu_;
  std::vector<Entry> entries_ ABSL_GUARDED_BY(mu_);  // the most recently used last
};

// A block whose kernels have been looked up. Refers to the program, which must outlive it.
struct PreparedBlock {
  const ProgramDesc* program = nullptr;
  int block_id = 0;
  std::vector<const OpInfo*> infos;  // parallel to the block's ops
  // Shared by copies of this PreparedBlock (they run the same ops).
  std::shared_ptr<ArgCache> args = std::make_shared<ArgCache>();
};

class Executor {
 public:
  // `registry` must outlive the executor.
  explicit Executor(const OpRegistry* registry) : registry_(registry) {}

  absl::StatusOr<PreparedBlock> Prepare(const ProgramDesc& program, int block_id) const;
  // Creates the block's variables in `scope` (if absent) and runs its ops. Stops at the first
  // failing op and returns its error.
  absl::Status Run(const PreparedBlock& block, Scope* scope) const;
  // Creates the block's variables in `scope` (as Run does first), unless nothing changed in
  // the scope since the block last ran there.
  void CreateVariables(const PreparedBlock& block, Scope* scope) const;
  // Runs ops [begin, end) of a prepared block, without creating the block's variables first
  // (the ops create their outputs). Used to run a block in parts, e.g. a trainer's leading
  // prefetch ops for the next batch in another scope (trainer/local_trainer.h).
  absl::Status RunOps(const PreparedBlock& block, int begin, int end, Scope* scope) const;
  // Prepare + Run.
  absl::Status Run(const ProgramDesc& program, int block_id, Scope* scope) const;
  // Runs a single op (used by ops with sub-blocks and by tests).
  absl::Status RunOp(const OpDesc& op, Scope* scope) const;

  const OpRegistry& registry() const { return *registry_; }

 private:
  const OpRegistry* registry_;
};

// Creates every variable the block declares in `scope` (empty, typed on first write).
void CreateBlockVariables(const BlockDesc& block, Scope* scope);

}  // namespace tessera

#endif  // TESSERA_COMMON_FRAMEWORK_EXECUTOR_H_
