// Read-only embedding serving under load: `--concurrency` client threads, each with its own
// gRPC connection, send Prefetch requests of `--ids` ids of one table to a pserver started with
// --serve_bundle (tests/bench/serving.sh starts it) for `--seconds`, one request in flight per
// thread. Prints requests/s, ids/s and the latency percentiles (p50, p99, max) of the requests.
// The ids are drawn Zipf-like (alpha 1.1) from [0, --id_range), as a CTR slot's are.
//
//   serve_prefetch --endpoint=127.0.0.1:PORT --table=NAME [--ids=4096] [--seconds=5]
//                  [--concurrency=1] [--id_range=10000] [--job_id=...]
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_format.h"
#include "common/base/malloc_tuning.h"
#include "common/base/mutex_tuning.h"
#include "common/data/rng.h"
#include "common/rpc/grpc/grpc_client.h"

ABSL_FLAG(std::string, endpoint, "", "The serving pserver, host:port (required).");
ABSL_FLAG(std::string, table, "", "The distributed table to look up (required).");
ABSL_FLAG(std::string, job_id, "tessera",
          "The job id the serving pserver was started with (its --job_id).");
ABSL_FLAG(int64_t, ids, 4096, "Ids per Prefetch request.");
ABSL_FLAG(double, seconds, 5, "How long each run lasts, after a one-second warm-up.");
ABSL_FLAG(int, concurrency, 1, "Client threads, each with one request in flight.");
ABSL_FLAG(int64_t, id_range, 10000, "Ids are drawn from [0, id_range).");

namespace tessera {
namespace {

double Seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Zipf-like ids: floor(range^u) - 1 for uniform u is heavy at small ids, as CTR slots are.
std::vector<int64_t> DrawIds(uint64_t seed, int64_t n, int64_t range) {
  std::mt19937_64 rng(seed);
  std::vector<int64_t> ids(static_cast<size_t>(n));
  const double log_range = std::log(static_cast<double>(range));
  for (auto& id : ids) {
    const double u = data::UniformDouble(rng);
    id = std::min<int64_t>(range - 1, static_cast<int64_t>(std::exp(u * log_range)) - 1);
  }
  return ids;
}

int Run() {
  const std::string endpoint = absl::GetFlag(FLAGS_endpoint);
  const std::string table = absl::GetFlag(FLAGS_table);
  const int64_t n = absl::GetFlag(FLAGS_ids);
  const int threads = absl::GetFlag(FLAGS_concurrency);
  if (endpoint.empty() || table.empty() || n < 1 || threads < 1) {
    std::fprintf(stderr, "serve_prefetch: --endpoint, --table, --ids >= 1 and --concurrency >= 1 "
                         "are required\n");
    return 2;
  }
  const double seconds = absl::GetFlag(FLAGS_seconds);
  std::atomic<bool> measuring{false}, stop{false}, failed{false};
  std::vector<std::vector<double>> latencies(static_cast<size_t>(threads));
  std::vector<std::thread> workers;
  for (int t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      GrpcClientOptions co;
      GrpcPServerClient client(endpoint, co);
      if (absl::Status s = client.Connect(absl::Seconds(10)); !s.ok()) {
        std::fprintf(stderr, "serve_prefetch: %s\n", std::string(s.message()).c_str());
        failed = true;
        return;
      }
      RequestMeta meta{absl::GetFlag(FLAGS_job_id), 0, 0, false};
      std::vector<std::vector<int64_t>> batches;
      for (int b = 0; b < 16; ++b) {
        batches.push_back(DrawIds(static_cast<uint64_t>(t) * 1000 + b, n,
                                  absl::GetFlag(FLAGS_id_range)));
      }
      Tensor out;
      for (size_t k = 0; !stop.load(); ++k) {
        const double begin = Seconds();
        absl::Status s = client.Prefetch(meta, table, batches[k % batches.size()], &out);
        const double took = Seconds() - begin;
        if (!s.ok()) {
          std::fprintf(stderr, "serve_prefetch: %s\n", std::string(s.message()).c_str());
          failed = true;
          return;
        }
        if (measuring.load()) latencies[static_cast<size_t>(t)].push_back(took);
      }
    });
  }
  std::this_thread::sleep_for(std::chrono::seconds(1));  // warm-up: connections, the allocator
  measuring = true;
  const double begin = Seconds();
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  measuring = false;
  const double elapsed = Seconds() - begin;
  stop = true;
  for (auto& w : workers) w.join();
  if (failed) return 1;
  std::vector<double> all;
  for (const auto& l : latencies) all.insert(all.end(), l.begin(), l.end());
  if (all.empty()) {
    std::fprintf(stderr, "serve_prefetch: no request finished within %.1f s\n", seconds);
    return 1;
  }
  std::sort(all.begin(), all.end());
  auto pct = [&](double p) {
    return all[std::min(all.size() - 1, static_cast<size_t>(p * static_cast<double>(all.size())))];
  };
  const double qps = static_cast<double>(all.size()) / elapsed;
  std::printf(
      "serve_prefetch: %d client(s), %lld ids/request: %.0f requests/s, %.3g ids/s, latency "
      "p50 %.3f ms p99 %.3f ms max %.3f ms (%zu requests in %.1f s)\n",
      threads, static_cast<long long>(n), qps, qps * static_cast<double>(n), pct(0.5) * 1e3,
      pct(0.99) * 1e3, all.back() * 1e3, all.size(), elapsed);
  return 0;
}

}  // namespace
}  // namespace tessera

int main(int argc, char** argv) {
  tessera::TuneMallocForLargeBuffers();
  tessera::DisableMutexDeadlockDetection();
  absl::SetProgramUsageMessage("Prefetch load against a --serve_bundle pserver");
  absl::ParseCommandLine(argc, argv);
  return tessera::Run();
}
