// GradientInbox: where the trainers' gradient blocks land on a pserver, before the Applier
// (pserver/applier.h) uses them.
//
// For each arriving gradient message it checks the gradient against the pserver program (a
// gradient this pserver optimizes; dense or sparse, dtype and shape as declared; a table
// gradient's rows as wide as the table; in sync mode, the server's current step), gives it a
// receive buffer, refuses sparse rows outside a sliced parameter's block, and counts the
// message's bytes until the gradient is complete (a large tensor comes in several chunks).
// Receive buffers: sync mode keeps one per trainer in the server's scope
// (TrainerGradName(grad, trainer), which the optimize blocks sum); async mode one per trainer
// scope (each push is optimized alone, in its trainer's scope). In sync mode it remembers the
// step at which each trainer's table gradient arrived, so a step applies only the table
// gradients sent for it.
//
// Thread-safe: RPC threads call Prepare, CheckRows and Arrived concurrently; the Applier reads
// TableGradients between a step's send barrier and its release (no trainer sends meanwhile);
// CompleteFromAll (which gradients may be applied early) may be called under the
// ParameterServer's lock, which is taken before the inbox's, never after.
#ifndef TESSERA_PSERVER_GRADIENT_INBOX_H_
#define TESSERA_PSERVER_GRADIENT_INBOX_H_

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/framework/scope.h"
#include "common/rpc/server.h"
#include "proto/program.pb.h"

namespace tessera {

class GradientInbox {
 public:
  // `program`: the pserver program, whose block 0 declares the gradients; `dense_grads` the
  // gradients of its optimize blocks; `table_grads` each distributed table's gradient name ->
  // (table name, row width). `program` and `scope` must outlive the inbox. Creates one child
  // scope of `scope` per trainer (async receive buffers).
  GradientInbox(const ProgramDesc* program, Scope* scope, int num_trainers, bool sync,
                std::string endpoint, std::vector<std::string> dense_grads,
                std::map<std::string, std::pair<std::string, int64_t>> table_grads);

  // The receive buffer for a message of gradient `h.name` from `meta.trainer_id`, resized to
  // the header's dtype and shape. InvalidArgument naming the gradient for an unknown one or a
  // kind, dtype or shape the program does not declare; FailedPrecondition naming both steps
  // when a sync message is for a step other than `server_step`.
  absl::StatusOr<Variable*> Prepare(const RequestMeta& meta, const VariableHeader& h,
                                    int64_t server_step);
  // A sparse gradient of a sliced (not distributed-table) parameter must name rows of its
  // block: InvalidArgument naming the gradient, the row and the pserver otherwise, with the
  // received rows emptied so that nothing applies them.
  absl::Status CheckRows(const VariableHeader& h, Variable* var) const;
  // Counts one message of `h` from meta.trainer_id; true when the trainer's gradient is
  // complete (and the count restarts for its next one). Sync: notes the step it completed for.
  bool Arrived(const RequestMeta& meta, const VariableHeader& h);
  // Sync: whether each trainer of `trainers` has its gradient `grad` complete for `step` (its
  // last message of that step arrived).
  bool CompleteFromAll(const std::string& grad, int64_t step, const std::set<int>& trainers) const;

  bool IsTableGradient(const std::string& grad) const {
    auto it = entries_.find(grad);
    return it != entries_.end() && it->second.table;
  }
  // Sync: the trainers' gradients of table gradient `grad` that arrived for `step`, in trainer
  // order (a trainer whose batch had no id of the table sent none).
  std::vector<const SelectedRows*> TableGradients(const std::string& grad, int64_t step) const;
  // Async: trainer `k`'s receive scope.
  Scope* trainer_scope(int k) const { return trainer_scopes_[static_cast<size_t>(k)]; }

 private:
  // What the inbox knows of one gradient, found by one hash lookup per message; the per-trainer
  // state is guarded by mu_ (the rest is fixed at construction).
  struct Entry {
    bool table = false;
    std::string table_name;             // table gradients
    int64_t dim = 0;                    // table gradients: the row width
    const VarDesc* declared = nullptr;  // its declaration in block 0, if any
    // Per trainer: the receive buffer (resolved on first use), the bytes of an incomplete
    // gradient, (sync, tables) the step at which it last arrived, and (sync) the step for which
    // it last completed (-1: never).
    std::vector<Variable*> buffer;
    std::vector<int64_t> bytes;
    std::vector<int64_t> step;
    std::vector<int64_t> completed;
  };
  absl::Status CheckDeclared(const Entry& e, const VariableHeader& h) const;

  const ProgramDesc* program_;
  Scope* scope_;
  const int num_trainers_;
  const bool sync_;
  const std::string endpoint_;
  std::vector<Scope*> trainer_scopes_;

  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, Entry> entries_;  // the map is fixed; see Entry for its state
};

}  // namespace tessera

#endif  // TESSERA_PSERVER_GRADIENT_INBOX_H_
