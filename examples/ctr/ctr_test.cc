#include <iostream>
#include <set>
#include <sstream>

#include "common/data/synthetic.h"
#include "common/ops/ops.h"
#include "examples/ctr/model.h"
#include "gtest/gtest.h"
#include "trainer/local_trainer.h"

namespace tessera {
namespace examples {
namespace {

std::vector<int64_t> ShapeOf(const VarDesc& v) {
  return std::vector<int64_t>(v.shape().begin(), v.shape().end());
}

TEST(CtrTest, BuildsWideAndDeepProgram) {
  auto registry = NewStandardOpRegistry();
  CtrOptions o;
  o.dict_size = 500;
  auto spec = BuildCtr(*registry, o);
  ASSERT_TRUE(spec.ok()) << spec.status();
  const BlockDesc& block = spec->main.blocks(0);
  for (int s : {0, 25}) {
    const VarDesc* emb = FindVarDesc(block, "emb_" + std::to_string(s));
    const VarDesc* wide = FindVarDesc(block, "wide_" + std::to_string(s));
    ASSERT_NE(emb, nullptr);
    ASSERT_NE(wide, nullptr);
    EXPECT_EQ(ShapeOf(*emb), (std::vector<int64_t>{500, 8}));
    EXPECT_EQ(ShapeOf(*wide), (std::vector<int64_t>{500, 1}));
    EXPECT_TRUE(emb->is_sparse());
    EXPECT_FALSE(emb->is_distributed());
    // Sparse tables get SelectedRows gradients.
    const VarDesc* grad = FindVarDesc(block, "emb_" + std::to_string(s) + "@GRAD");
    ASSERT_NE(grad, nullptr);
    EXPECT_EQ(grad->type(), SELECTED_ROWS);
  }
  EXPECT_EQ(FindVarDesc(block, "emb_26"), nullptr);
  // The deep layers: (26 * 8 + 13) -> 64 -> 32 -> 1.
  EXPECT_EQ(ShapeOf(*FindVarDesc(block, "deep_fc_0.w")), (std::vector<int64_t>{26 * 8 + 13, 64}));
  EXPECT_EQ(ShapeOf(*FindVarDesc(block, "deep_fc_1.w")), (std::vector<int64_t>{64, 32}));
  EXPECT_EQ(ShapeOf(*FindVarDesc(block, "deep_out.w")), (std::vector<int64_t>{32, 1}));
  EXPECT_EQ(ShapeOf(*FindVarDesc(block, "wide_dense.w")), (std::vector<int64_t>{13, 1}));
  int adam = 0;
  for (const auto& op : block.ops()) adam += op.type() == "adam";
  EXPECT_EQ(adam, 52 + 6 + 1);  // tables, deep weights and biases, the wide dense weight

  ASSERT_EQ(spec->feeds.slots.size(), 26u);
  EXPECT_EQ(spec->feeds.slots[3].name, "slot_3");
  EXPECT_EQ(spec->feeds.slots[3].dict_size, 500);
  EXPECT_EQ(spec->feeds.dense, "dense_input");
  EXPECT_EQ(spec->feeds.num_dense, 13);
  EXPECT_EQ(spec->feeds.label, "label");
  EXPECT_FALSE(spec->prediction.empty());

  // Distributed tables keep raw ids.
  o.is_distributed = true;
  auto dist = BuildCtr(*registry, o);
  ASSERT_TRUE(dist.ok()) << dist.status();
  EXPECT_TRUE(FindVarDesc(dist->main.blocks(0), "emb_0")->is_distributed());
  EXPECT_EQ(dist->feeds.slots[0].dict_size, 0);

  o = CtrOptions();
  o.optimizer = "rmsprop";
  auto bad = BuildCtr(*registry, o);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("'rmsprop'"), std::string::npos);
  o = CtrOptions();
  o.dict_sizes = {10, 20};
  EXPECT_FALSE(BuildCtr(*registry, o).ok());
}

// The example's claim: held-out AUC above 0.70 on synthetic click data.
TEST(CtrTest, ReachesHeldOutAucAboveSeventyPercent) {
  data::CtrDataOptions d;
  d.vocab_per_slot = 2000;
  d.seed = 11;
  d.model_seed = 5;
  auto train = data::MakeCtrData(40000, d);
  d.seed = 12;
  auto test = data::MakeCtrData(10000, d);
  ASSERT_TRUE(train.ok() && test.ok());

  auto registry = NewStandardOpRegistry();
  CtrOptions o;
  o.dict_size = 2000;
  auto spec = BuildCtr(*registry, o);
  ASSERT_TRUE(spec.ok()) << spec.status();
  std::ostringstream log;
  LocalTrainer::Options to;
  to.batch_size = 128;
  to.epochs = 2;
  to.seed = 3;
  to.log = &log;
  auto trainer = LocalTrainer::Create(registry.get(), *std::move(spec), to);
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  auto before = (*trainer)->Evaluate(*test);
  ASSERT_TRUE(before.ok()) << before.status();
  ASSERT_TRUE(before->has_auc);
  EXPECT_LT(before->auc, 0.65);  // the untrained model knows little
  auto epochs = (*trainer)->Train(*train);
  ASSERT_TRUE(epochs.ok()) << epochs.status();
  auto after = (*trainer)->Evaluate(*test);
  ASSERT_TRUE(after.ok()) << after.status();
  ASSERT_TRUE(after->has_auc);
  EXPECT_GT(after->auc, 0.70) << log.str();
  std::cout << "held-out AUC " << before->auc << " -> " << after->auc << "\n";
  EXPECT_LT(after->mean_loss, before->mean_loss);
  // The live progress lines carry the training batches' AUC, which rises above chance.
  std::string text = log.str();
  size_t last = text.rfind(" auc ");
  ASSERT_NE(last, std::string::npos) << text;
  EXPECT_GT(std::strtod(text.c_str() + last + 5, nullptr), 0.6) << text;
}

}  // namespace
}  // namespace examples
}  // namespace tessera
