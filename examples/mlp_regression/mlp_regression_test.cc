#include <sstream>

#include "common/data/synthetic.h"
#include "common/ops/ops.h"
#include "examples/mlp_regression/model.h"
#include "gtest/gtest.h"
#include "trainer/local_trainer.h"

namespace tessera {
namespace examples {
namespace {

TEST(MlpRegressionTest, BuildsTheClassicPerceptron) {
  auto registry = NewStandardOpRegistry();
  auto spec = BuildMlpRegression(*registry);
  ASSERT_TRUE(spec.ok()) << spec.status();
  const BlockDesc& block = spec->main.blocks(0);
  const VarDesc* w1 = FindVarDesc(block, "hidden.w");
  const VarDesc* w2 = FindVarDesc(block, "output.w");
  ASSERT_NE(w1, nullptr);
  ASSERT_NE(w2, nullptr);
  EXPECT_EQ(std::vector<int64_t>(w1->shape().begin(), w1->shape().end()),
            (std::vector<int64_t>{10, 100}));
  EXPECT_EQ(std::vector<int64_t>(w2->shape().begin(), w2->shape().end()),
            (std::vector<int64_t>{100, 1}));
  int momentum_ops = 0, relu_ops = 0;
  for (const auto& op : block.ops()) {
    momentum_ops += op.type() == "momentum";
    relu_ops += op.type() == "relu";
    if (op.type() == "momentum") {
      EXPECT_NEAR(GetFloatAttr(op, "mu", 0), 0.9, 1e-6);
    }
  }
  EXPECT_EQ(momentum_ops, 4);  // two weights, two biases
  EXPECT_EQ(relu_ops, 1);
  EXPECT_EQ(spec->feeds.dense, "x");
  EXPECT_EQ(spec->feeds.num_dense, 10);
  EXPECT_EQ(spec->feeds.label, "y");
  EXPECT_TRUE(spec->prediction.empty());

  MlpRegressionOptions bad;
  bad.learning_rate = -1;
  EXPECT_FALSE(BuildMlpRegression(*registry, bad).ok());
}

// The example's claim: held-out MSE below 1.5 (the noise alone is 0.5) well within 100 epochs.
TEST(MlpRegressionTest, ReachesMseBelowOneAndAHalf) {
  auto registry = NewStandardOpRegistry();
  auto spec = BuildMlpRegression(*registry);
  ASSERT_TRUE(spec.ok()) << spec.status();
  auto train = data::MakeRegressionData(10000, 1);
  auto test = data::MakeRegressionData(2000, 1001);
  ASSERT_TRUE(train.ok() && test.ok());
  std::ostringstream log;
  LocalTrainer::Options o;
  o.batch_size = 32;
  o.epochs = 5;
  o.seed = 1;
  o.log = &log;
  auto trainer = LocalTrainer::Create(registry.get(), *std::move(spec), o);
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  auto before = (*trainer)->Evaluate(*test);
  ASSERT_TRUE(before.ok()) << before.status();
  auto epochs = (*trainer)->Train(*train);
  ASSERT_TRUE(epochs.ok()) << epochs.status();
  auto after = (*trainer)->Evaluate(*test);
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_GT(before->mean_loss, 100.0);  // the targets are around 37.5
  EXPECT_LT(after->mean_loss, 1.5) << log.str();
  EXPECT_GT(after->mean_loss, 0.3);  // it cannot beat the noise by much
  EXPECT_LT(epochs->back().mean_loss, epochs->front().mean_loss);
}

}  // namespace
}  // namespace examples
}  // namespace tessera
