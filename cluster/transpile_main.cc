// tessera_transpile: shows what the transpiler makes of a model for a cluster, as the daemons
// would derive it (same flags, same environment variables, same LoadModel + transpiler config).
//
//   tessera_transpile --example=ctr --pservers=a:1,b:2 --trainers=2 [--out_dir=DIR]
//   tessera_transpile --program=main.pbtxt --startup_program=startup.pbtxt --pservers=...
//
// Prints a summary (per pserver: the parameter blocks it holds, with their shapes and rows) and
// writes every program as a text proto that ParseProgramText (and --program of the daemons and
// of tessera_program) reads back:
//   trainer.pbtxt, trainer_startup.pbtxt, pserver_<i>.pbtxt, pserver_<i>_startup.pbtxt
// where i is the pserver's position in --pservers (DIR is created if missing). Without --out_dir
// the programs follow the summary on stdout, each after a "# ==== <file name> ====" comment line.
// Any other flag of the daemons is accepted (--trainer_id, --sync_mode, --split_method,
// --slice_var_up,
// --min_block_size, ...; --help lists them).
//
// Exit status: 0 on success; 2 for a bad flag (one line on stderr); 1 when the model cannot be
// built, transpiled or written (one line on stderr).
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/config/daemon_flags.h"
#include "common/ops/ops.h"
#include "common/framework/program_io.h"
#include "common/framework/tensor.h"
#include "cluster/cluster_programs.h"
#include "transpiler/distribute_transpiler.h"

namespace tessera {
namespace {

constexpr char kProgram[] = "tessera_transpile";

struct NamedProgram {
  std::string file;  // e.g. "pserver_0_startup.pbtxt"
  const ProgramDesc* program;
};

std::string Shape(const std::vector<int64_t>& dims) { return ShapeString(dims); }

// Summary of the split: the cluster, then per pserver its parameter blocks.
std::string Summary(const ClusterConfig& config, const DistributeTranspiler& t,
                    const ModelSpec& model) {
  std::string out = absl::StrFormat(
      "%s: example %s%s, %d pserver(s), %d trainer(s), %s mode, split %s, slice_var_up %s, "
      "min_block_size %d, tables %s%s\n",
      kProgram, config.example,
      config.program.empty() ? "" : absl::StrCat(" (program ", config.program, ")"),
      config.pservers.size(), config.trainers, config.sync_mode ? "sync" : "async",
      config.split_method, config.slice_var_up ? "on" : "off", config.min_block_size,
      config.table_placement, config.fuse_tables ? ", fuse_tables on" : "");
  std::map<std::string, std::vector<const VarBlock*>> by_endpoint;
  for (const auto& b : t.param_blocks()) by_endpoint[b.endpoint].push_back(&b);
  for (size_t i = 0; i < config.pservers.size(); ++i) {
    const std::string& ep = config.pservers[i];
    const auto& blocks = by_endpoint[ep];
    int64_t elements = 0;
    for (const VarBlock* b : blocks) elements += NumElements(b->shape);
    std::vector<const OpDesc*> tables;
    absl::StatusOr<ProgramDesc> program = t.GetPserverProgram(ep);
    if (program.ok()) {
      for (const OpDesc& op : program->blocks(0).ops()) {
        if (op.type() == "sparse_table") tables.push_back(&op);
      }
    }
    absl::StrAppendFormat(&out,
                          "pserver %d %s: %d parameter block(s), %d elements, %d table shard(s)\n",
                          i, ep, blocks.size(), elements, tables.size());
    for (const VarBlock* b : blocks) {
      const VarDesc* v = FindVarDesc(model.main.blocks(0), b->var);
      std::vector<int64_t> full = v == nullptr
                                      ? std::vector<int64_t>{}
                                      : std::vector<int64_t>(v->shape().begin(), v->shape().end());
      if (b->name == b->var) {
        absl::StrAppendFormat(&out, "  %-28s %s (whole)\n", b->name, Shape(b->shape));
      } else {
        absl::StrAppendFormat(&out, "  %-28s %s rows [%d, %d) of %s %s\n", b->name, Shape(b->shape),
                              b->begin_row, b->begin_row + b->num_rows, b->var, Shape(full));
      }
    }
    for (const OpDesc* op : tables) {
      const std::string group = GetStringAttr(*op, "group", "");
      absl::StrAppendFormat(&out, "  %-28s table shard %d of %d, dim %d%s\n",
                            GetStringAttr(*op, "table", ""), GetIntAttr(*op, "shard", 0),
                            GetIntAttr(*op, "num_shards", 0), GetIntAttr(*op, "dim", 0),
                            group.empty() ? "" : absl::StrCat(", in ", group));
    }
  }
  const ProgramDesc& tp = t.trainer_program();
  absl::StrAppendFormat(&out, "trainer %d: %d ops in the main program, %d in startup\n",
                        config.trainer_id, tp.blocks(0).ops_size(),
                        t.trainer_startup_program().blocks(0).ops_size());
  return out;
}

int BadFlag(const std::string& message) {
  std::fprintf(stderr, "%s: %s (--help lists the flags)\n", kProgram, message.c_str());
  return 2;
}

int Fail(const absl::Status& s) {
  std::fprintf(stderr, "%s: %s\n", kProgram, std::string(s.message()).c_str());
  return 1;
}

int Main(int argc, char** argv) {
  // --out_dir is this tool's own flag; everything else goes to the daemons' parser.
  std::optional<std::string> out_dir;
  std::vector<char*> rest = {argv[0]};
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--out_dir" || absl::StartsWith(arg, "--out_dir=")) {
      if (arg == "--out_dir") {
        if (i + 1 >= argc) return BadFlag("flag --out_dir needs a value");
        out_dir = argv[++i];
      } else {
        out_dir = arg.substr(std::string("--out_dir=").size());
      }
      if (out_dir->empty()) return BadFlag("flag --out_dir needs a directory");
      continue;
    }
    rest.push_back(argv[i]);
  }
  const EnvLookup env = ProcessEnvironment();
  absl::StatusOr<ClusterConfig> config =
      ParseDaemonArgs(static_cast<int>(rest.size()), rest.data(), env, "trainer");
  if (!config.ok()) {
    if (config.status().code() == absl::StatusCode::kNotFound) {  // --help
      std::cout << "Usage: " << kProgram
                << " [--out_dir=DIR] [daemon flags: --example, --program, --startup_program, "
                   "--pservers, --trainers, ...]\n"
                << config.status().message();
      return 0;
    }
    return BadFlag(std::string(config.status().message()));
  }
  if (config->mode != "pserver") {
    return BadFlag(absl::StrCat("--mode=", config->mode,
                                " has no pserver programs to show (use --mode=pserver)"));
  }

  auto registry = NewStandardOpRegistry();
  absl::StatusOr<ModelSpec> model = LoadModel(*config, *registry);
  if (!model.ok()) return Fail(model.status());
  absl::StatusOr<DistributeTranspiler> t = DistributeTranspiler::Transpile(
      model->main, model->startup, TranspilerConfigFor(*config, config->trainer_id));
  if (!t.ok()) return Fail(t.status());

  std::vector<ProgramDesc> pserver_programs;
  pserver_programs.reserve(2 * config->pservers.size());
  std::vector<NamedProgram> programs = {{"trainer.pbtxt", &t->trainer_program()},
                                        {"trainer_startup.pbtxt", &t->trainer_startup_program()}};
  for (size_t i = 0; i < config->pservers.size(); ++i) {
    auto main = t->GetPserverProgram(config->pservers[i]);
    if (!main.ok()) return Fail(main.status());
    auto startup = t->GetPserverStartupProgram(config->pservers[i]);
    if (!startup.ok()) return Fail(startup.status());
    pserver_programs.push_back(*std::move(main));
    pserver_programs.push_back(*std::move(startup));
  }
  for (size_t i = 0; i < config->pservers.size(); ++i) {
    programs.push_back({absl::StrCat("pserver_", i, ".pbtxt"), &pserver_programs[2 * i]});
    programs.push_back(
        {absl::StrCat("pserver_", i, "_startup.pbtxt"), &pserver_programs[2 * i + 1]});
  }

  std::cout << Summary(*config, *t, *model);
  if (out_dir.has_value()) {
    std::error_code ec;
    std::filesystem::create_directories(*out_dir, ec);
    if (ec) {
      return Fail(absl::UnavailableError(
          absl::StrCat("cannot create --out_dir ", *out_dir, ": ", ec.message())));
    }
    for (const auto& p : programs) {
      const std::string path = absl::StrCat(*out_dir, "/", p.file);
      absl::Status s = WriteProgramFile(*p.program, path);
      if (!s.ok()) return Fail(s);
    }
    std::cout << "wrote " << programs.size() << " programs to " << *out_dir << ": "
              << absl::StrJoin(programs, ", ",
                               [](std::string* o, const NamedProgram& p) { o->append(p.file); })
              << "\n";
  } else {
    for (const auto& p : programs) {
      std::cout << "# ==== " << p.file << " ====\n" << ProgramToText(*p.program);
    }
  }
  std::cout.flush();
  if (!std::cout) {
    std::fprintf(stderr, "%s: cannot write to stdout\n", kProgram);
    return 1;
  }
  return 0;
}

}  // namespace
}  // namespace tessera

int main(int argc, char** argv) { return tessera::Main(argc, argv); }
