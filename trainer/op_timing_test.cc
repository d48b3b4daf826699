#include "trainer/op_timing.h"

#include "absl/time/clock.h"
#include "common/framework/executor.h"
#include "common/framework/op_desc.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

OpInfo Sleeper(absl::Duration d, absl::Status result = absl::OkStatus()) {
  return OpInfo{[d, result](OpContext&) {
                  absl::SleepFor(d);
                  return result;
                },
                nullptr};
}

ProgramDesc Program(const std::vector<std::string>& types) {
  ProgramDesc p;
  BlockDesc* b = p.add_blocks();
  for (const auto& t : types) b->add_ops()->set_type(t);
  return p;
}

TEST(OpTimingTest, PhasesOfRpcAndCollectiveOps) {
  EXPECT_STREQ(TracePhaseOf("send"), "send");
  EXPECT_STREQ(TracePhaseOf("send_barrier"), "send_barrier");
  EXPECT_STREQ(TracePhaseOf("recv"), "recv");
  EXPECT_STREQ(TracePhaseOf("fetch_barrier"), "fetch_barrier");
  EXPECT_STREQ(TracePhaseOf("prefetch"), "prefetch");
  EXPECT_STREQ(TracePhaseOf("c_allreduce_mean"), "allreduce");
  EXPECT_STREQ(TracePhaseOf("mul"), "compute");
  EXPECT_STREQ(TracePhaseOf("sender"), "compute");
}

TEST(OpTimingTest, TracesStepsAndTimesBarriers) {
  OpRegistry base;
  ASSERT_TRUE(base.Register("mul", Sleeper(absl::Milliseconds(1))).ok());
  ASSERT_TRUE(base.Register("send", Sleeper(absl::Milliseconds(1))).ok());
  ASSERT_TRUE(base.Register("send_barrier", Sleeper(absl::Milliseconds(3))).ok());
  ASSERT_TRUE(base.Register("fetch_barrier", Sleeper(absl::Milliseconds(0))).ok());
  ASSERT_TRUE(
      base.Register("bad", Sleeper(absl::ZeroDuration(), absl::InternalError("boom"))).ok());
  Tracer tracer(TracerOptions{});
  StepTracer steps(&tracer, /*first_step=*/1, /*num_steps=*/1);
  MetricsRegistry metrics;
  Histogram* send_wait = metrics.GetHistogram("send_wait", "", {0.002}).value();
  Histogram* fetch_wait = metrics.GetHistogram("fetch_wait", "", {0.002}).value();
  OpRegistry timed;
  ASSERT_TRUE(RegisterTimedOps(base, OpTimingOptions{&steps, send_wait, fetch_wait}, &timed).ok());
  EXPECT_EQ(timed.Types(), base.Types());
  // Registering twice into the same registry fails.
  EXPECT_EQ(RegisterTimedOps(base, OpTimingOptions{}, &timed).code(),
            absl::StatusCode::kAlreadyExists);

  Executor exec(&timed);
  ProgramDesc p = Program({"mul", "mul", "send", "send_barrier", "mul", "fetch_barrier"});
  Scope scope;
  for (int64_t step = 0; step < 3; ++step) {
    steps.BeginStep(step);
    ASSERT_TRUE(exec.Run(p, 0, &scope).ok());
    steps.EndStep();
  }
  // Barriers are timed in every step, traced or not.
  Histogram::Snapshot s = send_wait->Get();
  EXPECT_EQ(s.count, 3u);
  EXPECT_EQ(s.counts[0], 0u);  // each blocked >= 3 ms
  EXPECT_GE(s.sum, 0.009);
  EXPECT_EQ(fetch_wait->Get().count, 3u);
  // Only step 1 is traced: step, compute (2 ops), send, send_barrier, compute, fetch_barrier.
  EXPECT_EQ(tracer.size(), 6);
  std::string json = tracer.ToJson();
  for (const char* want : {"\"step\",", "\"send\",", "\"send_barrier\",", "\"fetch_barrier\","}) {
    EXPECT_NE(json.find(std::string("{\"name\":") + want), std::string::npos) << want << json;
  }
  EXPECT_NE(json.find("\"args\":{\"step\":1,\"ops\":2}"), std::string::npos) << json;
  EXPECT_EQ(json.find("\"step\":0"), std::string::npos);
  EXPECT_EQ(json.find("\"step\":2"), std::string::npos);

  // A failing kernel's error passes through unchanged (the executor annotates it).
  absl::Status bad = exec.Run(Program({"bad"}), 0, &scope);
  EXPECT_EQ(bad.code(), absl::StatusCode::kInternal);
  EXPECT_NE(bad.message().find("boom"), std::string::npos);
}

// A send that carries its barriers counts as the send wait; one with the step's receive folded
// in (attr recv_folded) as both waits; one without a barrier as neither.
TEST(OpTimingTest, ASendWithTheReceiveFoldedInCountsAsBothWaits) {
  OpRegistry base;
  ASSERT_TRUE(base.Register("send", Sleeper(absl::ZeroDuration())).ok());
  MetricsRegistry metrics;
  Histogram* send_wait = metrics.GetHistogram("send_wait", "", {0.002}).value();
  Histogram* fetch_wait = metrics.GetHistogram("fetch_wait", "", {0.002}).value();
  OpRegistry timed;
  ASSERT_TRUE(
      RegisterTimedOps(base, OpTimingOptions{nullptr, send_wait, fetch_wait}, &timed).ok());
  ProgramDesc p = Program({"send", "send", "send"});
  OpDesc* barrier = p.mutable_blocks(0)->mutable_ops(1);
  SetAttr(barrier, "barrier_endpoints", std::vector<std::string>{"ps0"});
  OpDesc* folded = p.mutable_blocks(0)->mutable_ops(2);
  SetAttr(folded, "barrier_endpoints", std::vector<std::string>{"ps0"});
  SetAttr(folded, "recv_folded", true);
  Executor exec(&timed);
  Scope scope;
  ASSERT_TRUE(exec.Run(p, 0, &scope).ok());
  EXPECT_EQ(send_wait->Get().count, 2u);
  EXPECT_EQ(fetch_wait->Get().count, 1u);
}

}  // namespace
}  // namespace tessera
