#include "deploy/launch/launch_flags.h"

#include <cstdlib>
#include <fstream>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

using ::testing::HasSubstr;

std::string Tmp(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return std::string(dir != nullptr ? dir : "/tmp") + "/" + name;
}

TEST(LaunchFlagsTest, LauncherFlagsAndDaemonFlags) {
  LaunchOptions o;
  ASSERT_TRUE(ParseLaunchArgs({"--pservers=3", "--trainers=4", "--example=ctr", "--log_dir=/l",
                               "--restart_failed=2", "--devices=0,1", "--noplot", "--epochs=2",
                               "--stop_grace_s=1.5", "--", "--log_dir=/for-daemons"},
                              &o)
                  .ok());
  EXPECT_EQ(o.pservers, 3);
  EXPECT_EQ(o.trainers, 4);
  EXPECT_EQ(o.log_dir, "/l");
  EXPECT_EQ(o.restart_failed, 2);
  EXPECT_EQ(o.devices, "0,1");
  EXPECT_FALSE(o.plot);
  EXPECT_EQ(o.stop_grace, absl::Seconds(1.5));
  EXPECT_EQ(o.extra_args,
            (std::vector<std::string>{"--example=ctr", "--epochs=2", "--log_dir=/for-daemons"}));
}

TEST(LaunchFlagsTest, TraceIsForTrainerZeroOnly) {
  LaunchOptions o;
  ASSERT_TRUE(ParseLaunchArgs({"--trace=/tmp/t.json", "--example=ctr"}, &o).ok());
  EXPECT_EQ(o.trace, "/tmp/t.json");
  EXPECT_EQ(o.extra_args, (std::vector<std::string>{"--example=ctr"}));
}

TEST(LaunchFlagsTest, BindCpusFromFlagOrConfig) {
  LaunchOptions o;
  EXPECT_EQ(o.bind_cpus, "auto");
  ASSERT_TRUE(ParseLaunchArgs({"--bind_cpus=none", "--example=ctr"}, &o).ok());
  EXPECT_EQ(o.bind_cpus, "none");
  EXPECT_EQ(o.extra_args, (std::vector<std::string>{"--example=ctr"}));
  std::string path = Tmp("bind.pbtxt");
  std::ofstream(path) << "bind_cpus: \"none\"\n";
  LaunchOptions c;
  ASSERT_TRUE(ParseLaunchArgs({"--config=" + path}, &c).ok());
  EXPECT_EQ(c.bind_cpus, "none");
}

TEST(LaunchFlagsTest, SchedBatchFromFlagOrConfig) {
  LaunchOptions o;
  EXPECT_TRUE(o.sched_batch);
  ASSERT_TRUE(ParseLaunchArgs({"--nosched_batch"}, &o).ok());
  EXPECT_FALSE(o.sched_batch);
  ASSERT_TRUE(ParseLaunchArgs({"--sched_batch"}, &o).ok());
  EXPECT_TRUE(o.sched_batch);
  ASSERT_TRUE(ParseLaunchArgs({"--sched_batch=false"}, &o).ok());
  EXPECT_FALSE(o.sched_batch);
  EXPECT_TRUE(o.extra_args.empty());
  absl::Status bad = ParseLaunchArgs({"--sched_batch=maybe"}, &o);
  EXPECT_THAT(std::string(bad.message()), HasSubstr("--sched_batch='maybe'"));
  std::string path = Tmp("batch.pbtxt");
  std::ofstream(path) << "sched_batch: false\n";
  LaunchOptions c;
  ASSERT_TRUE(ParseLaunchArgs({"--config=" + path}, &c).ok());
  EXPECT_FALSE(c.sched_batch);
}

TEST(LaunchFlagsTest, MultiHostFlags) {
  LaunchOptions o;
  ASSERT_TRUE(ParseLaunchArgs({"--pservers=h1:6170, h2:6170", "--role=TRAINER", "--rank=1",
                               "--trainer_endpoints=h1:7000,h2:7000", "--mode=collective"},
                              &o)
                  .ok());
  EXPECT_EQ(o.pserver_endpoints, (std::vector<std::string>{"h1:6170", "h2:6170"}));
  EXPECT_EQ(o.trainer_endpoints, (std::vector<std::string>{"h1:7000", "h2:7000"}));
  EXPECT_EQ(o.role, "trainer");
  EXPECT_EQ(o.rank, 1);
  EXPECT_EQ(o.mode, "collective");
  EXPECT_TRUE(o.extra_args.empty());
}

TEST(LaunchFlagsTest, BadValuesNameTheFlag) {
  LaunchOptions o;
  absl::Status s = ParseLaunchArgs({"--trainers=two"}, &o);
  EXPECT_THAT(std::string(s.message()), HasSubstr("--trainers='two'"));
  s = ParseLaunchArgs({"--restart_failed=-1"}, &o);
  EXPECT_THAT(std::string(s.message()), HasSubstr("--restart_failed='-1'"));
  s = ParseLaunchArgs({"--trainer_id=3"}, &o);
  EXPECT_THAT(std::string(s.message()), HasSubstr("--trainer_id"));
  s = ParseLaunchArgs({"--role", "trainer"}, &o);
  EXPECT_THAT(std::string(s.message()), HasSubstr("--role=VALUE"));
  s = ParseLaunchArgs({"--help"}, &o);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(s.message()), HasSubstr("--restart_failed=K"));
}

TEST(LaunchFlagsTest, ConfigFileThenFlagsOverride) {
  std::string path = Tmp("job.pbtxt");
  std::ofstream(path) << "pservers: 1\ntrainers: 3\nrestart_failed: 1\nplot: false\n"
                         "pserver_endpoints: \"a:1\"\npserver_endpoints: \"b:2\"\n"
                         "daemon_args: \"--example=ctr\"\nstop_grace_s: 2\n";
  LaunchOptions o;
  ASSERT_TRUE(ParseLaunchArgs({"--trainers=5", "--config=" + path, "--epochs=2"}, &o).ok());
  EXPECT_EQ(o.pservers, 1);
  EXPECT_EQ(o.trainers, 5);  // the flag wins, wherever --config is
  EXPECT_EQ(o.restart_failed, 1);
  EXPECT_FALSE(o.plot);
  EXPECT_EQ(o.pserver_endpoints, (std::vector<std::string>{"a:1", "b:2"}));
  EXPECT_EQ(o.stop_grace, absl::Seconds(2));
  EXPECT_EQ(o.extra_args, (std::vector<std::string>{"--example=ctr", "--epochs=2"}));
  EXPECT_EQ(o.devices, "");  // unset fields keep the defaults
  EXPECT_EQ(o.mode, "pserver");
}

TEST(LaunchFlagsTest, BadConfigFileIsNamedWithTheLine) {
  std::string path = Tmp("bad.pbtxt");
  std::ofstream(path) << "pservers: 1\ntrainer: 3\n";
  LaunchOptions o;
  absl::Status s = ParseLaunchArgs({"--config=" + path}, &o);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr(path + ":2:"));
  EXPECT_THAT(std::string(s.message()), HasSubstr("trainer"));
  s = ParseLaunchArgs({"--config=/nonexistent.pbtxt"}, &o);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(s.message()), HasSubstr("/nonexistent.pbtxt"));
}

TEST(LaunchFlagsTest, ExampleConfigParses) {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  std::string path =
      std::string(srcdir != nullptr ? srcdir : ".") + "/tessera/deploy/launch/example_local.pbtxt";
  auto config = ReadLaunchConfig(path);
  ASSERT_TRUE(config.ok()) << config.status();
  LaunchOptions o;
  ASSERT_TRUE(ApplyLaunchConfig(*config, &o).ok());
  EXPECT_EQ(o.pservers, 2);
  EXPECT_EQ(o.extra_args, (std::vector<std::string>{"--example=mlp_regression", "--epochs=3"}));
}

}  // namespace
}  // namespace tessera
