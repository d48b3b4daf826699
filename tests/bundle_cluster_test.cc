// Inference bundles from real daemons (tessera_pserver and tessera_trainer on loopback, free
// ports, every process killed by pid): a chain of a full export and three deltas (tables placed
// whole) loads to exactly the rows of a full export at the same step (tables split), and
// tessera_predict's scoring of the bundle equals the trainer's own held-out evaluation.
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/io/bundle.h"
#include "common/io/file_system.h"
#include "examples/registry.h"
#include "gtest/gtest.h"
#include "pserver/bundle_tables.h"
#include "serving/predictor.h"
#include "tests/cluster_util.h"
#include "tests/equivalence_util.h"

namespace tessera {
namespace {

// The number after " <key> " in a log line (nan if absent).
double LogValue(const std::string& line, const std::string& key) {
  const size_t pos = line.find(" " + key + " ");
  return pos == std::string::npos ? std::nan("")
                                  : std::strtod(line.c_str() + pos + key.size() + 2, nullptr);
}

// Every row of every table, as (table, id) -> values.
std::map<std::pair<std::string, int64_t>, std::vector<float>> Rows(const BundleTables& tables) {
  std::map<std::pair<std::string, int64_t>, std::vector<float>> rows;
  for (const auto& [name, table] : tables) {
    const std::string bytes = table->ExportBytes(SparseTableExportOptions{});
    const int64_t dim = table->options().dim;
    const size_t record = 8 + 4 * static_cast<size_t>(dim) + 4;
    for (size_t at = sparse_table_format::kHeaderBytes; at + record <= bytes.size(); at += record) {
      int64_t id;
      std::memcpy(&id, bytes.data() + at, 8);
      std::vector<float> v(static_cast<size_t>(dim));
      std::memcpy(v.data(), bytes.data() + at + 8, 4 * v.size());
      rows[{name, id}] = std::move(v);
    }
  }
  return rows;
}

BundleTables LoadTables(const std::string& path) {
  io::FileSystem* fs = io::PosixFileSystem::Default();
  auto chain = io::ResolveBundle(fs, path);
  EXPECT_TRUE(chain.ok()) << chain.status();
  if (!chain.ok()) return {};
  auto tables = LoadBundleTables(fs, *chain, BundleTablesOptions{});
  EXPECT_TRUE(tables.ok()) << tables.status();
  return tables.ok() ? std::move(*tables) : BundleTables{};
}

// Every export of a sync job is the state after its step. A lookup creates a row too, and other
// trainers' lookups (the held-out evaluation after the last step) may run beside trainer 0's
// last export, so the jobs compared row for row have no held-out data.
std::vector<std::string> JobFlags(const examples::ExampleOptions& eo, const std::string& dir,
                                  int full_every) {
  // 16 steps of 128; exports at steps 4, 8, 12 and 16; rows unseen for 3 steps are evicted, so
  // the deltas carry tombstones.
  std::vector<std::string> flags = ExampleFlags(eo, 128, 1);
  flags.push_back("--export_dir=" + dir + "/exports");
  flags.push_back("--export_every_steps=4");
  flags.push_back(absl::StrCat("--export_full_every=", full_every));
  flags.push_back("--export_keep=10");
  flags.push_back("--table_evict_after_steps=3");
  return flags;
}

examples::ExampleOptions Ctr(int64_t test_examples) {
  examples::ExampleOptions eo;
  eo.name = "ctr";
  eo.num_examples = 2048;
  eo.num_test_examples = test_examples;
  eo.seed = 6;
  eo.vocab_per_slot = 2000;
  return eo;
}

// The job exporting deltas holds each table whole on one pserver (--table_placement=
// table_wise) and a slot's two tables as one (--fuse_tables, the default: one delta cut for
// both), the one exporting fulls splits every table over both and holds each apart: the same
// training, so the same rows, whichever pserver and pserver table exported them.
TEST(BundleClusterTest, BaseAndThreeDeltasLoadToTheRowsOfAFullExport) {
  const examples::ExampleOptions eo = Ctr(0);
  const std::string deltas = MakeTempDir("bundle_deltas"), fulls = MakeTempDir("bundle_fulls");
  PsJob job;
  job.example = "ctr";
  job.flags = JobFlags(eo, deltas, 4);
  job.flags.push_back("--table_placement=table_wise");
  RunPsJob(job, deltas);
  if (HasFailure()) return;
  job.flags = JobFlags(eo, fulls, 1);
  job.flags.push_back("--nofuse_tables");
  RunPsJob(job, fulls);
  if (HasFailure()) return;

  io::FileSystem* fs = io::PosixFileSystem::Default();
  auto chain = io::ResolveBundle(fs, deltas + "/exports");
  ASSERT_TRUE(chain.ok()) << chain.status();
  ASSERT_EQ(chain->size(), 4u);
  EXPECT_FALSE((*chain)[0].meta.delta);
  EXPECT_EQ((*chain)[0].meta.step, 4);
  for (size_t i = 1; i < chain->size(); ++i) {
    EXPECT_TRUE((*chain)[i].meta.delta);
    EXPECT_EQ((*chain)[i].meta.prev, (*chain)[i - 1].meta.step);
  }
  EXPECT_EQ(chain->back().meta.step, 16);

  // Base + 3 deltas == the other job's full export of step 16, row for row, bit for bit.
  auto full_chain = io::ResolveBundle(fs, fulls + "/exports");
  ASSERT_TRUE(full_chain.ok()) << full_chain.status();
  ASSERT_EQ(full_chain->size(), 1u);
  EXPECT_EQ(full_chain->back().meta.step, 16);
  const auto got = Rows(LoadTables(deltas + "/exports"));
  const auto want = Rows(LoadTables(fulls + "/exports"));
  ASSERT_FALSE(want.empty());
  EXPECT_EQ(got.size(), want.size());
  size_t differing = 0;
  for (const auto& [key, values] : want) {
    auto it = got.find(key);
    if (it == got.end() || std::memcmp(it->second.data(), values.data(), 4 * values.size()) != 0) {
      ++differing;
    }
  }
  EXPECT_EQ(differing, 0u);
  // The deltas did carry evictions: rows of the base are gone at step 16.
  const auto base_only = Rows(LoadTables((*chain)[0].dir));
  size_t gone = 0;
  for (const auto& [key, values] : base_only) gone += want.count(key) == 0 ? 1 : 0;
  EXPECT_GT(gone, 0u) << "no row of the base export was evicted by step 16";
}

TEST(BundleClusterTest, PredictOnTheBundleEqualsTheTrainersHeldOutEvaluation) {
  const examples::ExampleOptions eo = Ctr(301);
  const std::string dir = MakeTempDir("bundle_predict");
  PsJob job;
  job.example = "ctr";
  job.flags = JobFlags(eo, dir, 4);
  RunPsJob(job, dir);
  if (HasFailure()) return;
  io::FileSystem* fs = io::PosixFileSystem::Default();
  auto chain = io::ResolveBundle(fs, dir + "/exports");
  ASSERT_TRUE(chain.ok()) << chain.status();
  ASSERT_EQ(chain->size(), 4u);

  // tessera_predict's scoring of the bundle == the trainer's held-out evaluation at step 16.
  std::string eval_line;
  for (absl::string_view line : absl::StrSplit(ReadFileOrEmpty(dir + "/trainer.0.log"), '\n')) {
    if (absl::StrContains(line, "held-out loss")) eval_line = std::string(line);
  }
  ASSERT_NE(eval_line.find("on 301 examples at step 16"), std::string::npos) << eval_line;
  auto data = examples::LoadExampleData(eo);
  ASSERT_TRUE(data.ok()) << data.status();
  auto predictor = Predictor::Load(fs, dir + "/exports", PredictorOptions{});
  ASSERT_TRUE(predictor.ok()) << predictor.status();
  int64_t predictions = 0;
  auto scored = (*predictor)->Score(data->test, [&](const data::Example&, double p) {
    EXPECT_TRUE(p >= 0 && p <= 1) << p;
    ++predictions;
  });
  ASSERT_TRUE(scored.ok()) << scored.status();
  EXPECT_EQ(predictions, 301);
  ASSERT_TRUE(scored->eval.has_auc);
  EXPECT_NEAR(scored->eval.auc, LogValue(eval_line, "auc"), 1e-6) << eval_line;
  EXPECT_NEAR(scored->eval.mean_loss, LogValue(eval_line, "loss"), 1e-6) << eval_line;

  // A damaged table file of the chain is one DataLoss line naming it.
  const io::BundleLink& last = chain->back();
  auto pserver_manifest =
      io::ReadManifest(fs, last.dir + "/" + io::PserverFilePrefix(1, 2) + ".MANIFEST");
  ASSERT_TRUE(pserver_manifest.ok()) << pserver_manifest.status();
  std::string table_file;
  for (const auto& e : pserver_manifest->files) {
    if (absl::EndsWith(e.name, ".tbl") && e.size > 100) table_file = e.name;
  }
  ASSERT_FALSE(table_file.empty());
  const std::string path = last.dir + "/" + table_file;
  auto bytes = fs->ReadFile(path);
  ASSERT_TRUE(bytes.ok());
  std::string damaged = *bytes;
  damaged[damaged.size() / 2] ^= 1;
  ASSERT_TRUE(io::WriteFileAtomic(fs, path, damaged).ok());
  auto broken = Predictor::Load(fs, dir + "/exports", PredictorOptions{});
  ASSERT_FALSE(broken.ok());
  EXPECT_EQ(broken.status().code(), absl::StatusCode::kDataLoss) << broken.status();
  EXPECT_NE(broken.status().message().find(table_file), std::string::npos) << broken.status();
  EXPECT_EQ(std::string(broken.status().message()).find('\n'), std::string::npos);
}

}  // namespace
}  // namespace tessera
