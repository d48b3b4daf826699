// The job handshake with real daemons: 2 pservers and 2 trainers where one process was started
// with one flag different (a stale ConfigMap, a typo). Every such job fails in under 10 s, no
// process exits 0, and a log names the field with both values. The same job without the
// difference trains to the end (the control case).
#include <signal.h>
#include <sys/wait.h>

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "absl/time/clock.h"
#include "gtest/gtest.h"
#include "tests/cluster_util.h"

namespace tessera {
namespace {

// What a job of 2 pservers and 2 trainers came to.
struct Outcome {
  int exited_zero = 0;
  std::string logs;  // every process's log, concatenated
  absl::Duration took;
};

// Runs tessera_pserver with `pserver_args[p]` and tessera_trainer with `trainer_args[k]` (each
// followed by `common`, a flag of the same name in `trainer_changes[k]` replacing it), logs in
// `dir`, and waits (bounded) for every process.
Outcome RunJob(const std::string& dir, const std::vector<std::string>& common,
               const std::vector<std::vector<std::string>>& pserver_args,
               const std::vector<std::vector<std::string>>& trainer_args,
               const std::vector<std::vector<std::string>>& trainer_changes) {
  ProcessGroup group;
  std::vector<pid_t> pids;
  std::vector<std::string> logs;
  const absl::Time start = absl::Now();
  auto launch = [&](const std::string& binary, std::vector<std::string> args,
                    const std::vector<std::string>& changed, const std::string& name) {
    args.insert(args.begin(), RunfilePath(binary));
    args.insert(args.end(), common.begin(), common.end());
    for (const std::string& flag : changed) {
      const std::string prefix = flag.substr(0, flag.find('=') + 1);
      args.erase(std::remove_if(args.begin() + 1, args.end(),
                                [&](const std::string& a) { return a.rfind(prefix, 0) == 0; }),
                 args.end());
      args.push_back(flag);
    }
    logs.push_back(absl::StrCat(dir, "/", name, ".log"));
    auto pid = group.Start(args, logs.back());
    EXPECT_TRUE(pid.ok()) << pid.status();
    if (pid.ok()) pids.push_back(*pid);
  };
  for (size_t p = 0; p < pserver_args.size(); ++p) {
    launch("pserver/tessera_pserver", pserver_args[p], {}, absl::StrCat("pserver.", p));
  }
  for (size_t k = 0; k < trainer_args.size(); ++k) {
    launch("trainer/tessera_trainer", trainer_args[k], trainer_changes[k],
           absl::StrCat("trainer.", k));
  }
  Outcome out;
  for (size_t i = 0; i < pids.size(); ++i) {
    auto status = group.Wait(pids[i], absl::Seconds(60));
    EXPECT_TRUE(status.ok()) << logs[i] << ": " << status.status();
    out.exited_zero += status.ok() && WIFEXITED(*status) && WEXITSTATUS(*status) == 0;
    out.logs += ReadFileOrEmpty(logs[i]);
  }
  out.took = absl::Now() - start;
  return out;
}

struct Case {
  std::string name;
  // Extra flags of trainer 1 (or of both trainers with `all_trainers`).
  std::vector<std::string> trainer1;
  bool all_trainers = false;
  // Text a log must hold ("" for the control case, which must succeed).
  std::string named;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

class HandshakeTest : public ::testing::TestWithParam<Case> {};

TEST_P(HandshakeTest, OneDifferentFlagFailsTheJobNamingIt) {
  const Case& c = GetParam();
  auto eps = FreeEndpoints(2);
  ASSERT_TRUE(eps.ok()) << eps.status();
  const std::string pservers = "--pservers=" + absl::StrJoin(*eps, ",");
  const Outcome out =
      RunJob(MakeTempDir("handshake_" + c.name),
             {"--trainers=2", "--example=mlp_regression", "--num_examples=512", "--batch_size=64",
              "--epochs=2", "--barrier_timeout_s=30", "--connect_timeout_s=5",
              "--startup_timeout_s=20", "--job_id=handshake"},
             {{pservers, "--current_endpoint=" + (*eps)[0]},
              {pservers, "--current_endpoint=" + (*eps)[1]}},
             {{pservers, "--trainer_id=0"}, {pservers, "--trainer_id=1"}},
             {c.all_trainers ? c.trainer1 : std::vector<std::string>{}, c.trainer1});
  if (c.named.empty()) {
    EXPECT_EQ(out.exited_zero, 4) << out.logs;
    return;
  }
  EXPECT_EQ(out.exited_zero, 0) << out.logs;
  EXPECT_LT(out.took, absl::Seconds(10)) << out.logs;
  EXPECT_NE(out.logs.find(c.named), std::string::npos) << "no log names '" << c.named << "':\n"
                                                       << out.logs;
}

INSTANTIATE_TEST_SUITE_P(
    Misconfigurations, HandshakeTest,
    ::testing::Values(
        Case{"control", {}, false, ""},
        Case{"learning_rate", {"--learning_rate=0.002"}, false, "has learning_rate=0.002 but"},
        Case{"batch_size", {"--batch_size=32"}, false, "has batch_size=32 but"},
        Case{"num_examples", {"--num_examples=1024"}, false, "has num_examples=1024 but"},
        Case{"epochs", {"--epochs=3"}, false, "has epochs=3 but"},
        Case{"seed", {"--seed=9"}, false, "has seed=9 but"},
        Case{"trainer_count", {"--trainers=3"}, true, "has trainers=3 but"},
        Case{"duplicate_id", {"--trainer_id=0"}, false, "registered with"},
        Case{"example", {"--example=ctr"}, false, "has model=ctr#"},
        Case{"sync_mode", {"--sync_mode=false"}, false, "has sync_mode=false but"},
        Case{"heartbeat", {"--heartbeat_s=1"}, false, "has heartbeat_s=1 but"},
        // Trainers would look tables up where the pservers do not hold them.
        Case{"table_placement",
             {"--table_placement=table_wise"},
             true,
             "has table_placement=table_wise but"},
        // Trainers would look up and update a slot's tables where the pservers hold them apart.
        Case{"fuse_tables", {"--fuse_tables=false"}, true, "has fuse_tables=false but"},
        // Failures at start, before a trainer connects: its ABORT still reaches the pservers,
        // which pass the cause on instead of waiting for it until a timeout.
        Case{"zero_steps", {"--num_examples=1"}, true, "this job would train 0 steps"},
        Case{"empty_data", {"--train_data=/dev/null"}, false, "stopped with an error, so pserver"}),
    [](const ::testing::TestParamInfo<Case>& info) { return info.param.name; });

// The pservers in another order on one trainer: its gradient blocks would go to the wrong
// pservers.
TEST(HandshakeOrderTest, PserverOrderMustAgree) {
  auto eps = FreeEndpoints(2);
  ASSERT_TRUE(eps.ok()) << eps.status();
  const std::string in_order = "--pservers=" + absl::StrJoin(*eps, ",");
  const std::string reversed = (*eps)[1] + "," + (*eps)[0];
  const Outcome out = RunJob(
      MakeTempDir("handshake_order"),
      {"--trainers=2", "--example=mlp_regression", "--num_examples=512", "--batch_size=64",
       "--connect_timeout_s=5", "--startup_timeout_s=20"},
      {{in_order, "--current_endpoint=" + (*eps)[0]},
       {in_order, "--current_endpoint=" + (*eps)[1]}},
      {{in_order, "--trainer_id=0"}, {"--pservers=" + reversed, "--trainer_id=1"}}, {{}, {}});
  EXPECT_EQ(out.exited_zero, 0) << out.logs;
  EXPECT_LT(out.took, absl::Seconds(10)) << out.logs;
  EXPECT_NE(out.logs.find("has pservers=" + reversed + " but"), std::string::npos) << out.logs;
}

// A 2 x 2 sync job (mlp_regression, or what `extra` flags say) trains until process `victim`
// (0, 1: pservers; 2, 3: trainers) gets `signal`; every other process must then exit non-zero
// within 15 s, and no line of any log may exceed 400 characters (errors lead with the cause and
// name at most 3 of an op's inputs).
struct Lost {
  std::vector<std::string> pservers;  // endpoints
  std::vector<std::string> logs;      // of every process (empty after a failure)
};
Lost LoseOneProcess(const std::string& name, int victim, int signal,
                    const std::vector<std::string>& extra) {
  auto eps = FreeEndpoints(2);
  EXPECT_TRUE(eps.ok()) << eps.status();
  if (!eps.ok()) return {};
  const std::string dir = MakeTempDir(name);
  std::vector<std::string> common = {
      "--pservers=" + absl::StrJoin(*eps, ","), "--trainers=2", "--batch_size=64",
      "--epochs=100000", "--log_every_steps=1", "--connect_timeout_s=5",
      "--barrier_timeout_s=60", "--job_id=" + name};
  const bool example_given = std::any_of(extra.begin(), extra.end(), [](const std::string& f) {
    return absl::StartsWith(f, "--example=");
  });
  if (!example_given) {
    common.push_back("--example=mlp_regression");
    common.push_back("--num_examples=512");
  }
  common.insert(common.end(), extra.begin(), extra.end());
  ProcessGroup group;
  std::vector<pid_t> pids;
  std::vector<std::string> logs;
  auto launch = [&](const std::string& binary, const std::string& flag, const std::string& log) {
    std::vector<std::string> args = {RunfilePath(binary), flag};
    args.insert(args.end(), common.begin(), common.end());
    logs.push_back(absl::StrCat(dir, "/", log, ".log"));
    auto pid = group.Start(args, logs.back());
    EXPECT_TRUE(pid.ok()) << pid.status();
    pids.push_back(pid.ok() ? *pid : -1);
  };
  launch("pserver/tessera_pserver", "--current_endpoint=" + (*eps)[0], "pserver.0");
  launch("pserver/tessera_pserver", "--current_endpoint=" + (*eps)[1], "pserver.1");
  launch("trainer/tessera_trainer", "--trainer_id=0", "trainer.0");
  launch("trainer/tessera_trainer", "--trainer_id=1", "trainer.1");
  const absl::Time training_by = absl::Now() + absl::Seconds(60);
  while (absl::Now() < training_by &&
         ReadFileOrEmpty(logs[2]).find("step 5 ") == std::string::npos) {
    absl::SleepFor(absl::Milliseconds(50));
  }
  EXPECT_NE(ReadFileOrEmpty(logs[2]).find("step 5 "), std::string::npos)
      << ReadFileOrEmpty(logs[2]);
  group.Kill(pids[victim], signal);
  const absl::Time hit = absl::Now();
  for (int i = 0; i < 4; ++i) {
    if (i == victim) continue;
    auto status = group.Wait(pids[i], absl::Seconds(15));
    EXPECT_TRUE(status.ok()) << logs[i] << " still running " << absl::Now() - hit << " after "
                             << logs[victim] << "'s process got signal " << signal << ":\n"
                             << ReadFileOrEmpty(logs[i]);
    if (!status.ok()) return {};
    EXPECT_FALSE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0) << ReadFileOrEmpty(logs[i]);
  }
  Lost lost{*eps, {}};
  for (const std::string& log : logs) {
    lost.logs.push_back(ReadFileOrEmpty(log));
    for (absl::string_view line : absl::StrSplit(lost.logs.back(), '\n')) {
      EXPECT_LE(line.size(), 400u) << log << ": " << line;
    }
  }
  return lost;
}

// A pserver killed mid-training: the surviving pserver's log names the lost one (passed on by
// the trainers' ABORT), not the trainers it stopped hearing from. The CTR model with local
// tables: a step's send carries some 60 gradients, and the failure still fits on a short line.
TEST(LostPeerTest, SurvivingPserverNamesTheKilledOne) {
  const Lost lost = LoseOneProcess(
      "lost_pserver", 1, SIGKILL,
      {"--example=ctr", "--num_examples=4096", "--nodistributed_tables", "--vocab_per_slot=500"});
  ASSERT_EQ(lost.logs.size(), 4u);
  const std::string& survivor = lost.logs[0];
  EXPECT_NE(survivor.find("pserver " + lost.pservers[1]), std::string::npos) << survivor;
  EXPECT_NE(survivor.find(" stopped with an error, so pserver "), std::string::npos) << survivor;
  EXPECT_EQ(survivor.find("presumed dead"), std::string::npos) << survivor;
}

// A trainer killed, or frozen (SIGSTOP: its connections stay open), mid-training: its
// heartbeats stop, and the pservers fail the job naming it within 5 x --heartbeat_s, not at the
// 60 s --barrier_timeout_s; the other trainer ends with that cause.
class LostTrainerTest : public ::testing::TestWithParam<int> {};

TEST_P(LostTrainerTest, PserversNameTheTrainerWhoseHeartbeatsStopped) {
  const Lost lost = LoseOneProcess(absl::StrCat("lost_trainer_", GetParam()), 3, GetParam(),
                                   {"--heartbeat_s=0.5"});
  ASSERT_EQ(lost.logs.size(), 4u);
  for (int i : {0, 1, 2}) {
    EXPECT_NE(lost.logs[i].find("trainers [1] sent no heartbeat for 2.5s"), std::string::npos)
        << lost.logs[i];
  }
}

INSTANTIATE_TEST_SUITE_P(KilledOrFrozen, LostTrainerTest, ::testing::Values(SIGKILL, SIGSTOP),
                         [](const ::testing::TestParamInfo<int>& info) {
                           return info.param == SIGKILL ? "killed" : "frozen";
                         });

}  // namespace
}  // namespace tessera
