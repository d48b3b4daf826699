// conv2d forward + backward GFLOP/s on LeNet's two convolutions (batch 64), against the peak of
// a plain Eigen GEMM measured in the same run, and LeNet's training samples/s on Fashion-MNIST
// (the job `examples/lenet` runs: feed, forward, backward, momentum update), all on one thread.
//
//   bazel run -c opt //tests/bench:conv -- [--min_seconds=1] [--repeats=3] [--lenet_images=3200]
//
// FLOPs count multiply-adds as 2: forward 2 N M Ho Wo C kh kw; backward the same for the filter
// gradient and again for the input gradient (conv1's input is the data: no input gradient).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "Eigen/Core"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_format.h"
#include "common/executor.h"
#include "common/model_file.h"
#include "common/mutex_tuning.h"
#include "common/ops/ops.h"
#include "examples/fashion_mnist/model.h"
#include "trainer/local_trainer.h"

ABSL_FLAG(double, min_seconds, 1.0, "Minimum duration of one timed repeat.");
ABSL_FLAG(int, repeats, 3, "Timed repeats per measurement (the best is reported).");
ABSL_FLAG(int64_t, lenet_images, 3200,
          "Fashion-MNIST training images of the LeNet epoch that is timed (0: skip it).");

namespace tessera {
namespace {

using Clock = std::chrono::steady_clock;

// The best rate (units per second) of `run` over --repeats repeats of at least --min_seconds.
double BestRate(const std::function<void()>& run, double units_per_run) {
  double best = 0;
  for (int r = 0; r < absl::GetFlag(FLAGS_repeats); ++r) {
    int64_t runs = 0;
    const Clock::time_point start = Clock::now();
    double elapsed = 0;
    while (elapsed < absl::GetFlag(FLAGS_min_seconds)) {
      run();
      ++runs;
      elapsed = std::chrono::duration<double>(Clock::now() - start).count();
    }
    best = std::max(best, units_per_run * static_cast<double>(runs) / elapsed);
  }
  return best;
}

double GemmPeakGflops() {
  using Mat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
  const int n = 512;
  Mat a = Mat::Random(n, n), b = Mat::Random(n, n), c(n, n);
  return BestRate([&] { c.noalias() = a * b; }, 2.0 * n * n * n) / 1e9;
}

struct ConvCase {
  const char* name;
  int64_t n, c, h, w, m, k;
  bool input_grad;
};

// GFLOP/s of conv2d forward + conv2d_grad through the executor; *flops_per_run gets the FLOPs of
// one forward + backward.
double ConvGflops(const ConvCase& cc, double* flops_per_run) {
  auto registry = NewStandardOpRegistry();
  Executor exec(registry.get());
  Scope scope;
  auto feed = [&](const std::string& name, const Shape& shape) {
    Tensor* t = scope.Var(name)->GetMutable<Tensor>();
    t->Resize(FLOAT32, shape);
    t->flat<float>() = Eigen::ArrayXf::Random(t->numel());
  };
  const int64_t ho = cc.h - cc.k + 1, wo = cc.w - cc.k + 1;
  feed("x", {cc.n, cc.c, cc.h, cc.w});
  feed("w", {cc.m, cc.c, cc.k, cc.k});
  feed("y@GRAD", {cc.n, cc.m, ho, wo});
  OpDesc fwd = MakeOp("conv2d", {{"Input", {"x"}}, {"Filter", {"w"}}}, {{"Output", {"y"}}});
  std::vector<std::pair<std::string, std::vector<std::string>>> grad_outputs = {
      {"Filter@GRAD", {"w@GRAD"}}};
  if (cc.input_grad) grad_outputs.push_back({"Input@GRAD", {"x@GRAD"}});
  OpDesc bwd = MakeOp("conv2d_grad",
                      {{"Input", {"x"}}, {"Filter", {"w"}}, {"Output", {"y"}},
                       {"Output@GRAD", {"y@GRAD"}}},
                      grad_outputs);
  const double one = 2.0 * cc.n * cc.m * ho * wo * cc.c * cc.k * cc.k;
  const double flops = one * (cc.input_grad ? 3 : 2);
  *flops_per_run = flops;
  return BestRate(
             [&] {
               absl::Status s = exec.RunOp(fwd, &scope);
               if (s.ok()) s = exec.RunOp(bwd, &scope);
               if (!s.ok()) {
                 std::fprintf(stderr, "conv: %s\n", std::string(s.message()).c_str());
                 std::exit(1);
               }
             },
             flops) /
         1e9;
}

int Run() {
  Eigen::setNbThreads(1);
  DisableMutexDeadlockDetection();
  const double peak = GemmPeakGflops();
  std::printf("Eigen GEMM 512x512x512 float, 1 thread: %.1f GFLOP/s (the peak)\n", peak);
  const ConvCase cases[] = {{"lenet conv1 [64,1,28,28] * [20,1,5,5]", 64, 1, 28, 28, 20, 5, false},
                            {"lenet conv2 [64,20,12,12] * [50,20,5,5]", 64, 20, 12, 12, 50, 5, true}};
  double flops = 0, seconds = 0;  // both convolutions of one LeNet step
  for (const ConvCase& cc : cases) {
    double f = 0;
    const double g = ConvGflops(cc, &f);
    flops += f;
    seconds += f / (g * 1e9);
    std::printf("conv2d forward+backward %s: %.1f GFLOP/s = %.2f of the GEMM peak\n", cc.name, g,
                g / peak);
  }
  const double both = flops / seconds / 1e9;
  std::printf("both LeNet convolutions (%.0f MFLOP per batch of 64): %.1f GFLOP/s = %.2f of the "
              "GEMM peak\n",
              flops / 1e6, both, both / peak);
  const int64_t images = absl::GetFlag(FLAGS_lenet_images);
  if (images <= 0) return 0;
  auto data = examples::ReadFashionMnist(examples::kFashionMnistTrain, images);
  if (!data.ok()) {
    std::printf("lenet: skipped (%s)\n", std::string(data.status().message()).c_str());
    return 0;
  }
  auto registry = NewStandardOpRegistry();
  auto file = examples::LenetModelFile();
  auto model = file.ok() ? CompileModel(*file, *registry, "lenet") : file.status();
  if (!model.ok()) {
    std::fprintf(stderr, "lenet: %s\n", std::string(model.status().message()).c_str());
    return 1;
  }
  LocalTrainerOptions to;
  to.batch_size = 64;
  to.log_every_steps = 0;
  auto trainer = LocalTrainer::Create(registry.get(), *std::move(model), to);
  if (!trainer.ok()) return 1;
  double best = 0;
  for (int r = 0; r < absl::GetFlag(FLAGS_repeats); ++r) {
    auto stats = (*trainer)->TrainEpoch(*data);
    if (!stats.ok()) return 1;
    best = std::max(best, stats->samples_per_sec);
  }
  std::printf("lenet training on %lld Fashion-MNIST images, batch 64, 1 thread: %.0f samples/s\n",
              static_cast<long long>(images), best);
  return 0;
}

}  // namespace
}  // namespace tessera

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  return tessera::Run();
}
