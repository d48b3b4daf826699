// TrainerProcess on its own (Create / Start / Wait), in this process against a PserverProcess:
// a sync job of 1 pserver and 1 trainer trains to the end with every step on the pserver; a
// missing --train_data fails Create naming the file; no pserver fails Start within
// --connect_timeout_s; and a trainer destroyed after Start without Wait tells its pserver
// (ABORT) instead of leaving it waiting.
#include <memory>
#include <sstream>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/io/fault_injecting_file_system.h"
#include "gtest/gtest.h"
#include "pserver/pserver_daemon.h"
#include "tests/cluster_util.h"
#include "trainer/trainer_daemon.h"

namespace tessera {
namespace {

constexpr int64_t kExamples = 512;
constexpr int64_t kBatch = 64;

// What the processes of a sync job of 1 pserver on `endpoint` and 1 trainer share.
ClusterConfig JobConfig(const std::string& endpoint) {
  ClusterConfig c;
  c.pservers = {endpoint};
  c.trainers = 1;
  c.example = "mlp_regression";
  c.num_examples = kExamples;
  c.batch_size = kBatch;
  c.epochs = 1;
  c.stats_interval_s = 0;
  return c;
}

ClusterConfig PserverConfig(const std::string& endpoint) {
  ClusterConfig c = JobConfig(endpoint);
  c.role = "pserver";
  c.current_endpoint = endpoint;
  c.startup_timeout_s = 20;  // a trainer that never comes fails the test, not hangs it
  return c;
}

ClusterConfig TrainerConfig(const std::string& endpoint) {
  ClusterConfig c = JobConfig(endpoint);
  c.role = "trainer";
  c.trainer_id = 0;
  return c;
}

// A PserverProcess serving on its endpoint, its Wait on a thread of its own; the destructor
// joins it (the pserver's Wait ends when its trainers completed or the job failed).
class ServingPserver {
 public:
  explicit ServingPserver(const std::string& endpoint) : config_(PserverConfig(endpoint)) {}
  explicit ServingPserver(ClusterConfig config) : config_(std::move(config)) {}
  ~ServingPserver() { (void)Join(); }

  absl::Status Start() {
    auto process = PserverProcess::Create(config_, log_);
    if (!process.ok()) return process.status();
    process_ = std::move(*process);
    absl::Status started = process_->Start();
    if (!started.ok()) return started;
    thread_ = std::thread([this] { result_ = process_->Wait(); });
    return absl::OkStatus();
  }
  // The result of the pserver's Wait.
  absl::Status Join() {
    if (thread_.joinable()) thread_.join();
    return result_;
  }
  ParameterServer* server() { return process_->server(); }
  std::string log() const { return log_.str(); }

 private:
  const ClusterConfig config_;
  std::ostringstream log_;
  std::unique_ptr<PserverProcess> process_;
  std::thread thread_;
  absl::Status result_;
};

TEST(TrainerProcessTest, TrainsASyncJobWithAPserverInThisProcess) {
  auto eps = FreeEndpoints(1);
  ASSERT_TRUE(eps.ok()) << eps.status();
  const std::string& ep = (*eps)[0];
  ServingPserver pserver(ep);
  ASSERT_TRUE(pserver.Start().ok());

  const ClusterConfig config = TrainerConfig(ep);
  std::ostringstream log;
  absl::Status trained = [&]() -> absl::Status {
    auto trainer = TrainerProcess::Create(config, log);
    if (!trainer.ok()) return trainer.status();
    absl::Status started = (*trainer)->Start();
    if (!started.ok()) return started;
    return (*trainer)->Wait();
  }();
  EXPECT_TRUE(trained.ok()) << trained << "\n" << log.str();
  absl::Status served = pserver.Join();
  EXPECT_TRUE(served.ok()) << served << "\n" << pserver.log();
  EXPECT_EQ(pserver.server()->stats().steps, kExamples / kBatch) << pserver.log();
  EXPECT_NE(log.str().find("trainer 0/1: example mlp_regression"), std::string::npos) << log.str();
  EXPECT_NE(pserver.log().find(absl::StrCat("steps=", kExamples / kBatch)), std::string::npos)
      << pserver.log();
}

// Trainer 0's checkpoints go through the file system given to Create: the fault injected into
// its first write fails the job with the fault's message, and the pserver hears of it.
TEST(TrainerProcessTest, CheckpointsGoThroughTheFileSystemGivenToCreate) {
  auto eps = FreeEndpoints(1);
  ASSERT_TRUE(eps.ok()) << eps.status();
  const std::string& ep = (*eps)[0];
  const std::string dir = MakeTempDir("trainer_process_ckpt");
  ClusterConfig pc = PserverConfig(ep);
  pc.checkpoint_dir = dir;
  ServingPserver pserver(pc);
  ASSERT_TRUE(pserver.Start().ok());
  ClusterConfig config = TrainerConfig(ep);
  config.checkpoint_dir = dir;
  config.checkpoint_every = 2;
  io::FaultInjectingFileSystem faulty(io::PosixFileSystem::Default(), /*fail_at=*/1,
                                      /*crash=*/false);
  std::ostringstream log;
  auto trainer = TrainerProcess::Create(config, log, &faulty);
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  ASSERT_TRUE((*trainer)->Start().ok());
  absl::Status trained = (*trainer)->Wait();
  EXPECT_FALSE(trained.ok());
  EXPECT_NE(trained.message().find("injected fault at file operation 1"), std::string::npos)
      << trained << "\n" << log.str();
  EXPECT_TRUE(faulty.fired());
  EXPECT_FALSE(pserver.Join().ok()) << pserver.log();
}

TEST(TrainerProcessTest, AMissingTrainDataFileFailsCreate) {
  auto eps = FreeEndpoints(1);
  ASSERT_TRUE(eps.ok()) << eps.status();
  ClusterConfig config = TrainerConfig((*eps)[0]);
  config.example = "ctr";  // reads --train_data (mlp_regression's data is synthetic)
  config.train_data = absl::StrCat(MakeTempDir("trainer_process"), "/missing.txt");
  std::ostringstream log;
  auto trainer = TrainerProcess::Create(config, log);
  ASSERT_FALSE(trainer.ok());
  EXPECT_NE(trainer.status().message().find(config.train_data), std::string::npos)
      << trainer.status();
}

TEST(TrainerProcessTest, NoPserverFailsStartWithinTheConnectTimeout) {
  auto eps = FreeEndpoints(1);  // nothing listens there
  ASSERT_TRUE(eps.ok()) << eps.status();
  ClusterConfig config = TrainerConfig((*eps)[0]);
  config.connect_timeout_s = 0.5;
  std::ostringstream log;
  auto trainer = TrainerProcess::Create(config, log);
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  absl::Status started = (*trainer)->Start();
  EXPECT_EQ(started.code(), absl::StatusCode::kUnavailable) << started;
  EXPECT_NE(started.message().find((*eps)[0]), std::string::npos) << started;
  EXPECT_NE(started.message().find("--connect_timeout_s=0.5"), std::string::npos) << started;
  // Wait needs a successful Start.
  EXPECT_EQ((*trainer)->Wait().code(), absl::StatusCode::kFailedPrecondition);
}

TEST(TrainerProcessTest, ATrainerDestroyedAfterStartTellsItsPserver) {
  auto eps = FreeEndpoints(1);
  ASSERT_TRUE(eps.ok()) << eps.status();
  const std::string& ep = (*eps)[0];
  ServingPserver pserver(ep);
  ASSERT_TRUE(pserver.Start().ok());
  const ClusterConfig config = TrainerConfig(ep);
  std::ostringstream log;
  {
    auto trainer = TrainerProcess::Create(config, log);
    ASSERT_TRUE(trainer.ok()) << trainer.status();
    absl::Status started = (*trainer)->Start();
    EXPECT_TRUE(started.ok()) << started;
    // Destroyed without Wait: stops its heartbeats, aborts the job on the pserver.
  }
  absl::Status served = pserver.Join();
  EXPECT_EQ(served.code(), absl::StatusCode::kAborted) << served;
  EXPECT_NE(served.message().find("trainer process stopped"), std::string::npos) << served;
  EXPECT_EQ(pserver.server()->stats().steps, 0);
}

}  // namespace
}  // namespace tessera
