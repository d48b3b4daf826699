// All-reduce bandwidth of the Gloo backend between 2 processes on this machine, beside what
// plain loopback TCP sockets move in the same run.
//
//   bazel run //tests/bench:allreduce -- [--min_seconds=1] [--repeats=5] [--sizes=1048576,...]
//
// The program forks itself: the parent is rank 0, the child rank 1. First the raw TCP figures,
// over one connection between the two processes:
//   exchange: both processes send S bytes to each other at once (a sender thread and a
//             receiver thread each), which is what a 2-rank ring all-reduce does on the wire:
//             each rank sends S/2 in reduce-scatter and S/2 in all-gather, and receives the same;
//   one-way:  rank 0 streams S bytes to rank 1.
// Then collective::Context (rank 0 serves a TcpStore, Gloo on 127.0.0.1) all-reduces (sum) S
// bytes of float32 with each Gloo algorithm: "ring" with GlooOptions' default segment (4 MiB),
// "ring:1048576" with Gloo's own default (1 MiB), "halving_doubling", "bcube". Every figure is
// S / time in GB/s (10^9 bytes/s), the median of --repeats timed runs of at least
// --min_seconds each, the methods of one size taking turns run after run; for the all-reduce
// this is the usual "algorithm bandwidth" (bus bandwidth is the same for 2 ranks).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/collective/context.h"
#include "common/collective/tcp_store.h"

ABSL_FLAG(double, min_seconds, 1.0, "Minimum duration of one timed run.");
ABSL_FLAG(int, repeats, 5, "Timed runs per figure (the median is reported).");
ABSL_FLAG(std::string, sizes, "1048576,4194304,16777216", "All-reduce sizes in float32 elements.");
ABSL_FLAG(std::string, algorithms, "ring,ring:1048576,halving_doubling,bcube",
          "Gloo all-reduce algorithms to time: ring (ring:<segment bytes> for another segment "
          "size), halving_doubling, bcube.");
ABSL_FLAG(int64_t, ring_segment_bytes, 0,
          "Ring segment bytes for every algorithm spec without one (0: GlooOptions' default).");

namespace tessera {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

void Die(const std::string& what) {
  std::fprintf(stderr, "allreduce bench: %s\n", what.c_str());
  std::exit(1);
}

void SendAll(int fd, const void* data, size_t n) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::send(fd, p, n, MSG_NOSIGNAL);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) Die(absl::StrFormat("send failed: %s", std::strerror(errno)));
    p += w;
    n -= static_cast<size_t>(w);
  }
}

void RecvAll(int fd, void* data, size_t n) {
  char* p = static_cast<char*>(data);
  while (n > 0) {
    const ssize_t r = ::recv(fd, p, n, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) Die(absl::StrFormat("recv failed: %s", r == 0 ? "closed" : std::strerror(errno)));
    p += r;
    n -= static_cast<size_t>(r);
  }
}

template <typename T>
void SendValue(int fd, T v) {
  SendAll(fd, &v, sizeof(v));
}
template <typename T>
T RecvValue(int fd) {
  T v;
  RecvAll(fd, &v, sizeof(v));
  return v;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

// Both ranks send `bytes` to each other at once over the data socket.
void Exchange(int fd, std::vector<char>& out, std::vector<char>& in) {
  std::thread sender([&] { SendAll(fd, out.data(), out.size()); });
  RecvAll(fd, in.data(), in.size());
  sender.join();
}

// Rank 0 streams `bytes` to rank 1, which answers with one byte once it has them all.
void OneWay(int rank, int fd, std::vector<char>& buf) {
  if (rank == 0) {
    SendAll(fd, buf.data(), buf.size());
    RecvValue<char>(fd);
  } else {
    RecvAll(fd, buf.data(), buf.size());
    SendValue<char>(fd, 1);
  }
}

// One timed method: `step` moves `bytes` once (both ranks call it together).
struct Method {
  std::string name;
  std::function<void()> step;
  int64_t iters = 0;
  std::vector<double> rates;
};

// Rank 0 picks an iteration count for about --min_seconds from a warm-up and tells rank 1.
int64_t Calibrate(int rank, int control_fd, const std::function<void()>& step) {
  step();  // warm-up (connections, allocations)
  const Clock::time_point t0 = Clock::now();
  step();
  const double one = std::max(1e-6, Seconds(t0, Clock::now()));
  if (rank == 0) {
    const int64_t iters =
        std::max<int64_t>(2, static_cast<int64_t>(absl::GetFlag(FLAGS_min_seconds) / one));
    SendValue(control_fd, iters);
    return iters;
  }
  return RecvValue<int64_t>(control_fd);
}

// Parses "ring", "ring:4194304" (segment bytes), "halving_doubling", "bcube".
collective::InitParams GlooParams(const std::string& spec) {
  collective::InitParams params;
  params.gloo.hostname = "127.0.0.1";
  params.timeout = absl::Seconds(120);
  params.job_id = spec;
  std::vector<std::string> parts = absl::StrSplit(spec, ':');
  int64_t segment = absl::GetFlag(FLAGS_ring_segment_bytes);
  if (parts.size() == 2 && !absl::SimpleAtoi(parts[1], &segment)) Die("bad algorithm " + spec);
  if (segment > 0) params.gloo.ring_segment_bytes = static_cast<size_t>(segment);
  if (parts[0] == "ring") {
    params.gloo.all_reduce_algorithm = collective::GlooOptions::AllReduceAlgorithm::kRing;
  } else if (parts[0] == "halving_doubling") {
    params.gloo.all_reduce_algorithm =
        collective::GlooOptions::AllReduceAlgorithm::kHalvingDoubling;
  } else if (parts[0] == "bcube") {
    params.gloo.all_reduce_algorithm = collective::GlooOptions::AllReduceAlgorithm::kBcube;
  } else {
    Die("unknown algorithm " + spec);
  }
  return params;
}

int Run(int rank, int data_fd, int control_fd) {
  std::vector<size_t> sizes;
  for (absl::string_view s : absl::StrSplit(absl::GetFlag(FLAGS_sizes), ',')) {
    size_t n = 0;
    if (!absl::SimpleAtoi(s, &n) || n == 0) Die(absl::StrFormat("bad size '%s'", s));
    sizes.push_back(n);
  }
  const std::vector<std::string> algorithms = absl::StrSplit(absl::GetFlag(FLAGS_algorithms), ',');

  // One Gloo context per algorithm, all joined through a store rank 0 serves.
  std::unique_ptr<collective::TcpStoreServer> server;
  std::string endpoint;
  if (rank == 0) {
    auto started = collective::TcpStoreServer::Start("127.0.0.1:0");
    if (!started.ok()) Die(std::string(started.status().message()));
    server = std::move(*started);
    endpoint = server->endpoint();
    SendValue<int32_t>(control_fd, server->port());
  } else {
    endpoint = absl::StrFormat("127.0.0.1:%d", RecvValue<int32_t>(control_fd));
  }
  auto store = collective::TcpStore::Connect(endpoint, absl::Seconds(30));
  if (!store.ok()) Die(std::string(store.status().message()));
  std::shared_ptr<collective::Store> shared_store(std::move(*store));
  std::vector<std::unique_ptr<collective::Context>> contexts;
  for (const std::string& a : algorithms) {
    contexts.push_back(std::make_unique<collective::Context>());
    absl::Status s = contexts.back()->InitWithStore(shared_store, rank, 2, GlooParams(a));
    if (!s.ok()) Die(std::string(s.message()));
  }

  // Per size, the methods are timed in turn, run after run, so that load changes on the
  // machine hit them alike.
  std::vector<std::vector<Method>> results;
  for (size_t n : sizes) {
    const size_t bytes = n * sizeof(float);
    std::vector<char> out(bytes, static_cast<char>(rank)), in(bytes);
    std::vector<std::vector<float>> x(algorithms.size(), std::vector<float>(n, 1.0f));
    std::vector<Method> methods;
    methods.push_back({"raw TCP exchange", [&] { Exchange(data_fd, out, in); }});
    methods.push_back({"raw TCP one-way", [&] { OneWay(rank, data_fd, out); }});
    for (size_t a = 0; a < algorithms.size(); ++a) {
      collective::Communicator* comm = contexts[a]->world();
      std::vector<float>* buf = &x[a];
      methods.push_back({"gloo " + algorithms[a], [comm, buf] {
                           absl::Status st =
                               comm->AllReduce(absl::MakeSpan(*buf), collective::ReduceOp::kSum);
                           if (!st.ok()) Die(std::string(st.message()));
                         }});
    }
    for (Method& m : methods) m.iters = Calibrate(rank, control_fd, m.step);
    for (int rep = 0; rep < absl::GetFlag(FLAGS_repeats); ++rep) {
      for (Method& m : methods) {
        const Clock::time_point t0 = Clock::now();
        for (int64_t i = 0; i < m.iters; ++i) m.step();
        m.rates.push_back(static_cast<double>(bytes) * m.iters / Seconds(t0, Clock::now()) / 1e9);
      }
    }
    for (size_t a = 0; a < algorithms.size(); ++a) {
      if (!(x[a][0] >= 2.0f)) Die("all-reduce result is wrong");
    }
    results.push_back(std::move(methods));
  }
  for (auto& ctx : contexts) {
    absl::Status s = ctx->Shutdown();
    if (!s.ok()) Die(std::string(s.message()));
  }

  if (rank == 0) {
    std::printf(
        "2 processes, loopback, float32 sum; GB/s = bytes / time, median of %d runs "
        "(min-max)\n\n",
        absl::GetFlag(FLAGS_repeats));
    std::string header = "| floats | MB |";
    std::string rule = "| ---: | ---: |";
    for (const Method& m : results[0]) {
      header += " " + m.name + " |";
      rule += " ---: |";
    }
    std::printf("%s\n%s\n", header.c_str(), rule.c_str());
    for (size_t i = 0; i < sizes.size(); ++i) {
      std::string row = absl::StrFormat("| %d | %.1f |", sizes[i], sizes[i] * 4 / 1e6);
      for (const Method& m : results[i]) {
        row += absl::StrFormat(" %.2f (%.2f-%.2f) |", Median(m.rates),
                               *std::min_element(m.rates.begin(), m.rates.end()),
                               *std::max_element(m.rates.begin(), m.rates.end()));
      }
      std::printf("%s\n", row.c_str());
    }
  }
  return 0;
}

int Main() {
  // Two loopback connections (data and control), set up before fork: the listener exists
  // before the child connects.
  const int listener = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof(addr);
  if (::bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
      ::listen(listener, 4) != 0 ||
      ::getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len) != 0) {
    Die("cannot listen on loopback");
  }
  std::fflush(stdout);
  const pid_t child = ::fork();
  if (child < 0) Die("fork failed");
  const int rank = child == 0 ? 1 : 0;
  int data_fd = -1, control_fd = -1;
  if (rank == 1) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    ::close(listener);
    for (int* fd : {&data_fd, &control_fd}) {
      *fd = ::socket(AF_INET, SOCK_STREAM, 0);
      if (::connect(*fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
        Die("cannot connect to rank 0");
      }
    }
  } else {
    data_fd = ::accept(listener, nullptr, nullptr);
    control_fd = ::accept(listener, nullptr, nullptr);
    ::close(listener);
  }
  int one = 1;
  ::setsockopt(control_fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  const int rc = Run(rank, data_fd, control_fd);
  if (rank == 1) _exit(rc);
  int status = 0;
  ::waitpid(child, &status, 0);
  return rc != 0 ? rc : (WIFEXITED(status) ? WEXITSTATUS(status) : 1);
}

}  // namespace
}  // namespace tessera

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return tessera::Main();
}
