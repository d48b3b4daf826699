// Launcher with stand-in daemons: small shell scripts that print their flags and environment
// and exit as each test needs. The real daemons run in tests/launch_cluster_test.cc.
#include "deploy/launch/launcher.h"

#include <sched.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <climits>
#include <cstdlib>
#include <fstream>
#include <regex>
#include <sstream>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/io/checkpoint_io.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

std::string NewDir(const std::string& name) {
  const char* tmp = std::getenv("TEST_TMPDIR");
  std::string tmpl = absl::StrCat(tmp != nullptr ? tmp : "/tmp", "/", name, "_XXXXXX");
  std::vector<char> buf(tmpl.begin(), tmpl.end());
  buf.push_back('\0');
  EXPECT_NE(::mkdtemp(buf.data()), nullptr);
  return buf.data();
}

std::string Read(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string Script(const std::string& dir, const std::string& name, const std::string& body) {
  std::string path = absl::StrCat(dir, "/", name);
  std::ofstream(path) << "#!/bin/sh\nD=" << dir << "\n" << body;
  ::chmod(path.c_str(), 0755);
  return path;
}

// A pserver that exits 0 once trainer 0 has finished (bounded: 30 s).
const char kPserver[] = R"(echo "pserver args: $*"
i=0; while [ ! -e $D/trainer0.done ] && [ $i -lt 600 ]; do sleep 0.05; i=$((i+1)); done
exit 0
)";

// A trainer that logs three steps, its flags and devices, and succeeds.
const char kTrainer[] = R"(echo "trainer args: $*"
echo "devices CUDA_VISIBLE_DEVICES=${CUDA_VISIBLE_DEVICES:-unset}" \
  "TESSERA_DEVICE=${TESSERA_DEVICE:-unset} TESSERA_DEVICES=${TESSERA_DEVICES:-unset}" \
  "TESSERA_CPU_PLACES=${TESSERA_CPU_PLACES:-unset}"
echo "step 10 loss 0.9 samples/s 1000"
echo "step 20 loss 0.5 samples/s 1100"
echo "step 30 loss 0.25 samples/s 1200"
case "$*" in *--trainer_id=0*) touch $D/trainer0.done;; esac
exit 0
)";

// kTrainer, except that trainer 1 fails (exit 4) on its first run only (a counter file $D/runs).
std::string Trainer1FailsOnce() {
  return absl::StrCat(R"(case "$*" in *--trainer_id=1*)
  n=$(cat $D/runs 2>/dev/null || echo 0); echo $((n+1)) > $D/runs
  echo "run $n: $*"
  if [ "$n" = 0 ]; then exit 4; fi;;
esac
)",
                      kTrainer);
}

// The pids the launcher printed ("<name> pid N"), by name; a restarted process appears twice.
std::vector<std::pair<std::string, pid_t>> PrintedPids(const std::string& out) {
  std::vector<std::pair<std::string, pid_t>> pids;
  std::regex re("tessera_launch: (\\w+\\.\\d+) pid (\\d+)");
  for (auto it = std::sregex_iterator(out.begin(), out.end(), re); it != std::sregex_iterator();
       ++it) {
    pids.push_back({(*it)[1], std::stoi((*it)[2])});
  }
  return pids;
}

bool Gone(pid_t pid) { return ::kill(pid, 0) != 0 && errno == ESRCH; }

class LauncherTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = NewDir("launcher");
    o_.pservers = 1;
    o_.trainers = 2;
    o_.log_dir = dir_ + "/logs";
    o_.pserver_bin = Script(dir_, "pserver", kPserver);
    o_.trainer_bin = Script(dir_, "trainer", kTrainer);
    o_.stop_grace = absl::Seconds(2);
    o_.gnuplot = "/nonexistent/gnuplot";  // plots are tested in tests/launch_cluster_test.cc
  }

  // Runs the launcher; returns its exit code and leaves its output in out_.
  int Run() {
    std::ostringstream out;
    Launcher launcher(o_, out);
    auto code = launcher.Run();
    out_ = out.str();
    EXPECT_TRUE(code.ok()) << code.status();
    return code.ok() ? *code : -1;
  }

  void ExpectAllGone() {
    auto pids = PrintedPids(out_);
    EXPECT_FALSE(pids.empty()) << out_;
    for (const auto& [name, pid] : pids) EXPECT_TRUE(Gone(pid)) << name << " pid " << pid;
  }

  std::string dir_;
  LaunchOptions o_;
  std::string out_;
};

TEST_F(LauncherTest, LocalJobSucceedsWithLogsMetricsAndStreamedTrainer0) {
  o_.extra_args = {"--example=mlp_regression", "--epochs=3"};
  ASSERT_EQ(Run(), 0) << out_;
  EXPECT_THAT(out_, HasSubstr("all processes finished"));
  EXPECT_THAT(out_, HasSubstr("trainer args: --role=trainer --trainer_id=0"));  // streamed
  EXPECT_THAT(out_, HasSubstr("logs in " + o_.log_dir));
  std::string t1 = Read(o_.log_dir + "/trainer.1.log");
  EXPECT_THAT(t1, HasSubstr("--trainer_id=1 "));
  EXPECT_THAT(t1, HasSubstr("--trainers=2 "));
  EXPECT_THAT(t1, HasSubstr("--example=mlp_regression --epochs=3"));
  EXPECT_THAT(Read(o_.log_dir + "/trainer.0.log"), HasSubstr("step 30 loss 0.25"));
  EXPECT_THAT(Read(o_.log_dir + "/pserver.0.log"), HasSubstr("--role=pserver --current_endpoint="));
  EXPECT_EQ(Read(o_.log_dir + "/metrics.csv"),
            "step,loss,samples_per_s,eval_loss,eval_auc,eval_accuracy\n10,0.9,1000,,,\n20,0.5,"
            "1100,,,\n30,0.25,1200,,,\n");
  EXPECT_THAT(out_, HasSubstr("no plot"));  // the gnuplot given does not exist
  ExpectAllGone();
}

TEST_F(LauncherTest, FailedProcessTakesTheJobDown) {
  o_.trainers = 3;
  o_.trainer_bin = Script(dir_, "trainer", R"(case "$*" in *--trainer_id=2*) exit 3;; esac
exec sleep 60
)");
  absl::Time start = absl::Now();
  EXPECT_EQ(Run(), 3) << out_;
  EXPECT_LT(absl::Now() - start, absl::Seconds(30));
  EXPECT_THAT(out_, HasSubstr("trainer.2 (pid "));
  EXPECT_THAT(out_, HasSubstr("exited with status 3; stopping the job"));
  EXPECT_EQ(PrintedPids(out_).size(), 4u) << out_;
  ExpectAllGone();
}

TEST_F(LauncherTest, KilledProcessGivesSignalExitCode) {
  o_.trainer_bin = Script(dir_, "trainer", R"(case "$*" in *--trainer_id=1*) kill -9 $$;; esac
exec sleep 60
)");
  EXPECT_EQ(Run(), 128 + 9) << out_;
  EXPECT_THAT(out_, HasSubstr("was killed by signal 9"));
  ExpectAllGone();
}

TEST_F(LauncherTest, RestartFailedRerunsTheProcessWithTheSameFlags) {
  o_.restart_failed = 2;
  // trainer 1 fails on its first run only (a counter file); the others behave normally.
  o_.trainer_bin = Script(dir_, "trainer", Trainer1FailsOnce());
  ASSERT_EQ(Run(), 0) << out_;
  EXPECT_THAT(out_, HasSubstr("exited with status 4; restarting it (1 of 2"));
  EXPECT_EQ(Read(dir_ + "/runs"), "2\n");
  std::string log = Read(o_.log_dir + "/trainer.1.log");
  EXPECT_THAT(log, HasSubstr("run 0: --role=trainer --trainer_id=1"));
  EXPECT_THAT(log, HasSubstr("==== tessera_launch: restart 1 of 2 ====\nrun 1: --role=trainer "
                             "--trainer_id=1"));
  // Same flags on both runs.
  std::smatch a, b;
  ASSERT_TRUE(std::regex_search(log, a, std::regex("run 0: (.*)")));
  ASSERT_TRUE(std::regex_search(log, b, std::regex("run 1: (.*)")));
  EXPECT_EQ(a[1], b[1]);
  auto pids = PrintedPids(out_);
  EXPECT_EQ(pids.size(), 4u) << out_;  // 3 processes, trainer.1 twice
  ExpectAllGone();
}

TEST_F(LauncherTest, RestartsAreBounded) {
  o_.restart_failed = 2;
  o_.trainer_bin = Script(dir_, "trainer", R"(case "$*" in *--trainer_id=1*) exit 5;; esac
exec sleep 60
)");
  EXPECT_EQ(Run(), 5) << out_;
  EXPECT_THAT(out_, HasSubstr("restarting it (2 of 2"));
  EXPECT_THAT(out_, HasSubstr("exited with status 5 after 2 restarts; stopping the job"));
  EXPECT_EQ(PrintedPids(out_).size(), 5u) << out_;
  ExpectAllGone();
}

TEST_F(LauncherTest, RequestStopStopsEveryChild) {
  o_.pserver_bin = Script(dir_, "pserver", "exec sleep 60\n");
  // A child that ignores SIGTERM is killed after stop_grace.
  o_.trainers = 1;
  o_.trainer_bin = Script(dir_, "trainer",
                          "trap '' TERM; touch $D/tr.started\n"
                          "while true; do sleep 0.05; done\n");
  o_.stop_grace = absl::Milliseconds(300);
  std::thread stopper([this] {
    for (int i = 0; i < 600 && ::access((dir_ + "/tr.started").c_str(), F_OK) != 0; ++i) {
      absl::SleepFor(absl::Milliseconds(50));
    }
    Launcher::RequestStop();
  });
  int code = Run();
  stopper.join();
  EXPECT_EQ(code, 130) << out_;
  EXPECT_THAT(out_, HasSubstr("interrupted; stopping every process"));
  ExpectAllGone();
}

TEST_F(LauncherTest, DevicesGoToTheTrainersEnvironment) {
  o_.devices = "0,1/2";
  ASSERT_EQ(Run(), 0) << out_;
  EXPECT_THAT(Read(o_.log_dir + "/trainer.0.log"),
              HasSubstr("CUDA_VISIBLE_DEVICES=0,1 TESSERA_DEVICE=gpu TESSERA_DEVICES=0,1 "));
  EXPECT_THAT(Read(o_.log_dir + "/trainer.1.log"),
              HasSubstr("CUDA_VISIBLE_DEVICES=2 TESSERA_DEVICE=gpu TESSERA_DEVICES=0 "));
  o_.devices = "cpu:3";
  ASSERT_EQ(Run(), 0) << out_;
  EXPECT_THAT(Read(o_.log_dir + "/trainer.1.log"),
              HasSubstr("CUDA_VISIBLE_DEVICES=unset TESSERA_DEVICE=unset TESSERA_DEVICES=unset "
                        "TESSERA_CPU_PLACES=3"));
}

TEST_F(LauncherTest, PserverOnlyHostWaitsForItsPservers) {
  // A multi-host job where this host runs only pserver 1: no local trainers, so the pserver is
  // not stopped for "trainers finished"; it exits on its own.
  o_.pserver_endpoints = {"203.0.113.1:6170", "127.0.0.1:6171"};
  o_.role = "pserver";
  o_.pserver_exit_grace = absl::Milliseconds(100);
  o_.pserver_bin = Script(dir_, "pserver", "echo \"args: $*\"; sleep 1; exit 0\n");
  ASSERT_EQ(Run(), 0) << out_;
  EXPECT_EQ(PrintedPids(out_).size(), 1u) << out_;
  EXPECT_THAT(Read(o_.log_dir + "/pserver.1.log"),
              HasSubstr("--current_endpoint=127.0.0.1:6171 "
                        "--pservers=203.0.113.1:6170,127.0.0.1:6171 --trainers=2"));
}

TEST_F(LauncherTest, BadBinaryIsAStatus) {
  o_.trainer_bin = dir_ + "/missing";
  std::ostringstream out;
  Launcher launcher(o_, out);
  auto code = launcher.Run();
  ASSERT_FALSE(code.ok());
  EXPECT_THAT(std::string(code.status().message()), HasSubstr(dir_ + "/missing"));
}

// --- PlanLaunch ---

std::string Flag(const ProcessSpec& p, const std::string& name) {
  for (const auto& a : p.argv) {
    if (absl::StartsWith(a, "--" + name + "=")) return a.substr(name.size() + 3);
  }
  return "<none>";
}

std::vector<std::string> Names(const std::vector<ProcessSpec>& specs) {
  std::vector<std::string> out;
  for (const auto& s : specs) out.push_back(s.name);
  return out;
}

TEST(PlanLaunchTest, LocalJob) {
  LaunchOptions o;
  o.pservers = 2;
  o.trainers = 3;
  o.pserver_bin = "/bin/ps";
  o.trainer_bin = "/bin/tr";
  o.extra_args = {"--example=ctr"};
  auto plan = PlanLaunch(o);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(Names(*plan), (std::vector<std::string>{"pserver.0", "pserver.1", "trainer.0",
                                                    "trainer.1", "trainer.2"}));
  std::string eps = Flag((*plan)[0], "pservers");
  EXPECT_EQ(Flag((*plan)[0], "current_endpoint") + "," + Flag((*plan)[1], "current_endpoint"), eps);
  EXPECT_NE(Flag((*plan)[0], "current_endpoint"), Flag((*plan)[1], "current_endpoint"));
  for (const auto& p : *plan) {
    EXPECT_EQ(Flag(p, "pservers"), eps);
    EXPECT_EQ(Flag(p, "trainers"), "3");
    EXPECT_EQ(Flag(p, "job_id"), absl::StrCat("local-", ::getpid()));
    EXPECT_EQ(p.argv.back(), "--example=ctr");  // user flags last: they win
    EXPECT_EQ(p.argv[0], p.trainer ? "/bin/tr" : "/bin/ps");
    EXPECT_EQ(Flag(p, "role"), p.trainer ? "trainer" : "pserver");
  }
  EXPECT_EQ(Flag((*plan)[4], "trainer_id"), "2");
  EXPECT_EQ(Flag((*plan)[4], "current_endpoint"), "<none>");
}

TEST(PlanLaunchTest, TraceGoesToTrainerZeroAndEveryPserverBesideIt) {
  LaunchOptions o;
  o.pservers = 2;
  o.trainers = 2;
  o.trace = "/tmp/t.json";
  auto plan = PlanLaunch(o);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(Names(*plan),
            (std::vector<std::string>{"pserver.0", "pserver.1", "trainer.0", "trainer.1"}));
  EXPECT_EQ(Flag((*plan)[2], "trace"), "/tmp/t.json");
  EXPECT_EQ(Flag((*plan)[0], "trace"), "/tmp/t.pserver0.json");
  EXPECT_EQ(Flag((*plan)[1], "trace"), "/tmp/t.pserver1.json");
  EXPECT_EQ(Flag((*plan)[3], "trace"), "<none>");
  o.trace = "";
  plan = PlanLaunch(o);
  ASSERT_TRUE(plan.ok()) << plan.status();
  for (const ProcessSpec& p : *plan) EXPECT_EQ(Flag(p, "trace"), "<none>") << p.name;
}

TEST(PserverTracePathTest, InsertsThePserverBeforeAJsonEnding) {
  EXPECT_EQ(PserverTracePath("/tmp/t.json", 0), "/tmp/t.pserver0.json");
  EXPECT_EQ(PserverTracePath("/tmp/t.json", 12), "/tmp/t.pserver12.json");
  EXPECT_EQ(PserverTracePath("/tmp/trace", 1), "/tmp/trace.pserver1.json");
  EXPECT_EQ(PserverTracePath("t.json.gz", 0), "t.json.gz.pserver0.json");
  EXPECT_EQ(PserverTracePath(".json", 3), ".pserver3.json");
}

TEST(PlanLaunchTest, MultiHostShareByRoleRankAndHost) {
  ASSERT_FALSE(IsLocalHost("203.0.113.1"));  // TEST-NET-3 stands for another host
  ASSERT_FALSE(IsLocalHost("203.0.113.2"));
  LaunchOptions o;
  o.pserver_endpoints = {"203.0.113.1:6170", "127.0.0.1:6171"};  // only the second is this host
  o.trainers = 2;
  EXPECT_FALSE(PlanLaunch(o).ok());  // no trainer endpoints: the host must say its role
  o.role = "pserver";
  EXPECT_EQ(Names(PlanLaunch(o).value()), (std::vector<std::string>{"pserver.1"}));
  o.rank = 0;
  EXPECT_EQ(Names(PlanLaunch(o).value()), (std::vector<std::string>{"pserver.0"}));
  o.rank = 2;
  EXPECT_FALSE(PlanLaunch(o).ok());
  o.role = "trainer";
  o.rank = -1;
  EXPECT_EQ(Names(PlanLaunch(o).value()), (std::vector<std::string>{"trainer.0", "trainer.1"}));
  o.rank = 1;
  auto plan = PlanLaunch(o).value();
  ASSERT_EQ(Names(plan), (std::vector<std::string>{"trainer.1"}));
  EXPECT_EQ(Flag(plan[0], "trainer_id"), "1");
  EXPECT_EQ(Flag(plan[0], "pservers"), "203.0.113.1:6170,127.0.0.1:6171");
  EXPECT_EQ(Flag(plan[0], "job_id"), "<none>");  // every host must agree: the daemons' default

  o.role = "";
  o.rank = -1;
  o.trainer_endpoints = {"203.0.113.1:7000", "127.0.0.1:7001", "localhost:7002"};
  plan = PlanLaunch(o).value();
  ASSERT_EQ(Names(plan), (std::vector<std::string>{"pserver.1", "trainer.1", "trainer.2"}));
  EXPECT_EQ(Flag(plan[1], "trainers"), "3");
  EXPECT_EQ(Flag(plan[1], "current_endpoint"), "127.0.0.1:7001");
  EXPECT_EQ(Flag(plan[2], "trainer_endpoints"), "203.0.113.1:7000,127.0.0.1:7001,localhost:7002");

  o.pserver_endpoints = {"203.0.113.1:6170"};
  o.trainer_endpoints = {"203.0.113.2:7000"};
  auto none = PlanLaunch(o);
  ASSERT_FALSE(none.ok());
  EXPECT_THAT(std::string(none.status().message()), HasSubstr("nothing to start"));
  o.pserver_endpoints = {"203.0.113.1"};
  EXPECT_THAT(std::string(PlanLaunch(o).status().message()), HasSubstr("'203.0.113.1'"));
}

TEST(PlanLaunchTest, CollectiveHasNoPservers) {
  LaunchOptions o;
  o.mode = "collective";
  o.trainers = 2;
  auto plan = PlanLaunch(o).value();
  ASSERT_EQ(Names(plan), (std::vector<std::string>{"trainer.0", "trainer.1"}));
  EXPECT_EQ(Flag(plan[0], "mode"), "collective");
  EXPECT_EQ(Flag(plan[0], "pservers"), "<none>");
  std::string eps = Flag(plan[1], "trainer_endpoints");
  EXPECT_EQ(eps, Flag(plan[0], "current_endpoint") + "," + Flag(plan[1], "current_endpoint"));
  o.pserver_endpoints = {"127.0.0.1:1"};
  EXPECT_FALSE(PlanLaunch(o).ok());
  o.mode = "nccl";
  EXPECT_FALSE(PlanLaunch(o).ok());
}

TEST(PlanLaunchTest, HybridHasPserversAndTrainerEndpoints) {
  LaunchOptions o;
  o.mode = "hybrid";
  o.pservers = 2;
  o.trainers = 2;
  auto plan = PlanLaunch(o).value();
  ASSERT_EQ(Names(plan),
            (std::vector<std::string>{"pserver.0", "pserver.1", "trainer.0", "trainer.1"}));
  EXPECT_EQ(Flag(plan[2], "mode"), "hybrid");
  EXPECT_EQ(Flag(plan[0], "mode"), "hybrid");
  EXPECT_NE(Flag(plan[2], "pservers"), "<none>");
  EXPECT_EQ(Flag(plan[3], "trainer_endpoints"),
            Flag(plan[2], "current_endpoint") + "," + Flag(plan[3], "current_endpoint"));
}

TEST(PlanLaunchTest, Devices) {
  LaunchOptions o;
  o.pservers = 1;
  o.trainers = 2;
  auto env = [&](const std::string& devices) -> std::vector<std::string> {
    o.devices = devices;
    auto plan = PlanLaunch(o);
    if (!plan.ok()) return {std::string(plan.status().message())};
    std::vector<std::string> out;
    for (const auto& p : *plan) {
      for (const auto& [k, v] : p.env) out.push_back(absl::StrCat(p.name, " ", k, "=", v));
    }
    return out;
  };
  EXPECT_EQ(env(""), std::vector<std::string>{});
  EXPECT_EQ(env("0,1,2,3"),
            (std::vector<std::string>{
                "trainer.0 CUDA_VISIBLE_DEVICES=0,1", "trainer.0 TESSERA_DEVICE=gpu",
                "trainer.0 TESSERA_DEVICES=0,1", "trainer.1 CUDA_VISIBLE_DEVICES=2,3",
                "trainer.1 TESSERA_DEVICE=gpu", "trainer.1 TESSERA_DEVICES=0,1"}));
  EXPECT_EQ(env("gpu:4,5"),
            (std::vector<std::string>{"trainer.0 CUDA_VISIBLE_DEVICES=4",
                                      "trainer.0 TESSERA_DEVICE=gpu", "trainer.0 TESSERA_DEVICES=0",
                                      "trainer.1 CUDA_VISIBLE_DEVICES=5",
                                      "trainer.1 TESSERA_DEVICE=gpu",
                                      "trainer.1 TESSERA_DEVICES=0"}));
  EXPECT_EQ(env("0/1,2"),
            (std::vector<std::string>{
                "trainer.0 CUDA_VISIBLE_DEVICES=0", "trainer.0 TESSERA_DEVICE=gpu",
                "trainer.0 TESSERA_DEVICES=0", "trainer.1 CUDA_VISIBLE_DEVICES=1,2",
                "trainer.1 TESSERA_DEVICE=gpu", "trainer.1 TESSERA_DEVICES=0,1"}));
  EXPECT_EQ(env("cpu:8"), (std::vector<std::string>{"trainer.0 TESSERA_CPU_PLACES=8",
                                                    "trainer.1 TESSERA_CPU_PLACES=8"}));
  EXPECT_THAT(env("0,1,2")[0], HasSubstr("--devices='0,1,2'"));
  EXPECT_THAT(env("0/1/2")[0], HasSubstr("3 groups"));
  EXPECT_THAT(env("0,x")[0], HasSubstr("'x'"));
  EXPECT_THAT(env("cpu:0")[0], HasSubstr("cpu:N"));
}

// The CPUs of a Cpus_allowed_list ("0-3,6").
std::vector<int> ParseCpuList(const std::string& list) {
  std::vector<int> cpus;
  std::stringstream in(list);
  std::string part;
  while (std::getline(in, part, ',')) {
    int a = 0, b = 0;
    const size_t dash = part.find('-');
    if (dash == std::string::npos) {
      EXPECT_TRUE(absl::SimpleAtoi(part, &a)) << list;
      b = a;
    } else {
      EXPECT_TRUE(absl::SimpleAtoi(part.substr(0, dash), &a)) << list;
      EXPECT_TRUE(absl::SimpleAtoi(part.substr(dash + 1), &b)) << list;
    }
    for (int c = a; c <= b; ++c) cpus.push_back(c);
  }
  return cpus;
}

// The CPUs a stand-in daemon's log says it may run on (its "cpus: ..." line).
std::vector<int> LoggedCpus(const std::string& log) {
  std::smatch m;
  const std::string text = Read(log);
  if (!std::regex_search(text, m, std::regex("cpus: ([0-9,-]+)"))) {
    ADD_FAILURE() << "no cpus line in " << log << ": " << text;
    return {};
  }
  return ParseCpuList(m[1]);
}

// The daemons as the launcher binds them: each pair of trainer k and pserver k on its share of
// the launcher's CPUs (what the kernel reports to the running daemon), or (none) on all of them.
TEST_F(LauncherTest, BindsTrainerAndPserverPairsToTheirShareOfTheCpus) {
  const char kCpus[] =
      "echo \"cpus: $(sed -n 's/^Cpus_allowed_list:[[:space:]]*//p' /proc/self/status)\"\n";
  o_.pserver_bin = Script(dir_, "pserver", absl::StrCat(kCpus, kPserver));
  o_.trainer_bin = Script(dir_, "trainer", absl::StrCat(kCpus, kTrainer));
  o_.pservers = 2;
  o_.trainers = 2;
  const std::vector<int> all = AllowedCpus();
  ASSERT_FALSE(all.empty());
  std::vector<std::vector<int>> parts(2);
  if (all.size() >= 2) {
    parts[0].assign(all.begin(), all.begin() + all.size() / 2);
    parts[1].assign(all.begin() + all.size() / 2, all.end());
  } else {
    parts = {all, all};
  }
  ASSERT_EQ(Run(), 0) << out_;
  for (int k = 0; k < 2; ++k) {
    EXPECT_EQ(LoggedCpus(absl::StrCat(o_.log_dir, "/trainer.", k, ".log")), parts[k]) << k;
    EXPECT_EQ(LoggedCpus(absl::StrCat(o_.log_dir, "/pserver.", k, ".log")), parts[k]) << k;
  }
  EXPECT_THAT(out_, HasSubstr("trainer.1 on CPU "));
  EXPECT_THAT(out_, HasSubstr("--bind_cpus=none leaves it to the OS"));

  o_.bind_cpus = "none";
  ASSERT_EQ(Run(), 0) << out_;
  for (int k = 0; k < 2; ++k) {
    EXPECT_EQ(LoggedCpus(absl::StrCat(o_.log_dir, "/trainer.", k, ".log")), all) << k;
    EXPECT_EQ(LoggedCpus(absl::StrCat(o_.log_dir, "/pserver.", k, ".log")), all) << k;
  }
  EXPECT_THAT(out_, Not(HasSubstr(" on CPU ")));
}

// Every daemon runs under SCHED_BATCH (policy 3 in /proc/PID/stat, field 41) unless
// --nosched_batch (then under the launcher's own policy); it does not depend on the cluster's
// shape.
TEST_F(LauncherTest, DaemonsRunUnderSchedBatch) {
  const char kPolicy[] = "echo \"policy: $(awk '{print $41}' /proc/self/stat)\"\n";
  o_.pserver_bin = Script(dir_, "pserver", absl::StrCat(kPolicy, kPserver));
  o_.trainer_bin = Script(dir_, "trainer", absl::StrCat(kPolicy, kTrainer));
  for (bool batch : {true, false}) {
    o_.sched_batch = batch;
    ASSERT_EQ(Run(), 0) << out_;
    const std::string want =
        absl::StrCat("policy: ", batch ? SCHED_BATCH : ::sched_getscheduler(0), "\n");
    for (const char* log : {"pserver.0.log", "trainer.0.log", "trainer.1.log"}) {
      EXPECT_THAT(Read(absl::StrCat(o_.log_dir, "/", log)), HasSubstr(want)) << log << batch;
    }
  }
}

// Specs of `pservers` pservers then `trainers` trainers, as PlanLaunch orders them.
std::vector<ProcessSpec> Specs(int pservers, int trainers) {
  std::vector<ProcessSpec> specs;
  for (int i = 0; i < pservers; ++i) specs.push_back({absl::StrCat("pserver.", i), false, i});
  for (int k = 0; k < trainers; ++k) specs.push_back({absl::StrCat("trainer.", k), true, k});
  return specs;
}

TEST(BindCpusTest, PairsShareEqualPartsOfTheCpus) {
  auto cpus_of = [](const std::vector<ProcessSpec>& specs) {
    std::vector<std::vector<int>> out;
    for (const ProcessSpec& s : specs) out.push_back(s.cpus);
    return out;
  };
  using V = std::vector<std::vector<int>>;
  std::vector<ProcessSpec> specs = Specs(2, 2);
  BindCpus({0, 1}, &specs);  // pservers first, then trainers
  EXPECT_EQ(cpus_of(specs), (V{{0}, {1}, {0}, {1}}));
  specs = Specs(2, 2);
  BindCpus({0, 1, 2, 3, 4, 5, 6, 7}, &specs);
  EXPECT_EQ(cpus_of(specs), (V{{0, 1, 2, 3}, {4, 5, 6, 7}, {0, 1, 2, 3}, {4, 5, 6, 7}}));
  specs = Specs(2, 2);
  BindCpus({2, 5, 6}, &specs);  // an uneven mask: the parts differ by at most one CPU
  EXPECT_EQ(cpus_of(specs), (V{{2}, {5, 6}, {2}, {5, 6}}));
  specs = Specs(3, 3);
  BindCpus({0, 1}, &specs);  // more pairs than CPUs: round robin
  EXPECT_EQ(cpus_of(specs), (V{{0}, {1}, {0}, {0}, {1}, {0}}));
  // Not pairs: nothing bound.
  for (auto [ps, tr] : {std::pair{1, 1}, {1, 2}, {2, 1}, {0, 2}, {2, 0}}) {
    specs = Specs(ps, tr);
    BindCpus({0, 1, 2, 3}, &specs);
    for (const ProcessSpec& s : specs) EXPECT_TRUE(s.cpus.empty()) << ps << "x" << tr << s.name;
  }
  specs = Specs(2, 2);
  BindCpus({}, &specs);
  for (const ProcessSpec& s : specs) EXPECT_TRUE(s.cpus.empty()) << s.name;
}

TEST(PlanLaunchTest, BadOptions) {
  LaunchOptions o;
  o.bind_cpus = "yes";
  absl::StatusOr<std::vector<ProcessSpec>> bad = PlanLaunch(o);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr("--bind_cpus='yes'"));
  o.bind_cpus = "auto";
  o.role = "worker";
  EXPECT_FALSE(PlanLaunch(o).ok());
  o.role = "";
  o.rank = 0;
  EXPECT_FALSE(PlanLaunch(o).ok());  // --rank without --role
  o.rank = -1;
  o.pservers = 0;
  EXPECT_FALSE(PlanLaunch(o).ok());
  o.pservers = 1;
  o.restart_failed = -1;
  EXPECT_FALSE(PlanLaunch(o).ok());
}

TEST(IsLocalHostTest, KnowsThisMachine) {
  EXPECT_TRUE(IsLocalHost("127.0.0.1"));
  EXPECT_TRUE(IsLocalHost("localhost"));
  char name[HOST_NAME_MAX + 1] = {0};
  ASSERT_EQ(::gethostname(name, sizeof(name) - 1), 0);
  EXPECT_TRUE(IsLocalHost(name));
  EXPECT_FALSE(
      IsLocalHost("203.0.113.1"));  // TEST-NET-3 (this test assumes no machine here has it)
  EXPECT_FALSE(IsLocalHost(""));
}

}  // namespace
}  // namespace tessera

namespace tessera {
namespace {

// With --checkpoint_dir among the daemons' flags a failure restarts every process of the job,
// each with --init_from=<the newest complete checkpoint>.
TEST_F(LauncherTest, RestartWithCheckpointDirRestartsTheJobFromTheNewestCheckpoint) {
  o_.restart_failed = 1;
  const std::string ckpts = dir_ + "/ckpts";
  io::FileSystem* fs = io::PosixFileSystem::Default();
  for (int64_t step : {5, 10}) {
    auto ckpt = io::BeginCheckpoint(fs, ckpts, step);
    ASSERT_TRUE(ckpt.ok()) << ckpt.status();
    io::TrainerCheckpointState st;
    st.step = step;
    if (step == 5) {
      ASSERT_TRUE(io::CommitTrainerCheckpoint(fs, *ckpt, st, {}).ok());
    }
  }  // ckpt-10 has no manifest: incomplete, not picked
  const std::string want = ckpts + "/" + io::CheckpointDirName(5);
  o_.extra_args.push_back("--checkpoint_dir=" + ckpts);
  o_.trainer_bin = Script(dir_, "trainer", Trainer1FailsOnce());
  ASSERT_EQ(Run(), 0) << out_;
  EXPECT_THAT(out_, HasSubstr("restarting the job (1 of 1) from " + want));
  EXPECT_THAT(Read(o_.log_dir + "/trainer.1.log"), HasSubstr("--init_from=" + want));
  for (const char* name : {"/pserver.0.log", "/trainer.0.log"}) {
    const std::string log = Read(o_.log_dir + name);
    EXPECT_THAT(log, HasSubstr("==== tessera_launch: restart 1 of 1 ====")) << name;
    EXPECT_THAT(log, HasSubstr("--init_from=" + want)) << name;
  }
  ExpectAllGone();
}

}  // namespace
}  // namespace tessera
