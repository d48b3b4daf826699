// tessera_transpile, run as a subprocess: the files it writes parse back (ParseProgramText) to
// exactly the programs the daemons derive in process, two runs write byte-identical files, the
// stdout form holds the same programs, a written program can be fed back in, and bad flags give
// one line and exit status 2.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "common/config/cluster_config.h"
#include "common/ops/ops.h"
#include "common/framework/program_io.h"
#include "gtest/gtest.h"
#include "cluster/cluster_programs.h"

namespace tessera {
namespace {

struct RunResult {
  int exit_code = -1;  // -1: killed by a signal or timed out
  std::string out, err;
};

std::string TmpDir() {
  const char* t = std::getenv("TEST_TMPDIR");
  return t != nullptr ? t : "/tmp";
}

std::string Binary() {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  const char* ws = std::getenv("TEST_WORKSPACE");
  return absl::StrCat(srcdir != nullptr ? srcdir : ".", "/", ws != nullptr ? ws : "tessera",
                      "/cluster/tessera_transpile");
}

std::string ReadAll(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Runs tessera_transpile with `args` and no TESSERA_*/PADDLE_* environment; kills it (by pid)
// after 60 s.
RunResult RunTool(const std::vector<std::string>& args) {
  static int counter = 0;
  const std::string base = absl::StrCat(TmpDir(), "/run_", counter++);
  const std::string out_path = base + ".out", err_path = base + ".err";
  std::vector<std::string> argv_s = {Binary()};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);
  char* envp[] = {nullptr};
  pid_t pid = fork();
  if (pid == 0) {
    int out = open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    int err = open(err_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (out < 0 || err < 0) _exit(127);
    dup2(out, 1);
    dup2(err, 2);
    execve(argv[0], argv.data(), envp);
    _exit(127);
  }
  RunResult r;
  EXPECT_GT(pid, 0);
  if (pid <= 0) return r;
  int status = 0;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  while (true) {
    pid_t w = waitpid(pid, &status, WNOHANG);
    if (w == pid) break;
    if (std::chrono::steady_clock::now() > deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      ADD_FAILURE() << "tessera_transpile did not finish in 60 s";
      return r;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  if (WIFEXITED(status)) r.exit_code = WEXITSTATUS(status);
  r.out = ReadAll(out_path);
  r.err = ReadAll(err_path);
  return r;
}

std::string Serialize(const ProgramDesc& p) {
  std::string s;
  EXPECT_TRUE(p.SerializeToString(&s));
  return s;
}

// The programs the daemons derive for `config`, by file name.
std::map<std::string, ProgramDesc> Expected(const ClusterConfig& config) {
  auto registry = NewStandardOpRegistry();
  auto t = TranspileFor(config, *registry, config.trainer_id);
  EXPECT_TRUE(t.ok()) << t.status();
  std::map<std::string, ProgramDesc> out;
  if (!t.ok()) return out;
  out["trainer.pbtxt"] = t->trainer_program();
  out["trainer_startup.pbtxt"] = t->trainer_startup_program();
  for (size_t i = 0; i < config.pservers.size(); ++i) {
    out[absl::StrCat("pserver_", i, ".pbtxt")] = *t->GetPserverProgram(config.pservers[i]);
    out[absl::StrCat("pserver_", i, "_startup.pbtxt")] =
        *t->GetPserverStartupProgram(config.pservers[i]);
  }
  return out;
}

std::vector<std::string> FilesIn(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(dir)) {
    names.push_back(e.path().filename().string());
  }
  std::sort(names.begin(), names.end());
  return names;
}

// Every expected file is in `dir`, parses, and equals the in-process program.
void ExpectFilesMatch(const std::string& dir, const std::map<std::string, ProgramDesc>& want) {
  std::vector<std::string> names;
  for (const auto& [name, p] : want) names.push_back(name);
  ASSERT_EQ(FilesIn(dir), names);
  for (const auto& [name, program] : want) {
    const std::string path = dir + "/" + name;
    auto parsed = ParseProgramText(ReadAll(path), path);
    ASSERT_TRUE(parsed.ok()) << parsed.status();
    EXPECT_TRUE(Serialize(*parsed) == Serialize(program)) << name << " parses to another program";
    auto read = ReadProgramFile(path);  // what the daemons' --program reads
    ASSERT_TRUE(read.ok()) << read.status();
    EXPECT_TRUE(Serialize(*read) == Serialize(program)) << name << " reads as another program";
  }
}

TEST(TranspileMainTest, CtrFilesParseBackAndRepeat) {
  const std::string d1 = TmpDir() + "/ctr1", d2 = TmpDir() + "/ctr2/nested";
  RunResult r1 =
      RunTool({"--example=ctr", "--pservers=a:1,b:2", "--trainers=2", "--out_dir=" + d1});
  ASSERT_EQ(r1.exit_code, 0) << r1.err;
  EXPECT_EQ(r1.err, "");
  RunResult r2 =
      RunTool({"--example=ctr", "--pservers", "a:1,b:2", "--trainers=2", "--out_dir", d2});
  ASSERT_EQ(r2.exit_code, 0) << r2.err;
  EXPECT_EQ(r1.out.substr(0, r1.out.find("wrote")), r2.out.substr(0, r2.out.find("wrote")));

  ClusterConfig config;
  config.role = "trainer";
  config.example = "ctr";
  config.pservers = {"a:1", "b:2"};
  config.trainers = 2;
  std::map<std::string, ProgramDesc> want = Expected(config);
  ASSERT_EQ(want.size(), 6u);
  ExpectFilesMatch(d1, want);
  ExpectFilesMatch(d2, want);
  for (const auto& [name, p] : want) {
    EXPECT_TRUE(ReadAll(d1 + "/" + name) == ReadAll(d2 + "/" + name)) << name << " differs";
  }
  // The summary names every pserver with its blocks.
  EXPECT_TRUE(absl::StrContains(r1.out, "pserver 0 a:1: ")) << r1.out;
  EXPECT_TRUE(absl::StrContains(r1.out, "pserver 1 b:2: ")) << r1.out;
  EXPECT_TRUE(absl::StrContains(r1.out, "2 trainer(s), sync mode")) << r1.out;
  EXPECT_TRUE(absl::StrContains(r1.out, "wrote 6 programs to " + d1)) << r1.out;
}

TEST(TranspileMainTest, StdoutHoldsTheSamePrograms) {
  const std::vector<std::string> flags = {
      "--example=mlp_regression", "--pservers=h:1,h:2,h:3", "--trainers=3", "--trainer_id=2",
      "--split_method=hash_name", "--min_block_size=100",   "--nosync_mode"};
  RunResult r = RunTool(flags);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  std::vector<std::string> with_dir = flags;
  const std::string dir = TmpDir() + "/mlp";
  with_dir.push_back("--out_dir=" + dir);
  RunResult rd = RunTool(with_dir);
  ASSERT_EQ(rd.exit_code, 0) << rd.err;

  // Sections "# ==== <file> ====" in order, each equal to the written file.
  std::vector<std::string> parts = absl::StrSplit(r.out, "# ==== ");
  ASSERT_EQ(parts.size(), 9u) << r.out;                            // summary + 8 programs
  EXPECT_TRUE(absl::StrContains(parts[0], "rows [")) << parts[0];  // fc weight sliced
  EXPECT_TRUE(absl::StrContains(parts[0], "async mode, split hash_name")) << parts[0];
  const std::vector<std::string> files = {
      "trainer.pbtxt",   "trainer_startup.pbtxt",   "pserver_0.pbtxt", "pserver_0_startup.pbtxt",
      "pserver_1.pbtxt", "pserver_1_startup.pbtxt", "pserver_2.pbtxt", "pserver_2_startup.pbtxt"};
  for (size_t i = 0; i < files.size(); ++i) {
    const std::string header = files[i] + " ====\n";
    ASSERT_TRUE(absl::StartsWith(parts[i + 1], header)) << parts[i + 1].substr(0, 80);
    EXPECT_TRUE(parts[i + 1].substr(header.size()) == ReadAll(dir + "/" + files[i]))
        << files[i] << " on stdout differs from the written file";
  }
  ClusterConfig config;
  config.role = "trainer";
  config.example = "mlp_regression";
  config.pservers = {"h:1", "h:2", "h:3"};
  config.trainers = 3;
  config.trainer_id = 2;
  config.split_method = "hash_name";
  config.min_block_size = 100;
  config.sync_mode = false;
  ExpectFilesMatch(dir, Expected(config));
}

TEST(TranspileMainTest, WrittenProgramsCanBeFedBackIn) {
  // The single-machine programs as files, transpiled from --program, give the same output as
  // --example.
  auto registry = NewStandardOpRegistry();
  ClusterConfig config;
  config.example = "mlp_regression";
  auto model = LoadModel(config, *registry);
  ASSERT_TRUE(model.ok()) << model.status();
  const std::string main = TmpDir() + "/mlp_main.pbtxt", startup = TmpDir() + "/mlp_startup.pbtxt";
  ASSERT_TRUE(WriteProgramFile(model->main, main).ok());
  ASSERT_TRUE(WriteProgramFile(model->startup, startup).ok());
  const std::string a = TmpDir() + "/from_example", b = TmpDir() + "/from_files";
  RunResult ra = RunTool(
      {"--example=mlp_regression", "--pservers=x:1,y:2", "--min_block_size=64", "--out_dir=" + a});
  ASSERT_EQ(ra.exit_code, 0) << ra.err;
  RunResult rb =
      RunTool({"--example=mlp_regression", "--program=" + main, "--startup_program=" + startup,
               "--pservers=x:1,y:2", "--min_block_size=64", "--out_dir=" + b});
  ASSERT_EQ(rb.exit_code, 0) << rb.err;
  ASSERT_EQ(FilesIn(a), FilesIn(b));
  for (const auto& f : FilesIn(a)) {
    EXPECT_TRUE(ReadAll(a + "/" + f) == ReadAll(b + "/" + f)) << f << " differs";
  }
  // A transpiled trainer program fed back as --program is refused by name, saying what to give.
  RunResult rc = RunTool({"--program=" + a + "/trainer.pbtxt",
                          "--startup_program=" + a + "/trainer_startup.pbtxt", "--pservers=x:1"});
  EXPECT_EQ(rc.exit_code, 1);
  EXPECT_TRUE(absl::StrContains(rc.err, "--program " + a + "/trainer.pbtxt is a transpiled "
                                        "trainer or pserver program"))
      << rc.err;
  EXPECT_TRUE(absl::StrContains(rc.err, "tessera_program --out")) << rc.err;
}

// Exit status `code` and exactly one line on stderr containing `text`.
void ExpectError(const std::vector<std::string>& args, int code, const std::string& text) {
  RunResult r = RunTool(args);
  EXPECT_EQ(r.exit_code, code) << absl::StrJoin(args, " ") << ": " << r.err;
  EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
  EXPECT_TRUE(absl::StrContains(r.err, text)) << r.err << " lacks '" << text << "'";
  EXPECT_TRUE(absl::StartsWith(r.err, "tessera_transpile: ")) << r.err;
}

// The summary names each pserver's table shards: the ctr example's 52 tables (26 slots, a deep
// and a wide table each) split over both pservers, or each whole on one, a slot's two together.
TEST(TranspileMainTest, SummaryNamesTheTableShards) {
  auto count = [](const std::string& text, const std::string& what) {
    int n = 0;
    for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
    return n;
  };
  RunResult rows = RunTool({"--example=ctr", "--pservers=a:1,b:2"});
  ASSERT_EQ(rows.exit_code, 0) << rows.err;
  EXPECT_TRUE(absl::StrContains(rows.out, "tables row_wise, fuse_tables on\n")) << rows.out;
  // Each slot's deep and wide table: one table group, on every pserver.
  EXPECT_EQ(count(rows.out, ", in emb_0+wide_0\n"), 4) << rows.out;
  EXPECT_EQ(count(rows.out, "elements, 52 table shard(s)\n"), 2) << rows.out;
  EXPECT_EQ(count(rows.out, "table shard 1 of 2, dim"), 52) << rows.out;
  RunResult whole =
      RunTool({"--example=ctr", "--pservers=a:1,b:2", "--table_placement=table_wise"});
  ASSERT_EQ(whole.exit_code, 0) << whole.err;
  EXPECT_TRUE(absl::StrContains(whole.out, "tables table_wise, fuse_tables on\n")) << whole.out;
  EXPECT_EQ(count(whole.out, "elements, 26 table shard(s)\n"), 2) << whole.out;
  EXPECT_EQ(count(whole.out, "table shard 0 of 1, dim"), 52) << whole.out;
  for (const char* slot : {"emb_0 ", "wide_0 "}) {
    const size_t at = whole.out.find(slot);
    ASSERT_NE(at, std::string::npos) << whole.out;
    EXPECT_LT(at, whole.out.find("pserver 1 b:2")) << slot << " is not with the other";
  }
  RunResult apart = RunTool({"--example=ctr", "--pservers=a:1,b:2", "--nofuse_tables"});
  ASSERT_EQ(apart.exit_code, 0) << apart.err;
  EXPECT_TRUE(absl::StrContains(apart.out, "tables row_wise\n")) << apart.out;
  EXPECT_EQ(count(apart.out, ", in "), 0) << apart.out;
  ExpectError({"--pservers=a:1", "--table_placement=by_table"}, 2, "'by_table'");
}

TEST(TranspileMainTest, BadFlagsAndFailures) {
  ExpectError({"--example=ctr"}, 2, "--pservers is empty");
  ExpectError({"--example=nope", "--pservers=a:1"}, 2, "'nope'");
  ExpectError({"--pservers=a"}, 2, "'a' is not host:port");
  ExpectError({"--pservers=a:1", "--frobnicate=1"}, 2, "unknown flag --frobnicate");
  ExpectError({"--pservers=a:1", "--out_dir"}, 2, "--out_dir needs a value");
  ExpectError({"--pservers=a:1", "--out_dir="}, 2, "--out_dir needs a directory");
  ExpectError({"--pservers=a:1", "--trainers=2", "--trainer_id=2"}, 2, "--trainer_id=2");
  ExpectError({"--pservers=a:1", "--split_method=by_size"}, 2, "'by_size'");
  ExpectError({"--pservers=a:1", "--program=x.pbtxt"}, 2, "--startup_program");
  ExpectError({"--pservers=a:1,a:1"}, 2, "--pservers names a:1 twice");
  // Failures after parsing: status 1.
  ExpectError({"--pservers=a:1", "--program=" + TmpDir() + "/missing.pbtxt",
               "--startup_program=" + TmpDir() + "/missing.pbtxt"},
              1, "missing.pbtxt");
  const std::string file = TmpDir() + "/a_file";
  std::ofstream(file) << "x";
  ExpectError({"--pservers=a:1", "--example=mlp_regression", "--out_dir=" + file + "/sub"}, 1,
              "a_file/sub");
  RunResult help = RunTool({"--help"});
  EXPECT_EQ(help.exit_code, 0);
  EXPECT_TRUE(absl::StrContains(help.out, "--out_dir")) << help.out;
  EXPECT_TRUE(absl::StrContains(help.out, "--pservers")) << help.out;
}

}  // namespace
}  // namespace tessera
