// Bad input against a real pserver: a ParameterServer (async, so a gradient it accepts is applied
// at once) behind a GrpcServer, sent hand-made malformed messages through a raw gRPC stub (what a
// buggy or hostile peer could send, bypassing the client's encoder). Every one is refused with
// INVALID_ARGUMENT and a one-line message, and every parameter and counter is byte-for-byte what
// it was; a good gradient sent afterwards is applied (so the comparison can fail). Message size
// limits hold on both sides. Program files and data files with a bad line name file:line.
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "common/data/criteo.h"
#include "common/framework/executor.h"
#include "common/layers/layers.h"
#include "common/layers/optimizer.h"
#include "common/ops/ops.h"
#include "common/framework/program_io.h"
#include "common/rpc/grpc/codec.h"
#include "common/rpc/grpc/grpc_client.h"
#include "common/rpc/grpc/grpc_server.h"
#include "grpcpp/create_channel.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/security/credentials.h"
#include "gtest/gtest.h"
#include "pserver/parameter_server.h"
#include "tests/cluster_util.h"
#include "transpiler/distribute_transpiler.h"

namespace tessera {
namespace {

constexpr int64_t kServerMaxBytes = 4096;  // the pserver's message limit in this test
const std::vector<std::string> kParams = {"fc.w", "fc.b", "emb", "big.w"};

class BadInputTest : public ::testing::Test {
 protected:
  void SetUp() override {
    registry_ = NewStandardOpRegistry();
    ProgramDesc main, startup;
    ProgramBuilder b(&main, &startup);
    std::string x = layers::Data(b, "x", {-1, 4});
    std::string x2 = layers::Data(b, "x2", {-1, 512});
    std::string ids = layers::Data(b, "ids", {-1, 1}, INT64);
    std::string label = layers::Data(b, "label", {-1, 1});
    layers::FcOptions fc;
    fc.name = "fc";
    layers::FcOptions big;
    big.name = "big";  // 512 x 3 floats: a 6 KiB gradient, over kServerMaxBytes
    big.bias = false;
    layers::EmbeddingOptions e;
    e.name = "emb";
    e.is_sparse = true;  // a local table: its gradient travels as SelectedRows
    std::string h = layers::ElementwiseAdd(b, layers::Fc(b, x, 3, fc), layers::Fc(b, x2, 3, big));
    h = layers::ElementwiseAdd(b, h, layers::Embedding(b, ids, 50, 3, e));
    std::string pred = layers::Fc(b, h, 1);
    std::string loss = layers::Mean(b, layers::SquareError(b, pred, label));
    OptimizerOptions oo;
    oo.learning_rate = 0.5f;
    ASSERT_TRUE(SGD(oo).Minimize(b, *registry_, loss).ok());

    auto eps = FreeEndpoints(1);
    ASSERT_TRUE(eps.ok()) << eps.status();
    endpoint_ = (*eps)[0];
    TranspilerConfig cfg;
    cfg.pservers = {endpoint_};
    cfg.trainers = 2;
    cfg.sync_mode = false;
    auto t = DistributeTranspiler::Transpile(main, startup, cfg);
    ASSERT_TRUE(t.ok()) << t.status();
    pserver_program_ = *t->GetPserverProgram(endpoint_);
    pserver_startup_ = *t->GetPserverStartupProgram(endpoint_);
    Executor exec(registry_.get());
    ASSERT_TRUE(exec.Run(pserver_startup_, 0, &scope_).ok());
    ParameterServerOptions po;
    po.job_id = "job";
    po.endpoint = endpoint_;
    auto ps =
        ParameterServer::Create(*t->GetPserverProgram(endpoint_), &scope_, registry_.get(), po);
    ASSERT_TRUE(ps.ok()) << ps.status();
    ps_ = std::move(*ps);
    GrpcServerOptions so;
    so.address = endpoint_;
    so.max_message_bytes = kServerMaxBytes;
    server_ = std::make_unique<GrpcServer>(so, ps_.get());
    ASSERT_TRUE(server_->Start().ok());
    channel_ = grpc::CreateChannel(endpoint_, grpc::InsecureChannelCredentials());
    stub_ = std::make_unique<grpc::GenericStub>(channel_);
    GrpcClientOptions co;
    co.deadline = absl::Seconds(20);
    client_ = std::make_unique<GrpcPServerClient>(endpoint_, co);
  }
  void TearDown() override {
    if (server_ != nullptr) server_->Shutdown();
  }

  // One unary call of `method` with `bytes` as the request, bypassing every encoder.
  grpc::Status Raw(const std::string& method, const std::string& bytes) {
    grpc::Slice slice(bytes);
    grpc::ByteBuffer request(&slice, 1), response;
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
    absl::Notification done;
    grpc::Status result;
    stub_->UnaryCall(&ctx, "/tessera.PServer/" + method, grpc::StubOptions(), &request, &response,
                     [&](grpc::Status s) {
                       result = s;
                       done.Notify();
                     });
    done.WaitForNotification();
    return result;
  }

  // Every parameter's bytes as the pserver stores them (read between requests), and the small
  // ones as a GetVariable returns them.
  std::map<std::string, std::string> Snapshot() {
    std::map<std::string, std::string> out;
    for (const auto& name : kParams) {
      const Variable* v = scope_.FindVar(name);
      EXPECT_TRUE(v != nullptr && v->Is<Tensor>()) << name;
      if (v == nullptr || !v->Is<Tensor>()) continue;
      const Tensor& t = v->Get<Tensor>();
      out[name] = absl::StrCat(ShapeString(t.shape()), ":",
                               std::string(static_cast<const char*>(t.raw_data()), t.nbytes()));
      if (name == "big.w") continue;  // over the pserver's send limit
      Variable got;
      absl::Status s = client_->GetVariable(meta_, name, &got);
      EXPECT_TRUE(s.ok()) << s;
      if (!s.ok()) continue;
      const Tensor& g = got.Get<Tensor>();
      EXPECT_EQ(std::string(static_cast<const char*>(g.raw_data()), g.nbytes()),
                std::string(static_cast<const char*>(t.raw_data()), t.nbytes()))
          << name;
    }
    return out;
  }

  // A well-formed gradient message for parameter `param` of `rows` x `cols` floats.
  VariableMessage Grad(const std::string& param, int64_t rows, int64_t cols) {
    VariableMessage m;
    *m.mutable_header() = ToHeader(meta_);
    m.set_name(param + "@GRAD");
    m.set_type(DENSE_TENSOR);
    m.set_dtype(FLOAT32);
    m.add_dims(rows);
    if (cols > 0) m.add_dims(cols);
    std::vector<float> g(static_cast<size_t>(rows * std::max<int64_t>(cols, 1)), 0.25f);
    m.set_payload(std::string(reinterpret_cast<const char*>(g.data()), g.size() * sizeof(float)));
    return m;
  }

  // Sends `bytes` and expects INVALID_ARGUMENT with a one-line message containing `needle`.
  void ExpectRefused(const std::string& what, const std::string& bytes, const std::string& needle) {
    grpc::Status s = Raw("SendVariable", bytes);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT)
        << what << ": " << s.error_code() << " " << s.error_message();
    EXPECT_NE(s.error_message().find(needle), std::string::npos)
        << what << ": '" << s.error_message() << "' lacks '" << needle << "'";
    EXPECT_EQ(s.error_message().find('\n'), std::string::npos) << what << ": " << s.error_message();
  }

  // An async pserver of this job (2 trainers) with `options`, its own scope, no transport: what
  // the watchdog makes of the requests the test hands it. The status it fails with, or a
  // timeout after 10 s.
  absl::Status RunWatchdog(ParameterServerOptions options,
                           const std::function<void(ParameterServer*)>& requests) {
    options.job_id = "job";
    options.endpoint = "watched";
    Scope scope;
    Executor exec(registry_.get());
    EXPECT_TRUE(exec.Run(pserver_startup_, 0, &scope).ok());
    auto ps = ParameterServer::Create(pserver_program_, &scope, registry_.get(), options);
    EXPECT_TRUE(ps.ok()) << ps.status();
    if (!ps.ok()) return ps.status();
    absl::Status failed;
    absl::Notification done;
    std::thread waiter([&] {
      failed = (*ps)->Wait();
      done.Notify();
    });
    requests(ps->get());
    if (!done.WaitForNotificationWithTimeout(absl::Seconds(10))) {
      (*ps)->HandleAbort(meta_, "the test gave up waiting", [](absl::Status) {});
    }
    waiter.join();
    return failed;
  }

  std::unique_ptr<OpRegistry> registry_;
  ProgramDesc pserver_program_, pserver_startup_;
  Scope scope_;
  std::unique_ptr<ParameterServer> ps_;
  std::unique_ptr<GrpcServer> server_;
  std::string endpoint_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<grpc::GenericStub> stub_;
  std::unique_ptr<GrpcPServerClient> client_;
  RequestMeta meta_{"job", 0, 0};
};

TEST_F(BadInputTest, MalformedGradientsAreRefusedAndChangeNothing) {
  const auto before = Snapshot();
  ASSERT_EQ(before.size(), kParams.size());
  const ParameterServerStats stats_before = ps_->stats();
  const std::string good = Grad("fc.w", 4, 3).SerializeAsString();

  VariableMessage m = Grad("fc.w", 4, 3);
  m.set_payload(m.payload().substr(0, 44));
  ExpectRefused("payload shorter than the shape", m.SerializeAsString(), "44 payload bytes");
  m = Grad("fc.w", 4, 3);
  m.set_payload(m.payload() + "abcd");
  ExpectRefused("payload longer than the shape", m.SerializeAsString(), "52 payload bytes");
  m = Grad("fc.w", 3, 4);
  ExpectRefused("wrong shape", m.SerializeAsString(), "expected [4, 3]");
  m = Grad("fc.w", 4, 3);
  m.set_dtype(FLOAT64);
  m.set_payload(m.payload() + m.payload());
  ExpectRefused("wrong dtype", m.SerializeAsString(), "expected float32");
  m = Grad("fc.w", 4, 3);
  m.set_dtype(static_cast<DataType>(9));
  ExpectRefused("unknown dtype", m.SerializeAsString(), "unknown dtype 9");
  m = Grad("fc.w", 4, 3);
  m.set_name("nope@GRAD");
  ExpectRefused("unknown variable", m.SerializeAsString(), "no gradient variable 'nope@GRAD'");
  m = Grad("fc.w", 4, 3);
  m.set_name("fc.w@GRAD\nFAKE LOG LINE");
  ExpectRefused("name with a newline", m.SerializeAsString(), "control character");
  m = Grad("fc.w", 4, 3);
  m.set_dims(0, -4);
  ExpectRefused("negative dim", m.SerializeAsString(), "negative dim -4");
  m = Grad("fc.w", 4, 3);
  m.set_type(static_cast<VarType>(2));
  ExpectRefused("unsupported type", m.SerializeAsString(), "unsupported type");

  // Chunks: an offset past the end, a negative one, a declared size that is not the shape's.
  m = Grad("fc.w", 4, 3);
  m.set_total_bytes(48);
  m.set_chunk_offset(48);
  m.set_payload(std::string(4, '\0'));
  ExpectRefused("chunk past the end", m.SerializeAsString(), "does not fit its 48 bytes");
  m.set_chunk_offset(-8);
  ExpectRefused("negative chunk offset", m.SerializeAsString(), "does not fit");
  m.set_chunk_offset(0);
  m.set_total_bytes(96);
  ExpectRefused("total_bytes not the shape's", m.SerializeAsString(), "declares 96 bytes");

  // Sparse gradient of the local table: row ids that do not match the rows of the value.
  m = Grad("emb", 2, 3);
  m.set_type(SELECTED_ROWS);
  m.set_height(50);
  std::vector<int64_t> ids = {1, 2, 3};
  m.set_rows_data(std::string(reinterpret_cast<const char*>(ids.data()), 24));
  ExpectRefused("3 row ids for 2 rows", m.SerializeAsString(), "24 bytes of row ids for 2 rows");
  m.set_rows_data(m.rows_data().substr(0, 13));
  ExpectRefused("row ids not a multiple of 8", m.SerializeAsString(), "13 bytes of row ids");
  m = Grad("emb", 2, 3);
  ExpectRefused("dense gradient for a sparse table", m.SerializeAsString(), "must be sparse");
  m = Grad("emb", 2, 3);
  m.set_type(SELECTED_ROWS);
  m.set_height(50);
  ids = {3, 50};  // the table has rows [0, 50)
  m.set_rows_data(std::string(reinterpret_cast<const char*>(ids.data()), 16));
  ExpectRefused("row id past the table", m.SerializeAsString(), "row 50");
  ids = {-1, 3};
  m.set_rows_data(std::string(reinterpret_cast<const char*>(ids.data()), 16));
  ExpectRefused("negative row id", m.SerializeAsString(), "row -1");

  // Raw bytes: truncated inside the payload, a byte-field length that is negative as an int64
  // (a 10-byte varint), trailing bytes that are not a field.
  ExpectRefused("truncated", good.substr(0, good.size() - 5), "truncated");
  std::string negative = Grad("fc.w", 4, 3).SerializeAsString();
  negative = negative.substr(0, negative.rfind('\x7a'));  // drop the payload field (tag 15)
  negative += std::string("\x7a\xfc\xff\xff\xff\xff\xff\xff\xff\xff\x01", 11);
  ExpectRefused("negative byte-field length", negative, "bad byte-field length");
  ExpectRefused("trailing garbage", good + "\xff", "malformed variable message");

  EXPECT_EQ(Snapshot(), before);
  const ParameterServerStats stats_after = ps_->stats();
  EXPECT_EQ(stats_after.grads_applied, stats_before.grads_applied);
  EXPECT_EQ(stats_after.grads_received, stats_before.grads_received);

  // The server is unharmed: good dense and sparse gradients are applied (only fc.w and rows 0
  // and 49 of emb move).
  ASSERT_TRUE(Raw("SendVariable", good).ok());
  m = Grad("emb", 2, 3);
  m.set_type(SELECTED_ROWS);
  m.set_height(50);
  ids = {0, 49};
  m.set_rows_data(std::string(reinterpret_cast<const char*>(ids.data()), 16));
  grpc::Status sparse = Raw("SendVariable", m.SerializeAsString());
  ASSERT_TRUE(sparse.ok()) << sparse.error_message();
  for (int i = 0; i < 100 && ps_->stats().grads_applied < stats_before.grads_applied + 2; ++i) {
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_EQ(ps_->stats().grads_applied, stats_before.grads_applied + 2);
  auto after = Snapshot();
  for (const char* moved : {"fc.w", "emb"}) {
    EXPECT_NE(after[moved], before.at(moved)) << moved;
    after[moved] = before.at(moved);
  }
  EXPECT_EQ(after, before);
}

TEST_F(BadInputTest, MalformedSmallRequestsAreRefused) {
  const auto before = Snapshot();
  PrefetchRequest prefetch;
  *prefetch.mutable_header() = ToHeader(meta_);
  prefetch.set_table("emb");
  prefetch.set_ids(std::string(12, '\0'));
  grpc::Status s = Raw("Prefetch", prefetch.SerializeAsString());
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_NE(s.error_message().find("12 bytes, not a multiple of 8"), std::string::npos)
      << s.error_message();

  GetRequest get;
  *get.mutable_header() = ToHeader(meta_);
  get.set_name("fc.w");
  get.set_offset(-4);
  s = Raw("GetVariable", get.SerializeAsString());
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  get.set_offset(40);
  get.set_length(16);
  s = Raw("GetVariable", get.SerializeAsString());
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_NE(s.error_message().find("outside variable fc.w of 48 bytes"), std::string::npos)
      << s.error_message();

  s = Raw("Barrier", std::string("\x12\xff", 2));  // a length running past the end
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  BarrierRequest barrier;
  *barrier.mutable_header() = ToHeader(RequestMeta{"job", 7, 0});
  s = Raw("Barrier", barrier.SerializeAsString());
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_NE(s.error_message().find("trainer_id 7"), std::string::npos) << s.error_message();

  // Strings the server would echo (names, the job id, a checkpoint dir) are refused when they
  // carry a control character: the error stays one line and shows the value escaped.
  auto expect_escaped = [&](const std::string& method, const std::string& bytes,
                            const std::string& needle) {
    grpc::Status st = Raw(method, bytes);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << method;
    EXPECT_NE(st.error_message().find(needle), std::string::npos) << st.error_message();
    EXPECT_EQ(st.error_message().find('\n'), std::string::npos) << st.error_message();
  };
  get.set_name("fc.w\nforged line");
  get.set_offset(0);
  get.set_length(0);
  expect_escaped("GetVariable", get.SerializeAsString(), "variable name \"fc.w\\nforged line\"");
  prefetch.set_table("emb\r");
  prefetch.set_ids(std::string(8, '\0'));
  expect_escaped("Prefetch", prefetch.SerializeAsString(), "table name \"emb\\r\"");
  *barrier.mutable_header() = ToHeader(RequestMeta{"job\nx", 0, 0});
  expect_escaped("Barrier", barrier.SerializeAsString(), "job id \"job\\nx\"");
  CheckpointRequest checkpoint;
  *checkpoint.mutable_header() = ToHeader(meta_);
  checkpoint.set_dir("/tmp/x\n");
  expect_escaped("Checkpoint", checkpoint.SerializeAsString(), "checkpoint dir");
  EXPECT_EQ(Snapshot(), before);
}

// A trainer's ABORT passes its error on: the pserver fails the job naming the trainer and the
// cause. A reason that could forge log lines is refused and fails nothing.
// Heartbeats say that a trainer is alive, not that it works: an async trainer that beats but sends
// nothing else for --barrier_timeout_s is still silent (hung main thread); one whose heartbeats
// stop and that sends nothing is lost after heartbeat_timeout, long before barrier_timeout.
TEST_F(BadInputTest, HeartbeatsTellAliveFromWorking) {
  ParameterServerOptions hung;
  hung.barrier_timeout = absl::Milliseconds(500);
  hung.heartbeat_timeout = absl::Seconds(5);
  absl::Status s = RunWatchdog(hung, [&](ParameterServer* ps) {
    EXPECT_TRUE(ps->Admit(meta_).ok());
    // Heartbeats from trainer 0 until the pserver fails the job (they then get the failure).
    const absl::Time until = absl::Now() + absl::Seconds(3);
    while (absl::Now() < until && ps->AdmitHeartbeat(meta_).ok()) {
      absl::SleepFor(absl::Milliseconds(50));
    }
  });
  EXPECT_NE(s.message().find("sent nothing for 500ms"), std::string::npos) << s;
  EXPECT_EQ(s.message().find("heartbeat"), std::string::npos) << s;

  ParameterServerOptions lost;
  lost.barrier_timeout = absl::Seconds(60);
  lost.heartbeat_timeout = absl::Milliseconds(300);
  s = RunWatchdog(lost, [&](ParameterServer* ps) {
    EXPECT_TRUE(ps->Admit(meta_).ok());
    EXPECT_TRUE(ps->AdmitHeartbeat(meta_).ok());  // then nothing
  });
  EXPECT_NE(s.message().find("trainers [0] sent no heartbeat for 300ms"), std::string::npos)
      << s;
}

TEST_F(BadInputTest, AnAbortPassesItsReasonOn) {
  BarrierRequest forged;
  *forged.mutable_header() = ToHeader(meta_);
  forged.set_kind(ABORT);
  forged.set_reason("x\npserver 0: all is well");
  grpc::Status s = Raw("Barrier", forged.SerializeAsString());
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << s.error_message();
  EXPECT_NE(s.error_message().find("abort reason"), std::string::npos) << s.error_message();
  Variable w;
  ASSERT_TRUE(client_->GetVariable(meta_, "fc.w", &w).ok()) << "the refused abort failed the job";

  ASSERT_TRUE(client_->Abort(meta_, "pserver 10.0.0.9:6170 SendBatch: connection refused").ok());
  absl::Status failed = ps_->Wait();
  EXPECT_EQ(failed.code(), absl::StatusCode::kAborted) << failed;
  EXPECT_NE(failed.message().find(absl::StrCat("trainer ", meta_.trainer_id,
                                               " stopped with an error, so pserver ", endpoint_,
                                               " stops the job: pserver 10.0.0.9:6170 SendBatch: "
                                               "connection refused")),
            std::string::npos)
      << failed;
  EXPECT_EQ(client_->GetVariable(meta_, "fc.w", &w).code(), absl::StatusCode::kAborted);
}

TEST_F(BadInputTest, MessageSizeLimitsAreEnforcedOnBothSides) {
  const auto before = Snapshot();
  // A 6 KiB gradient to a server that takes at most 4 KiB.
  Variable big;
  big.GetMutable<Tensor>()->Resize(FLOAT32, {512, 3});
  for (int64_t i = 0; i < 512 * 3; ++i) big.GetMutable<Tensor>()->data<float>()[i] = 1;
  absl::Status s = client_->SendVariable(meta_, "big.w@GRAD", big);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_NE(s.message().find(endpoint_), std::string::npos) << s;
  EXPECT_NE(s.message().find("6"), std::string::npos) << s;  // names the size
  EXPECT_EQ(s.message().find('\n'), std::string::npos) << s;
  EXPECT_EQ(Snapshot(), before);

  // A client that takes at most 256 bytes refuses the 600-byte table instead of reading it.
  GrpcClientOptions small;
  small.deadline = absl::Seconds(20);
  small.max_message_bytes = 256;
  GrpcPServerClient client(endpoint_, small);
  Variable out;
  s = client.GetVariable(meta_, "emb", &out);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_NE(s.message().find(endpoint_), std::string::npos) << s;
  // ... while one within its limit reads fine.
  s = client.GetVariable(meta_, "fc.w", &out);
  EXPECT_TRUE(s.ok()) << s;
}

TEST(BadFileTest, ProgramAndDataFilesNameTheFileAndLine) {
  const std::string dir = MakeTempDir("bad_files");
  const std::string program = dir + "/model.pbtxt";
  std::ofstream(program)
      << "blocks {\n  parent_idx: -1\n  ops { type: \"mul\" inputs { x: 1 } }\n}\n";
  auto p = ReadProgramFile(program);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(p.status().message().rfind(program + ":3:", 0), 0u) << p.status();
  EXPECT_EQ(p.status().message().find('\n'), std::string::npos) << p.status();

  // An escaped newline in an op type would make every error that names the op two lines.
  std::ofstream(program, std::ios::trunc) << "blocks {\n  ops { type: \"mul\\nX\" }\n}\n";
  p = ReadProgramFile(program);
  ASSERT_FALSE(p.ok());
  EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(p.status().message(),
            program + ": block 0 op #0: type \"mul\\nX\" contains a control character");

  const std::string criteo = dir + "/train.txt";
  std::ofstream(criteo) << "1\t5\tff\n\n0\t7\tzz\n";
  auto d = data::ReadCriteoFile(criteo, 1, 1);
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(d.status().message().rfind(criteo + ":3: field 3 (C1)", 0), 0u) << d.status();
}

}  // namespace
}  // namespace tessera
