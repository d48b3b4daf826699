#include "trainer/training_data.h"

#include "absl/strings/str_cat.h"
#include "common/data/formats.h"
#include "common/base/status.h"
#include "examples/registry.h"

namespace tessera {

namespace {

absl::StatusOr<Counter*> BadLinesCounter(MetricsRegistry* metrics, int trainer_id,
                                         const std::string& what) {
  return metrics->GetCounter("tessera_trainer_data_bad_lines_total",
                             "Malformed data lines skipped (--max_bad_lines).",
                             {{"trainer_id", std::to_string(trainer_id)}, {"data", what}});
}

}  // namespace

data::CriteoDataOptions ReadOptionsFor(const ClusterConfig& config, const FeedSpec& feeds) {
  data::CriteoDataOptions read;
  // Every data flag was checked at start (cluster_config.h), so these parses cannot fail.
  read.format = data::ParseDataFormat(config.data_format).value_or(data::DataFormat::kCriteo);
  read.float_dense = config.float_dense;
  read.csv = data::ParseCsvColumns(config.csv_columns).value_or(data::CsvColumns{});
  if (read.format != data::DataFormat::kCriteo) {
    read.num_dense = feeds.num_dense;
    read.num_sparse = static_cast<int>(feeds.slots.size());
  }
  read.num_multi = static_cast<int>(feeds.multi_slots.size());
  read.max_line_bytes = config.max_line_bytes;
  read.max_bad_lines = config.max_bad_lines;
  return read;
}

absl::StatusOr<std::unique_ptr<TrainingData>> TrainingData::Open(const ClusterConfig& config,
                                                                 const FeedSpec& feeds,
                                                                 MetricsRegistry* metrics,
                                                                 std::ostream* log) {
  std::unique_ptr<TrainingData> d(new TrainingData(config, log));
  d->streamed_ = config.reader == "stream";
  d->read_ = ReadOptionsFor(config, feeds);
  examples::ExampleOptions o;
  o.name = config.example;
  o.seed = config.seed;
  o.num_examples = config.num_examples;
  o.num_test_examples = config.num_test_examples;
  o.vocab_per_slot = config.vocab_per_slot;
  o.train_data = config.train_data;
  o.test_data = config.test_data;
  o.read = d->read_;
  examples::ExampleData loaded;
  if (d->streamed_) {
    // The training files are read epoch by epoch; only the held-out data is loaded.
    TS_ASSIGN_OR_RETURN(std::vector<std::string> paths, data::ExpandDataPaths(config.train_data));
    TS_ASSIGN_OR_RETURN(d->files_, data::StatDataFiles(paths));
    TS_ASSIGN_OR_RETURN(d->stream_bad_lines_,
                        BadLinesCounter(metrics, config.trainer_id, "train"));
    if (!config.test_data.empty()) {
      TS_ASSIGN_OR_RETURN(loaded.test,
                          data::ReadCriteoData(config.test_data, d->read_, &loaded.test_read));
    }
  } else {
    TS_ASSIGN_OR_RETURN(loaded, examples::LoadExampleData(o));
  }
  d->train_ = std::move(loaded.train);
  d->test_ = std::move(loaded.test);
  // Lines skipped under --max_bad_lines: in the log and on /metrics.
  for (const auto& [what, read] : {std::make_pair("train", &loaded.train_read),
                                   std::make_pair("test", &loaded.test_read)}) {
    if (read->bad_lines == 0) continue;
    *log << "trainer " << config.trainer_id << ": skipped " << read->bad_lines << " bad lines of "
         << what << " data (--max_bad_lines=" << config.max_bad_lines
         << "); the first: " << read->first_bad_line << std::endl;
    TS_ASSIGN_OR_RETURN(Counter * bad, BadLinesCounter(metrics, config.trainer_id, what));
    bad->Increment(static_cast<double>(read->bad_lines));
  }
  return d;
}

std::string TrainingData::Describe() const {
  return streamed_ ? absl::StrCat("streaming ", files_.size(), " data files")
                   : absl::StrCat(train_.examples.size(), " training examples");
}

void TrainingData::ReportStreamBadLines() {
  std::vector<std::pair<int64_t, data::ExampleStreamStats>> reads;
  {
    absl::MutexLock lock(&pending_->mu);
    reads.swap(pending_->reads);
  }
  for (const auto& [epoch, s] : reads) {
    stream_bad_lines_->Increment(static_cast<double>(s.bad_lines));
    *log_ << "trainer " << config_.trainer_id << ": epoch " << epoch << ": skipped "
          << s.bad_lines << " bad lines of train data (--max_bad_lines=" << config_.max_bad_lines
          << "); the first: " << s.first_bad_line << std::endl;
  }
}

LocalTrainer::StreamFactory TrainingData::streams() {
  if (!streamed_) return nullptr;
  return [this](int64_t epoch) -> absl::StatusOr<std::unique_ptr<data::ExampleStream>> {
    ReportStreamBadLines();
    data::ShardOptions so;
    so.num_trainers = config_.trainers;
    so.rank = config_.trainer_id;
    so.seed = config_.seed;
    TS_ASSIGN_OR_RETURN(std::vector<data::DataShard> shards,
                        data::AssignShards(files_, so, epoch));
    data::ExampleStreamOptions eo;
    eo.format = read_;
    eo.shuffle_buffer = config_.shuffle_buffer;
    eo.shuffle_seed = data::StreamShuffleSeed(config_.seed, epoch, config_.trainer_id);
    eo.queue_examples = config_.reader_queue;
    eo.on_read_all = [pending = pending_, epoch](const data::ExampleStreamStats& s) {
      if (s.bad_lines == 0) return;
      absl::MutexLock lock(&pending->mu);
      pending->reads.push_back({epoch, s});
    };
    return data::ExampleStream::Open(std::move(shards), eo);
  };
}

}  // namespace tessera
