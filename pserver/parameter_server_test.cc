// ParameterServer's sync step protocol for requests that ride with a step (after_update): the
// next batch's lookups and the step's gets, sent before the step's gradients, are answered once
// the step is applied, with the updated rows; the fused lookups of the optimize equal plain
// ones; a later step than the server's is refused; a failed job answers held requests.
#include "pserver/parameter_server.h"

#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/framework/executor.h"
#include "common/framework/op_desc.h"
#include "common/layers/layers.h"
#include "common/layers/optimizer.h"
#include "common/ops/ops.h"
#include "common/rpc/inproc/inproc_client.h"
#include "gtest/gtest.h"
#include "transpiler/distribute_transpiler.h"

namespace tessera {
namespace {

constexpr float kLr = 0.5f;
const char kEndpoint[] = "10.0.0.1:7000";

// ids -> a distributed table "table" (width 2) and a dense fc "fc" over x, SGD: one trainer,
// one pserver, sync.
struct Job {
  std::unique_ptr<OpRegistry> registry = NewStandardOpRegistry();
  ProgramDesc program;
  Scope scope;
  std::unique_ptr<ParameterServer> server;
  std::vector<std::string> dense_grads;
  std::string table_grad;
};

// `trainers` trainers; `decay_steps` > 0: the learning rate halves every decay_steps steps;
// `tune` may change the server's options.
std::unique_ptr<Job> MakeJob(int trainers = 1, int64_t decay_steps = 0,
                             const std::function<void(ParameterServerOptions&)>& tune = nullptr,
                             bool sync = true) {
  auto job = std::make_unique<Job>();
  ProgramDesc main, startup;
  ProgramBuilder b(&main, &startup);
  std::string x = layers::Data(b, "x", {-1, 3});
  std::string ids = layers::Data(b, "ids", {-1, 1}, INT64);
  layers::FcOptions fo;
  fo.name = "fc";
  fo.bias = false;
  layers::EmbeddingOptions dist;
  dist.name = "table";
  dist.is_sparse = true;
  dist.is_distributed = true;
  std::string loss =
      layers::ElementwiseAdd(b, layers::Mean(b, layers::Fc(b, x, 2, fo)),
                             layers::Mean(b, layers::Embedding(b, ids, 10, 2, dist)));
  OptimizerOptions oo;
  oo.learning_rate = kLr;
  oo.decay_steps = decay_steps;
  oo.decay_rate = 0.5f;
  EXPECT_TRUE(SGD(oo).Minimize(b, *job->registry, loss).ok());
  TranspilerConfig cfg;
  cfg.pservers = {kEndpoint};
  cfg.trainers = trainers;
  cfg.sync_mode = sync;
  auto t = DistributeTranspiler::Transpile(main, startup, cfg);
  EXPECT_TRUE(t.ok()) << t.status();
  job->program = *t->GetPserverProgram(kEndpoint);
  Executor exec(job->registry.get());
  EXPECT_TRUE(exec.Run(*t->GetPserverStartupProgram(kEndpoint), 0, &job->scope).ok());
  ParameterServerOptions po;
  po.job_id = "job";
  po.endpoint = kEndpoint;
  po.barrier_timeout = absl::Seconds(30);
  po.param_blocks = t->param_blocks();
  if (tune) tune(po);
  auto server = ParameterServer::Create(job->program, &job->scope, job->registry.get(), po);
  EXPECT_TRUE(server.ok()) << server.status();
  job->server = std::move(*server);
  for (const auto& op : job->program.blocks(0).ops()) {
    if (op.type() != "listen_and_serv") continue;
    for (const std::string& entry : GetStringsAttr(op, "grad_to_block_id")) {
      job->dense_grads.push_back(entry.substr(0, entry.rfind(':')));
    }
  }
  for (const auto& op : job->program.blocks(0).ops()) {
    if (op.type() == "sparse_table") job->table_grad = GetStringAttr(op, "grad", "");
  }
  EXPECT_FALSE(job->table_grad.empty());
  return job;
}

RequestMeta Meta(int64_t step, int trainer = 0) { return RequestMeta{"job", trainer, step}; }

// What a held request was answered, once it was.
struct Answer {
  absl::Mutex mu;
  bool answered = false;
  std::vector<absl::StatusOr<Tensor>> rows;
  bool Answered() {
    absl::MutexLock lock(&mu);
    return answered;
  }
  RequestHandler::PrefetchBatchDone Done() {
    return [this](std::vector<absl::StatusOr<Tensor>> got) {
      absl::MutexLock lock(&mu);
      rows = std::move(got);
      answered = true;
    };
  }
  void Wait() {
    absl::MutexLock lock(&mu);
    mu.AwaitWithTimeout(absl::Condition(&answered), absl::Seconds(20));
    ASSERT_TRUE(answered);
  }
};

std::vector<float> Row(const absl::StatusOr<Tensor>& rows, int i) {
  EXPECT_TRUE(rows.ok()) << rows.status();
  if (!rows.ok()) return {};
  return {rows->data<float>()[2 * i], rows->data<float>()[2 * i + 1]};
}

// Sends trainer `meta.trainer_id`'s dense gradients of step `meta.step`, every element `dense`.
void SendDense(Job& job, const RequestMeta& meta, float dense) {
  for (const std::string& g : job.dense_grads) {
    VariableHeader h;
    h.name = g;
    const Variable* param = job.scope.FindVar(g.substr(0, g.find("@GRAD")));
    ASSERT_NE(param, nullptr) << g;
    h.dims = param->Get<Tensor>().shape();
    h.total_bytes = h.chunk_bytes = static_cast<int64_t>(param->Get<Tensor>().nbytes());
    auto dest = job.server->PrepareReceive(meta, h);
    ASSERT_TRUE(dest.ok()) << dest.status();
    Tensor* value = (*dest)->GetMutable<Tensor>();
    for (int64_t i = 0; i < value->numel(); ++i) value->data<float>()[i] = dense;
    job.server->HandleSend(meta, h, *dest, [](absl::Status s) { EXPECT_TRUE(s.ok()) << s; });
  }
}

// Sends trainer `trainer`'s table rows {1: (1, 2)} of step `step` and its send barrier (and,
// unless `dense_sent`, its dense gradients, all `dense`, in the same request as a SendBatch).
void SendStep(Job& job, int64_t step, float dense = 0, DoneCallback barrier_done = nullptr,
              int trainer = 0, bool dense_sent = false) {
  RequestMeta meta = Meta(step, trainer);
  meta.barrier_follows = true;
  if (!dense_sent) SendDense(job, meta, dense);
  VariableHeader h;
  h.name = job.table_grad;
  h.type = SELECTED_ROWS;
  h.dims = {1, 2};
  h.height = 10;
  h.num_rows = 1;
  h.total_bytes = h.chunk_bytes = 8;
  auto dest = job.server->PrepareReceive(meta, h);
  ASSERT_TRUE(dest.ok()) << dest.status();
  SelectedRows* sr = (*dest)->GetMutable<SelectedRows>();
  sr->rows = {1};
  sr->value.data<float>()[0] = 1;
  sr->value.data<float>()[1] = 2;
  job.server->HandleSend(meta, h, *dest, [](absl::Status s) { EXPECT_TRUE(s.ok()) << s; });
  if (!barrier_done) barrier_done = [](absl::Status s) { EXPECT_TRUE(s.ok()) << s; };
  job.server->HandleBarrier(meta, SEND_BARRIER, std::move(barrier_done));
}

TEST(ParameterServerTest, LookupsAfterTheUpdateWaitForItAndSeeIt) {
  std::unique_ptr<Job> job = MakeJob();
  // The rows before any update.
  Answer before;
  job->server->HandlePrefetchBatch(Meta(0), {{"table", {1, 2}}}, false, before.Done());
  ASSERT_TRUE(before.Answered());
  const std::vector<float> row1 = Row(before.rows[0], 0), row2 = Row(before.rows[0], 1);

  // Sent before the step's gradients: held (the optimize looks it up), then the updated rows.
  Answer fused, refused;
  job->server->HandlePrefetchBatch(Meta(0), {{"table", {2, 1}}}, true, fused.Done());
  job->server->HandlePrefetchBatch(Meta(1), {{"table", {1}}}, true, refused.Done());
  ASSERT_TRUE(refused.Answered());
  ASSERT_EQ(refused.rows.size(), 1u);
  EXPECT_EQ(refused.rows[0].status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(refused.rows[0].status().message().find("awaits the update of step 1"),
            std::string::npos)
      << refused.rows[0].status();
  EXPECT_FALSE(fused.Answered());
  // The held lookup is answered as soon as the tables are applied: before the send barrier,
  // which waits for the whole update (the dense blocks too).
  absl::Notification applied;
  bool fused_first = false;
  SendStep(*job, 0, 0, [&](absl::Status s) {
    EXPECT_TRUE(s.ok()) << s;
    fused_first = fused.Answered();
    applied.Notify();
  });
  fused.Wait();
  ASSERT_TRUE(applied.WaitForNotificationWithTimeout(absl::Seconds(20)));
  EXPECT_TRUE(fused_first);
  ASSERT_EQ(fused.rows.size(), 1u);
  EXPECT_EQ(Row(fused.rows[0], 0), row2);  // untouched
  EXPECT_EQ(Row(fused.rows[0], 1), (std::vector<float>{row1[0] - kLr * 1, row1[1] - kLr * 2}));

  // After the update (step 0 applied, its fetch barrier not yet reached): at once, the same.
  Answer late;
  job->server->HandlePrefetchBatch(Meta(0), {{"table", {2, 1}}, {"nope", {3}}}, true, late.Done());
  ASSERT_TRUE(late.Answered());
  ASSERT_EQ(late.rows.size(), 2u);
  EXPECT_EQ(Row(late.rows[0], 0), Row(fused.rows[0], 0));
  EXPECT_EQ(Row(late.rows[0], 1), Row(fused.rows[0], 1));
  EXPECT_EQ(late.rows[1].status().code(), absl::StatusCode::kInvalidArgument);
  // Of the 5 lookups, only the held one of step 0 was done by the optimize.
  EXPECT_EQ(job->server->stats().prefetches, 5);
  EXPECT_EQ(job->server->stats().fused_prefetches, 1);

  // Held for step 1, then the job fails: answered with the failure.
  job->server->HandleBarrier(Meta(0), FETCH_BARRIER, [](absl::Status s) { EXPECT_TRUE(s.ok()); });
  Answer failed;
  job->server->HandlePrefetchBatch(Meta(1), {{"table", {1}}}, true, failed.Done());
  EXPECT_FALSE(failed.Answered());
  job->server->Fail(absl::AbortedError("trainer 0 stopped"));
  failed.Wait();
  ASSERT_EQ(failed.rows.size(), 1u);
  EXPECT_EQ(failed.rows[0].status().code(), absl::StatusCode::kAborted);
}

// Waits (bounded) until the server looked `n` queries up ahead of their step's optimize.
bool AwaitLookupsAhead(ParameterServer& server, int64_t n) {
  const absl::Time deadline = absl::Now() + absl::Seconds(20);
  while (server.stats().lookups_ahead < n && absl::Now() < deadline) {
    absl::SleepFor(absl::Milliseconds(1));
  }
  return server.stats().lookups_ahead == n;
}

// A sync lookup sent before its step's gradients is looked up at once, while the trainers
// compute; the optimize then copies in the rows its update changes (duplicates too), so the
// answer equals a lookup after the update. Rows the update leaves alone are not looked up again.
TEST(ParameterServerTest, LookupsAheadOfTheOptimizeAnswerTheUpdatedRows) {
  std::unique_ptr<Job> job = MakeJob();
  Answer before;
  job->server->HandlePrefetchBatch(Meta(0), {{"table", {1, 2, 3}}}, false, before.Done());
  ASSERT_TRUE(before.Answered());
  const std::vector<float> row1 = Row(before.rows[0], 0), row2 = Row(before.rows[0], 1);

  Answer ahead;
  // 1 (updated) twice, 2 (left alone), 5 (a new row, made by the look-ahead).
  job->server->HandlePrefetchBatch(Meta(0), {{"table", {1, 2, 1, 5}}}, true, ahead.Done());
  ASSERT_TRUE(AwaitLookupsAhead(*job->server, 1));
  EXPECT_FALSE(ahead.Answered());
  SendStep(*job, 0);
  ahead.Wait();
  ASSERT_EQ(ahead.rows.size(), 1u);
  const std::vector<float> updated = {row1[0] - kLr * 1, row1[1] - kLr * 2};
  EXPECT_EQ(Row(ahead.rows[0], 0), updated);
  EXPECT_EQ(Row(ahead.rows[0], 1), row2);
  EXPECT_EQ(Row(ahead.rows[0], 2), updated);
  Answer after;
  job->server->HandlePrefetchBatch(Meta(0), {{"table", {1, 2, 1, 5}}}, true, after.Done());
  ASSERT_TRUE(after.Answered());
  for (int i = 0; i < 4; ++i) EXPECT_EQ(Row(ahead.rows[0], i), Row(after.rows[0], i)) << i;
  EXPECT_EQ(job->server->stats().fused_prefetches, 1);
  EXPECT_EQ(job->server->stats().lookups_ahead, 1);
}

// A look-ahead looks up into the tensor of its trainer's last answer once nothing else holds it
// (the reply was sent), never into one still held: the rows sent are never overwritten.
TEST(ParameterServerTest, ALookAheadReusesTheLastAnswersRowsOnceReleased) {
  std::unique_ptr<Job> job = MakeJob();
  auto step = [&](int64_t s, Answer* answer) {
    job->server->HandlePrefetchBatch(Meta(s), {{"table", {1, 2, 5}}}, true, answer->Done());
    ASSERT_TRUE(AwaitLookupsAhead(*job->server, s + 1));
    SendStep(*job, s);
    answer->Wait();
    job->server->HandleBarrier(Meta(s), FETCH_BARRIER,
                               [](absl::Status st) { EXPECT_TRUE(st.ok()); });
    Answer now;  // the rows after the update
    job->server->HandlePrefetchBatch(Meta(s), {{"table", {1, 2, 5}}}, false, now.Done());
    ASSERT_TRUE(now.Answered());
    ASSERT_EQ(answer->rows.size(), 1u);
    for (int i = 0; i < 3; ++i) EXPECT_EQ(Row(answer->rows[0], i), Row(now.rows[0], i)) << s;
  };
  Answer first, second, third;
  step(0, &first);
  const void* first_buffer = first.rows[0]->raw_data();
  const std::vector<float> first_row = Row(first.rows[0], 0);
  // `first` still holds its rows: the next answer has a buffer of its own.
  step(1, &second);
  EXPECT_NE(second.rows[0]->raw_data(), first_buffer);
  EXPECT_EQ(Row(first.rows[0], 0), first_row);
  EXPECT_NE(Row(second.rows[0], 0), first_row);  // row 1 was updated
  // Released: the next look-ahead looks up into it.
  const void* second_buffer = second.rows[0]->raw_data();
  second.rows.clear();
  step(2, &third);
  EXPECT_EQ(third.rows[0]->raw_data(), second_buffer);
}

// No look-ahead, the optimize looks the rows up after the update: with a row lifecycle option
// (a second lookup of an id would count twice), and for lookups riding on a send (they come
// with the gradients, when the optimize is near).
TEST(ParameterServerTest, NoLookupsAheadWithAdmissionOrRidingOnTheSend) {
  for (bool admission : {true, false}) {
    std::unique_ptr<Job> job = MakeJob(1, 0, [&](ParameterServerOptions& o) {
      if (admission) o.table_admission_threshold = 2;
    });
    RequestMeta meta = Meta(0);
    meta.barrier_follows = !admission;
    Answer looked_up;
    job->server->HandlePrefetchBatch(meta, {{"table", {1}}}, true, looked_up.Done());
    SendStep(*job, 0);
    looked_up.Wait();
    EXPECT_EQ(job->server->stats().fused_prefetches, 1) << admission;
    EXPECT_EQ(job->server->stats().lookups_ahead, 0) << admission;
  }
}

// The barrier that completes a sync step runs its optimize on the caller's thread (a gRPC thread
// in the daemon): the step is applied, and the barrier answered, when HandleBarrier returns.
TEST(ParameterServerTest, TheLastSendBarrierAppliesTheStepOnItsOwnThread) {
  std::unique_ptr<Job> job = MakeJob(/*trainers=*/2);
  const std::thread::id caller = std::this_thread::get_id();
  std::vector<std::thread::id> answered_on;
  absl::Mutex mu;
  auto done = [&](absl::Status s) {
    EXPECT_TRUE(s.ok()) << s;
    absl::MutexLock lock(&mu);
    answered_on.push_back(std::this_thread::get_id());
  };
  SendStep(*job, 0, 1.0f, done, /*trainer=*/0);
  {
    absl::MutexLock lock(&mu);
    EXPECT_TRUE(answered_on.empty());  // trainer 1's barrier is missing
  }
  SendStep(*job, 0, 1.0f, done, /*trainer=*/1);
  absl::MutexLock lock(&mu);
  ASSERT_EQ(answered_on.size(), 2u);
  EXPECT_EQ(answered_on[0], caller);
  EXPECT_EQ(answered_on[1], caller);
  EXPECT_GT(job->server->stats().grads_applied, 0);
}

// fc moved by -lr from `before` to `after` (its gradient was all ones), row 1 of the table by
// -lr * (1, 2) from `rows_before` to `rows`.
void ExpectOneStepApplied(const Variable& before, const Variable& after, const Tensor& rows_before,
                          const Tensor& rows) {
  ASSERT_EQ(after.Get<Tensor>().numel(), before.Get<Tensor>().numel());
  for (int64_t i = 0; i < after.Get<Tensor>().numel(); ++i) {
    EXPECT_EQ(after.Get<Tensor>().data<float>()[i], before.Get<Tensor>().data<float>()[i] - kLr);
  }
  ASSERT_EQ(rows.numel(), 2);
  EXPECT_EQ(rows.data<float>()[0], rows_before.data<float>()[0] - kLr * 1);
  EXPECT_EQ(rows.data<float>()[1], rows_before.data<float>()[1] - kLr * 2);
}

// An async step through a client (the in-process one, whose SendGetBatchAsync without the send
// barrier sends, then fetches): the parameter and the rows it fetches include its own push.
TEST(ParameterServerTest, AnAsyncPushWithItsFetchSeesThePushApplied) {
  std::unique_ptr<Job> job = MakeJob(1, 0, nullptr, /*sync=*/false);
  InProcClient client(kEndpoint, job->server.get());
  const std::string grad = job->dense_grads.at(0);
  const std::string fc = grad.substr(0, grad.find("@GRAD"));
  Variable before;
  ASSERT_TRUE(client.GetVariable(Meta(0), fc, &before).ok());
  std::vector<int64_t> ids = {1};
  Tensor rows_before, rows;
  ASSERT_TRUE(client.Prefetch(Meta(0), "table", ids, &rows_before).ok());
  Variable dense;
  Tensor* d = dense.GetMutable<Tensor>();
  d->Resize(FLOAT32, before.Get<Tensor>().shape());
  for (int64_t i = 0; i < d->numel(); ++i) d->data<float>()[i] = 1;
  Variable table;
  SelectedRows* sr = table.GetMutable<SelectedRows>();
  sr->height = 10;
  sr->rows = {1};
  sr->value.Resize(FLOAT32, {1, 2});
  sr->value.data<float>()[0] = 1;
  sr->value.data<float>()[1] = 2;
  Variable after;
  StatusGroup done(1);
  client.SendGetBatchAsync(Meta(0), {{grad, &dense}, {job->table_grad, &table}},
                           /*send_barrier=*/false, nullptr, {{fc, &after}}, false,
                           {{"table", &ids, &rows}}, done.Callback());
  ASSERT_TRUE(done.Wait().ok());
  ExpectOneStepApplied(before, after, rows_before, rows);
}

// The same through a client (the in-process one, whose batched calls compose single ones after
// AwaitUpdateAsync): a GetBatch and a PrefetchBatch sent before the step's gradients come back
// with the parameters and rows the step left.
TEST(ParameterServerTest, ClientGetsAndLookupsAfterTheUpdate) {
  std::unique_ptr<Job> job = MakeJob();
  InProcClient client(kEndpoint, job->server.get());
  const std::string fc = job->dense_grads.at(0).substr(0, job->dense_grads[0].find("@GRAD"));
  Variable before;
  ASSERT_TRUE(client.GetVariable(Meta(0), fc, &before).ok());
  std::vector<int64_t> ids = {1};
  Tensor rows_before, rows;
  ASSERT_TRUE(client.Prefetch(Meta(0), "table", ids, &rows_before).ok());

  Variable after;
  StatusGroup got(1), looked(1);
  client.GetBatchAsync(Meta(0), {{fc, &after}}, false, true, got.Callback());
  client.PrefetchBatchAsync(Meta(0), {{"table", &ids, &rows}}, true, looked.Callback());
  SendStep(*job, 0, /*dense=*/1.0f);
  ASSERT_TRUE(got.Wait().ok());
  ASSERT_TRUE(looked.Wait().ok());
  ExpectOneStepApplied(before, after, rows_before, rows);
  // A step ahead of the pserver's is refused through the client too.
  StatusGroup ahead(1);
  client.GetBatchAsync(Meta(1), {{fc, &after}}, false, true, ahead.Callback());
  EXPECT_EQ(ahead.Wait().code(), absl::StatusCode::kFailedPrecondition);
}

// Dense gradients sent ahead of the barrier (early sends): a block is applied once every
// trainer's copy of the step is in, before the barrier, after the step's learning-rate schedule;
// the step's optimize applies it (and runs the schedule) no second time; a checkpoint between
// the early apply and the barrier is refused; gradients that come with the barrier (also the
// entries of a client's SendBatch with the barrier) wait for it. A checkpoint waits for every
// early apply running, so the counts are read after one.
TEST(ParameterServerTest, EarlyGradientsApplyOnceEveryTrainersCopyIsIn) {
  // Two trainers; the learning rate halves every step: kLr at step 0, kLr / 2 at step 1.
  std::unique_ptr<Job> job = MakeJob(/*trainers=*/2, /*decay_steps=*/1);
  ASSERT_EQ(job->dense_grads.size(), 1u);
  const std::string fc = job->dense_grads[0].substr(0, job->dense_grads[0].find("@GRAD"));
  auto weights = [&] {
    const Tensor& t = job->scope.FindVar(fc)->Get<Tensor>();
    return std::vector<float>(t.data<float>(), t.data<float>() + t.numel());
  };
  auto early_applies = [&](int64_t want) {
    for (int i = 0; i < 2000 && job->server->stats().early_applies < want; ++i) {
      absl::SleepFor(absl::Milliseconds(10));
    }
    return job->server->stats().early_applies;
  };
  auto table_row = [&] {
    Answer a;
    job->server->HandlePrefetchBatch(Meta(0), {{"table", {1}}}, false, a.Done());
    EXPECT_TRUE(a.Answered());
    return Row(a.rows[0], 0);
  };
  auto finish_step = [&](int64_t step, bool dense_sent, float dense) {
    absl::Notification released[2];
    for (int k = 0; k < 2; ++k) {
      SendStep(
          *job, step, dense,
          [&released, k](absl::Status s) {
            EXPECT_TRUE(s.ok()) << s;
            released[k].Notify();
          },
          k, dense_sent);
    }
    for (auto& r : released) ASSERT_TRUE(r.WaitForNotificationWithTimeout(absl::Seconds(20)));
    for (int k = 0; k < 2; ++k) {
      job->server->HandleBarrier(Meta(step, k), FETCH_BARRIER,
                                 [](absl::Status s) { EXPECT_TRUE(s.ok()) << s; });
    }
  };
  auto checkpoint = [&](const std::string& name) {
    const std::string dir = ::testing::TempDir() + "/" + name;
    EXPECT_TRUE(io::PosixFileSystem::Default()->CreateDirs(dir).ok());
    return job->server->SaveCheckpoint(dir);
  };
  const std::vector<float> w0 = weights();
  const std::vector<float> row0 = table_row();

  // Step 0: trainer 0's copy alone applies nothing (an apply started now would make the
  // checkpoint refuse half a step); trainer 1's makes the block applied (the mean, at kLr) before
  // either barrier.
  SendDense(*job, Meta(0, 0), 1.0f);
  absl::Status none_yet = checkpoint("early_none_yet");
  EXPECT_TRUE(none_yet.ok()) << none_yet;
  EXPECT_EQ(job->server->stats().early_applies, 0);
  EXPECT_EQ(weights(), w0);
  SendDense(*job, Meta(0, 1), 3.0f);
  ASSERT_EQ(early_applies(1), 1);
  std::vector<float> w1 = weights();
  for (size_t i = 0; i < w0.size(); ++i) EXPECT_FLOAT_EQ(w1[i], w0[i] - kLr * 2.0f) << i;
  // Half a step applied: a checkpoint now is refused, naming why.
  absl::Status half = checkpoint("early_half");
  EXPECT_EQ(half.code(), absl::StatusCode::kFailedPrecondition) << half;
  EXPECT_NE(half.message().find("half a step"), std::string::npos) << half;
  // The barriers: the block is not applied again; the table takes its step at kLr too (the
  // schedule ran once for the step, at the early apply).
  finish_step(0, /*dense_sent=*/true, 0);
  EXPECT_EQ(weights(), w1);
  EXPECT_EQ(table_row(), (std::vector<float>{row0[0] - kLr * 1, row0[1] - kLr * 2}));
  ParameterServerStats st = job->server->stats();
  EXPECT_EQ(st.early_applies, 1);
  EXPECT_EQ(st.steps, 1);
  // Between steps a checkpoint is taken.
  absl::Status between = checkpoint("early_between");
  EXPECT_TRUE(between.ok()) << between;

  // Step 1: dense gradients that come with the barrier are applied by the step's optimize only,
  // at kLr / 2 (the schedule ran once more).
  const std::vector<float> row1 = table_row();
  finish_step(1, /*dense_sent=*/false, 2.0f);
  ASSERT_TRUE(checkpoint("early_step1").ok());
  EXPECT_EQ(job->server->stats().early_applies, 1);
  const std::vector<float> w2 = weights();
  for (size_t i = 0; i < w0.size(); ++i) EXPECT_FLOAT_EQ(w2[i], w1[i] - kLr / 2 * 2.0f) << i;
  EXPECT_EQ(table_row(), (std::vector<float>{row1[0] - kLr / 2 * 1, row1[1] - kLr / 2 * 2}));

  // Step 2 through a client whose SendBatch hands the pserver each entry alone (the in-process
  // one): the entries of a batch with the barrier wait for it; the step is applied once, at kLr
  // / 4.
  InProcClient client(kEndpoint, job->server.get());
  Variable grad;
  Tensor* g = grad.GetMutable<Tensor>();
  g->Resize(FLOAT32, job->scope.FindVar(fc)->Get<Tensor>().shape());
  for (int64_t i = 0; i < g->numel(); ++i) g->data<float>()[i] = 4.0f;
  StatusGroup sent(2);
  for (int k = 0; k < 2; ++k) {
    client.SendBatchAsync(Meta(2, k), {{job->dense_grads[0], &grad}}, /*send_barrier=*/true,
                          nullptr, sent.Callback());
  }
  ASSERT_TRUE(sent.Wait().ok());
  ASSERT_TRUE(checkpoint("early_step2").ok());
  EXPECT_EQ(job->server->stats().early_applies, 1);
  const std::vector<float> w3 = weights();
  for (size_t i = 0; i < w0.size(); ++i) EXPECT_FLOAT_EQ(w3[i], w2[i] - kLr / 4 * 4.0f) << i;
}

}  // namespace
}  // namespace tessera
