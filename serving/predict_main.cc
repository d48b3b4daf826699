// tessera_predict: batch scoring of data files with an inference bundle (README "Serving").
//
//   tessera_predict --bundle=EXPORT_DIR --data=FILE[,FILE...] --out=PREDICTIONS
//
// Reads the data with the readers of training, as the bundle's job read its data (its
// --data_format, --float_dense and --csv_columns, unless overridden here), scores it in batches
// of the job's batch size (serving/predictor.h: the trainer's held-out evaluation), writes one
// prediction per example (%.9g, one a line, in the data's order) to --out atomically, and prints
// one line:
//   tessera_predict: N examples in S s (R examples/s, 1 thread); loss L auc A (export-..., step K)
// (the AUC when the model's metrics ask for one and the labels hold both classes).
// Exit status: 0 done; 2 bad flags (an --out whose directory is missing included), an unreadable
// or damaged bundle, unreadable data or data the model cannot take; 1 writing --out failed.
// Every error is one line on stderr.
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/internal/program_name.h"
#include "absl/flags/internal/usage.h"
#include "absl/flags/reflection.h"
#include "absl/flags/usage.h"
#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "common/base/malloc_tuning.h"
#include "common/base/mutex_tuning.h"
#include "common/data/criteo.h"
#include "common/data/formats.h"
#include "common/io/file_system.h"
#include "serving/predictor.h"

ABSL_FLAG(std::string, bundle, "",
          "Required. The inference bundle: an export-<step> directory, or the --export_dir of a "
          "job (its newest complete export), with every export its delta chain needs.");
ABSL_FLAG(std::string, data, "",
          "Required. The data to score: a file, or a comma-separated list of files, directories "
          "and glob patterns (plain or gzip), read as training reads --test_data.");
ABSL_FLAG(std::string, out, "",
          "Required. Where the predictions go: one per scored example, in order, as %.9g; "
          "written atomically (a temporary file renamed over it).");
ABSL_FLAG(int64_t, batch_size, 0,
          "Examples per program run; 0 = the batch size the bundle's job trained with (the "
          "trainer evaluates in batches of it, so the loss matches its held-out loss).");
ABSL_FLAG(int64_t, max_bad_lines, 0,
          "Malformed data lines to skip (reported) before failing; skipped lines get no "
          "prediction.");
ABSL_FLAG(std::string, data_format, "",
          "criteo | csv | libsvm | multislot | idx; \"\" = the format the bundle's job read "
          "(criteo for a job on synthetic data).");
ABSL_FLAG(std::string, float_dense, "",
          "criteo: true = the dense fields are decimal floats taken as they are, false = counts "
          "stored as log(1 + count); \"\" = as the bundle's job read them.");
ABSL_FLAG(std::string, csv_columns, "",
          "csv: which columns feed what, \"label=..;dense=..;slots=..;multi=..\"; \"\" = the "
          "bundle's job's.");

namespace {

constexpr char kProgram[] = "tessera_predict";
constexpr char kUsage[] =
    "scores data files with an inference bundle, one prediction per line.\n"
    "  tessera_predict --bundle=EXPORT_DIR --data=FILE[,FILE...] --out=PREDICTIONS [flags]\n"
    "Prints the examples/s and, as the trainer's held-out evaluation, the loss and AUC.\n"
    "Exit status: 0 done, 2 bad flags or inputs, 1 --out could not be written.";

// One line of stderr, prefixed with the program's name.
int Fail(int code, absl::string_view message) {
  std::string line = absl::StrReplaceAll(message, {{"\n", "; "}});
  std::fprintf(stderr, "%s: %s\n", kProgram, line.c_str());
  return code;
}

// Parses --name=value, --name value, and --name / --noname for booleans, into the flags of
// this file only. Returns -1 to go on, or the exit status (0 after --help, 2 on a bad flag).
int ParseFlags(int argc, char** argv) {
  absl::flags_internal::SetProgramInvocationName(kProgram);
  absl::SetProgramUsageMessage(kUsage);
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "-h" || absl::StartsWith(arg, "--help") || absl::StartsWith(arg, "-help")) {
      absl::flags_internal::FlagsHelp(std::cout, "predict_main.",
                                      absl::flags_internal::HelpFormat::kHumanReadable, kUsage);
      return 0;
    }
    if (arg.size() < 2 || arg[0] != '-') {
      return Fail(2, absl::StrCat("unexpected argument '", arg, "' (--help lists the flags)"));
    }
    std::string body = arg.substr(arg[1] == '-' ? 2 : 1);
    std::string name = body, value;
    const size_t eq = body.find('=');
    const bool has_value = eq != std::string::npos;
    if (has_value) {
      name = body.substr(0, eq);
      value = body.substr(eq + 1);
    }
    absl::CommandLineFlag* flag = absl::FindCommandLineFlag(name);
    const bool ours =
        flag != nullptr && flag->Filename().find("predict_main.") != std::string::npos;
    if (!ours && !has_value && name.rfind("no", 0) == 0) {
      absl::CommandLineFlag* negated = absl::FindCommandLineFlag(name.substr(2));
      if (negated != nullptr && negated->IsOfType<bool>() &&
          negated->Filename().find("predict_main.") != std::string::npos) {
        std::string error;
        negated->ParseFrom("false", &error);
        continue;
      }
    }
    if (!ours) {
      return Fail(2, absl::StrCat("unknown flag '", arg, "' (--help lists the flags)"));
    }
    if (!has_value) {
      if (flag->IsOfType<bool>()) {
        value = "true";
      } else if (i + 1 < argc) {
        value = argv[++i];
      } else {
        return Fail(2, absl::StrCat("--", name, " needs a value"));
      }
    }
    std::string error;
    if (!flag->ParseFrom(value, &error)) {
      return Fail(2, absl::StrCat("--", name, "=", value, ": ", error));
    }
  }
  return -1;
}

// "", "true" or "false" (and 1 / 0, yes / no) -> *value; false for anything else.
bool ParseOptionalBool(const std::string& text, bool dflt, bool* value) {
  const std::string t = absl::AsciiStrToLower(text);
  if (t.empty()) {
    *value = dflt;
  } else if (t == "true" || t == "1" || t == "yes") {
    *value = true;
  } else if (t == "false" || t == "0" || t == "no") {
    *value = false;
  } else {
    return false;
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  // As the daemons do (common/base/*_tuning.h): the scoring loop takes scope locks per op.
  tessera::TuneMallocForLargeBuffers();
  tessera::DisableMutexDeadlockDetection();
  if (int code = ParseFlags(argc, argv); code >= 0) return code;
  namespace data = tessera::data;
  const std::string bundle = absl::GetFlag(FLAGS_bundle);
  const std::string data_spec = absl::GetFlag(FLAGS_data);
  const std::string out_path = absl::GetFlag(FLAGS_out);
  for (const auto& [name, value] :
       {std::make_pair("bundle", &bundle), std::make_pair("data", &data_spec),
        std::make_pair("out", &out_path)}) {
    if (value->empty()) return Fail(2, absl::StrCat("--", name, " is required (--help)"));
  }
  const int64_t batch_size = absl::GetFlag(FLAGS_batch_size);
  if (batch_size < 0) {
    return Fail(2, absl::StrCat("--batch_size=", batch_size,
                                " must be >= 1 (or 0: the bundle's batch size)"));
  }
  const int64_t max_bad_lines = absl::GetFlag(FLAGS_max_bad_lines);
  if (max_bad_lines < 0) {
    return Fail(2, absl::StrCat("--max_bad_lines=", max_bad_lines, " must be >= 0"));
  }
  // The overrides are checked before the bundle is loaded.
  const std::string format_flag = absl::GetFlag(FLAGS_data_format);
  if (!format_flag.empty() && !data::ParseDataFormat(format_flag).ok()) {
    return Fail(2, absl::StrCat("--data_format=", format_flag,
                                " is not criteo, csv, libsvm, multislot or idx"));
  }
  const std::string float_dense_flag = absl::GetFlag(FLAGS_float_dense);
  bool float_dense = false;
  if (!ParseOptionalBool(float_dense_flag, false, &float_dense)) {
    return Fail(2, absl::StrCat("--float_dense=", float_dense_flag, " is not true, false or \"\""));
  }
  const std::string csv_flag = absl::GetFlag(FLAGS_csv_columns);
  if (!csv_flag.empty()) {
    auto csv = data::ParseCsvColumns(csv_flag);
    if (!csv.ok()) {
      return Fail(2, absl::StrCat("--csv_columns=", csv_flag, ": ", csv.status().message()));
    }
  }

  tessera::io::FileSystem* fs = tessera::io::PosixFileSystem::Default();
  const std::string out_dir = tessera::io::DirName(out_path);
  if (!out_dir.empty() && !fs->Exists(out_dir)) {
    return Fail(2, absl::StrCat("--out=", out_path, ": no directory ", out_dir));
  }
  tessera::PredictorOptions options;
  options.batch_size = batch_size;
  auto predictor = tessera::Predictor::Load(fs, bundle, options);
  if (!predictor.ok()) {
    return Fail(2, absl::StrCat("--bundle=", bundle, ": ", predictor.status().message()));
  }
  const tessera::io::BundleModel& model = (*predictor)->model();

  // How the job read its data (trainer/training_data.h, ReadOptionsFor), with the overrides.
  data::CriteoDataOptions read;
  const std::string format_name = !format_flag.empty()        ? format_flag
                                  : model.data_format.empty() ? "criteo"
                                                              : model.data_format;
  auto format = data::ParseDataFormat(format_name);
  if (!format.ok()) {
    return Fail(2, absl::StrCat("--bundle=", bundle, ": model.spec's data_format '", format_name,
                                "' is not a data format (use --data_format)"));
  }
  read.format = *format;
  read.float_dense = model.float_dense;
  if (!float_dense_flag.empty()) read.float_dense = float_dense;
  const std::string csv_spec = csv_flag.empty() ? model.csv_columns : csv_flag;
  auto csv = data::ParseCsvColumns(csv_spec);
  if (!csv.ok()) {
    return Fail(2, absl::StrCat("--bundle=", bundle, ": model.spec's csv_columns '", csv_spec,
                                "': ", csv.status().message(), " (use --csv_columns)"));
  }
  read.csv = *std::move(csv);
  if (read.format != data::DataFormat::kCriteo) {
    read.num_dense = model.feeds.num_dense;
    read.num_sparse = static_cast<int>(model.feeds.slots.size());
  }
  read.num_multi = static_cast<int>(model.feeds.multi_slots.size());
  read.max_bad_lines = max_bad_lines;
  data::CriteoReadStats read_stats;
  auto dataset = data::ReadCriteoData(data_spec, read, &read_stats);
  if (!dataset.ok()) return Fail(2, dataset.status().message());
  if (read_stats.bad_lines > 0) {
    std::cout << kProgram << ": skipped " << read_stats.bad_lines
              << " bad lines (--max_bad_lines=" << max_bad_lines
              << "); the first: " << read_stats.first_bad_line << std::endl;
  }
  if (dataset->examples.empty()) {
    return Fail(2, absl::StrCat("--data=", data_spec, " holds no example"));
  }

  std::string predictions;
  predictions.reserve(dataset->examples.size() * 12);
  auto scored = (*predictor)->Score(*dataset, [&](const data::Example&, double p) {
    absl::StrAppendFormat(&predictions, "%.9g\n", p);
  });
  if (!scored.ok()) {
    return Fail(2, absl::StrCat("scoring --data=", data_spec, ": ", scored.status().message()));
  }
  absl::Status written = tessera::io::WriteFileAtomic(fs, out_path, predictions);
  if (!written.ok()) {
    return Fail(1, absl::StrCat("--out=", out_path, ": ", written.message()));
  }
  const tessera::EvalResult& eval = scored->eval;
  std::string line =
      absl::StrFormat("%s: %d examples in %.3f s (%.0f examples/s, 1 thread); loss %.9f", kProgram,
                      eval.samples, scored->seconds, scored->examples_per_sec, eval.mean_loss);
  if (eval.has_auc) absl::StrAppendFormat(&line, " auc %.9f", eval.auc);
  if (eval.has_accuracy) absl::StrAppendFormat(&line, " accuracy %.9f", eval.accuracy);
  absl::StrAppendFormat(&line, " (%s, step %d)", (*predictor)->export_name(),
                        (*predictor)->meta().step);
  std::cout << line << std::endl;
  return 0;
}
