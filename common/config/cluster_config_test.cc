#include "common/config/cluster_config.h"

#include <map>

#include "common/config/daemon_flags.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

EnvLookup Env(std::map<std::string, std::string> vars) {
  return [vars](const std::string& name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

TEST(ClusterConfigTest, PaddleEnvironmentNamesWork) {
  ClusterConfig c;
  ASSERT_TRUE(ApplyEnvironment({},
                               Env({{"PADDLE_TRAINING_ROLE", "PSERVER"},
                                    {"PADDLE_PSERVERS_IP_PORT_LIST", "10.0.0.1:6170, 10.0.0.2:6170"},
                                    {"PADDLE_TRAINERS_NUM", "4"},
                                    {"PADDLE_TRAINER_ID", "3"},
                                    {"PADDLE_CURRENT_ENDPOINT", "10.0.0.2:6170"}}),
                               &c)
                  .ok());
  EXPECT_EQ(c.role, "pserver");
  EXPECT_EQ(c.pservers, (std::vector<std::string>{"10.0.0.1:6170", "10.0.0.2:6170"}));
  EXPECT_EQ(c.trainers, 4);
  EXPECT_EQ(c.trainer_id, 3);
  EXPECT_TRUE(Validate(c).ok()) << Validate(c);
}

// Older Fluid launchers name the pserver hosts and one port apart, and the role without PADDLE_.
TEST(ClusterConfigTest, FluidCompositeEnvironmentNamesWork) {
  ClusterConfig c;
  ASSERT_TRUE(ApplyEnvironment({},
                               Env({{"TRAINING_ROLE", "PSERVER"},
                                    {"PADDLE_PSERVERS", "10.0.0.1, 10.0.0.2"},
                                    {"PADDLE_PORT", "6174"},
                                    {"POD_IP", "10.0.0.2"},
                                    {"PADDLE_TRAINERS_NUM", "2"}}),
                               &c)
                  .ok());
  EXPECT_EQ(c.role, "pserver");
  EXPECT_EQ(c.pservers, (std::vector<std::string>{"10.0.0.1:6174", "10.0.0.2:6174"}));
  EXPECT_EQ(c.current_endpoint, "10.0.0.2:6174");
  EXPECT_TRUE(Validate(c).ok()) << Validate(c);
  // The full names win over the composite ones.
  ClusterConfig d;
  ASSERT_TRUE(ApplyEnvironment({},
                               Env({{"PADDLE_PSERVERS_IP_PORT_LIST", "10.0.0.9:7000"},
                                    {"PADDLE_PSERVERS", "10.0.0.1"},
                                    {"PADDLE_PORT", "6174"}}),
                               &d)
                  .ok());
  EXPECT_EQ(d.pservers, (std::vector<std::string>{"10.0.0.9:7000"}));
}

TEST(ClusterConfigTest, FlagsWinOverTesseraWhichWinsOverPaddle) {
  ClusterConfig c;
  ASSERT_TRUE(SetFromString("trainers", "2", &c).ok());
  ASSERT_TRUE(ApplyEnvironment({"trainers"},
                               Env({{"TESSERA_TRAINERS", "5"},
                                    {"PADDLE_TRAINERS_NUM", "7"},
                                    {"TESSERA_TRAINER_ID", "1"},
                                    {"PADDLE_TRAINER_ID", "0"}}),
                               &c)
                  .ok());
  EXPECT_EQ(c.trainers, 2);
  EXPECT_EQ(c.trainer_id, 1);
}

TEST(ClusterConfigTest, VerboseFromFlagOrEnvironment) {
  ClusterConfig c;
  EXPECT_FALSE(c.verbose);
  ASSERT_TRUE(ApplyEnvironment({}, Env({{"TESSERA_VERBOSE", "true"}}), &c).ok());
  EXPECT_TRUE(c.verbose);
  ASSERT_TRUE(SetFromString("verbose", "false", &c).ok());
  EXPECT_FALSE(c.verbose);
}

TEST(ClusterConfigTest, BadValuesNameTheSettingAndSource) {
  ClusterConfig c;
  absl::Status s = ApplyEnvironment({}, Env({{"PADDLE_TRAINERS_NUM", "two"}}), &c);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("PADDLE_TRAINERS_NUM='two'"), std::string::npos) << s;
  s = SetFromString("min_block_size", "0", &c);
  EXPECT_NE(s.message().find("--min_block_size='0'"), std::string::npos) << s;
  s = SetFromString("sync_mode", "maybe", &c);
  EXPECT_FALSE(s.ok());
  c = ClusterConfig{};
  c.role = "trainer";
  c.pservers = {"127.0.0.1:7001"};
  ASSERT_TRUE(SetFromString("table_placement", "by_table", &c).ok());
  s = Validate(c);
  EXPECT_NE(s.message().find("--table_placement='by_table' must be row_wise or table_wise"),
            std::string::npos)
      << s;
  ASSERT_TRUE(SetFromString("table_placement", "table_wise", &c).ok());
  EXPECT_TRUE(Validate(c).ok()) << Validate(c);
}

TEST(ClusterConfigTest, IntegersOutsideTheirFieldAreRefusedNotTruncated) {
  ClusterConfig c;
  // 2^32 + 1 fits an int64 but not the int field: it used to become 1 trainer.
  absl::Status s = SetFromString("trainers", "4294967297", &c);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("--trainers='4294967297': must be <= 2147483647"), std::string::npos)
      << s;
  EXPECT_EQ(c.trainers, ClusterConfig().trainers);
  for (const char* flag : {"trainer_id", "epochs", "cpu_places", "async_max_merge"}) {
    EXPECT_FALSE(SetFromString(flag, "2147483648", &c).ok()) << flag;
    EXPECT_TRUE(SetFromString(flag, "2147483647", &c).ok()) << flag;
  }
  EXPECT_FALSE(SetFromString("trainers", "99999999999999999999", &c).ok());
  EXPECT_TRUE(SetFromString("seed", "9223372036854775807", &c).ok());  // uint64 field
  EXPECT_EQ(c.seed, uint64_t{9223372036854775807u});
  s = SetFromString("metrics_port", "65536", &c);
  EXPECT_NE(s.message().find("must be <= 65535"), std::string::npos) << s;
  EXPECT_TRUE(SetFromString("metrics_port", "65535", &c).ok());
  s = ApplyEnvironment({}, Env({{"PADDLE_TRAINERS_NUM", "4294967297"}}), &c);
  EXPECT_NE(s.message().find("PADDLE_TRAINERS_NUM='4294967297'"), std::string::npos) << s;
}

TEST(ClusterConfigTest, EverySettingSaysWhatItDoesAndItsDefault) {
  const ClusterConfig defaults;
  for (const SettingInfo& s : AllSettings()) {
    EXPECT_GE(s.help.size(), 10u) << "--" << s.flag << " has no help";
    EXPECT_EQ(s.help.find('\n'), std::string::npos) << s.flag;
    // The default shown is the value the flag sets: applying it changes nothing.
    ClusterConfig c;
    if (!s.default_value.empty()) {
      EXPECT_TRUE(SetFromString(s.flag, s.default_value, &c).ok()) << s.flag;
    }
  }
  auto find = [](const std::string& flag) {
    for (const SettingInfo& s : AllSettings()) {
      if (s.flag == flag) return s;
    }
    return SettingInfo{};
  };
  EXPECT_EQ(find("trainers").default_value, "1");
  EXPECT_EQ(find("batch_size").default_value, "256");
  EXPECT_EQ(find("sync_mode").default_value, "true");
  EXPECT_EQ(find("split_method").default_value, "round_robin");
  EXPECT_EQ(find("rpc_deadline_s").default_value, "120");
  EXPECT_EQ(find("max_line_bytes").default_value, "1048576");
  const std::string usage = DaemonUsage("tessera_pserver");
  EXPECT_NE(usage.find("--trainers\n      number of trainer processes in the job [default: 1]  "
                       "(env: TESSERA_TRAINERS, PADDLE_TRAINERS_NUM)"),
            std::string::npos)
      << usage;
  EXPECT_NE(usage.find("--checkpoint_dir\n"), std::string::npos);
}

TEST(ClusterConfigTest, GlobalBatchSmallerThanTheTrainerCountIsRefused) {
  ClusterConfig c;
  c.role = "trainer";
  c.pservers = {"127.0.0.1:7001"};
  c.trainers = 2;
  c.batch_size = 1;
  absl::Status s = Validate(c);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("--batch_size=1 is smaller than --trainers=2"), std::string::npos)
      << s;
  c.batch_size = 2;
  EXPECT_TRUE(Validate(c).ok());
}

TEST(ClusterConfigTest, HybridModeNeedsPserversTrainerEndpointsAndSyncMode) {
  ClusterConfig c;
  c.role = "trainer";
  c.mode = "hybrid";
  c.trainers = 2;
  c.pservers = {"127.0.0.1:7001"};
  absl::Status s = Validate(c);
  EXPECT_NE(s.message().find("--mode=hybrid needs --trainer_endpoints"), std::string::npos) << s;
  c.trainer_endpoints = {"127.0.0.1:7100", "127.0.0.1:7101"};
  EXPECT_TRUE(Validate(c).ok()) << Validate(c);
  c.sync_mode = false;
  EXPECT_NE(Validate(c).message().find("--mode=hybrid trains in sync mode"), std::string::npos);
  c.sync_mode = true;
  c.pservers.clear();
  EXPECT_NE(Validate(c).message().find("--pservers is empty"), std::string::npos);
  c.pservers = {"127.0.0.1:7001"};
  c.mode = "nccl";
  EXPECT_NE(Validate(c).message().find("must be pserver, collective or hybrid"),
            std::string::npos);
}

TEST(ClusterConfigTest, ValidateChecksTheWhole) {
  ClusterConfig c;
  c.role = "pserver";
  c.pservers = {"127.0.0.1:7000", "127.0.0.1:7001"};
  c.current_endpoint = "127.0.0.1:7002";
  absl::Status s = Validate(c);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("not in --pservers"), std::string::npos) << s;
  c.current_endpoint = "127.0.0.1:7001";
  EXPECT_TRUE(Validate(c).ok());
  c.pservers.push_back("nohost");
  EXPECT_NE(Validate(c).message().find("'nohost'"), std::string::npos);
  c.pservers.pop_back();
  c.pservers.push_back("127.0.0.1:7000");
  EXPECT_NE(Validate(c).message().find("--pservers names 127.0.0.1:7000 twice (entries 0 and 2)"),
            std::string::npos)
      << Validate(c);
  c.pservers.pop_back();
  c.heartbeat_s = 0.01;
  EXPECT_NE(Validate(c).message().find("--heartbeat_s=0.01 must be 0 (off) or at least 0.1"),
            std::string::npos)
      << Validate(c);
  c.heartbeat_s = 0;
  EXPECT_TRUE(Validate(c).ok());
  c.keepalive_s = 0.05;
  EXPECT_NE(Validate(c).message().find("--keepalive_s=0.05"), std::string::npos);
  c.keepalive_s = 5;
  c.trainer_id = 1;
  c.trainers = 1;
  EXPECT_FALSE(Validate(c).ok());
  c.trainer_id = 0;
  // Data settings: the format, CSV columns and the streaming reader's needs.
  c.data_format = "parquet";
  EXPECT_NE(Validate(c).message().find("--data_format: data format 'parquet'"), std::string::npos)
      << Validate(c);
  c.data_format = "csv";
  c.csv_columns = "click";
  EXPECT_NE(Validate(c).message().find("--csv_columns: CSV columns part 'click'"),
            std::string::npos)
      << Validate(c);
  c.csv_columns = "label=click";
  EXPECT_TRUE(Validate(c).ok());
  c.reader = "mmap";
  EXPECT_NE(Validate(c).message().find("--reader='mmap' must be memory or stream"),
            std::string::npos);
  c.reader = "stream";
  EXPECT_TRUE(Validate(c).ok());  // a pserver needs no data
  c.role = "trainer";
  EXPECT_NE(Validate(c).message().find("--reader=stream needs --train_data"), std::string::npos);
  c.train_data = "/data";
  EXPECT_TRUE(Validate(c).ok());
  c.role = "worker";
  EXPECT_NE(Validate(c).message().find("--role='worker'"), std::string::npos);
}

TEST(ClusterConfigTest, DeviceSettings) {
  ClusterConfig c;
  c.role = "trainer";
  c.pservers = {"127.0.0.1:7000"};
  EXPECT_EQ(c.device, "cpu");
  ASSERT_TRUE(ApplyEnvironment({}, Env({{"TESSERA_DEVICE", "gpu"}, {"TESSERA_DEVICES", "1"}}), &c)
                  .ok());
  EXPECT_EQ(c.device, "gpu");
  EXPECT_EQ(c.devices, "1");
  EXPECT_TRUE(Validate(c).ok()) << Validate(c);
  c.device = "cpu";
  EXPECT_NE(Validate(c).message().find("--devices=1 needs --device=gpu"), std::string::npos);
  c.devices.clear();
  c.device = "tpu";
  EXPECT_NE(Validate(c).message().find("--device='tpu'"), std::string::npos);
}

}  // namespace
}  // namespace tessera
