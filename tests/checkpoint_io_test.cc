// Checkpoint files: manifests, corrupt and truncated files (one-line errors naming the file),
// and saves interrupted at every file operation (fault injection, with and without a crash,
// over many random contents): the last complete checkpoint always loads exactly as it was
// saved.
#include "common/io/checkpoint_io.h"

#include <cstring>
#include <random>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/io/crc32c.h"
#include "common/io/fault_injecting_file_system.h"
#include "common/io/file_system.h"
#include "common/base/status.h"
#include "gtest/gtest.h"
#include "pserver/checkpoint.h"
#include "pserver/sparse_table.h"
#include "tests/cluster_util.h"

namespace tessera {
namespace {

using io::FileSystem;

constexpr int kRows = 6, kCols = 4, kDim = 3;

// Deterministic content for checkpoint `version`: a sliced dense variable, a copy, and a table
// with Adagrad state.
struct Content {
  std::map<std::string, Tensor> dense;
  std::map<int64_t, std::vector<float>> rows;  // id -> values then state
};

Content MakeContent(uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> u(-1, 1);
  Content c;
  Tensor w(FLOAT32, {kRows, kCols});
  for (int64_t i = 0; i < w.numel(); ++i) w.data<float>()[i] = u(rng);
  c.dense["w"] = w;
  Tensor lr(FLOAT32, {1});
  lr.data<float>()[0] = u(rng);
  c.dense["lr"] = lr;
  const int n = 1 + static_cast<int>(rng() % 20);
  for (int i = 0; i < n; ++i) {
    std::vector<float> r(2 * kDim);
    for (auto& x : r) x = u(rng);
    c.rows[static_cast<int64_t>(rng() % 1000) - 500] = r;
  }
  return c;
}

std::unique_ptr<SparseTable> NewTable() {
  SparseTableOptions o;
  o.dim = kDim;
  o.optimizer = "adagrad";
  o.num_shards = 4;
  return *SparseTable::Create(o);
}

// Saves `c` as the complete checkpoint of `step` under `root` (one pserver, the trainer's
// commit, LATEST and pruning), all through `fs`.
absl::Status Save(FileSystem* fs, const std::string& root, int64_t step, const Content& c) {
  auto table = NewTable();
  // Rows with given values and state: an export file written by hand (the format is public).
  std::string bytes(sparse_table_format::kHeaderBytes, '\0');
  const uint32_t dim = kDim, sw = kDim, version = sparse_table_format::kVersion, flags = 0, opt = 1;
  const uint64_t count = c.rows.size();
  std::memcpy(&bytes[0], sparse_table_format::kMagic, 8);
  std::memcpy(&bytes[8], &version, 4);
  std::memcpy(&bytes[12], &flags, 4);
  std::memcpy(&bytes[16], &dim, 4);
  std::memcpy(&bytes[20], &sw, 4);
  std::memcpy(&bytes[24], &count, 8);
  std::memcpy(&bytes[32], &opt, 4);
  uint32_t hcrc = sparse_table_format::Crc32c(bytes.data(), 36);
  std::memcpy(&bytes[36], &hcrc, 4);
  for (const auto& [id, r] : c.rows) {
    std::string rec(8 + 4 * r.size() + 4, '\0');
    std::memcpy(&rec[0], &id, 8);
    std::memcpy(&rec[8], r.data(), 4 * r.size());
    uint32_t crc = sparse_table_format::Crc32c(rec.data(), rec.size() - 4);
    std::memcpy(&rec[rec.size() - 4], &crc, 4);
    bytes += rec;
  }
  const std::string scratch = MakeTempDir("table") + "/t.tbl";
  TS_RETURN_IF_ERROR(io::WriteFileAtomic(io::PosixFileSystem::Default(), scratch, bytes));
  auto imported = table->Import(scratch);
  if (!imported.ok()) return imported.status();

  auto dir = io::BeginCheckpoint(fs, root, step);
  if (!dir.ok()) return dir.status();
  PserverShardToSave shard;
  shard.index = 0;
  shard.num_pservers = 1;
  shard.step = step;
  shard.dense = c.dense;
  shard.slices["w"] = DenseSlice{"w", 0, kRows, kRows};
  shard.slices["lr"] = DenseSlice{"lr", -1, 0, 0};
  shard.tables.push_back({"emb", 0, table.get(), step});
  TS_RETURN_IF_ERROR(SavePserverShard(fs, *dir, shard));
  io::TrainerCheckpointState st;
  st.step = step;
  st.epoch = step / 10;
  st.step_in_epoch = step % 10;
  st.seed = 7;
  TS_RETURN_IF_ERROR(io::CommitTrainerCheckpoint(fs, *dir, st, {"pserver-0-of-1.MANIFEST"}));
  return io::FinishCheckpoint(fs, root, step, 2);
}

// Loads the newest complete checkpoint under `root`; its step in *step.
absl::StatusOr<Content> Load(const std::string& root, int64_t* step) {
  FileSystem* fs = io::PosixFileSystem::Default();
  TS_ASSIGN_OR_RETURN(std::string ckpt, io::ResolveCheckpoint(fs, root));
  TS_ASSIGN_OR_RETURN(io::TrainerCheckpointState st, io::ReadTrainerCheckpoint(fs, ckpt));
  *step = st.step;
  Scope scope;
  scope.Var("w")->GetMutable<Tensor>()->Resize(FLOAT32, {kRows, kCols});
  scope.Var("lr")->GetMutable<Tensor>()->Resize(FLOAT32, {1});
  auto table = NewTable();
  PserverRestoreTarget target;
  target.scope = &scope;
  target.slices["w"] = DenseSlice{"w", 0, kRows, kRows};
  target.slices["lr"] = DenseSlice{"lr", -1, 0, 0};
  target.tables.push_back({"emb", 0, table.get(), 0});
  TS_ASSIGN_OR_RETURN(PserverRestored r, RestorePserverShard(fs, ckpt, target));
  if (r.step != st.step) return absl::InternalError("pserver and trainer steps differ");
  Content c;
  c.dense["w"] = scope.FindVar("w")->Get<Tensor>().Clone();
  c.dense["lr"] = scope.FindVar("lr")->Get<Tensor>().Clone();
  if (table->Size() != r.table_rows) return absl::InternalError("row count");
  // Rows are compared by the caller through PeekRow on a fresh load; collect all ids seen.
  for (int64_t id = -500; id < 500; ++id) {
    std::vector<float> r2(2 * kDim);
    if (table->PeekRow(id, r2.data(), r2.data() + kDim)) c.rows[id] = r2;
  }
  return c;
}

void ExpectSame(const Content& got, const Content& want) {
  ASSERT_EQ(got.dense.size(), want.dense.size());
  for (const auto& [name, t] : want.dense) {
    const Tensor& g = got.dense.at(name);
    ASSERT_EQ(g.shape(), t.shape()) << name;
    EXPECT_EQ(0, std::memcmp(g.raw_data(), t.raw_data(), t.nbytes())) << name;
  }
  ASSERT_EQ(got.rows.size(), want.rows.size());
  for (const auto& [id, r] : want.rows) {
    ASSERT_EQ(got.rows.count(id), 1u) << id;
    EXPECT_EQ(0, std::memcmp(got.rows.at(id).data(), r.data(), 4 * r.size())) << id;
  }
}

TEST(CheckpointIoTest, Crc32cKnownValues) {
  EXPECT_EQ(io::Crc32c("123456789"), 0xE3069283u);  // the standard check value
  EXPECT_EQ(io::Crc32c(""), 0u);
  std::string long_text(1000, 'x');
  EXPECT_EQ(io::Crc32c(long_text), sparse_table_format::Crc32c(long_text.data(), 1000));
}

TEST(CheckpointIoTest, ManifestRoundTripAndDamage) {
  io::Manifest m;
  m.meta["step"] = "12";
  m.files.push_back({"a.dense", 10, 0x1234abcd});
  std::string text = io::SerializeManifest(m);
  auto back = io::ParseManifest(text, "/x/MANIFEST");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->meta.at("step"), "12");
  ASSERT_EQ(back->files.size(), 1u);
  EXPECT_EQ(back->files[0].crc32c, 0x1234abcdu);
  std::string flipped = text;
  flipped[text.find("a.dense")] = 'b';
  for (const std::string& bad : {text.substr(0, text.size() / 2), flipped, std::string()}) {
    auto r = io::ParseManifest(bad, "/x/MANIFEST");
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.status().code(), absl::StatusCode::kDataLoss);
    EXPECT_TRUE(absl::StrContains(r.status().message(), "/x/MANIFEST")) << r.status();
    EXPECT_EQ(r.status().message().find('\n'), absl::string_view::npos);
  }
}

TEST(CheckpointIoTest, RoundTripKeepsLastTwo) {
  const std::string root = MakeTempDir("ckpt_rt");
  FileSystem* fs = io::PosixFileSystem::Default();
  for (int64_t step : {5, 10, 15}) ASSERT_TRUE(Save(fs, root, step, MakeContent(step)).ok());
  int64_t step = 0;
  auto c = Load(root, &step);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(step, 15);
  ExpectSame(*c, MakeContent(15));
  EXPECT_FALSE(fs->Exists(root + "/" + io::CheckpointDirName(5)));
  EXPECT_TRUE(fs->Exists(root + "/" + io::CheckpointDirName(10)));
  EXPECT_EQ(*fs->ReadFile(root + "/LATEST"), io::CheckpointDirName(15) + "\n");
  auto st = io::ReadTrainerCheckpoint(fs, root + "/" + io::CheckpointDirName(15));
  ASSERT_TRUE(st.ok());
  EXPECT_EQ(st->epoch, 1);
  EXPECT_EQ(st->step_in_epoch, 5);
  EXPECT_EQ(st->seed, 7u);
}

// Every file of a checkpoint, truncated or with one byte flipped, gives a one-line DataLoss
// error that names that file.
TEST(CheckpointIoTest, CorruptOrTruncatedFilesNameTheFile) {
  FileSystem* fs = io::PosixFileSystem::Default();
  const std::string good = MakeTempDir("ckpt_good");
  ASSERT_TRUE(Save(fs, good, 3, MakeContent(3)).ok());
  const std::string name = io::CheckpointDirName(3);
  auto files = fs->ListDir(good + "/" + name);
  ASSERT_TRUE(files.ok());
  ASSERT_GE(files->size(), 6u);
  for (const std::string& file : *files) {
    for (int mode = 0; mode < 2; ++mode) {
      const std::string root = MakeTempDir("ckpt_bad");
      ASSERT_TRUE(Save(fs, root, 3, MakeContent(3)).ok());
      const std::string path = root + "/" + name + "/" + file;
      std::string data = *fs->ReadFile(path);
      if (mode == 0) {
        data = data.substr(0, data.size() - 1);  // truncated
      } else {
        data[data.size() / 2] ^= 0x20;  // one byte changed
      }
      ASSERT_TRUE(io::WriteFileAtomic(fs, path, data).ok());
      int64_t step;
      auto c = Load(root, &step);
      ASSERT_FALSE(c.ok()) << file << " mode " << mode;
      EXPECT_TRUE(absl::StrContains(c.status().message(), path))
          << file << " mode " << mode << ": " << c.status();
      EXPECT_EQ(c.status().message().find('\n'), absl::string_view::npos) << c.status();
      EXPECT_EQ(c.status().code(), absl::StatusCode::kDataLoss) << c.status();
    }
  }
}

// A save of checkpoint 20 over a good checkpoint 10, failed at its n-th file operation for every
// n (and, with crash, every operation after it failing too: a process that died there). Loading
// afterwards gives checkpoint 10 exactly, or 20 exactly when only the pruning after the commit
// failed. Many random contents (seeds).
TEST(CheckpointIoTest, InterruptedSaveNeverCorruptsTheLastGoodCheckpoint) {
  // fsyncs are counted and failed like every operation but skipped (hundreds of saves).
  io::FaultInjectingFileSystem nosync(io::PosixFileSystem::Default(), 0, false, true);
  FileSystem* posix = &nosync;
  int trials = 0, kept_old = 0;
  for (uint64_t seed = 1; seed <= 10; ++seed) {
    // Count the operations of a clean save.
    const std::string probe = MakeTempDir("ckpt_probe");
    ASSERT_TRUE(Save(posix, probe, 10, MakeContent(seed)).ok());
    io::FaultInjectingFileSystem counter(posix, 0, false, true);
    ASSERT_TRUE(Save(&counter, probe, 20, MakeContent(seed + 100)).ok());
    const int64_t ops = counter.ops();
    ASSERT_GT(ops, 10);
    for (int64_t n = 1; n <= ops; ++n) {
      for (bool crash : {false, true}) {
        const std::string root = MakeTempDir("ckpt_fault");
        const Content old = MakeContent(seed), next = MakeContent(seed + 100);
        ASSERT_TRUE(Save(posix, root, 10, old).ok());
        io::FaultInjectingFileSystem faulty(posix, n, crash, true);
        absl::Status s = Save(&faulty, root, 20, next);
        ASSERT_TRUE(faulty.fired()) << "op " << n;
        ++trials;
        int64_t step = -1;
        auto loaded = Load(root, &step);
        ASSERT_TRUE(loaded.ok()) << "seed " << seed << " op " << n << " crash " << crash << ": "
                                 << loaded.status() << " (save: " << s << ")";
        if (step == 10) {
          ++kept_old;
          EXPECT_FALSE(s.ok());
          ExpectSame(*loaded, old);
          // What the trainer does after a failed save: no partial ckpt-20 stays, ckpt-10 does.
          ASSERT_TRUE(io::AbandonCheckpoint(posix, root, 20).ok()) << "op " << n;
          EXPECT_FALSE(posix->Exists(root + "/" + io::CheckpointDirName(20))) << "op " << n;
          ASSERT_TRUE(Load(root, &step).ok()) << "op " << n;
          EXPECT_EQ(step, 10);
        } else {
          ASSERT_EQ(step, 20) << "op " << n;
          ExpectSame(*loaded, next);
        }
        // The next save (no faults) succeeds over whatever the interrupted one left.
        ASSERT_TRUE(Save(posix, root, 30, MakeContent(seed + 200)).ok()) << "op " << n;
        ASSERT_TRUE(Load(root, &step).ok());
        EXPECT_EQ(step, 30);
      }
    }
  }
  EXPECT_GT(kept_old, trials / 2);
}

}  // namespace
}  // namespace tessera
