#include "trainer/training_data.h"

#include <stdlib.h>

#include <fstream>
#include <set>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "common/data/criteo.h"
#include "common/data/synthetic.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

using ::testing::HasSubstr;

std::string TempDir() {
  std::string dir = absl::StrCat(::testing::TempDir(), "/training_data_test_XXXXXX");
  EXPECT_NE(mkdtemp(dir.data()), nullptr);
  return dir;
}

// Three Criteo files of 100 CTR examples each, whose first categorical id tells them apart.
std::string WriteFiles() {
  const std::string dir = TempDir();
  for (int f = 0; f < 3; ++f) {
    data::CtrDataOptions o;
    o.seed = 1 + f;
    auto d = data::MakeCtrData(100, o);
    EXPECT_TRUE(d.ok());
    for (int i = 0; i < 100; ++i) d->examples[i].sparse[0] = f * 1000 + i;
    EXPECT_TRUE(data::WriteCriteoFile(absl::StrCat(dir, "/part-", f), *d).ok());
  }
  return dir;
}

TEST(TrainingDataTest, StreamedTrainersReadDisjointSharesOfEveryEpoch) {
  const std::string dir = WriteFiles();
  for (int64_t epoch : {0, 1}) {
    std::set<int64_t> seen;
    for (int rank = 0; rank < 2; ++rank) {
      ClusterConfig c;
      c.reader = "stream";
      c.train_data = dir;
      c.trainers = 2;
      c.trainer_id = rank;
      c.shuffle_buffer = 16;
      MetricsRegistry metrics;
      std::ostringstream log;
      auto data = TrainingData::Open(c, FeedSpec{}, &metrics, &log);
      ASSERT_TRUE(data.ok()) << data.status();
      EXPECT_TRUE((*data)->streamed());
      EXPECT_TRUE((*data)->train().examples.empty());
      EXPECT_EQ((*data)->Describe(), "streaming 3 data files");
      auto stream = (*data)->streams()(epoch);
      ASSERT_TRUE(stream.ok()) << stream.status();
      data::Example e;
      while (*(*stream)->Next(&e)) {
        EXPECT_TRUE(seen.insert(e.sparse[0]).second) << e.sparse[0] << " read twice";
      }
    }
    EXPECT_EQ(seen.size(), 300u) << "epoch " << epoch;
  }
}

TEST(TrainingDataTest, BadLinesAreLoggedAndCountedForMemoryAndStreams) {
  const std::string dir = WriteFiles();
  std::ofstream(dir + "/part-1", std::ios::app) << "not a line\n";
  ClusterConfig c;
  c.train_data = dir;
  c.max_bad_lines = 5;
  {
    MetricsRegistry metrics;
    std::ostringstream log;
    auto data = TrainingData::Open(c, FeedSpec{}, &metrics, &log);
    ASSERT_TRUE(data.ok()) << data.status();
    EXPECT_EQ((*data)->train().examples.size(), 300u);
    EXPECT_EQ((*data)->Describe(), "300 training examples");
    EXPECT_THAT(log.str(), HasSubstr("skipped 1 bad lines of train data (--max_bad_lines=5)"));
    auto counter = metrics.GetCounter("tessera_trainer_data_bad_lines_total", "",
                                      {{"trainer_id", "0"}, {"data", "train"}});
    ASSERT_TRUE(counter.ok());
    EXPECT_EQ((*counter)->Value(), 1);
  }
  c.reader = "stream";
  MetricsRegistry metrics;
  std::ostringstream log;
  auto data = TrainingData::Open(c, FeedSpec{}, &metrics, &log);
  ASSERT_TRUE(data.ok()) << data.status();
  auto stream = (*data)->streams()(0);
  ASSERT_TRUE(stream.ok());
  EXPECT_EQ(*(*stream)->Skip(1000), 300);
  stream->reset();  // the reader thread reported before it ended
  (*data)->ReportStreamBadLines();
  EXPECT_THAT(log.str(), HasSubstr("epoch 0: skipped 1 bad lines of train data"));
  auto counter = metrics.GetCounter("tessera_trainer_data_bad_lines_total", "",
                                    {{"trainer_id", "0"}, {"data", "train"}});
  EXPECT_EQ((*counter)->Value(), 1);
  // A missing data directory names itself.
  c.train_data = dir + "/missing";
  EXPECT_THAT(std::string(TrainingData::Open(c, FeedSpec{}, &metrics, &log).status().message()),
              HasSubstr(dir + "/missing"));
}

}  // namespace
}  // namespace tessera
