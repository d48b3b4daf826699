// conv2d forward + backward GFLOP/s on LeNet's two convolutions (batch 64), against the peak of
// a plain Eigen GEMM measured in the same run, and LeNet's training samples/s on Fashion-MNIST
// (the job `examples/lenet` runs: feed, forward, backward, momentum update), all on one thread.
//
//   bazel run //tests/bench:conv -- [--min_seconds=1] [--repeats=3] [--lenet_images=3200]
//
// The GEMM and the convolutions run in interleaved turns of 50 ms, so that the ratio is not
// skewed by the VM's speed drifting between measurements. FLOPs count multiply-adds as 2:
// forward 2 N M Ho Wo C kh kw; backward the same for the filter gradient and again for the
// input gradient (conv1's input is the data: no input gradient).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "Eigen/Core"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_format.h"
#include "common/framework/executor.h"
#include "common/layers/model_file.h"
#include "common/base/mutex_tuning.h"
#include "common/ops/ops.h"
#include "examples/fashion_mnist/model.h"
#include "trainer/local_trainer.h"

ABSL_FLAG(double, min_seconds, 1.0,
          "Seconds of each of GEMM, conv1 and conv2 per repeat (run in interleaved 50 ms turns).");
ABSL_FLAG(int, repeats, 3, "Repeats (multiplies --min_seconds); also the LeNet epochs timed.");
ABSL_FLAG(int64_t, lenet_images, 3200,
          "Fashion-MNIST training images of the LeNet epoch that is timed (0: skip it).");

namespace tessera {
namespace {

using Clock = std::chrono::steady_clock;

// A timed piece of work: `run` does `flops` floating-point operations.
struct Workload {
  std::string name;
  std::function<void()> run;
  double flops = 0;
  double seconds = 0;  // accumulated
  int64_t runs = 0;
  double gflops() const { return flops * static_cast<double>(runs) / seconds / 1e9; }
};

// Runs the workloads in turns of about 50 ms each until each has had `seconds` in all, so that
// they all see the same mix of this (shared, drifting) VM's fast and slow moments.
void Interleave(std::vector<Workload*> work, double seconds) {
  constexpr double kTurn = 0.05;
  for (double done = 0; done < seconds; done += kTurn) {
    for (Workload* w : work) {
      const Clock::time_point start = Clock::now();
      double elapsed = 0;
      while (elapsed < kTurn) {
        w->run();
        ++w->runs;
        elapsed = std::chrono::duration<double>(Clock::now() - start).count();
      }
      w->seconds += elapsed;
    }
  }
}

using Mat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;

struct ConvCase {
  const char* name;
  int64_t n, c, h, w, m, k;
  bool input_grad;
};

// conv2d forward + conv2d_grad of `cc` through the executor, in its own scope.
struct ConvWork {
  std::unique_ptr<OpRegistry> registry = NewStandardOpRegistry();
  Executor exec{registry.get()};
  Scope scope;
  OpDesc fwd, bwd;

  Workload Make(const ConvCase& cc) {
    auto feed = [&](const std::string& name, const Shape& shape) {
      Tensor* t = scope.Var(name)->GetMutable<Tensor>();
      t->Resize(FLOAT32, shape);
      t->flat<float>() = Eigen::ArrayXf::Random(t->numel());
    };
    const int64_t ho = cc.h - cc.k + 1, wo = cc.w - cc.k + 1;
    feed("x", {cc.n, cc.c, cc.h, cc.w});
    feed("w", {cc.m, cc.c, cc.k, cc.k});
    feed("y@GRAD", {cc.n, cc.m, ho, wo});
    fwd = MakeOp("conv2d", {{"Input", {"x"}}, {"Filter", {"w"}}}, {{"Output", {"y"}}});
    std::vector<std::pair<std::string, std::vector<std::string>>> grads = {
        {"Filter@GRAD", {"w@GRAD"}}};
    if (cc.input_grad) grads.push_back({"Input@GRAD", {"x@GRAD"}});
    bwd = MakeOp(
        "conv2d_grad",
        {{"Input", {"x"}}, {"Filter", {"w"}}, {"Output", {"y"}}, {"Output@GRAD", {"y@GRAD"}}},
        grads);
    const double one = 2.0 * cc.n * cc.m * ho * wo * cc.c * cc.k * cc.k;
    Workload w;
    w.name = cc.name;
    w.flops = one * (cc.input_grad ? 3 : 2);
    w.run = [this] {
      absl::Status s = exec.RunOp(fwd, &scope);
      if (s.ok()) s = exec.RunOp(bwd, &scope);
      if (!s.ok()) {
        std::fprintf(stderr, "conv: %s\n", std::string(s.message()).c_str());
        std::exit(1);
      }
    };
    return w;
  }
};

int Run() {
  Eigen::setNbThreads(1);
  DisableMutexDeadlockDetection();
  const int n = 512;
  Mat a = Mat::Random(n, n), b = Mat::Random(n, n), c(n, n);
  Workload gemm{"Eigen GEMM 512x512x512 float", [&] { c.noalias() = a * b; }, 2.0 * n * n * n};
  ConvWork conv_work[2];
  Workload conv[2] = {
      conv_work[0].Make({"lenet conv1 [64,1,28,28] * [20,1,5,5]", 64, 1, 28, 28, 20, 5, false}),
      conv_work[1].Make({"lenet conv2 [64,20,12,12] * [50,20,5,5]", 64, 20, 12, 12, 50, 5, true})};
  for (Workload* w : {&gemm, &conv[0], &conv[1]}) w->run();  // warm: scratch buffers, caches
  Interleave({&gemm, &conv[0], &conv[1]},
             absl::GetFlag(FLAGS_min_seconds) * absl::GetFlag(FLAGS_repeats));
  const double peak = gemm.gflops();
  std::printf("%s, 1 thread: %.1f GFLOP/s (the peak)\n", gemm.name.c_str(), peak);
  double flops = 0, seconds = 0;  // both convolutions of one LeNet step
  for (const Workload& w : conv) {
    std::printf("conv2d forward+backward %s: %.1f GFLOP/s = %.2f of the GEMM peak\n",
                w.name.c_str(), w.gflops(), w.gflops() / peak);
    flops += w.flops;
    seconds += w.flops / (w.gflops() * 1e9);
  }
  std::printf(
      "both LeNet convolutions (forward+backward of a batch of 64, %.0f MFLOP): %.1f "
      "GFLOP/s = %.2f of the GEMM peak\n",
      flops / 1e6, flops / seconds / 1e9, flops / seconds / 1e9 / peak);
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
