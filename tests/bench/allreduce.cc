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
//
// --backend=nccl (a --config=cuda build only; the CPU build refuses it):
//
//   bazel run --config=cuda //tests/bench:allreduce -- --backend=nccl [--ranks=1] [--sizes=...]
//
// times the NCCL backend instead, with no fork: --ranks ranks are threads of this process, rank
// r on GPU r (0: one rank per GPU), joined through an in-memory store by collective::Context.
// Each rank all-reduces (sum, out of place) S bytes of float32 between two buffers in its GPU's
// memory with the blocking Communicator::AllReduce a trainer's collective ops use (it waits for
// the GPU each time). Figures as above (rank 0's clock): algorithm bandwidth S / time, and bus
// bandwidth = algorithm bandwidth * 2 (N - 1) / N, what each GPU's links carry in a ring of N
// (0 for one rank, whose all-reduce is a copy within its GPU).
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
#include "common/collective/store.h"
#include "common/collective/tcp_store.h"

#ifdef TESSERA_WITH_NCCL
#include <cuda_runtime.h>
#endif

ABSL_FLAG(double, min_seconds, 1.0, "Minimum duration of one timed run.");
ABSL_FLAG(int, repeats, 5, "Timed runs per figure (the median is reported).");
ABSL_FLAG(std::string, sizes, "1048576,4194304,16777216", "All-reduce sizes in float32 elements.");
ABSL_FLAG(std::string, algorithms, "ring,ring:1048576,halving_doubling,bcube",
          "Gloo all-reduce algorithms to time: ring (ring:<segment bytes> for another segment "
          "size), halving_doubling, bcube.");
ABSL_FLAG(int64_t, ring_segment_bytes, 0,
          "Ring segment bytes for every algorithm spec without one (0: GlooOptions' default).");
ABSL_FLAG(std::string, backend, "gloo",
          "gloo: 2 processes over loopback TCP; nccl (--config=cuda builds): GPUs, --ranks "
          "threads of this process.");
ABSL_FLAG(int, ranks, 1, "nccl: ranks (threads of this process, rank r on GPU r); 0: one per GPU.");

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

// --sizes, in float32 elements.
std::vector<size_t> ParseSizes() {
  std::vector<size_t> sizes;
  for (absl::string_view s : absl::StrSplit(absl::GetFlag(FLAGS_sizes), ',')) {
    size_t n = 0;
    if (!absl::SimpleAtoi(s, &n) || n == 0) Die(absl::StrFormat("bad size '%s'", s));
    sizes.push_back(n);
  }
  return sizes;
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
  const std::vector<size_t> sizes = ParseSizes();
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

#ifdef TESSERA_WITH_NCCL
void CheckCuda(cudaError_t e, const std::string& what) {
  if (e != cudaSuccess) Die(absl::StrFormat("%s: %s", what, cudaGetErrorString(e)));
}

// One rank of the NCCL run (a thread): joins, then times every size; rank 0 fills `rates`
// (per size, --repeats algorithm bandwidths in GB/s).
void NcclRank(int rank, int world, const std::vector<size_t>& sizes,
              std::shared_ptr<collective::Store> store, std::vector<std::vector<double>>* rates) {
  collective::InitParams params;
  params.backend = collective::BackendType::kNccl;
  params.timeout = absl::Seconds(120);
  params.local_rank = 0;  // every rank on this machine: the GPU is device_id, not the local rank
  params.device_id = rank;
  collective::Context ctx;
  absl::Status s = ctx.InitWithStore(store, rank, world, params);
  if (!s.ok()) Die(std::string(s.message()));
  collective::Communicator* comm = ctx.world();
  CheckCuda(cudaSetDevice(rank), "cudaSetDevice");
  auto all_reduce = [&](const float* send, float* recv, size_t n) {
    absl::Status st = comm->AllReduce(send, recv, n, collective::ElementType::kFloat32,
                                      collective::ReduceOp::kSum);
    if (!st.ok()) Die(std::string(st.message()));
  };
  for (size_t n : sizes) {
    const size_t bytes = n * sizeof(float);
    float* send = nullptr;
    float* recv = nullptr;
    CheckCuda(cudaMalloc(&send, bytes), "cudaMalloc");
    CheckCuda(cudaMalloc(&recv, bytes), "cudaMalloc");
    const std::vector<float> ones(n, 1.0f);
    CheckCuda(cudaMemcpy(send, ones.data(), bytes, cudaMemcpyHostToDevice), "cudaMemcpy");
    // Warm-up, then rank 0's iteration count for about --min_seconds, the same on every rank.
    all_reduce(send, recv, n);
    const Clock::time_point t0 = Clock::now();
    all_reduce(send, recv, n);
    const double one = std::max(1e-6, Seconds(t0, Clock::now()));
    int64_t iters =
        std::max<int64_t>(2, static_cast<int64_t>(absl::GetFlag(FLAGS_min_seconds) / one));
    s = comm->Broadcast(absl::MakeSpan(&iters, 1), 0);
    if (!s.ok()) Die(std::string(s.message()));
    std::vector<double> r;
    for (int rep = 0; rep < absl::GetFlag(FLAGS_repeats); ++rep) {
      const Clock::time_point start = Clock::now();
      for (int64_t i = 0; i < iters; ++i) all_reduce(send, recv, n);
      r.push_back(static_cast<double>(bytes) * iters / Seconds(start, Clock::now()) / 1e9);
    }
    float first = 0, last = 0;
    CheckCuda(cudaMemcpy(&first, recv, sizeof(float), cudaMemcpyDeviceToHost), "cudaMemcpy");
    CheckCuda(cudaMemcpy(&last, recv + n - 1, sizeof(float), cudaMemcpyDeviceToHost), "cudaMemcpy");
    if (first != static_cast<float>(world) || last != static_cast<float>(world)) {
      Die(absl::StrFormat("nccl all-reduce result is wrong: %g and %g, want %d", first, last,
                          world));
    }
    CheckCuda(cudaFree(send), "cudaFree");
    CheckCuda(cudaFree(recv), "cudaFree");
    if (rank == 0) rates->push_back(std::move(r));
  }
  s = ctx.Shutdown();
  if (!s.ok()) Die(std::string(s.message()));
}

int NcclMain() {
  int gpus = 0;
  if (cudaGetDeviceCount(&gpus) != cudaSuccess || gpus == 0) {
    Die("--backend=nccl: no CUDA device (cudaGetDeviceCount reports none)");
  }
  const int world = absl::GetFlag(FLAGS_ranks) == 0 ? gpus : absl::GetFlag(FLAGS_ranks);
  if (world < 1 || world > gpus) {
    Die(absl::StrFormat("--ranks=%d: need 1 to %d (one rank per GPU; 0 for all)",
                        absl::GetFlag(FLAGS_ranks), gpus));
  }
  const std::vector<size_t> sizes = ParseSizes();
  auto store = std::make_shared<collective::HashStore>();
  std::vector<std::vector<double>> rates;
  std::vector<std::thread> threads;
  for (int r = 1; r < world; ++r) {
    threads.emplace_back([&, r] { NcclRank(r, world, sizes, store, nullptr); });
  }
  NcclRank(0, world, sizes, store, &rates);
  for (auto& t : threads) t.join();

  cudaDeviceProp prop;
  CheckCuda(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
  std::printf(
      "NCCL, %d rank(s) as threads of one process (rank r on GPU r; GPU 0: %s), float32 sum out "
      "of place, blocking AllReduce; GB/s = bytes / time, median of %d runs (min-max)\n\n",
      world, prop.name, absl::GetFlag(FLAGS_repeats));
  std::printf("| floats | MB | algorithm GB/s | bus GB/s |\n| ---: | ---: | ---: | ---: |\n");
  const double bus = 2.0 * (world - 1) / world;
  for (size_t i = 0; i < sizes.size(); ++i) {
    const std::vector<double>& r = rates[i];
    const double lo = *std::min_element(r.begin(), r.end());
    const double hi = *std::max_element(r.begin(), r.end());
    std::printf("%s\n", absl::StrFormat("| %d | %.1f | %.2f (%.2f-%.2f) | %.2f |", sizes[i],
                                        sizes[i] * 4 / 1e6, Median(r), lo, hi, Median(r) * bus)
                            .c_str());
  }
  return 0;
}
#endif  // TESSERA_WITH_NCCL

int Main() {
  const std::string backend = absl::GetFlag(FLAGS_backend);
  if (backend == "nccl") {
#ifdef TESSERA_WITH_NCCL
    return NcclMain();
#else
    Die("--backend=nccl: this build has no NCCL; run it with bazel run --config=cuda "
        "//tests/bench:allreduce -- --backend=nccl");
#endif
  }
  if (backend != "gloo") Die("--backend='" + backend + "' must be gloo or nccl");
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
