// Training throughput of one step (forward + backward + SGD update) through the Tessera
// executor, against the same step written directly in Eigen (the baseline, measured in the
// same run), for
//   - the MLP 784-512-10 (ReLU, softmax cross entropy), batch 256;
//   - the regression MLP 10-100-1 (ReLU, square error), batch 32 and 256.
// One thread (Eigen::setNbThreads(1)). Feeding is not timed: the batch is fed once.
//
//   bazel run //tests/bench:train_throughput -- [--min_seconds=1] [--repeats=5] [--profile]
//
// Before timing, both implementations start from the same parameters and run a few steps; the
// losses must agree (a wrong baseline would make the comparison meaningless). --profile adds a
// per-op timing table for Tessera (each kernel timed individually in the executor loop).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "Eigen/Core"
#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "common/framework/executor.h"
#include "common/layers/layers.h"
#include "common/layers/optimizer.h"
#include "common/ops/ops.h"

ABSL_FLAG(double, min_seconds, 1.0, "Minimum duration of one timed repeat.");
ABSL_FLAG(int, repeats, 5, "Timed repeats per measurement (the median is reported).");
ABSL_FLAG(bool, profile, false, "Print per-op times of the Tessera step.");
ABSL_FLAG(std::string, only, "", "Run only the model named mnist or regression.");
ABSL_FLAG(int64_t, batch, 0, "Run only the configurations of this batch size (0: all).");
ABSL_FLAG(bool, mutex_deadlock_detection, true,
          "false: turn off absl::Mutex deadlock detection (an experiment: Scope lookups lock).");

namespace tessera {
namespace {

using Clock = std::chrono::steady_clock;
using Mat = Eigen::Matrix<float, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
using RowVec = Eigen::Matrix<float, 1, Eigen::Dynamic>;
constexpr float kLr = 0.01f;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

struct Stats {
  double median = 0, min = 0, max = 0;  // samples/s
};

// Samples/s of `step` over at least min_seconds.
double TimeOnce(const std::function<void()>& step, int64_t batch, double min_seconds) {
  int64_t steps = 0;
  const Clock::time_point start = Clock::now();
  double elapsed = 0;
  while (elapsed < min_seconds) {
    for (int i = 0; i < 10; ++i) step();
    steps += 10;
    elapsed = Seconds(start, Clock::now());
  }
  return static_cast<double>(steps * batch) / elapsed;
}

// Times `a` and `b` alternately, `repeats` times each after a warm-up, so that load changes on
// the machine affect both alike; the median and range of each.
std::pair<Stats, Stats> MeasurePair(const std::function<void()>& a, const std::function<void()>& b,
                                    int64_t batch) {
  const double min_seconds = absl::GetFlag(FLAGS_min_seconds);
  const int repeats = std::max(1, absl::GetFlag(FLAGS_repeats));
  for (int i = 0; i < 20; ++i) {
    a();
    b();
  }
  std::vector<double> ra, rb;
  for (int r = 0; r < repeats; ++r) {
    ra.push_back(TimeOnce(a, batch, min_seconds));
    rb.push_back(TimeOnce(b, batch, min_seconds));
  }
  auto stats = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return Stats{v[v.size() / 2], v.front(), v.back()};
  };
  return {stats(ra), stats(rb)};
}

// A two-layer ReLU MLP: in -> hidden -> out. classes > 0: softmax cross entropy over `out`
// classes; classes == 0: square error against one real target.
struct MlpConfig {
  std::string name;
  int64_t in, hidden, out, batch;
  bool classify;
};

// ---------------------------------------------------------------------------------------------
// Tessera

class TesseraMlp {
 public:
  TesseraMlp(const MlpConfig& c, const OpRegistry* registry) : c_(c), exec_(registry) {
    ProgramBuilder b(&main_, &startup_);
    std::string x = layers::Data(b, "x", {-1, c.in});
    std::string y = layers::Data(b, "y", {-1, 1}, c.classify ? INT64 : FLOAT32);
    layers::FcOptions f1;
    f1.name = "fc1";
    f1.act = "relu";
    layers::FcOptions f2;
    f2.name = "fc2";
    std::string logits = layers::Fc(b, layers::Fc(b, x, c.hidden, f1), c.out, f2);
    loss_ = layers::Mean(b, c.classify ? layers::SoftmaxWithCrossEntropy(b, logits, y)
                                       : layers::SquareError(b, logits, y));
    OptimizerOptions o;
    o.learning_rate = kLr;
    Check(SGD(o).Minimize(b, *registry, loss_).status());
    Check(exec_.Run(startup_, 0, &scope_));
    auto prepared = exec_.Prepare(main_, 0);
    Check(prepared.status());
    prepared_ = *prepared;
  }

  void Feed(const Mat& x, const std::vector<int64_t>& labels, const std::vector<float>& targets) {
    Tensor* xt = scope_.Var("x")->GetMutable<Tensor>();
    xt->Resize(FLOAT32, {c_.batch, c_.in});
    std::copy(x.data(), x.data() + x.size(), xt->data<float>());
    Tensor* yt = scope_.Var("y")->GetMutable<Tensor>();
    if (c_.classify) {
      yt->Resize(INT64, {c_.batch, 1});
      std::copy(labels.begin(), labels.end(), yt->data<int64_t>());
    } else {
      yt->Resize(FLOAT32, {c_.batch, 1});
      std::copy(targets.begin(), targets.end(), yt->data<float>());
    }
  }

  void Step() { Check(exec_.Run(prepared_, &scope_)); }
  float Loss() const { return scope_.FindVar(loss_)->Get<Tensor>().data<float>()[0]; }
  const Tensor& Param(const std::string& name) const { return scope_.FindVar(name)->Get<Tensor>(); }

  // Runs `steps` steps timing each kernel; prints the ops by total time.
  void Profile(int steps) {
    const BlockDesc& block = main_.blocks(0);
    std::vector<double> secs(static_cast<size_t>(block.ops_size()), 0.0);
    double total = 0;
    // The arguments resolved as Executor::Run finds them (the scope has not changed).
    const auto args = prepared_.args->For(block, scope_).first;
    for (int s = 0; s < steps; ++s) {
      for (int i = 0; i < block.ops_size(); ++i) {
        OpContext ctx(block.ops(i), &scope_, &(*args)[static_cast<size_t>(i)]);
        const Clock::time_point t0 = Clock::now();
        Check(prepared_.infos[static_cast<size_t>(i)]->kernel(ctx));
        const double dt = Seconds(t0, Clock::now());
        secs[static_cast<size_t>(i)] += dt;
        total += dt;
      }
    }
    std::vector<int> order(secs.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int>(i);
    std::sort(order.begin(), order.end(), [&](int a, int b) { return secs[a] > secs[b]; });
    const Clock::time_point run_start = Clock::now();
    for (int s = 0; s < steps; ++s) Step();
    const double run = Seconds(run_start, Clock::now()) / steps;
    std::printf(
        "  profile over %d steps: Executor::Run %.1f us/step, its kernels %.1f us/step, "
        "outside the kernels %.1f us/step\n",
        steps, run * 1e6, total / steps * 1e6, (run - total / steps) * 1e6);
    for (int i : order) {
      std::printf("    %6.1f us %5.1f%%  #%-2d %s\n", secs[i] / steps * 1e6, 100 * secs[i] / total,
                  i, OpSignature(block.ops(i)).c_str());
    }
  }

 private:
  static void Check(const absl::Status& s) {
    if (!s.ok()) {
      std::fprintf(stderr, "train_throughput: %s\n", std::string(s.message()).c_str());
      std::exit(1);
    }
  }

  MlpConfig c_;
  Executor exec_;
  ProgramDesc main_, startup_;
  std::string loss_;
  Scope scope_;
  PreparedBlock prepared_;
};

// ---------------------------------------------------------------------------------------------
// The baseline: the same step hand-written in Eigen, buffers allocated once.

class EigenMlp {
 public:
  EigenMlp(const MlpConfig& c, const TesseraMlp& init) : c_(c) {
    auto load = [&](const std::string& name, int64_t rows, int64_t cols) {
      const Tensor& t = init.Param(name);
      return Mat(Eigen::Map<const Mat>(t.data<float>(), rows, cols));
    };
    w1_ = load("fc1.w", c.in, c.hidden);
    b1_ = load("fc1.b", 1, c.hidden);
    w2_ = load("fc2.w", c.hidden, c.out);
    b2_ = load("fc2.b", 1, c.out);
    z1_.resize(c.batch, c.hidden);
    h_.resize(c.batch, c.hidden);
    z2_.resize(c.batch, c.out);
    dz2_.resize(c.batch, c.out);
    dh_.resize(c.batch, c.hidden);
    dw1_.resize(c.in, c.hidden);
    dw2_.resize(c.hidden, c.out);
  }

  void Feed(const Mat& x, const std::vector<int64_t>& labels, const std::vector<float>& targets) {
    x_ = x;
    labels_ = labels;
    targets_ = targets;
  }

  void Step() {
    const float inv_b = 1.0f / static_cast<float>(c_.batch);
    // Forward.
    z1_.noalias() = x_ * w1_;
    z1_.rowwise() += b1_;
    h_ = z1_.cwiseMax(0.0f);
    z2_.noalias() = h_ * w2_;
    z2_.rowwise() += b2_;
    double loss = 0;
    if (c_.classify) {
      for (int64_t i = 0; i < c_.batch; ++i) {
        auto row = z2_.row(i);
        auto grad = dz2_.row(i);
        const float max = row.maxCoeff();
        grad = (row.array() - max).exp().matrix();
        const float sum = grad.sum();
        grad /= sum;
        const int64_t k = labels_[static_cast<size_t>(i)];
        loss -= std::log(std::max(grad(k), 1e-20f));
        grad(k) -= 1.0f;
      }
      dz2_ *= inv_b;
    } else {
      for (int64_t i = 0; i < c_.batch; ++i) {
        const float d = z2_(i, 0) - targets_[static_cast<size_t>(i)];
        loss += d * d;
        dz2_(i, 0) = 2.0f * d * inv_b;
      }
    }
    loss_ = static_cast<float>(loss * inv_b);
    // Backward.
    dw2_.noalias() = h_.transpose() * dz2_;
    db2_ = dz2_.colwise().sum();
    dh_.noalias() = dz2_ * w2_.transpose();
    dh_ = (z1_.array() > 0.0f).select(dh_, 0.0f);
    dw1_.noalias() = x_.transpose() * dh_;
    db1_ = dh_.colwise().sum();
    // SGD.
    w1_ -= kLr * dw1_;
    b1_ -= kLr * db1_;
    w2_ -= kLr * dw2_;
    b2_ -= kLr * db2_;
  }

  float Loss() const { return loss_; }

 private:
  MlpConfig c_;
  Mat x_;
  std::vector<int64_t> labels_;
  std::vector<float> targets_;
  Mat w1_, w2_, z1_, h_, z2_, dz2_, dh_, dw1_, dw2_;
  RowVec b1_, b2_, db1_, db2_;
  float loss_ = 0;
};

// ---------------------------------------------------------------------------------------------

void Run(const MlpConfig& c, const OpRegistry* registry) {
  std::mt19937 rng(42);
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  Mat x(c.batch, c.in);
  for (int64_t i = 0; i < x.size(); ++i) x.data()[i] = u(rng);
  std::vector<int64_t> labels(static_cast<size_t>(c.batch));
  std::vector<float> targets(static_cast<size_t>(c.batch));
  for (int64_t i = 0; i < c.batch; ++i) {
    labels[static_cast<size_t>(i)] = static_cast<int64_t>(rng() % static_cast<uint32_t>(c.out));
    targets[static_cast<size_t>(i)] = x.row(i).sum() / static_cast<float>(c.in);
  }

  TesseraMlp tessera(c, registry);
  tessera.Feed(x, labels, targets);
  EigenMlp eigen(c, tessera);
  eigen.Feed(x, labels, targets);

  // Same parameters, same data: the losses of the first steps must agree.
  double worst = 0;
  for (int s = 0; s < 5; ++s) {
    tessera.Step();
    eigen.Step();
    const double a = tessera.Loss(), b = eigen.Loss();
    worst = std::max(worst, std::abs(a - b) / std::max(1e-6, std::abs(b)));
  }
  std::printf("%s, batch %lld: losses of 5 steps agree to %.1e (relative)\n", c.name.c_str(),
              static_cast<long long>(c.batch), worst);
  if (worst > 1e-3) {
    std::fprintf(stderr, "train_throughput: %s: Tessera and the Eigen baseline disagree\n",
                 c.name.c_str());
    std::exit(1);
  }

  const auto [t, e] = MeasurePair([&] { tessera.Step(); }, [&] { eigen.Step(); }, c.batch);
  std::printf("  tessera  %10.0f samples/s  (%8.1f us/step; repeats %.0f..%.0f)\n", t.median,
              1e6 * c.batch / t.median, t.min, t.max);
  std::printf("  eigen    %10.0f samples/s  (%8.1f us/step; repeats %.0f..%.0f)\n", e.median,
              1e6 * c.batch / e.median, e.min, e.max);
  std::printf("  tessera / eigen = %.3f\n", t.median / e.median);
  if (absl::GetFlag(FLAGS_profile)) tessera.Profile(c.batch >= 256 && c.in > 100 ? 200 : 5000);
  std::fflush(stdout);
}

}  // namespace
}  // namespace tessera

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  Eigen::setNbThreads(1);
  if (!absl::GetFlag(FLAGS_mutex_deadlock_detection)) {
    absl::SetMutexDeadlockDetectionMode(absl::OnDeadlockCycle::kIgnore);
  }
#if defined(EIGEN_VECTORIZE_AVX2) && defined(EIGEN_VECTORIZE_FMA)
  const char* simd = "AVX2+FMA";
#elif defined(EIGEN_VECTORIZE_AVX)
  const char* simd = "AVX";
#else
  const char* simd = "SSE or none";
#endif
  std::printf(
      "train_throughput: one training step (forward + backward + SGD), 1 thread; "
      "Eigen %d.%d.%d, %s\n",
      EIGEN_WORLD_VERSION, EIGEN_MAJOR_VERSION, EIGEN_MINOR_VERSION, simd);
  auto registry = tessera::NewStandardOpRegistry();
  const std::string only = absl::GetFlag(FLAGS_only);
  const std::vector<tessera::MlpConfig> configs = {
      {"mnist", 784, 512, 10, 256, true},
      {"regression", 10, 100, 1, 32, false},
      {"regression", 10, 100, 1, 256, false},
  };
  for (const auto& c : configs) {
    const int64_t batch = absl::GetFlag(FLAGS_batch);
    if ((only.empty() || only == c.name) && (batch == 0 || batch == c.batch)) {
      tessera::Run(c, registry.get());
    }
  }
  return 0;
}
