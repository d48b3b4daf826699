#include "trainer/checkpoints.h"

#include <stdlib.h>

#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/io/checkpoint_io.h"
#include "common/io/file_system.h"
#include "common/rpc/answering_client.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

using ::testing::HasSubstr;

// A pserver that writes its shard's manifest of a checkpoint under `root` (or fails), and
// answers nothing else.
class FakePserver : public AnsweringPServerClient {
 public:
  FakePserver(std::string root, int index, int num)
      : root_(std::move(root)), index_(index), num_(num) {}
  bool fail = false;

  void CheckpointAsync(const RequestMeta&, const std::string& dir, DoneCallback done) override {
    if (fail) return done(absl::UnavailableError("pserver gone"));
    done(io::WriteFileAtomic(io::PosixFileSystem::Default(),
                             absl::StrCat(root_, "/", dir, "/",
                                          io::PserverFilePrefix(index_, num_), ".MANIFEST"),
                             "a pserver's manifest"));
  }

 private:
  std::string root_;
  int index_, num_;
};

std::string TempRoot() {
  std::string dir = absl::StrCat(::testing::TempDir(), "/checkpoints_test_XXXXXX");
  EXPECT_NE(mkdtemp(dir.data()), nullptr);
  return dir;
}

ClusterConfig Config(const std::string& root) {
  ClusterConfig c;
  c.pservers = {"a:1", "b:2"};
  c.trainers = 2;
  c.seed = 7;
  c.checkpoint_dir = root;
  c.checkpoint_keep = 1;
  return c;
}

TEST(CheckpointsTest, SavesRestoresAndKeepsTheNewest) {
  const std::string root = TempRoot();
  ClusterConfig c = Config(root);
  io::FileSystem* fs = io::PosixFileSystem::Default();
  FakePserver a(root, 0, 2), b(root, 1, 2);
  std::ostringstream log;
  CheckpointWriter writer(c, fs, {&a, &b}, &log);
  EXPECT_EQ(writer.last_step(), -1);
  ASSERT_TRUE(writer.Save({"job", 0, 10}, TrainPosition{10, 1, 3}).ok());
  ASSERT_TRUE(writer.Save({"job", 0, 20}, TrainPosition{20, 2, 0}).ok());
  EXPECT_EQ(writer.last_step(), 20);
  EXPECT_FALSE(fs->Exists(root + "/" + io::CheckpointDirName(10)));  // --checkpoint_keep=1
  EXPECT_THAT(log.str(), HasSubstr("checkpoint " + root + "/" + io::CheckpointDirName(20)));

  c.init_from = root;
  auto p = ReadResumePosition(c, fs, log);
  ASSERT_TRUE(p.ok()) << p.status();
  ASSERT_TRUE(p->has_value());
  EXPECT_EQ((*p)->global_step, 20);
  EXPECT_EQ((*p)->epoch, 2);
  EXPECT_EQ((*p)->step_in_epoch, 0);
  c.init_from.clear();
  EXPECT_FALSE(ReadResumePosition(c, fs, log)->has_value());
  c.init_from = root + "/nothing";
  EXPECT_THAT(std::string(ReadResumePosition(c, fs, log).status().message()),
              HasSubstr("--init_from=" + root + "/nothing"));
}

// A pserver that cannot save: the error names the step and the directory, and no partial
// ckpt-* is left beside the last complete one.
TEST(CheckpointsTest, AFailedSaveLeavesNoPartialCheckpoint) {
  const std::string root = TempRoot();
  const ClusterConfig c = Config(root);
  io::FileSystem* fs = io::PosixFileSystem::Default();
  FakePserver a(root, 0, 2), b(root, 1, 2);
  std::ostringstream log;
  CheckpointWriter writer(c, fs, {&a, &b}, &log);
  ASSERT_TRUE(writer.Save({"job", 0, 5}, TrainPosition{5, 0, 5}).ok());
  b.fail = true;
  absl::Status s = writer.Save({"job", 0, 10}, TrainPosition{10, 0, 10});
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("checkpoint of step 10 in --checkpoint_dir=" + root + ": pserver gone"));
  EXPECT_FALSE(fs->Exists(root + "/" + io::CheckpointDirName(10)));
  EXPECT_EQ(writer.last_step(), 5);
  auto latest = io::ResolveCheckpoint(fs, root);
  ASSERT_TRUE(latest.ok());
  EXPECT_EQ(*latest, root + "/" + io::CheckpointDirName(5));
}

// A streamed job's checkpoint resumes only a job that replays the same streams.
TEST(CheckpointsTest, AStreamedCheckpointNeedsTheSameStreams) {
  const std::string root = TempRoot();
  ClusterConfig c = Config(root);
  c.reader = "stream";
  c.shuffle_buffer = 100;
  io::FileSystem* fs = io::PosixFileSystem::Default();
  FakePserver a(root, 0, 2), b(root, 1, 2);
  std::ostringstream log;
  CheckpointWriter writer(c, fs, {&a, &b}, &log);
  ASSERT_TRUE(writer.Save({"job", 0, 4}, TrainPosition{4, 0, 4}).ok());
  auto state = io::ReadTrainerCheckpoint(fs, root + "/" + io::CheckpointDirName(4));
  ASSERT_TRUE(state.ok());
  EXPECT_EQ(state->stream_shuffle_buffer, 100);

  c.init_from = root;
  EXPECT_TRUE(ReadResumePosition(c, fs, log).ok());
  auto refused = [&](const ClusterConfig& changed) {
    absl::StatusOr<std::optional<TrainPosition>> p = ReadResumePosition(changed, fs, log);
    EXPECT_EQ(p.status().code(), absl::StatusCode::kFailedPrecondition);
    return std::string(p.status().message());
  };
  ClusterConfig other = c;
  other.shuffle_buffer = 50;
  EXPECT_THAT(refused(other), HasSubstr("--shuffle_buffer=100 but this one has --shuffle_buffer=50"));
  other = c;
  other.seed = 8;
  EXPECT_THAT(refused(other), HasSubstr("--seed=7 but this one has --seed=8"));
  other = c;
  other.batch_size = 512;
  EXPECT_THAT(refused(other), HasSubstr("--batch_size=256 but this one has --batch_size=512"));
  other = c;
  other.trainers = 3;
  EXPECT_THAT(refused(other), HasSubstr("--trainers=2 but this one has --trainers=3"));
  other = c;
  other.reader = "memory";
  EXPECT_THAT(refused(other), HasSubstr("--reader=stream but this one has --reader=memory"));
  // An in-memory job's checkpoint resumes with another trainer count (the global order is the
  // same), but not as a streamed job.
  ClusterConfig memory = Config(TempRoot());
  FakePserver ma(memory.checkpoint_dir, 0, 2), mb(memory.checkpoint_dir, 1, 2);
  CheckpointWriter memory_writer(memory, fs, {&ma, &mb}, &log);
  ASSERT_TRUE(memory_writer.Save({"job", 0, 4}, TrainPosition{4, 0, 4}).ok());
  memory.init_from = memory.checkpoint_dir;
  memory.trainers = 4;
  EXPECT_TRUE(ReadResumePosition(memory, fs, log).ok());
  memory.reader = "stream";
  EXPECT_THAT(refused(memory), HasSubstr("--reader=memory but this one has --reader=stream"));
}

}  // namespace
}  // namespace tessera
