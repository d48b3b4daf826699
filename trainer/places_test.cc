// Multi-place trainers: the program split, the CPU reducer, and LocalTrainer with cpu_places
// K = 1, 2, 3 ending with the same parameters (MLP, and the CTR model's sparse gradients).
#include "trainer/places.h"

#include <cmath>
#include <map>

#include "common/framework/op_desc.h"
#include "common/ops/ops.h"
#include "examples/registry.h"
#include "gtest/gtest.h"
#include "tests/equivalence_util.h"
#include "trainer/local_trainer.h"

namespace tessera {
namespace {

ModelSpec Mlp(const OpRegistry& registry) {
  examples::ExampleOptions eo;
  eo.name = "mlp_regression";
  auto m = examples::BuildExampleModel(registry, eo);
  EXPECT_TRUE(m.ok()) << m.status();
  return *m;
}

TEST(SplitForPlacesTest, CutsAtTheFirstOpAfterBackward) {
  auto registry = NewStandardOpRegistry();
  ModelSpec m = Mlp(*registry);
  auto split = SplitForPlaces(m.main);
  ASSERT_TRUE(split.ok()) << split.status();
  const BlockDesc& block = m.main.blocks(0);
  ASSERT_LT(split->boundary, block.ops_size());
  EXPECT_NE(OpRoleOf(block.ops(split->boundary)) & kRoleOptimize, 0);
  EXPECT_EQ(split->place.blocks(0).ops_size(), split->boundary);
  EXPECT_EQ(split->rest.blocks(0).ops_size(), block.ops_size() - split->boundary);
  for (const auto& op : split->place.blocks(0).ops()) {
    EXPECT_EQ(OpRoleOf(op) & (kRoleOptimize | kRoleRPC | kRoleDist), 0) << OpSignature(op);
  }
  // Every parameter's gradient is combined, nothing else.
  std::set<std::string> want;
  for (const auto& v : block.vars()) {
    if (v.trainable()) want.insert(GradVarName(v.name()));
  }
  EXPECT_EQ(std::set<std::string>(split->reduced.begin(), split->reduced.end()), want);
  for (const auto& name : split->place_locals) {
    const VarDesc* v = FindVarDesc(block, name);
    EXPECT_TRUE(v == nullptr || !v->persistable()) << name;
  }
}

TEST(SplitForPlacesTest, RejectsProgramsOfAnotherShape) {
  auto registry = NewStandardOpRegistry();
  ModelSpec m = Mlp(*registry);
  const BlockDesc& block = m.main.blocks(0);
  auto split = SplitForPlaces(m.main);
  ASSERT_TRUE(split.ok());
  const int boundary = split->boundary;

  // No backward op: forward only.
  ProgramDesc fwd = m.main;
  fwd.mutable_blocks(0)->mutable_ops()->DeleteSubrange(boundary - 1,
                                                       block.ops_size() - boundary + 1);
  while (fwd.blocks(0).ops_size() > 0 &&
         (OpRoleOf(fwd.blocks(0).ops(fwd.blocks(0).ops_size() - 1)) & kRoleBackward) != 0) {
    fwd.mutable_blocks(0)->mutable_ops()->RemoveLast();
  }
  auto none = SplitForPlaces(fwd);
  ASSERT_FALSE(none.ok());
  EXPECT_NE(none.status().message().find("no backward op"), std::string::npos) << none.status();

  // A forward op after the optimizer.
  ProgramDesc late = m.main;
  *late.mutable_blocks(0)->add_ops() = block.ops(0);
  auto after = SplitForPlaces(late);
  ASSERT_FALSE(after.ok());
  EXPECT_NE(after.status().message().find(absl::StrCat("op #", block.ops_size(), " ")),
            std::string::npos)
      << after.status();
  EXPECT_NE(after.status().message().find("forward"), std::string::npos) << after.status();

  // An optimize op before the forward pass.
  ProgramDesc early = m.main;
  auto* ops = early.mutable_blocks(0)->mutable_ops();
  *ops->Add() = block.ops(boundary);
  for (int i = ops->size() - 1; i > 0; --i) ops->SwapElements(i, i - 1);
  auto before = SplitForPlaces(early);
  ASSERT_FALSE(before.ok());
  EXPECT_NE(before.status().message().find("op #0 momentum"), std::string::npos) << before.status();

  // A backward op writing a parameter.
  ProgramDesc writes = m.main;
  OpDesc* grad_op = writes.mutable_blocks(0)->mutable_ops(boundary - 1);
  const std::string param = GetStringsAttr(block.ops(boundary), kOpRoleVarAttr)[0];
  std::string out = AllOutputArgs(*grad_op)[0];
  RenameOpOutput(grad_op, out, param);
  auto persist = SplitForPlaces(writes);
  ASSERT_FALSE(persist.ok());
  EXPECT_NE(persist.status().message().find("persistable variable '" + param + "'"),
            std::string::npos)
      << persist.status();

  // An activation read after the cut.
  ProgramDesc reads = m.main;
  OpDesc* opt = reads.mutable_blocks(0)->mutable_ops(boundary);
  const std::string grad = OpInput(*opt, "Grad");
  const std::string act = AllOutputArgs(block.ops(0))[0];
  RenameOpInput(opt, grad, act);
  auto activation = SplitForPlaces(reads);
  ASSERT_FALSE(activation.ok());
  EXPECT_NE(activation.status().message().find("'" + act + "'"), std::string::npos)
      << activation.status();
}

Tensor Filled(Shape shape, float start) {
  Tensor t(FLOAT32, shape);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = start + static_cast<float>(i);
  return t;
}

TEST(CpuPlaceReducerTest, WeightedSumOfDenseAndSparse) {
  CpuPlaceReducer reducer;
  Variable a, b, out;
  *a.GetMutable<Tensor>() = Filled({2, 2}, 1);
  *b.GetMutable<Tensor>() = Filled({2, 2}, 10);
  ASSERT_TRUE(reducer.WeightedSum("g", {&a, &b}, {0.25, 0.75}, &out).ok());
  const Tensor& sum = out.Get<Tensor>();
  for (int i = 0; i < 4; ++i) {
    EXPECT_FLOAT_EQ(sum.data<float>()[i], 0.25f * (1 + i) + 0.75f * (10 + i));
  }
  EXPECT_NE(sum.raw_data(), a.Get<Tensor>().raw_data());  // its own buffer

  Variable s0, s1, merged;
  SelectedRows* r0 = s0.GetMutable<SelectedRows>();
  r0->height = 5;
  r0->rows = {4, 1};
  r0->value = Filled({2, 3}, 1);
  SelectedRows* r1 = s1.GetMutable<SelectedRows>();
  r1->height = 5;
  r1->rows = {1};
  r1->value = Filled({1, 3}, 100);
  ASSERT_TRUE(reducer.WeightedSum("e", {&s0, &s1}, {0.5, 0.5}, &merged).ok());
  const SelectedRows& m = merged.Get<SelectedRows>();
  EXPECT_EQ(m.height, 5);
  EXPECT_EQ(m.rows, (std::vector<int64_t>{4, 1, 1}));
  ASSERT_EQ(m.value.shape(), (Shape{3, 3}));
  EXPECT_FLOAT_EQ(m.value.data<float>()[0], 0.5f);
  EXPECT_FLOAT_EQ(m.value.data<float>()[8], 51.0f);

  // Disagreements name the variable and the place.
  Variable c;
  *c.GetMutable<Tensor>() = Filled({3, 2}, 0);
  absl::Status shape = reducer.WeightedSum("g", {&a, &c}, {0.5, 0.5}, &out);
  EXPECT_EQ(shape.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(shape.message().find("'g'"), std::string::npos) << shape;
  EXPECT_NE(shape.message().find("place 1"), std::string::npos) << shape;
  absl::Status kind = reducer.WeightedSum("e", {&s0, &a}, {0.5, 0.5}, &out);
  EXPECT_NE(kind.message().find("place 1 has a dense tensor"), std::string::npos) << kind;
  Variable empty;
  absl::Status missing = reducer.WeightedSum("g", {&a, &empty}, {0.5, 0.5}, &out);
  EXPECT_NE(missing.message().find("place 1 did not compute it"), std::string::npos) << missing;

  Variable cat;
  ASSERT_TRUE(reducer.ConcatRows("p", {&a, &b}, &cat).ok());
  ASSERT_EQ(cat.Get<Tensor>().shape(), (Shape{4, 2}));
  EXPECT_FLOAT_EQ(cat.Get<Tensor>().data<float>()[4], 10.0f);
}

using TrainRun = LocalRun;

TrainRun Train(const examples::ExampleOptions& eo, int64_t batch, int places, int epochs,
               absl::Status* create_status = nullptr) {
  LocalTrainerOptions lo;
  lo.batch_size = batch;
  lo.epochs = epochs;
  lo.seed = 9;
  lo.log_every_steps = 3;
  lo.cpu_places = places;
  TrainRun run = TrainLocally(eo, lo);
  if (create_status != nullptr) *create_status = run.create_status;
  return run;
}

TEST(LocalTrainerPlacesTest, OneTwoAndThreePlacesTrainTheSameMlp) {
  examples::ExampleOptions eo;
  eo.name = "mlp_regression";
  eo.num_examples = 250;  // batches of 16 and a last one of 10: divisible by neither 3 nor 4
  eo.num_test_examples = 10;
  eo.seed = 3;
  const TrainRun one = Train(eo, 16, 1, 2);
  ASSERT_FALSE(one.params.empty());
  for (int k : {2, 3}) {
    const TrainRun run = Train(eo, 16, k, 2);
    ExpectParamsClose(run.params, one.params, 1e-5, absl::StrCat(k, " places"));
    ASSERT_EQ(run.epochs.size(), one.epochs.size());
    for (size_t e = 0; e < one.epochs.size(); ++e) {
      EXPECT_EQ(run.epochs[e].samples, one.epochs[e].samples);
      EXPECT_NEAR(run.epochs[e].mean_loss, one.epochs[e].mean_loss,
                  1e-5 * std::fabs(one.epochs[e].mean_loss));
    }
  }
  // Some parameter moved: the comparison is not between two untrained models.
  const TrainRun untrained = Train(eo, 16, 1, 0);
  double moved = 0;
  for (const auto& [name, t] : one.params) {
    for (int64_t i = 0; i < t.numel(); ++i) {
      moved = std::max<double>(
          moved, std::fabs(t.data<float>()[i] - untrained.params.at(name).data<float>()[i]));
    }
  }
  EXPECT_GT(moved, 1e-3);
}

TEST(LocalTrainerPlacesTest, BatchesSmallerThanThePlacesStillTrain) {
  examples::ExampleOptions eo;
  eo.name = "mlp_regression";
  eo.num_examples = 41;  // batches of 2 and a last one of 1, on 3 places
  eo.num_test_examples = 10;
  eo.seed = 5;
  const TrainRun one = Train(eo, 2, 1, 1);
  const TrainRun three = Train(eo, 2, 3, 1);
  // Steps of 1-2 examples at the example's learning rate amplify float rounding more.
  ExpectParamsClose(three.params, one.params, 1e-4, "batch 2 on 3 places");
  ASSERT_EQ(three.epochs.size(), 1u);
  EXPECT_EQ(three.epochs[0].samples, 41);
}

TEST(LocalTrainerPlacesTest, CtrSparseGradientsOnTwoPlaces) {
  examples::ExampleOptions eo;
  eo.name = "ctr";
  eo.num_examples = 300;
  eo.num_test_examples = 10;
  eo.vocab_per_slot = 200;
  eo.seed = 2;
  const TrainRun one = Train(eo, 32, 1, 1);
  const TrainRun two = Train(eo, 32, 2, 1);
  ASSERT_FALSE(one.params.empty());
  ExpectParamsClose(two.params, one.params, 1e-4, "ctr on 2 places");
}

TEST(LocalTrainerPlacesTest, RejectsZeroPlaces) {
  examples::ExampleOptions eo;
  eo.name = "mlp_regression";
  eo.num_examples = 10;
  eo.num_test_examples = 1;
  absl::Status s;
  Train(eo, 4, 0, 1, &s);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("cpu_places must be >= 1, got 0"), std::string::npos) << s;
}

}  // namespace
}  // namespace tessera
