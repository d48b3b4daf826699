// Parameter-server mode with real daemons: tessera_pserver and tessera_trainer processes talking
// gRPC on loopback (free ports picked at run time; every process killed by pid at the end).
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <zlib.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <functional>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/match.h"
#include "absl/time/clock.h"
#include "common/ops/ops.h"
#include "common/framework/params_io.h"
#include "common/data/criteo.h"
#include "common/data/stream.h"
#include "common/data/synthetic.h"
#include "common/layers/model_file.h"
#include "examples/registry.h"
#include "gtest/gtest.h"
#include "pserver/sparse_table.h"
#include "tests/cluster_util.h"
#include "tests/equivalence_util.h"
#include "trainer/local_trainer.h"

namespace tessera {
namespace {

// mlp_regression or ctr data with 64 test examples.
// The log of pserver `p` of a job run in `dir`.
std::string PserverLog(const std::string& dir, int p) {
  return ReadFileOrEmpty(absl::StrCat(dir, "/pserver.", p, ".log"));
}

// `key`'s values (SumAfter) summed over the logs of a job's two pservers.
int64_t SumOverPservers(const std::string& dir, const std::string& key) {
  return SumAfter(PserverLog(dir, 0), key) + SumAfter(PserverLog(dir, 1), key);
}

examples::ExampleOptions Example(const std::string& name, int64_t examples, uint64_t seed) {
  examples::ExampleOptions eo;
  eo.name = name;
  eo.num_examples = examples;
  eo.num_test_examples = 64;
  eo.seed = seed;
  if (name == "ctr") eo.vocab_per_slot = 2000;
  return eo;
}

// A sync job of `job`'s shape training `eo` with `batch` for `epochs` (and `extra` flags) ends
// with every trainer's parameters within `rtol` of single-machine training; returns the
// job's directory.
std::string ExpectSyncEqualsSingleMachine(PsJob job, const std::string& name,
                                          const examples::ExampleOptions& eo, int64_t batch,
                                          int epochs, const std::vector<std::string>& extra,
                                          double rtol) {
  std::string dir = MakeTempDir(name);
  job.example = eo.name;
  job.flags = ExampleFlags(eo, batch, epochs);
  job.flags.insert(job.flags.end(), extra.begin(), extra.end());
  auto params = RunPsJob(job, dir);
  EXPECT_EQ(params.size(), static_cast<size_t>(job.trainers));
  auto want = SingleMachine(eo, batch, eo.seed, epochs);
  for (const auto& p : params) ExpectParamsClose(p, want, rtol);
  return dir;
}

class SyncTwoByTwo : public ::testing::TestWithParam<bool> {};

// With and without the memory optimization pass on the trainer program.
TEST_P(SyncTwoByTwo, EqualsSingleMachine) {
  std::string dir =
      ExpectSyncEqualsSingleMachine(PsJob{}, "sync2x2", Example("mlp_regression", 1024, 3), 64, 2,
                                    {"--min_block_size=400", "--split_method=round_robin",
                                     GetParam() ? "--memory_optimize" : "--nomemory_optimize"},
                                    1e-5);
  if (GetParam()) {
    EXPECT_NE(ReadFileOrEmpty(dir + "/trainer.0.log").find("memory_optimize: reused"),
              std::string::npos);
  }
}

INSTANTIATE_TEST_SUITE_P(MemoryOptimize, SyncTwoByTwo, ::testing::Bool());

// Multi-device trainers: each trainer splits its share of a global batch across 2 CPU places
// (threads), combines their gradients weighted by their shares and sends once. Batches of 66
// (and a last one of 34) give places of 17 and 16 examples (9 and 8 in the last batch), so the
// weighting matters.
TEST(PsClusterTest, SyncTwoByTwoWithTwoCpuPlacesEqualsSingleMachine) {
  std::string dir = ExpectSyncEqualsSingleMachine(
      PsJob{}, "sync2x2_places", Example("mlp_regression", 1024, 3), 66, 2,
      {"--min_block_size=400", "--split_method=round_robin", "--cpu_places=2"}, 1e-5);
  EXPECT_NE(ReadFileOrEmpty(dir + "/trainer.0.log").find(", 2 cpu places"), std::string::npos)
      << ReadFileOrEmpty(dir + "/trainer.0.log");
}

// The same with the CTR model's local embedding tables: every place's sparse (SelectedRows)
// gradients are concatenated before they are split by pserver and sent.
TEST(PsClusterTest, SyncCtrWithLocalTablesOnTwoCpuPlacesEqualsSingleMachine) {
  ExpectSyncEqualsSingleMachine(
      PsJob{}, "sync_ctr_places", Example("ctr", 576, 5), 96, 1,
      {"--split_method=hash_name", "--nodistributed_tables", "--cpu_places=2"}, 1e-4);
}

// And with the tables on the pservers: the places' ids are looked up together, one request per
// pserver and step (not one per place), and each place gets its rows: the job ends with the
// parameters of the same job on one place. A sync step thus makes 2 requests per pserver
// (PrefetchBatch, and SendGetBatch: the receive rides on the send as on one place). 2 trainers x
// 2 epochs x 12 steps; besides the steps a trainer makes a few requests (register, initial pull,
// complete, a heartbeat every 2 s), far fewer than the 48 that a third request per step (a
// second prefetch, or the receive on its own) would add.
TEST(PsClusterTest, SyncCtrWithDistributedTablesOnTwoCpuPlacesEqualsOnePlace) {
  const examples::ExampleOptions eo = Example("ctr", 576, 5);
  std::vector<std::map<std::string, Tensor>> params[2];
  std::string dir[2];
  for (int places : {1, 2}) {
    dir[places - 1] = MakeTempDir(absl::StrCat("sync_ctr_dist_places", places));
    PsJob job;
    job.example = eo.name;
    job.flags = ExampleFlags(eo, 48, 2);
    for (const std::string& f : {std::string("--split_method=hash_name"),
                                 std::string("--distributed_tables"),
                                 absl::StrCat("--cpu_places=", places)}) {
      job.flags.push_back(f);
    }
    params[places - 1] = RunPsJob(job, dir[places - 1]);
    ASSERT_EQ(params[places - 1].size(), 2u);
  }
  // The trainers hold the dense parameters (the tables live on the pservers); they depend on
  // every looked-up row, so wrong rows for a place would show in them.
  for (int k = 0; k < 2; ++k) {
    EXPECT_EQ(params[1][k].size(), 7u);
    ExpectParamsClose(params[1][k], params[0][k], 1e-5);
  }
  const int64_t trainer_steps = 2 * 2 * (576 / 48);
  for (int p = 0; p < 2; ++p) {
    const std::string log = PserverLog(dir[1], p);
    const size_t at = log.find(" requests=");
    ASSERT_NE(at, std::string::npos) << log;
    const int64_t requests = std::stoll(log.substr(at + 10));
    EXPECT_LE(requests, 2 * trainer_steps + 24) << log;
    EXPECT_GE(requests, 2 * trainer_steps) << log;
  }
}

TEST(PsClusterTest, SyncThreeByThreeCtrWithSparseTablesEqualsSingleMachine) {
  PsJob job;
  job.pservers = 3;
  job.trainers = 3;
  ExpectSyncEqualsSingleMachine(job, "sync3x3", Example("ctr", 576, 5), 96, 1,
                                {"--split_method=hash_name", "--nodistributed_tables"}, 1e-4);
}

// Runs a model script of examples/python with `args`; false (after a failure) if it fails.
bool RunPythonModel(const std::string& script, const std::vector<std::string>& args,
                    const std::string& log) {
  ProcessGroup group;
  setenv("PYTHONPATH", RunfilePath("python").c_str(), 1);
  std::vector<std::string> argv = {"/usr/bin/python3", RunfilePath("examples/python/" + script)};
  argv.insert(argv.end(), args.begin(), args.end());
  auto pid = group.Start(argv, log);
  EXPECT_TRUE(pid.ok()) << pid.status();
  if (!pid.ok()) return false;
  auto status = group.Wait(*pid, absl::Seconds(60));
  EXPECT_TRUE(status.ok()) << status.status();
  const bool ok = status.ok() && WIFEXITED(*status) && WEXITSTATUS(*status) == 0;
  EXPECT_TRUE(ok) << ReadFileOrEmpty(log);
  return ok;
}

// A model file given with --model (the ctr model with a learning rate that no flag sets) trains
// on 2 pservers x 2 trainers as the same file does on one machine.
TEST(PsClusterTest, SyncTwoByTwoFromAModelFileEqualsSingleMachine) {
  examples::ExampleOptions eo = Example("ctr", 576, 5);
  eo.learning_rate = 0.004f;
  absl::StatusOr<ModelFile> model = examples::ExampleModelFile("ctr");
  ASSERT_TRUE(model.ok()) << model.status();
  ModelOverrides o;
  o.learning_rate = eo.learning_rate;
  const std::string path = MakeTempDir("model_file") + "/ctr_model.pbtxt";
  ASSERT_TRUE(WriteModelFile(ApplyOverrides(*model, o), path).ok());
  ExpectSyncEqualsSingleMachine(PsJob{}, "sync_model_file", eo, 96, 1,
                                {"--model=" + path, "--split_method=hash_name"}, 1e-4);
}

// The wide & deep model written in Python (examples/python/wide_deep.py, python/tessera) trains
// on 2 pservers x 2 trainers to the parameters the C++-built model reaches on one machine.
TEST(PsClusterTest, PythonWideDeepOnTwoByTwoEqualsCppSingleMachine) {
  const std::string dir = MakeTempDir("python_model");
  const std::string path = dir + "/wide_deep.pbtxt";
  ASSERT_TRUE(RunPythonModel("wide_deep.py", {"--out=" + path}, dir + "/python.log"));
  ExpectSyncEqualsSingleMachine(PsJob{}, "python_wide_deep", Example("ctr", 576, 5), 96, 1,
                                {"--model=" + path, "--split_method=hash_name"}, 1e-5);
}

// The multi-hot model of examples/python/multi_hot.py (every table on the pservers), changed by
// `edit`, trained by `job` (and by one machine, from the same model file) on the same data: every
// trainer's dense parameters within `rtol` of one machine's. Returns one machine's parameters.
// With `gzip_parts`, the trainers read the training data as that many gzip files in a directory
// (one machine: the examples of all of them, in order).
std::map<std::string, Tensor> ExpectMultiHotJobEqualsSingleMachine(
    PsJob job, const std::string& name, const std::function<void(ModelFile*)>& edit,
    double rtol = 1e-5, int gzip_parts = 0, int stream_epochs = 0,
    const std::string& data_format = "criteo", std::string* job_dir = nullptr) {
  const std::string dir = MakeTempDir(name);
  if (job_dir != nullptr) *job_dir = dir;
  const std::string model_path = dir + "/multi_hot.pbtxt";
  if (!RunPythonModel("multi_hot.py", {"--out=" + model_path, "--distributed_tables"},
                      dir + "/python.log")) {
    return {};
  }
  if (edit) {
    absl::StatusOr<ModelFile> m = ReadModelFile(model_path);
    EXPECT_TRUE(m.ok()) << m.status();
    if (!m.ok()) return {};
    edit(&*m);
    EXPECT_TRUE(WriteModelFile(*m, model_path).ok());
  }
  // Ids below the tables' 1000 rows, so that one machine's local tables hold the rows a pserver
  // creates for them (the same initial values, SparseTable's contract).
  data::CtrDataOptions o;
  o.num_multi = 2;
  o.vocab_per_slot = 300;
  o.seed = 5;
  auto small_ids = [](int64_t id) { return ((id % 1000) + 1000) % 1000; };
  int64_t empty_lists = 0;
  std::map<std::string, data::Dataset> sets;
  for (const auto& [set, n] : {std::make_pair("train", 576), std::make_pair("test", 64)}) {
    absl::StatusOr<data::Dataset> d = data::MakeCtrData(n, o);
    EXPECT_TRUE(d.ok()) << d.status();
    if (!d.ok()) return {};
    for (data::Example& e : d->examples) {
      for (int64_t& id : e.sparse) id = small_ids(id);
      for (auto& ids : e.multi) {
        for (int64_t& id : ids) id = small_ids(id);
        empty_lists += ids.empty();
      }
    }
    EXPECT_TRUE(data::WriteCriteoFile(dir + "/" + set + ".txt", *d).ok());
    if (data_format != "criteo") {
      // The same examples as CSV (a header of the Criteo names; dense values as the floats
      // they are, ids in decimal) or as MultiSlot lines.
      std::string text;
      if (data_format == "csv") {
        text = "label";
        for (int i = 1; i <= 13; ++i) absl::StrAppend(&text, ",I", i);
        for (int i = 1; i <= 26; ++i) absl::StrAppend(&text, ",C", i);
        absl::StrAppend(&text, ",M1,M2\n");
      }
      const bool csv = data_format == "csv";
      for (const data::Example& e : d->examples) {
        absl::StrAppend(&text, csv ? "" : "1 ", e.label, csv ? "" : " 13");
        for (float v : e.dense) absl::StrAppend(&text, csv ? "," : " ", absl::StrFormat("%.9g", v));
        for (int64_t id : e.sparse) absl::StrAppend(&text, csv ? "," : " 1 ", id);
        for (const auto& ids : e.multi) {
          absl::StrAppend(&text, csv ? "," : absl::StrCat(" ", ids.size(), " "),
                          absl::StrJoin(ids, csv ? "|" : " "));
        }
        text += "\n";
      }
      std::ofstream(dir + "/" + set + "." + data_format, std::ios::binary) << text;
    }
    if (gzip_parts > 0 && std::string(set) == "train") {
      EXPECT_EQ(mkdir((dir + "/train_parts").c_str(), 0755), 0);
      // Streamed: parts of 2 or 3 local batches of 48 (576 = 96 + 144 + 96 + 144 + 96), so
      // that no trainer has a partial batch and a global step is both trainers' full batches.
      const size_t per_part = (d->examples.size() + gzip_parts - 1) / gzip_parts;
      size_t begin = 0;
      for (int part = 0; part < gzip_parts; ++part) {
        data::Dataset piece = *d;
        const size_t end = std::min(d->examples.size(),
                                    begin + (stream_epochs > 0 ? 48 * (2 + part % 2) : per_part));
        piece.examples.assign(d->examples.begin() + begin, d->examples.begin() + end);
        const std::string text_path = absl::StrCat(dir, "/part-", part, ".txt");
        EXPECT_TRUE(data::WriteCriteoFile(text_path, piece).ok());
        const std::string text = ReadFileOrEmpty(text_path);
        gzFile gz = gzopen(absl::StrCat(dir, "/train_parts/part-", part, ".gz").c_str(), "wb");
        EXPECT_NE(gz, nullptr);
        if (gz == nullptr) return {};
        EXPECT_EQ(gzwrite(gz, text.data(), static_cast<unsigned>(text.size())),
                  static_cast<int>(text.size()));
        EXPECT_EQ(gzclose(gz), Z_OK);
        begin = end;
      }
      EXPECT_EQ(begin, d->examples.size());
    }
    sets[set] = *std::move(d);
    ++o.seed;
  }
  EXPECT_GT(empty_lists, 50);  // empty lists pool to zeros, on both sides

  auto registry = NewStandardOpRegistry();
  absl::StatusOr<ModelFile> file = ReadModelFile(model_path);
  EXPECT_TRUE(file.ok()) << file.status();
  if (!file.ok()) return {};
  ModelOverrides local;
  local.single_machine = true;
  absl::StatusOr<ModelSpec> model =
      CompileModel(ApplyOverrides(*file, local), *registry, model_path);
  EXPECT_TRUE(model.ok()) << model.status();
  if (!model.ok()) return {};
  LocalTrainerOptions lo;
  lo.batch_size = 96;
  lo.epochs = 1;
  lo.seed = 5;
  lo.log_every_steps = 0;
  data::Dataset train = sets["train"];
  std::vector<std::string> stream_flags;
  if (stream_epochs > 0) {
    // What the 2 streaming trainers train on: per epoch, each reads its shards of the files
    // (the daemons' assignment and shuffle seeds), and global step s is trainer 0's s-th local
    // batch of 48, then trainer 1's, until the first runs out. One machine trains on those
    // global batches in that order.
    auto paths = data::ExpandDataPaths(dir + "/train_parts");
    auto files = data::StatDataFiles(*paths);
    EXPECT_TRUE(files.ok()) << files.status();
    if (!files.ok()) return {};
    train.examples.clear();
    int uneven_epochs = 0;  // epochs that end when one trainer runs out before the other
    for (int64_t epoch = 0; epoch < stream_epochs; ++epoch) {
      std::vector<std::vector<data::Example>> local(2);
      for (int k = 0; k < 2; ++k) {
        auto shards = data::AssignShards(*files, data::ShardOptions{2, k, 5, true}, epoch);
        data::ExampleStreamOptions so;
        so.format.num_multi = 2;
        so.shuffle_buffer = 64;
        so.shuffle_seed = data::StreamShuffleSeed(5, epoch, k);
        auto stream = data::ExampleStream::Open(*shards, so);
        data::Example e;
        while (*(*stream)->Next(&e)) local[k].push_back(e);
        EXPECT_EQ(local[k].size() % 48, 0u);
      }
      uneven_epochs += local[0].size() != local[1].size();
      const size_t steps = std::min(local[0].size(), local[1].size()) / 48;
      EXPECT_GE(steps, 4u);
      for (size_t s = 0; s < steps; ++s) {
        for (int k = 0; k < 2; ++k) {
          train.examples.insert(train.examples.end(), local[k].begin() + 48 * s,
                                local[k].begin() + 48 * (s + 1));
        }
      }
    }
    EXPECT_GT(uneven_epochs, 0) << "no epoch tests the end of uneven shards";
    lo.shuffle = false;
    stream_flags = {"--reader=stream", "--shuffle_buffer=64", "--reader_queue=100",
                    absl::StrCat("--epochs=", stream_epochs)};
  }
  LocalRun reference = TrainModelLocally(*model, train, lo);
  EXPECT_TRUE(reference.create_status.ok()) << reference.create_status;
  // The trainers hold every parameter but the tables.
  for (const VarDesc& v : file->forward().blocks(0).vars()) {
    if (v.is_distributed()) reference.params.erase(v.name());
  }
  EXPECT_EQ(reference.params.size(), 4u);  // deep_fc_0 and deep_out weights and biases

  job.example = "ctr";
  const std::string ext = data_format == "criteo" ? "txt" : data_format;
  job.flags.insert(job.flags.end(),
                   {"--model=" + model_path,
                    "--train_data=" + dir + (gzip_parts > 0 ? "/train_parts" : "/train." + ext),
                    "--test_data=" + dir + "/test." + ext, "--data_format=" + data_format,
                    "--batch_size=96", "--epochs=1", "--seed=5", "--split_method=hash_name"});
  job.flags.insert(job.flags.end(), stream_flags.begin(), stream_flags.end());
  auto params = RunPsJob(job, dir);
  EXPECT_EQ(params.size(), static_cast<size_t>(job.trainers));
  for (const auto& p : params) ExpectParamsClose(p, reference.params, rtol, name);
  return reference.params;
}

// A model with multi-hot slots (lists of 0 to 4 ids, pooled by sum and by average) and every
// table on the pservers (examples/python/multi_hot.py) trains on 2 pservers x 2 trainers to the
// parameters one machine reaches on the same data.
TEST(PsClusterTest, MultiHotSlotsWithDistributedTablesEqualSingleMachine) {
  ExpectMultiHotJobEqualsSingleMachine(PsJob{}, "multi_hot", nullptr);
}

// Parameters sliced over the pservers (deep_fc_0.w in two blocks, which a concat after the
// receive assembles): the steps are pipelined all the same (the next batch's lookups ride on the
// step's send, and each pserver answers them fused into the step's update; an unpipelined step
// looks them up at its start, unfused), and the job trains to one machine's parameters.
TEST(PsClusterTest, SlicedParametersArePipelinedAndEqualSingleMachine) {
  PsJob job;
  job.flags = {"--min_block_size=64"};
  std::string dir;
  ExpectMultiHotJobEqualsSingleMachine(job, "sliced_pipelined", nullptr, 1e-5, 0, 0, "criteo",
                                       &dir);
  int64_t blocks = 0;
  for (int p = 0; p < 2; ++p) {
    const std::string log = PserverLog(dir, p);
    EXPECT_GT(SumAfter(log, " fused_prefetches="), 0) << log;
    blocks += SumAfter(log, ": serving ");
  }
  EXPECT_EQ(blocks, 5);  // the 4 dense parameters, one of them in 2 blocks
}

// Gradients out as backward produces them (--send_early_kb): the dense gradient blocks backward
// completes first go to their pservers in the middle of backward (the split of the sliced
// deep_fc_0.w's gradient moved up to where backward completes it), the step's send carries the
// rest with its barrier; the steps are pipelined as before and the job trains to one machine's
// parameters.
TEST(PsClusterTest, EarlySendsEqualSingleMachine) {
  PsJob job;
  job.flags = {"--min_block_size=64", "--send_early_kb=1"};
  std::string dir;
  ExpectMultiHotJobEqualsSingleMachine(job, "early_sends", nullptr, 1e-5, 0, 0, "criteo", &dir);
  for (int t = 0; t < 2; ++t) {
    const std::string log = ReadFileOrEmpty(absl::StrCat(dir, "/trainer.", t, ".log"));
    EXPECT_NE(log.find(" dense gradient blocks ("), std::string::npos) << log;
  }
  for (int p = 0; p < 2; ++p) {
    const std::string log = PserverLog(dir, p);
    EXPECT_GT(SumAfter(log, " fused_prefetches="), 0) << log;
  }
  // The pservers applied early blocks as soon as both trainers' copies were in.
  EXPECT_GT(SumOverPservers(dir, " early_applies="), 0);
}

// With --chunk_bytes=256 every dense gradient over 256 bytes travels in chunk calls and the
// rest in batches cut at 256 bytes, all ahead of the request that carries the step's barrier:
// the pservers apply each such block as soon as both trainers' copies are in, without early
// sends, and the job still trains to one machine's parameters.
TEST(PsClusterTest, ChunkedGradientsApplyOnArrivalAndEqualSingleMachine) {
  PsJob job;
  job.flags = {"--chunk_bytes=256"};
  std::string dir;
  ExpectMultiHotJobEqualsSingleMachine(job, "chunked", nullptr, 1e-5, 0, 0, "criteo", &dir);
  EXPECT_GT(SumOverPservers(dir, " early_applies="), 0);
}

// Table-wise placement (--table_placement=table_wise): each of the multi-hot model's 28 tables
// (26 slots, 2 multi-hot lists; one group each, all of width 4) lives whole on one pserver, 14
// on each; the job is pipelined as row-wise placement is and trains to one machine's parameters.
TEST(PsClusterTest, TableWisePlacementEqualsSingleMachine) {
  PsJob job;
  job.flags = {"--table_placement=table_wise"};
  std::string dir;
  ExpectMultiHotJobEqualsSingleMachine(job, "table_wise", nullptr, 1e-5, 0, 0, "criteo", &dir);
  for (int p = 0; p < 2; ++p) {
    const std::string log = PserverLog(dir, p);
    EXPECT_EQ(SumAfter(log, " parameter blocks and "), 14) << log;
    EXPECT_GT(SumAfter(log, " fused_prefetches="), 0) << log;
  }
}

// Table groups (--fuse_tables, the default): each slot's deep and wide table of the ctr model is
// one pserver table of both (26 groups of the 52 tables, on each pserver row-wise, spread
// table-wise). Grouped, row-wise and table-wise, the trainers' parameters (which depend on every
// row looked up) equal those of the job holding every table apart. (The ctr model's Adam
// updates a local table's untouched rows, a distributed one's not: the tables held apart are
// the reference; MultiHotSlotsWithDistributedTablesEqualSingleMachine ties them to one machine.)
TEST(PsClusterTest, CtrTableGroupsTrainAsTheTablesHeldApart) {
  const examples::ExampleOptions eo = Example("ctr", 576, 5);
  auto run = [&](const std::string& name, const std::vector<std::string>& flags) {
    const std::string dir = MakeTempDir("ctr_groups_" + name);
    PsJob job;
    job.example = eo.name;
    job.flags = ExampleFlags(eo, 96, 1);
    job.flags.push_back("--split_method=hash_name");
    job.flags.push_back("--distributed_tables");
    job.flags.insert(job.flags.end(), flags.begin(), flags.end());
    const auto params = RunPsJob(job, dir);
    int groups = 0;
    for (int p = 0; p < 2; ++p) {
      const std::string log = PserverLog(dir, p);
      groups += SumAfter(log, " table shards (");
    }
    return std::make_pair(params, groups);
  };
  const auto apart = run("apart", {"--fuse_tables=false"});
  ASSERT_EQ(apart.first.size(), 2u);
  EXPECT_EQ(apart.first[0].size(), 7u);  // the dense parameters; the tables are the pservers'
  EXPECT_EQ(apart.second, 0);
  for (const std::string placement : {"row_wise", "table_wise"}) {
    const auto grouped = run(placement, {"--fuse_tables", "--table_placement=" + placement});
    ASSERT_EQ(grouped.first.size(), 2u) << placement;
    for (int k = 0; k < 2; ++k) {
      ExpectParamsClose(grouped.first[k], apart.first[k], 1e-6, placement);
    }
    EXPECT_EQ(grouped.second, placement == "row_wise" ? 2 * 26 : 26) << placement;
  }
}

// Hybrid mode: the tables on the pservers (prefetch and push as in PS mode), the dense
// parameters on the trainers, their gradients all-reduced with Gloo and applied by each trainer:
// the same parameters as one machine, and only the tables' traffic reaches the pservers.
TEST(PsClusterTest, HybridTwoByTwoWithDistributedTablesEqualsSingleMachine) {
  PsJob job;
  job.trainer_endpoints = true;
  job.flags = {"--mode=hybrid"};
  std::string dir;
  ExpectMultiHotJobEqualsSingleMachine(job, "hybrid", nullptr, 1e-5, 0, 0, "criteo", &dir);
  for (int k = 0; k < 2; ++k) {
    const std::string log = ReadFileOrEmpty(absl::StrCat(dir, "/trainer.", k, ".log"));
    EXPECT_NE(log.find("hybrid (tables on 2 pservers"), std::string::npos) << log;
    const size_t at = log.find("gradient all-reduce bytes=");
    ASSERT_NE(at, std::string::npos) << log;
    EXPECT_GT(std::stoll(log.substr(at + 26)), 0) << log;
  }
}

// The training data as a directory of 3 gzip files (--train_data=DIR): the same parameters as
// one machine reading the examples of all of them.
TEST(PsClusterTest, DirectoryOfGzipFilesEqualsSingleMachineOnTheirConcatenation) {
  ExpectMultiHotJobEqualsSingleMachine(PsJob{}, "gzip_parts", nullptr, 1e-5, 3);
}

// Streamed (--reader=stream) over a directory of 5 gzip files for 2 epochs: each trainer reads
// only its own files (reassigned per epoch) through a shuffle buffer, every trainer ends an epoch
// when the first runs out, and the parameters equal one machine's on the global batches the two
// trainers' streams make. (1e-4: the two trainers' averaged means round apart from one mean of
// 96, measured at 4.9e-5 after 10 steps; one example out of place moves parameters by 5e-3 to 10.)
TEST(PsClusterTest, StreamedGzipFilesEqualSingleMachineOnTheTrainersBatches) {
  ExpectMultiHotJobEqualsSingleMachine(PsJob{}, "streamed_parts", nullptr, 1e-4, 5,
                                       /*stream_epochs=*/2);
}

// The same with a sliced parameter (--min_block_size=64: deep_fc_0.w in two blocks, assembled by
// a concat after the receive): streamed steps look the next batch up once the send returned,
// beside the receive and the concat, and the parameters still equal one machine's.
TEST(PsClusterTest, StreamedStepsWithASlicedParameterEqualSingleMachine) {
  PsJob job;
  job.flags = {"--min_block_size=64"};
  std::string dir;
  ExpectMultiHotJobEqualsSingleMachine(job, "streamed_sliced", nullptr, 1e-4, 5,
                                       /*stream_epochs=*/2, "criteo", &dir);
  int64_t blocks = 0;
  for (int p = 0; p < 2; ++p) {
    blocks += SumAfter(PserverLog(dir, p), ": serving ");
  }
  EXPECT_EQ(blocks, 5);  // the 4 dense parameters, one of them in 2 blocks
}

// The same data as CSV with a header (columns by their Criteo names, ids in decimal) and as
// Fluid's MultiSlot text: the same parameters as one machine.
TEST(PsClusterTest, CsvAndMultiSlotDataEqualSingleMachine) {
  ExpectMultiHotJobEqualsSingleMachine(PsJob{}, "csv", nullptr, 1e-5, 0, 0, "csv");
  ExpectMultiHotJobEqualsSingleMachine(PsJob{}, "multislot", nullptr, 1e-5, 0, 0, "multislot");
}

// Tables with optimizers of their own (a type, and a learning rate of their own or the model's),
// updated by the pservers' tables as one machine updates them (1e-4: the tables' Adam rounds
// differently in float32 from the adam kernel, as in the CTR model's tests).
TEST(PsClusterTest, TableOptimizersOnTwoByTwoEqualSingleMachine) {
  ExpectMultiHotJobEqualsSingleMachine(PsJob{}, "table_optimizers", [](ModelFile* m) {
    auto own = [&](const std::string& table, const std::string& type, float lr) {
      TableOptimizer* t = m->add_table_optimizers();
      t->set_table(table);
      t->mutable_optimizer()->set_type(type);
      t->mutable_optimizer()->set_learning_rate(lr);
    };
    own("emb_0", "adam", 0.01f);
    own("multi_emb_0", "sgd", 0.5f);
    own("multi_emb_1", "sgd", 0.0f);  // the model's learning rate
  }, 1e-4);
}

// Clipping by global norm, with one trainer (which clips what one machine clips: its gradients
// are the batch's) and a bound every step exceeds: the same parameters as one machine, and not
// those of training without clipping.
TEST(PsClusterTest, GradientClippingWithOneTrainerEqualsSingleMachine) {
  PsJob one;
  one.trainers = 1;
  std::map<std::string, Tensor> clipped = ExpectMultiHotJobEqualsSingleMachine(
      one, "clip_global_norm",
      [](ModelFile* m) { m->mutable_optimizer()->set_clip_global_norm(0.01f); });
  std::map<std::string, Tensor> unclipped =
      ExpectMultiHotJobEqualsSingleMachine(one, "no_clip", nullptr);
  ASSERT_FALSE(clipped.empty());
  const double differ = MaxAbsDifference(clipped, unclipped);
  EXPECT_GT(differ, 1e-3) << "clipping changed nothing: the bound is never reached";
}

TEST(PsClusterTest, CtrWithDistributedTablesLearns) {
  std::string dir = MakeTempDir("ctr_dist");
  PsJob job;
  job.example = "ctr";
  job.flags = {"--num_examples=12000",
               "--num_test_examples=2000",
               "--batch_size=128",
               "--epochs=1",
               "--seed=2",
               "--vocab_per_slot=2000",
               "--distributed_tables",
               "--table_export_dir=" + dir,
               "--heartbeat_s=0"};  // the count below is of the step protocol's requests
  auto params = RunPsJob(job, dir);
  // Every pserver exported its shard of every table, and the files load into fresh tables.
  int64_t rows = 0;
  for (int shard = 0; shard < 2; ++shard) {
    SparseTableOptions o;
    o.dim = 8;
    auto table = SparseTable::Create(o);
    ASSERT_TRUE(table.ok());
    auto n = (*table)->Import(absl::StrCat(dir, "/emb_3.shard", shard, ".tbl"));
    ASSERT_TRUE(n.ok()) << n.status();
    EXPECT_GT(*n, 0);
    rows += *n;
  }
  EXPECT_LE(rows, 2000);  // at most the slot's vocabulary
  std::string log = ReadFileOrEmpty(dir + "/trainer.0.log");
  size_t pos = log.find(" auc ", log.find("held-out loss"));  // not the live progress AUC
  ASSERT_NE(pos, std::string::npos) << log;
  EXPECT_GT(std::strtod(log.c_str() + pos + 5, nullptr), 0.70) << log;
  // The tables never existed on a trainer: the dump holds no emb_* / wide_* variable.
  for (const auto& [name, t] : params[0]) EXPECT_EQ(name.rfind("emb_", 0), std::string::npos);
  std::string ps =
      ReadFileOrEmpty(dir + "/pserver.0.log") + ReadFileOrEmpty(dir + "/pserver.1.log");
  EXPECT_NE(ps.find("table_rows="), std::string::npos) << ps;
  // A pipelined sync step makes 1 request to each pserver: one SendGetBatch with the gradients,
  // both barriers, the parameters and the next batch's lookups for all tables (2 requests per
  // step would break the bound). Besides the steps, each trainer registers, pulls the initial
  // parameters, looks its first batch up and completes, and the held-out evaluation prefetches
  // once per batch of 128 of each trainer's half and sends each trainer's partial to pserver 0,
  // where trainer 0 fetches the sum.
  const int64_t trainer_steps = 2 * (12000 / 128 + 1);  // 94 steps each (96 examples left over)
  const int64_t eval_batches = 2 * ((1000 + 127) / 128);
  for (int p = 0; p < 2; ++p) {
    std::string log = PserverLog(dir, p);
    int64_t requests = SumAfter(log, " requests=");
    EXPECT_GE(requests, trainer_steps) << log;
    EXPECT_LE(requests, trainer_steps + 4 * 2 + eval_batches + (p == 0 ? 3 : 0)) << log;
  }
}

// With one trainer the next batch's lookups keep their own request (answered as soon as the
// pserver applied the tables, overlapping its dense update) and the receive rides on the send:
// 2 requests per pipelined step, not 1 (tests/bench/RESULTS.md: riding did not pay there).
// 24 steps of 128; besides them the trainer registers, pulls the initial parameters and
// completes, and its held-out evaluation prefetches once per batch of 128 and reduces through
// pserver 0 (send and fetch).
TEST(PsClusterTest, OneTrainerKeepsItsLookupsOwnRequest) {
  std::string dir = MakeTempDir("ctr_one_trainer");
  PsJob job;
  job.example = "ctr";
  job.pservers = 1;
  job.trainers = 1;
  job.flags = {"--num_examples=3072", "--num_test_examples=512", "--batch_size=128",
               "--epochs=1",          "--seed=2",                 "--vocab_per_slot=500",
               "--distributed_tables", "--heartbeat_s=0"};
  RunPsJob(job, dir);
  const int64_t steps = 3072 / 128;
  const int64_t eval_batches = 512 / 128;
  const std::string log = ReadFileOrEmpty(dir + "/pserver.0.log");
  const int64_t requests = SumAfter(log, " requests=");
  EXPECT_GE(requests, 2 * steps) << log;  // riding would make about steps + 8
  EXPECT_LE(requests, 2 * steps + 4 + eval_batches + 2) << log;
  // Its own lookup requests: the optimize takes them (fused), some looked up ahead of it.
  EXPECT_GT(SumAfter(log, " fused_prefetches="), 0) << log;
  ASSERT_NE(log.find(" lookups_ahead="), std::string::npos) << log;
  EXPECT_LE(SumAfter(log, " lookups_ahead="), SumAfter(log, " fused_prefetches=")) << log;
  // Every update of the 26 table groups took the rows its batch's lookup found.
  EXPECT_EQ(SumAfter(log, " table_updates_reusing_lookups="), 26 * steps) << log;
}

// The held-out value "<key> X" of trainer 0's evaluation line `line` (NaN when missing).
double EvalValue(const std::string& line, const std::string& key) {
  const size_t pos = line.find(" " + key + " ");
  return pos == std::string::npos ? std::nan("") : std::strtod(line.c_str() + pos + key.size() + 2, nullptr);
}

// Distributed evaluation (--eval_every_steps): each of 2 trainers scores its half of the
// held-out set, pserver 0 sums the partials and trainer 0 reports the job's result, which
// equals one machine scoring the whole set with the same parameters (the AUC histograms
// exactly, the loss to float rounding).
TEST(PsClusterTest, DistributedEvaluationEqualsOneMachineOnTheWholeTestSet) {
  const std::string dir = MakeTempDir("dist_eval");
  examples::ExampleOptions eo = Example("ctr", 2048, 6);
  eo.num_test_examples = 301;  // an odd split: 150 and 151
  eo.distributed_tables = false;  // every parameter reaches the trainers' dumps
  PsJob job;
  job.example = "ctr";
  job.flags = ExampleFlags(eo, 128, 1);
  job.flags.push_back("--nodistributed_tables");
  job.flags.push_back("--eval_every_steps=5");
  std::vector<Params> params = RunPsJob(job, dir);
  ASSERT_EQ(params.size(), 2u);
  const std::string log = ReadFileOrEmpty(dir + "/trainer.0.log");
  std::vector<std::string> evals;
  for (absl::string_view line : absl::StrSplit(log, '\n')) {
    if (absl::StrContains(line, "held-out loss")) evals.emplace_back(line);
  }
  // Steps 5, 10 and 15 of 16, and the end.
  ASSERT_EQ(evals.size(), 4u) << log;
  EXPECT_NE(evals.back().find("on 301 examples at step 16 (2 trainers)"), std::string::npos)
      << evals.back();
  EXPECT_EQ(ReadFileOrEmpty(dir + "/trainer.1.log").find("held-out loss"), std::string::npos);

  // One machine: the dumped parameters, the whole held-out set.
  auto registry = NewStandardOpRegistry();
  auto model = examples::BuildExampleModel(*registry, eo);
  ASSERT_TRUE(model.ok()) << model.status();
  auto data = examples::LoadExampleData(eo);
  ASSERT_TRUE(data.ok()) << data.status();
  LocalTrainerOptions o;
  o.batch_size = 128;
  auto local = LocalTrainer::Create(registry.get(), *model, o);
  ASSERT_TRUE(local.ok()) << local.status();
  for (const auto& [name, t] : params[0]) {
    (*local)->scope()->Var(name)->GetMutable<Tensor>()->CopyFrom(t);
  }
  auto whole = (*local)->EvaluatePartial(data->test, 0, 301);
  ASSERT_TRUE(whole.ok()) << whole.status();
  const EvalResult want = whole->Result();
  ASSERT_TRUE(want.has_auc);
  EXPECT_NEAR(EvalValue(evals.back(), "auc"), want.auc, 1e-8) << evals.back();
  EXPECT_NEAR(EvalValue(evals.back(), "loss"), want.mean_loss, 1e-6 * want.mean_loss)
      << evals.back();
}

// Collective mode: trainers only (Gloo all-reduce, rendezvous at trainer 0), each fed 1/N of
// every global batch, equal single-machine training on the full batches.
class CollectiveTest : public ::testing::TestWithParam<int> {};

TEST_P(CollectiveTest, EqualsSingleMachine) {
  const int n = GetParam();
  std::string dir = MakeTempDir("collective");
  const examples::ExampleOptions eo = Example("mlp_regression", 960, 4);
  std::vector<std::string> flags = ExampleFlags(eo, 48, 2);
  flags.push_back("--example=mlp_regression");
  RunCollectiveTrainers(dir, n, flags);
  if (HasFatalFailure()) return;
  ExpectDumpsClose(dir, n, SingleMachine(eo, 48, 4, 2), 1e-5);
  const std::string log = ReadFileOrEmpty(dir + "/trainer.0.log");
  EXPECT_NE(log.find("all-reduce overlapped with backward"), std::string::npos);
  // The held-out evaluation: every trainer scored its share, the all-reduce summed them.
  EXPECT_NE(log.find(absl::StrCat("on 64 examples at step 40 (", n, " trainers)")),
            std::string::npos)
      << log;
}

INSTANTIATE_TEST_SUITE_P(TwoAndThreeTrainers, CollectiveTest, ::testing::Values(2, 3));

// The overlapped all-reduce in buckets of 1 KiB (the MLP's four gradients, 4.4 KB, make several
// buckets reduced while backward runs) and the single all-reduce after backward both equal one
// machine.
TEST(PsClusterTest, CollectiveOverlappedBucketsAndOneAllReduceEqualSingleMachine) {
  const examples::ExampleOptions eo = Example("mlp_regression", 960, 4);
  const Params want = SingleMachine(eo, 48, 4, 2);
  for (const std::string& mode : {std::string("--allreduce_bucket_kb=1"),
                                  std::string("--allreduce_overlap=false")}) {
    std::string dir = MakeTempDir("collective_overlap");
    std::vector<std::string> flags = ExampleFlags(eo, 48, 2);
    flags.push_back("--example=mlp_regression");
    flags.push_back(mode);
    RunCollectiveTrainers(dir, 2, flags);
    if (HasFatalFailure()) return;
    ExpectDumpsClose(dir, 2, want, 1e-5);
    const bool overlapped =
        ReadFileOrEmpty(dir + "/trainer.0.log").find("all-reduce overlapped") != std::string::npos;
    EXPECT_EQ(overlapped, mode != "--allreduce_overlap=false") << mode;
  }
}

double HeldOutLoss(const std::string& dir) {
  std::string log = ReadFileOrEmpty(dir + "/trainer.0.log");
  size_t pos = log.find("held-out loss ");
  EXPECT_NE(pos, std::string::npos) << log;
  return pos == std::string::npos ? -1 : std::strtod(log.c_str() + pos + 14, nullptr);
}

// Param: the example, "ctr_table_wise" for ctr with --table_placement=table_wise.
class AsyncTest : public ::testing::TestWithParam<std::string> {
 protected:
  PsJob Job(std::vector<std::string> flags) const {
    PsJob job;
    job.example = GetParam() == "ctr_table_wise" ? "ctr" : GetParam();
    if (GetParam() == "ctr_table_wise") flags.push_back("--table_placement=table_wise");
    job.flags = std::move(flags);
    return job;
  }
};

// Async training (trainers read their own writes) converges at least as well as sync after the
// same samples (held-out loss at most 10% above sync's).
TEST_P(AsyncTest, ConvergesLikeSync) {
  PsJob job = Job({"--num_examples=2048", "--num_test_examples=512", "--batch_size=64",
                   GetParam() == "mlp_regression" ? "--epochs=25" : "--epochs=2", "--seed=11",
                   "--vocab_per_slot=500", "--min_block_size=400"});
  std::string sync_dir = MakeTempDir("sync_ref");
  RunPsJob(job, sync_dir);
  double sync_loss = HeldOutLoss(sync_dir);
  job.flags.push_back("--sync_mode=false");
  std::string dir = MakeTempDir("async");
  RunPsJob(job, dir);
  double async_loss = HeldOutLoss(dir);
  EXPECT_LT(async_loss, 1.1 * sync_loss) << "async " << async_loss << " vs sync " << sync_loss;
}

// Fully asynchronous trainers with merged pushes: every gradient a trainer pushed is applied
// exactly once (pserver counters equal trainer counters).
TEST_P(AsyncTest, AppliesEveryPushExactlyOnce) {
  PsJob job = Job({"--num_examples=2048", "--num_test_examples=64", "--batch_size=64", "--epochs=2",
                   "--seed=11", "--vocab_per_slot=500", "--min_block_size=400", "--sync_mode=false",
                   "--async_max_merge=3", "--noasync_read_own_writes"});
  std::string dir = MakeTempDir("async_count");
  RunPsJob(job, dir);
  std::string pservers =
      ReadFileOrEmpty(dir + "/pserver.0.log") + ReadFileOrEmpty(dir + "/pserver.1.log");
  int64_t applied = SumAfter(pservers, "grads_applied=");
  int64_t sent_total = 0;
  for (int k = 0; k < job.trainers; ++k) {
    std::string tlog = ReadFileOrEmpty(absl::StrCat(dir, "/trainer.", k, ".log"));
    int64_t sent = SumAfter(tlog, " sent=");
    int64_t pushed = SumAfter(tlog, "pushed=");
    EXPECT_GT(sent, 0) << tlog;
    EXPECT_LE(sent, pushed);
    EXPECT_EQ(SumAfter(pservers, absl::StrCat("grads_from_trainer_", k, "=")), sent) << pservers;
    sent_total += sent;
  }
  EXPECT_EQ(applied, sent_total) << pservers;
}

INSTANTIATE_TEST_SUITE_P(Examples, AsyncTest,
                         ::testing::Values("mlp_regression", "ctr", "ctr_table_wise"));

// One async trainer that reads its own writes has each push applied before its next receive,
// and the next batch's lookups ride on that receive: it trains exactly as one sync trainer.
TEST(PsClusterTest, OneAsyncTrainerReadingItsOwnWritesTrainsAsSync) {
  PsJob job;
  job.example = "ctr";
  job.trainers = 1;
  job.flags = {
      "--num_examples=1024",  "--num_test_examples=64", "--batch_size=64", "--epochs=1", "--seed=5",
      "--vocab_per_slot=500", "--distributed_tables"};
  auto sync = RunPsJob(job, MakeTempDir("one_sync"));
  job.flags.push_back("--sync_mode=false");
  auto async = RunPsJob(job, MakeTempDir("one_async"));
  ASSERT_EQ(sync.size(), 1u);
  ASSERT_EQ(async.size(), 1u);
  ExpectParamsClose(async[0], sync[0], 1e-5);
}

// An async trainer that reads its own writes (the default) makes 1 request per step to each
// pserver: its push carries its receive and the next batch's lookups for every table (a
// SendGetBatch without the send barrier). Without read-own-writes it makes 2: the
// communicator's push (merged pushes make fewer) and the receive carrying the lookups; the
// lookups in their own request would make one more. Besides the steps, each trainer registers,
// pulls the initial parameters, looks its first batch up and completes, and the held-out
// evaluation prefetches once per batch of each trainer's half and reduces through pserver 0.
TEST(PsClusterTest, AsyncStepCarriesItsReceiveAndTheLookups) {
  for (bool read_own_writes : {true, false}) {
    SCOPED_TRACE(read_own_writes ? "reading its own writes" : "not reading its own writes");
    std::string dir = MakeTempDir("async_requests");
    PsJob job;
    job.example = "ctr";
    job.flags = {"--num_examples=6400",
                 "--num_test_examples=512",
                 "--batch_size=128",
                 "--epochs=1",
                 "--seed=2",
                 "--vocab_per_slot=500",
                 "--distributed_tables",
                 "--sync_mode=false",
                 "--heartbeat_s=0",
                 read_own_writes ? "--async_read_own_writes" : "--noasync_read_own_writes"};
    RunPsJob(job, dir);
    const int64_t trainer_steps = 2 * (6400 / 128);
    const int64_t eval_batches = 2 * ((256 + 127) / 128);
    const int64_t per_step = read_own_writes ? 1 : 2;
    for (int p = 0; p < 2; ++p) {
      const std::string log = PserverLog(dir, p);
      const int64_t requests = SumAfter(log, " requests=");
      EXPECT_GE(requests, trainer_steps) << log;
      EXPECT_LE(requests, per_step * trainer_steps + 4 * 2 + eval_batches + (p == 0 ? 3 : 0))
          << log;
      // Each push of a trainer reading its own writes is the gradient of the batch it looked
      // up last: its table updates take the lookup's rows (merged pushes may not).
      const int64_t reused = SumAfter(log, " table_updates_reusing_lookups=");
      if (read_own_writes) EXPECT_EQ(reused, 26 * trainer_steps) << log;
    }
  }
}

// Kill trainer 1 (param 1) or both trainers (param 2) in sync mode: the pservers fail within the
// timeout with a message naming the missing trainers, the surviving trainer fails too, and no
// process is left.
class KillTest : public ::testing::TestWithParam<int> {};

TEST_P(KillTest, PserversFailWithinTheTimeoutAndNothingHangs) {
  std::string dir = MakeTempDir("kill");
  ProcessGroup group;
  auto eps = FreeEndpoints(2);
  ASSERT_TRUE(eps.ok());
  std::vector<std::string> common = {absl::StrCat("--pservers=", absl::StrJoin(*eps, ",")),
                                     "--trainers=2",
                                     "--example=mlp_regression",
                                     "--epochs=100000",
                                     "--batch_size=32",
                                     "--num_examples=256",
                                     "--barrier_timeout_s=2",
                                     "--rpc_deadline_s=20",
                                     "--log_every_steps=1"};
  std::vector<pid_t> ps, tr;
  for (int p = 0; p < 2; ++p) {
    std::vector<std::string> args = {RunfilePath("pserver/tessera_pserver"),
                                     "--current_endpoint=" + (*eps)[p]};
    args.insert(args.end(), common.begin(), common.end());
    ps.push_back(*group.Start(args, absl::StrCat(dir, "/pserver.", p, ".log")));
  }
  for (int k = 0; k < 2; ++k) {
    std::vector<std::string> args = {RunfilePath("trainer/tessera_trainer"),
                                     absl::StrCat("--trainer_id=", k)};
    args.insert(args.end(), common.begin(), common.end());
    tr.push_back(*group.Start(args, absl::StrCat(dir, "/trainer.", k, ".log")));
  }
  // Wait (bounded) until training is under way, then kill trainer 1.
  absl::Time deadline = absl::Now() + absl::Seconds(60);
  while (ReadFileOrEmpty(dir + "/trainer.0.log").find("step 5 ") == std::string::npos) {
    ASSERT_LT(absl::Now(), deadline) << ReadFileOrEmpty(dir + "/trainer.0.log");
    ASSERT_TRUE(group.Running(tr[1])) << ReadFileOrEmpty(dir + "/trainer.1.log");
    absl::SleepFor(absl::Milliseconds(50));
  }
  absl::Time killed = absl::Now();
  group.Kill(tr[1], SIGKILL);
  std::vector<pid_t> expect_failed = {ps[0], ps[1]};
  if (GetParam() == 1) {
    expect_failed.push_back(tr[0]);
  } else {
    group.Kill(tr[0], SIGKILL);  // every trainer gone: nobody reaches a barrier
  }
  for (pid_t pid : expect_failed) {
    auto status = group.Wait(pid, absl::Seconds(30));
    ASSERT_TRUE(status.ok()) << status.status();
    EXPECT_FALSE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0);
  }
  EXPECT_LT(absl::Now() - killed, absl::Seconds(30));
  // Each pserver fails with one of the two messages (which one depends on where the trainers
  // were: a pserver whose barrier already completed sees only silence while the survivor waits
  // on the other pserver); with one trainer killed, some pserver names it.
  bool named = false;
  for (int p = 0; p < 2; ++p) {
    std::string log = PserverLog(dir, p);
    EXPECT_TRUE(log.find("presumed dead") != std::string::npos ||
                log.find("did not arrive") != std::string::npos)
        << log;
    named |= log.find("trainers [1] did not arrive") != std::string::npos;
    // A pserver stopped by the surviving trainer's ABORT passes that trainer's error on.
    EXPECT_EQ(log.find("(its log says why)"), std::string::npos) << log;
  }
  if (GetParam() == 1) EXPECT_TRUE(named);
  for (pid_t pid : group.pids()) EXPECT_FALSE(group.Running(pid));
}

INSTANTIATE_TEST_SUITE_P(OneOrAllTrainers, KillTest, ::testing::Values(1, 2));

// Async mode, trainer 1 killed mid-training (1 pserver, 2 trainers, 2 s timeout). Without
// --async_drop_silent_trainers the pserver fails naming trainer 1; with it, the pserver drops
// trainer 1, trainer 0 trains to the end, the pserver exits 0 and has applied every gradient
// trainer 0 sent exactly once.
class AsyncTrainerLossTest : public ::testing::TestWithParam<bool> {};

TEST_P(AsyncTrainerLossTest, SilentTrainerFailsOrIsDropped) {
  const bool drop = GetParam();
  std::string dir = MakeTempDir(drop ? "async_drop" : "async_fail");
  ProcessGroup group;
  auto eps = FreeEndpoints(1);
  ASSERT_TRUE(eps.ok());
  std::vector<std::string> common = {
      "--pservers=" + (*eps)[0],  "--trainers=2",
      "--example=mlp_regression", "--sync_mode=false",
      "--batch_size=32",          "--num_examples=256",
      "--barrier_timeout_s=2",    "--rpc_deadline_s=20",
      "--log_every_steps=1",      drop ? "--async_drop_silent_trainers=true" : "--seed=1",
      // Trainer 0 outlives trainer 1 by more than the timeout (~10 s of training); without the
      // option it trains until the pserver's failure reaches it.
      drop ? "--epochs=1500" : "--epochs=100000"};
  std::vector<std::string> ps_args = {RunfilePath("pserver/tessera_pserver"),
                                      "--current_endpoint=" + (*eps)[0]};
  ps_args.insert(ps_args.end(), common.begin(), common.end());
  pid_t ps = *group.Start(ps_args, dir + "/pserver.0.log");
  std::vector<pid_t> tr;
  for (int k = 0; k < 2; ++k) {
    std::vector<std::string> args = {RunfilePath("trainer/tessera_trainer"),
                                     absl::StrCat("--trainer_id=", k)};
    args.insert(args.end(), common.begin(), common.end());
    tr.push_back(*group.Start(args, absl::StrCat(dir, "/trainer.", k, ".log")));
  }
  absl::Time deadline = absl::Now() + absl::Seconds(60);
  while (ReadFileOrEmpty(dir + "/trainer.1.log").find("epoch 2 ") == std::string::npos) {
    ASSERT_LT(absl::Now(), deadline) << ReadFileOrEmpty(dir + "/trainer.1.log");
    ASSERT_TRUE(group.Running(tr[1])) << ReadFileOrEmpty(dir + "/trainer.1.log");
    absl::SleepFor(absl::Milliseconds(20));
  }
  group.Kill(tr[1], SIGKILL);
  auto ps_status = group.Wait(ps, absl::Seconds(120));
  ASSERT_TRUE(ps_status.ok()) << ps_status.status();
  std::string ps_log = ReadFileOrEmpty(dir + "/pserver.0.log");
  if (drop) {
    auto t0 = group.Wait(tr[0], absl::Seconds(120));
    ASSERT_TRUE(t0.ok()) << t0.status();
    std::string t0_log = ReadFileOrEmpty(dir + "/trainer.0.log");
    EXPECT_TRUE(WIFEXITED(*t0) && WEXITSTATUS(*t0) == 0) << t0_log;
    EXPECT_TRUE(WIFEXITED(*ps_status) && WEXITSTATUS(*ps_status) == 0) << ps_log;
    EXPECT_NE(ps_log.find("dropped_silent_trainers=[1]"), std::string::npos) << ps_log;
    const int64_t sent = SumAfter(t0_log, " sent=");
    EXPECT_GT(sent, 0) << t0_log;
    EXPECT_EQ(SumAfter(ps_log, "grads_from_trainer_0="), sent) << ps_log;
  } else {
    EXPECT_FALSE(WIFEXITED(*ps_status) && WEXITSTATUS(*ps_status) == 0) << ps_log;
    EXPECT_NE(ps_log.find("trainers [1] sent nothing for 2s"), std::string::npos) << ps_log;
    auto t0 = group.Wait(tr[0], absl::Seconds(60));  // its next request is refused
    ASSERT_TRUE(t0.ok()) << t0.status();
    EXPECT_FALSE(WIFEXITED(*t0) && WEXITSTATUS(*t0) == 0);
  }
  for (pid_t pid : group.pids()) EXPECT_FALSE(group.Running(pid));
}

INSTANTIATE_TEST_SUITE_P(FailOrDrop, AsyncTrainerLossTest, ::testing::Bool());

}  // namespace
}  // namespace tessera
