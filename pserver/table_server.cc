#include "pserver/table_server.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/status.h"
#include "common/framework/tensor.h"
#include "common/io/bundle.h"
#include "common/io/checkpoint_io.h"

namespace tessera {

TableServer::TableServer(const TableServerOptions& options)
    : options_(options), fs_(options.fs != nullptr ? options.fs : io::PosixFileSystem::Default()) {}

TableServer::~TableServer() = default;

absl::StatusOr<std::unique_ptr<TableServer>> TableServer::Create(
    const TableServerOptions& options) {
  if (options.num_shards < 1 || options.shard < 0 || options.shard >= options.num_shards) {
    return absl::InvalidArgumentError(
        absl::StrCat("serving shard ", options.shard, " of ", options.num_shards, " is not one"));
  }
  if (options.bundle.empty()) return absl::InvalidArgumentError("no bundle to serve");
  std::unique_ptr<TableServer> server(new TableServer(options));
  server->single_export_ = server->fs_->Exists(io::JoinPath(options.bundle, io::kManifestName));
  TS_ASSIGN_OR_RETURN(std::vector<io::BundleLink> chain,
                      io::ResolveBundle(server->fs_, options.bundle));
  TS_ASSIGN_OR_RETURN(BundleTables tables,
                      LoadBundleTables(server->fs_, chain, server->LoadOptions()));
  server->Publish(MakeSnapshot(std::make_shared<BundleTables>(std::move(tables)), chain.back(),
                               /*by_delta=*/false));
  return server;
}

BundleTablesOptions TableServer::LoadOptions() const {
  BundleTablesOptions o;
  o.shard = options_.shard;
  o.num_shards = options_.num_shards;
  o.table_shards = options_.table_shards;
  return o;
}

std::shared_ptr<const TableServer::Snapshot> TableServer::MakeSnapshot(
    std::shared_ptr<BundleTables> storage, const io::BundleLink& link, bool by_delta) {
  auto s = std::make_shared<Snapshot>();
  std::vector<std::string> names;
  for (const auto& [name, table] : *storage) {
    if (table == nullptr) continue;  // left by a failed load
    s->tables[name] = table.get();
    s->served.rows += table->Size();
    names.push_back(name);
  }
  s->storage = std::move(storage);
  s->served.dir = link.dir;
  s->served.step = link.meta.step;
  s->served.base = link.meta.base;
  s->served.by_delta = by_delta;
  s->served.tables = static_cast<int>(names.size());
  s->table_names = names.empty() ? "none" : absl::StrJoin(names, ", ");
  return s;
}

std::shared_ptr<const TableServer::Snapshot> TableServer::Current() const {
  absl::MutexLock lock(&mu_);
  return snapshot_;
}

void TableServer::Publish(std::shared_ptr<const Snapshot> snapshot) {
  std::shared_ptr<const Snapshot> old;
  {
    absl::MutexLock lock(&mu_);
    old = std::move(snapshot_);
    snapshot_ = std::move(snapshot);
  }
  // `old` (and, if no request holds it, its tables) goes here, outside the lock.
}

ServedExport TableServer::served() const { return Current()->served; }

TableServerStats TableServer::stats() const {
  TableServerStats s;
  s.prefetches = prefetches_.load(std::memory_order_relaxed);
  s.ids = ids_.load(std::memory_order_relaxed);
  s.reloads = reloads_.load(std::memory_order_relaxed);
  s.failed_refreshes = failed_refreshes_.load(std::memory_order_relaxed);
  s.served = served();
  return s;
}

absl::Status TableServer::Refresh() {
  absl::MutexLock lock(&refresh_mu_);
  absl::Status s = RefreshLocked();
  if (!s.ok()) failed_refreshes_.fetch_add(1, std::memory_order_relaxed);
  return s;
}

absl::Status TableServer::RefreshLocked() {
  if (single_export_) return absl::OkStatus();  // one export-* directory: nothing newer
  std::shared_ptr<const Snapshot> current = Current();
  const ServedExport& served = current->served;
  TS_ASSIGN_OR_RETURN(std::vector<io::BundleLink> chain, io::ResolveBundle(fs_, options_.bundle));
  const io::BundleLink& newest = chain.back();
  if (newest.meta.step < served.step) return absl::OkStatus();
  if (newest.meta.step == served.step && !tables_mixed_) return absl::OkStatus();

  // The deltas after the served export, if the newest chain continues the served one.
  size_t next = chain.size();
  if (!tables_mixed_ && chain.front().meta.step == served.base) {
    for (size_t i = 0; i < chain.size(); ++i) {
      if (chain[i].meta.step == served.step) next = i + 1;
    }
  }
  if (next < chain.size()) {
    // In place: the tables are shared with `current`, which requests may still read (each row
    // changes atomically). Only this thread touches `storage` itself (the map).
    std::shared_ptr<BundleTables> storage = current->storage;
    for (size_t i = next; i < chain.size(); ++i) {
      absl::Status applied = ApplyBundleDelta(fs_, chain[i], LoadOptions(), storage.get());
      if (!applied.ok()) {
        tables_mixed_ = true;
        return absl::Status(applied.code(), absl::StrCat("applying ", chain[i].dir, " to ",
                                                         served.dir, ": ", applied.message()));
      }
    }
    Publish(MakeSnapshot(std::move(storage), newest, /*by_delta=*/true));
  } else {
    TS_ASSIGN_OR_RETURN(BundleTables tables, LoadBundleTables(fs_, chain, LoadOptions()));
    Publish(MakeSnapshot(std::make_shared<BundleTables>(std::move(tables)), newest,
                         /*by_delta=*/false));
    tables_mixed_ = false;
  }
  reloads_.fetch_add(1, std::memory_order_relaxed);
  return absl::OkStatus();
}

absl::Status TableServer::Refused(const std::string& method) const {
  return absl::FailedPreconditionError(absl::StrCat("pserver ", options_.endpoint,
                                                    " serves bundle ", Current()->served.dir,
                                                    " read-only: ", method, " refused"));
}

absl::Status TableServer::Admit(const RequestMeta& meta) {
  if (meta.job_id != options_.job_id) {
    return absl::UnauthenticatedError(absl::StrCat(
        "request of job '", meta.job_id, "' refused by pserver of job '", options_.job_id, "'"));
  }
  return absl::OkStatus();
}

absl::Status TableServer::AdmitHeartbeat(const RequestMeta& meta) { return Admit(meta); }

absl::StatusOr<Variable*> TableServer::PrepareReceive(const RequestMeta& meta,
                                                      const VariableHeader& header) {
  return Refused("SendVariable");
}

void TableServer::HandleSend(const RequestMeta& meta, const VariableHeader& header, Variable* var,
                             DoneCallback done) {
  done(Refused("SendVariable"));
}

void TableServer::HandleGet(const RequestMeta& meta, const std::string& name, GetDone done) {
  done(Refused("GetVariable"));
}

void TableServer::HandlePrefetch(const RequestMeta& meta, const std::string& table,
                                 std::vector<int64_t> ids, PrefetchDone done) {
  std::shared_ptr<const Snapshot> snapshot = Current();
  auto it = snapshot->tables.find(table);
  if (it == snapshot->tables.end()) {
    done(absl::InvalidArgumentError(
        absl::StrCat("pserver ", options_.endpoint, " serves no table '", table, "' (bundle ",
                     snapshot->served.dir, " has: ", snapshot->table_names, ")")));
    return;
  }
  const SparseTable& t = *it->second;
  Tensor rows(FLOAT32, {static_cast<int64_t>(ids.size()), t.options().dim});
  absl::Status s = t.LookupReadOnly(ids, rows.data<float>());
  if (!s.ok()) {
    done(absl::Status(s.code(), absl::StrCat("pserver ", options_.endpoint, " table ", table, ": ",
                                             s.message())));
    return;
  }
  prefetches_.fetch_add(1, std::memory_order_relaxed);
  ids_.fetch_add(static_cast<int64_t>(ids.size()), std::memory_order_relaxed);
  done(std::move(rows));
}

void TableServer::HandleBarrier(const RequestMeta& meta, BarrierKind kind, DoneCallback done) {
  if (kind == HEARTBEAT) {
    done(absl::OkStatus());
    return;
  }
  done(Refused(absl::StrCat("Barrier ", BarrierKind_Name(kind))));
}

void TableServer::HandleCheckpoint(const RequestMeta& meta, const std::string& dir,
                                   DoneCallback done) {
  done(Refused("Checkpoint"));
}

void TableServer::HandleRegister(const RequestMeta& meta, const JobFields& fields, uint64_t nonce,
                                 DoneCallback done) {
  done(Refused("Register"));
}

}  // namespace tessera
