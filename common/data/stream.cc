#include "common/data/stream.h"

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/data/rng.h"
#include "common/data/sampler.h"
#include "common/base/status.h"

namespace tessera {
namespace data {

std::string DataShard::DebugString() const {
  std::string s = path;
  if (begin != 0 || end >= 0) absl::StrAppend(&s, "[", begin, ",", end, ")");
  if (stride > 1) absl::StrAppend(&s, " lines ", offset + 1, " mod ", stride);
  return s;
}

absl::StatusOr<std::vector<DataFile>> StatDataFiles(const std::vector<std::string>& paths) {
  std::vector<DataFile> files;
  files.reserve(paths.size());
  for (const std::string& path : paths) {
    DataFile f;
    f.path = path;
    struct stat st;
    FILE* file = std::fopen(path.c_str(), "rb");
    if (file == nullptr || ::fstat(fileno(file), &st) != 0) {
      const int err = errno;
      if (file != nullptr) std::fclose(file);
      const std::string msg = absl::StrCat("cannot open data file ", path, ": ", std::strerror(err));
      return err == ENOENT ? absl::NotFoundError(msg)
             : (err == EACCES || err == EPERM) ? absl::PermissionDeniedError(msg)
                                               : absl::UnavailableError(msg);
    }
    unsigned char magic[2] = {0, 0};
    const size_t got = std::fread(magic, 1, 2, file);
    std::fclose(file);
    if (S_ISDIR(st.st_mode)) {
      return absl::InvalidArgumentError(absl::StrCat("data file ", path, " is a directory"));
    }
    f.bytes = static_cast<int64_t>(st.st_size);
    f.gzip = got == 2 && magic[0] == 0x1f && magic[1] == 0x8b;
    files.push_back(std::move(f));
  }
  return files;
}

absl::StatusOr<std::vector<DataShard>> AssignShards(const std::vector<DataFile>& all_files,
                                                    const ShardOptions& options, int64_t epoch) {
  if (options.num_trainers < 1 || options.rank < 0 || options.rank >= options.num_trainers ||
      epoch < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "AssignShards: trainers=", options.num_trainers, " rank=", options.rank,
        " epoch=", epoch, ": need trainers >= 1, 0 <= rank < trainers and epoch >= 0"));
  }
  // Empty files hold no line: they are nobody's share.
  std::vector<DataFile> nonempty;
  for (const DataFile& f : all_files) {
    if (f.bytes > 0) nonempty.push_back(f);
  }
  const std::vector<DataFile>& files = nonempty;
  const int64_t n = static_cast<int64_t>(files.size());
  std::vector<int64_t> order;
  if (options.shuffle) {
    order = SeededPermutation(n, options.seed + static_cast<uint64_t>(epoch));
  } else {
    for (int64_t i = 0; i < n; ++i) order.push_back(i);
  }
  const int64_t trainers = options.num_trainers;
  std::vector<DataShard> mine;
  if (n >= trainers) {
    std::vector<int64_t> load(static_cast<size_t>(trainers), 0);
    for (int64_t i : order) {
      const DataFile& f = files[static_cast<size_t>(i)];
      const size_t to = static_cast<size_t>(std::min_element(load.begin(), load.end()) -
                                            load.begin());
      // Every file weighs at least one byte, so empty files spread too.
      load[to] += std::max<int64_t>(f.bytes, 1);
      if (static_cast<int>(to) == options.rank) mine.push_back(DataShard{f.path});
    }
    return mine;
  }
  for (int64_t i : order) {
    const DataFile& f = files[static_cast<size_t>(i)];
    DataShard s{f.path};
    if (f.gzip) {
      s.stride = trainers;
      s.offset = options.rank;
    } else {
      // [bytes * k / N, bytes * (k + 1) / N) without overflow for any file size.
      auto cut = [&](int64_t k) {
        return static_cast<int64_t>(static_cast<__int128>(f.bytes) * k / trainers);
      };
      s.begin = cut(options.rank);
      s.end = options.rank + 1 == trainers ? -1 : cut(options.rank + 1);
    }
    mine.push_back(std::move(s));
  }
  return mine;
}

uint64_t StreamShuffleSeed(uint64_t seed, int64_t epoch, int rank) {
  return Mix64(seed ^ Mix64(static_cast<uint64_t>(epoch) << 20 ^ static_cast<uint64_t>(rank)));
}

ExampleStream::ExampleStream(std::vector<DataShard> shards, const ExampleStreamOptions& options)
    : shards_(std::move(shards)), options_(options), rng_(options.shuffle_seed) {}

absl::StatusOr<std::unique_ptr<ExampleStream>> ExampleStream::Open(
    std::vector<DataShard> shards, const ExampleStreamOptions& options) {
  if (options.queue_examples < 1 || options.shuffle_buffer < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ExampleStream: queue_examples=", options.queue_examples, " (must be >= 1), shuffle_buffer=",
        options.shuffle_buffer, " (must be >= 0)"));
  }
  std::unique_ptr<ExampleStream> stream(new ExampleStream(std::move(shards), options));
  stream->thread_ = std::thread([s = stream.get()] { s->Produce(); });
  return stream;
}

ExampleStream::~ExampleStream() {
  stopping_.store(true, std::memory_order_relaxed);
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  thread_.join();
}

ExampleStreamStats ExampleStream::stats() const {
  absl::MutexLock lock(&mu_);
  return stats_;
}

bool ExampleStream::Push(std::vector<Example>* chunk, size_t filled) {
  absl::MutexLock lock(&mu_);
  // A chunk may always go into an empty queue, so any queue_examples makes progress.
  auto room = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stop_ || queued_ == 0 ||
           queued_ + static_cast<int64_t>(kChunk) <= options_.queue_examples;
  };
  mu_.Await(absl::Condition(&room));
  if (stop_) return false;
  queued_ += static_cast<int64_t>(filled);
  stats_.examples += static_cast<int64_t>(filled);
  queue_.emplace_back(std::move(*chunk), filled);
  if (!free_.empty()) {
    *chunk = std::move(free_.back());
    free_.pop_back();
  } else {
    *chunk = std::vector<Example>();
  }
  chunk->resize(kChunk);
  return true;
}

absl::Status ExampleStream::ProduceShard(const DataShard& shard, std::vector<Example>* chunk,
                                         size_t* filled) {
  const CriteoDataOptions& f = options_.format;
  TS_ASSIGN_OR_RETURN(std::unique_ptr<CriteoReader> reader,
                      CriteoReader::Open(shard.path, f, f.max_line_bytes));
  TS_RETURN_IF_ERROR(reader->Restrict(shard.begin, shard.end));
  TS_RETURN_IF_ERROR(reader->SetStride(shard.stride, shard.offset));
  {
    absl::MutexLock lock(&mu_);
    reader->set_max_bad_lines(f.max_bad_lines, stats_.bad_lines, stats_.first_bad_line);
  }
  auto record_bad_lines = [&] {
    absl::MutexLock lock(&mu_);
    stats_.bad_lines = reader->bad_lines();
    stats_.first_bad_line = reader->first_bad_line();
  };
  while (!stopping_.load(std::memory_order_relaxed)) {
    absl::StatusOr<bool> more = reader->Next(&(*chunk)[*filled]);
    if (!more.ok()) {
      record_bad_lines();
      return more.status();
    }
    if (!*more) break;
    if (++*filled == kChunk) {
      if (!Push(chunk, *filled)) return absl::CancelledError("stream stopped");
      *filled = 0;
    }
  }
  record_bad_lines();
  if (stopping_.load(std::memory_order_relaxed)) return absl::CancelledError("stream stopped");
  return absl::OkStatus();
}

void ExampleStream::Produce() {
  std::vector<Example> chunk(kChunk);
  size_t filled = 0;
  absl::Status status;
  for (const DataShard& shard : shards_) {
    status = ProduceShard(shard, &chunk, &filled);
    if (!status.ok()) break;
  }
  if (absl::IsCancelled(status)) return;
  if (filled > 0 && !Push(&chunk, filled)) return;
  if (status.ok() && options_.on_read_all) options_.on_read_all(stats());
  absl::MutexLock lock(&mu_);
  error_ = status;
  produced_all_ = true;
}

absl::StatusOr<bool> ExampleStream::Pull(Example* example) {
  if (chunk_pos_ == chunk_size_) {
    absl::MutexLock lock(&mu_);
    if (!chunk_.empty()) free_.push_back(std::move(chunk_));
    chunk_ = std::vector<Example>();
    chunk_pos_ = chunk_size_ = 0;
    auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
      return !queue_.empty() || produced_all_;
    };
    mu_.Await(absl::Condition(&ready));
    if (queue_.empty()) {
      if (!error_.ok()) return error_;
      return false;
    }
    chunk_ = std::move(queue_.front().first);
    chunk_size_ = queue_.front().second;
    queue_.pop_front();
    queued_ -= static_cast<int64_t>(chunk_size_);
  }
  std::swap(*example, chunk_[chunk_pos_++]);
  return true;
}

absl::StatusOr<bool> ExampleStream::Next(Example* example) {
  if (!failed_.ok()) return failed_;
  auto fail = [this](absl::Status s) {
    failed_ = s;
    return s;
  };
  if (options_.shuffle_buffer <= 1) {
    absl::StatusOr<bool> got = Pull(example);
    if (!got.ok()) return fail(got.status());
    return got;
  }
  const size_t capacity = static_cast<size_t>(options_.shuffle_buffer);
  while (!input_done_ && shuffle_.size() < capacity) {
    shuffle_.emplace_back();
    absl::StatusOr<bool> got = Pull(&shuffle_.back());
    if (!got.ok()) return fail(got.status());
    if (!*got) {
      shuffle_.pop_back();
      input_done_ = true;
    }
  }
  if (shuffle_.empty()) return false;
  const size_t pick = static_cast<size_t>(UniformBelow(rng_, shuffle_.size()));
  std::swap(*example, shuffle_[pick]);
  if (!input_done_) {
    absl::StatusOr<bool> got = Pull(&shuffle_[pick]);
    if (!got.ok()) return fail(got.status());
    if (*got) return true;
    input_done_ = true;
  }
  std::swap(shuffle_[pick], shuffle_.back());
  shuffle_.pop_back();
  return true;
}

absl::StatusOr<int64_t> ExampleStream::NextBatch(int64_t n, std::vector<Example>* batch) {
  if (static_cast<int64_t>(batch->size()) < n) batch->resize(static_cast<size_t>(n));
  int64_t count = 0;
  while (count < n) {
    TS_ASSIGN_OR_RETURN(bool more, Next(&(*batch)[static_cast<size_t>(count)]));
    if (!more) break;
    ++count;
  }
  return count;
}

absl::StatusOr<int64_t> ExampleStream::Skip(int64_t n) {
  Example scratch;
  int64_t count = 0;
  while (count < n) {
    TS_ASSIGN_OR_RETURN(bool more, Next(&scratch));
    if (!more) break;
    ++count;
  }
  return count;
}

}  // namespace data
}  // namespace tessera
