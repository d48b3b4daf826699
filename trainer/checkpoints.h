// A trainer's side of checkpoints (README "Checkpoints").
//
// Restore (every trainer, --init_from): the position of the checkpoint, which every trainer
// resumes at. In sync mode every trainer is where trainer 0 is, and the data order depends only
// on the seed and the epoch; a streamed job (--reader=stream) replays each trainer's streams to
// the position, which needs the same seed, trainer count and shuffle buffer as the checkpointed
// job (and its batch size): a restore that differs in one of them is refused, naming both
// values.
//
// Save (trainer 0, --checkpoint_dir): asks every pserver to write its shard of ckpt-<step> under
// its own --checkpoint_dir (all at once), then commits trainer.state and the MANIFEST listing
// the pservers' manifests, and keeps the newest --checkpoint_keep. A failed save removes its
// partial directory, so the previous complete checkpoint stays the one to restore.
#ifndef TESSERA_TRAINER_CHECKPOINTS_H_
#define TESSERA_TRAINER_CHECKPOINTS_H_

#include <cstdint>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/config/cluster_config.h"
#include "common/io/checkpoint_io.h"
#include "common/rpc/client.h"
#include "trainer/local_trainer.h"

namespace tessera {

// The position of --init_from's checkpoint (std::nullopt without --init_from). Errors name
// --init_from.
absl::StatusOr<std::optional<TrainPosition>> ReadResumePosition(const ClusterConfig& config,
                                                                io::FileSystem* fs,
                                                                std::ostream& log);

class CheckpointWriter {
 public:
  // `pservers[i]` is config.pservers[i]'s client; `meta` names the job and trainer. All must
  // outlive the writer.
  CheckpointWriter(const ClusterConfig& config, io::FileSystem* fs,
                   std::vector<PServerClient*> pservers, std::ostream* log);

  // Writes the checkpoint of position `p`. Errors name the step and --checkpoint_dir.
  absl::Status Save(const RequestMeta& meta, const TrainPosition& p);
  // The step of the last checkpoint saved or restored (-1: none).
  int64_t last_step() const { return last_step_; }
  void set_last_step(int64_t step) { last_step_ = step; }

 private:
  absl::Status Write(const RequestMeta& meta, const TrainPosition& p);

  const ClusterConfig& config_;
  io::FileSystem* fs_;
  std::vector<PServerClient*> pservers_;
  std::ostream* log_;
  int64_t last_step_ = -1;
};

}  // namespace tessera

#endif  // TESSERA_TRAINER_CHECKPOINTS_H_
