// TableServer over bundles written here by hand, as two training pservers and trainer 0 would
// (io::BeginExport, WritePserverExport, io::CommitExport): every id answered by the serving
// shard that owns it (1, 2 or 3 serving shards), every other request refused naming its method,
// Refresh picking up a delta in place and a new base whole, and a damaged export leaving the
// served one served. Then the same over gRPC, and ServingPserverProcess watching a bundle.
#include "pserver/table_server.h"

#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/config/cluster_config.h"
#include "common/io/bundle.h"
#include "common/io/checkpoint_io.h"
#include "common/io/file_system.h"
#include "common/ops/sharding.h"
#include "common/rpc/grpc/grpc_client.h"
#include "common/rpc/grpc/grpc_server.h"
#include "gtest/gtest.h"
#include "pserver/bundle_tables.h"
#include "pserver/pserver_daemon.h"
#include "pserver/sparse_table.h"

namespace tessera {
namespace {

constexpr int kTrainingPservers = 2;
constexpr int64_t kIds = 48;     // ids 0 .. kIds - 1 are trained
constexpr int64_t kEvicted = 7;  // seen only at step 1, evicted at step 4
const char* const kJob = "serve-job";

// Tables of two widths, so that a mix-up of tables shows.
const std::map<std::string, int64_t>& TableDims() {
  static const auto* dims = new std::map<std::string, int64_t>{{"emb", 4}, {"side", 2}};
  return *dims;
}

SparseTableOptions Options(const std::string& table) {
  SparseTableOptions o;
  o.dim = TableDims().at(table);
  o.initializer.seed = table == "emb" ? 11 : 12;
  o.num_shards = 4;
  o.evict_after_steps = 3;
  o.prefault = false;
  return o;
}

std::string FreshDir() {
  const std::string dir =
      io::JoinPath(::testing::TempDir(),
                   absl::StrCat("table_server_test_",
                                ::testing::UnitTest::GetInstance()->current_test_info()->name()));
  io::FileSystem* fs = io::PosixFileSystem::Default();
  EXPECT_TRUE(fs->DeleteRecursively(dir).ok());
  EXPECT_TRUE(fs->CreateDirs(dir).ok());
  return dir;
}

// The training side: each training pserver's shard of every table, and the exports trainer 0
// commits under `root`.
class Training {
 public:
  explicit Training(std::string root) : root_(std::move(root)) {
    for (const auto& [name, dim] : TableDims()) {
      for (int p = 0; p < kTrainingPservers; ++p) {
        tables_[name].push_back(*SparseTable::Create(Options(name)));
      }
      initial_[name] = *SparseTable::Create(Options(name));
    }
  }

  // A gradient for each id at `step` (each on the pserver that owns it).
  void Update(const std::vector<int64_t>& ids, int64_t step) {
    for (auto& [name, shards] : tables_) {
      const int64_t dim = TableDims().at(name);
      for (int p = 0; p < kTrainingPservers; ++p) {
        std::vector<int64_t> mine;
        std::vector<float> grads;
        for (int64_t id : ids) {
          if (ShardOf(id, kTrainingPservers, ShardMethod::kHash) != p) continue;
          mine.push_back(id);
          for (int64_t j = 0; j < dim; ++j) grads.push_back(0.01f * (id + 1) * (step + j));
        }
        ASSERT_TRUE(shards[p]->ApplyGradients(mine, grads.data(), 1.0f, step).ok());
        shards[p]->AdvanceStep(step);
      }
    }
  }
  int64_t Evict() {
    int64_t n = 0;
    for (auto& [name, shards] : tables_) {
      for (auto& t : shards) n += t->EvictStale();
    }
    return n;
  }

  // Writes and commits export-<step>: full (prev < 0) or a delta on export-<prev>.
  absl::StatusOr<std::string> Export(int64_t step, int64_t prev = -1) {
    io::FileSystem* fs = io::PosixFileSystem::Default();
    const bool delta = prev >= 0;
    if (!delta) base_ = step;
    auto dir = io::BeginExport(fs, root_, step);
    if (!dir.ok()) return dir.status();
    std::vector<std::string> manifests;
    for (int p = 0; p < kTrainingPservers; ++p) {
      std::vector<BundleTableRef> refs;
      for (auto& [name, shards] : tables_) refs.push_back({name, shards[p].get()});
      absl::Status s = WritePserverExport(fs, *dir, p, kTrainingPservers, delta, refs);
      if (!s.ok()) return s;
      manifests.push_back(absl::StrCat("pserver-", p, "-of-", kTrainingPservers, ".MANIFEST"));
    }
    io::BundleMeta meta;
    meta.step = step;
    meta.delta = delta;
    meta.prev = prev;
    meta.base = base_;
    meta.num_pservers = kTrainingPservers;
    meta.table_shard_method = "hash";
    absl::Status s = io::CommitExport(fs, *dir, meta, {}, manifests);
    if (!s.ok()) return s;
    s = io::FinishExport(fs, root_, step, /*keep=*/100);
    if (!s.ok()) return s;
    return *dir;
  }

  // What serving `id` of `table` must answer now: the trained row, else the initial values.
  std::vector<float> Expected(const std::string& table, int64_t id) const {
    std::vector<float> row(static_cast<size_t>(TableDims().at(table)));
    const SparseTable& owner =
        *tables_.at(table)[ShardOf(id, kTrainingPservers, ShardMethod::kHash)];
    if (!owner.PeekRow(id, row.data())) return Initial(table, id);
    return row;
  }
  std::vector<float> Initial(const std::string& table, int64_t id) const {
    std::vector<float> row(static_cast<size_t>(TableDims().at(table)));
    EXPECT_TRUE(initial_.at(table)->LookupReadOnly({id}, row.data()).ok());
    return row;
  }
  int64_t Rows() const {
    int64_t n = 0;
    for (const auto& [name, shards] : tables_) {
      for (const auto& t : shards) n += t->Size();
    }
    return n;
  }

  const std::string& root() const { return root_; }

 private:
  std::string root_;
  int64_t base_ = 0;
  std::map<std::string, std::vector<std::unique_ptr<SparseTable>>> tables_;
  std::map<std::string, std::unique_ptr<SparseTable>> initial_;
};

// Ids 0..kIds-1 trained at steps 1 and 2; kEvicted only at step 1.
void TrainFirstSteps(Training* t) {
  std::vector<int64_t> all, but_evicted;
  for (int64_t id = 0; id < kIds; ++id) {
    all.push_back(id);
    if (id != kEvicted) but_evicted.push_back(id);
  }
  t->Update(all, 1);
  t->Update(but_evicted, 2);
}

absl::StatusOr<std::unique_ptr<TableServer>> Serve(const std::string& bundle, int shard = 0,
                                                   int num_shards = 1) {
  TableServerOptions o;
  o.bundle = bundle;
  o.shard = shard;
  o.num_shards = num_shards;
  o.job_id = kJob;
  o.endpoint = "127.0.0.1:1234";
  return TableServer::Create(o);
}

absl::StatusOr<Tensor> Prefetch(TableServer* server, const std::string& table,
                                std::vector<int64_t> ids) {
  absl::StatusOr<Tensor> out = absl::UnknownError("no answer");
  server->HandlePrefetch({kJob, 0, 0}, table, std::move(ids),
                         [&](absl::StatusOr<Tensor> rows) { out = std::move(rows); });
  return out;
}

std::vector<float> Row(const Tensor& t, int64_t i) {
  const int64_t dim = t.shape()[1];
  return std::vector<float>(t.data<float>() + i * dim, t.data<float>() + (i + 1) * dim);
}

// Ids trained, never trained, and negative.
std::vector<int64_t> IdsToAsk() {
  std::vector<int64_t> ids;
  for (int64_t id = -3; id < kIds + 5; ++id) ids.push_back(id);
  return ids;
}

// Every table's every id answered as `training` says now, by one server of every id.
void ExpectServes(TableServer* server, const Training& training) {
  for (const auto& [table, dim] : TableDims()) {
    const std::vector<int64_t> ids = IdsToAsk();
    auto rows = Prefetch(server, table, ids);
    ASSERT_TRUE(rows.ok()) << rows.status();
    ASSERT_EQ(rows->shape(), (Shape{static_cast<int64_t>(ids.size()), dim}));
    for (size_t i = 0; i < ids.size(); ++i) {
      EXPECT_EQ(Row(*rows, static_cast<int64_t>(i)), training.Expected(table, ids[i]))
          << table << " id " << ids[i];
    }
  }
}

TEST(TableServerTest, OneShardServesEveryRow) {
  Training training(FreshDir());
  TrainFirstSteps(&training);
  ASSERT_TRUE(training.Export(10).ok());
  auto server = Serve(training.root());
  ASSERT_TRUE(server.ok()) << server.status();
  ExpectServes(server->get(), training);
  const ServedExport served = (*server)->served();
  EXPECT_EQ(served.step, 10);
  EXPECT_EQ(served.dir, io::JoinPath(training.root(), io::ExportDirName(10)));
  EXPECT_EQ(served.tables, 2);
  EXPECT_EQ(served.rows, training.Rows());
  const TableServerStats stats = (*server)->stats();
  EXPECT_EQ(stats.prefetches, 2);
  EXPECT_EQ(stats.ids, 2 * static_cast<int64_t>(IdsToAsk().size()));
}

// Each id comes from the serving shard that owns it (ShardOf with the bundle's method over the
// serving pservers, whatever their number); another shard answers it with initial values, as an
// id never trained.
TEST(TableServerTest, ShardsTogetherServeEveryId) {
  Training training(FreshDir());
  TrainFirstSteps(&training);
  ASSERT_TRUE(training.Export(10).ok());
  for (int num_shards : {1, 2, 3}) {
    SCOPED_TRACE(absl::StrCat(num_shards, " serving shards"));
    std::vector<std::unique_ptr<TableServer>> servers;
    int64_t rows = 0;
    for (int s = 0; s < num_shards; ++s) {
      auto server = Serve(training.root(), s, num_shards);
      ASSERT_TRUE(server.ok()) << server.status();
      rows += (*server)->served().rows;
      servers.push_back(*std::move(server));
    }
    EXPECT_EQ(rows, training.Rows());
    const std::vector<int64_t> ids = IdsToAsk();
    for (const auto& [table, dim] : TableDims()) {
      for (int s = 0; s < num_shards; ++s) {
        auto got = Prefetch(servers[s].get(), table, ids);
        ASSERT_TRUE(got.ok()) << got.status();
        for (size_t i = 0; i < ids.size(); ++i) {
          const bool owner = ShardOf(ids[i], num_shards, ShardMethod::kHash) == s;
          EXPECT_EQ(Row(*got, static_cast<int64_t>(i)),
                    owner ? training.Expected(table, ids[i]) : training.Initial(table, ids[i]))
              << table << " id " << ids[i] << " from shard " << s;
        }
      }
    }
  }
}

TEST(TableServerTest, BadShardOptionsAndAMissingBundleFailCreate) {
  const std::string root = FreshDir();
  auto none = Serve(root);
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), absl::StatusCode::kNotFound) << none.status();
  EXPECT_NE(none.status().message().find(root), std::string::npos) << none.status();
  EXPECT_EQ(Serve(root, 2, 2).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(TableServerTest, RefusesEverythingButPrefetchAndHeartbeats) {
  Training training(FreshDir());
  TrainFirstSteps(&training);
  auto dir = training.Export(10);
  ASSERT_TRUE(dir.ok()) << dir.status();
  auto made = Serve(training.root());
  ASSERT_TRUE(made.ok()) << made.status();
  TableServer& server = **made;
  const RequestMeta meta{kJob, 0, 0};
  auto expect_refused = [&](const absl::Status& s, const std::string& method) {
    EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
    EXPECT_EQ(s.message(), absl::StrCat("pserver 127.0.0.1:1234 serves bundle ", *dir,
                                        " read-only: ", method, " refused"));
  };
  absl::Status got;
  auto capture = [&](absl::Status s) { got = s; };

  VariableHeader h;
  h.name = "emb@GRAD";
  expect_refused(server.PrepareReceive(meta, h).status(), "SendVariable");
  server.HandleGet(meta, "w", [&](absl::StatusOr<Variable> v) { got = v.status(); });
  expect_refused(got, "GetVariable");
  server.HandleRegister(meta, {{"trainers", "1"}}, 42, capture);
  expect_refused(got, "Register");
  server.HandleCheckpoint(meta, "ckpt-0000000001", capture);
  expect_refused(got, "Checkpoint");
  for (BarrierKind kind : {SEND_BARRIER, FETCH_BARRIER, COMPLETE}) {
    server.HandleBarrier(meta, kind, capture);
    expect_refused(got, absl::StrCat("Barrier ", BarrierKind_Name(kind)));
  }
  server.HandleAbort(meta, "trainer failed", capture);
  expect_refused(got, "Barrier ABORT");

  EXPECT_TRUE(server.AdmitHeartbeat(meta).ok());
  server.HandleBarrier(meta, HEARTBEAT, capture);
  EXPECT_TRUE(got.ok()) << got;
  EXPECT_TRUE(server.Admit(meta).ok());
  EXPECT_EQ(server.Admit({"other-job", 0, 0}).code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(server.AdmitHeartbeat({"other-job", 0, 0}).code(), absl::StatusCode::kUnauthenticated);

  auto unknown = Prefetch(&server, "nope", {1, 2});
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(unknown.status().message().find("'nope'"), std::string::npos) << unknown.status();
  EXPECT_NE(unknown.status().message().find("emb, side"), std::string::npos) << unknown.status();
  EXPECT_EQ(server.stats().prefetches, 0);
}

TEST(TableServerTest, RefreshAppliesADeltaThenLoadsANewBase) {
  Training training(FreshDir());
  TrainFirstSteps(&training);
  ASSERT_TRUE(training.Export(10).ok());
  auto made = Serve(training.root());
  ASSERT_TRUE(made.ok()) << made.status();
  TableServer& server = **made;

  // Nothing newer.
  EXPECT_TRUE(server.Refresh().ok());
  EXPECT_EQ(server.served().step, 10);
  EXPECT_EQ(server.stats().reloads, 0);

  // A delta: three rows changed, kEvicted evicted (a tombstone), the rest as they were.
  training.Update({1, 2, 3}, 4);
  EXPECT_EQ(training.Evict(), 2);  // kEvicted, from both tables
  ASSERT_TRUE(training.Export(20, /*prev=*/10).ok());
  absl::Status s = server.Refresh();
  ASSERT_TRUE(s.ok()) << s;
  ServedExport served = server.served();
  EXPECT_EQ(served.step, 20);
  EXPECT_EQ(served.base, 10);
  EXPECT_TRUE(served.by_delta);
  EXPECT_EQ(served.rows, training.Rows());
  ExpectServes(&server, training);
  EXPECT_EQ(training.Expected("emb", kEvicted), training.Initial("emb", kEvicted));

  // Two more deltas at once.
  training.Update({4, 5}, 5);
  ASSERT_TRUE(training.Export(30, 20).ok());
  training.Update({5, 6, 100}, 6);
  ASSERT_TRUE(training.Export(40, 30).ok());
  s = server.Refresh();
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(server.served().step, 40);
  EXPECT_TRUE(server.served().by_delta);
  ExpectServes(&server, training);

  // A new base is loaded whole and replaces the served tables.
  training.Update({8, 9}, 7);
  ASSERT_TRUE(training.Export(50).ok());
  s = server.Refresh();
  ASSERT_TRUE(s.ok()) << s;
  served = server.served();
  EXPECT_EQ(served.step, 50);
  EXPECT_EQ(served.base, 50);
  EXPECT_FALSE(served.by_delta);
  EXPECT_EQ(served.rows, training.Rows());
  ExpectServes(&server, training);
  EXPECT_EQ(server.stats().reloads, 3);
  EXPECT_EQ(server.stats().failed_refreshes, 0);
}

TEST(TableServerTest, ADamagedNewExportKeepsTheServedOne) {
  Training training(FreshDir());
  TrainFirstSteps(&training);
  ASSERT_TRUE(training.Export(10).ok());
  auto made = Serve(training.root());
  ASSERT_TRUE(made.ok()) << made.status();
  TableServer& server = **made;
  // What export 10 holds, before training goes on.
  std::map<std::string, Tensor> before;
  for (const auto& [table, dim] : TableDims()) {
    auto rows = Prefetch(&server, table, IdsToAsk());
    ASSERT_TRUE(rows.ok());
    before[table] = *rows;
  }

  training.Update({1, 2, 3}, 4);
  auto dir = training.Export(20);
  ASSERT_TRUE(dir.ok()) << dir.status();
  io::FileSystem* fs = io::PosixFileSystem::Default();
  const std::string tbl = io::JoinPath(*dir, io::BundleTableFileName(1, 2, "emb"));
  auto bytes = fs->ReadFile(tbl);
  ASSERT_TRUE(bytes.ok()) << bytes.status();
  ASSERT_GT(bytes->size(), 60u);
  (*bytes)[50] ^= 0x40;
  auto file = fs->NewWritableFile(tbl);
  ASSERT_TRUE(file.ok());
  ASSERT_TRUE((*file)->Append(*bytes).ok());
  ASSERT_TRUE((*file)->Close().ok());

  absl::Status s = server.Refresh();
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_NE(s.message().find(tbl), std::string::npos) << s;
  EXPECT_EQ(server.served().step, 10);
  EXPECT_EQ(server.stats().failed_refreshes, 1);
  for (const auto& [table, dim] : TableDims()) {
    auto rows = Prefetch(&server, table, IdsToAsk());
    ASSERT_TRUE(rows.ok());
    for (int64_t i = 0; i < rows->shape()[0]; ++i) {
      EXPECT_EQ(Row(*rows, i), Row(before[table], i)) << table << " row " << i;
    }
  }

  // A delta whose chain has a gap is refused too, and the next good export is picked up.
  ASSERT_TRUE(fs->DeleteRecursively(*dir).ok());
  training.Update({4}, 5);
  ASSERT_TRUE(training.Export(30, /*prev=*/20).ok());
  s = server.Refresh();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_EQ(server.served().step, 10);
  ASSERT_TRUE(training.Export(40).ok());
  s = server.Refresh();
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(server.served().step, 40);
  ExpectServes(&server, training);
}

// One export-* directory is served as it is: nothing newer is looked for.
TEST(TableServerTest, AnExportDirectoryIsServedAsItIs) {
  Training training(FreshDir());
  TrainFirstSteps(&training);
  auto dir = training.Export(10);
  ASSERT_TRUE(dir.ok());
  auto made = Serve(*dir);
  ASSERT_TRUE(made.ok()) << made.status();
  training.Update({1}, 4);
  ASSERT_TRUE(training.Export(20, 10).ok());
  EXPECT_TRUE((*made)->Refresh().ok());
  EXPECT_EQ((*made)->served().step, 10);
  EXPECT_EQ((*made)->stats().reloads, 0);
}

std::unique_ptr<GrpcPServerClient> Client(int port) {
  GrpcClientOptions o;
  o.deadline = absl::Seconds(20);
  return std::make_unique<GrpcPServerClient>(absl::StrCat("127.0.0.1:", port), o);
}

TEST(TableServerTest, PrefetchOverGrpc) {
  Training training(FreshDir());
  TrainFirstSteps(&training);
  ASSERT_TRUE(training.Export(10).ok());
  auto made = Serve(training.root());
  ASSERT_TRUE(made.ok()) << made.status();
  GrpcServer server(GrpcServerOptions{"127.0.0.1:0"}, made->get());
  ASSERT_TRUE(server.Start().ok());
  auto client = Client(server.port());
  const RequestMeta meta{kJob, 0, 0};
  const std::vector<int64_t> ids = IdsToAsk();
  Tensor rows;
  absl::Status s = client->Prefetch(meta, "emb", ids, &rows);
  ASSERT_TRUE(s.ok()) << s;
  for (size_t i = 0; i < ids.size(); ++i) {
    EXPECT_EQ(Row(rows, static_cast<int64_t>(i)), training.Expected("emb", ids[i]));
  }
  Variable v;
  v.GetMutable<Tensor>()->Resize(FLOAT32, {1});
  s = client->SendVariable(meta, "w", v);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("read-only: SendVariable refused"), std::string::npos) << s;
  s = client->Register(meta, {{"trainers", "1"}}, 1);
  EXPECT_NE(s.message().find("Register refused"), std::string::npos) << s;
  EXPECT_EQ(client->Prefetch({"other-job", 0, 0}, "emb", ids, &rows).code(),
            absl::StatusCode::kUnauthenticated);
  EXPECT_TRUE(client->Barrier(meta, HEARTBEAT).ok());
  server.Shutdown();
  server.Wait();
}

ClusterConfig ServingConfig(const std::string& bundle) {
  ClusterConfig c;
  c.role = "pserver";
  c.pservers = {"127.0.0.1:0"};
  c.current_endpoint = "127.0.0.1:0";
  c.job_id = kJob;
  c.serve_bundle = bundle;
  c.model = "/nonexistent/model.pbtxt";  // a serving pserver builds no model
  c.stats_interval_s = 0;
  return c;
}

TEST(ServingPserverProcessTest, AMissingBundleIsAConfigurationError) {
  const std::string root = FreshDir();
  ClusterConfig c = ServingConfig(io::JoinPath(root, "none"));
  std::ostringstream log;
  auto p = ServingPserverProcess::Create(c, log);
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find("--serve_bundle=" + c.serve_bundle), std::string::npos)
      << p.status();
}

TEST(ServingPserverProcessTest, ServesAndPicksUpADelta) {
  Training training(FreshDir());
  TrainFirstSteps(&training);
  ASSERT_TRUE(training.Export(10).ok());
  const int64_t rows_at_10 = training.Rows();
  ClusterConfig c = ServingConfig(training.root());
  c.watch_bundle = true;
  c.watch_bundle_interval_s = 0.02;
  std::ostringstream log;
  auto made = ServingPserverProcess::Create(c, log);
  ASSERT_TRUE(made.ok()) << made.status();
  ServingPserverProcess& p = **made;
  ASSERT_TRUE(p.Start().ok());
  auto client = Client(p.port());
  const RequestMeta meta{kJob, 0, 0};
  const std::vector<int64_t> ids = IdsToAsk();
  Tensor rows;
  ASSERT_TRUE(client->Prefetch(meta, "side", ids, &rows).ok());
  for (size_t i = 0; i < ids.size(); ++i) {
    EXPECT_EQ(Row(rows, static_cast<int64_t>(i)), training.Expected("side", ids[i]));
  }

  training.Update({1, 2, 3}, 4);
  ASSERT_EQ(training.Evict(), 2);
  ASSERT_TRUE(training.Export(20, 10).ok());
  // The watcher's next look picks it up.
  const absl::Time deadline = absl::Now() + absl::Seconds(30);
  while (p.server()->served().step != 20 && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(10));
  }
  ASSERT_EQ(p.server()->served().step, 20);
  ASSERT_TRUE(client->Prefetch(meta, "side", ids, &rows).ok());
  for (size_t i = 0; i < ids.size(); ++i) {
    EXPECT_EQ(Row(rows, static_cast<int64_t>(i)), training.Expected("side", ids[i]));
  }

  p.RequestStop();
  p.RequestStop();  // twice is fine
  EXPECT_TRUE(p.Wait().ok());
  const std::string text = log.str();
  EXPECT_NE(text.find(absl::StrCat("serving ", training.root(),
                                   "/export-0000000010 (step 10): 2 tables, ", rows_at_10,
                                   " rows (shard 0 of 1)")),
            std::string::npos)
      << text;
  EXPECT_NE(text.find("/export-0000000020 (step 20, delta)"), std::string::npos) << text;
  EXPECT_NE(text.find("prefetches=2"), std::string::npos) << text;
}

}  // namespace
}  // namespace tessera
