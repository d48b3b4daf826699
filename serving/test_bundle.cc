#include "serving/test_bundle.h"

#include <map>
#include <random>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/base/status.h"
#include "common/framework/op_desc.h"
#include "common/framework/params_io.h"
#include "common/io/bundle.h"
#include "common/io/checkpoint_io.h"
#include "common/layers/layers.h"
#include "common/layers/program_builder.h"
#include "pserver/bundle_tables.h"
#include "trainer/bundle_export.h"
#include "trainer/local_trainer.h"

namespace tessera {

ModelSpec BuildTestModel(const TestModelOptions& options) {
  ModelSpec spec;
  spec.main.set_random_seed(7);
  ProgramBuilder b(&spec.main, &spec.startup);
  const std::string dense = layers::Data(b, "dense_input", {-1, kTestNumDense});
  const std::string slot = layers::Data(b, "slot_0", {-1, 1}, INT64);
  const std::string label = layers::Data(b, "label", {-1, 1});
  layers::EmbeddingOptions eo;
  eo.name = kTestTable;
  eo.is_sparse = true;
  eo.is_distributed = options.distributed;
  const std::string emb = layers::Embedding(b, slot, options.vocab, options.dim, eo);
  layers::FcOptions hidden;
  hidden.name = "hidden";
  hidden.act = "relu";
  hidden.bias_init = Initializer::Uniform(-0.1f, 0.1f);
  const std::string h = layers::Fc(b, layers::Concat(b, {emb, dense}, 1), 8, hidden);
  layers::FcOptions out;
  out.name = "logit";
  out.bias_init = Initializer::Constant(0.05f);
  const std::string logit = layers::Fc(b, h, 1, out);
  spec.loss = layers::Mean(b, layers::SigmoidCrossEntropyWithLogits(b, logit, label));
  spec.prediction = layers::Sigmoid(b, logit);
  spec.metrics = {"auc"};
  spec.feeds.dense = dense;
  spec.feeds.num_dense = kTestNumDense;
  spec.feeds.slots = {SlotFeed{slot, 0}};
  spec.feeds.label = label;
  spec.feeds.label_dtype = FLOAT32;
  return spec;
}

SparseTableOptions TestTableOptions(int64_t dim) {
  SparseTableOptions o;
  o.dim = dim;
  o.initializer.kind = SparseTableInitializer::kUniform;
  o.initializer.min = -0.5;
  o.initializer.max = 0.5;
  o.initializer.seed = 11;
  o.optimizer = "sgd";
  o.num_shards = 4;
  o.prefault = false;
  return o;
}

absl::StatusOr<std::unique_ptr<SparseTable>> MakeTestTable(int64_t vocab, int64_t dim) {
  TS_ASSIGN_OR_RETURN(std::unique_ptr<SparseTable> table,
                      SparseTable::Create(TestTableOptions(dim)));
  std::vector<int64_t> ids;
  for (int64_t id = 0; id < vocab / 2; ++id) ids.push_back(id);
  std::vector<float> grads(ids.size() * static_cast<size_t>(dim));
  for (size_t i = 0; i < grads.size(); ++i) grads[i] = 0.25f * static_cast<float>(i % 7) - 0.75f;
  TS_RETURN_IF_ERROR(table->ApplyGradients(ids, grads.data(), 0.5f, 1));
  return table;
}

absl::StatusOr<std::string> WriteTestBundle(io::FileSystem* fs, const std::string& root,
                                            const ModelSpec& model, const Scope& params,
                                            SparseTable* table, const TestBundleOptions& options) {
  TS_ASSIGN_OR_RETURN(std::string dir, io::BeginExport(fs, root, options.step));
  TS_RETURN_IF_ERROR(WritePserverExport(fs, dir, 0, 1, /*delta=*/false, {{kTestTable, table}}));
  io::BundleModel how;
  how.batch_size = options.batch_size;
  how.data_format = options.data_format;
  TS_ASSIGN_OR_RETURN(BundleModelFiles model_files, MakeBundleModelFiles(model, how));
  std::map<std::string, std::string> files = std::move(model_files.files);
  std::vector<std::string> dense;
  for (const std::string& name : model_files.dense) {
    if (name != options.omit_param) dense.push_back(name);
  }
  TS_ASSIGN_OR_RETURN(files[io::kDenseParamsName], SerializeVariables(params, dense));
  io::BundleMeta meta;
  meta.step = options.step;
  meta.base = options.step;
  meta.num_pservers = 1;
  TS_RETURN_IF_ERROR(
      io::CommitExport(fs, dir, meta, files, {io::PserverFilePrefix(0, 1) + ".MANIFEST"}));
  return dir;
}

data::Dataset MakeTestData(int64_t n, const std::vector<int64_t>& ids, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> value(-1.0f, 1.0f);
  data::Dataset d;
  d.num_dense = kTestNumDense;
  d.num_sparse = 1;
  for (int64_t i = 0; i < n; ++i) {
    data::Example e;
    for (int j = 0; j < kTestNumDense; ++j) e.dense.push_back(value(rng));
    e.sparse.push_back(ids[static_cast<size_t>(i) % ids.size()]);
    e.label = (rng() & 1) != 0 ? 1.0f : 0.0f;
    d.examples.push_back(std::move(e));
  }
  return d;
}

std::string TestDataCsv(const data::Dataset& dataset) {
  std::string out = "label,I1,I2,C1\n";
  for (const data::Example& e : dataset.examples) {
    absl::StrAppendFormat(&out, "%g,%.9g,%.9g,%d\n", e.label, e.dense[0], e.dense[1], e.sparse[0]);
  }
  return out;
}

}  // namespace tessera
