#include "trainer/checkpoints.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "common/base/status.h"

namespace tessera {

namespace {

// The shuffle buffer a streamed job's checkpoint records (-1: the in-memory reader).
int64_t StreamShuffleBuffer(const ClusterConfig& config) {
  return config.reader == "stream" ? config.shuffle_buffer : -1;
}

// A streamed job's position only means something to a job that replays the same streams.
absl::Status CheckSameStreams(const ClusterConfig& config, const io::TrainerCheckpointState& s) {
  const int64_t buffer = StreamShuffleBuffer(config);
  if (s.stream_shuffle_buffer < 0 && buffer < 0) return absl::OkStatus();
  auto refuse = [](absl::string_view what, auto saved, auto now) {
    return absl::FailedPreconditionError(absl::StrCat(
        "the checkpoint was written by a job with ", what, "=", saved, " but this one has ", what,
        "=", now, " (a streamed job resumes by reading its streams again up to the checkpoint's "
        "step, which needs the same --reader, --shuffle_buffer, --seed, --batch_size and --trainers)"));
  };
  if (s.stream_shuffle_buffer < 0 || buffer < 0) {
    return refuse("--reader", s.stream_shuffle_buffer < 0 ? "memory" : "stream", config.reader);
  }
  if (s.stream_shuffle_buffer != buffer) {
    return refuse("--shuffle_buffer", s.stream_shuffle_buffer, buffer);
  }
  if (s.seed != config.seed) return refuse("--seed", s.seed, config.seed);
  if (s.batch_size >= 0 && s.batch_size != config.batch_size) {
    return refuse("--batch_size", s.batch_size, config.batch_size);
  }
  if (s.trainers != config.trainers) return refuse("--trainers", s.trainers, config.trainers);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::optional<TrainPosition>> ReadResumePosition(const ClusterConfig& config,
                                                                io::FileSystem* fs,
                                                                std::ostream& log) {
  if (config.init_from.empty()) return std::nullopt;
  absl::StatusOr<io::TrainerCheckpointState> state =
      [&]() -> absl::StatusOr<io::TrainerCheckpointState> {
    TS_ASSIGN_OR_RETURN(std::string ckpt, io::ResolveCheckpoint(fs, config.init_from));
    log << "trainer " << config.trainer_id << ": restoring " << ckpt << std::endl;
    TS_ASSIGN_OR_RETURN(io::TrainerCheckpointState s, io::ReadTrainerCheckpoint(fs, ckpt));
    TS_RETURN_IF_ERROR(CheckSameStreams(config, s));
    return s;
  }();
  if (!state.ok()) {
    return absl::Status(state.status().code(), absl::StrCat("--init_from=", config.init_from,
                                                            ": ", state.status().message()));
  }
  const TrainPosition p{state->step, state->epoch, state->step_in_epoch};
  log << "trainer " << config.trainer_id << ": resuming at step " << p.global_step << " (epoch "
      << p.epoch << ", step " << p.step_in_epoch << " of it)" << std::endl;
  return p;
}

CheckpointWriter::CheckpointWriter(const ClusterConfig& config, io::FileSystem* fs,
                                   std::vector<PServerClient*> pservers, std::ostream* log)
    : config_(config), fs_(fs), pservers_(std::move(pservers)), log_(log) {}

absl::Status CheckpointWriter::Write(const RequestMeta& meta, const TrainPosition& p) {
  TS_ASSIGN_OR_RETURN(std::string dir,
                      io::BeginCheckpoint(fs_, config_.checkpoint_dir, p.global_step));
  const int num_ps = static_cast<int>(pservers_.size());
  StatusGroup group(num_ps);
  for (PServerClient* pserver : pservers_) {
    // Pservers write under their own --checkpoint_dir: the request names only ckpt-<step>.
    pserver->CheckpointAsync(meta, io::CheckpointDirName(p.global_step), group.Callback());
  }
  TS_RETURN_IF_ERROR(group.Wait());
  std::vector<std::string> manifests;
  for (int i = 0; i < num_ps; ++i) {
    manifests.push_back(io::PserverFilePrefix(i, num_ps) + ".MANIFEST");
  }
  io::TrainerCheckpointState st;
  st.step = p.global_step;
  st.epoch = p.epoch;
  st.step_in_epoch = p.step_in_epoch;
  st.seed = config_.seed;
  st.trainers = config_.trainers;
  st.num_pservers = num_ps;
  st.stream_shuffle_buffer = StreamShuffleBuffer(config_);
  st.batch_size = config_.batch_size;
  TS_RETURN_IF_ERROR(io::CommitTrainerCheckpoint(fs_, dir, st, manifests));
  TS_RETURN_IF_ERROR(io::FinishCheckpoint(fs_, config_.checkpoint_dir, p.global_step,
                                          static_cast<int>(config_.checkpoint_keep)));
  last_step_ = p.global_step;
  *log_ << "trainer 0: checkpoint " << dir << " committed" << std::endl;
  return absl::OkStatus();
}

absl::Status CheckpointWriter::Save(const RequestMeta& meta, const TrainPosition& p) {
  absl::Status s = Write(meta, p);
  if (s.ok()) return s;
  // No partial ckpt-* is left behind (the previous complete one stays the one to restore).
  absl::Status cleaned = io::AbandonCheckpoint(fs_, config_.checkpoint_dir, p.global_step);
  if (!cleaned.ok()) {
    *log_ << "trainer 0: could not remove the partial checkpoint of step " << p.global_step
          << ": " << cleaned.message() << std::endl;
  }
  return absl::Status(s.code(), absl::StrCat("checkpoint of step ", p.global_step,
                                             " in --checkpoint_dir=", config_.checkpoint_dir,
                                             ": ", s.message()));
}

}  // namespace tessera
