// Streaming training data, for data sets larger than a trainer's memory.
//
// AssignShards decides which parts of which files each trainer reads in an epoch, so that
// every line is read by exactly one trainer per epoch:
//   - at least as many files as trainers: whole files. The files are visited in a per-epoch
//     order (SeededPermutation(seed + epoch), or as given without shuffle), and each goes to
//     the trainer with the fewest bytes so far (ties: the lowest rank), so trainers get about
//     the same number of bytes and read their files in that order;
//   - fewer files than trainers: every file is split among all trainers. A plain file in
//     equal byte ranges (a line belongs to the range holding its first byte); a gzip file,
//     which cannot be split without reading it, by lines (trainer k parses lines k, k+N, ...
//     and skips the others unparsed).
// Empty files are left out. Every trainer computes every trainer's assignment from the same
// inputs (the file list, its sizes, the seed and the epoch), without talking to the others.
//
// ExampleStream reads a list of shards: one background thread opens them in order and parses
// their lines (CriteoReader) into a bounded queue; Next() hands the examples out through a
// shuffle buffer of `shuffle_buffer` examples (each output a uniform pick from the buffer,
// refilled from the queue, as tf.data's shuffle), seeded, so a stream is the same sequence
// every time it is opened with the same shards and options. Its memory is the queue, the
// buffer and one read buffer, whatever the size of the files.
#ifndef TESSERA_COMMON_DATA_STREAM_H_
#define TESSERA_COMMON_DATA_STREAM_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "common/data/criteo.h"
#include "common/data/example.h"

namespace tessera {
namespace data {

// A data file, as AssignShards needs to know it.
struct DataFile {
  std::string path;
  int64_t bytes = 0;  // on disk (compressed size for gzip)
  bool gzip = false;
};

// Size and compression (by content: the gzip magic bytes) of each path; an error names a path
// that cannot be read.
absl::StatusOr<std::vector<DataFile>> StatDataFiles(const std::vector<std::string>& paths);

// A part of one file that one trainer reads in an epoch (see CriteoReader::Restrict and
// SetStride).
struct DataShard {
  std::string path;
  int64_t begin = 0;  // the lines that start in bytes [begin, end) (end < 0: to the end)
  int64_t end = -1;
  int64_t stride = 1;  // of those, lines l (1-based) with (l - 1) % stride == offset
  int64_t offset = 0;

  bool operator==(const DataShard& o) const {
    return path == o.path && begin == o.begin && end == o.end && stride == o.stride &&
           offset == o.offset;
  }
  // "path", "path[begin,end)" or "path lines k mod n".
  std::string DebugString() const;
};

struct ShardOptions {
  int num_trainers = 1;  // >= 1
  int rank = 0;          // in [0, num_trainers)
  uint64_t seed = 0;     // the per-epoch file order uses seed + epoch
  bool shuffle = true;   // false: files in the order given
};

// Trainer `rank`'s shards of epoch `epoch` (>= 0), in the order it reads them (see the file
// comment). Empty when `files` is empty. InvalidArgument for bad options.
absl::StatusOr<std::vector<DataShard>> AssignShards(const std::vector<DataFile>& files,
                                                    const ShardOptions& options, int64_t epoch);

// The shuffle-buffer seed of trainer `rank` in epoch `epoch` of a job seeded `seed`: every
// (epoch, trainer) its own sequence.
uint64_t StreamShuffleSeed(uint64_t seed, int64_t epoch, int rank);

struct ExampleStreamStats {
  int64_t examples = 0;   // parsed so far by the background thread
  int64_t bad_lines = 0;  // skipped under the budget
  std::string first_bad_line;
};

struct ExampleStreamOptions {
  CriteoDataOptions format;  // field counts, longest line, bad-line budget (whole stream)
  // Examples the shuffle buffer holds; 0 or 1: examples come in file order.
  int64_t shuffle_buffer = 0;
  uint64_t shuffle_seed = 0;
  // Parsed examples the background thread may read ahead of Next() (>= 1).
  int64_t queue_examples = 8192;
  // Called on the background thread once every shard was read without an error (e.g. to
  // report the lines skipped under the bad-line budget).
  std::function<void(const ExampleStreamStats&)> on_read_all;
};

class ExampleStream {
 public:
  // Starts reading `shards` at once. InvalidArgument for bad options; a file that cannot be
  // opened fails the first Next() that needs it.
  static absl::StatusOr<std::unique_ptr<ExampleStream>> Open(std::vector<DataShard> shards,
                                                             const ExampleStreamOptions& options);
  // Stops the background thread (without waiting for the files' ends).
  ~ExampleStream();
  ExampleStream(const ExampleStream&) = delete;
  ExampleStream& operator=(const ExampleStream&) = delete;

  // The next example (swapped into *example, whose vectors are reused): true, false at the
  // end of the last shard, or the first read or parse error (naming the file and line), after
  // which the stream stays failed.
  absl::StatusOr<bool> Next(Example* example);
  // Up to `n` next examples into (*batch)[0, count), resizing *batch to at least `n`: the
  // count (0 at the end), or an error as Next().
  absl::StatusOr<int64_t> NextBatch(int64_t n, std::vector<Example>* batch);
  // Skips `n` examples (as many Next() calls): the count skipped.
  absl::StatusOr<int64_t> Skip(int64_t n);

  ExampleStreamStats stats() const;

 private:
  static constexpr size_t kChunk = 256;  // examples per queue entry

  ExampleStream(std::vector<DataShard> shards, const ExampleStreamOptions& options);
  // The background thread: parses every shard into chunks.
  void Produce();
  absl::Status ProduceShard(const DataShard& shard, std::vector<Example>* chunk, size_t* filled);
  // Hands a full (or the last) chunk to the queue; false when the stream is being stopped.
  bool Push(std::vector<Example>* chunk, size_t filled);
  // The next example in file order (no shuffle).
  absl::StatusOr<bool> Pull(Example* example);

  const std::vector<DataShard> shards_;
  const ExampleStreamOptions options_;

  mutable absl::Mutex mu_;
  // Full chunks, each with its example count.
  std::deque<std::pair<std::vector<Example>, size_t>> queue_ ABSL_GUARDED_BY(mu_);
  std::vector<std::vector<Example>> free_ ABSL_GUARDED_BY(mu_);  // chunks to reuse
  int64_t queued_ ABSL_GUARDED_BY(mu_) = 0;                      // examples in queue_
  bool produced_all_ ABSL_GUARDED_BY(mu_) = false;
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status error_ ABSL_GUARDED_BY(mu_);  // the producer's, delivered after its examples
  ExampleStreamStats stats_ ABSL_GUARDED_BY(mu_);

  // Consumer side (Next's thread only).
  std::vector<Example> chunk_;
  size_t chunk_pos_ = 0;
  size_t chunk_size_ = 0;
  bool input_done_ = false;
  absl::Status failed_;
  std::vector<Example> shuffle_;
  std::mt19937_64 rng_;

  // Set by the destructor: the producer stops between lines (stop_ wakes it in Push).
  std::atomic<bool> stopping_{false};
  std::thread thread_;
};

}  // namespace data
}  // namespace tessera

#endif  // TESSERA_COMMON_DATA_STREAM_H_
