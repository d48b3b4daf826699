// Inference bundles: names, the model spec text, commits, chains resolved base first, gaps and
// damaged manifests refused naming the export or file, the keep rule and abandoning.
#include "common/io/bundle.h"

#include <cstdlib>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/io/fault_injecting_file_system.h"
#include "common/io/file_system.h"
#include "gtest/gtest.h"

namespace tessera {
namespace io {
namespace {

std::string MakeTempDir(const std::string& prefix) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  std::string tmpl = absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/", prefix, "_XXXXXX");
  std::vector<char> buf(tmpl.begin(), tmpl.end());
  buf.push_back('\0');
  char* dir = ::mkdtemp(buf.data());
  EXPECT_NE(dir, nullptr) << tmpl;
  return dir == nullptr ? std::string() : std::string(dir);
}

BundleMeta Full(int64_t step) {
  BundleMeta m;
  m.step = step;
  m.base = step;
  m.num_pservers = 1;
  return m;
}

BundleMeta Delta(int64_t step, int64_t prev, int64_t base) {
  BundleMeta m;
  m.step = step;
  m.delta = true;
  m.prev = prev;
  m.base = base;
  m.num_pservers = 1;
  return m;
}

// Commits export `meta.step` under `root` with one pserver manifest and a model spec, then
// FinishExport with `keep`.
absl::Status Export(FileSystem* fs, const std::string& root, const BundleMeta& meta,
                    int keep = 100) {
  auto dir = BeginExport(fs, root, meta.step);
  if (!dir.ok()) return dir.status();
  const std::string pserver_manifest = PserverFilePrefix(0, 1) + ".MANIFEST";
  ManifestWriter pserver(fs, *dir);
  absl::Status s =
      pserver.WriteFile(BundleTableFileName(0, 1, "emb"), absl::StrCat("rows of ", meta.step));
  if (!s.ok()) return s;
  pserver.SetMeta("kind", meta.delta ? "delta" : "full");
  s = pserver.Commit(pserver_manifest);
  if (!s.ok()) return s;
  s = CommitExport(fs, *dir, meta, {{kModelSpecName, "loss l\n"}, {kDenseParamsName, "params"}},
                   {pserver_manifest});
  if (!s.ok()) return s;
  return FinishExport(fs, root, meta.step, keep);
}

std::vector<int64_t> Steps(const std::vector<BundleLink>& chain) {
  std::vector<int64_t> out;
  for (const auto& l : chain) out.push_back(l.meta.step);
  return out;
}

std::vector<int64_t> ExportsUnder(FileSystem* fs, const std::string& root) {
  std::vector<int64_t> out;
  auto names = fs->ListDir(root);
  EXPECT_TRUE(names.ok()) << names.status();
  if (!names.ok()) return out;
  for (const auto& n : *names) {
    if (ExportStep(n) >= 0) out.push_back(ExportStep(n));
  }
  return out;
}

void ExpectOneLine(const absl::Status& s) {
  EXPECT_EQ(s.message().find('\n'), absl::string_view::npos) << s;
}

TEST(BundleTest, Names) {
  EXPECT_EQ(ExportDirName(42), "export-0000000042");
  EXPECT_EQ(ExportStep("export-0000000042"), 42);
  EXPECT_EQ(ExportStep(ExportDirName(12345678901)), 12345678901);
  for (const char* bad : {"export-", "export-12a", "ckpt-0000000042", "export--1", "x"}) {
    EXPECT_EQ(ExportStep(bad), -1) << bad;
  }
  for (bool delta : {false, true}) {
    const std::string name = ExportRequestName(7, delta);
    EXPECT_EQ(name, delta ? "export-0000000007:delta" : "export-0000000007:full");
    int64_t step = -1;
    bool d = !delta;
    ASSERT_TRUE(ParseExportRequestName(name, &step, &d)) << name;
    EXPECT_EQ(step, 7);
    EXPECT_EQ(d, delta);
  }
  int64_t step;
  bool delta;
  for (const char* bad : {"export-0000000007", "export-0000000007:", "export-0000000007:other",
                          "ckpt-0000000007:full", ":full", "export-x:delta"}) {
    EXPECT_FALSE(ParseExportRequestName(bad, &step, &delta)) << bad;
  }
  EXPECT_EQ(BundleTableFileName(1, 3, "emb"), "pserver-1-of-3.emb.tbl");
}

TEST(BundleTest, MetaRoundTripAndValidation) {
  for (const BundleMeta& meta : {Full(10), Delta(30, 20, 10)}) {
    Manifest m;
    PutBundleMeta(meta, &m);
    auto back = GetBundleMeta(m, "/r/MANIFEST");
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(back->step, meta.step);
    EXPECT_EQ(back->delta, meta.delta);
    EXPECT_EQ(back->prev, meta.prev);
    EXPECT_EQ(back->base, meta.base);
    EXPECT_EQ(back->num_pservers, meta.num_pservers);
    EXPECT_EQ(back->table_shard_method, "hash");
  }
  struct Case {
    std::string key, value;
  };
  // Each change to a good delta's meta, and the key its error must name.
  for (const Case& c : std::vector<Case>{{"kind", "half"},
                                         {"step", "x"},
                                         {"prev", "30"},
                                         {"prev", ""},
                                         {"base", "25"},
                                         {"num_pservers", "-1"},
                                         {"table_shard_method", ""}}) {
    Manifest m;
    PutBundleMeta(Delta(30, 20, 10), &m);
    if (c.value.empty()) {
      m.meta.erase(c.key);
    } else {
      m.meta[c.key] = c.value;
    }
    auto r = GetBundleMeta(m, "/r/export-0000000030/MANIFEST");
    ASSERT_FALSE(r.ok()) << c.key << "=" << c.value;
    EXPECT_TRUE(absl::StrContains(r.status().message(), "/r/export-0000000030/MANIFEST"))
        << r.status();
    EXPECT_TRUE(absl::StrContains(r.status().message(), c.key)) << r.status();
    ExpectOneLine(r.status());
  }
  Manifest full;
  PutBundleMeta(Full(10), &full);
  full.meta["base"] = "5";
  auto r = GetBundleMeta(full, "/r/MANIFEST");
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(absl::StrContains(r.status().message(), "'base'")) << r.status();
}

BundleModel SampleModel() {
  BundleModel m;
  m.prediction = "p";
  m.loss = "l";
  m.metrics = {"auc", "logloss"};
  m.feeds.dense = "dense";
  m.feeds.num_dense = 13;
  m.feeds.slots = {{"C1", 1000}, {"C2", 0}, {"C0", 7}};
  m.feeds.multi_slots = {{"tags", 50}};
  m.feeds.label = "label";
  m.feeds.label_dtype = INT64;
  m.batch_size = 512;
  m.data_format = "criteo";
  m.float_dense = true;
  m.csv_columns = "label=click,dense=a:b";
  return m;
}

TEST(BundleTest, ModelRoundTrip) {
  for (const BundleModel& model : {SampleModel(), BundleModel()}) {
    auto text = SerializeBundleModel(model);
    ASSERT_TRUE(text.ok()) << text.status();
    auto back = ParseBundleModel(*text, "/r/model.spec");
    ASSERT_TRUE(back.ok()) << back.status() << "\n" << *text;
    EXPECT_EQ(back->prediction, model.prediction);
    EXPECT_EQ(back->loss, model.loss);
    EXPECT_EQ(back->metrics, model.metrics);
    EXPECT_EQ(back->feeds.dense, model.feeds.dense);
    EXPECT_EQ(back->feeds.num_dense, model.feeds.num_dense);
    ASSERT_EQ(back->feeds.slots.size(), model.feeds.slots.size());
    for (size_t i = 0; i < model.feeds.slots.size(); ++i) {
      EXPECT_EQ(back->feeds.slots[i].name, model.feeds.slots[i].name);
      EXPECT_EQ(back->feeds.slots[i].dict_size, model.feeds.slots[i].dict_size);
    }
    ASSERT_EQ(back->feeds.multi_slots.size(), model.feeds.multi_slots.size());
    for (size_t i = 0; i < model.feeds.multi_slots.size(); ++i) {
      EXPECT_EQ(back->feeds.multi_slots[i].name, model.feeds.multi_slots[i].name);
      EXPECT_EQ(back->feeds.multi_slots[i].dict_size, model.feeds.multi_slots[i].dict_size);
    }
    EXPECT_EQ(back->feeds.label, model.feeds.label);
    EXPECT_EQ(back->feeds.label_dtype, model.feeds.label_dtype);
    EXPECT_EQ(back->batch_size, model.batch_size);
    EXPECT_EQ(back->data_format, model.data_format);
    EXPECT_EQ(back->float_dense, model.float_dense);
    EXPECT_EQ(back->csv_columns, model.csv_columns);
  }
  auto text = SerializeBundleModel(SampleModel());
  ASSERT_TRUE(text.ok());
  EXPECT_TRUE(absl::StrContains(*text, "slot C1 1000\nslot C2 0\nslot C0 7\n")) << *text;
  EXPECT_TRUE(absl::StrContains(*text, "label label int64\n")) << *text;
  auto empty = SerializeBundleModel(BundleModel());
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ(*empty, "batch_size 256\nfloat_dense 0\n");
}

TEST(BundleTest, ModelWhitespaceIsRefused) {
  BundleModel m = SampleModel();
  m.feeds.slots[1].name = "C 2";
  auto r = SerializeBundleModel(m);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StrContains(r.status().message(), "'C 2'")) << r.status();
  m = SampleModel();
  m.csv_columns = "a,\nb";
  r = SerializeBundleModel(m);
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(absl::StrContains(r.status().message(), "csv_columns")) << r.status();
  m = SampleModel();
  m.feeds.label_dtype = INT32;
  r = SerializeBundleModel(m);
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(absl::StrContains(r.status().message(), "label")) << r.status();
}

TEST(BundleTest, ModelBadLinesNamePathAndLine) {
  struct Case {
    std::string text, want;
  };
  for (const Case& c : std::vector<Case>{
           {"loss l\nbogus 1\n", "line 2: unknown key 'bogus'"},
           {"loss l\nloss m\n", "line 2: 'loss' given twice"},
           {"slot C1\n", "line 1"},
           {"slot C1 -3\n", "'-3'"},
           {"\n\ndense d x\n", "line 3"},
           {"label y float16\n", "'float16'"},
           {"batch_size 0\n", "batch_size '0'"},
           {"float_dense yes\n", "'yes'"},
           {"loss\n", "line 1"},
           {"prediction a b\n", "line 1"},
       }) {
    auto r = ParseBundleModel(c.text, "/r/export-0000000001/model.spec");
    ASSERT_FALSE(r.ok()) << c.text;
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
    EXPECT_TRUE(absl::StrContains(r.status().message(), "/r/export-0000000001/model.spec"))
        << r.status();
    EXPECT_TRUE(absl::StrContains(r.status().message(), c.want))
        << "want '" << c.want << "' in: " << r.status();
    ExpectOneLine(r.status());
  }
}

TEST(BundleTest, CommitAndResolveFull) {
  FileSystem* fs = PosixFileSystem::Default();
  const std::string root = MakeTempDir("bundle_full");
  ASSERT_TRUE(Export(fs, root, Full(10)).ok());
  EXPECT_EQ(*fs->ReadFile(JoinPath(root, kLatestName)), "export-0000000010\n");
  for (const std::string& path : {root, root + "/", JoinPath(root, ExportDirName(10)),
                                  JoinPath(root, ExportDirName(10)) + "/"}) {
    auto chain = ResolveBundle(fs, path);
    ASSERT_TRUE(chain.ok()) << path << ": " << chain.status();
    ASSERT_EQ(chain->size(), 1u);
    const BundleLink& link = (*chain)[0];
    EXPECT_EQ(link.meta.step, 10);
    EXPECT_FALSE(link.meta.delta);
    EXPECT_EQ(link.meta.num_pservers, 1);
    EXPECT_TRUE(absl::EndsWith(link.dir, ExportDirName(10))) << link.dir;
    for (const std::string& name : {std::string(kModelSpecName), std::string(kDenseParamsName),
                                    PserverFilePrefix(0, 1) + ".MANIFEST"}) {
      const ManifestEntry* e = link.manifest.Find(name);
      ASSERT_NE(e, nullptr) << name;
      EXPECT_TRUE(ReadVerified(fs, link.dir, *e).ok()) << name;
    }
    EXPECT_EQ(*ReadVerified(fs, link.dir, *link.manifest.Find(kModelSpecName)), "loss l\n");
  }
  // Nothing there: NotFound naming the path.
  const std::string empty = MakeTempDir("bundle_empty");
  auto none = ResolveBundle(fs, empty);
  ASSERT_FALSE(none.ok());
  EXPECT_EQ(none.status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(absl::StrContains(none.status().message(), empty)) << none.status();
  auto missing = ResolveBundle(fs, empty + "/nope");
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(absl::StrContains(missing.status().message(), empty + "/nope")) << missing.status();
  // A bad meta is refused before anything is written.
  auto dir = BeginExport(fs, root, 20);
  ASSERT_TRUE(dir.ok());
  absl::Status bad = CommitExport(fs, *dir, Delta(20, 20, 10), {}, {});
  EXPECT_EQ(bad.code(), absl::StatusCode::kInvalidArgument) << bad;
  EXPECT_TRUE(absl::StrContains(bad.message(), "'prev'")) << bad;
  EXPECT_FALSE(fs->Exists(JoinPath(*dir, kManifestName)));
}

TEST(BundleTest, ChainResolvesBaseFirst) {
  FileSystem* fs = PosixFileSystem::Default();
  const std::string root = MakeTempDir("bundle_chain");
  ASSERT_TRUE(Export(fs, root, Full(10)).ok());
  ASSERT_TRUE(Export(fs, root, Delta(20, 10, 10)).ok());
  ASSERT_TRUE(Export(fs, root, Delta(30, 20, 10)).ok());
  auto chain = ResolveBundle(fs, root);
  ASSERT_TRUE(chain.ok()) << chain.status();
  EXPECT_EQ(Steps(*chain), (std::vector<int64_t>{10, 20, 30}));
  EXPECT_EQ((*chain)[0].dir, JoinPath(root, ExportDirName(10)));
  EXPECT_EQ((*chain)[2].dir, JoinPath(root, ExportDirName(30)));
  // A middle export named directly: its chain only.
  chain = ResolveBundle(fs, JoinPath(root, ExportDirName(20)));
  ASSERT_TRUE(chain.ok()) << chain.status();
  EXPECT_EQ(Steps(*chain), (std::vector<int64_t>{10, 20}));
  // An incomplete newer export (a failed attempt) is skipped.
  ASSERT_TRUE(BeginExport(fs, root, 40).ok());
  chain = ResolveBundle(fs, root);
  ASSERT_TRUE(chain.ok()) << chain.status();
  EXPECT_EQ(Steps(*chain), (std::vector<int64_t>{10, 20, 30}));
}

TEST(BundleTest, GapIsRefusedNamingTheMissingExport) {
  FileSystem* fs = PosixFileSystem::Default();
  for (bool incomplete : {false, true}) {
    const std::string root = MakeTempDir("bundle_gap");
    ASSERT_TRUE(Export(fs, root, Full(10)).ok());
    ASSERT_TRUE(Export(fs, root, Delta(20, 10, 10)).ok());
    ASSERT_TRUE(Export(fs, root, Delta(30, 20, 10)).ok());
    const std::string middle = JoinPath(root, ExportDirName(20));
    ASSERT_TRUE(fs->DeleteRecursively(incomplete ? JoinPath(middle, kManifestName) : middle).ok());
    auto chain = ResolveBundle(fs, root);
    ASSERT_FALSE(chain.ok());
    EXPECT_EQ(chain.status().code(), absl::StatusCode::kFailedPrecondition) << chain.status();
    EXPECT_TRUE(absl::StrContains(chain.status().message(),
                                  "export-0000000030 is a delta on export-0000000020, which is "
                                  "missing or incomplete (a gap in the delta chain)"))
        << chain.status();
    ExpectOneLine(chain.status());
  }
}

TEST(BundleTest, LinkOfAnotherChainIsRefused) {
  FileSystem* fs = PosixFileSystem::Default();
  const std::string root = MakeTempDir("bundle_other");
  ASSERT_TRUE(Export(fs, root, Full(10)).ok());
  ASSERT_TRUE(Export(fs, root, Delta(20, 10, 10)).ok());
  ASSERT_TRUE(Export(fs, root, Delta(30, 20, 10)).ok());
  ASSERT_TRUE(Export(fs, root, Full(20)).ok());  // export-20 redone as a full export
  auto chain = ResolveBundle(fs, JoinPath(root, ExportDirName(30)));
  ASSERT_FALSE(chain.ok());
  EXPECT_EQ(chain.status().code(), absl::StatusCode::kFailedPrecondition) << chain.status();
  EXPECT_TRUE(absl::StrContains(chain.status().message(), "export-0000000030")) << chain.status();
  EXPECT_TRUE(absl::StrContains(chain.status().message(), "export-0000000020")) << chain.status();
}

TEST(BundleTest, DamagedManifestIsDataLossNamingIt) {
  FileSystem* fs = PosixFileSystem::Default();
  for (int64_t damaged : {30, 10}) {  // the newest, then a link of its chain
    const std::string root = MakeTempDir("bundle_damaged");
    ASSERT_TRUE(Export(fs, root, Full(10)).ok());
    ASSERT_TRUE(Export(fs, root, Delta(20, 10, 10)).ok());
    ASSERT_TRUE(Export(fs, root, Delta(30, 20, 10)).ok());
    const std::string path = JoinPath(JoinPath(root, ExportDirName(damaged)), kManifestName);
    std::string text = *fs->ReadFile(path);
    text[text.size() / 2] ^= 0x20;
    ASSERT_TRUE(WriteFileAtomic(fs, path, text).ok());
    auto chain = ResolveBundle(fs, root);
    ASSERT_FALSE(chain.ok());
    EXPECT_EQ(chain.status().code(), absl::StatusCode::kDataLoss) << chain.status();
    EXPECT_TRUE(absl::StrContains(chain.status().message(), path)) << chain.status();
    ExpectOneLine(chain.status());
  }
}

TEST(BundleTest, FinishKeepsTheChainsOfTheKeptExports) {
  FileSystem* fs = PosixFileSystem::Default();
  const std::string root = MakeTempDir("bundle_keep");
  // An older chain 10 <- 20, then 30 <- 40 <- 50; an incomplete leftover at 25.
  ASSERT_TRUE(Export(fs, root, Full(10)).ok());
  ASSERT_TRUE(Export(fs, root, Delta(20, 10, 10)).ok());
  ASSERT_TRUE(Export(fs, root, Full(30)).ok());
  ASSERT_TRUE(Export(fs, root, Delta(40, 30, 30)).ok());
  ASSERT_TRUE(Export(fs, root, Delta(50, 40, 30)).ok());
  // A newer export (committed by a later attempt) is not FinishExport(50)'s to judge.
  ASSERT_TRUE(Export(fs, root, Full(60)).ok());
  ASSERT_TRUE(BeginExport(fs, root, 25).ok());
  EXPECT_EQ(ExportsUnder(fs, root), (std::vector<int64_t>{10, 20, 25, 30, 40, 50, 60}));
  ASSERT_TRUE(FinishExport(fs, root, 50, 1).ok());
  EXPECT_EQ(ExportsUnder(fs, root), (std::vector<int64_t>{30, 40, 50, 60}));
  EXPECT_EQ(*fs->ReadFile(JoinPath(root, kLatestName)), "export-0000000050\n");
  auto chain = ResolveBundle(fs, JoinPath(root, ExportDirName(50)));
  ASSERT_TRUE(chain.ok()) << chain.status();
  EXPECT_EQ(Steps(*chain), (std::vector<int64_t>{30, 40, 50}));
  // keep 2 at 60: 60 and 50, with 50's chain.
  ASSERT_TRUE(FinishExport(fs, root, 60, 2).ok());
  EXPECT_EQ(ExportsUnder(fs, root), (std::vector<int64_t>{30, 40, 50, 60}));
  // keep 1 (and 0, read as 1) at 60: only the full 60.
  ASSERT_TRUE(FinishExport(fs, root, 60, 0).ok());
  EXPECT_EQ(ExportsUnder(fs, root), (std::vector<int64_t>{60}));
}

TEST(BundleTest, AbandonRemovesOnlyAnIncompleteExport) {
  FileSystem* fs = PosixFileSystem::Default();
  const std::string root = MakeTempDir("bundle_abandon");
  ASSERT_TRUE(Export(fs, root, Full(10)).ok());
  auto dir = BeginExport(fs, root, 20);
  ASSERT_TRUE(dir.ok());
  ASSERT_TRUE(WriteFileAtomic(fs, JoinPath(*dir, "pserver-0-of-1.emb.tbl"), "partial").ok());
  ASSERT_TRUE(AbandonExport(fs, root, 20).ok());
  EXPECT_FALSE(fs->Exists(*dir));
  ASSERT_TRUE(AbandonExport(fs, root, 10).ok());
  EXPECT_TRUE(fs->Exists(JoinPath(JoinPath(root, ExportDirName(10)), kManifestName)));
  ASSERT_TRUE(AbandonExport(fs, root, 99).ok());  // absent: nothing to do
  // BeginExport over an incomplete leftover empties it.
  dir = BeginExport(fs, root, 30);
  ASSERT_TRUE(dir.ok());
  ASSERT_TRUE(WriteFileAtomic(fs, JoinPath(*dir, "stale"), "x").ok());
  dir = BeginExport(fs, root, 30);
  ASSERT_TRUE(dir.ok());
  EXPECT_FALSE(fs->Exists(JoinPath(*dir, "stale")));
}

// An export interrupted at every file operation (a process that died there) is never seen as
// complete, and the export before it still resolves.
TEST(BundleTest, InterruptedExportLeavesThePreviousOneResolvable) {
  FileSystem* posix = PosixFileSystem::Default();
  for (int64_t fail_at = 1;; ++fail_at) {
    const std::string root = MakeTempDir("bundle_fault");
    ASSERT_TRUE(Export(posix, root, Full(10)).ok());
    FaultInjectingFileSystem fs(posix, fail_at, /*crash=*/true, /*skip_sync=*/true);
    absl::Status s = Export(&fs, root, Delta(20, 10, 10), 1);
    auto chain = ResolveBundle(posix, root);
    ASSERT_TRUE(chain.ok()) << "fail_at " << fail_at << ": " << chain.status();
    if (s.ok()) {
      EXPECT_FALSE(fs.fired());
      EXPECT_EQ(Steps(*chain), (std::vector<int64_t>{10, 20}));
      break;
    }
    // Either the old export, or the new one when only LATEST or the pruning failed.
    EXPECT_TRUE(Steps(*chain) == std::vector<int64_t>{10} ||
                Steps(*chain) == (std::vector<int64_t>{10, 20}))
        << "fail_at " << fail_at;
    ASSERT_LT(fail_at, 200) << "the export never succeeded";
  }
}

}  // namespace
}  // namespace io
}  // namespace tessera
