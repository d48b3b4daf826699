// The data a trainer trains and evaluates on (README "Running the pieces yourself"):
// --train_data / --test_data in --data_format, or the built-in --example's synthetic data.
//
// --reader=memory (and synthetic data) loads the training set; every trainer holds all of it
// and trains on its share of each global batch. --reader=stream opens, each epoch, this
// trainer's shards of the training files (data::AssignShards: the same assignment on every
// trainer) as a data::ExampleStream shuffled with a buffer seeded by seed, epoch and trainer.
// The held-out set is loaded in both cases. Lines skipped under --max_bad_lines are logged and
// counted on /metrics (tessera_trainer_data_bad_lines_total{data="train"|"test"}), a stream's
// from the training thread once it was read to its end.
#ifndef TESSERA_TRAINER_TRAINING_DATA_H_
#define TESSERA_TRAINER_TRAINING_DATA_H_

#include <cstdint>
#include <memory>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/config/cluster_config.h"
#include "common/data/criteo.h"
#include "common/data/example.h"
#include "common/data/stream.h"
#include "common/metrics/metrics.h"
#include "common/framework/model_spec.h"
#include "trainer/local_trainer.h"

namespace tessera {

// How this job's data files are read: --data_format (Criteo's layout of 13 dense and 26
// categorical fields; any other format holds exactly the model's feeds), --float_dense,
// --csv_columns, --max_line_bytes and --max_bad_lines.
data::CriteoDataOptions ReadOptionsFor(const ClusterConfig& config, const FeedSpec& feeds);

class TrainingData {
 public:
  // Loads (or, streamed, finds and sizes) the data of `config` for a model fed by `feeds`.
  // `metrics` and `log` must outlive the result. Errors name the file, line and field.
  static absl::StatusOr<std::unique_ptr<TrainingData>> Open(const ClusterConfig& config,
                                                            const FeedSpec& feeds,
                                                            MetricsRegistry* metrics,
                                                            std::ostream* log);

  bool streamed() const { return streamed_; }
  // --reader=memory: the training set (empty when streamed).
  const data::Dataset& train() const { return train_; }
  // The held-out set (empty without --test_data or synthetic data).
  const data::Dataset& test() const { return test_; }
  // --reader=stream: this trainer's stream of each epoch.
  LocalTrainer::StreamFactory streams();
  // "60000 training examples" or "streaming 21 data files".
  std::string Describe() const;
  // Logs and counts the bad lines of the streams read to their end so far (the training
  // thread; streams() does it at each epoch's start too).
  void ReportStreamBadLines();

 private:
  TrainingData(const ClusterConfig& config, std::ostream* log) : config_(config), log_(log) {}

  const ClusterConfig& config_;
  std::ostream* log_;
  bool streamed_ = false;
  data::Dataset train_, test_;
  data::CriteoDataOptions read_;
  std::vector<data::DataFile> files_;
  Counter* stream_bad_lines_ = nullptr;
  // Filled by the streams' reader threads (ExampleStreamOptions::on_read_all).
  struct Pending {
    absl::Mutex mu;
    std::vector<std::pair<int64_t, data::ExampleStreamStats>> reads ABSL_GUARDED_BY(mu);
  };
  std::shared_ptr<Pending> pending_ = std::make_shared<Pending>();
};

}  // namespace tessera

#endif  // TESSERA_TRAINER_TRAINING_DATA_H_
