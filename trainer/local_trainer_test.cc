#include "trainer/local_trainer.h"

#include <cmath>
#include <cstring>
#include <map>
#include <set>
#include <sstream>

#include "common/data/criteo.h"
#include "common/layers/layers.h"
#include "common/layers/optimizer.h"
#include "common/ops/ops.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

using data::Dataset;
using data::Example;

// y = 2 x0 - x1 + 0.5 on a grid, no noise.
Dataset LinearData(int n) {
  Dataset d;
  d.num_dense = 2;
  for (int i = 0; i < n; ++i) {
    float x0 = std::sin(0.37f * i), x1 = std::cos(0.91f * i + 0.3f);
    d.examples.push_back({{x0, x1}, {}, 2 * x0 - x1 + 0.5f});
  }
  return d;
}

class LocalTrainerTest : public ::testing::Test {
 protected:
  // Linear regression (or, with `logistic`, logistic regression whose prediction is the
  // sigmoid of the logit) trained by SGD.
  ModelSpec Linear(float lr, bool logistic = false) {
    ModelSpec m;
    ProgramBuilder b(&m.main, &m.startup);
    std::string x = layers::Data(b, "x", {-1, 2});
    std::string y = layers::Data(b, "y", {-1, 1});
    layers::FcOptions fc;
    fc.name = "fc";
    std::string out = layers::Fc(b, x, 1, fc);
    if (logistic) {
      m.loss = layers::Mean(b, layers::SigmoidCrossEntropyWithLogits(b, out, y));
      m.prediction = layers::Sigmoid(b, out);
    } else {
      m.loss = layers::Mean(b, layers::SquareError(b, out, y));
    }
    OptimizerOptions o;
    o.learning_rate = lr;
    auto pairs = SGD(o).Minimize(b, *registry_, m.loss);
    EXPECT_TRUE(pairs.ok()) << pairs.status();
    m.feeds.dense = "x";
    m.feeds.num_dense = 2;
    m.feeds.label = "y";
    return m;
  }

  std::unique_ptr<OpRegistry> registry_ = NewStandardOpRegistry();
  std::ostringstream log_;
};

TEST_F(LocalTrainerTest, ForwardProgramKeepsOnlyTheForwardOpsOfTheTargets) {
  ModelSpec m = Linear(0.1f, /*logistic=*/true);
  auto fwd = ForwardProgram(m.main, {m.loss});
  ASSERT_TRUE(fwd.ok()) << fwd.status();
  std::vector<std::string> types;
  for (const auto& op : fwd->blocks(0).ops()) {
    types.push_back(op.type());
    EXPECT_EQ(OpRoleOf(op) & (kRoleBackward | kRoleOptimize), 0) << OpSignature(op);
  }
  // The sigmoid of the prediction is not needed for the loss.
  EXPECT_EQ(types, (std::vector<std::string>{"mul", "elementwise_add",
                                             "sigmoid_cross_entropy_with_logits", "mean"}));
  EXPECT_EQ(FindVarDesc(fwd->blocks(0), "fc.w@GRAD"), nullptr);
  EXPECT_NE(FindVarDesc(fwd->blocks(0), "fc.w"), nullptr);

  auto both = ForwardProgram(m.main, {m.loss, m.prediction});
  ASSERT_TRUE(both.ok());
  EXPECT_EQ(both->blocks(0).ops_size(), 5);

  auto bad = ForwardProgram(m.main, {"fc.w@GRAD"});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("'fc.w@GRAD'"), std::string::npos);

  // Dropout runs in inference mode in the evaluation program (and stays as it was in training).
  ProgramDesc with_dropout = m.main;
  OpDesc* first = with_dropout.mutable_blocks(0)->mutable_ops(0);
  const std::string x = OpInputs(*first, "X")[0];
  OpDesc dropout = MakeOp("dropout", {{"X", {x}}}, {{"Out", {x + ".dropped"}}, {"Mask", {"mask"}}});
  SetAttr(&dropout, "is_test", false);
  SetAttr(&dropout, kOpRoleAttr, int64_t{kRoleForward});
  SetOpInputs(first, "X", {x + ".dropped"});
  *with_dropout.mutable_blocks(0)->add_ops() = dropout;
  auto* ops = with_dropout.mutable_blocks(0)->mutable_ops();
  for (int i = ops->size() - 1; i > 0; --i) ops->SwapElements(i, i - 1);  // dropout first
  auto eval = ForwardProgram(with_dropout, {m.loss});
  ASSERT_TRUE(eval.ok()) << eval.status();
  ASSERT_EQ(eval->blocks(0).ops(0).type(), "dropout");
  EXPECT_TRUE(GetBoolAttr(eval->blocks(0).ops(0), "is_test", false));
  EXPECT_FALSE(GetBoolAttr(with_dropout.blocks(0).ops(0), "is_test", true));
}

TEST_F(LocalTrainerTest, TrainsLinearRegressionAndLogsProgress) {
  LocalTrainer::Options o;
  o.batch_size = 8;
  o.epochs = 30;
  o.log_every_steps = 5;
  o.seed = 7;
  o.log = &log_;
  auto trainer = LocalTrainer::Create(registry_.get(), Linear(0.2f), o);
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  Dataset data = LinearData(100);
  auto before = (*trainer)->Evaluate(data);
  ASSERT_TRUE(before.ok()) << before.status();
  EXPECT_FALSE(before->has_auc);
  auto epochs = (*trainer)->Train(data);
  ASSERT_TRUE(epochs.ok()) << epochs.status();
  ASSERT_EQ(epochs->size(), 30u);
  EXPECT_EQ((*epochs)[0].samples, 100);
  EXPECT_EQ((*epochs)[0].steps, 13);  // 12 full batches and one of 4
  EXPECT_EQ((*trainer)->global_step(), 30 * 13);
  EXPECT_LT(epochs->back().mean_loss, (*epochs)[0].mean_loss * 0.01);
  auto after = (*trainer)->Evaluate(data);
  ASSERT_TRUE(after.ok()) << after.status();
  EXPECT_EQ(after->samples, 100);
  EXPECT_LT(after->mean_loss, 1e-4);
  EXPECT_GT(before->mean_loss, 0.1);
  // The learned parameters are the planted ones.
  const Tensor& w = (*trainer)->scope()->FindVar("fc.w")->Get<Tensor>();
  EXPECT_NEAR(w.data<float>()[0], 2.0f, 0.02f);
  EXPECT_NEAR(w.data<float>()[1], -1.0f, 0.02f);

  const std::string log = log_.str();
  EXPECT_NE(log.find("step 5 loss "), std::string::npos) << log;
  EXPECT_NE(log.find("step 390 loss "), std::string::npos) << log;
  EXPECT_NE(log.find(" samples/s "), std::string::npos) << log;
  EXPECT_NE(log.find("epoch 29 mean loss "), std::string::npos) << log;
}

TEST_F(LocalTrainerTest, SameSeedSameRunOtherSeedOtherOrder) {
  Dataset data = LinearData(50);
  auto run = [&](uint64_t seed) {
    LocalTrainer::Options o;
    o.batch_size = 4;
    o.epochs = 2;
    o.seed = seed;
    o.log = &log_;
    auto t = LocalTrainer::Create(registry_.get(), Linear(0.05f), o);
    EXPECT_TRUE(t.ok());
    auto e = (*t)->Train(data);
    EXPECT_TRUE(e.ok());
    return std::make_pair((*e)[0].mean_loss, (*e)[1].mean_loss);
  };
  auto a = run(1), b = run(1), c = run(2);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
}

TEST_F(LocalTrainerTest, EvaluateComputesAucWithoutChangingParameters) {
  // Separable along x0 - x1 > 0.
  Dataset data;
  data.num_dense = 2;
  for (int i = 0; i < 200; ++i) {
    float x0 = std::sin(1.3f * i), x1 = std::cos(0.7f * i);
    data.examples.push_back({{x0, x1}, {}, x0 - x1 > 0 ? 1.0f : 0.0f});
  }
  LocalTrainer::Options o;
  o.batch_size = 16;
  o.epochs = 20;
  o.log_every_steps = 0;
  o.log = &log_;
  auto trainer = LocalTrainer::Create(registry_.get(), Linear(0.5f, true), o);
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  ASSERT_TRUE((*trainer)->Train(data).ok());
  Tensor w = (*trainer)->scope()->FindVar("fc.w")->Get<Tensor>().Clone();
  auto r1 = (*trainer)->Evaluate(data);
  ASSERT_TRUE(r1.ok()) << r1.status();
  auto r2 = (*trainer)->Evaluate(data);
  ASSERT_TRUE(r2.ok());
  ASSERT_TRUE(r1->has_auc);
  EXPECT_GT(r1->auc, 0.97);
  EXPECT_EQ(r1->auc, r2->auc);
  EXPECT_EQ(r1->mean_loss, r2->mean_loss);
  const Tensor& w2 = (*trainer)->scope()->FindVar("fc.w")->Get<Tensor>();
  EXPECT_EQ(w.data<float>()[0], w2.data<float>()[0]);
  EXPECT_EQ(w.data<float>()[1], w2.data<float>()[1]);
  EXPECT_EQ(log_.str().find("step "), std::string::npos);  // log_every_steps = 0

  // One class only: no AUC, but the loss is still reported.
  Dataset ones = data;
  for (auto& e : ones.examples) e.label = 1;
  auto r3 = (*trainer)->Evaluate(ones);
  ASSERT_TRUE(r3.ok()) << r3.status();
  EXPECT_FALSE(r3->has_auc);
}

TEST_F(LocalTrainerTest, DivergenceIsReportedWithTheStep) {
  LocalTrainer::Options o;
  o.batch_size = 10;
  o.epochs = 100;
  o.log = &log_;
  auto trainer = LocalTrainer::Create(registry_.get(), Linear(50.0f), o);
  ASSERT_TRUE(trainer.ok());
  auto r = (*trainer)->Train(LinearData(100));
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("lower the learning rate"), std::string::npos) << r.status();
  EXPECT_NE(r.status().message().find("step "), std::string::npos);
}

TEST_F(LocalTrainerTest, BadOptionsAndSpecsAreRejected) {
  LocalTrainer::Options o;
  o.batch_size = 0;
  auto t = LocalTrainer::Create(registry_.get(), Linear(0.1f), o);
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("batch_size"), std::string::npos);

  o.batch_size = 4;
  ModelSpec m = Linear(0.1f);
  m.loss = "nope";
  t = LocalTrainer::Create(registry_.get(), m, o);
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("'nope'"), std::string::npos);

  m = Linear(0.1f);
  m.feeds.dense = "z";
  t = LocalTrainer::Create(registry_.get(), m, o);
  ASSERT_FALSE(t.ok());
  EXPECT_NE(t.status().message().find("'z'"), std::string::npos);

  // Data that does not fit the spec fails at the first step, naming the feed.
  t = LocalTrainer::Create(registry_.get(), Linear(0.1f), o);
  ASSERT_TRUE(t.ok());
  Dataset bad = LinearData(10);
  bad.examples[3].dense.pop_back();
  auto r = (*t)->TrainEpoch(bad);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("feed 'x'"), std::string::npos) << r.status();
  EXPECT_FALSE((*t)->TrainEpoch(Dataset()).ok());
}

}  // namespace
}  // namespace tessera

namespace tessera {
namespace {

// A trainer stopped after step 10 (on_step_end) and a fresh one given its parameters and
// ResumeAt(its position) end exactly where an uninterrupted run does.
TEST_F(LocalTrainerTest, ResumeAtContinuesFromTheSavedPosition) {
  const Dataset data = LinearData(50);  // 7 steps per epoch at batch 8 (the last one of 2)
  LocalTrainerOptions o;
  o.batch_size = 8;
  o.epochs = 2;
  o.log_every_steps = 0;
  o.log = &log_;
  auto straight = LocalTrainer::Create(registry_.get(), Linear(0.05f), o);
  ASSERT_TRUE(straight.ok());
  ASSERT_TRUE((*straight)->Train(data).ok());
  EXPECT_EQ((*straight)->global_step(), 14);

  TrainPosition saved;
  std::map<std::string, Tensor> params;
  LocalTrainerOptions stop = o;
  LocalTrainer* first_ptr = nullptr;
  stop.on_step_end = [&](const TrainPosition& p) {
    if (p.global_step < 10) return absl::OkStatus();
    saved = p;
    for (const char* name : {"fc.w", "fc.b"}) {
      params[name] = first_ptr->scope()->FindVar(name)->Get<Tensor>().Clone();
    }
    return absl::CancelledError("stop");
  };
  auto first = LocalTrainer::Create(registry_.get(), Linear(0.05f), stop);
  ASSERT_TRUE(first.ok());
  first_ptr = first->get();
  EXPECT_EQ((*first)->Train(data).status().code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(saved.global_step, 10);
  EXPECT_EQ(saved.epoch, 1);
  EXPECT_EQ(saved.step_in_epoch, 3);

  LocalTrainerOptions rest = o;
  rest.epochs = static_cast<int>(o.epochs - saved.epoch);
  auto second = LocalTrainer::Create(registry_.get(), Linear(0.05f), rest);
  ASSERT_TRUE(second.ok());
  for (const auto& [name, t] : params) {
    (*second)->scope()->FindVar(name)->GetMutable<Tensor>()->CopyFrom(t);
  }
  (*second)->ResumeAt(saved);
  ASSERT_TRUE((*second)->Train(data).ok());
  EXPECT_EQ((*second)->global_step(), 14);
  EXPECT_EQ((*second)->epochs_done(), 2);
  for (const char* name : {"fc.w", "fc.b"}) {
    const Tensor& a = (*straight)->scope()->FindVar(name)->Get<Tensor>();
    const Tensor& b = (*second)->scope()->FindVar(name)->Get<Tensor>();
    EXPECT_EQ(0, std::memcmp(a.raw_data(), b.raw_data(), a.nbytes())) << name;
  }
}

// Click data in a Criteo-format file (2 dense counts, no categorical field).
std::string WriteClickFile(const std::string& name, int n) {
  Dataset d;
  d.num_dense = 2;
  for (int i = 0; i < n; ++i) {
    d.examples.push_back({{data::DenseFromCount(i % 7), data::DenseFromCount(i % 5)},
                          {},
                          i % 3 == 0 ? 1.0f : 0.0f});
  }
  const std::string path = ::testing::TempDir() + "/" + name;
  EXPECT_TRUE(data::WriteCriteoFile(path, d).ok());
  return path;
}

LocalTrainer::StreamFactory StreamOf(const std::string& path, int64_t shuffle_buffer = 0) {
  return [path, shuffle_buffer](int64_t epoch) {
    data::ExampleStreamOptions so;
    so.format.num_dense = 2;
    so.format.num_sparse = 0;
    so.shuffle_buffer = shuffle_buffer;
    so.shuffle_seed = static_cast<uint64_t>(epoch);
    return data::ExampleStream::Open({data::DataShard{path}}, so);
  };
}

bool SameParams(LocalTrainer* a, LocalTrainer* b) {
  for (const char* name : {"fc.w", "fc.b"}) {
    const Tensor& x = a->scope()->FindVar(name)->Get<Tensor>();
    const Tensor& y = b->scope()->FindVar(name)->Get<Tensor>();
    if (x.nbytes() != y.nbytes() || std::memcmp(x.raw_data(), y.raw_data(), x.nbytes()) != 0) {
      return false;
    }
  }
  return true;
}

// A file streamed in order trains exactly as the same examples held in memory, unshuffled.
TEST_F(LocalTrainerTest, StreamedDataTrainsAsInMemoryData) {
  const std::string path = WriteClickFile("stream_equal.txt", 50);
  auto mem = data::ReadCriteoFile(path, 2, 0);
  ASSERT_TRUE(mem.ok()) << mem.status();
  LocalTrainerOptions o;
  o.batch_size = 8;
  o.epochs = 2;
  o.shuffle = false;
  o.log_every_steps = 3;
  o.log = &log_;
  std::vector<TrainPosition> positions;
  auto in_memory = LocalTrainer::Create(registry_.get(), Linear(0.1f, true), o);
  ASSERT_TRUE(in_memory.ok());
  ASSERT_TRUE((*in_memory)->Train(*mem).ok());
  o.on_step_end = [&](const TrainPosition& p) {
    positions.push_back(p);
    return absl::OkStatus();
  };
  auto streamed = LocalTrainer::Create(registry_.get(), Linear(0.1f, true), o);
  ASSERT_TRUE(streamed.ok());
  auto stats = (*streamed)->Train(StreamOf(path));
  ASSERT_TRUE(stats.ok()) << stats.status();
  ASSERT_EQ(stats->size(), 2u);
  EXPECT_EQ((*stats)[0].steps, 7);  // 6 of 8 examples and 1 of 2
  EXPECT_EQ((*stats)[0].samples, 50);
  EXPECT_EQ((*streamed)->global_step(), 14);
  EXPECT_TRUE(SameParams(in_memory->get(), streamed->get()));
  // The last step of an epoch reports the next epoch's start.
  ASSERT_EQ(positions.size(), 14u);
  EXPECT_EQ(positions[5].epoch, 0);
  EXPECT_EQ(positions[5].step_in_epoch, 6);
  EXPECT_EQ(positions[6].epoch, 1);
  EXPECT_EQ(positions[6].step_in_epoch, 0);
  EXPECT_NE(log_.str().find("step 3 loss"), std::string::npos) << log_.str();
}

// Sync mode: the other trainers may end the epoch first; each step says whether this trainer
// has a batch after it. A resumed epoch skips the examples of the steps before the checkpoint.
TEST_F(LocalTrainerTest, StreamedEpochEndsWhenAnyTrainerRunsOutAndResumes) {
  const std::string path = WriteClickFile("stream_agree.txt", 40);
  LocalTrainerOptions o;
  o.batch_size = 8;
  o.epochs = 1;
  o.log_every_steps = 0;
  o.log = &log_;
  std::vector<bool> lasts;
  int64_t steps = 0;
  o.before_stream_step = [&](bool last) { lasts.push_back(last); };
  o.stream_epoch_ends = [&] { return steps == 3; };
  o.after_step = [&](int64_t, double, int64_t) { ++steps; };
  auto agreed = LocalTrainer::Create(registry_.get(), Linear(0.1f, true), o);
  ASSERT_TRUE(agreed.ok());
  auto stats = (*agreed)->Train(StreamOf(path, /*shuffle_buffer=*/16));
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ((*stats)[0].steps, 3);
  EXPECT_EQ(lasts, (std::vector<bool>{false, false, false}));
  EXPECT_NE(log_.str().find("epoch 0 ended when another trainer ran out of data"),
            std::string::npos)
      << log_.str();
  EXPECT_EQ((*agreed)->epochs_done(), 1);

  // Alone, the same stream runs 5 steps, the last one saying so.
  lasts.clear();
  o.stream_epoch_ends = nullptr;
  o.epochs = 1;
  auto alone = LocalTrainer::Create(registry_.get(), Linear(0.1f, true), o);
  ASSERT_TRUE((*alone)->Train(StreamOf(path, 16)).ok());
  EXPECT_EQ(lasts, (std::vector<bool>{false, false, false, false, true}));

  // Stopped after step 2 and resumed there: the same parameters as the uninterrupted run.
  std::map<std::string, Tensor> params;
  TrainPosition saved;
  LocalTrainer* first_ptr = nullptr;
  LocalTrainerOptions stop = o;
  stop.on_step_end = [&](const TrainPosition& p) {
    if (p.global_step < 2) return absl::OkStatus();
    saved = p;
    for (const char* name : {"fc.w", "fc.b"}) {
      params[name] = first_ptr->scope()->FindVar(name)->Get<Tensor>().Clone();
    }
    return absl::CancelledError("stop");
  };
  auto first = LocalTrainer::Create(registry_.get(), Linear(0.1f, true), stop);
  first_ptr = first->get();
  EXPECT_EQ((*first)->Train(StreamOf(path, 16)).status().code(), absl::StatusCode::kCancelled);
  ASSERT_EQ(saved.step_in_epoch, 2);
  auto second = LocalTrainer::Create(registry_.get(), Linear(0.1f, true), o);
  for (const auto& [name, t] : params) {
    (*second)->scope()->FindVar(name)->GetMutable<Tensor>()->CopyFrom(t);
  }
  (*second)->ResumeAt(saved);
  ASSERT_TRUE((*second)->Train(StreamOf(path, 16)).ok());
  EXPECT_EQ((*second)->global_step(), 5);
  EXPECT_TRUE(SameParams(alone->get(), second->get()));

  // A checkpoint's position past the end of the data (the files or the batch changed) is an
  // error, not an empty epoch.
  auto past = LocalTrainer::Create(registry_.get(), Linear(0.1f, true), o);
  (*past)->ResumeAt(TrainPosition{10, 0, 10});
  absl::Status beyond = (*past)->Train(StreamOf(path, 16)).status();
  EXPECT_EQ(beyond.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(beyond.message().find("needs 80 examples of trainer 0's data, which holds only 40"),
            std::string::npos)
      << beyond;

  // A stream without any example is an error naming the epoch.
  const std::string empty = ::testing::TempDir() + "/stream_empty.txt";
  ASSERT_TRUE(data::WriteCriteoFile(empty, Dataset{2, 0}).ok());
  auto none = LocalTrainer::Create(registry_.get(), Linear(0.1f, true), o);
  absl::Status s = (*none)->Train(StreamOf(empty)).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("epoch 0: trainer 0 has no training example"), std::string::npos)
      << s;
}

}  // namespace
}  // namespace tessera
