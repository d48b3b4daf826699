#include "common/layers/model_file.h"

#include <memory>
#include <string>

#include "absl/strings/match.h"
#include "common/layers/layers.h"
#include "common/layers/program_builder.h"
#include "common/framework/op_desc.h"
#include "common/ops/ops.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

using ::testing::HasSubstr;

// x [-1, 4] dense, ids [-1, 1] slot 0, y [-1, 1] label:
//   out = fc(concat(x, emb(ids)), 1);  loss = mean(square_error(out, y))
ModelFile SmallModel() {
  ModelParts p;
  ProgramBuilder b(&p.forward, &p.startup);
  std::string x = layers::Data(b, "x", {-1, 4});
  std::string ids = layers::Data(b, "ids", {-1, 1}, INT64);
  std::string y = layers::Data(b, "y", {-1, 1});
  layers::EmbeddingOptions eo;
  eo.name = "emb";
  eo.is_sparse = true;
  std::string e = layers::Embedding(b, ids, 100, 3, eo);
  layers::FcOptions fc;
  fc.name = "out";
  std::string out = layers::Fc(b, layers::Concat(b, {x, e}, 1), 1, fc);
  p.loss = layers::Mean(b, layers::SquareError(b, out, y));
  p.prediction = out;
  p.metrics = {"mse"};
  p.feeds.dense = x;
  p.feeds.num_dense = 4;
  p.feeds.slots = {{ids, 100}};
  p.feeds.label = y;
  p.optimizer.set_type("sgd");
  p.optimizer.set_learning_rate(0.1f);
  return MakeModelFile(std::move(p));
}

class ModelFileTest : public ::testing::Test {
 protected:
  ModelFileTest() : registry_(NewStandardOpRegistry()) {}

  // The refusal of `model`: one line starting with the file's name.
  std::string Refusal(const ModelFile& model) {
    absl::StatusOr<ModelSpec> spec = CompileModel(model, *registry_, "m.pbtxt");
    EXPECT_FALSE(spec.ok());
    if (spec.ok()) return "";
    const std::string message(spec.status().message());
    EXPECT_EQ(spec.status().code(), absl::StatusCode::kInvalidArgument) << message;
    EXPECT_TRUE(absl::StartsWith(message, "model file m.pbtxt: ")) << message;
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
    return message;
  }

  BlockDesc* Forward(ModelFile* m) { return m->mutable_forward()->mutable_blocks(0); }
  VarDesc* Var(ModelFile* m, const std::string& name) {
    for (VarDesc& v : *Forward(m)->mutable_vars()) {
      if (v.name() == name) return &v;
    }
    ADD_FAILURE() << "no variable " << name;
    return nullptr;
  }
  // Index of the first forward op of `type`.
  int OpIndex(ModelFile* m, const std::string& type) {
    for (int i = 0; i < Forward(m)->ops_size(); ++i) {
      if (Forward(m)->ops(i).type() == type) return i;
    }
    ADD_FAILURE() << "no op " << type;
    return 0;
  }

  std::unique_ptr<OpRegistry> registry_;
};

TEST_F(ModelFileTest, CompilesWithBackwardOptimizerAndFeeds) {
  absl::StatusOr<ModelSpec> spec = CompileModel(SmallModel(), *registry_, "m.pbtxt");
  ASSERT_TRUE(spec.ok()) << spec.status();
  int sgd = 0, backward = 0;
  for (const OpDesc& op : spec->main.blocks(0).ops()) {
    if (op.type() == "sgd") ++sgd;
    if ((OpRoleOf(op) & kRoleBackward) != 0) ++backward;
  }
  EXPECT_EQ(sgd, 3);  // emb, out.w, out.b
  EXPECT_GT(backward, 0);
  EXPECT_EQ(spec->feeds.dense, "x");
  EXPECT_EQ(spec->feeds.num_dense, 4);
  ASSERT_EQ(spec->feeds.slots.size(), 1u);
  EXPECT_EQ(spec->feeds.slots[0].name, "ids");
  EXPECT_EQ(spec->feeds.slots[0].dict_size, 100);
  EXPECT_EQ(spec->feeds.label, "y");
  EXPECT_EQ(spec->metrics, std::vector<std::string>{"mse"});
}

TEST_F(ModelFileTest, TextRoundTripAndParseErrorsNameTheLine) {
  const ModelFile m = SmallModel();
  absl::StatusOr<ModelFile> back = ParseModelText(ModelToText(m), "m.pbtxt");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(ModelToText(*back), ModelToText(m));
  absl::StatusOr<ModelFile> bad = ParseModelText("format_version: 1\nforward { blocks { oops", "m");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("m:2:"));
}

TEST_F(ModelFileTest, RefusesAFutureOrMissingFormatVersion) {
  ModelFile m = SmallModel();
  m.set_format_version(kModelFormatVersion + 1);
  EXPECT_THAT(Refusal(m), HasSubstr("format_version 2 is newer than this build reads (1)"));
  m.set_format_version(0);
  EXPECT_THAT(Refusal(m), HasSubstr("format_version is 0"));
}

TEST_F(ModelFileTest, RefusesAnUnknownOp) {
  ModelFile m = SmallModel();
  const int i = OpIndex(&m, "concat");
  Forward(&m)->mutable_ops(i)->set_type("concatt");
  EXPECT_THAT(Refusal(m), HasSubstr("(concatt): unknown op type 'concatt'"));
}

TEST_F(ModelFileTest, RefusesBackwardOrOptimizerOps) {
  ModelFile m = SmallModel();
  SetAttr(Forward(&m)->mutable_ops(0), kOpRoleAttr, static_cast<int64_t>(kRoleOptimize));
  EXPECT_THAT(Refusal(m), HasSubstr("a model file holds forward ops only"));
}

TEST_F(ModelFileTest, RefusesAnUnboundOrMissingFeed) {
  ModelFile m = SmallModel();
  m.mutable_feeds()->erase(m.mutable_feeds()->begin() + 1);  // ids
  EXPECT_THAT(Refusal(m), HasSubstr("reads 'ids', which no op writes and no feed binds"));

  m = SmallModel();
  FeedBinding* f = m.add_feeds();
  f->set_var("nope");
  f->set_source(FeedBinding::SLOT);
  f->set_slot(1);
  EXPECT_THAT(Refusal(m), HasSubstr("feed 'nope' names no variable of the forward program"));

  m = SmallModel();
  m.mutable_feeds(1)->set_slot(3);
  EXPECT_THAT(Refusal(m), HasSubstr("slot 0 is not bound"));

  m = SmallModel();
  m.mutable_feeds(0)->set_var("ids");  // DENSE on an int64 [-1, 1] variable
  EXPECT_THAT(Refusal(m), HasSubstr("DENSE feed 'ids' is int64 [-1, 1]; it must be float32"));

  m = SmallModel();
  *m.add_feeds() = m.feeds(2);  // the label twice
  EXPECT_THAT(Refusal(m), HasSubstr("feed 'y' is bound twice"));
}

TEST_F(ModelFileTest, RefusesAShapeMismatch) {
  ModelFile m = SmallModel();
  // The fc weight takes 4 + 3 inputs; declare 6 (and initialize it so).
  Var(&m, "out.w")->set_shape(0, 6);
  for (OpDesc& op : *m.mutable_startup()->mutable_blocks(0)->mutable_ops()) {
    if (OpOutput(op, "Out") == "out.w") SetAttr(&op, "shape", std::vector<int64_t>{6, 1});
  }
  EXPECT_THAT(Refusal(m), HasSubstr("shape check (a batch of 2 through the forward program)"));

  m = SmallModel();
  Var(&m, OpOutput(Forward(&m)->ops(OpIndex(&m, "concat")), "Out"))->set_shape(1, 5);
  EXPECT_THAT(Refusal(m), HasSubstr("is declared [-1, 5] but op"));
}

TEST_F(ModelFileTest, RefusesANonScalarLoss) {
  ModelFile m = SmallModel();
  m.set_loss(OpOutput(Forward(&m)->ops(OpIndex(&m, "square_error")), "Out"));
  EXPECT_THAT(Refusal(m), HasSubstr("it must be a float32 scalar [1] (take its mean)"));
}

TEST_F(ModelFileTest, RefusesACycle) {
  ModelFile m = SmallModel();
  // Move the mean before the square error it reads.
  const int mean = OpIndex(&m, "mean");
  const int sq = OpIndex(&m, "square_error");
  Forward(&m)->mutable_ops()->SwapElements(mean, sq);
  EXPECT_THAT(Refusal(m), HasSubstr("cycle: op"));
  EXPECT_THAT(Refusal(m), HasSubstr("(square_error) writes later"));
}

TEST_F(ModelFileTest, RefusesAnEmbeddingOfDimZero) {
  ModelFile m = SmallModel();
  Var(&m, "emb")->set_shape(1, 0);
  EXPECT_THAT(Refusal(m), HasSubstr("embedding 'emb' has dim 0"));
}

TEST_F(ModelFileTest, RefusesAnOptimizerTheTableDoesNotSupport) {
  ModelFile m = SmallModel();
  m.mutable_optimizer()->set_type("momentum");
  ModelOverrides o;
  o.distributed_tables = true;
  EXPECT_THAT(Refusal(ApplyOverrides(m, o)),
              HasSubstr("optimizer 'momentum' cannot update distributed table 'emb'"));
  m.mutable_optimizer()->set_type("rmsprop");
  EXPECT_THAT(Refusal(m), HasSubstr("optimizer type 'rmsprop' is unknown"));
}

// A table with an optimizer of its own (adagrad, its own learning rate) and clipping by global
// norm: one clip op over every gradient before the optimize ops, the table's update by its own
// optimizer reading its own learning-rate variable, the others by the model's.
TEST_F(ModelFileTest, CompilesTableOptimizersAndGradientClipping) {
  ModelFile m = SmallModel();
  m.mutable_optimizer()->set_clip_global_norm(2.5f);
  TableOptimizer* t = m.add_table_optimizers();
  t->set_table("emb");
  t->mutable_optimizer()->set_type("adagrad");
  t->mutable_optimizer()->set_learning_rate(0.3f);
  absl::StatusOr<ModelSpec> spec = CompileModel(m, *registry_, "m.pbtxt");
  ASSERT_TRUE(spec.ok()) << spec.status();
  std::vector<std::string> types;
  int clip_at = -1, first_update = -1;
  const auto& ops = spec->main.blocks(0).ops();
  for (int i = 0; i < ops.size(); ++i) {
    const OpDesc& op = ops[i];
    if (op.type() == "clip_by_global_norm") {
      clip_at = i;
      EXPECT_EQ(OpInputs(op, "X").size(), 3u);
      EXPECT_EQ(OpInputs(op, "X"), OpOutputs(op, "Out"));
      EXPECT_FLOAT_EQ(GetFloatAttr(op, "max_norm", 0), 2.5f);
    }
    if (op.type() != "sgd" && op.type() != "adagrad") continue;
    if (first_update < 0) first_update = i;
    const std::string param = OpInput(op, "Param");
    EXPECT_EQ(op.type(), param == "emb" ? "adagrad" : "sgd") << param;
    EXPECT_EQ(OpInput(op, "LearningRate"),
              param == "emb" ? "emb.learning_rate" : "learning_rate_0") << param;
  }
  ASSERT_GE(clip_at, 0);
  EXPECT_LT(clip_at, first_update);
  // The table's learning rate and accumulator are initialized by the startup program.
  bool lr_init = false, moment_init = false;
  for (const OpDesc& op : spec->startup.blocks(0).ops()) {
    lr_init |= OpOutput(op, "Out") == "emb.learning_rate";
    moment_init |= OpOutput(op, "Out") == "emb.moment";
  }
  EXPECT_TRUE(lr_init);
  EXPECT_TRUE(moment_init);
}

TEST_F(ModelFileTest, RefusesBadTableOptimizersAndClipping) {
  ModelFile m = SmallModel();
  m.mutable_optimizer()->set_clip_global_norm(-1);
  EXPECT_THAT(Refusal(m), HasSubstr("optimizer clip_global_norm -1 must be >= 0 and finite"));

  auto with_table = [&](const std::string& table, const std::string& type) {
    ModelFile t = SmallModel();
    TableOptimizer* o = t.add_table_optimizers();
    o->set_table(table);
    o->mutable_optimizer()->set_type(type);
    return t;
  };
  EXPECT_THAT(Refusal(with_table("out.w", "adam")),
              HasSubstr("table_optimizers 'out.w' names no embedding table"));
  m = with_table("emb", "adam");
  *m.add_table_optimizers() = m.table_optimizers(0);
  EXPECT_THAT(Refusal(m), HasSubstr("table_optimizers 'emb' is given twice"));
  EXPECT_THAT(Refusal(with_table("emb", "rmsprop")),
              HasSubstr("table_optimizers 'emb' optimizer type 'rmsprop' is unknown"));
  m = with_table("emb", "adam");
  m.mutable_table_optimizers(0)->mutable_optimizer()->set_decay_steps(10);
  EXPECT_THAT(Refusal(m), HasSubstr("table_optimizers 'emb' optimizer sets decay_steps: a table "
                                    "has no schedule or clipping of its own"));
  m = with_table("emb", "adam");
  m.mutable_table_optimizers(0)->mutable_optimizer()->set_learning_rate(-0.5f);
  EXPECT_THAT(Refusal(m), HasSubstr("learning_rate -0.5 must be >= 0 and finite"));
  // A distributed table's own optimizer must be one the pservers' tables implement, and the
  // model's may then be any.
  ModelOverrides distributed;
  distributed.distributed_tables = true;
  EXPECT_THAT(Refusal(ApplyOverrides(with_table("emb", "momentum"), distributed)),
              HasSubstr("optimizer 'momentum' cannot update distributed table 'emb'"));
  m = with_table("emb", "adagrad");
  m.mutable_optimizer()->set_type("momentum");
  EXPECT_TRUE(CompileModel(ApplyOverrides(m, distributed), *registry_, "m.pbtxt").ok());
}

TEST_F(ModelFileTest, RefusesAParameterWithoutInitializer) {
  ModelFile m = SmallModel();
  auto* ops = m.mutable_startup()->mutable_blocks(0)->mutable_ops();
  for (int i = 0; i < ops->size(); ++i) {
    if (OpOutput(ops->Get(i), "Out") == "out.b") ops->DeleteSubrange(i, 1);
  }
  EXPECT_THAT(Refusal(m), HasSubstr("parameter 'out.b' has no initializer"));
}

TEST_F(ModelFileTest, OverridesLearningRateAndTablePlacement) {
  ModelOverrides o;
  o.learning_rate = 0.5f;
  o.distributed_tables = true;
  const ModelFile m = ApplyOverrides(SmallModel(), o);
  EXPECT_FLOAT_EQ(m.optimizer().learning_rate(), 0.5f);
  absl::StatusOr<ModelSpec> spec = CompileModel(m, *registry_, "m.pbtxt");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->feeds.slots[0].dict_size, 0);  // raw ids for a distributed table
  const VarDesc* emb = FindVarDesc(spec->main.blocks(0), "emb");
  ASSERT_NE(emb, nullptr);
  EXPECT_TRUE(emb->is_distributed());
}

// A multi-hot slot: ids of every example concatenated, looked up and pooled per example.
TEST_F(ModelFileTest, CompilesAMultiHotSlotAndChecksItsBinding) {
  ModelParts p;
  ProgramBuilder b(&p.forward, &p.startup);
  std::string ids = layers::Data(b, "tags", {-1, 1}, INT64);
  std::string y = layers::Data(b, "y", {-1, 1});
  layers::EmbeddingOptions eo;
  eo.name = "tag_emb";
  eo.is_sparse = true;
  std::string e = layers::Embedding(b, ids, 50, 3, eo);
  std::string pooled = "tags_pooled";
  b.CreateVar(pooled, {-1, 3});
  OpDesc* pool = b.AppendOp(MakeOp("sequence_pool", {{"X", {e}}}, {{"Out", {pooled}}}));
  SetAttr(pool, "pooltype", "AVERAGE");
  layers::FcOptions fc;
  fc.name = "out";
  p.loss = layers::Mean(b, layers::SquareError(b, layers::Fc(b, pooled, 1, fc), y));
  p.feeds.multi_slots = {{ids, 50}};
  p.feeds.label = y;
  p.optimizer.set_type("adagrad");
  p.optimizer.set_learning_rate(0.1f);
  ModelFile m = MakeModelFile(std::move(p));
  ASSERT_EQ(m.feeds(0).source(), FeedBinding::MULTI_SLOT);
  absl::StatusOr<ModelSpec> spec = CompileModel(m, *registry_, "m.pbtxt");
  ASSERT_TRUE(spec.ok()) << spec.status();
  ASSERT_EQ(spec->feeds.multi_slots.size(), 1u);
  EXPECT_EQ(spec->feeds.multi_slots[0].name, "tags");
  EXPECT_EQ(spec->feeds.multi_slots[0].dict_size, 50);
  EXPECT_TRUE(spec->feeds.slots.empty());

  ModelFile twice = m;
  *twice.add_feeds() = m.feeds(0);
  EXPECT_THAT(Refusal(twice), HasSubstr("feed 'tags' is bound twice"));
  ModelFile wrong_shape = m;
  Var(&wrong_shape, "tags")->set_shape(1, 2);
  EXPECT_THAT(Refusal(wrong_shape), HasSubstr("MULTI_SLOT feed 'tags' is int64 [-1, 2]"));
  m.mutable_feeds(0)->set_slot(1);
  EXPECT_THAT(Refusal(m), HasSubstr("MULTI_SLOT feeds must bind slots 0..0"));
}

// One process: a distributed table becomes local, its raw ids fed modulo its rows.
TEST_F(ModelFileTest, SingleMachineMakesDistributedTablesLocal) {
  ModelOverrides dist;
  dist.distributed_tables = true;
  ModelOverrides local;
  local.single_machine = true;
  const ModelFile m = ApplyOverrides(ApplyOverrides(SmallModel(), dist), local);
  absl::StatusOr<ModelSpec> spec = CompileModel(m, *registry_, "m.pbtxt");
  ASSERT_TRUE(spec.ok()) << spec.status();
  EXPECT_EQ(spec->feeds.slots[0].dict_size, 100);
  EXPECT_FALSE(FindVarDesc(spec->main.blocks(0), "emb")->is_distributed());
}

}  // namespace
}  // namespace tessera
