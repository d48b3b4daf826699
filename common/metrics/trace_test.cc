#include "common/metrics/trace.h"

#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <thread>
#include <vector>

#include "absl/time/clock.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"

namespace tessera {
namespace {

using google::protobuf::Struct;
using google::protobuf::Value;

// The "X" events of a trace document, parsed by protobuf's JSON parser (fails the test on
// invalid JSON).
std::vector<Struct> Spans(const std::string& json) {
  Struct doc;
  auto s = google::protobuf::util::JsonStringToMessage(json, &doc);
  EXPECT_TRUE(s.ok()) << s.ToString() << "\n" << json;
  std::vector<Struct> out;
  for (const Value& v : doc.fields().at("traceEvents").list_value().values()) {
    if (v.struct_value().fields().at("ph").string_value() == "X") out.push_back(v.struct_value());
  }
  return out;
}

std::string Name(const Struct& e) { return e.fields().at("name").string_value(); }
double Num(const Struct& e, const std::string& key) { return e.fields().at(key).number_value(); }
double Arg(const Struct& e, const std::string& key) {
  const auto& args = e.fields().at("args").struct_value().fields();
  auto it = args.find(key);
  return it == args.end() ? -1 : it->second.number_value();
}

TEST(TraceTest, StepsAndPhasesNestAndComputeMerges) {
  Tracer tracer(TracerOptions{3, "trainer 3"});
  StepTracer steps(&tracer, /*first_step=*/1, /*num_steps=*/2);
  for (int64_t step = 0; step < 4; ++step) {
    steps.BeginStep(step);
    EXPECT_EQ(steps.recording(), step == 1 || step == 2) << step;
    auto phase = [&](const char* name) {
      int64_t start = Tracer::NowMicros();
      absl::SleepFor(absl::Microseconds(200));
      steps.Phase(name, start, Tracer::NowMicros());
    };
    phase("compute");
    phase("compute");  // merges with the previous one
    phase("send");
    phase("send_barrier");
    phase("compute");
    phase("recv");
    phase("fetch_barrier");
    steps.EndStep();
    EXPECT_FALSE(steps.recording());
  }
  steps.Phase("send", 1, 2);  // no step open: ignored
  std::string json = tracer.ToJson();
  EXPECT_NE(json.find("\"process_name\""), std::string::npos);
  std::vector<Struct> spans = Spans(json);
  ASSERT_EQ(spans.size(), 2u * 7);  // per step: step, 2 compute, 4 RPC phases
  std::map<int, Struct> step_span;
  std::map<int, std::vector<std::string>> names;
  for (const Struct& e : spans) {
    EXPECT_EQ(Num(e, "pid"), 3);
    EXPECT_GE(Num(e, "dur"), 0);
    int step = static_cast<int>(Arg(e, "step"));
    EXPECT_TRUE(step == 1 || step == 2) << step;
    if (Name(e) == "step") {
      step_span[step] = e;
    } else {
      names[step].push_back(Name(e));
    }
  }
  for (int step : {1, 2}) {
    ASSERT_EQ(step_span.count(step), 1u);
    EXPECT_EQ(Arg(step_span[step], "incomplete"), -1);
    EXPECT_EQ(names[step], (std::vector<std::string>{"compute", "send", "send_barrier", "compute",
                                                     "recv", "fetch_barrier"}));
    double begin = Num(step_span[step], "ts"), end = begin + Num(step_span[step], "dur");
    for (const Struct& e : spans) {
      if (Name(e) == "step" || Arg(e, "step") != step) continue;
      EXPECT_GE(Num(e, "ts"), begin) << Name(e);
      EXPECT_LE(Num(e, "ts") + Num(e, "dur"), end) << Name(e);
      if (Name(e) == "compute" && Arg(e, "ops") == 2) {
        EXPECT_GE(Num(e, "dur"), 400);  // both merged ops
      }
    }
  }
  // Spans in time order within a step: the first compute (2 ops) precedes send.
  EXPECT_EQ(Arg(spans[0], "ops"), 2);
}

TEST(TraceTest, FinishClosesAFailedStepAsIncomplete) {
  Tracer tracer(TracerOptions{});
  StepTracer steps(&tracer, 0, -1);
  steps.BeginStep(0);
  steps.Phase("compute", Tracer::NowMicros(), Tracer::NowMicros());
  steps.Finish();
  EXPECT_FALSE(steps.recording());
  std::vector<Struct> spans = Spans(tracer.ToJson());
  ASSERT_EQ(spans.size(), 2u);
  EXPECT_EQ(Name(spans[1]), "step");
  EXPECT_EQ(Arg(spans[1], "incomplete"), 1);
  steps.Finish();  // nothing open: no-op
  EXPECT_EQ(tracer.size(), 2);
}

TEST(TraceTest, BoundedAndThreadSafe) {
  TracerOptions o;
  o.max_events = 1000;
  Tracer tracer(o);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 500; ++i) tracer.AddSpan("x", i, 1, {{"i", i}});
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(tracer.size(), 1000);
  EXPECT_EQ(tracer.dropped(), 1000);
  std::vector<Struct> spans = Spans(tracer.ToJson());
  EXPECT_EQ(spans.size(), 1000u);
  std::set<double> tids;
  for (const Struct& e : spans) tids.insert(Num(e, "tid"));
  EXPECT_GE(tids.size(), 2u);  // threads get their own tracks
}

TEST(TraceTest, EscapesNamesAndClampsNegativeDurations) {
  Tracer tracer(TracerOptions{0, "a \"quoted\"\\ name\n"});
  tracer.AddSpan("we\"ird", 10, -5);
  std::vector<Struct> spans = Spans(tracer.ToJson());
  ASSERT_EQ(spans.size(), 1u);
  EXPECT_EQ(Name(spans[0]), "we\"ird");
  EXPECT_EQ(Num(spans[0], "dur"), 0);
}

TEST(TraceTest, WriteFileAndItsErrors) {
  Tracer tracer(TracerOptions{});
  tracer.AddSpan("step", 1, 2, {{"step", 0}});
  std::string path = ::testing::TempDir() + "/trace_test.json";
  ASSERT_TRUE(tracer.WriteFile(path).ok());
  std::ifstream f(path);
  std::stringstream text;
  text << f.rdbuf();
  EXPECT_EQ(text.str(), tracer.ToJson());
  absl::Status bad = tracer.WriteFile("/nonexistent-dir/x/trace.json");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.message().find("/nonexistent-dir/x/trace.json"), std::string::npos) << bad;
}

}  // namespace
}  // namespace tessera
