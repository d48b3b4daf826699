// tessera_launch with the real daemons: a local cluster of pservers and trainers as separate
// processes. A trainer that dies takes the job down, Ctrl-C (SIGINT) stops every process,
// --restart_failed restarts a dead trainer, and a finished job leaves its logs, metrics.csv and
// training.png. Every pid the launcher prints must be gone when it exits.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <regex>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/cluster_util.h"

namespace tessera {
namespace {

using ::testing::HasSubstr;

// The launcher's "<name> pid N" lines, in order (a restarted process appears again).
std::vector<std::pair<std::string, pid_t>> PrintedPids(const std::string& out) {
  std::vector<std::pair<std::string, pid_t>> pids;
  std::regex re("tessera_launch: (\\w+\\.\\d+) pid (\\d+)");
  for (auto it = std::sregex_iterator(out.begin(), out.end(), re); it != std::sregex_iterator();
       ++it) {
    pids.push_back({(*it)[1], std::stoi((*it)[2])});
  }
  return pids;
}

pid_t PidOf(const std::string& out, const std::string& name, int nth = 0) {
  for (const auto& [n, pid] : PrintedPids(out)) {
    if (n == name && nth-- == 0) return pid;
  }
  return -1;
}

bool Gone(pid_t pid) { return ::kill(pid, 0) != 0 && errno == ESRCH; }

class LaunchClusterTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = MakeTempDir("launch");
    out_path_ = dir_ + "/launcher.out";
  }

  // Starts tessera_launch with `flags` (plus the daemon binaries and --log_dir=<dir>/<logs>),
  // its output in `out_path`.
  pid_t StartLauncher(std::vector<std::string> flags, const std::string& out_path,
                      const std::string& logs = "logs") {
    std::vector<std::string> argv = {RunfilePath("deploy/launch/tessera_launch"),
                                     "--pserver_bin=" + RunfilePath("pserver/tessera_pserver"),
                                     "--trainer_bin=" + RunfilePath("trainer/tessera_trainer"),
                                     "--log_dir=" + dir_ + "/" + logs};
    argv.insert(argv.end(), flags.begin(), flags.end());
    auto pid = group_.Start(argv, out_path);
    EXPECT_TRUE(pid.ok()) << pid.status();
    return pid.ok() ? *pid : -1;
  }
  void Start(std::vector<std::string> flags) {
    launcher_ = StartLauncher(flags, out_path_);
    ASSERT_GT(launcher_, 0);
  }

  std::string Output() { return ReadFileOrEmpty(out_path_); }

  // Waits (at most 60 s) until `done(output)` holds; false on timeout or if the launcher exits.
  bool WaitFor(const std::function<bool(const std::string&)>& done) {
    absl::Time deadline = absl::Now() + absl::Seconds(60);
    while (absl::Now() < deadline) {
      if (done(Output())) return true;
      if (!group_.Running(launcher_)) return done(Output());
      absl::SleepFor(absl::Milliseconds(50));
    }
    return false;
  }

  // Waits until `n` processes were started and trainer 0 has logged a training step.
  void WaitUntilTraining(size_t n) {
    ASSERT_TRUE(WaitFor([n](const std::string& out) {
      return PrintedPids(out).size() >= n && absl::StrContains(out, "\nstep ");
    })) << Output();
  }

  // The launcher's exit code; fails the test if it runs longer than `bound`.
  int WaitExit(absl::Duration bound) {
    auto status = group_.Wait(launcher_, bound);
    EXPECT_TRUE(status.ok()) << status.status() << "\n" << Output();
    if (!status.ok()) return -1;
    EXPECT_TRUE(WIFEXITED(*status)) << *status;
    return WEXITSTATUS(*status);
  }

  void ExpectNothingLeft() {
    auto pids = PrintedPids(Output());
    ASSERT_FALSE(pids.empty());
    for (const auto& [name, pid] : pids) {
      EXPECT_TRUE(Gone(pid)) << name << " pid " << pid << " is still there\n" << Output();
    }
  }

  std::vector<std::string> LongJob() {
    return {"--pservers=2",    "--trainers=2",       "--example=mlp_regression",
            "--epochs=100000", "--num_examples=256", "--num_test_examples=0"};
  }

  ProcessGroup group_;
  pid_t launcher_ = -1;
  std::string dir_, out_path_;
};

TEST_F(LaunchClusterTest, KilledTrainerTakesTheJobDown) {
  Start(LongJob());
  WaitUntilTraining(4);
  pid_t trainer1 = PidOf(Output(), "trainer.1");
  ASSERT_GT(trainer1, 0) << Output();
  ASSERT_EQ(::kill(trainer1, SIGKILL), 0);
  int code = WaitExit(absl::Seconds(30));
  EXPECT_EQ(code, 128 + SIGKILL) << Output();
  EXPECT_THAT(Output(), HasSubstr(absl::StrCat("trainer.1 (pid ", trainer1,
                                               ") was killed by signal 9; stopping the job")));
  EXPECT_THAT(Output(), HasSubstr("logs in " + dir_ + "/logs"));
  ExpectNothingLeft();
}

// Async with --async_drop_silent_trainers: a killed trainer does not take the job down; the
// pserver drops it after --barrier_timeout_s of silence and the job ends when trainer 0 is done.
TEST_F(LaunchClusterTest, AsyncJobGoesOnWithoutAKilledTrainer) {
  // Every trainer gets the same flags here: enough epochs (~12 s) that trainer 1 is surely
  // still training when it is killed, and trainer 0 ends on its own.
  Start({"--pservers=1", "--trainers=2", "--example=mlp_regression", "--epochs=10000",
         "--num_examples=256", "--num_test_examples=0", "--sync_mode=false",
         "--async_drop_silent_trainers=true", "--barrier_timeout_s=2"});
  WaitUntilTraining(3);
  pid_t trainer1 = PidOf(Output(), "trainer.1");
  ASSERT_GT(trainer1, 0) << Output();
  ASSERT_EQ(::kill(trainer1, SIGKILL), 0);
  EXPECT_EQ(WaitExit(absl::Seconds(120)), 0) << Output();
  EXPECT_THAT(Output(), HasSubstr(absl::StrCat("trainer.1 (pid ", trainer1,
                                               ") was killed by signal 9; the job goes on")));
  EXPECT_THAT(Output(), HasSubstr("the job went on without trainer.1"));
  EXPECT_THAT(ReadFileOrEmpty(dir_ + "/logs/pserver.0.log"),
              HasSubstr("dropped_silent_trainers=[1]"));
  ExpectNothingLeft();
}

TEST_F(LaunchClusterTest, CtrlCStopsEveryProcess) {
  Start(LongJob());
  WaitUntilTraining(4);
  ASSERT_EQ(::kill(launcher_, SIGINT), 0);
  EXPECT_EQ(WaitExit(absl::Seconds(30)), 130) << Output();
  EXPECT_THAT(Output(), HasSubstr("interrupted; stopping every process"));
  EXPECT_EQ(PrintedPids(Output()).size(), 4u);
  ExpectNothingLeft();
}

TEST_F(LaunchClusterTest, RestartFailedRestartsADeadTrainer) {
  std::vector<std::string> flags = LongJob();
  flags.push_back("--restart_failed=1");
  Start(flags);
  WaitUntilTraining(4);
  pid_t first = PidOf(Output(), "trainer.1");
  ASSERT_EQ(::kill(first, SIGKILL), 0);
  ASSERT_TRUE(WaitFor([](const std::string& out) { return PidOf(out, "trainer.1", 1) > 0; }))
      << Output();
  pid_t second = PidOf(Output(), "trainer.1", 1);
  EXPECT_NE(second, first);
  EXPECT_THAT(Output(), HasSubstr("was killed by signal 9; restarting it (1 of 1"));
  // The restarted trainer has the same flags; without checkpoints the job may not survive it,
  // but it must still end cleanly: kill the new one too (its last restart is spent).
  ::kill(second, SIGKILL);
  EXPECT_NE(WaitExit(absl::Seconds(30)), 0) << Output();
  EXPECT_THAT(ReadFileOrEmpty(dir_ + "/logs/trainer.1.log"),
              HasSubstr("==== tessera_launch: restart 1 of 1 ===="));
  // 2 pservers, 2 trainers and the restarted trainer.1. The restarted trainer registers again
  // with the pservers, which fail the sync job (it cannot take a trainer back without a
  // checkpoint); when that reaches the other processes before the launcher stops the job, each
  // of them may spend its one restart too (4 + 4 at most).
  const size_t pids = PrintedPids(Output()).size();
  EXPECT_GE(pids, 5u) << Output();
  EXPECT_LE(pids, 8u) << Output();
  ExpectNothingLeft();
}

TEST_F(LaunchClusterTest, FinishedJobFromAConfigFileLeavesLogsMetricsAndPlot) {
  std::string config = dir_ + "/job.pbtxt";
  std::ofstream(config) << "pservers: 1\ntrainers: 2\n"
                           "daemon_args: \"--example=mlp_regression\"\n"
                           "daemon_args: \"--epochs=2\"\n"
                           "daemon_args: \"--num_examples=5120\"\n"
                           "daemon_args: \"--log_every_steps=4\"\n";
  Start({"--config=" + config});
  EXPECT_EQ(WaitExit(absl::Seconds(60)), 0) << Output();
  std::string out = Output();
  EXPECT_EQ(PrintedPids(out).size(), 3u) << out;
  EXPECT_THAT(out, HasSubstr("all processes finished"));
  EXPECT_THAT(out, HasSubstr("logs in " + dir_ + "/logs"));
  for (const char* log : {"pserver.0.log", "trainer.0.log", "trainer.1.log"}) {
    EXPECT_FALSE(ReadFileOrEmpty(dir_ + "/logs/" + log).empty()) << log;
  }
  // 5120 examples / 256 per global batch = 20 steps per epoch, logged every 4 steps.
  std::string csv = ReadFileOrEmpty(dir_ + "/logs/metrics.csv");
  EXPECT_EQ(csv.rfind("step,loss,samples_per_s,eval_loss,eval_auc,eval_accuracy\n4,", 0), 0u)
      << csv;
  // 10 logged steps and the held-out evaluation at the end.
  EXPECT_EQ(std::count(csv.begin(), csv.end(), '\n'), 12) << csv;
  EXPECT_NE(csv.find("\n40,,,"), std::string::npos) << csv;
  if (access("/usr/bin/gnuplot", X_OK) == 0) {
    EXPECT_THAT(out, HasSubstr("plot of loss, held-out loss and samples/s: " + dir_ + "/logs/training.png"));
    std::string png = ReadFileOrEmpty(dir_ + "/logs/training.png");
    EXPECT_EQ(png.substr(0, 8), "\x89PNG\r\n\x1a\n");
  }
  ExpectNothingLeft();
}

// A multi-host job on one machine: three launchers get the same endpoint list and each starts
// only its share (--role/--rank), as each host of a cluster would.
TEST_F(LaunchClusterTest, EachLauncherStartsItsShareOfAMultiHostJob) {
  auto eps = FreeEndpoints(2);
  ASSERT_TRUE(eps.ok()) << eps.status();
  std::vector<std::string> job = {"--pserver_endpoints=" + (*eps)[0] + "," + (*eps)[1],
                                  "--trainers=2",
                                  "--example=mlp_regression",
                                  "--epochs=2",
                                  "--num_examples=2560",
                                  "--job_id=shared"};
  auto with = [&job](std::vector<std::string> more) {
    more.insert(more.begin(), job.begin(), job.end());
    return more;
  };
  pid_t ps = StartLauncher(with({"--role=pserver"}), dir_ + "/ps.out", "ps");
  pid_t t0 = StartLauncher(with({"--role=trainer", "--rank=0"}), dir_ + "/t0.out", "t0");
  pid_t t1 = StartLauncher(with({"--role=trainer", "--rank=1"}), dir_ + "/t1.out", "t1");
  for (pid_t pid : {ps, t0, t1}) {
    auto status = group_.Wait(pid, absl::Seconds(60));
    ASSERT_TRUE(status.ok()) << status.status();
    EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0)
        << *status << "\n"
        << ReadFileOrEmpty(dir_ + "/ps.out") << ReadFileOrEmpty(dir_ + "/t0.out")
        << ReadFileOrEmpty(dir_ + "/t1.out");
  }
  std::string ps_out = ReadFileOrEmpty(dir_ + "/ps.out");
  EXPECT_THAT(ps_out, HasSubstr("starting 2 pservers"));
  EXPECT_THAT(ps_out, HasSubstr("pserver.1 pid "));
  EXPECT_THAT(ReadFileOrEmpty(dir_ + "/t0.out"), HasSubstr("starting 0 pservers and 1 trainers "
                                                           "on this host: trainer.0;"));
  EXPECT_THAT(ReadFileOrEmpty(dir_ + "/t1.out"), HasSubstr("on this host: trainer.1;"));
  // Trainer 1 only trains; trainer 0 logs the steps and gets the plot data.
  EXPECT_THAT(ReadFileOrEmpty(dir_ + "/t0/trainer.0.log"), HasSubstr("step 20 loss "));
  EXPECT_FALSE(ReadFileOrEmpty(dir_ + "/t0/metrics.csv").empty());
  EXPECT_THAT(ReadFileOrEmpty(dir_ + "/t1/trainer.1.log"), HasSubstr("trainer 1/2"));
  for (const char* out : {"/ps.out", "/t0.out", "/t1.out"}) {
    for (const auto& [name, pid] : PrintedPids(ReadFileOrEmpty(dir_ + out))) {
      EXPECT_TRUE(Gone(pid)) << name << " pid " << pid;
    }
  }
}

}  // namespace
}  // namespace tessera
