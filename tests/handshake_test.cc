// The job handshake with real daemons: 2 pservers and 2 trainers where one process was started
// with one flag different (a stale ConfigMap, a typo). Every such job fails in under 10 s, no
// process exits 0, and a log names the field with both values. The same job without the
// difference trains to the end (the control case).
#include <sys/wait.h>

#include <algorithm>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
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
        Case{"sync_mode", {"--sync_mode=false"}, false, "has sync_mode=false but"}),
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

}  // namespace
}  // namespace tessera
