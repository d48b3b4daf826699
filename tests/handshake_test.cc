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
  const std::string dir = MakeTempDir("handshake_" + c.name);
  auto eps = FreeEndpoints(2);
  ASSERT_TRUE(eps.ok()) << eps.status();
  const std::vector<std::string> common = {
      "--trainers=2",          "--example=mlp_regression", "--num_examples=512",
      "--batch_size=64",       "--epochs=2",               "--barrier_timeout_s=30",
      "--connect_timeout_s=5", "--startup_timeout_s=20",   "--job_id=handshake"};
  ProcessGroup group;
  std::vector<pid_t> pids;
  std::vector<std::string> logs;
  const absl::Time start = absl::Now();
  // `args` + the common flags, `changed` replacing any flag of the same name.
  auto launch = [&](std::vector<std::string> args, const std::string& name,
                    const std::vector<std::string>& changed = {}) {
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
    ASSERT_TRUE(pid.ok()) << pid.status();
    pids.push_back(*pid);
  };
  for (int p = 0; p < 2; ++p) {
    launch({RunfilePath("pserver/tessera_pserver"), "--pservers=" + absl::StrJoin(*eps, ","),
            "--current_endpoint=" + (*eps)[p]},
           absl::StrCat("pserver.", p));
  }
  for (int k = 0; k < 2; ++k) {
    std::vector<std::string> args = {RunfilePath("trainer/tessera_trainer"),
                                     "--pservers=" + absl::StrJoin(*eps, ","),
                                     absl::StrCat("--trainer_id=", k)};
    launch(args, absl::StrCat("trainer.", k),
           k == 1 || c.all_trainers ? c.trainer1 : std::vector<std::string>{});
  }
  int exited_zero = 0;
  std::string all_logs;
  for (size_t i = 0; i < pids.size(); ++i) {
    auto status = group.Wait(pids[i], absl::Seconds(60));
    ASSERT_TRUE(status.ok()) << logs[i] << ": " << status.status();
    exited_zero += WIFEXITED(*status) && WEXITSTATUS(*status) == 0;
    all_logs += ReadFileOrEmpty(logs[i]);
  }
  const absl::Duration took = absl::Now() - start;
  if (c.named.empty()) {
    EXPECT_EQ(exited_zero, 4) << all_logs;
    return;
  }
  EXPECT_EQ(exited_zero, 0) << all_logs;
  EXPECT_LT(took, absl::Seconds(10)) << all_logs;
  EXPECT_NE(all_logs.find(c.named), std::string::npos) << "no log names '" << c.named << "':\n"
                                                       << all_logs;
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
  const std::string dir = MakeTempDir("handshake_order");
  auto eps = FreeEndpoints(2);
  ASSERT_TRUE(eps.ok()) << eps.status();
  const std::string in_order = absl::StrJoin(*eps, ",");
  const std::string reversed = (*eps)[1] + "," + (*eps)[0];
  const std::vector<std::string> common = {"--trainers=2", "--example=mlp_regression",
                                           "--num_examples=512", "--batch_size=64",
                                           "--connect_timeout_s=5", "--startup_timeout_s=20"};
  ProcessGroup group;
  std::vector<pid_t> pids;
  std::vector<std::string> logs;
  const absl::Time start = absl::Now();
  auto launch = [&](std::vector<std::string> args, const std::string& name) {
    args.insert(args.end(), common.begin(), common.end());
    logs.push_back(absl::StrCat(dir, "/", name, ".log"));
    auto pid = group.Start(args, logs.back());
    ASSERT_TRUE(pid.ok()) << pid.status();
    pids.push_back(*pid);
  };
  for (int p = 0; p < 2; ++p) {
    launch({RunfilePath("pserver/tessera_pserver"), "--pservers=" + in_order,
            "--current_endpoint=" + (*eps)[p]},
           absl::StrCat("pserver.", p));
  }
  launch({RunfilePath("trainer/tessera_trainer"), "--pservers=" + in_order, "--trainer_id=0"},
         "trainer.0");
  launch({RunfilePath("trainer/tessera_trainer"), "--pservers=" + reversed, "--trainer_id=1"},
         "trainer.1");
  int exited_zero = 0;
  std::string all_logs;
  for (size_t i = 0; i < pids.size(); ++i) {
    auto status = group.Wait(pids[i], absl::Seconds(60));
    ASSERT_TRUE(status.ok()) << status.status();
    exited_zero += WIFEXITED(*status) && WEXITSTATUS(*status) == 0;
    all_logs += ReadFileOrEmpty(logs[i]);
  }
  EXPECT_EQ(exited_zero, 0) << all_logs;
  EXPECT_LT(absl::Now() - start, absl::Seconds(10)) << all_logs;
  EXPECT_NE(all_logs.find("has pservers=" + reversed + " but"), std::string::npos) << all_logs;
}

}  // namespace
}  // namespace tessera
