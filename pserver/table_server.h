// TableServer: the request handler of a serving pserver (--serve_bundle): one shard of the
// distributed tables of an inference bundle (common/io/bundle.h), read-only.
//
// It answers Prefetch (the rows of the ids asked, from SparseTable::LookupReadOnly: held rows'
// values, the table's initial values for ids it does not hold) and heartbeats; every other
// request (SendVariable/SendBatch, GetVariable/GetBatch, barriers other than HEARTBEAT, ABORT,
// Checkpoint, Register) is refused with FAILED_PRECONDITION naming the method. Requests of
// another job are refused as by the training ParameterServer.
//
// Sharding. Shard `shard` of `num_shards` holds the ids that ShardOf(id, num_shards, the
// bundle's table_shard_method) assigns to it (pserver/bundle_tables.h), whatever number of
// pservers trained the bundle; a client sends each id to the serving pserver that owns it. An id
// sent to another shard is answered with the table's initial values, like an id never trained.
//
// Refresh. The tables are an immutable snapshot (which tables, which export) behind a mutex; a
// request keeps the snapshot it started with. Refresh() looks for a newer complete export when
// the served path is an export root (a directory of export-* directories); a path that is one
// export-* directory is served as it is and Refresh() finds nothing newer. A newer export whose
// chain has the served export's base and contains the served export is reached by applying the
// deltas after the served one, in order, to the live tables (each row changes atomically; a
// lookup during the apply may see some rows of the new export and some of the old). Any other
// newer export (a new base, or one whose chain skips the served export) is loaded whole into
// fresh tables, which replace the served ones once loaded (both are in memory meanwhile). A
// failed refresh leaves the served export served; after a delta that failed halfway (some of
// its tables applied) the next refresh loads the newest chain whole instead of applying deltas.
//
// Thread-safe: requests, Refresh(), served() and stats() may run concurrently; Refresh() calls
// are serialized.
#ifndef TESSERA_PSERVER_TABLE_SERVER_H_
#define TESSERA_PSERVER_TABLE_SERVER_H_

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/io/file_system.h"
#include "common/rpc/server.h"
#include "pserver/bundle_tables.h"

namespace tessera {

struct TableServerOptions {
  // The bundle: an export-* directory (served as it is), or an export root (its newest complete
  // export; Refresh() picks up newer ones).
  std::string bundle;
  // This server's shard of the ids, of num_shards serving pservers (0 <= shard < num_shards).
  int shard = 0;
  int num_shards = 1;
  // SparseTableOptions::num_shards of the tables loaded; 0: SparseTable's default.
  int table_shards = 0;
  // Requests must carry this job id (UNAUTHENTICATED otherwise).
  std::string job_id = "tessera";
  // This server's host:port, for messages.
  std::string endpoint;
  // Where the bundle is read; null: the local file system. Must outlive the server.
  io::FileSystem* fs = nullptr;
};

// The export being served.
struct ServedExport {
  std::string dir;        // <root>/export-<step>
  int64_t step = 0;       // its step
  int64_t base = 0;       // the step of its chain's full export
  bool by_delta = false;  // reached from the previous export by applying deltas in place
  int tables = 0;
  int64_t rows = 0;  // rows held by this shard, all tables
};

struct TableServerStats {
  int64_t prefetches = 0;        // Prefetch requests answered (one per table of a batch)
  int64_t ids = 0;               // ids looked up
  int64_t reloads = 0;           // refreshes that changed the served export
  int64_t failed_refreshes = 0;  // refreshes that failed (the served export stayed)
  ServedExport served;
};

class TableServer : public RequestHandler {
 public:
  // Resolves options.bundle and loads this shard of its chain's tables. Errors name the path:
  // NotFound (no complete export), FailedPrecondition (a gap in the chain), DataLoss (a damaged
  // file), InvalidArgument (bad shard options).
  static absl::StatusOr<std::unique_ptr<TableServer>> Create(const TableServerOptions& options);
  ~TableServer() override;
  TableServer(const TableServer&) = delete;
  TableServer& operator=(const TableServer&) = delete;

  // Picks up a newer complete export of the bundle (see the file comment). OK when there is
  // nothing newer, or when the newer export is served now; an error naming the export
  // otherwise, with the previously served export still served.
  absl::Status Refresh();

  ServedExport served() const;
  TableServerStats stats() const;

  // RequestHandler.
  absl::Status Admit(const RequestMeta& meta) override;
  absl::Status AdmitHeartbeat(const RequestMeta& meta) override;
  absl::StatusOr<Variable*> PrepareReceive(const RequestMeta& meta,
                                           const VariableHeader& header) override;
  void HandleSend(const RequestMeta& meta, const VariableHeader& header, Variable* var,
                  DoneCallback done) override;
  void HandleGet(const RequestMeta& meta, const std::string& name, GetDone done) override;
  void HandlePrefetch(const RequestMeta& meta, const std::string& table, std::vector<int64_t> ids,
                      PrefetchDone done) override;
  void HandleBarrier(const RequestMeta& meta, BarrierKind kind, DoneCallback done) override;
  void HandleCheckpoint(const RequestMeta& meta, const std::string& dir,
                        DoneCallback done) override;
  void HandleRegister(const RequestMeta& meta, const JobFields& fields, uint64_t nonce,
                      DoneCallback done) override;

 private:
  // What requests read: the tables of one export. Never changes once published; the tables it
  // points to are owned by `storage`, which a later snapshot reached by deltas shares (the
  // deltas change their rows in place).
  struct Snapshot {
    std::shared_ptr<BundleTables> storage;
    std::map<std::string, SparseTable*> tables;  // from storage, by name
    ServedExport served;
    std::string table_names;  // "a, b", for messages
  };

  explicit TableServer(const TableServerOptions& options);
  std::shared_ptr<const Snapshot> Current() const;
  void Publish(std::shared_ptr<const Snapshot> snapshot);
  // A snapshot over `storage` for export `link` of a chain.
  static std::shared_ptr<const Snapshot> MakeSnapshot(std::shared_ptr<BundleTables> storage,
                                                      const io::BundleLink& link, bool by_delta);
  BundleTablesOptions LoadOptions() const;
  absl::Status RefreshLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(refresh_mu_);
  // "pserver <ep> serves bundle <dir> read-only: <method> refused".
  absl::Status Refused(const std::string& method) const;

  const TableServerOptions options_;
  io::FileSystem* const fs_;
  // options_.bundle holds a MANIFEST itself: one export, nothing newer to look for.
  bool single_export_ = false;

  mutable absl::Mutex mu_;
  std::shared_ptr<const Snapshot> snapshot_ ABSL_GUARDED_BY(mu_);

  // Serializes Refresh().
  absl::Mutex refresh_mu_;
  // A delta failed halfway: the live tables may hold part of it, so the next refresh loads whole.
  bool tables_mixed_ ABSL_GUARDED_BY(refresh_mu_) = false;

  std::atomic<int64_t> prefetches_{0};
  std::atomic<int64_t> ids_{0};
  std::atomic<int64_t> reloads_{0};
  std::atomic<int64_t> failed_refreshes_{0};
};

}  // namespace tessera

#endif  // TESSERA_PSERVER_TABLE_SERVER_H_
