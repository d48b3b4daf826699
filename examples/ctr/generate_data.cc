// generate_data: writes synthetic Criteo-format click data (see common/data/synthetic.h).
//
//   generate_data --out=/tmp/train.txt --examples=100000 --seed=1
//   generate_data --out=/tmp/test.txt  --examples=20000  --seed=2   # held-out, same model
//
// Each line: a 0/1 label, 13 dense counts and 26 categorical ids (16 hex digits), tab-separated.
// Ids in each slot are Zipf-distributed ranks mapped over all of int64; the label is drawn from
// a planted logistic model fixed by --model_seed, so files generated with the same --model_seed
// and different --seed are a training set and a held-out set of one task. The same flags give
// the same bytes on every machine. The file is written atomically.
//
// Exit status: 0 on success, 2 for a bad flag (one line on stderr), 1 when writing fails.
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/commandlineflag.h"
#include "absl/flags/flag.h"
#include "absl/flags/reflection.h"
#include "absl/status/status.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/data/criteo.h"
#include "common/data/example.h"
#include "common/data/synthetic.h"

ABSL_FLAG(std::string, out, "", "Output file (required); replaced atomically.");
ABSL_FLAG(int64_t, examples, 100000, "Number of examples to write (>= 0).");
ABSL_FLAG(int64_t, vocab_per_slot, 1000000, "Distinct ids per categorical slot, 1 .. 2^40.");
ABSL_FLAG(double, alpha, 1.1, "Zipf exponent of the id distribution (> 0).");
ABSL_FLAG(uint64_t, seed, 1, "Seed of the examples drawn.");
ABSL_FLAG(uint64_t, model_seed, 0,
          "Seed of the planted model; keep it equal for a training set and its test set.");
ABSL_FLAG(int, num_dense, 13, "Dense count features per example (>= 0).");
ABSL_FLAG(int, num_sparse, 26, "Categorical slots per example (0 .. 65536).");
ABSL_FLAG(int, multi_hot_slots, 0,
          "Multi-hot slots per example (0 .. 65536 - num_sparse), written after the categorical "
          "ones as ','-separated id lists of 0 .. --max_multi_ids ids.");
ABSL_FLAG(int, max_multi_ids, 4, "Most ids of a multi-hot slot's list (0 .. 1000).");
ABSL_FLAG(std::string, format, "criteo", "Output format; only 'criteo'.");

namespace {

namespace data = tessera::data;

constexpr const char* kFlagNames[] = {"out",         "examples",        "vocab_per_slot",
                                      "alpha",       "seed",            "model_seed",
                                      "num_dense",   "num_sparse",      "multi_hot_slots",
                                      "max_multi_ids", "format"};

void PrintUsage() {
  std::printf("usage: generate_data --out=FILE [--name=value ...]\n");
  for (const char* name : kFlagNames) {
    const absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    std::printf("  --%s (default '%s'): %s\n", name, flag->DefaultValue().c_str(),
                flag->Help().c_str());
  }
}

// Sets the flags above from --name=value arguments. absl::ParseCommandLine would exit with
// status 1 on a bad value; Tessera tools answer a bad flag with one line and status 2, so each
// value goes through the flag's own parser here. Returns "" or the error line.
std::string SetFlags(int argc, char** argv, bool* help) {
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--help" || arg == "-h" || arg == "--helpfull") {
      *help = true;
      return "";
    }
    if (!absl::StartsWith(arg, "--")) return absl::StrCat("unexpected argument '", arg, "'");
    const size_t eq = arg.find('=');
    const std::string name = arg.substr(2, eq == std::string::npos ? std::string::npos : eq - 2);
    bool known = false;
    for (const char* n : kFlagNames) known = known || name == n;
    absl::CommandLineFlag* flag = known ? absl::FindCommandLineFlag(name) : nullptr;
    if (flag == nullptr) return absl::StrCat("unknown flag --", name, " (see --help)");
    if (eq == std::string::npos)
      return absl::StrCat("--", name, " needs a value: --", name, "=...");
    const std::string value = arg.substr(eq + 1);
    std::string error;
    if (!flag->ParseFrom(value, &error)) {
      return absl::StrCat("--", name, "='", value, "': ", error);
    }
  }
  return "";
}

// The error line for flag values out of range, or "".
std::string CheckFlags() {
  if (absl::GetFlag(FLAGS_out).empty()) return "--out is required (the file to write)";
  if (absl::GetFlag(FLAGS_examples) < 0) {
    return absl::StrCat("--examples must be >= 0, got ", absl::GetFlag(FLAGS_examples));
  }
  const int64_t vocab = absl::GetFlag(FLAGS_vocab_per_slot);
  if (vocab < 1 || vocab > (int64_t{1} << 40)) {
    return absl::StrCat("--vocab_per_slot must be in [1, 2^40], got ", vocab);
  }
  const double alpha = absl::GetFlag(FLAGS_alpha);
  if (!(alpha > 0) || !std::isfinite(alpha)) {
    return absl::StrCat("--alpha must be finite and > 0, got ", alpha);
  }
  if (absl::GetFlag(FLAGS_num_dense) < 0) {
    return absl::StrCat("--num_dense must be >= 0, got ", absl::GetFlag(FLAGS_num_dense));
  }
  if (absl::GetFlag(FLAGS_num_sparse) < 0 || absl::GetFlag(FLAGS_num_sparse) > 65536) {
    return absl::StrCat("--num_sparse must be in [0, 65536], got ",
                        absl::GetFlag(FLAGS_num_sparse));
  }
  if (absl::GetFlag(FLAGS_format) != "criteo") {
    return absl::StrCat("--format='", absl::GetFlag(FLAGS_format),
                        "' is not supported (supported: criteo)");
  }
  return "";
}

int Fail(const absl::Status& status) {
  std::fprintf(stderr, "generate_data: %s\n", std::string(status.message()).c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  bool help = false;
  std::string error = SetFlags(argc, argv, &help);
  if (help) {
    PrintUsage();
    return 0;
  }
  if (error.empty()) error = CheckFlags();
  if (!error.empty()) {
    std::fprintf(stderr, "generate_data: %s\n", error.c_str());
    return 2;
  }

  data::CtrDataOptions options;
  options.num_dense = absl::GetFlag(FLAGS_num_dense);
  options.num_sparse = absl::GetFlag(FLAGS_num_sparse);
  options.vocab_per_slot = absl::GetFlag(FLAGS_vocab_per_slot);
  options.alpha = absl::GetFlag(FLAGS_alpha);
  options.seed = absl::GetFlag(FLAGS_seed);
  options.model_seed = absl::GetFlag(FLAGS_model_seed);
  options.num_multi = absl::GetFlag(FLAGS_multi_hot_slots);
  options.max_multi_ids = absl::GetFlag(FLAGS_max_multi_ids);
  absl::StatusOr<data::CtrGenerator> generator = data::CtrGenerator::Create(options);
  if (!generator.ok()) {
    std::fprintf(stderr, "generate_data: %s\n", std::string(generator.status().message()).c_str());
    return 2;
  }

  const std::string out = absl::GetFlag(FLAGS_out);
  const int64_t n = absl::GetFlag(FLAGS_examples);
  absl::PrintF(
      "generate_data: %d examples (%d dense counts, %d categorical slots of %d Zipf(%g) ids, %d "
      "multi-hot slots; seed %d, model_seed %d) -> %s\n",
      n, options.num_dense, options.num_sparse, options.vocab_per_slot, options.alpha,
      options.num_multi, options.seed, options.model_seed, out);
  std::fflush(stdout);

  const auto start = std::chrono::steady_clock::now();
  absl::StatusOr<std::unique_ptr<data::CriteoWriter>> writer =
      data::CriteoWriter::Open(out, options.num_dense, options.num_sparse, options.num_multi);
  if (!writer.ok()) return Fail(writer.status());
  data::Example example;
  int64_t positives = 0;
  for (int64_t i = 0; i < n; ++i) {
    generator->Next(&example);
    positives += example.label == 1.0f;
    absl::Status s = (*writer)->Write(example);
    if (!s.ok()) return Fail(s);
  }
  absl::Status s = (*writer)->Close();
  if (!s.ok()) return Fail(s);
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  absl::PrintF("generate_data: wrote %d examples, %.1f%% positive, in %.1f s\n", n,
               n == 0 ? 0.0 : 100.0 * static_cast<double>(positives) / static_cast<double>(n),
               seconds);
  return 0;
}
