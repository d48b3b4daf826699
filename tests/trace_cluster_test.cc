// A real pserver + trainer job with --trace: the trainer's Chrome-trace JSON is valid (parsed
// by protobuf's JSON parser), holds one "step" span per traced step and, nested in each, the
// phases compute, prefetch, send and recv (the sync barriers ride on send and recv, and no
// separate barrier phase appears; on one place the step's recv rides on its send). The
// pservers' traces of the same steps: each step's optimize with its phases, inside trainer 0's
// barrier wait, inside the trainer's send (one clock). A job whose pserver dies still leaves the
// steps it recorded, the failed one marked incomplete; a bad --trace path fails a trainer or a
// pserver at start naming the path.
#include <signal.h>
#include <sys/wait.h>

#include <map>
#include <set>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "google/protobuf/struct.pb.h"
#include "google/protobuf/util/json_util.h"
#include "gtest/gtest.h"
#include "tests/cluster_util.h"

namespace tessera {
namespace {

using google::protobuf::Struct;
using google::protobuf::Value;

struct Span {
  std::string name;
  double ts = -1, dur = -1, pid = -1;
  int64_t step = -1;
  int64_t trainer = -1;  // the pservers' per-request spans
  bool incomplete = false;

  double end() const { return ts + dur; }
};

// The "X" events of the trace at `path`; fails the test when it is not valid trace JSON.
std::vector<Span> ReadTrace(const std::string& path) {
  std::string json = ReadFileOrEmpty(path);
  Struct doc;
  auto s = google::protobuf::util::JsonStringToMessage(json, &doc);
  EXPECT_TRUE(s.ok()) << s.ToString() << "\n" << json;
  std::vector<Span> out;
  auto events = doc.fields().find("traceEvents");
  EXPECT_NE(events, doc.fields().end()) << json;
  if (events == doc.fields().end()) return out;
  for (const Value& v : events->second.list_value().values()) {
    const auto& f = v.struct_value().fields();
    if (f.at("ph").string_value() != "X") continue;
    Span span;
    span.name = f.at("name").string_value();
    EXPECT_TRUE(f.count("ts") && f.count("dur") && f.count("pid") && f.count("tid"));
    span.ts = f.at("ts").number_value();
    span.dur = f.at("dur").number_value();
    span.pid = f.at("pid").number_value();
    const auto& args = f.at("args").struct_value().fields();
    if (args.count("step")) span.step = static_cast<int64_t>(args.at("step").number_value());
    if (args.count("trainer")) {
      span.trainer = static_cast<int64_t>(args.at("trainer").number_value());
    }
    span.incomplete = args.count("incomplete") && args.at("incomplete").number_value() == 1;
    out.push_back(span);
  }
  return out;
}

bool ExitedWith(int status, int code) { return WIFEXITED(status) && WEXITSTATUS(status) == code; }

// Starts trainer 0 with `argv` (logging to dir/trainer.log), waits (at most 90 s) for it to exit
// 0, then (at most 30 s each) for `pservers`.
void RunTrainerToSuccess(ProcessGroup* group, const std::string& dir,
                         const std::vector<std::string>& argv, const std::vector<pid_t>& pservers) {
  auto trainer = group->Start(argv, dir + "/trainer.log");
  ASSERT_TRUE(trainer.ok());
  auto status = group->Wait(*trainer, absl::Seconds(90));
  ASSERT_TRUE(status.ok()) << ReadFileOrEmpty(dir + "/trainer.log");
  ASSERT_TRUE(ExitedWith(*status, 0)) << ReadFileOrEmpty(dir + "/trainer.log");
  for (pid_t p : pservers) EXPECT_TRUE(group->Wait(p, absl::Seconds(30)).ok());
}

// Starts a pserver at `endpoint` and trainer 0 (tracing to `trace` with --trace_steps=
// `trace_steps`), both with `common` flags, in `group`; waits (at most 60 s) until the trainer
// logged step 20. Their pids go to *pserver and *trainer.
void StartTracedJobPastStep20(ProcessGroup* group, const std::string& dir,
                              const std::string& endpoint, const std::vector<std::string>& common,
                              const std::string& trace, const std::string& trace_steps,
                              pid_t* pserver, pid_t* trainer) {
  std::vector<std::string> ps_argv = {RunfilePath("pserver/tessera_pserver"),
                                      "--current_endpoint=" + endpoint};
  ps_argv.insert(ps_argv.end(), common.begin(), common.end());
  auto ps = group->Start(ps_argv, dir + "/pserver.log");
  ASSERT_TRUE(ps.ok());
  *pserver = *ps;
  std::vector<std::string> tr = {RunfilePath("trainer/tessera_trainer"), "--trainer_id=0",
                                 "--trace=" + trace, "--trace_steps=" + trace_steps};
  tr.insert(tr.end(), common.begin(), common.end());
  auto t = group->Start(tr, dir + "/trainer.log");
  ASSERT_TRUE(t.ok());
  *trainer = *t;
  absl::Time deadline = absl::Now() + absl::Seconds(60);
  while (ReadFileOrEmpty(dir + "/trainer.log").find("step 20 ") == std::string::npos) {
    ASSERT_LT(absl::Now(), deadline) << ReadFileOrEmpty(dir + "/trainer.log");
    ASSERT_TRUE(group->Running(*trainer)) << ReadFileOrEmpty(dir + "/trainer.log");
    absl::SleepFor(absl::Milliseconds(50));
  }
}

// A sync pserver's trace of steps 3..7 (process `pid`) against trainer 0's, `trainer` (per
// step, the first span of each name): per step, one optimize holding its tables, answer and
// blocks phases in that order, and one send and one fetch barrier of trainer 0, the optimize
// inside the send barrier's wait and the send barrier inside the trainer's send (one clock);
// one lookup batch of trainer 0 per step, which `ahead` (the next batch's, sent during the step)
// is answered only once the step's tables are applied, and otherwise (the step's own) before
// the step's optimize starts.
void ExpectPserverTimeline(const std::vector<Span>& spans, int pid,
                           std::map<int64_t, std::map<std::string, Span>>& trainer, bool ahead) {
  std::map<int64_t, std::map<std::string, std::vector<Span>>> by_step;
  for (const Span& s : spans) {
    EXPECT_EQ(s.pid, pid) << s.name;
    EXPECT_GT(s.ts, 0) << s.name;
    EXPECT_GE(s.dur, 0) << s.name;
    EXPECT_GE(s.step, 3) << s.name;
    EXPECT_LE(s.step, 7) << s.name;
    by_step[s.step][s.name].push_back(s);
  }
  for (int64_t step = 3; step <= 7; ++step) {
    SCOPED_TRACE(absl::StrCat("step ", step));
    auto& got = by_step[step];
    for (const char* name :
         {"optimize", "tables", "answer", "blocks", "send_barrier", "fetch_barrier", "prefetch"}) {
      ASSERT_EQ(got[name].size(), 1u) << name;
    }
    const Span& optimize = got["optimize"][0];
    const Span& tables = got["tables"][0];
    const Span& answer = got["answer"][0];
    const Span& blocks = got["blocks"][0];
    EXPECT_EQ(tables.ts, optimize.ts);
    EXPECT_EQ(answer.ts, tables.end());
    EXPECT_EQ(blocks.ts, answer.end());
    EXPECT_EQ(blocks.end(), optimize.end());
    const Span& send_barrier = got["send_barrier"][0];
    EXPECT_EQ(send_barrier.trainer, 0);
    EXPECT_EQ(got["fetch_barrier"][0].trainer, 0);
    EXPECT_LE(send_barrier.ts, optimize.ts);
    EXPECT_GE(send_barrier.end(), optimize.end());
    const Span& send = trainer[step]["send"];
    EXPECT_LE(send.ts, send_barrier.ts);
    EXPECT_GE(send.end(), send_barrier.end());
    const Span& prefetch = got["prefetch"][0];
    EXPECT_EQ(prefetch.trainer, 0);
    if (ahead) {
      EXPECT_GE(prefetch.end(), tables.end());
    } else {
      EXPECT_LE(prefetch.end(), optimize.ts);
    }
  }
}

// A traced 1-trainer CTR job with `extra` flags for every process, whose trainer looks up the
// next batch during a step's recv exactly when `prefetch_ahead`.
void ExpectNestedStepTimeline(const std::vector<std::string>& extra, bool prefetch_ahead) {
  std::string dir = MakeTempDir("trace");
  auto eps = FreeEndpoints(2);
  ASSERT_TRUE(eps.ok());
  std::string pservers = (*eps)[0] + "," + (*eps)[1];
  // 1024 examples / 64 = 16 steps; steps 3..7 are traced.
  std::vector<std::string> common = {
      "--pservers=" + pservers, "--trainers=1",    "--example=ctr", "--num_examples=1024",
      "--num_test_examples=64", "--batch_size=64", "--epochs=1",    "--vocab_per_slot=500",
      "--barrier_timeout_s=20"};
  common.insert(common.end(), extra.begin(), extra.end());
  ProcessGroup group;
  std::vector<pid_t> ps;
  for (int i = 0; i < 2; ++i) {
    std::vector<std::string> argv = {RunfilePath("pserver/tessera_pserver"),
                                     "--current_endpoint=" + (*eps)[i],
                                     absl::StrCat("--trace=", dir, "/pserver.", i, ".json"),
                                     "--trace_first_step=3", "--trace_steps=5"};
    argv.insert(argv.end(), common.begin(), common.end());
    auto pid = group.Start(argv, absl::StrCat(dir, "/pserver.", i, ".log"));
    ASSERT_TRUE(pid.ok());
    ps.push_back(*pid);
  }
  std::string trace = dir + "/trace.json";
  std::vector<std::string> tr = {RunfilePath("trainer/tessera_trainer"), "--trainer_id=0",
                                 "--trace=" + trace, "--trace_first_step=3", "--trace_steps=5"};
  tr.insert(tr.end(), common.begin(), common.end());
  RunTrainerToSuccess(&group, dir, tr, ps);
  if (::testing::Test::HasFatalFailure()) return;
  EXPECT_NE(ReadFileOrEmpty(dir + "/trainer.log").find("spans written to " + trace),
            std::string::npos);

  std::vector<Span> spans = ReadTrace(trace);
  std::map<int64_t, Span> steps;
  std::map<int64_t, std::multiset<std::string>> phases;
  for (const Span& s : spans) {
    EXPECT_GT(s.ts, 0) << s.name;
    EXPECT_GE(s.dur, 0) << s.name;
    EXPECT_EQ(s.pid, 0) << s.name;
    ASSERT_GE(s.step, 0) << s.name << " has no step";
    if (s.name == "step") {
      EXPECT_EQ(steps.count(s.step), 0u) << "step " << s.step << " twice";
      steps[s.step] = s;
    } else {
      phases[s.step].insert(s.name);
    }
  }
  std::set<int64_t> got;
  for (const auto& [step, span] : steps) {
    got.insert(step);
    EXPECT_FALSE(span.incomplete);
  }
  EXPECT_EQ(got, (std::set<int64_t>{3, 4, 5, 6, 7}));
  for (int64_t step = 3; step <= 7; ++step) {
    for (const char* want : {"compute", "prefetch", "send"}) {
      EXPECT_GE(phases[step].count(want), 1u) << want << " missing in step " << step;
    }
    // Sync on one place, the step's receive rides on its send: no recv of its own.
    EXPECT_EQ(phases[step].count("recv"), 0u) << "step " << step;
    for (const char* gone : {"send_barrier", "fetch_barrier"}) {
      EXPECT_EQ(phases[step].count(gone), 0u)
          << gone << " is a request of its own in step " << step;
    }
  }
  // Every phase lies inside its step's span (timestamps are whole microseconds).
  for (const Span& s : spans) {
    if (s.name == "step") continue;
    ASSERT_EQ(steps.count(s.step), 1u) << s.name << " of untraced step " << s.step;
    const Span& st = steps[s.step];
    EXPECT_GE(s.ts, st.ts) << s.name << " of step " << s.step;
    EXPECT_LE(s.ts + s.dur, st.ts + st.dur) << s.name << " of step " << s.step;
  }
  // Steps follow each other.
  for (int64_t step = 4; step <= 7; ++step) {
    EXPECT_GE(steps[step].ts, steps[step - 1].ts + steps[step - 1].dur);
  }
  // Where the lookups run: with prefetch_ahead (sync, sends carrying the barrier: pipelined),
  // a step's prefetch span is the next batch's requests going out beside the compute (when
  // depends on the threads' scheduling: not checked here); the pservers answer them only once
  // they applied the step (their traces show it, below), and the rows are stored by the reply's
  // thread. Without, the prefetch is the step's own, before its compute.
  std::map<int64_t, std::map<std::string, Span>> first;
  for (const Span& s : spans) {
    auto& f = first[s.step];
    if (f.count(s.name) == 0 || s.ts < f[s.name].ts) f[s.name] = s;
  }
  for (int64_t step = 3; step <= 7; ++step) {
    const Span& prefetch = first[step]["prefetch"];
    EXPECT_GE(prefetch.ts, 0) << "step " << step << " has no prefetch";
    if (!prefetch_ahead) {
      EXPECT_LE(prefetch.ts + prefetch.dur, first[step]["compute"].ts) << "step " << step;
    }
  }
  for (int i = 0; i < 2; ++i) {
    SCOPED_TRACE(absl::StrCat("pserver ", i));
    ExpectPserverTimeline(ReadTrace(absl::StrCat(dir, "/pserver.", i, ".json")), 1000 + i, first,
                          prefetch_ahead);
  }
}

TEST(TraceClusterTest, TrainerWritesNestedStepTimeline) {
  ExpectNestedStepTimeline({}, /*prefetch_ahead=*/true);
}

TEST(TraceClusterTest, TrainerWritesNestedStepTimelineWithoutPrefetchAhead) {
  ExpectNestedStepTimeline({"--prefetch_ahead=false"}, /*prefetch_ahead=*/false);
}

// Admission counts sightings: the next batch's lookups would land in a checkpoint taken after
// the step, so the trainer does not look ahead then.
TEST(TraceClusterTest, NoPrefetchAheadWithTableAdmission) {
  ExpectNestedStepTimeline({"--table_admission_threshold=2"}, /*prefetch_ahead=*/false);
}

// Async: no barriers and no step-wide optimize on the pserver; its trace holds the trainer's
// lookup batches only.
TEST(TraceClusterTest, AnAsyncPserverTracesItsLookupsOnly) {
  std::string dir = MakeTempDir("trace_async");
  auto eps = FreeEndpoints(1);
  ASSERT_TRUE(eps.ok());
  std::vector<std::string> common = {
      "--pservers=" + (*eps)[0], "--trainers=1",         "--example=ctr",  "--num_examples=1024",
      "--num_test_examples=64",  "--batch_size=64",      "--epochs=1",     "--vocab_per_slot=500",
      "--sync_mode=false",       "--trace_first_step=3", "--trace_steps=5"};
  ProcessGroup group;
  std::vector<std::string> ps_argv = {RunfilePath("pserver/tessera_pserver"),
                                      "--current_endpoint=" + (*eps)[0],
                                      "--trace=" + dir + "/pserver.json"};
  ps_argv.insert(ps_argv.end(), common.begin(), common.end());
  auto ps = group.Start(ps_argv, dir + "/pserver.log");
  ASSERT_TRUE(ps.ok());
  std::vector<std::string> tr_argv = {RunfilePath("trainer/tessera_trainer"), "--trainer_id=0"};
  tr_argv.insert(tr_argv.end(), common.begin(), common.end());
  RunTrainerToSuccess(&group, dir, tr_argv, {*ps});
  if (HasFatalFailure()) return;
  std::set<int64_t> steps;
  for (const Span& s : ReadTrace(dir + "/pserver.json")) {
    EXPECT_EQ(s.name, "prefetch");
    EXPECT_EQ(s.pid, 1000);
    EXPECT_EQ(s.trainer, 0);
    steps.insert(s.step);
  }
  EXPECT_EQ(steps, (std::set<int64_t>{3, 4, 5, 6, 7})) << ReadFileOrEmpty(dir + "/pserver.log");
}

TEST(TraceClusterTest, FailedRunKeepsTheStepsItRecorded) {
  std::string dir = MakeTempDir("trace_fail");
  auto eps = FreeEndpoints(1);
  ASSERT_TRUE(eps.ok());
  std::vector<std::string> common = {"--pservers=" + (*eps)[0],  "--trainers=1",
                                     "--example=mlp_regression", "--num_examples=256",
                                     "--batch_size=32",          "--epochs=100000",
                                     "--log_every_steps=10",     "--rpc_deadline_s=2",
                                     "--barrier_timeout_s=20",   "--verbose"};
  ProcessGroup group;
  std::string trace = dir + "/trace.json";
  pid_t ps = -1, trainer = -1;
  // Let it train a few steps, then kill the pserver.
  StartTracedJobPastStep20(&group, dir, (*eps)[0], common, trace, "1000000", &ps, &trainer);
  if (HasFatalFailure()) return;
  group.Kill(ps, SIGKILL);
  auto status = group.Wait(trainer, absl::Seconds(60));
  ASSERT_TRUE(status.ok()) << ReadFileOrEmpty(dir + "/trainer.log");
  EXPECT_FALSE(ExitedWith(*status, 0)) << ReadFileOrEmpty(dir + "/trainer.log");

  std::vector<Span> spans = ReadTrace(trace);
  int complete = 0, incomplete = 0;
  int64_t last_step = -1;
  for (const Span& s : spans) {
    if (s.name != "step") continue;
    (s.incomplete ? incomplete : complete) += 1;
    if (s.incomplete) EXPECT_GT(s.step, last_step);  // the failed step is the last one
    last_step = std::max(last_step, s.step);
  }
  EXPECT_GE(complete, 20) << ReadFileOrEmpty(dir + "/trainer.log");
  EXPECT_EQ(incomplete, 1) << ReadFileOrEmpty(dir + "/trainer.log");
  // --verbose: after the one-line cause, the failed op in full (inputs and outputs).
  const std::string log = ReadFileOrEmpty(dir + "/trainer.log");
  const size_t full = log.find("tessera_trainer: in full: op #");
  EXPECT_NE(full, std::string::npos) << log;
  EXPECT_NE(log.find(") -> (", full), std::string::npos) << log;
}

TEST(TraceClusterTest, TraceIsWrittenWhenItsLastStepEndsEvenIfTheTrainerIsKilled) {
  std::string dir = MakeTempDir("trace_kill");
  auto eps = FreeEndpoints(1);
  ASSERT_TRUE(eps.ok());
  std::vector<std::string> common = {"--pservers=" + (*eps)[0],  "--trainers=1",
                                     "--example=mlp_regression", "--num_examples=256",
                                     "--batch_size=32",          "--epochs=100000",
                                     "--log_every_steps=10"};
  ProcessGroup group;
  std::string trace = dir + "/trace.json";
  pid_t ps = -1, trainer = -1;
  StartTracedJobPastStep20(&group, dir, (*eps)[0], common, trace, "10", &ps, &trainer);
  if (HasFatalFailure()) return;
  group.Kill(trainer, SIGKILL);  // no chance to write at exit
  std::set<int64_t> steps;
  for (const Span& s : ReadTrace(trace)) {
    if (s.name == "step" && !s.incomplete) steps.insert(s.step);
  }
  EXPECT_EQ(steps, (std::set<int64_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}));
  for (pid_t pid : group.pids()) group.Kill(pid, SIGKILL);
}

TEST(TraceClusterTest, UnwritableTracePathFailsAtStart) {
  std::string dir = MakeTempDir("trace_bad");
  auto eps = FreeEndpoints(1);
  ASSERT_TRUE(eps.ok());
  std::string bad = dir + "/no/such/dir/trace.json";
  ProcessGroup group;
  auto trainer = group.Start(
      {RunfilePath("trainer/tessera_trainer"), "--trainer_id=0", "--pservers=" + (*eps)[0],
       "--trainers=1", "--example=mlp_regression", "--trace=" + bad},
      dir + "/trainer.log");
  ASSERT_TRUE(trainer.ok());
  auto status = group.Wait(*trainer, absl::Seconds(30));
  ASSERT_TRUE(status.ok());
  EXPECT_FALSE(ExitedWith(*status, 0));
  std::string log = ReadFileOrEmpty(dir + "/trainer.log");
  EXPECT_NE(log.find("trace file " + bad), std::string::npos) << log;
  auto pserver = group.Start(
      {RunfilePath("pserver/tessera_pserver"), "--current_endpoint=" + (*eps)[0],
       "--pservers=" + (*eps)[0], "--trainers=1", "--example=mlp_regression", "--trace=" + bad},
      dir + "/pserver.log");
  ASSERT_TRUE(pserver.ok());
  status = group.Wait(*pserver, absl::Seconds(30));
  ASSERT_TRUE(status.ok());
  EXPECT_FALSE(ExitedWith(*status, 0));
  log = ReadFileOrEmpty(dir + "/pserver.log");
  EXPECT_NE(log.find("trace file " + bad), std::string::npos) << log;
}

}  // namespace
}  // namespace tessera
