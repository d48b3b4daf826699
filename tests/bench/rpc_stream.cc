// A sync step's exchange with one pserver over gRPC, as a unary call per step (what
// SendGetBatch is) against one message each way on a bidi stream that lives for the whole job:
// the client sends a request of R bytes and waits for the reply of P bytes, round after round,
// against a server in a child process (this binary with --serve). Both sides use gRPC's callback
// API as the daemons do (the client waits for each reply on a condition, as a trainer's step
// does), and the server copies nothing: it answers each request with a preallocated reply.
//
//   bazel build //tests/bench:rpc_stream
//   bazel-bin/tests/bench/rpc_stream [--sizes=1024:1024,16384:16384,98304:65536]
//       [--seconds=2] [--repeats=3] [--clients=1]
//
// Per size (R:P) and transport: round trips per second, and CPU microseconds per round trip of
// the client process and of the server process (user + system, all threads, from /proc). The
// transports alternate repeat by repeat so that load on the machine falls on both; medians of
// --repeats. --clients runs that many client threads at once, each with its own channel (as
// trainers do), which is how a pserver sees a step of several trainers.
//
// gRPC's completion-queue API instead of its callback API, unary calls only: --cq_server serves
// them from one thread polling a completion queue; --cq_client makes each call on a completion
// queue that the calling thread polls, or (--cq_poller) that a poller thread polls, which
// signals the caller as a callback would.
// Results and command lines: tests/bench/RESULTS.md.
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "common/base/malloc_tuning.h"
#include "grpcpp/generic/async_generic_service.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "tests/bench/child_process.h"
#include "tests/bench/stats.h"

ABSL_FLAG(std::string, sizes, "1024:1024,16384:16384,98304:65536",
          "Request:reply sizes in bytes to measure, comma-separated (the CTR job's 2x2 step is "
          "about 90 KB to each pserver and 65 KB back).");
ABSL_FLAG(double, seconds, 2.0, "Duration of one timed run.");
ABSL_FLAG(int, repeats, 3, "Timed runs per size and transport (the median is reported).");
ABSL_FLAG(int, clients, 1, "Client threads, each with its own channel, running at once.");
ABSL_FLAG(bool, serve, false, "Internal: run as the server child (its port on stdout).");
ABSL_FLAG(bool, cq_server, false,
          "Serve on gRPC's completion-queue API, one polling thread, instead of the callback API "
          "(unary only: the stream rows are left out).");
ABSL_FLAG(bool, cq_client, false,
          "Make the unary calls on a completion queue the calling thread polls, instead of the "
          "callback API.");
ABSL_FLAG(bool, cq_poller, false,
          "With --cq_client: a poller thread polls the completion queue and signals the caller.");

namespace tessera {
namespace {

using Clock = std::chrono::steady_clock;

[[noreturn]] void Die(const std::string& message) { bench::Die("rpc_stream", message); }

constexpr char kUnary[] = "/bench.Exchange/Unary";
// A call's (a stream's: one run's) deadline, so that a hung server fails the run.
constexpr std::chrono::seconds kCallDeadline(120);
constexpr char kStream[] = "/bench.Exchange/Stream";

// A message of `bytes` bytes whose first 4 hold `reply_bytes` (the size the server answers).
grpc::ByteBuffer Message(size_t bytes, uint32_t reply_bytes) {
  std::string data(std::max<size_t>(bytes, 4), 'x');
  std::memcpy(&data[0], &reply_bytes, 4);
  grpc::Slice slice(data);
  return grpc::ByteBuffer(&slice, 1);
}

uint32_t ReplyBytesOf(const grpc::ByteBuffer& request) {
  std::vector<grpc::Slice> slices;
  uint32_t n = 0;
  if (!request.Dump(&slices).ok()) return 0;
  char head[4];
  size_t got = 0;
  for (const grpc::Slice& s : slices) {
    const size_t take = std::min(s.size(), sizeof(head) - got);
    std::memcpy(head + got, s.begin(), take);
    got += take;
    if (got == sizeof(head)) break;
  }
  if (got == sizeof(head)) std::memcpy(&n, head, 4);
  return n;
}

// ---------------------------------------------------------------------------------------------
// Server (child process): every method is served by a bidi reactor; Unary answers one request
// and finishes, Stream answers each request on the same stream until the client closes it.

class Replies {
 public:
  // A reply of `bytes` bytes, built once per size and shared (gRPC slices are reference counted).
  grpc::ByteBuffer Get(uint32_t bytes) {
    absl::MutexLock lock(&mu_);
    for (const auto& [size, buffer] : cache_) {
      if (size == bytes) return buffer;
    }
    cache_.emplace_back(bytes, Message(bytes, 0));
    return cache_.back().second;
  }

 private:
  absl::Mutex mu_;
  std::vector<std::pair<uint32_t, grpc::ByteBuffer>> cache_ ABSL_GUARDED_BY(mu_);
};

class ExchangeReactor : public grpc::ServerGenericBidiReactor {
 public:
  ExchangeReactor(Replies* replies, bool stream) : replies_(replies), stream_(stream) {
    StartRead(&request_);
  }
  void OnReadDone(bool ok) override {
    if (!ok) return Finish(grpc::Status::OK);  // the client closed its side
    reply_ = replies_->Get(ReplyBytesOf(request_));
    request_.Clear();
    if (stream_) {
      StartWrite(&reply_);
    } else {
      StartWriteAndFinish(&reply_, grpc::WriteOptions(), grpc::Status::OK);
    }
  }
  void OnWriteDone(bool ok) override {
    if (!ok) return Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "write failed"));
    StartRead(&request_);
  }
  void OnDone() override { delete this; }

 private:
  Replies* replies_;
  const bool stream_;
  grpc::ByteBuffer request_, reply_;
};

class ExchangeService : public grpc::CallbackGenericService {
 public:
  grpc::ServerGenericBidiReactor* CreateReactor(grpc::GenericCallbackServerContext* ctx) override {
    return new ExchangeReactor(&replies_, ctx->method() == kStream);
  }

 private:
  Replies replies_;
};

// --cq_server: one unary call on the completion-queue API: requested, its request read, answered
// with the prebuilt reply, deleted. Its own tag (one operation is outstanding at a time); one
// thread polls the queue.
class CqCall {
 public:
  CqCall(grpc::AsyncGenericService* service, grpc::ServerCompletionQueue* cq, Replies* replies)
      : service_(service), cq_(cq), replies_(replies), stream_(&ctx_) {
    service_->RequestCall(&ctx_, &stream_, cq_, cq_, this);
  }
  // The completion of its one outstanding operation; false: the call is done (delete it).
  bool Proceed(bool ok) {
    if (!ok || state_ == State::kAnswering) return false;
    if (state_ == State::kRequested) {
      new CqCall(service_, cq_, replies_);  // the next call
      state_ = State::kReading;
      stream_.Read(&request_, this);
    } else {
      reply_ = replies_->Get(ReplyBytesOf(request_));
      state_ = State::kAnswering;
      stream_.WriteAndFinish(reply_, grpc::WriteOptions(), grpc::Status::OK, this);
    }
    return true;
  }

 private:
  enum class State { kRequested, kReading, kAnswering };
  grpc::AsyncGenericService* service_;
  grpc::ServerCompletionQueue* cq_;
  Replies* replies_;
  grpc::GenericServerContext ctx_;
  grpc::GenericServerAsyncReaderWriter stream_;
  grpc::ByteBuffer request_, reply_;
  State state_ = State::kRequested;
};

int Serve() {
  const bool cq_api = absl::GetFlag(FLAGS_cq_server);
  ExchangeService callback_service;
  grpc::AsyncGenericService cq_service;
  Replies replies;
  grpc::ServerBuilder builder;
  int port = 0;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  std::unique_ptr<grpc::ServerCompletionQueue> cq;
  if (cq_api) {
    builder.RegisterAsyncGenericService(&cq_service);
    cq = builder.AddCompletionQueue();
  } else {
    builder.RegisterCallbackGenericService(&callback_service);
  }
  builder.SetMaxReceiveMessageSize(64 << 20);
  builder.SetMaxSendMessageSize(64 << 20);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0) Die("the server child cannot listen on 127.0.0.1");
  std::thread poller;
  if (cq_api) {
    new CqCall(&cq_service, cq.get(), &replies);  // each call that comes requests the next
    poller = std::thread([&] {
      void* tag;
      bool ok;
      while (cq->Next(&tag, &ok)) {
        auto* call = static_cast<CqCall*>(tag);
        if (!call->Proceed(ok)) delete call;
      }
    });
  }
  std::printf("%d\n", port);
  std::fflush(stdout);
  char c;
  while (read(0, &c, 1) > 0) {
  }  // until the parent closes our stdin
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  if (cq_api) {
    cq->Shutdown();
    poller.join();
  }
  return 0;
}

// ---------------------------------------------------------------------------------------------
// Client.

// Waits for one callback at a time.
class Signal {
 public:
  void Notify(bool ok) {
    absl::MutexLock lock(&mu_);
    ok_ = ok;
    done_ = true;
  }
  bool Wait() {
    absl::MutexLock lock(&mu_);
    mu_.Await(absl::Condition(&done_));
    done_ = false;
    return ok_;
  }

 private:
  absl::Mutex mu_;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  bool ok_ ABSL_GUARDED_BY(mu_) = false;
};

std::shared_ptr<grpc::Channel> NewChannel(int port) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(64 << 20);
  args.SetMaxSendMessageSize(64 << 20);
  // Each client its own connection, as each trainer has.
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  return grpc::CreateCustomChannel(absl::StrCat("127.0.0.1:", port),
                                   grpc::InsecureChannelCredentials(), args);
}

// A unary call's client side: its context (with the call's deadline), reply and status.
struct UnaryCall {
  UnaryCall() { ctx.set_deadline(std::chrono::system_clock::now() + kCallDeadline); }
  grpc::ClientContext ctx;
  grpc::ByteBuffer reply;
  grpc::Status status;
};

// Unary calls on a completion queue (--cq_client), one after another, until `until`: polled by
// this thread, or (`poller`) by a poller thread that signals it; returns the round trips.
int64_t RunUnaryOnQueue(grpc::GenericStub* stub, const grpc::ByteBuffer& request,
                        Clock::time_point until, bool poller) {
  grpc::CompletionQueue cq;
  Signal signal;
  std::thread polling;
  if (poller) {
    polling = std::thread([&] {
      void* tag;
      bool ok;
      while (cq.Next(&tag, &ok)) static_cast<Signal*>(tag)->Notify(ok);
    });
  }
  int64_t rounds = 0;
  while (Clock::now() < until) {
    UnaryCall u;
    auto call = stub->PrepareUnaryCall(&u.ctx, kUnary, request, &cq);
    call->StartCall();
    call->Finish(&u.reply, &u.status, &signal);
    bool ok = false;
    if (poller) {
      ok = signal.Wait();
    } else {
      void* tag;
      if (!cq.Next(&tag, &ok)) ok = false;
    }
    if (!ok || !u.status.ok()) {
      Die("unary call on a completion queue failed: " + u.status.error_message());
    }
    ++rounds;
  }
  cq.Shutdown();
  if (poller) {
    polling.join();
  } else {
    void* tag;
    bool ok;
    while (cq.Next(&tag, &ok)) {
    }
  }
  return rounds;
}

// Unary calls, one after another, until `until`; returns the round trips.
int64_t RunUnary(grpc::GenericStub* stub, const grpc::ByteBuffer& request,
                 Clock::time_point until) {
  if (absl::GetFlag(FLAGS_cq_client)) {
    return RunUnaryOnQueue(stub, request, until, absl::GetFlag(FLAGS_cq_poller));
  }
  Signal signal;
  int64_t rounds = 0;
  while (Clock::now() < until) {
    UnaryCall u;
    stub->UnaryCall(&u.ctx, kUnary, grpc::StubOptions(), &request, &u.reply, [&](grpc::Status s) {
      u.status = std::move(s);
      signal.Notify(true);
    });
    signal.Wait();
    if (!u.status.ok()) Die("unary call failed: " + u.status.error_message());
    ++rounds;
  }
  return rounds;
}

// One bidi stream: write a request, read its reply, until `until`; returns the round trips.
class StreamClient : public grpc::ClientBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  StreamClient(grpc::GenericStub* stub, const grpc::ByteBuffer& request) : request_(request) {
    // The whole run's stream: a hung server ends it (and the run) with an error.
    ctx_.set_deadline(std::chrono::system_clock::now() + kCallDeadline);
    stub->PrepareBidiStreamingCall(&ctx_, kStream, grpc::StubOptions(), this);
    StartCall();
  }
  int64_t Run(Clock::time_point until) {
    int64_t rounds = 0;
    while (Clock::now() < until) {
      StartWrite(&request_);
      if (!step_.Wait()) Die("stream write failed");
      StartRead(&reply_);
      if (!step_.Wait()) Die("stream read failed");
      reply_.Clear();
      ++rounds;
    }
    StartWritesDone();
    done_.Wait();
    if (!status_.ok()) Die("stream failed: " + status_.error_message());
    return rounds;
  }
  void OnWriteDone(bool ok) override { step_.Notify(ok); }
  void OnReadDone(bool ok) override { step_.Notify(ok); }
  void OnDone(const grpc::Status& s) override {
    status_ = s;
    done_.Notify(true);
  }

 private:
  grpc::ClientContext ctx_;
  const grpc::ByteBuffer& request_;
  grpc::ByteBuffer reply_;
  Signal step_, done_;
  grpc::Status status_;
};

struct Result {
  double rounds_per_second = 0;
  double client_us = 0, server_us = 0;  // CPU per round trip
};

Result Measure(bool stream, const std::vector<std::unique_ptr<grpc::GenericStub>>& stubs,
               const grpc::ByteBuffer& request, pid_t server, double seconds) {
  const bench::Usage c0 = bench::UsageOf(0), s0 = bench::UsageOf(server);
  const Clock::time_point start = Clock::now();
  const Clock::time_point until =
      start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
  std::vector<int64_t> rounds(stubs.size(), 0);
  std::vector<std::thread> threads;
  for (size_t i = 0; i < stubs.size(); ++i) {
    threads.emplace_back([&, i] {
      if (stream) {
        StreamClient client(stubs[i].get(), request);
        rounds[i] = client.Run(until);
      } else {
        rounds[i] = RunUnary(stubs[i].get(), request, until);
      }
    });
  }
  for (auto& t : threads) t.join();
  const double wall = std::chrono::duration<double>(Clock::now() - start).count();
  const bench::Usage c1 = bench::UsageOf(0), s1 = bench::UsageOf(server);
  int64_t total = 0;
  for (int64_t r : rounds) total += r;
  Result res;
  if (total == 0) return res;
  res.rounds_per_second = total / wall;
  res.client_us = 1e6 * (c1.cpu_seconds - c0.cpu_seconds) / total;
  res.server_us = 1e6 * (s1.cpu_seconds - s0.cpu_seconds) / total;
  return res;
}

using bench::Median;

int Main() {
  std::vector<std::pair<uint32_t, uint32_t>> sizes;
  for (absl::string_view s : absl::StrSplit(absl::GetFlag(FLAGS_sizes), ',')) {
    std::vector<absl::string_view> rp = absl::StrSplit(s, ':');
    uint32_t r = 0, p = 0;
    if (rp.size() != 2 || !absl::SimpleAtoi(rp[0], &r) || !absl::SimpleAtoi(rp[1], &p) || r < 4 ||
        r > (32u << 20) || p > (32u << 20)) {
      Die(absl::StrCat("bad --sizes entry '", s, "': want REQUEST:REPLY bytes, 4 B to 32 MiB"));
    }
    sizes.push_back({r, p});
  }
  const int repeats = absl::GetFlag(FLAGS_repeats);
  const int clients = absl::GetFlag(FLAGS_clients);
  const double seconds = absl::GetFlag(FLAGS_seconds);
  if (clients < 1 || clients > 64 || repeats < 1 || !(seconds > 0) || seconds > 100) {
    Die(absl::StrCat("need --clients in [1, 64] (got ", clients, "), --repeats >= 1 (got ", repeats,
                     ") and --seconds in (0, 100] (got ", seconds, ")"));
  }
  // The server first: no gRPC state may exist in this process when it forks.
  bench::Child server =
      bench::StartChild("rpc_stream", absl::GetFlag(FLAGS_cq_server)
                                          ? std::vector<std::string>{"--serve", "--cq_server"}
                                          : std::vector<std::string>{"--serve"});
  int port = 0;
  if (!absl::SimpleAtoi(server.line, &port) || port <= 0) {
    Die("bad port line from the server child: " + server.line);
  }
  std::vector<std::unique_ptr<grpc::GenericStub>> stubs;
  for (int i = 0; i < clients; ++i) {
    stubs.push_back(std::make_unique<grpc::GenericStub>(NewChannel(port)));
  }
  std::printf(
      "rpc_stream: %d client thread(s), 1 server process, loopback; %d run(s) of %.1f s per size "
      "and transport, alternated; medians\n",
      clients, repeats, seconds);
  std::printf(
      "| request B | reply B | transport | round trips/s | client CPU us/rt | server CPU "
      "us/rt | CPU us/rt both | vs unary |\n");
  std::printf("| ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: |\n");
  for (const auto& [req, rep] : sizes) {
    const grpc::ByteBuffer request = Message(req, rep);
    // Warm-up: connections up, buffers and the server's reply built.
    Measure(false, stubs, request, server.pid, 0.2);
    const int transports = absl::GetFlag(FLAGS_cq_server) ? 1 : 2;
    if (transports == 2) Measure(true, stubs, request, server.pid, 0.2);
    std::vector<double> rps[2], cl[2], sv[2], both[2];
    for (int r = 0; r < repeats; ++r) {
      for (int t = 0; t < transports; ++t) {
        const Result res = Measure(t == 1, stubs, request, server.pid, seconds);
        rps[t].push_back(res.rounds_per_second);
        cl[t].push_back(res.client_us);
        sv[t].push_back(res.server_us);
        both[t].push_back(res.client_us + res.server_us);
      }
    }
    const double unary_both = Median(both[0]);
    for (int t = 0; t < transports; ++t) {
      std::printf("| %u | %u | %s | %.0f | %.1f | %.1f | %.1f | %.2f |\n", req, rep,
                  t == 0 ? "unary" : "stream", Median(rps[t]), Median(cl[t]), Median(sv[t]),
                  Median(both[t]), Median(both[t]) / unary_both);
    }
  }
  stubs.clear();
  bench::StopChild(&server);
  return 0;
}

}  // namespace
}  // namespace tessera

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  signal(SIGPIPE, SIG_IGN);
  tessera::TuneMallocForLargeBuffers();  // what the daemons do (common/base/malloc_tuning.h)
  if (absl::GetFlag(FLAGS_serve)) return tessera::Serve();
  return tessera::Main();
}
