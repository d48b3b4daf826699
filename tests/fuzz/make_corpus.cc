// Writes the seed corpora of the fuzz targets (tests/fuzz/corpus/<name>/), small valid inputs
// built with the real encoders and layers, so that the fuzzers start from what peers and users
// actually send. The committed corpus was written by:
//   bazel run //tests/fuzz:make_corpus -- $PWD/tests/fuzz/corpus
// (files are overwritten, files found by the fuzzers are left alone).
#include <climits>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/data/criteo.h"
#include "common/layers/layers.h"
#include "common/layers/optimizer.h"
#include "common/ops/ops.h"
#include "common/layers/model_file.h"
#include "common/framework/program_io.h"
#include "common/rpc/grpc/codec.h"

namespace tessera {
namespace {

bool Write(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << bytes;
  out.close();
  if (!out) std::fprintf(stderr, "cannot write %s\n", path.c_str());
  return static_cast<bool>(out);
}

std::string Flatten(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  (void)buffer.Dump(&slices);
  std::string out;
  for (const auto& s : slices) out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  return out;
}

bool CodecSeeds(const std::string& dir) {
  RequestMeta meta{"job", 1, 7};
  bool ok = true;
  // Option byte 0: the message in one slice; 0x35: cut into slices of 2..6 bytes.
  auto put = [&](const std::string& name, const std::string& message) {
    ok &= Write(dir + "/" + name, std::string(1, '\0') + message);
    ok &= Write(dir + "/" + name + "_sliced", std::string(1, '\x35') + message);
  };
  Variable dense;
  Tensor* t = dense.GetMutable<Tensor>();
  t->Resize(FLOAT32, {2, 3});
  for (int i = 0; i < 6; ++i) t->data<float>()[i] = 0.5f * i - 1;
  put("dense_f32", Flatten(EncodeVariable(meta, "fc.w@GRAD", dense)));
  put("dense_chunk", Flatten(EncodeVariable(meta, "fc.w@GRAD.block1", dense, 8, 12)));
  Variable d64;
  d64.GetMutable<Tensor>()->Resize(FLOAT64, {3});
  for (int i = 0; i < 3; ++i) d64.GetMutable<Tensor>()->data<double>()[i] = i;
  put("dense_f64", Flatten(EncodeVariable(meta, "b", d64)));
  Variable empty;
  empty.GetMutable<Tensor>()->Resize(FLOAT32, {0, 4});
  put("dense_empty", Flatten(EncodeVariable(meta, "e", empty)));
  Variable sparse;
  SelectedRows* sr = sparse.GetMutable<SelectedRows>();
  sr->height = 1000;
  sr->rows = {3, -1, LLONG_MAX};
  sr->value.Resize(FLOAT32, {3, 2});
  for (int i = 0; i < 6; ++i) sr->value.data<float>()[i] = static_cast<float>(i);
  put("sparse_rows", Flatten(EncodeVariable(meta, "emb@GRAD.shard0", sparse)));
  put("batch_send", Flatten(EncodeBatch(
                        meta, {{"fc.w@GRAD", &dense}, {"emb@GRAD.shard0", &sparse}, {"e", &empty}},
                        /*send_barrier=*/true)));
  // A slot's deep and wide gradients: the second names the first's row ids (rows_of_entry).
  Variable wide;
  SelectedRows* wr = wide.GetMutable<SelectedRows>();
  wr->height = 1000;
  wr->rows = sr->rows;
  wr->value.Resize(FLOAT32, {3, 1});
  for (int i = 0; i < 3; ++i) wr->value.data<float>()[i] = static_cast<float>(-i);
  put("batch_send_shared_rows",
      Flatten(EncodeBatch(meta, {{"emb@GRAD.shard0", &sparse}, {"wide@GRAD.shard0", &wide}},
                          /*send_barrier=*/true)));
  // A pipelined sync step's SendGetBatch: gradients, both barriers, the names to fetch.
  BatchExtras fold;
  fold.get_names = {"fc.w", "fc.b"};
  fold.fetch_barrier = true;
  put("batch_send_get",
      Flatten(EncodeBatch(meta, {{"emb@GRAD.shard0", &sparse}}, /*send_barrier=*/true, fold)));
  // ... with the next batch's lookups riding along (deep and wide share their ids).
  const std::vector<int64_t> next_ids = {7, -2, LLONG_MIN};
  Tensor unused;
  fold.lookups = {{"emb", &next_ids, &unused}, {"wide", &next_ids, &unused}};
  put("batch_send_get_lookups",
      Flatten(EncodeBatch(meta, {{"emb@GRAD.shard0", &sparse}}, /*send_barrier=*/true, fold)));
  GetBatchRequest get_batch;
  *get_batch.mutable_header() = ToHeader(meta);
  get_batch.add_names("fc.w");
  get_batch.add_names("fc.b");
  get_batch.set_fetch_barrier(true);
  put("get_batch_request", get_batch.SerializeAsString());
  GetRequest get;
  *get.mutable_header() = ToHeader(meta);
  get.set_name("fc.w");
  get.set_offset(8);
  get.set_length(16);
  put("get_request", get.SerializeAsString());
  // The range that overflowed the server's check (offset + length wraps past 2^63).
  get.set_offset(LLONG_MAX);
  get.set_length(16);
  put("get_request_overflow", get.SerializeAsString());
  PrefetchRequest prefetch;
  *prefetch.mutable_header() = ToHeader(meta);
  prefetch.set_table("emb");
  std::vector<int64_t> ids = {0, -5, 42};
  prefetch.set_ids(std::string(reinterpret_cast<const char*>(ids.data()), 24));
  put("prefetch_request", prefetch.SerializeAsString());
  PrefetchBatchRequest prefetch_batch;
  *prefetch_batch.mutable_header() = ToHeader(meta);
  for (const char* table : {"emb_0", "wide_0"}) {
    PrefetchBatchRequest::Table* entry = prefetch_batch.add_tables();
    entry->set_table(table);
    entry->set_ids(std::string(reinterpret_cast<const char*>(ids.data()), 24));
  }
  put("prefetch_batch_request", prefetch_batch.SerializeAsString());
  // The second table names the first's ids (ids_of_table).
  prefetch_batch.mutable_tables(1)->clear_ids();
  prefetch_batch.mutable_tables(1)->set_ids_of_table(1);
  put("prefetch_batch_request_shared_ids", prefetch_batch.SerializeAsString());
  BarrierRequest barrier;
  *barrier.mutable_header() = ToHeader(meta);
  barrier.set_kind(FETCH_BARRIER);
  put("barrier_request", barrier.SerializeAsString());
  RegisterRequest reg;
  *reg.mutable_header() = ToHeader(meta);
  for (const auto& [name, value] : {std::make_pair("trainers", "2"),
                                    std::make_pair("pservers", "127.0.0.1:6170,127.0.0.1:6171"),
                                    std::make_pair("learning_rate", "0.001")}) {
    RegisterRequest::Field* f = reg.add_fields();
    f->set_name(name);
    f->set_value(value);
  }
  reg.set_nonce(0x123456789abcdef0ULL);
  put("register_request", reg.SerializeAsString());
  return ok;
}

// Main + startup programs of a small model, as the program fuzzer reads them.
struct Model {
  ProgramDesc main, startup;
};

Model Linear(const OpRegistry& registry) {
  Model m;
  ProgramBuilder b(&m.main, &m.startup);
  std::string x = layers::Data(b, "x", {-1, 3});
  std::string y = layers::Data(b, "y", {-1, 1});
  std::string pred = layers::Fc(b, x, 1);
  std::string loss = layers::Mean(b, layers::SquareError(b, pred, y));
  OptimizerOptions oo;
  oo.learning_rate = 0.1f;
  (void)SGD(oo).Minimize(b, registry, loss);
  return m;
}

Model Table(const OpRegistry& registry, bool distributed) {
  Model m;
  ProgramBuilder b(&m.main, &m.startup);
  std::string ids = layers::Data(b, "ids", {-1, 1}, INT64);
  std::string label = layers::Data(b, "label", {-1, 1});
  layers::EmbeddingOptions e;
  e.name = "emb";
  e.is_sparse = true;
  e.is_distributed = distributed;
  std::string emb = layers::Embedding(b, ids, 64, 4, e);
  std::string logit = layers::Fc(b, emb, 1);
  std::string loss = layers::Mean(b, layers::SigmoidCrossEntropyWithLogits(b, logit, label));
  OptimizerOptions oo;
  oo.learning_rate = 0.01f;
  (void)Adam(oo).Minimize(b, registry, loss);
  return m;
}

bool ProgramSeeds(const std::string& dir) {
  auto registry = NewStandardOpRegistry();
  bool ok = true;
  auto put = [&](const std::string& name, const Model& m) {
    const std::string sep = "\n#startup\n";
    // Byte 0: bit 0 binary, bit 1 async.
    ok &= Write(dir + "/" + name + "_text",
                std::string(1, '\0') + ProgramToText(m.main) + sep + ProgramToText(m.startup));
    ok &= Write(dir + "/" + name + "_text_async",
                std::string(1, '\x02') + ProgramToText(m.main) + sep + ProgramToText(m.startup));
    ok &= Write(dir + "/" + name + "_binary", std::string(1, '\x01') + m.main.SerializeAsString() +
                                                  sep + m.startup.SerializeAsString());
  };
  put("linear_sgd", Linear(*registry));
  put("sparse_table_adam", Table(*registry, false));
  put("distributed_table_adam", Table(*registry, true));
  // Malformed text the parser must reject naming file:line.
  ok &=
      Write(dir + "/bad_unclosed_block", std::string(1, '\0') + "blocks {\n  ops { type: \"x\"\n");
  ok &= Write(dir + "/bad_unknown_field", std::string(1, '\0') + "blocks { opz {} }\n");
  ok &= Write(dir + "/no_blocks", std::string(1, '\0') + "\n");
  return ok;
}

// Model files (forward program, feeds, optimizer) as tessera_program and python/tessera write
// them.
bool ModelSeeds(const std::string& dir) {
  bool ok = true;
  auto model = [](bool distributed, const char* optimizer) {
    ModelParts p;
    ProgramBuilder b(&p.forward, &p.startup);
    std::string x = layers::Data(b, "x", {-1, 3});
    std::string ids = layers::Data(b, "ids", {-1, 1}, INT64);
    std::string label = layers::Data(b, "label", {-1, 1});
    layers::EmbeddingOptions e;
    e.name = "emb";
    e.is_sparse = true;
    e.is_distributed = distributed;
    std::string emb = layers::Embedding(b, ids, 64, 4, e);
    std::string logit = layers::Fc(b, layers::Concat(b, {x, emb}, 1), 1);
    p.loss = layers::Mean(b, layers::SigmoidCrossEntropyWithLogits(b, logit, label));
    p.prediction = layers::Sigmoid(b, logit);
    p.metrics = {"auc", "log_loss"};
    p.feeds.dense = x;
    p.feeds.num_dense = 3;
    p.feeds.slots = {{ids, distributed ? 0 : 64}};
    p.feeds.label = label;
    p.optimizer.set_type(optimizer);
    p.optimizer.set_learning_rate(0.01f);
    p.optimizer.set_decay_steps(100);
    p.optimizer.set_decay_rate(0.9f);
    return ModelToText(MakeModelFile(std::move(p)));
  };
  ok &= Write(dir + "/local_table_adam", model(false, "adam"));
  ok &= Write(dir + "/distributed_table_momentum", model(true, "momentum"));
  ok &= Write(dir + "/future_version", "format_version: 2\n");
  ok &= Write(dir + "/bad_unclosed", "format_version: 1\nforward { blocks { ops { type: \"x\"\n");
  return ok;
}

bool CriteoSeeds(const std::string& dir) {
  using data::FormatId;
  bool ok = true;
  // Byte 0x80: 13 dense + 26 categorical fields.
  std::vector<std::string> fields = {"1"};
  for (int j = 0; j < data::kCriteoNumDense; ++j) {
    fields.push_back(j % 4 == 3 ? "" : absl::StrCat(j * 7 - 2));
  }
  for (int j = 0; j < data::kCriteoNumSparse; ++j) {
    fields.push_back(j % 5 == 4 ? "" : j % 2 ? FormatId(-j) : absl::StrCat(j * 977));
  }
  std::string line = absl::StrJoin(fields, "\t");
  fields[0] = "0";
  std::string line0 = absl::StrJoin(fields, "\t");
  ok &= Write(dir + "/criteo_two_lines", "\x80" + line + "\n" + line0 + "\n");
  ok &= Write(dir + "/criteo_crlf_blank", "\x80" + line + "\r\n\r\n" + line0);
  fields[3] = "x7";
  ok &= Write(dir + "/criteo_bad_dense", "\x80" + line + "\n" + absl::StrJoin(fields, "\t") + "\n");
  // Byte 0x09: 1 dense + 2 categorical fields.
  ok &= Write(dir + "/small_fields", std::string("\x09") + "1\t5\tff\tDEADBEEF\n0\t\t\t0\n");
  ok &= Write(dir + "/small_bad_count", std::string("\x09") + "1\t5\tff\n");
  return ok;
}

}  // namespace
}  // namespace tessera

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s CORPUS_ROOT (holding codec/, program/, criteo/, model_file/)\n", argv[0]);
    return 2;
  }
  std::string root = argv[1];
  bool ok = tessera::CodecSeeds(root + "/codec") && tessera::ProgramSeeds(root + "/program") &&
            tessera::CriteoSeeds(root + "/criteo") && tessera::ModelSeeds(root + "/model_file");
  return ok ? 0 : 1;
}
