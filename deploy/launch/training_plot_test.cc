#include "deploy/launch/training_plot.h"

#include <sys/stat.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

using ::testing::HasSubstr;

std::string Tmp(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return std::string(dir != nullptr ? dir : "/tmp") + "/" + name;
}

std::string Read(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TEST(TrainingPlotTest, ParsesOnlyStepLines) {
  auto points = ParseTrainingLog(
      "trainer 0/2: example mlp_regression, 20000 training examples\n"
      "step 20 loss 617.421 samples/s 12415\n"
      "epoch 0 mean loss 175.805 samples 10000 samples/s 26317 seconds 0.38\n"
      "step 40 loss 5.5e-3 samples/s 35550\r\n"
      "step 60 (epoch 1): loss 'nan' is not finite\n"
      "step x loss 1 samples/s 2\n"
      "step 80 loss 1 samples/s\n"
      "step 100 loss 0.5 samples/s 900 eta 12s\n"
      "step 120 loss 0.4 samples/s 950 eta 3s auc 0.8123\n");
  ASSERT_EQ(points.size(), 4u);
  EXPECT_EQ(points[3].step, 120);
  EXPECT_EQ(points[2].step, 100);
  EXPECT_DOUBLE_EQ(points[2].samples_per_s, 900);
  EXPECT_EQ(points[0].step, 20);
  EXPECT_DOUBLE_EQ(points[0].loss, 617.421);
  EXPECT_DOUBLE_EQ(points[0].samples_per_s, 12415);
  EXPECT_EQ(points[1].step, 40);
  EXPECT_DOUBLE_EQ(points[1].loss, 5.5e-3);
  EXPECT_DOUBLE_EQ(points[1].samples_per_s, 35550);
}

TEST(TrainingPlotTest, CsvReplacesTheFile) {
  std::string csv = Tmp("t.csv");
  std::ofstream(csv) << "old,content\n";
  ASSERT_TRUE(WriteTrainingCsv({{1, 2.5, 100}, {2, 1.25, 200}}, csv).ok());
  EXPECT_EQ(Read(csv),
            "step,loss,samples_per_s,eval_loss,eval_auc,eval_accuracy\n1,2.5,100,,,\n2,1.25,200,,,\n");
}

TEST(TrainingPlotTest, HeldOutEvaluationsBecomeEvalColumns) {
  auto points = ParseTrainingLog(
      "step 10 loss 0.7 samples/s 900\n"
      "trainer 0: held-out loss 0.512 auc 0.75 on 301 examples at step 10 (2 trainers)\n"
      "trainer 0: held-out loss 0.25 accuracy 0.875 on 8 examples at step 20 (1 trainer)\n"
      "trainer 0: held-out loss nope at step 30\n");
  ASSERT_EQ(points.size(), 3u);
  EXPECT_TRUE(points[1].eval);
  EXPECT_EQ(points[1].step, 10);
  EXPECT_DOUBLE_EQ(points[1].eval_auc, 0.75);
  EXPECT_TRUE(std::isnan(points[1].eval_accuracy));
  std::string csv = Tmp("eval.csv");
  ASSERT_TRUE(WriteTrainingCsv(points, csv).ok());
  EXPECT_EQ(Read(csv),
            "step,loss,samples_per_s,eval_loss,eval_auc,eval_accuracy\n10,0.7,900,,,\n"
            "10,,,0.512,0.75,\n20,,,0.25,,0.875\n");
}

TEST(TrainingPlotTest, ScriptQuotesPaths) {
  std::string s = TrainingPlotScript("/a/it's.csv", "/b/p.png", true);
  EXPECT_THAT(s, HasSubstr("set output '/b/p.png'\n"));
  EXPECT_THAT(s, HasSubstr("plot '/a/it''s.csv' using 1:2"));
  EXPECT_THAT(s, HasSubstr("\nset logscale y\n"));
  EXPECT_THAT(TrainingPlotScript("a", "b", false), ::testing::Not(HasSubstr("\nset logscale y\n")));
}

TEST(TrainingPlotTest, DrawsAPngWhenGnuplotExists) {
  std::string gnuplot = FindInPath("gnuplot");
  if (gnuplot.empty()) GTEST_SKIP() << "gnuplot is not installed (deploy/setup installs it)";
  std::string csv = Tmp("p.csv"), png = Tmp("p.png");
  ASSERT_TRUE(WriteTrainingCsv({{10, 5, 1000}, {20, 2, 1500}, {30, 1, 1400}}, csv).ok());
  absl::Status s = PlotTraining(gnuplot, csv, png, true);
  ASSERT_TRUE(s.ok()) << s;
  std::string data = Read(png);
  ASSERT_GT(data.size(), 1000u);
  EXPECT_EQ(data.substr(0, 8), "\x89PNG\r\n\x1a\n");
  EXPECT_THAT(Read(Tmp("p.gnuplot")), HasSubstr("set terminal pngcairo"));
}

TEST(TrainingPlotTest, GnuplotFailureIsReportedWithItsMessage) {
  std::string fake = Tmp("fake_gnuplot");
  std::ofstream(fake) << "#!/bin/sh\necho 'line 3: unknown terminal' >&2\nexit 1\n";
  ::chmod(fake.c_str(), 0755);
  absl::Status s = PlotTraining(fake, Tmp("q.csv"), Tmp("q.png"), true);
  ASSERT_FALSE(s.ok());
  EXPECT_THAT(std::string(s.message()), HasSubstr(Tmp("q.png")));
  EXPECT_THAT(std::string(s.message()), HasSubstr("unknown terminal"));
  std::string hang = Tmp("hang_gnuplot");
  std::ofstream(hang) << "#!/bin/sh\nexec sleep 60\n";
  ::chmod(hang.c_str(), 0755);
  s = PlotTraining(hang, Tmp("q.csv"), Tmp("q.png"), true, absl::Milliseconds(200));
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
}

TEST(TrainingPlotTest, FindInPath) {
  EXPECT_FALSE(FindInPath("sh").empty());
  EXPECT_EQ(FindInPath("no-such-program-tessera"), "");
}

}  // namespace
}  // namespace tessera
