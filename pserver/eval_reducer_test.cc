// EvalReducer: partials of a round summed across trainers, a get answered once all arrived (in
// either order), refusals naming the bad partial, and failure of waiting gets.
#include "pserver/eval_reducer.h"

#include "gtest/gtest.h"

namespace tessera {
namespace {

VariableHeader Header(const std::string& name, int64_t n) {
  VariableHeader h;
  h.name = name;
  h.dtype = FLOAT64;
  h.dims = {n};
  h.total_bytes = h.chunk_bytes = n * 8;
  return h;
}

void Send(EvalReducer* r, int trainer, const std::string& name, std::vector<double> values,
          std::vector<std::function<void()>>* run) {
  auto v = r->Prepare(trainer, Header(name, static_cast<int64_t>(values.size())));
  ASSERT_TRUE(v.ok()) << v.status();
  std::copy(values.begin(), values.end(), (*v)->GetMutable<Tensor>()->data<double>());
  ASSERT_TRUE(r->Add(trainer, Header(name, static_cast<int64_t>(values.size())), run).ok());
}

void RunAll(std::vector<std::function<void()>>* run) {
  for (auto& f : *run) f();
  run->clear();
}

TEST(EvalReducerTest, AGetIsAnsweredWithTheSumOnceEveryTrainerSent) {
  EvalReducer r(3, "ps0");
  std::vector<std::function<void()>> run;
  const std::string name = EvalReducer::VariableName(4);
  Send(&r, 1, name, {1, 2}, &run);
  std::vector<double> got;
  r.Get(name, [&](absl::StatusOr<Variable> v) {
    ASSERT_TRUE(v.ok()) << v.status();
    const Tensor& t = v->Get<Tensor>();
    got.assign(t.data<double>(), t.data<double>() + t.numel());
  }, &run);
  EXPECT_TRUE(run.empty());  // trainers 0 and 2 missing
  Send(&r, 2, name, {10, 20}, &run);
  EXPECT_TRUE(run.empty());
  Send(&r, 0, name, {100, 200}, &run);
  ASSERT_EQ(run.size(), 1u);
  RunAll(&run);
  EXPECT_EQ(got, (std::vector<double>{111, 222}));
}

TEST(EvalReducerTest, AGetAfterEveryPartialIsAnsweredAtOnceAndRoundsAreApart) {
  EvalReducer r(2, "ps0");
  std::vector<std::function<void()>> run;
  Send(&r, 0, EvalReducer::VariableName(0), {1}, &run);
  Send(&r, 1, EvalReducer::VariableName(0), {2}, &run);
  Send(&r, 0, EvalReducer::VariableName(1), {5}, &run);
  double got = 0;
  r.Get(EvalReducer::VariableName(0),
        [&](absl::StatusOr<Variable> v) { got = v->Get<Tensor>().data<double>()[0]; }, &run);
  ASSERT_EQ(run.size(), 1u);
  RunAll(&run);
  EXPECT_EQ(got, 3);
  r.Get(EvalReducer::VariableName(1), [&](absl::StatusOr<Variable>) { got = -1; }, &run);
  EXPECT_TRUE(run.empty());  // round 1 lacks trainer 1
}

TEST(EvalReducerTest, BadPartialsAreRefusedNamingThem) {
  EvalReducer r(2, "ps0");
  std::vector<std::function<void()>> run;
  VariableHeader f32 = Header("@EVAL@.1", 4);
  f32.dtype = FLOAT32;
  EXPECT_EQ(r.Prepare(0, f32).status().code(), absl::StatusCode::kInvalidArgument);
  auto unnumbered = r.Prepare(0, Header("@EVAL@.x", 4));
  EXPECT_NE(unnumbered.status().message().find("'@EVAL@.x'"), std::string::npos);
  VariableHeader outside = Header("@EVAL@.1", 4);
  outside.chunk_offset = 24;
  outside.chunk_bytes = 16;
  EXPECT_FALSE(r.Prepare(0, outside).ok());
  VariableHeader short_total = Header("@EVAL@.1", 4);
  short_total.total_bytes = 16;
  EXPECT_FALSE(r.Prepare(0, short_total).ok());
  EXPECT_FALSE(r.Prepare(0, Header("@EVAL@.1", EvalReducer::kMaxValues + 1)).ok());

  Send(&r, 0, "@EVAL@.1", {1, 2}, &run);
  auto twice = r.Prepare(0, Header("@EVAL@.1", 2));
  EXPECT_NE(twice.status().message().find("twice"), std::string::npos) << twice.status();
  auto v = r.Prepare(1, Header("@EVAL@.1", 3));
  ASSERT_TRUE(v.ok());
  absl::Status other = r.Add(1, Header("@EVAL@.1", 3), &run);
  EXPECT_EQ(other.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(other.message().find("3 values, another trainer 2"), std::string::npos) << other;
}

TEST(EvalReducerTest, ATrainerThatLeftIsNotWaitedFor) {
  EvalReducer r(3, "ps0");
  std::vector<std::function<void()>> run;
  Send(&r, 0, "@EVAL@.0", {1}, &run);
  Send(&r, 2, "@EVAL@.0", {4}, &run);  // trainer 2 sent before it left: it counts
  double got = 0;
  r.Get("@EVAL@.0", [&](absl::StatusOr<Variable> v) {
    ASSERT_TRUE(v.ok()) << v.status();
    got = v->Get<Tensor>().data<double>()[0];
  }, &run);
  EXPECT_TRUE(run.empty());
  r.Leave(1, &run);  // dropped without a partial
  ASSERT_EQ(run.size(), 1u);
  RunAll(&run);
  EXPECT_EQ(got, 5);
  // Later rounds wait only for the trainers still there.
  Send(&r, 0, "@EVAL@.1", {2}, &run);
  r.Get("@EVAL@.1", [&](absl::StatusOr<Variable> v) { got = v->Get<Tensor>().data<double>()[0]; },
        &run);
  EXPECT_TRUE(run.empty());
  Send(&r, 2, "@EVAL@.1", {3}, &run);
  ASSERT_EQ(run.size(), 1u);
  RunAll(&run);
  EXPECT_EQ(got, 5);
}

TEST(EvalReducerTest, FailAllAnswersWaitingGetsWithTheReason) {
  EvalReducer r(2, "ps0");
  std::vector<std::function<void()>> run;
  absl::Status got;
  r.Get("@EVAL@.0", [&](absl::StatusOr<Variable> v) { got = v.status(); }, &run);
  r.FailAll(absl::AbortedError("job failed"), &run);
  ASSERT_EQ(run.size(), 1u);
  RunAll(&run);
  EXPECT_EQ(got.code(), absl::StatusCode::kAborted);
}

// A partial in chunks (a client's chunk size below its bytes): summed once its last chunk is
// in, whatever their order; chunks that disagree on its length are refused.
TEST(EvalReducerTest, APartialInChunksIsAddedOnceComplete) {
  EvalReducer r(2, "ps0");
  std::vector<std::function<void()>> run;
  Send(&r, 0, "@EVAL@.2", {1, 2, 3, 4}, &run);
  bool answered = false;
  std::vector<double> sum;
  r.Get(
      "@EVAL@.2",
      [&](absl::StatusOr<Variable> v) {
        ASSERT_TRUE(v.ok()) << v.status();
        const Tensor& t = v->Get<Tensor>();
        sum.assign(t.data<double>(), t.data<double>() + t.numel());
        answered = true;
      },
      &run);
  RunAll(&run);
  // Trainer 1's partial in two chunks of 16 bytes, the second first.
  for (int64_t offset : {16, 0}) {
    VariableHeader chunk = Header("@EVAL@.2", 4);
    chunk.chunk_offset = offset;
    chunk.chunk_bytes = 16;
    auto v = r.Prepare(1, chunk);
    ASSERT_TRUE(v.ok()) << v.status();
    double* d = (*v)->GetMutable<Tensor>()->data<double>() + offset / 8;
    d[0] = 10.0 * (offset / 8 + 1);
    d[1] = 10.0 * (offset / 8 + 2);
    ASSERT_TRUE(r.Add(1, chunk, &run).ok());
    RunAll(&run);
    EXPECT_EQ(answered, offset == 0) << offset;
  }
  EXPECT_EQ(sum, (std::vector<double>{11, 22, 33, 44}));

  // A chunk sent twice while another is still landing: the partial waits for that one (its
  // buffer stays) and is added once it is in.
  VariableHeader lo = Header("@EVAL@.4", 4), hi = Header("@EVAL@.4", 4);
  lo.chunk_bytes = hi.chunk_bytes = 16;
  hi.chunk_offset = 16;
  auto lo1 = r.Prepare(0, lo);
  auto hi1 = r.Prepare(0, hi);
  ASSERT_TRUE(lo1.ok() && hi1.ok());
  ASSERT_TRUE(r.Add(0, lo, &run).ok());
  auto lo2 = r.Prepare(0, lo);
  ASSERT_TRUE(lo2.ok());
  EXPECT_EQ(*lo2, *hi1);
  ASSERT_TRUE(r.Add(0, lo, &run).ok());  // 32 bytes counted, the high chunk still landing
  ASSERT_TRUE(r.Add(0, hi, &run).ok());  // (refused as never prepared had it been added)
  EXPECT_FALSE(r.Prepare(0, lo).ok());   // added: a further chunk is a second partial

  VariableHeader first = Header("@EVAL@.3", 4);
  first.chunk_bytes = 16;
  ASSERT_TRUE(r.Prepare(0, first).ok());
  ASSERT_TRUE(r.Add(0, first, &run).ok());
  VariableHeader longer = Header("@EVAL@.3", 6);
  longer.chunk_offset = 16;
  longer.chunk_bytes = 16;
  auto bad = r.Prepare(0, longer);
  EXPECT_EQ(bad.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("chunks of evaluation partial '@EVAL@.3'"),
            std::string::npos)
      << bad.status();
}

}  // namespace
}  // namespace tessera
