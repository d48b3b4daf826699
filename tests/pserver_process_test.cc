// PserverProcess on its own (Create / Start / Wait), in this process: configuration errors at
// Create, a port in use at Start, and a pserver no trainer reaches ending with the startup
// timeout's message after Wait, with its totals logged.
#include <sstream>

#include "gtest/gtest.h"
#include "pserver/pserver_daemon.h"
#include "tests/cluster_util.h"

namespace tessera {
namespace {

ClusterConfig PserverConfig(const std::vector<std::string>& eps, int index) {
  ClusterConfig c;
  c.role = "pserver";
  c.pservers = eps;
  c.current_endpoint = eps[static_cast<size_t>(index)];
  c.trainers = 2;
  c.example = "mlp_regression";
  c.stats_interval_s = 0;
  return c;
}

TEST(PserverProcessTest, AnEndpointOutsideThePserverListIsAConfigurationError) {
  auto eps = FreeEndpoints(3);
  ASSERT_TRUE(eps.ok()) << eps.status();
  ClusterConfig c = PserverConfig({(*eps)[0], (*eps)[1]}, 0);
  c.current_endpoint = (*eps)[2];
  std::ostringstream log;
  auto p = PserverProcess::Create(c, log);
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.status().message().find((*eps)[2]), std::string::npos) << p.status();
}

TEST(PserverProcessTest, APortInUseFailsStart) {
  auto eps = FreeEndpoints(2);
  ASSERT_TRUE(eps.ok()) << eps.status();
  ClusterConfig c = PserverConfig(*eps, 0);
  std::ostringstream log_a, log_b;
  auto a = PserverProcess::Create(c, log_a);
  auto b = PserverProcess::Create(c, log_b);
  ASSERT_TRUE(a.ok() && b.ok());
  ASSERT_TRUE((*a)->Start().ok());
  absl::Status second = (*b)->Start();
  EXPECT_FALSE(second.ok());
  EXPECT_NE(second.message().find((*eps)[0]), std::string::npos) << second;
  // Both are destroyed without Wait: nothing hangs.
}

TEST(PserverProcessTest, NoTrainerEndsWaitWithTheStartupTimeout) {
  auto eps = FreeEndpoints(1);
  ASSERT_TRUE(eps.ok()) << eps.status();
  ClusterConfig c = PserverConfig(*eps, 0);
  c.startup_timeout_s = 0.3;
  std::ostringstream log;
  auto p = PserverProcess::Create(c, log);
  ASSERT_TRUE(p.ok()) << p.status();
  ASSERT_TRUE((*p)->Start().ok());
  absl::Status s = (*p)->Wait();
  EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
  EXPECT_NE(s.message().find("no trainer reached it within --startup_timeout_s=0.3"),
            std::string::npos)
      << s;
  EXPECT_NE(log.str().find("serving"), std::string::npos) << log.str();
  EXPECT_NE(log.str().find("steps=0"), std::string::npos) << log.str();
}

}  // namespace
}  // namespace tessera
