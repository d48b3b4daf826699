#include "serving/predictor.h"

#include <stdlib.h>

#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/framework/executor.h"
#include "common/io/bundle.h"
#include "common/ops/ops.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "serving/test_bundle.h"
#include "trainer/local_trainer.h"

namespace tessera {
namespace {

using ::testing::HasSubstr;

constexpr int64_t kVocab = 40;
constexpr int64_t kDim = 4;

std::string TempDir() {
  std::string dir = absl::StrCat(::testing::TempDir(), "/predictor_test_XXXXXX");
  EXPECT_NE(mkdtemp(dir.data()), nullptr);
  return dir;
}

// Flips one byte in the middle of `path` (its size stays).
void FlipByte(const std::string& path) {
  std::string bytes;
  {
    std::ifstream in(path, std::ios::binary);
    ASSERT_TRUE(in.good()) << path;
    bytes.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  ASSERT_FALSE(bytes.empty()) << path;
  bytes[bytes.size() / 2] ^= 0x10;
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
  ASSERT_TRUE(out.good()) << path;
}

class PredictorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = TempDir();
    registry_ = NewStandardOpRegistry();
    TestModelOptions mo;
    mo.vocab = kVocab;
    mo.dim = kDim;
    model_ = BuildTestModel(mo);
    Executor executor(registry_.get());
    ASSERT_TRUE(executor.Run(model_.startup, 0, &params_).ok());
    auto table = MakeTestTable(kVocab, kDim);
    ASSERT_TRUE(table.ok()) << table.status();
    table_ = *std::move(table);
  }

  std::string WriteBundle(const TestBundleOptions& options = {}) {
    auto dir = WriteTestBundle(fs_, root_, model_, params_, table_.get(), options);
    EXPECT_TRUE(dir.ok()) << dir.status();
    return dir.value_or("");
  }

  // Row `id` as the exported table serves it: the trained row, or a fresh table's initial one.
  std::vector<float> Row(int64_t id) {
    std::vector<float> row(kDim);
    if (table_->PeekRow(id, row.data())) return row;
    auto fresh = SparseTable::Create(TestTableOptions(kDim));
    EXPECT_TRUE(fresh.ok());
    EXPECT_TRUE((*fresh)->Lookup({id}, row.data()).ok());
    return row;
  }

  // The same model in a LocalTrainer, with the table a dense [rows, dim] parameter of `rows`.
  std::unique_ptr<LocalTrainer> Reference(const std::vector<std::vector<float>>& rows,
                                          int64_t batch_size) {
    TestModelOptions mo;
    mo.vocab = static_cast<int64_t>(rows.size());
    mo.dim = kDim;
    mo.distributed = false;
    ModelSpec model = BuildTestModel(mo);
    LocalTrainerOptions o;
    o.batch_size = batch_size;
    o.shuffle = false;
    o.log_every_steps = 0;
    auto trainer = LocalTrainer::Create(registry_.get(), model, o);
    EXPECT_TRUE(trainer.ok()) << trainer.status();
    if (!trainer.ok()) return nullptr;
    Scope* scope = (*trainer)->scope();
    for (const std::string& name : {"hidden.w", "hidden.b", "logit.w", "logit.b"}) {
      const Variable* v = params_.FindVar(name);
      EXPECT_NE(v, nullptr) << name;
      if (v != nullptr) scope->Var(name)->GetMutable<Tensor>()->CopyFrom(v->Get<Tensor>());
    }
    Tensor* w = scope->Var(kTestTable)->GetMutable<Tensor>();
    w->Resize(FLOAT32, {static_cast<int64_t>(rows.size()), kDim});
    for (size_t r = 0; r < rows.size(); ++r) {
      for (int64_t j = 0; j < kDim; ++j) w->data<float>()[r * kDim + j] = rows[r][j];
    }
    return *std::move(trainer);
  }

  // Expects the predictor's predictions and results on `data` to equal the reference's on
  // `reference_data` (the same examples, ids mapped into the dense table).
  void ExpectSameScores(Predictor* predictor, const data::Dataset& data, LocalTrainer* reference,
                        const data::Dataset& reference_data) {
    std::vector<double> got, want;
    auto stats = predictor->Score(data, [&](const data::Example&, double p) { got.push_back(p); });
    ASSERT_TRUE(stats.ok()) << stats.status();
    const int64_t n = static_cast<int64_t>(reference_data.examples.size());
    auto partial = reference->EvaluatePartial(
        reference_data, 0, n, [&](const data::Example&, double p) { want.push_back(p); });
    ASSERT_TRUE(partial.ok()) << partial.status();
    const EvalResult expected = partial->Result();
    EXPECT_EQ(stats->eval.samples, n);
    EXPECT_NEAR(stats->eval.mean_loss, expected.mean_loss, 1e-6);
    ASSERT_TRUE(expected.has_auc);
    ASSERT_TRUE(stats->eval.has_auc);
    EXPECT_NEAR(stats->eval.auc, expected.auc, 1e-6);
    EXPECT_GT(stats->seconds, 0);
    EXPECT_GT(stats->examples_per_sec, 0);
    ASSERT_EQ(got.size(), want.size());
    ASSERT_EQ(static_cast<int64_t>(got.size()), n);
    for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-6) << "example " << i;
  }

  io::FileSystem* fs_ = io::PosixFileSystem::Default();
  std::string root_;
  std::unique_ptr<OpRegistry> registry_;
  ModelSpec model_;
  Scope params_;
  std::unique_ptr<SparseTable> table_;
};

TEST_F(PredictorTest, ScoresAsTheTrainerWithADenseTable) {
  WriteBundle();
  auto predictor = Predictor::Load(fs_, root_, PredictorOptions{});
  ASSERT_TRUE(predictor.ok()) << predictor.status();
  Predictor& p = **predictor;
  EXPECT_EQ(p.batch_size(), 16);
  EXPECT_EQ(p.meta().step, 42);
  EXPECT_EQ(p.export_name(), "export-0000000042");
  // The lookup reads the loaded table; the table is no variable of the program.
  const BlockDesc& block = p.program().blocks(0);
  EXPECT_EQ(FindVarDesc(block, kTestTable), nullptr);
  int lookups = 0;
  for (const OpDesc& op : block.ops()) {
    EXPECT_NE(op.type(), "lookup_table");
    lookups += op.type() == kBundleLookupOp;
  }
  EXPECT_EQ(lookups, 1);

  std::vector<int64_t> ids;
  std::vector<std::vector<float>> rows;
  for (int64_t id = 0; id < kVocab; ++id) {
    ids.push_back((id * 7) % kVocab);
    rows.push_back(Row(id));
  }
  // 203 examples: batches of 16 and a last one of 11.
  const data::Dataset data = MakeTestData(203, ids, 5);
  auto reference = Reference(rows, 16);
  ASSERT_NE(reference, nullptr);
  ExpectSameScores(&p, data, reference.get(), data);

  // Another batch size, as the trainer would evaluate with it.
  PredictorOptions o;
  o.batch_size = 7;
  auto batched = Predictor::Load(fs_, root_, o);
  ASSERT_TRUE(batched.ok()) << batched.status();
  EXPECT_EQ((*batched)->batch_size(), 7);
  auto reference7 = Reference(rows, 7);
  ASSERT_NE(reference7, nullptr);
  ExpectSameScores(batched->get(), data, reference7.get(), data);
}

TEST_F(PredictorTest, UnexportedIdsGetTheTablesInitialValuesAndCreateNoRow) {
  WriteBundle();
  auto predictor = Predictor::Load(fs_, root_ + "/" + io::ExportDirName(42), PredictorOptions{});
  ASSERT_TRUE(predictor.ok()) << predictor.status();
  const SparseTable& loaded = *(*predictor)->tables().at(kTestTable);
  const int64_t held = loaded.Size();
  EXPECT_EQ(held, kVocab / 2);

  // Ids the table never held (above kVocab / 2, beyond the vocabulary, negative), and held ones.
  const std::vector<int64_t> ids = {kVocab - 1, 1000003, -7, int64_t{1} << 60, 3, kVocab + 5};
  std::vector<std::vector<float>> rows;
  std::vector<int64_t> dense_ids;
  for (int64_t id : ids) {
    dense_ids.push_back(static_cast<int64_t>(rows.size()));
    rows.push_back(Row(id));
  }
  // The unheld rows are a fresh table's (SparseTable::Lookup), not zeros.
  std::vector<float> fresh_row(kDim);
  auto fresh = SparseTable::Create(TestTableOptions(kDim));
  ASSERT_TRUE(fresh.ok());
  ASSERT_TRUE((*fresh)->Lookup({int64_t{1000003}}, fresh_row.data()).ok());
  EXPECT_EQ(rows[1], fresh_row);
  EXPECT_NE(fresh_row, std::vector<float>(kDim, 0.0f));

  const data::Dataset data = MakeTestData(60, ids, 9);
  const data::Dataset dense_data = MakeTestData(60, dense_ids, 9);
  auto reference = Reference(rows, 16);
  ASSERT_NE(reference, nullptr);
  ExpectSameScores(predictor->get(), data, reference.get(), dense_data);
  EXPECT_EQ(loaded.Size(), held);  // scoring created no row
}

TEST_F(PredictorTest, DamagedDenseParamsIsDataLossNamingTheFile) {
  const std::string dir = WriteBundle();
  FlipByte(dir + "/" + io::kDenseParamsName);
  auto predictor = Predictor::Load(fs_, root_, PredictorOptions{});
  ASSERT_FALSE(predictor.ok());
  EXPECT_EQ(predictor.status().code(), absl::StatusCode::kDataLoss) << predictor.status();
  EXPECT_THAT(std::string(predictor.status().message()), HasSubstr(io::kDenseParamsName));
  EXPECT_EQ(std::string(predictor.status().message()).find('\n'), std::string::npos);
}

TEST_F(PredictorTest, DamagedTableFileIsDataLossNamingTheFile) {
  const std::string dir = WriteBundle();
  const std::string file = io::BundleTableFileName(0, 1, kTestTable);
  FlipByte(dir + "/" + file);
  auto predictor = Predictor::Load(fs_, root_, PredictorOptions{});
  ASSERT_FALSE(predictor.ok());
  EXPECT_EQ(predictor.status().code(), absl::StatusCode::kDataLoss) << predictor.status();
  EXPECT_THAT(std::string(predictor.status().message()), HasSubstr(file));
  EXPECT_EQ(std::string(predictor.status().message()).find('\n'), std::string::npos);
}

TEST_F(PredictorTest, AVariableMissingFromDenseParamsIsNamed) {
  TestBundleOptions o;
  o.omit_param = "hidden.b";
  WriteBundle(o);
  auto predictor = Predictor::Load(fs_, root_, PredictorOptions{});
  ASSERT_FALSE(predictor.ok());
  EXPECT_EQ(predictor.status().code(), absl::StatusCode::kInvalidArgument) << predictor.status();
  EXPECT_THAT(std::string(predictor.status().message()), HasSubstr("'hidden.b'"));
  EXPECT_THAT(std::string(predictor.status().message()), HasSubstr(io::kDenseParamsName));
}

TEST_F(PredictorTest, NoBundleIsNotFound) {
  auto predictor = Predictor::Load(fs_, root_ + "/nothing", PredictorOptions{});
  ASSERT_FALSE(predictor.ok());
  EXPECT_THAT(std::string(predictor.status().message()), HasSubstr("nothing"));
}

TEST_F(PredictorTest, EmptyDataIsRefused) {
  WriteBundle();
  auto predictor = Predictor::Load(fs_, root_, PredictorOptions{});
  ASSERT_TRUE(predictor.ok()) << predictor.status();
  data::Dataset empty;
  empty.num_dense = kTestNumDense;
  empty.num_sparse = 1;
  EXPECT_EQ((*predictor)->Score(empty).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace tessera
