// Checkpoints and resharding, in process (trainers as threads, in-process RPC): a sync job with
// a sliced dense layer, a distributed table, Adam and a learning-rate schedule is checkpointed
// after 4 steps by 2 pservers; restoring into 3 pservers (and from those back into 2) and
// training 4 more steps ends with the same model as training 8 steps without stopping.
#include <cmath>
#include <set>
#include <tuple>

#include "absl/strings/str_cat.h"
#include "common/framework/executor.h"
#include "common/io/checkpoint_io.h"
#include "common/ops/ops.h"
#include "common/ops/sharding.h"
#include "gtest/gtest.h"
#include "pserver/checkpoint.h"
#include "pserver/parameter_server.h"
#include "pserver/sparse_table.h"
#include "tests/cluster_util.h"
#include "tests/inproc_cluster.h"
#include "transpiler/distribute_transpiler.h"

namespace tessera {
namespace {

constexpr int kVocab = 200;
constexpr int kDim = 8;
constexpr int kBatch = 12;
constexpr int kTrainers = 2;

// x -> fc 512 relu (10240 weights: sliced) ++ distributed embedding of ids -> fc 1 -> MSE; Adam
// with an exponentially decaying learning rate.
InprocModelOptions ModelOptions(int wide_dim = 0) {
  InprocModelOptions o;
  o.wide_dim = wide_dim;
  o.vocab = kVocab;
  o.emb_dim = kDim;
  o.distributed_table = true;
  o.optimizer = "adam";
  o.learning_rate = 0.01f;
  o.decay_steps = 2;
  o.decay_rate = 0.5f;
  return o;
}

struct Result {
  std::map<std::string, Tensor> dense;         // trainer 0's parameters
  std::map<int64_t, std::vector<float>> rows;  // table rows held by the pservers
  std::map<int64_t, std::vector<float>> wide;  // and the "wide" table's (JobKind::wide_dim)
};

// The model's second table and how the pservers hold the tables.
struct JobKind {
  TablePlacement placement = TablePlacement::kRowWise;
  int wide_dim = 0;          // > 0: a "wide" table looked up with the same ids as "emb"
  bool fuse_tables = false;  // the two as one pserver table
};

// A sync job of `pservers` pservers and kTrainers trainers running steps [first, last): restored
// from `init_from` if set, checkpointed into <save_root>/ckpt-<last> after the last step if set.
Result RunJob(int pservers, int first, int last, const std::string& init_from,
              const std::string& save_root, JobKind kind = {}) {
  InprocJobOptions jo;
  jo.table_placement = kind.placement;
  jo.fuse_tables = kind.fuse_tables;
  jo.trainers = kTrainers;
  jo.pservers = pservers;
  jo.batch = kBatch;
  jo.first_step = first;
  jo.last_step = last;
  jo.id_range = kVocab;
  jo.restore_from = init_from;
  jo.notify_complete = false;
  Result result;
  auto job = RunInprocJob(
      ModelOptions(kind.wide_dim), jo, [&](int k, const InprocModel& m, const Scope& scope) {
        if (k != 0) return;
        for (const auto& v : m.main.blocks(0).vars()) {
          if (v.trainable() && !v.is_distributed()) {
            result.dense[v.name()] = scope.FindVar(v.name())->Get<Tensor>().Clone();
          }
        }
      });
  if (!save_root.empty()) {
    io::FileSystem* fs = io::PosixFileSystem::Default();
    auto dir = io::BeginCheckpoint(fs, save_root, last);
    EXPECT_TRUE(dir.ok()) << dir.status();
    std::vector<std::string> manifests;
    for (int p = 0; p < pservers; ++p) {
      absl::Status s = job->servers[p]->SaveCheckpoint(*dir);
      EXPECT_TRUE(s.ok()) << s;
      manifests.push_back(io::PserverFilePrefix(p, pservers) + ".MANIFEST");
    }
    io::TrainerCheckpointState st;
    st.step = last;
    st.trainers = kTrainers;
    st.num_pservers = pservers;
    EXPECT_TRUE(io::CommitTrainerCheckpoint(fs, *dir, st, manifests).ok());
    EXPECT_TRUE(io::FinishCheckpoint(fs, save_root, last, 2).ok());
  }
  // The table's rows from their owners (their values after further steps depend on the
  // restored Adam moments too).
  result.rows = GatherTableRows(*job, "emb", kVocab, kDim, last);
  if (kind.wide_dim > 0) result.wide = GatherTableRows(*job, "wide", kVocab, kind.wide_dim, last);
  return result;
}

void ExpectSameModel(const Result& got, const Result& want, const std::string& what) {
  ASSERT_EQ(got.dense.size(), want.dense.size()) << what;
  for (const auto& [name, w] : want.dense) {
    const Tensor& g = got.dense.at(name);
    ASSERT_EQ(g.shape(), w.shape()) << what << " " << name;
    EXPECT_LE(WorstRelativeError(g, w, 1e-3), 1e-6) << what << " " << name;
  }
  using Rows = std::map<int64_t, std::vector<float>>;
  for (const auto& [g, w_rows] : {std::pair<const Rows*, const Rows*>(&got.rows, &want.rows),
                                  std::pair<const Rows*, const Rows*>(&got.wide, &want.wide)}) {
    ASSERT_EQ(g->size(), w_rows->size()) << what;
    for (const auto& [id, w] : *w_rows) {
      ASSERT_EQ(g->at(id).size(), w.size()) << what;
      for (size_t j = 0; j < w.size(); ++j) {
        EXPECT_NEAR(g->at(id)[j], w[j], 1e-6 * std::max(1e-3f, std::fabs(w[j])))
            << what << " row " << id << " col " << j;
      }
    }
  }
}

TEST(CheckpointReshardTest, TwoToThreeAndBackEqualsUninterrupted) {
  const std::string root = MakeTempDir("reshard");
  const Result straight = RunJob(2, 0, 8, "", "");
  // 2 pservers, 4 steps, checkpoint -> 3 pservers, 4 steps.
  RunJob(2, 0, 4, "", root + "/two");
  const std::string two = root + "/two/" + io::CheckpointDirName(4);
  ExpectSameModel(RunJob(3, 4, 8, two, ""), straight, "2 -> 3");
  // 2 -> 3 (no step, checkpoint again with 3) -> 2.
  RunJob(3, 4, 4, two, root + "/three");
  const std::string three = root + "/three/" + io::CheckpointDirName(4);
  ExpectSameModel(RunJob(2, 4, 8, three, ""), straight, "2 -> 3 -> 2");
  io::FileSystem* fs = io::PosixFileSystem::Default();
  auto top = io::ReadManifest(fs, three + "/MANIFEST");
  ASSERT_TRUE(top.ok()) << top.status();
  EXPECT_EQ(top->meta.at("num_pservers"), "3");
  // Restoring at the same count and continuing is exact too.
  ExpectSameModel(RunJob(2, 4, 8, two, ""), straight, "2 -> 2");
}

// A table split by id over the pservers (row-wise) and the same table whole on one (table-wise)
// restore from each other's checkpoints: every saved row goes to its new holder.
TEST(CheckpointReshardTest, RowWiseAndTableWisePlacementsRestoreEachOther) {
  const std::string root = MakeTempDir("reshard_placement");
  const Result straight = RunJob(2, 0, 8, "", "");
  RunJob(2, 0, 4, "", root + "/rows");
  const std::string rows = root + "/rows/" + io::CheckpointDirName(4);
  const JobKind table_wise{TablePlacement::kTableWise};
  ExpectSameModel(RunJob(2, 4, 8, rows, "", table_wise), straight, "row-wise 2 -> table-wise 2");
  // Table-wise on 3 (no step, checkpoint: one pserver saves the table) -> row-wise on 2.
  RunJob(3, 4, 4, rows, root + "/whole", table_wise);
  const std::string whole = root + "/whole/" + io::CheckpointDirName(4);
  int saved_tables = 0;
  for (int p = 0; p < 3; ++p) {
    saved_tables += io::PosixFileSystem::Default()->Exists(
        absl::StrCat(whole, "/", io::PserverFilePrefix(p, 3), ".emb.tbl"));
  }
  EXPECT_EQ(saved_tables, 1);
  ExpectSameModel(RunJob(2, 4, 8, whole, ""), straight, "table-wise 3 -> row-wise 2");
  // And a table-wise job trains as the row-wise one does.
  ExpectSameModel(RunJob(2, 0, 8, "", "", table_wise), straight, "table-wise");
}

// A table group (fuse_tables: "emb" and "wide", looked up with the same ids, held as one
// pserver table) trains as the tables held apart, and checkpoints one file per table: grouped
// and ungrouped jobs, row-wise and table-wise, restore from each other's checkpoints.
TEST(CheckpointReshardTest, GroupedAndUngroupedTablesRestoreEachOther) {
  const std::string root = MakeTempDir("reshard_groups");
  const JobKind apart{TablePlacement::kRowWise, 3, false};
  const JobKind grouped{TablePlacement::kRowWise, 3, true};
  const JobKind grouped_whole{TablePlacement::kTableWise, 3, true};
  const JobKind apart_whole{TablePlacement::kTableWise, 3, false};
  {  // The grouped job's pservers do hold one table of both.
    auto base = NewStandardOpRegistry();
    InprocModel m = BuildInprocModel(*base, ModelOptions(3));
    TranspilerConfig cfg;
    cfg.pservers = {"ps0:0", "ps1:0"};
    cfg.trainers = kTrainers;
    cfg.fuse_tables = true;
    auto t = DistributeTranspiler::Transpile(m.main, m.startup, cfg);
    ASSERT_TRUE(t.ok()) << t.status();
    const absl::StatusOr<ProgramDesc> program = t->GetPserverProgram("ps0:0");
    ASSERT_TRUE(program.ok()) << program.status();
    std::vector<std::string> groups;
    for (const OpDesc& op : program->blocks(0).ops()) {
      if (op.type() == "sparse_table") groups.push_back(GetStringAttr(op, "group", ""));
    }
    EXPECT_EQ(groups, std::vector<std::string>({"emb+wide", "emb+wide"}));
  }
  const Result straight = RunJob(2, 0, 8, "", "", apart);
  ExpectSameModel(RunJob(2, 0, 8, "", "", grouped), straight, "grouped");
  RunJob(2, 0, 4, "", root + "/grouped", grouped);
  const std::string from_grouped = root + "/grouped/" + io::CheckpointDirName(4);
  for (const char* table : {"emb", "wide"}) {
    EXPECT_TRUE(io::PosixFileSystem::Default()->Exists(
        absl::StrCat(from_grouped, "/", io::PserverFilePrefix(1, 2), ".", table, ".tbl")))
        << table;
  }
  ExpectSameModel(RunJob(3, 4, 8, from_grouped, "", apart_whole), straight,
                  "grouped row-wise 2 -> apart table-wise 3");
  ExpectSameModel(RunJob(2, 4, 8, from_grouped, "", grouped_whole), straight,
                  "grouped row-wise 2 -> grouped table-wise 2");
  RunJob(2, 0, 4, "", root + "/apart", apart);
  ExpectSameModel(RunJob(3, 4, 8, root + "/apart/" + io::CheckpointDirName(4), "", grouped),
                  straight, "apart row-wise 2 -> grouped row-wise 3");
}

TEST(CheckpointReshardTest, MissingOrDamagedCheckpointNamesTheFile) {
  const std::string root = MakeTempDir("reshard_bad");
  RunJob(2, 0, 1, "", root);
  const std::string ckpt = root + "/" + io::CheckpointDirName(1);
  io::FileSystem* fs = io::PosixFileSystem::Default();
  const std::string victim = ckpt + "/pserver-1-of-2.dense";
  std::string data = *fs->ReadFile(victim);
  data[data.size() / 3] ^= 1;
  ASSERT_TRUE(io::WriteFileAtomic(fs, victim, data).ok());
  auto base = NewStandardOpRegistry();
  InprocModel m = BuildInprocModel(*base, ModelOptions());
  TranspilerConfig cfg;
  cfg.pservers = {"ps0:0", "ps1:0", "ps2:0"};
  cfg.trainers = kTrainers;
  auto t = DistributeTranspiler::Transpile(m.main, m.startup, cfg);
  ASSERT_TRUE(t.ok());
  Scope scope;
  Executor exec(base.get());
  ASSERT_TRUE(exec.Run(*t->GetPserverStartupProgram("ps0:0"), 0, &scope).ok());
  ParameterServerOptions po;
  po.num_pservers = 3;
  po.param_blocks = t->param_blocks();
  auto server = ParameterServer::Create(*t->GetPserverProgram("ps0:0"), &scope, base.get(), po);
  ASSERT_TRUE(server.ok());
  absl::Status s = (*server)->RestoreCheckpoint(ckpt);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
  EXPECT_NE(s.message().find(victim), absl::string_view::npos) << s;
  EXPECT_EQ(s.message().find('\n'), absl::string_view::npos) << s;
}

// Admission counts and last-seen stamps (not part of table exports) survive a 2 -> 3 pserver
// restore: every record lands on its new owner (or on the one pserver holding the table whole),
// and an id one sighting short of admission is admitted at its next lookup there.
TEST(CheckpointReshardTest, AdmissionCountsAndLastSeenSurviveResharding) {
  SparseTableOptions o;
  o.dim = 4;
  o.optimizer = "adagrad";
  o.admission_threshold = 3;
  o.evict_after_steps = 1000;
  auto key = [](const SparseTableLifecycleRecord& r) {
    return std::make_tuple(r.id, r.seen, r.count, r.pending);
  };
  std::set<std::tuple<int64_t, uint32_t, uint32_t, bool>> before, after;
  const std::string root = MakeTempDir("reshard_life");
  io::FileSystem* fs = io::PosixFileSystem::Default();
  auto dir = io::BeginCheckpoint(fs, root, 7);
  ASSERT_TRUE(dir.ok());
  std::vector<std::string> manifests;
  for (int p = 0; p < 2; ++p) {
    auto table = SparseTable::Create(o);
    ASSERT_TRUE(table.ok());
    std::vector<float> out(o.dim);
    (*table)->AdvanceStep(5);
    for (int64_t id = 0; id < 200; ++id) {
      if (ShardOf(id, 2, ShardMethod::kHash) != p) continue;
      for (int k = 0; k < id % 4; ++k) ASSERT_TRUE((*table)->Lookup({id}, out.data()).ok());
    }
    (*table)->AdvanceStep(9);
    for (int64_t id = 3; id < 200; id += 8) {
      if (ShardOf(id, 2, ShardMethod::kHash) == p) {
        ASSERT_TRUE((*table)->Lookup({id}, out.data()).ok());
      }
    }
    std::vector<SparseTableLifecycleRecord> life;
    (*table)->ExportLifecycle(&life);
    for (const auto& r : life) before.insert(key(r));
    PserverShardToSave shard;
    shard.index = p;
    shard.num_pservers = 2;
    shard.step = 7;
    shard.tables.push_back({"emb", p, table->get(), 0});
    ASSERT_TRUE(SavePserverShard(fs, *dir, shard).ok());
    manifests.push_back(io::PserverFilePrefix(p, 2) + ".MANIFEST");
  }
  io::TrainerCheckpointState st;
  st.step = 7;
  st.num_pservers = 2;
  ASSERT_TRUE(io::CommitTrainerCheckpoint(fs, *dir, st, manifests).ok());
  int pending_seen = 0, seen_9 = 0;
  for (int p = 0; p < 3; ++p) {
    auto table = SparseTable::Create(o);
    ASSERT_TRUE(table.ok());
    Scope scope;
    PserverRestoreTarget target;
    target.index = p;
    target.num_pservers = 3;
    target.scope = &scope;
    target.tables.push_back({"emb", p, table->get(), 0});
    auto restored = RestorePserverShard(fs, *dir, target);
    ASSERT_TRUE(restored.ok()) << restored.status();
    std::vector<SparseTableLifecycleRecord> life;
    (*table)->ExportLifecycle(&life);
    for (const auto& r : life) {
      EXPECT_EQ(ShardOf(r.id, 3, ShardMethod::kHash), p) << r.id;
      after.insert(key(r));
      seen_9 += r.seen == 9;
      if (!r.pending || r.count != 2) continue;
      // One more sighting admits it.
      std::vector<float> out(o.dim);
      const int64_t rows = (*table)->Size();
      ASSERT_TRUE((*table)->Lookup({r.id}, out.data()).ok());
      EXPECT_EQ((*table)->Size(), rows + 1) << r.id;
      ++pending_seen;
    }
  }
  EXPECT_EQ(after, before);
  EXPECT_GT(pending_seen, 10);
  EXPECT_GT(seen_9, 5);
  // The table held whole by one of 3 pservers (table-wise: shard 0 of 1) takes every record.
  auto whole = SparseTable::Create(o);
  ASSERT_TRUE(whole.ok());
  Scope scope;
  PserverRestoreTarget target;
  target.index = 2;
  target.num_pservers = 3;
  target.scope = &scope;
  target.tables.push_back({"emb", 0, whole->get(), 0, /*num_shards=*/1});
  auto restored = RestorePserverShard(fs, *dir, target);
  ASSERT_TRUE(restored.ok()) << restored.status();
  std::vector<SparseTableLifecycleRecord> life;
  (*whole)->ExportLifecycle(&life);
  std::set<std::tuple<int64_t, uint32_t, uint32_t, bool>> held;
  for (const auto& r : life) held.insert(key(r));
  EXPECT_EQ(held, before);
}

}  // namespace
}  // namespace tessera
