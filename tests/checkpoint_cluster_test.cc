// Checkpoints with real daemons (tessera_pserver / tessera_trainer over gRPC on loopback, free
// ports, every process killed by pid): a sync MLP job of 2 trainers x 2 pservers checkpointing
// every few steps loses a pserver to kill -9; the job fails; the whole job restarts from the
// last complete checkpoint. The restarted pservers serve exactly the checkpoint's bytes, and
// the job ends with the same parameters as a run that was never interrupted.
#include <signal.h>
#include <sys/wait.h>

#include <cmath>
#include <cstring>
#include <iostream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "common/data/criteo.h"
#include "common/data/synthetic.h"
#include "common/io/checkpoint_io.h"
#include "common/framework/params_io.h"
#include "common/rpc/grpc/grpc_client.h"
#include "gtest/gtest.h"
#include "proto/tensor.pb.h"
#include "tests/cluster_util.h"

namespace tessera {
namespace {

constexpr int kPservers = 2;
constexpr int kTrainers = 2;

struct Cluster {
  ProcessGroup group;
  std::vector<std::string> eps;
  std::vector<pid_t> pservers, trainers;
};

std::vector<std::string> CommonFlags(const std::vector<std::string>& eps) {
  return {absl::StrCat("--pservers=", absl::StrJoin(eps, ",")),
          absl::StrCat("--trainers=", kTrainers),
          "--example=mlp_regression",
          "--num_examples=12000",
          "--batch_size=64",
          "--epochs=2",
          "--min_block_size=64",  // hidden.w is sliced across both pservers
          "--job_id=ckpt",
          "--log_every_steps=50",
          "--barrier_timeout_s=10",
          "--rpc_deadline_s=10"};
}

void StartPservers(Cluster* c, const std::string& dir, const std::vector<std::string>& extra,
                   int num = kPservers) {
  auto eps = FreeEndpoints(num);
  ASSERT_TRUE(eps.ok()) << eps.status();
  c->eps = *eps;
  for (int p = 0; p < num; ++p) {
    std::vector<std::string> args = {RunfilePath("pserver/tessera_pserver"),
                                     "--current_endpoint=" + c->eps[p]};
    for (const auto& f : CommonFlags(c->eps)) args.push_back(f);
    args.insert(args.end(), extra.begin(), extra.end());
    auto pid = c->group.Start(args, absl::StrCat(dir, "/pserver.", p, ".log"));
    ASSERT_TRUE(pid.ok()) << pid.status();
    c->pservers.push_back(*pid);
  }
}

void StartTrainers(Cluster* c, const std::string& dir, const std::vector<std::string>& extra) {
  for (int k = 0; k < kTrainers; ++k) {
    std::vector<std::string> args = {RunfilePath("trainer/tessera_trainer"),
                                     absl::StrCat("--trainer_id=", k),
                                     absl::StrCat("--dump_params=", dir, "/params.", k)};
    for (const auto& f : CommonFlags(c->eps)) args.push_back(f);
    args.insert(args.end(), extra.begin(), extra.end());
    auto pid = c->group.Start(args, absl::StrCat(dir, "/trainer.", k, ".log"));
    ASSERT_TRUE(pid.ok()) << pid.status();
    c->trainers.push_back(*pid);
  }
}

// Waits (bounded) for every process of `c`; true if all exited 0.
bool WaitAll(Cluster* c, const std::string& dir, absl::Duration timeout) {
  bool all_ok = true;
  for (size_t i = 0; i < c->trainers.size() + c->pservers.size(); ++i) {
    const bool trainer = i < c->trainers.size();
    const pid_t pid = trainer ? c->trainers[i] : c->pservers[i - c->trainers.size()];
    const std::string name =
        trainer ? absl::StrCat("trainer.", i) : absl::StrCat("pserver.", i - c->trainers.size());
    auto status = c->group.Wait(pid, timeout);
    bool ok = status.ok() && WIFEXITED(*status) && WEXITSTATUS(*status) == 0;
    if (!ok) {
      ADD_FAILURE() << name << " did not exit 0:\n"
                    << ReadFileOrEmpty(absl::StrCat(dir, "/", name, ".log"));
    }
    all_ok &= ok;
  }
  return all_ok;
}

std::map<std::string, Tensor> LoadParams(const std::string& path) {
  auto p = LoadVariables(path);
  EXPECT_TRUE(p.ok()) << p.status();
  return p.ok() ? *p : std::map<std::string, Tensor>{};
}

// Equal to 1e-6 relative; *identical is false unless every byte is the same.
void ExpectSameParams(const std::map<std::string, Tensor>& got,
                      const std::map<std::string, Tensor>& want, bool* identical) {
  *identical = false;
  ASSERT_FALSE(want.empty());
  ASSERT_EQ(got.size(), want.size());
  *identical = true;
  for (const auto& [name, w] : want) {
    const Tensor& g = got.at(name);
    ASSERT_EQ(g.shape(), w.shape()) << name;
    if (std::memcmp(g.raw_data(), w.raw_data(), w.nbytes()) == 0) continue;  // bit-identical
    *identical = false;
    for (int64_t i = 0; i < w.numel(); ++i) {
      const double x = g.data<float>()[i], y = w.data<float>()[i];
      ASSERT_LE(std::fabs(x - y), 1e-6 * std::max(1.0, std::fabs(y))) << name << "[" << i << "]";
    }
  }
}

TEST(CheckpointClusterTest, KillPserverRestartFromLastCheckpoint) {
  const std::string root = MakeTempDir("ckpt_cluster");
  io::FileSystem* fs = io::PosixFileSystem::Default();
  for (const char* d : {"/ref", "/a", "/b", "/c"}) ASSERT_TRUE(fs->CreateDirs(root + d).ok());

  // The reference: the same job, never interrupted (no checkpoints either).
  std::map<std::string, Tensor> reference;
  {
    Cluster c;
    ASSERT_NO_FATAL_FAILURE(StartPservers(&c, root + "/ref", {}));
    ASSERT_NO_FATAL_FAILURE(StartTrainers(&c, root + "/ref", {}));
    ASSERT_TRUE(WaitAll(&c, root + "/ref", absl::Seconds(120)));
    reference = LoadParams(root + "/ref/params.0");
  }

  // Checkpoint every 10 steps; kill -9 pserver 1 once a checkpoint of step >= 30 is complete.
  const std::string ckpts = root + "/ckpts";
  const std::vector<std::string> ckpt_flags = {"--checkpoint_dir=" + ckpts,
                                               "--checkpoint_every=10"};
  {
    Cluster c;
    ASSERT_NO_FATAL_FAILURE(StartPservers(&c, root + "/a", ckpt_flags));
    ASSERT_NO_FATAL_FAILURE(StartTrainers(&c, root + "/a", ckpt_flags));
    const absl::Time deadline = absl::Now() + absl::Seconds(120);
    int64_t step = -1;
    while (absl::Now() < deadline && c.group.Running(c.trainers[0])) {
      auto latest = io::ResolveCheckpoint(fs, ckpts);
      if (latest.ok()) {
        auto st = io::ReadTrainerCheckpoint(fs, *latest);
        if (st.ok()) step = st->step;
      }
      if (step >= 30) break;
      absl::SleepFor(absl::Milliseconds(5));
    }
    ASSERT_GE(step, 30) << "no checkpoint of step >= 30 appeared:\n"
                        << ReadFileOrEmpty(root + "/a/trainer.0.log");
    c.group.Kill(c.pservers[1], SIGKILL);
    std::cout << "killed pserver 1 (kill -9) after the checkpoint of step " << step << std::endl;
    // The job fails: every trainer exits non-zero within its RPC deadline / barrier timeout.
    for (int k = 0; k < kTrainers; ++k) {
      auto status = c.group.Wait(c.trainers[k], absl::Seconds(90));
      ASSERT_TRUE(status.ok()) << "trainer " << k << " hangs after the pserver died";
      EXPECT_FALSE(WIFEXITED(*status) && WEXITSTATUS(*status) == 0)
          << "trainer " << k << " finished although a pserver was killed";
    }
    c.group.Kill(c.pservers[0], SIGKILL);
    ASSERT_TRUE(c.group.Wait(c.pservers[0], absl::Seconds(30)).ok());
  }

  // The last complete checkpoint, as the restarted job will find it.
  auto ckpt = io::ResolveCheckpoint(fs, ckpts);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  auto state = io::ReadTrainerCheckpoint(fs, *ckpt);
  ASSERT_TRUE(state.ok()) << state.status();
  EXPECT_GE(state->step, 30);
  EXPECT_EQ(state->step % 10, 0);

  // A copy of it for the resharding run below (the restarted job prunes old checkpoints).
  const std::string copy = root + "/saved/" + io::CheckpointDirName(state->step);
  ASSERT_TRUE(fs->CreateDirs(copy).ok());
  auto names = fs->ListDir(*ckpt);
  ASSERT_TRUE(names.ok());
  for (const auto& n : *names) {
    ASSERT_TRUE(io::WriteFileAtomic(fs, copy + "/" + n, *fs->ReadFile(*ckpt + "/" + n)).ok());
  }

  // Restart the whole job from the checkpoint directory.
  Cluster c;
  const std::vector<std::string> restore = {"--init_from=" + ckpts};
  std::vector<std::string> pserver_flags = restore;  // pservers write only under their own dir
  pserver_flags.push_back("--checkpoint_dir=" + ckpts);
  ASSERT_NO_FATAL_FAILURE(StartPservers(&c, root + "/b", pserver_flags));
  // Before any trainer runs, every variable the pservers saved is served back bit for bit.
  GrpcClientOptions co;
  co.deadline = absl::Seconds(10);
  int compared = 0;
  for (int p = 0; p < kPservers; ++p) {
    const std::string file = absl::StrCat(*ckpt, "/pserver-", p, "-of-", kPservers, ".dense");
    auto bytes = fs->ReadFile(file);
    ASSERT_TRUE(bytes.ok()) << bytes.status();
    TensorMap saved;
    ASSERT_TRUE(saved.ParseFromString(*bytes)) << file;
    GrpcPServerClient client(c.eps[p], co);
    for (const auto& [name, proto] : saved.tensors()) {
      Variable got;
      absl::Status s;
      // The pserver may still be restoring: retry until it serves (bounded).
      for (int attempt = 0; attempt < 300; ++attempt) {
        s = client.GetVariable({"ckpt", 0, state->step}, name, &got);
        if (s.ok() || s.code() != absl::StatusCode::kUnavailable) break;
        absl::SleepFor(absl::Milliseconds(100));
      }
      ASSERT_TRUE(s.ok()) << c.eps[p] << " " << name << ": " << s;
      const Tensor& t = got.Get<Tensor>();
      ASSERT_EQ(t.nbytes(), proto.data().size()) << name;
      EXPECT_EQ(0, std::memcmp(t.raw_data(), proto.data().data(), t.nbytes()))
          << name << " differs from the checkpoint";
      ++compared;
    }
  }
  EXPECT_GE(compared, 8);  // parameters, velocities and the learning rate on both pservers
  std::vector<std::string> trainer_flags = restore;
  trainer_flags.insert(trainer_flags.end(), ckpt_flags.begin(), ckpt_flags.end());
  ASSERT_NO_FATAL_FAILURE(StartTrainers(&c, root + "/b", trainer_flags));
  ASSERT_TRUE(WaitAll(&c, root + "/b", absl::Seconds(120)));
  EXPECT_NE(ReadFileOrEmpty(root + "/b/trainer.1.log")
                .find(absl::StrCat("resuming at step ", state->step)),
            std::string::npos);
  bool identical0, identical1;
  ExpectSameParams(LoadParams(root + "/b/params.0"), reference, &identical0);
  ExpectSameParams(LoadParams(root + "/b/params.1"), reference, &identical1);
  std::cout << "restarted from the checkpoint of step " << state->step << "; " << compared
            << " restored variables served bit-identical; final parameters "
            << (identical0 && identical1 ? "bit-identical" : "within 1e-6")
            << " to the uninterrupted run" << std::endl;
  // The restarted job went on checkpointing; the newest is the final step's.
  auto last = io::ResolveCheckpoint(fs, ckpts);
  ASSERT_TRUE(last.ok());
  auto final_state = io::ReadTrainerCheckpoint(fs, *last);
  ASSERT_TRUE(final_state.ok());
  EXPECT_GT(final_state->step, state->step);
  EXPECT_EQ(final_state->epoch, 2);

  // Resharding over gRPC: the checkpoint of 2 pservers restored into a job of 3 ends with the
  // same parameters too (hidden.w is then sliced in 3).
  Cluster r;
  const std::vector<std::string> from_copy = {"--init_from=" + copy};
  ASSERT_NO_FATAL_FAILURE(StartPservers(&r, root + "/c", from_copy, 3));
  ASSERT_NO_FATAL_FAILURE(StartTrainers(&r, root + "/c", from_copy));
  ASSERT_TRUE(WaitAll(&r, root + "/c", absl::Seconds(120)));
  bool identical3;
  ExpectSameParams(LoadParams(root + "/c/params.0"), reference, &identical3);
  std::cout << "restored into 3 pservers: final parameters "
            << (identical3 ? "bit-identical" : "within 1e-6") << std::endl;
}

// Streamed data (--reader=stream): a job restored from a checkpoint taken in the middle of an
// epoch, with every trainer in the middle of a file and of its shuffle buffer, replays its
// streams to the saved step and ends with the parameters of the uninterrupted job, bit for bit.
TEST(CheckpointClusterTest, StreamedDataResumesMidFileBitIdentical) {
  const std::string root = MakeTempDir("ckpt_stream");
  io::FileSystem* fs = io::PosixFileSystem::Default();
  for (const char* d : {"/data", "/ref", "/a", "/b"}) ASSERT_TRUE(fs->CreateDirs(root + d).ok());
  data::CtrDataOptions o;
  o.vocab_per_slot = 500;
  for (int f = 0; f < 3; ++f) {
    o.seed = 11 + f;
    auto part = data::MakeCtrData(400 + 50 * f, o);
    ASSERT_TRUE(part.ok()) << part.status();
    ASSERT_TRUE(data::WriteCriteoFile(absl::StrCat(root, "/data/part-", f, ".txt"), *part).ok());
  }
  auto flags = [&](const std::vector<std::string>& eps) {
    return std::vector<std::string>{absl::StrCat("--pservers=", absl::StrJoin(eps, ",")),
                                    absl::StrCat("--trainers=", kTrainers),
                                    "--example=ctr",
                                    "--train_data=" + root + "/data",
                                    "--reader=stream",
                                    "--shuffle_buffer=50",
                                    "--reader_queue=64",
                                    "--batch_size=64",
                                    "--epochs=2",
                                    "--job_id=ckpt",
                                    "--log_every_steps=0",
                                    "--barrier_timeout_s=10",
                                    "--rpc_deadline_s=10"};
  };
  auto run = [&](const std::string& dir, const std::vector<std::string>& extra) {
    ProcessGroup group;
    auto eps = FreeEndpoints(kPservers);
    ASSERT_TRUE(eps.ok()) << eps.status();
    std::vector<std::pair<pid_t, std::string>> procs;
    for (int p = 0; p < kPservers; ++p) {
      std::vector<std::string> args = {RunfilePath("pserver/tessera_pserver"),
                                       "--current_endpoint=" + (*eps)[p]};
      for (const auto& f : flags(*eps)) args.push_back(f);
      args.insert(args.end(), extra.begin(), extra.end());
      const std::string log = absl::StrCat(dir, "/pserver.", p, ".log");
      auto pid = group.Start(args, log);
      ASSERT_TRUE(pid.ok()) << pid.status();
      procs.push_back({*pid, log});
    }
    for (int k = 0; k < kTrainers; ++k) {
      std::vector<std::string> args = {RunfilePath("trainer/tessera_trainer"),
                                       absl::StrCat("--trainer_id=", k),
                                       absl::StrCat("--dump_params=", dir, "/params.", k)};
      for (const auto& f : flags(*eps)) args.push_back(f);
      args.insert(args.end(), extra.begin(), extra.end());
      const std::string log = absl::StrCat(dir, "/trainer.", k, ".log");
      auto pid = group.Start(args, log);
      ASSERT_TRUE(pid.ok()) << pid.status();
      procs.push_back({*pid, log});
    }
    for (const auto& [pid, log] : procs) {
      auto status = group.Wait(pid, absl::Seconds(120));
      ASSERT_TRUE(status.ok() && WIFEXITED(*status) && WEXITSTATUS(*status) == 0)
          << log << ":\n" << ReadFileOrEmpty(log);
    }
  };
  ASSERT_NO_FATAL_FAILURE(run(root + "/ref", {}));
  const std::map<std::string, Tensor> reference = LoadParams(root + "/ref/params.0");

  // The same job checkpointing every 5 steps, all checkpoints kept.
  const std::string ckpts = root + "/ckpts";
  ASSERT_NO_FATAL_FAILURE(run(root + "/a", {"--checkpoint_dir=" + ckpts, "--checkpoint_every=5",
                                            "--checkpoint_keep=100"}));
  bool identical = false;
  ExpectSameParams(LoadParams(root + "/a/params.0"), reference, &identical);
  EXPECT_TRUE(identical) << "checkpointing changed the run";
  // Step 5: epoch 0, 5 local batches of 32 into each trainer's stream (mid-file: each file holds
  // 400 or more examples).
  const std::string ckpt = ckpts + "/" + io::CheckpointDirName(5);
  auto state = io::ReadTrainerCheckpoint(fs, ckpt);
  ASSERT_TRUE(state.ok()) << state.status();
  EXPECT_EQ(state->epoch, 0);
  EXPECT_EQ(state->step_in_epoch, 5);
  ASSERT_NO_FATAL_FAILURE(run(root + "/b", {"--init_from=" + ckpt}));
  EXPECT_NE(ReadFileOrEmpty(root + "/b/trainer.1.log").find("resuming at step 5 (epoch 0, step 5"),
            std::string::npos)
      << ReadFileOrEmpty(root + "/b/trainer.1.log");
  for (int k = 0; k < kTrainers; ++k) {
    ExpectSameParams(LoadParams(absl::StrCat(root, "/b/params.", k)), reference, &identical);
    EXPECT_TRUE(identical) << "trainer " << k << " after the restore is not bit-identical";
  }
}

}  // namespace
}  // namespace tessera
