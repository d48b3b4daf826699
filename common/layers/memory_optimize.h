// MemoryOptimize: a program pass that lets temporaries with disjoint lifetimes share one
// variable (and so one buffer), like Fluid's memory_optimize transpiler.
//
// Liveness is computed over block 0's ops in order. A *candidate* is a non-persistable
// DENSE_TENSOR variable declared in block 0 that some op of block 0 writes before any op reads
// it, is not in `skip_vars`, (with `skip_grads`) is not a gradient, and is not mentioned by an op
// with a sub-block or by any op of another block. A candidate is live from its first write to
// its last read or write (an op that reads and writes a variable keeps it live across that op).
// When a candidate A is first written after every variable sharing the buffer of an earlier
// candidate B has been used for the last time, and A and B have the same dtype and the same
// VarDesc shape (-1 batch dims compare equal), A is renamed to B in every op from A's first
// writer on and A's VarDesc is removed; the executor then reuses B's buffer (Tensor::Resize keeps
// its capacity). A is never merged into a variable read or written by A's first writer.
//
// After the pass, every variable keeps its value while it is live; the values of candidates
// after their last use are not kept, so fetch targets belong in `skip_vars`. The pass is pure
// (same program and options give the same result) and idempotent. Thread-compatible.
#ifndef TESSERA_COMMON_LAYERS_MEMORY_OPTIMIZE_H_
#define TESSERA_COMMON_LAYERS_MEMORY_OPTIMIZE_H_

#include <cstdint>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "proto/program.pb.h"

namespace tessera {

struct MemoryOptimizeOptions {
  // Never rename or reuse a gradient variable (name ends with "@GRAD" or contains "@GRAD@"), so
  // gradients stay intact for sending to pservers.
  bool skip_grads = false;
  // Variables never renamed or reused, e.g. fetch targets (the loss) and feed variables.
  std::set<std::string> skip_vars;
};

struct MemoryOptimizeStats {
  // Candidates considered (see the file comment).
  int num_candidates = 0;
  // Variables renamed away (each now shares an earlier variable's buffer).
  int vars_reused = 0;
  // Bytes no longer allocated for one example: for each renamed variable, its element count
  // with -1 (batch) dims counted as 1, times its dtype's size.
  int64_t bytes_saved_per_example = 0;
  // (renamed variable, variable whose buffer it now uses), in program order.
  std::vector<std::pair<std::string, std::string>> renames;
};

// Runs the pass on block 0 of `program` in place. Fails (InvalidArgument, program unchanged) if
// `program` is null or has no block 0, or an op refers to a sub-block that does not exist.
absl::StatusOr<MemoryOptimizeStats> MemoryOptimize(ProgramDesc* program,
                                                   const MemoryOptimizeOptions& options);

// One line for logs: "memory_optimize: reused 3 of 7 candidate variables, saving 96 bytes per
// example (c->a, d->b, e->a)". At most the first 8 renames are listed.
std::string MemoryOptimizeReport(const MemoryOptimizeStats& stats);

}  // namespace tessera

#endif  // TESSERA_COMMON_LAYERS_MEMORY_OPTIMIZE_H_
