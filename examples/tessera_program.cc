// tessera_program: writes an example's programs as text protos and prints a readable summary,
// or summarizes an existing program file.
//
//   tessera_program --example=mlp_regression|ctr|fashion_mnist_mlp|lenet [--out=main.pbtxt]
//                   [--startup_out=startup.pbtxt] [--model_out=model.pbtxt] [--distributed]
//   tessera_program --program=file.pbtxt
//
// --model_out writes the example's model file (proto/model.proto: forward program, feeds,
// optimizer), which every runner loads with --model. The summary lists every variable (shape, dtype, persistable / trainable / sparse /
// distributed / stop_gradient flags) and every op in order with its role. Exit status: 0 on
// success, 2 for a bad flag (one line on stderr), 1 when a file cannot be read, parsed or
// written.
#include <algorithm>
#include <cstdio>
#include <iostream>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/framework/op_desc.h"
#include "common/ops/ops.h"
#include "common/framework/program_io.h"
#include "common/framework/tensor.h"
#include "common/layers/model_file.h"
#include "examples/registry.h"
#include "common/framework/model_spec.h"

namespace {

constexpr char kUsage[] =
    "usage: tessera_program --example=mlp_regression|ctr|fashion_mnist_mlp|lenet [--out=main.pbtxt] "
    "[--startup_out=startup.pbtxt] [--model_out=model.pbtxt] [--distributed] | "
    "--program=file.pbtxt | --list_ops (the op types the standard registry has kernels for, "
    "one per line)";

struct Flags {
  std::string example;
  std::string out;
  std::string startup_out;
  std::string model_out;
  std::string program;
  bool distributed = false;
};

// Parses --name=value flags; an error message (one line) on anything else.
absl::StatusOr<Flags> ParseFlags(int argc, char** argv) {
  Flags f;
  std::map<std::string, std::string*> string_flags = {{"example", &f.example},
                                                      {"out", &f.out},
                                                      {"startup_out", &f.startup_out},
                                                      {"model_out", &f.model_out},
                                                      {"program", &f.program}};
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (!absl::StartsWith(arg, "--")) {
      return absl::InvalidArgumentError(absl::StrCat("unexpected argument '", arg, "'"));
    }
    std::string name = arg.substr(2), value;
    const size_t eq = name.find('=');
    const bool has_value = eq != std::string::npos;
    if (has_value) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
    }
    if (name == "distributed") {
      if (has_value && value != "true" && value != "false") {
        return absl::InvalidArgumentError(
            absl::StrCat("--distributed takes true or false, got '", value, "'"));
      }
      f.distributed = !has_value || value == "true";
      continue;
    }
    auto it = string_flags.find(name);
    if (it == string_flags.end()) {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag --", name));
    }
    if (!has_value || value.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", name, " needs a value (--", name, "=...)"));
    }
    *it->second = value;
  }
  if (f.example.empty() == f.program.empty()) {
    return absl::InvalidArgumentError("give exactly one of --example and --program");
  }
  if (!f.program.empty() &&
      (!f.out.empty() || !f.startup_out.empty() || !f.model_out.empty() || f.distributed)) {
    return absl::InvalidArgumentError(
        "--out, --startup_out, --model_out and --distributed go with --example, not --program");
  }
  const std::vector<std::string> known = tessera::examples::ExampleNames();
  if (!f.example.empty() && std::find(known.begin(), known.end(), f.example) == known.end()) {
    return absl::InvalidArgumentError(absl::StrCat("unknown example '", f.example, "' (known: ",
                                                   absl::StrJoin(known, ", "), ")"));
  }
  if (f.distributed && f.example != "ctr") {
    return absl::InvalidArgumentError("--distributed applies only to --example=ctr");
  }
  return f;
}

std::string RoleName(int64_t role) {
  if (role == tessera::kRoleForward) return "forward";
  std::vector<std::string> parts;
  const std::pair<int64_t, const char*> names[] = {
      {tessera::kRoleBackward, "backward"}, {tessera::kRoleOptimize, "optimize"},
      {tessera::kRoleRPC, "rpc"},           {tessera::kRoleDist, "dist"},
      {tessera::kRoleLRSched, "lr_sched"},  {tessera::kRoleLoss, "loss"}};
  int64_t rest = role;
  for (const auto& [bit, name] : names) {
    if ((role & bit) != 0) {
      parts.push_back(name);
      rest &= ~bit;
    }
  }
  if (rest != 0) parts.push_back(absl::StrCat("0x", absl::Hex(rest)));
  if ((role & ~tessera::kRoleLoss) == 0) parts.insert(parts.begin(), "forward");
  return absl::StrJoin(parts, "|");
}

std::string VarTypeName(tessera::VarType t) {
  switch (t) {
    case tessera::DENSE_TENSOR:
      return "";
    case tessera::SELECTED_ROWS:
      return "selected_rows ";
    default:
      return "raw ";
  }
}

std::string VarLine(const tessera::VarDesc& v) {
  std::vector<std::string> flags;
  if (v.persistable()) flags.push_back("persistable");
  if (v.trainable()) flags.push_back("trainable");
  if (v.is_sparse()) flags.push_back("sparse");
  if (v.is_distributed()) flags.push_back("distributed");
  if (v.stop_gradient()) flags.push_back("stop_gradient");
  std::string shape =
      tessera::ShapeString(std::vector<int64_t>(v.shape().begin(), v.shape().end()));
  return absl::StrFormat("  %-28s %s%s%s%s", v.name(), VarTypeName(v.type()),
                         tessera::DataTypeName(v.dtype()), shape,
                         flags.empty() ? "" : absl::StrCat("  ", absl::StrJoin(flags, " ")));
}

void PrintSummary(const std::string& title, const tessera::ProgramDesc& program) {
  std::cout << absl::StrFormat("== %s: %d block(s), random_seed %d\n", title, program.blocks_size(),
                               program.random_seed());
  for (const auto& block : program.blocks()) {
    std::cout << absl::StrFormat("block %d (parent %d): %d variables, %d ops\n", block.idx(),
                                 block.parent_idx(), block.vars_size(), block.ops_size());
    std::cout << "variables:\n";
    for (const auto& v : block.vars()) std::cout << VarLine(v) << "\n";
    std::cout << "ops:\n";
    for (int i = 0; i < block.ops_size(); ++i) {
      const tessera::OpDesc& op = block.ops(i);
      std::cout << absl::StrFormat("  #%-4d %-17s %s\n", i,
                                   absl::StrCat("[", RoleName(tessera::OpRoleOf(op)), "]"),
                                   tessera::OpSignature(op));
    }
  }
}

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "tessera_program: %s\n", std::string(s.message()).c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    if (std::string(argv[i]) == "--help" || std::string(argv[i]) == "-h") {
      std::cout << kUsage << "\n";
      return 0;
    }
  }
  if (argc == 2 && std::string(argv[1]) == "--list_ops") {
    // python/tessera's REGISTERED_OPS is held to this list (python/tests/test_examples.py).
    for (const std::string& type : tessera::NewStandardOpRegistry()->Types()) {
      std::cout << type << "\n";
    }
    return 0;
  }
  absl::StatusOr<Flags> flags = ParseFlags(argc, argv);
  if (!flags.ok()) {
    std::fprintf(stderr, "tessera_program: %s; %s\n", std::string(flags.status().message()).c_str(),
                 kUsage);
    return 2;
  }

  if (!flags->program.empty()) {
    auto program = tessera::ReadProgramFile(flags->program);
    if (!program.ok()) return Fail(program.status());
    PrintSummary(flags->program, *program);
    return 0;
  }

  auto registry = tessera::NewStandardOpRegistry();
  absl::StatusOr<tessera::ModelFile> model = tessera::examples::ExampleModelFile(flags->example);
  if (!model.ok()) return Fail(model.status());
  tessera::ModelOverrides overrides;
  overrides.distributed_tables = flags->distributed;
  *model = tessera::ApplyOverrides(std::move(*model), overrides);
  if (!flags->model_out.empty()) {
    absl::Status s = tessera::WriteModelFile(*model, flags->model_out);
    if (!s.ok()) return Fail(s);
    std::cout << "wrote the model file to " << flags->model_out << "\n";
  }
  absl::StatusOr<tessera::ModelSpec> spec =
      tessera::CompileModel(*model, *registry, absl::StrCat("example ", flags->example));
  if (!spec.ok()) return Fail(spec.status());
  std::cout << absl::StrFormat("example %s: loss %s, prediction %s\n", flags->example, spec->loss,
                               spec->prediction.empty() ? "(none)" : spec->prediction);
  PrintSummary("main program", spec->main);
  PrintSummary("startup program", spec->startup);
  if (!flags->out.empty()) {
    absl::Status s = tessera::WriteProgramFile(spec->main, flags->out);
    if (!s.ok()) return Fail(s);
    std::cout << "wrote the main program to " << flags->out << "\n";
  }
  if (!flags->startup_out.empty()) {
    absl::Status s = tessera::WriteProgramFile(spec->startup, flags->startup_out);
    if (!s.ok()) return Fail(s);
    std::cout << "wrote the startup program to " << flags->startup_out << "\n";
  }
  return 0;
}
