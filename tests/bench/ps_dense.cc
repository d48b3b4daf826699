// Dense push + pull bandwidth of the pserver RPC path against raw loopback TCP, measured in the
// same run on the same machine.
//
//   bazel build //tests/bench:ps_dense
//   bazel-bin/tests/bench/ps_dense [--total_mb=64] [--pservers=2] [--vars=2]
//                                  [--chunk_mb=1,4,16] [--repeats=7] [--notune_malloc]
//
// Setup: one trainer (this process) and --pservers servers, each a child process (this binary
// with --serve) holding a gRPC server (GrpcServer + a minimal RequestHandler that stores every
// received variable into a tensor preallocated on first use and serves it back without a copy)
// and a raw TCP listener. The parameter set is --total_mb MiB of float32 in --vars tensors,
// placed round robin on the servers.
//
// One round of each transport moves the whole set to the servers and back:
//   raw TCP: one connection per server, all servers in parallel; the trainer writes the
//     server's share in 1 MiB write()s, the server reads it into its buffer, then writes it
//     back in 1 MiB write()s and the trainer reads it into a second buffer.
//   gRPC: GrpcPServerClient (one per server; chunk_bytes = each --chunk_mb) sends every tensor
//     (SendVariableAsync, all at once) and, once all sends are done, fetches every tensor
//     (GetVariableAsync into a preallocated destination, so gets are chunked as well).
// Bandwidth = bytes pushed + bytes pulled over the round's wall time (MB = 10^6 bytes). The
// transports alternate round by round (after a warm-up round each) so that load changes on the
// machine affect both; medians of --repeats rounds. The pulled data is checked against what was
// pushed. CPU seconds of the trainer and the servers per GB moved and minor page faults per MB
// are reported as well. --tune_malloc (the default) makes every process keep freed memory (see
// main()); --notune_malloc measures glibc's defaults, which is what the daemons run with unless
// they tune malloc themselves. Results and the command lines: tests/bench/RESULTS.md.
#include <arpa/inet.h>
#include <fcntl.h>
#include <malloc.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "common/base/malloc_tuning.h"
#include "common/rpc/client.h"
#include "common/rpc/grpc/grpc_client.h"
#include "common/rpc/grpc/grpc_server.h"
#include "common/rpc/server.h"
#include "tests/bench/child_process.h"
#include "tests/bench/stats.h"

ABSL_FLAG(int64_t, total_mb, 64, "MiB of parameters (float32), pushed and pulled each round.");
ABSL_FLAG(int, pservers, 2, "Number of server processes.");
ABSL_FLAG(int, vars, 2, "Number of parameter tensors (placed round robin on the servers).");
ABSL_FLAG(std::string, chunk_mb, "1,4,16", "GrpcPServerClient chunk sizes to measure (MiB).");
ABSL_FLAG(int, repeats, 7, "Timed rounds per transport (the median is reported).");
ABSL_FLAG(int64_t, tcp_write_kb, 1024, "Size of each write() of the raw TCP baseline (KiB).");
ABSL_FLAG(bool, tune_malloc, true,
          "Keep freed memory in the process (mallopt: one arena, trim threshold 1 GiB, mmap "
          "threshold 32 MiB, top pad 64 MiB) in the trainer and the servers; false: glibc's "
          "defaults.");
ABSL_FLAG(bool, skip_tcp, false, "Measure gRPC only (e.g. under a profiler); no ratio.");
ABSL_FLAG(bool, serve, false, "Internal: run as a server child (ports on stdout).");

namespace tessera {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

[[noreturn]] void Die(const std::string& message) { bench::Die("ps_dense", message); }

// ---------------------------------------------------------------------------------------------
// Server side (child process).

// Stores each received dense variable in a tensor allocated when its first chunk arrives;
// serves it back sharing the buffer. Thread-safe.
class StoreHandler : public RequestHandler {
 public:
  absl::Status Admit(const RequestMeta&) override { return absl::OkStatus(); }
  absl::StatusOr<Variable*> PrepareReceive(const RequestMeta&, const VariableHeader& h) override {
    if (h.type != DENSE_TENSOR) return absl::InvalidArgumentError("dense only: " + h.name);
    absl::MutexLock lock(&mu_);
    std::unique_ptr<Variable>& v = vars_[h.name];
    if (v == nullptr) v = std::make_unique<Variable>();
    Tensor* t = v->GetMutable<Tensor>();
    if (!t->initialized() || t->shape() != h.dims || t->dtype() != h.dtype) {
      t->Resize(h.dtype, h.dims);
    }
    return v.get();
  }
  void HandleSend(const RequestMeta&, const VariableHeader&, Variable*,
                  DoneCallback done) override {
    done(absl::OkStatus());
  }
  void HandleGet(const RequestMeta&, const std::string& name, GetDone done) override {
    Variable copy;
    {
      absl::MutexLock lock(&mu_);
      auto it = vars_.find(name);
      if (it == vars_.end()) return done(absl::NotFoundError("no variable " + name));
      copy = *it->second;  // shares the buffer
    }
    done(std::move(copy));
  }
  void HandlePrefetch(const RequestMeta&, const std::string& table, std::vector<int64_t>,
                      PrefetchDone done) override {
    done(absl::UnimplementedError("no tables"));
  }
  void HandleBarrier(const RequestMeta&, BarrierKind, DoneCallback done) override {
    done(absl::OkStatus());
  }
  void HandleCheckpoint(const RequestMeta&, const std::string&, DoneCallback done) override {
    done(absl::UnimplementedError("no checkpoints"));
  }
  void HandleRegister(const RequestMeta&, const JobFields&, uint64_t, DoneCallback done) override {
    done(absl::UnimplementedError("no job handshake"));
  }

 private:
  absl::Mutex mu_;
  std::map<std::string, std::unique_ptr<Variable>> vars_ ABSL_GUARDED_BY(mu_);
};

bool ReadFull(int fd, void* buf, size_t n) {
  char* p = static_cast<char*>(buf);
  while (n > 0) {
    ssize_t r = read(fd, p, n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    p += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

// Writes n bytes in writes of at most `piece` bytes.
bool WriteFull(int fd, const void* buf, size_t n, size_t piece) {
  const char* p = static_cast<const char*>(buf);
  while (n > 0) {
    ssize_t w = write(fd, p, std::min(n, piece));
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) return false;
    p += w;
    n -= static_cast<size_t>(w);
  }
  return true;
}

void SetNoDelay(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

// Raw TCP baseline, per connection: repeatedly a header {push bytes, write size}, the pushed
// bytes (read into a buffer), then the same bytes written back in writes of that size.
void ServeTcpConnection(int fd) {
  SetNoDelay(fd);
  std::vector<char> buffer;
  int64_t header[2];
  while (ReadFull(fd, header, sizeof(header))) {
    const size_t n = static_cast<size_t>(header[0]);
    if (buffer.size() < n) buffer.resize(n);
    if (!ReadFull(fd, buffer.data(), n)) break;
    if (!WriteFull(fd, buffer.data(), n, static_cast<size_t>(header[1]))) break;
  }
  close(fd);
}

int ListenTcp(int* port) {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) Die(absl::StrCat("socket: ", std::strerror(errno)));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || listen(fd, 16) != 0) {
    Die(absl::StrCat("bind/listen on 127.0.0.1: ", std::strerror(errno)));
  }
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  *port = ntohs(addr.sin_port);
  return fd;
}

// Child: serves gRPC and raw TCP on free loopback ports, prints "<grpc port> <tcp port>", and
// exits when its stdin closes (the parent exited or is done).
int Serve() {
  StoreHandler handler;
  GrpcServerOptions so;
  so.address = "127.0.0.1:0";
  so.shutdown_grace = absl::Seconds(1);
  GrpcServer server(so, &handler);
  absl::Status s = server.Start();
  if (!s.ok()) Die(std::string(s.message()));
  int tcp_port = 0;
  int listen_fd = ListenTcp(&tcp_port);
  std::thread acceptor([listen_fd] {
    while (true) {
      int fd = accept(listen_fd, nullptr, nullptr);
      if (fd < 0) return;
      std::thread(ServeTcpConnection, fd).detach();
    }
  });
  std::printf("%d %d\n", server.port(), tcp_port);
  std::fflush(stdout);
  char c;
  while (read(0, &c, 1) > 0) {
  }
  shutdown(listen_fd, SHUT_RDWR);
  close(listen_fd);
  acceptor.join();
  server.Shutdown();
  server.Wait();
  std::_Exit(0);  // detached TCP threads may still hold sockets
}

// ---------------------------------------------------------------------------------------------
// Trainer side.

struct Child {
  bench::Child process;
  int grpc_port = 0, tcp_port = 0;
};

// Starts this binary with --serve; waits (up to 30 s) for its ports.
Child StartChild() {
  Child c;
  c.process = bench::StartChild(
      "ps_dense",
      {"--serve", absl::GetFlag(FLAGS_tune_malloc) ? "--tune_malloc" : "--notune_malloc"});
  if (std::sscanf(c.process.line.c_str(), "%d %d", &c.grpc_port, &c.tcp_port) != 2) {
    Die("bad port line from a server child: " + c.process.line);
  }
  return c;
}

using bench::Usage;
using bench::UsageOf;

struct Round {
  double seconds = 0;
  double push_seconds = 0;
  double trainer_cpu = 0, server_cpu = 0;
  double faults = 0;  // minor page faults, trainer + servers
};

struct Setup {
  std::vector<Child> children;
  std::vector<Variable> params;  // pushed
  std::vector<Variable> pulled;  // pull destinations
  std::vector<int> server_of;    // param -> server
  int64_t bytes_per_round = 0;   // pushed + pulled
};

// Trainer and servers' usage so far.
struct AllUsage {
  Usage trainer, servers;
};
AllUsage Sample(const Setup& s) {
  AllUsage a;
  a.trainer = UsageOf(0);
  for (const auto& c : s.children) {
    Usage u = UsageOf(c.process.pid);
    a.servers.cpu_seconds += u.cpu_seconds;
    a.servers.minor_faults += u.minor_faults;
  }
  return a;
}

void Account(const AllUsage& before, const Setup& s, Round* r) {
  const AllUsage after = Sample(s);
  r->trainer_cpu = after.trainer.cpu_seconds - before.trainer.cpu_seconds;
  r->server_cpu = after.servers.cpu_seconds - before.servers.cpu_seconds;
  r->faults = after.trainer.minor_faults - before.trainer.minor_faults +
              after.servers.minor_faults - before.servers.minor_faults;
}

// One raw TCP round over the already connected sockets.
Round TcpRound(const Setup& s, const std::vector<int>& fds, std::vector<std::vector<char>>* back,
               size_t write_bytes) {
  // Each server's share: its parameters' bytes, sent back to back.
  const int num_servers = static_cast<int>(fds.size());
  Round r;
  const AllUsage before = Sample(s);
  std::vector<double> push_done(num_servers);
  const Clock::time_point start = Clock::now();
  std::vector<std::thread> threads;
  for (int k = 0; k < num_servers; ++k) {
    threads.emplace_back([&, k] {
      int64_t total = 0;
      for (size_t i = 0; i < s.params.size(); ++i) {
        if (s.server_of[i] == k) total += s.params[i].Get<Tensor>().nbytes();
      }
      int64_t header[2] = {total, static_cast<int64_t>(write_bytes)};
      if (!WriteFull(fds[k], header, sizeof(header), sizeof(header))) Die("tcp write failed");
      for (size_t i = 0; i < s.params.size(); ++i) {
        if (s.server_of[i] != k) continue;
        const Tensor& t = s.params[i].Get<Tensor>();
        if (!WriteFull(fds[k], t.raw_data(), t.nbytes(), write_bytes)) Die("tcp write failed");
      }
      push_done[k] = Seconds(start, Clock::now());
      (*back)[k].resize(static_cast<size_t>(total));
      if (!ReadFull(fds[k], (*back)[k].data(), (*back)[k].size())) Die("tcp read failed");
    });
  }
  for (auto& t : threads) t.join();
  r.seconds = Seconds(start, Clock::now());
  // Pushing ends when the last byte is written (the server may still be reading).
  r.push_seconds = *std::max_element(push_done.begin(), push_done.end());
  Account(before, s, &r);
  return r;
}

// One gRPC round: push every parameter, then pull every parameter.
Round GrpcRound(Setup* s, const std::vector<std::unique_ptr<GrpcPServerClient>>& clients,
                int64_t step) {
  Round r;
  RequestMeta meta{"bench", 0, step};
  const AllUsage before = Sample(*s);
  const Clock::time_point start = Clock::now();
  const int n = static_cast<int>(s->params.size());
  {
    StatusGroup group(n);
    for (int i = 0; i < n; ++i) {
      clients[s->server_of[i]]->SendVariableAsync(meta, absl::StrCat("param_", i), &s->params[i],
                                                  group.Callback());
    }
    absl::Status st = group.Wait();
    if (!st.ok()) Die(std::string(st.message()));
  }
  r.push_seconds = Seconds(start, Clock::now());
  {
    StatusGroup group(n);
    for (int i = 0; i < n; ++i) {
      clients[s->server_of[i]]->GetVariableAsync(meta, absl::StrCat("param_", i), &s->pulled[i],
                                                 group.Callback());
    }
    absl::Status st = group.Wait();
    if (!st.ok()) Die(std::string(st.message()));
  }
  r.seconds = Seconds(start, Clock::now());
  Account(before, *s, &r);
  return r;
}

struct Summary {
  double mbps = 0, min_mbps = 0, max_mbps = 0;  // push + pull, median and range
  double push_mbps = 0, pull_mbps = 0;          // medians
  double trainer_cpu_per_gb = 0, server_cpu_per_gb = 0;
  double faults_per_mb = 0;
};

using bench::Median;

Summary Summarize(const std::vector<Round>& rounds, int64_t bytes) {
  std::vector<double> all, push, pull, tcpu, scpu, faults;
  const double half = bytes / 2.0;
  for (const auto& r : rounds) {
    all.push_back(bytes / r.seconds / 1e6);
    push.push_back(half / r.push_seconds / 1e6);
    pull.push_back(half / (r.seconds - r.push_seconds) / 1e6);
    tcpu.push_back(r.trainer_cpu / (bytes / 1e9));
    scpu.push_back(r.server_cpu / (bytes / 1e9));
    faults.push_back(r.faults / (bytes / 1e6));
  }
  Summary s;
  s.mbps = Median(all);
  s.min_mbps = *std::min_element(all.begin(), all.end());
  s.max_mbps = *std::max_element(all.begin(), all.end());
  s.push_mbps = Median(push);
  s.pull_mbps = Median(pull);
  s.trainer_cpu_per_gb = Median(tcpu);
  s.server_cpu_per_gb = Median(scpu);
  s.faults_per_mb = Median(faults);
  return s;
}

int Main() {
  const int64_t total_bytes = absl::GetFlag(FLAGS_total_mb) << 20;
  const int num_servers = absl::GetFlag(FLAGS_pservers);
  const int num_vars = absl::GetFlag(FLAGS_vars);
  const int repeats = std::max(1, absl::GetFlag(FLAGS_repeats));
  const size_t write_bytes = static_cast<size_t>(absl::GetFlag(FLAGS_tcp_write_kb)) << 10;
  std::vector<int64_t> chunks;
  for (absl::string_view c : absl::StrSplit(absl::GetFlag(FLAGS_chunk_mb), ',')) {
    int64_t mb = 0;
    if (!absl::SimpleAtoi(c, &mb) || mb < 0) Die(absl::StrCat("bad --chunk_mb entry '", c, "'"));
    chunks.push_back(mb);
  }
  if (num_servers < 1 || num_vars < 1 || total_bytes < 4 * num_vars || write_bytes == 0) {
    Die("need --pservers >= 1, --vars >= 1, --total_mb > 0 and --tcp_write_kb > 0");
  }

  // Children first: no gRPC state may exist in this process when it forks.
  Setup s;
  for (int k = 0; k < num_servers; ++k) s.children.push_back(StartChild());
  const int64_t elems = total_bytes / 4 / num_vars;
  for (int i = 0; i < num_vars; ++i) {
    Variable v;
    Tensor* t = v.GetMutable<Tensor>();
    t->Resize(FLOAT32, {elems});
    for (int64_t j = 0; j < elems; ++j)
      t->data<float>()[j] = static_cast<float>((i * 7919 + j) % 100003);
    s.params.push_back(v);
    Variable dst;
    dst.GetMutable<Tensor>()->Resize(FLOAT32, {elems});
    s.pulled.push_back(dst);
    s.server_of.push_back(i % num_servers);
  }
  s.bytes_per_round = 2 * elems * 4 * num_vars;
  std::printf(
      "ps_dense: %.1f MiB in %d float32 tensor(s) of %.1f MiB, %d server process(es), 1 trainer, "
      "loopback; each round pushes and pulls everything (%.1f MiB moved), %d rounds per "
      "transport\n",
      total_bytes / 1048576.0, num_vars, elems * 4 / 1048576.0, num_servers,
      s.bytes_per_round / 1048576.0, repeats);

  // Raw TCP connections (one per server).
  std::vector<int> fds;
  for (const auto& c : s.children) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(static_cast<uint16_t>(c.tcp_port));
    if (fd < 0 || connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
      Die(absl::StrCat("cannot connect to 127.0.0.1:", c.tcp_port, ": ", std::strerror(errno)));
    }
    SetNoDelay(fd);
    fds.push_back(fd);
  }
  std::vector<std::vector<char>> tcp_back(num_servers);

  // gRPC clients per chunk size.
  std::vector<std::vector<std::unique_ptr<GrpcPServerClient>>> clients(chunks.size());
  for (size_t c = 0; c < chunks.size(); ++c) {
    for (const auto& child : s.children) {
      GrpcClientOptions o;
      o.chunk_bytes = chunks[c] << 20;
      o.deadline = absl::Seconds(60);
      clients[c].push_back(
          std::make_unique<GrpcPServerClient>(absl::StrCat("127.0.0.1:", child.grpc_port), o));
    }
  }

  // Warm-up (connections, allocations on both sides), then check the round trips.
  TcpRound(s, fds, &tcp_back, write_bytes);
  for (int k = 0; k < num_servers; ++k) {
    size_t off = 0;
    for (size_t i = 0; i < s.params.size(); ++i) {
      if (s.server_of[i] != k) continue;
      const Tensor& t = s.params[i].Get<Tensor>();
      if (std::memcmp(tcp_back[k].data() + off, t.raw_data(), t.nbytes()) != 0) {
        Die("raw TCP round trip returned other bytes");
      }
      off += t.nbytes();
    }
  }
  int64_t step = 0;
  for (size_t c = 0; c < chunks.size(); ++c) {
    for (auto& p : s.pulled) std::memset(p.GetMutable<Tensor>()->raw_data(), 0, elems * 4);
    GrpcRound(&s, clients[c], step++);
    for (int i = 0; i < num_vars; ++i) {
      if (std::memcmp(s.pulled[i].Get<Tensor>().raw_data(), s.params[i].Get<Tensor>().raw_data(),
                      elems * 4) != 0) {
        Die(absl::StrCat("gRPC round trip (chunk ", chunks[c], " MiB) returned other bytes"));
      }
    }
  }

  std::vector<Round> tcp;
  std::vector<std::vector<Round>> grpc(chunks.size());
  const bool skip_tcp = absl::GetFlag(FLAGS_skip_tcp);
  for (int r = 0; r < repeats; ++r) {
    if (!skip_tcp || r == 0) tcp.push_back(TcpRound(s, fds, &tcp_back, write_bytes));
    for (size_t c = 0; c < chunks.size(); ++c) grpc[c].push_back(GrpcRound(&s, clients[c], step++));
  }

  const Summary base = Summarize(tcp, s.bytes_per_round);
  std::printf("\n%-26s %8s %11s %9s %9s %6s %14s %14s %9s\n", "transport", "MB/s", "range",
              "push MB/s", "pull MB/s", "ratio", "trainer cpu/GB", "servers cpu/GB", "faults/MB");
  auto row = [&](const std::string& name, const Summary& x) {
    std::printf("%-26s %8.0f %5.0f-%-5.0f %9.0f %9.0f %6.2f %13.2fs %13.2fs %9.1f\n", name.c_str(),
                x.mbps, x.min_mbps, x.max_mbps, x.push_mbps, x.pull_mbps, x.mbps / base.mbps,
                x.trainer_cpu_per_gb, x.server_cpu_per_gb, x.faults_per_mb);
  };
  row(absl::StrFormat("raw TCP (%d KiB writes)", write_bytes >> 10), base);
  for (size_t c = 0; c < chunks.size(); ++c) {
    row(absl::StrFormat("gRPC, chunk_bytes %d MiB", chunks[c]),
        Summarize(grpc[c], s.bytes_per_round));
  }
  std::printf(
      "(MB = 10^6 bytes; ratio = MB/s over the raw TCP MB/s of the same run; push and pull "
      "are each half the bytes)\n");

  for (int fd : fds) close(fd);
  clients.clear();
  for (auto& c : s.children) bench::StopChild(&c.process);
  return 0;
}

}  // namespace
}  // namespace tessera

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  signal(SIGPIPE, SIG_IGN);
  if (absl::GetFlag(FLAGS_tune_malloc)) {
    // gRPC allocates its read buffers per read and frees them once a message is consumed; with
    // glibc's defaults the freed memory goes back to the kernel (trim / munmap) and every new
    // buffer page-faults again, which costs more than the copies themselves on VMs.
    tessera::TuneMallocForLargeBuffers();  // what the daemons do (common/base/malloc_tuning.h)
  }
  if (absl::GetFlag(FLAGS_serve)) return tessera::Serve();
  return tessera::Main();
}
