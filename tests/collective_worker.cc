// One rank of a collective job, for tests/collective_cluster_test.cc: joins the job with the
// given init method, runs every collective (sizes 0, 1, odd, large), point-to-point, a group
// and the gradient reducers, checks the results and exits 0 (printing "rank R of N: OK"), or
// prints the first failure and exits 1. --mode=loop instead all-reduces until an operation
// fails (used to kill a peer mid-run) and exits 3 with the error.
#include <sys/prctl.h>

#include <cmath>
#include <csignal>
#include <cstdio>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "common/collective/context.h"
#include "common/collective/reducer.h"

ABSL_FLAG(std::string, init, "tcp", "tcp, file_system or mpi");
ABSL_FLAG(int, rank, -1, "this rank (ignored with --init=mpi)");
ABSL_FLAG(int, world_size, -1, "number of ranks (ignored with --init=mpi)");
ABSL_FLAG(std::string, endpoint, "", "tcp: rank 0's store endpoint host:port");
ABSL_FLAG(std::string, path, "", "file_system: shared directory");
ABSL_FLAG(std::string, hostname, "127.0.0.1", "address for the transport (and MPI's store)");
ABSL_FLAG(int, timeout_s, 30, "rendezvous and operation timeout");
ABSL_FLAG(std::string, mode, "check", "check: run every operation; loop: all-reduce until failure");

namespace tessera {
namespace collective {
namespace {

#define RETURN_IF_FAILED(expr)                                                             \
  do {                                                                                     \
    absl::Status _s = (expr);                                                              \
    if (!_s.ok()) return absl::Status(_s.code(), absl::StrCat(#expr, ": ", _s.message())); \
  } while (0)

absl::Status Expect(bool ok, const std::string& what) {
  return ok ? absl::OkStatus() : absl::InternalError(absl::StrCat("wrong result: ", what));
}

absl::Status RunChecks(Context& ctx) {
  Communicator* comm = ctx.world();
  const int rank = ctx.Rank();
  const int world = ctx.WorldSize();
  for (size_t n : {size_t{0}, size_t{1}, size_t{7}, size_t{1} << 20}) {
    // all_reduce sum / avg / max.
    std::vector<float> x(n), y(n);
    for (size_t i = 0; i < n; ++i) x[i] = static_cast<float>((rank + 1) * (i % 13 + 1));
    RETURN_IF_FAILED(comm->AllReduce(x.data(), y.data(), n, ElementType::kFloat32, ReduceOp::kSum));
    for (size_t i = 0; i < n; ++i) {
      RETURN_IF_FAILED(Expect(y[i] == (i % 13 + 1) * world * (world + 1) / 2.0f,
                              absl::StrCat("all_reduce sum n=", n, " i=", i)));
    }
    RETURN_IF_FAILED(comm->AllReduce(x.data(), y.data(), n, ElementType::kFloat32, ReduceOp::kMax));
    for (size_t i = 0; i < n; ++i) {
      RETURN_IF_FAILED(Expect(y[i] == (i % 13 + 1) * world, absl::StrCat("all_reduce max i=", i)));
    }
    std::vector<int64_t> z(n, rank);
    RETURN_IF_FAILED(comm->AllReduce(z.data(), z.data(), n, ElementType::kInt64, ReduceOp::kAvg));
    for (size_t i = 0; i < n; ++i) {
      RETURN_IF_FAILED(Expect(z[i] == (world - 1) / 2, absl::StrCat("all_reduce avg i=", i)));
    }
    // broadcast from the last rank.
    std::vector<int32_t> b(n, rank);
    RETURN_IF_FAILED(comm->Broadcast(b.data(), n, ElementType::kInt32, world - 1));
    for (size_t i = 0; i < n; ++i) RETURN_IF_FAILED(Expect(b[i] == world - 1, "broadcast"));
    // all_gather.
    std::vector<float> all(n * world);
    RETURN_IF_FAILED(comm->AllGather(x.data(), all.data(), n, ElementType::kFloat32));
    for (size_t j = 0; j < n * world; ++j) {
      RETURN_IF_FAILED(Expect(all[j] == static_cast<float>((j / n + 1) * ((j % n) % 13 + 1)),
                              absl::StrCat("all_gather j=", j)));
    }
    // reduce_scatter (sum of `all`, which is the same on every rank: world * all).
    std::vector<float> mine(n);
    RETURN_IF_FAILED(
        comm->ReduceScatter(all.data(), mine.data(), n, ElementType::kFloat32, ReduceOp::kSum));
    for (size_t i = 0; i < n; ++i) {
      RETURN_IF_FAILED(Expect(mine[i] == world * all[rank * n + i], "reduce_scatter"));
    }
  }
  RETURN_IF_FAILED(comm->Barrier());
  if (world > 1) {
    // isend / irecv around the ring.
    std::vector<double> out(1001, rank), in(1001, -1);
    auto r = comm->IRecv(in.data(), in.size(), ElementType::kFloat64, (rank + world - 1) % world);
    auto s = comm->ISend(out.data(), out.size(), ElementType::kFloat64, (rank + 1) % world);
    RETURN_IF_FAILED(r->Wait());
    RETURN_IF_FAILED(s->Wait());
    RETURN_IF_FAILED(Expect(in[1000] == (rank + world - 1) % world, "isend/irecv"));
  }
  // A group of the odd ranks.
  std::vector<int> odd;
  for (int r = 1; r < world; r += 2) odd.push_back(r);
  if (!odd.empty()) {
    auto group = ctx.NewGroup(odd);
    RETURN_IF_FAILED(group.status());
    if (rank % 2 == 1) {
      int64_t v = rank;
      RETURN_IF_FAILED((*group)->AllReduce(absl::MakeSpan(&v, 1), ReduceOp::kSum));
      int64_t want = 0;
      for (int r : odd) want += r;
      RETURN_IF_FAILED(Expect(v == want, "group all_reduce"));
    }
  }
  // Gradient reducers: mean of the gradients, fp16 on the wire halves the bytes.
  Tensor g1(FLOAT32, {300}), g2(FLOAT32, {2, 50});
  for (int i = 0; i < 300; ++i) g1.data<float>()[i] = rank + i * 0.5f;
  for (int i = 0; i < 100; ++i) g2.data<float>()[i] = -rank;
  CoalescingReducerOptions options;
  options.compression.kind = Compression::kFp16;
  comm->ResetStats();
  CoalescingReducer reducer(comm, options);
  RETURN_IF_FAILED(reducer.Add(&g1));
  RETURN_IF_FAILED(reducer.Add(&g2));
  RETURN_IF_FAILED(reducer.Finalize());
  RETURN_IF_FAILED(Expect(comm->stats().of(OpKind::kAllReduce).bytes == 400 * 2, "fp16 bytes"));
  RETURN_IF_FAILED(
      Expect(std::abs(g1.data<float>()[10] - ((world - 1) / 2.0f + 5)) < 1e-2f, "mean g1"));
  RETURN_IF_FAILED(Expect(std::abs(g2.data<float>()[99] + (world - 1) / 2.0f) < 1e-2f, "mean g2"));
  return absl::OkStatus();
}

int Main() {
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlive the launcher (test or mpirun)
  auto method = ParseInitMethod(absl::GetFlag(FLAGS_init));
  if (!method.ok()) {
    std::fprintf(stderr, "%s\n", std::string(method.status().message()).c_str());
    return 2;
  }
  InitParams params;
  params.endpoint = absl::GetFlag(FLAGS_endpoint);
  params.path = absl::GetFlag(FLAGS_path);
  params.gloo.hostname = absl::GetFlag(FLAGS_hostname);
  params.mpi_store_host = absl::GetFlag(FLAGS_hostname);
  params.timeout = absl::Seconds(absl::GetFlag(FLAGS_timeout_s));
  Context ctx;
  absl::Status s =
      ctx.Init(*method, absl::GetFlag(FLAGS_rank), absl::GetFlag(FLAGS_world_size), params);
  if (!s.ok()) {
    std::fprintf(stderr, "init failed: %s\n", s.ToString().c_str());
    return 1;
  }
  std::printf("rank %d of %d joined (%s)\n", ctx.Rank(), ctx.WorldSize(),
              InitMethodName(*method).c_str());
  std::fflush(stdout);
  if (absl::GetFlag(FLAGS_mode) == "loop") {
    std::vector<float> x(1 << 16, 1.0f);
    for (int64_t i = 0;; ++i) {
      s = ctx.world()->AllReduce(absl::MakeSpan(x), ReduceOp::kAvg);
      if (!s.ok()) break;
      if (i == 0) {
        std::printf("looping\n");
        std::fflush(stdout);
      }
    }
    std::fprintf(stderr, "all_reduce failed: %s\n", s.ToString().c_str());
    return 3;
  }
  const int rank = ctx.Rank(), world = ctx.WorldSize();
  s = RunChecks(ctx);
  if (!s.ok()) {
    std::fprintf(stderr, "rank %d: %s\n", rank, s.ToString().c_str());
    return 1;
  }
  s = ctx.Shutdown();
  if (!s.ok()) {
    std::fprintf(stderr, "rank %d: shutdown: %s\n", rank, s.ToString().c_str());
    return 1;
  }
  std::printf("rank %d of %d: OK\n", rank, world);
  return 0;
}

}  // namespace
}  // namespace collective
}  // namespace tessera

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return tessera::collective::Main();
}
