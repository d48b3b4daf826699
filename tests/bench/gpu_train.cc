// Training throughput on a GPU against the CPU: the MLP 784-512-10 (ReLU, softmax cross
// entropy, SGD) through LocalTrainer — feeding, every op, and the per-step fetch of the loss —
// with the trainer's --device=gpu placement (GPU kernels, cuBLAS) or the CPU kernels.
// Built with --config=cuda only:
//
//   bazel run --config=cuda //tests/bench:gpu_train -- [--examples=16384] [--batch_size=256]
//
// Prints samples/s per device and the speedup; without a GPU it prints SKIPPED for the GPU
// row. Synthetic data: 784 uniform features, 10 classes from a fixed random linear teacher.
#include <cstdio>
#include <random>
#include <sstream>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "common/data/example.h"
#include "common/device/cuda/cuda_device.h"
#include "common/device/placement.h"
#include "common/layers/layers.h"
#include "common/layers/optimizer.h"
#include "common/layers/program_builder.h"
#include "common/ops/ops.h"
#include "trainer/device_setup.h"
#include "trainer/local_trainer.h"

ABSL_FLAG(int64_t, examples, 16384, "Synthetic training examples per epoch.");
ABSL_FLAG(int64_t, batch_size, 256, "Batch size.");
ABSL_FLAG(int, epochs, 3, "Epochs; the first (warm-up: allocator, cuBLAS) is not reported.");

namespace tessera {
namespace {

ModelSpec Mlp(const OpRegistry& registry) {
  ModelSpec m;
  ProgramBuilder b(&m.main, &m.startup);
  std::string x = layers::Data(b, "x", {-1, 784});
  std::string y = layers::Data(b, "y", {-1, 1}, INT64);
  layers::FcOptions hidden;
  hidden.name = "hidden";
  hidden.act = "relu";
  layers::FcOptions out;
  out.name = "out";
  std::string logits = layers::Fc(b, layers::Fc(b, x, 512, hidden), 10, out);
  m.loss = layers::Mean(b, layers::SoftmaxWithCrossEntropy(b, logits, y));
  OptimizerOptions o;
  o.learning_rate = 0.01f;
  auto pairs = SGD(o).Minimize(b, registry, m.loss);
  if (!pairs.ok()) std::fprintf(stderr, "%s\n", pairs.status().ToString().c_str());
  m.feeds.dense = "x";
  m.feeds.num_dense = 784;
  m.feeds.label = "y";
  m.feeds.label_dtype = INT64;
  return m;
}

data::Dataset Data(int64_t n) {
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> u(0.0f, 1.0f);
  std::normal_distribution<float> g(0.0f, 1.0f);
  std::vector<float> teacher(784 * 10);
  for (float& w : teacher) w = g(rng);
  data::Dataset d;
  d.num_dense = 784;
  for (int64_t i = 0; i < n; ++i) {
    data::Example e;
    e.dense.resize(784);
    for (float& v : e.dense) v = u(rng);
    int best = 0;
    float best_score = -1e30f;
    for (int c = 0; c < 10; ++c) {
      float s = 0;
      for (int j = 0; j < 784; ++j) s += e.dense[j] * teacher[j * 10 + c];
      if (s > best_score) {
        best_score = s;
        best = c;
      }
    }
    e.label = static_cast<float>(best);
    d.examples.push_back(std::move(e));
  }
  return d;
}

// Samples/s of the epochs after the first; < 0 on error.
double Measure(const std::string& device, const data::Dataset& data, double* final_loss) {
  auto registry = NewStandardOpRegistry();
  ModelSpec model = Mlp(*registry);
  std::ostringstream log;
  LocalTrainerOptions lo;
  lo.batch_size = absl::GetFlag(FLAGS_batch_size);
  lo.epochs = 1;
  lo.log_every_steps = 0;
  lo.log = &log;
  auto plan = PlanTrainerDevices(device, "", *registry, model, &lo);
  if (!plan.ok()) {
    std::printf("%-4s SKIPPED: %s\n", device.c_str(), plan.status().ToString().c_str());
    return -1;
  }
  auto trainer = LocalTrainer::Create(plan->executor_registry(registry.get()), model, lo);
  if (!trainer.ok()) {
    std::printf("%-4s error: %s\n", device.c_str(), trainer.status().ToString().c_str());
    return -1;
  }
  double samples = 0, seconds = 0;
  for (int e = 0; e < absl::GetFlag(FLAGS_epochs); ++e) {
    auto stats = (*trainer)->Train(data);
    if (!stats.ok()) {
      std::printf("%-4s error: %s\n", device.c_str(), stats.status().ToString().c_str());
      return -1;
    }
    *final_loss = stats->back().mean_loss;
    if (e == 0) continue;
    samples += static_cast<double>(stats->back().samples);
    seconds += stats->back().seconds;
  }
  return seconds > 0 ? samples / seconds : -1;
}

}  // namespace
}  // namespace tessera

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  const tessera::data::Dataset data = tessera::Data(absl::GetFlag(FLAGS_examples));
  std::printf("MLP 784-512-10, batch %lld, %lld examples/epoch, %d epochs (first not timed)\n",
              static_cast<long long>(absl::GetFlag(FLAGS_batch_size)),
              static_cast<long long>(absl::GetFlag(FLAGS_examples)), absl::GetFlag(FLAGS_epochs));
  double cpu_loss = 0, gpu_loss = 0;
  const double cpu = tessera::Measure("cpu", data, &cpu_loss);
  if (cpu > 0) std::printf("cpu  %10.0f samples/s  (last epoch loss %.4f)\n", cpu, cpu_loss);
  if (tessera::CudaDeviceCount() == 0) {
    std::printf("gpu  SKIPPED: no CUDA device\n");
    return 0;
  }
  const double gpu = tessera::Measure("gpu", data, &gpu_loss);
  if (gpu > 0) {
    std::printf("gpu  %10.0f samples/s  (last epoch loss %.4f)\n", gpu, gpu_loss);
    if (cpu > 0) std::printf("speedup %.1fx\n", gpu / cpu);
  }
  return 0;
}
