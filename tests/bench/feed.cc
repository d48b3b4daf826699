// The trainer's feed of a batch from examples in memory (Feeder::Feed with a shuffled epoch
// order, as LocalTrainer feeds in-memory data): the CTR job's shape, 13 dense values and 26
// slots per example, Zipf(1.1) ids over 10^4 per slot, batches of 256 in a permutation of all
// the examples. Two feed specs: the slots' ids as they are (distributed tables: the cluster's
// trainers) and mapped into local tables of 10^4 rows (the single process).
//
//   bazel build //tests/bench:feed
//   bazel-bin/tests/bench/feed [--examples=480000] [--batch=256] [--repeats=5]
//
// Per spec: microseconds per batch, the median of --repeats passes over one epoch of batches.
// Compare builds by running their binaries alternately (tests/bench/RESULTS.md).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_cat.h"
#include "common/data/synthetic.h"
#include "common/framework/scope.h"
#include "tests/bench/stats.h"
#include "trainer/feeder.h"

ABSL_FLAG(int64_t, examples, 480000, "examples in memory (default 480000)");
ABSL_FLAG(int64_t, batch, 256, "examples per batch (default 256)");
ABSL_FLAG(int, repeats, 5, "passes over the epoch per spec; the median is reported (default 5)");

namespace tessera {
namespace {

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

FeedSpec CtrSpec(int64_t dict_size) {
  FeedSpec spec;
  spec.dense = "dense";
  spec.num_dense = 13;
  for (int s = 0; s < 26; ++s) spec.slots.push_back({absl::StrCat("slot", s), dict_size});
  spec.label = "label";
  return spec;
}

int Run() {
  const int64_t n = absl::GetFlag(FLAGS_examples);
  const int64_t batch = absl::GetFlag(FLAGS_batch);
  const int repeats = absl::GetFlag(FLAGS_repeats);
  if (n < 1 || batch < 1 || batch > n || repeats < 1) {
    std::fprintf(stderr, "feed: need 1 <= --batch <= --examples and --repeats >= 1\n");
    return 2;
  }
  data::CtrDataOptions options;
  options.vocab_per_slot = 10000;
  absl::StatusOr<data::Dataset> data = data::MakeCtrData(n, options);
  if (!data.ok()) {
    std::fprintf(stderr, "feed: %s\n", data.status().ToString().c_str());
    return 1;
  }
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), std::mt19937_64(7));
  const absl::Span<const data::Example> examples(data->examples);
  const absl::Span<const int64_t> all(order);
  const int64_t batches = n / batch;
  for (int64_t dict_size : {int64_t{0}, int64_t{10000}}) {
    Feeder feeder(CtrSpec(dict_size));
    Scope scope;
    std::vector<double> per_batch;
    int64_t checksum = 0;
    for (int r = 0; r < repeats; ++r) {
      const double t0 = Now();
      for (int64_t b = 0; b < batches; ++b) {
        absl::Status s = feeder.Feed(examples, all.subspan(b * batch, batch), &scope);
        if (!s.ok()) {
          std::fprintf(stderr, "feed: %s\n", s.ToString().c_str());
          return 1;
        }
        checksum += scope.FindVar("slot25")->Get<Tensor>().data<int64_t>()[batch - 1];
      }
      per_batch.push_back(1e6 * (Now() - t0) / static_cast<double>(batches));
    }
    std::printf(
        "%s: %.1f us per batch of %lld (%lld batches, checksum %lld)\n",
        dict_size == 0 ? "ids as they are (cluster trainer)" : "ids mod 10000 (single process)",
        bench::Median(per_batch), static_cast<long long>(batch), static_cast<long long>(batches),
        static_cast<long long>(checksum));
  }
  return 0;
}

}  // namespace
}  // namespace tessera

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return tessera::Run();
}
