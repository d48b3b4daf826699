// The distributed tables of an inference bundle (common/io/bundle.h): a pserver's part of a
// serving export, and loading a chain of exports into tables for prediction or serving.
//
// A pserver's manifest (pserver-<i>-of-<P>.MANIFEST) describes each table it wrote in meta
// keys, so that a loader can create it with the same initial values for ids it never saw:
//   table.<name>.dim, table.<name>.init (uniform_random | gaussian_random | fill_constant),
//   table.<name>.min, .max, .mean, .std, .value (as %.9g), table.<name>.seed
// and meta "index", "num_pservers", "kind" (full | delta).
#ifndef TESSERA_PSERVER_BUNDLE_TABLES_H_
#define TESSERA_PSERVER_BUNDLE_TABLES_H_

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/io/bundle.h"
#include "common/io/checkpoint_io.h"
#include "common/io/file_system.h"
#include "pserver/sparse_table.h"

namespace tessera {

struct BundleTableRef {
  std::string name;
  SparseTable* table = nullptr;
  int member = -1;  // which member of `table` (SparseTableOptions::members), or -1: all of it
};

// Writes pserver `index` of `num_pservers`'s part of a serving export into `dir` (which exists):
// each table as pserver-<index>-of-<num>.<name>.tbl, values only (delta: the rows changed and the
// ids evicted since this pserver's previous serving export; full: every row), then its
// manifest, last. A failed write leaves no manifest; the caller then makes the next export a
// full one (the tables' delta cut may have advanced for some of them).
absl::Status WritePserverExport(io::FileSystem* fs, const std::string& dir, int index,
                                int num_pservers, bool delta,
                                const std::vector<BundleTableRef>& tables);

// The meta keys above, and back (InvalidArgument naming `path` and the key).
void PutTableMeta(const std::string& name, const SparseTableOptions& options,
                  io::Manifest* manifest);
absl::StatusOr<SparseTableOptions> TableOptionsFromMeta(const io::Manifest& manifest,
                                                        const std::string& name,
                                                        const std::string& path);
// The tables a pserver manifest describes, sorted.
std::vector<std::string> TablesInMeta(const io::Manifest& manifest);

struct BundleTablesOptions {
  // Keep only the ids that shard `shard` of `num_shards` owns (ShardOf with the bundle's
  // table_shard_method), e.g. one of several serving pservers; 1: every id.
  int shard = 0;
  int num_shards = 1;
  int table_shards = 0;  // SparseTableOptions::num_shards of the tables made; 0: its default
};

using BundleTables = std::map<std::string, std::unique_ptr<SparseTable>>;

// Loads every table of `chain` (io::ResolveBundle's, base first): the base's rows, then each
// delta's in order (rows overwrite, tombstones remove). Every file is checked against its
// manifest; DataLoss names a damaged file.
absl::StatusOr<BundleTables> LoadBundleTables(io::FileSystem* fs,
                                              const std::vector<io::BundleLink>& chain,
                                              const BundleTablesOptions& options);
// Applies one delta `link` to tables loaded from the export it applies on (a table the delta
// names that `tables` lacks is created).
absl::Status ApplyBundleDelta(io::FileSystem* fs, const io::BundleLink& link,
                              const BundleTablesOptions& options, BundleTables* tables);

}  // namespace tessera

#endif  // TESSERA_PSERVER_BUNDLE_TABLES_H_
