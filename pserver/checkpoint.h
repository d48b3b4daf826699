// A pserver's part of a checkpoint, and loading it into a job with any number of pservers.
//
// Files of pserver i of P, in the checkpoint directory (common/io/checkpoint_io.h):
//   pserver-<i>-of-<P>.dense       every persistable dense variable of its scope (parameter
//                                  blocks, optimizer moments and beta powers, learning rate and
//                                  its schedule's state): a serialized TensorMap
//   pserver-<i>-of-<P>.meta        text: "step S", one "slice <var> <origin> <begin_row>
//                                  <rows> <origin_rows>" per dense variable (begin_row -1: a
//                                  whole copy of <origin>, e.g. a beta power), and one
//                                  "table <name> <shard> <applies>" per distributed table
//   pserver-<i>-of-<P>.<table>.tbl its shard of each distributed table: a SparseTable export
//                                  with optimizer state (pserver/sparse_table.h)
//   pserver-<i>-of-<P>.<table>.life its rows' last-seen stamps and pending admission counts:
//                                  20-byte records int64 id | uint32 seen | uint32 count |
//                                  uint32 pending (1: an id not admitted yet)
//   pserver-<i>-of-<P>.MANIFEST    the files above with sizes and CRC-32C, written last
// Loading (resharding): each dense variable of the new pserver is assembled from the saved
// slices of its origin variable in all P files (rows [begin, begin + rows) of the origin), and
// each table shard keeps the rows of all P saved shards that it owns now (ShardOf with the new
// pserver count; a table placed whole on one pserver keeps every row). Every file is checked
// against its manifest before use.
#ifndef TESSERA_PSERVER_CHECKPOINT_H_
#define TESSERA_PSERVER_CHECKPOINT_H_

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/io/file_system.h"
#include "common/framework/scope.h"
#include "proto/program.pb.h"
#include "pserver/sparse_table.h"
#include "transpiler/distribute_transpiler.h"

namespace tessera {

// Where a pserver's dense variable lies in its whole (origin) variable.
struct DenseSlice {
  std::string origin;
  int64_t begin_row = -1;  // -1: a whole copy of origin (no row range)
  int64_t rows = 0;
  int64_t origin_rows = 0;
};

// The slice of every persistable variable of a pserver program, from the transpiler's parameter
// blocks (all pservers', with their row ranges): a variable of an optimize block with the shape
// of the block's parameter slice covers the same rows of its origin; other ones are copies.
std::map<std::string, DenseSlice> DenseSlices(const ProgramDesc& pserver_program,
                                              const std::vector<VarBlock>& param_blocks);

struct PserverTableRef {
  std::string name;
  int shard = 0;
  SparseTable* table = nullptr;
  int64_t applies = 0;
  // Of how many shards: the pserver count (0, row-wise) or 1 (table-wise: the whole table).
  int num_shards = 0;
  // Which member of `table` this table is (SparseTableOptions::members), or -1: all of it.
  int member = -1;
};

struct PserverShardToSave {
  int index = 0;
  int num_pservers = 1;
  int64_t step = 0;
  std::map<std::string, Tensor> dense;  // snapshots
  std::map<std::string, DenseSlice> slices;
  std::vector<PserverTableRef> tables;
};

// Writes the files of one pserver into the checkpoint directory `dir`, its manifest last.
absl::Status SavePserverShard(io::FileSystem* fs, const std::string& dir,
                              const PserverShardToSave& shard);

struct PserverRestoreTarget {
  int index = 0;
  int num_pservers = 1;
  Scope* scope = nullptr;                    // variables to fill (already created and sized)
  std::map<std::string, DenseSlice> slices;  // of the variables to fill
  // shard = this pserver's index of num_shards = num_pservers (row-wise), or shard 0 of 1 (a
  // whole table, table-wise)
  std::vector<PserverTableRef> tables;
  std::string table_shard_method = "hash";
};

struct PserverRestored {
  int64_t step = 0;
  int saved_pservers = 0;
  std::map<std::string, int64_t> table_applies;  // largest over the saved shards
  int64_t table_rows = 0;
};

// Loads the complete checkpoint `ckpt_dir` (its MANIFEST must exist) into `target`. Errors name
// the file (DataLoss for a corrupt or truncated one) or the variable that cannot be assembled.
absl::StatusOr<PserverRestored> RestorePserverShard(io::FileSystem* fs, const std::string& ckpt_dir,
                                                    const PserverRestoreTarget& target);

}  // namespace tessera

#endif  // TESSERA_PSERVER_CHECKPOINT_H_
