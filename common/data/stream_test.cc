#include "common/data/stream.h"

#include <stdlib.h>
#include <zlib.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tessera {
namespace data {
namespace {

using ::testing::HasSubstr;

std::string TestDir(const std::string& name) {
  std::string dir = absl::StrCat(::testing::TempDir(), "/stream_test_", name, "_XXXXXX");
  EXPECT_NE(mkdtemp(dir.data()), nullptr) << dir;
  return dir;
}

// Format of these tests: label, one dense count, one categorical id (the line's identity).
CriteoDataOptions Format() {
  CriteoDataOptions f;
  f.num_dense = 1;
  f.num_sparse = 1;
  return f;
}

// Lines with ids first .. first + n - 1 (hex), of varying length; `crlf` ends them with \r\n.
std::string Lines(int64_t first, int64_t n, bool crlf = false) {
  std::string text;
  for (int64_t i = first; i < first + n; ++i) {
    absl::StrAppend(&text, i % 2, "\t", i * 37 % 1000, "\t", std::string(i % 4, '0'), absl::Hex(i),
                    crlf ? "\r\n" : "\n");
  }
  return text;
}

void WriteFile(const std::string& path, const std::string& text, bool gzip = false) {
  if (!gzip) {
    std::ofstream(path, std::ios::binary) << text;
    return;
  }
  gzFile f = gzopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr);
  ASSERT_EQ(gzwrite(f, text.data(), static_cast<unsigned>(text.size())),
            static_cast<int>(text.size()));
  ASSERT_EQ(gzclose(f), Z_OK);
}

// Every id of `shards` in stream order.
std::vector<int64_t> ReadIds(const std::vector<DataShard>& shards,
                             ExampleStreamOptions options = {}) {
  options.format = Format();
  auto stream = ExampleStream::Open(shards, options);
  EXPECT_TRUE(stream.ok()) << stream.status();
  std::vector<int64_t> ids;
  Example e;
  while (true) {
    absl::StatusOr<bool> more = (*stream)->Next(&e);
    EXPECT_TRUE(more.ok()) << more.status();
    if (!more.ok() || !*more) break;
    ids.push_back(e.sparse[0]);
  }
  return ids;
}

std::vector<int64_t> Range(int64_t first, int64_t n) {
  std::vector<int64_t> v;
  for (int64_t i = first; i < first + n; ++i) v.push_back(i);
  return v;
}

TEST(AssignShardsTest, WholeFilesBalancedByBytesAndReshuffledPerEpoch) {
  std::vector<DataFile> files;
  for (int i = 0; i < 7; ++i) files.push_back({absl::StrCat("f", i), 100 + 10 * i, false});
  std::set<std::vector<std::string>> orders;
  for (int64_t epoch = 0; epoch < 4; ++epoch) {
    std::map<std::string, int> owner;
    std::vector<int64_t> bytes(3, 0);
    std::vector<std::string> order;
    for (int rank = 0; rank < 3; ++rank) {
      ShardOptions o{3, rank, /*seed=*/5, /*shuffle=*/true};
      auto shards = AssignShards(files, o, epoch);
      ASSERT_TRUE(shards.ok()) << shards.status();
      EXPECT_EQ(*shards, *AssignShards(files, o, epoch));  // deterministic
      for (const DataShard& s : *shards) {
        EXPECT_EQ(s.begin, 0);
        EXPECT_EQ(s.end, -1);
        EXPECT_EQ(s.stride, 1);
        EXPECT_TRUE(owner.emplace(s.path, rank).second) << s.path << " read twice";
        bytes[rank] += 100 + 10 * (s.path[1] - '0');
        order.push_back(s.path);
      }
    }
    EXPECT_EQ(owner.size(), files.size());  // each file exactly once
    // Greedy by bytes: no trainer has more than the largest file above another.
    EXPECT_LE(*std::max_element(bytes.begin(), bytes.end()) -
                  *std::min_element(bytes.begin(), bytes.end()),
              160);
    orders.insert(order);
  }
  EXPECT_GT(orders.size(), 1u) << "the assignment never changed between epochs";
  // Without shuffle: the given order, every epoch.
  ShardOptions plain{2, 0, 5, false};
  EXPECT_EQ(*AssignShards(files, plain, 0), *AssignShards(files, plain, 3));
  EXPECT_EQ((*AssignShards(files, plain, 0))[0].path, "f0");
}

TEST(AssignShardsTest, EmptyFilesAreNobodysShare) {
  const std::vector<DataFile> files = {{"empty", 0, false}, {"data", 100, false}};
  for (int rank = 0; rank < 2; ++rank) {
    auto shards = AssignShards(files, ShardOptions{2, rank, 1, true}, 0);
    ASSERT_TRUE(shards.ok());
    ASSERT_EQ(shards->size(), 1u);  // one non-empty file for 2 trainers: split in byte ranges
    EXPECT_EQ((*shards)[0].path, "data");
    EXPECT_EQ((*shards)[0].begin, rank == 0 ? 0 : 50);
  }
}

TEST(AssignShardsTest, RefusesBadOptions) {
  EXPECT_FALSE(AssignShards({}, ShardOptions{0, 0}, 0).ok());
  EXPECT_FALSE(AssignShards({}, ShardOptions{2, 2}, 0).ok());
  EXPECT_FALSE(AssignShards({}, ShardOptions{2, 0}, -1).ok());
  EXPECT_TRUE(AssignShards({}, ShardOptions{2, 1}, 0)->empty());
}

// Fewer files than trainers: a plain file by byte ranges at line boundaries, a gzip file by
// lines; together the trainers read every line exactly once, whatever the cut points hit.
TEST(AssignShardsTest, FewerFilesThanTrainersSplitsEveryLineToOneTrainer) {
  const std::string dir = TestDir("split");
  WriteFile(dir + "/plain", Lines(0, 101, /*crlf=*/true));
  WriteFile(dir + "/packed.gz", Lines(1000, 77), /*gzip=*/true);
  WriteFile(dir + "/tiny", Lines(5000, 2));
  auto files = StatDataFiles({dir + "/plain", dir + "/packed.gz", dir + "/tiny"});
  ASSERT_TRUE(files.ok()) << files.status();
  EXPECT_FALSE((*files)[0].gzip);
  EXPECT_TRUE((*files)[1].gzip);
  for (int trainers : {4, 5, 7}) {
    std::multiset<int64_t> seen;
    for (int rank = 0; rank < trainers; ++rank) {
      auto shards = AssignShards(*files, ShardOptions{trainers, rank, 1, true}, 0);
      ASSERT_TRUE(shards.ok());
      ASSERT_EQ(shards->size(), 3u);
      for (int64_t id : ReadIds(*shards)) seen.insert(id);
    }
    std::multiset<int64_t> want;
    for (int64_t id : Range(0, 101)) want.insert(id);
    for (int64_t id : Range(1000, 77)) want.insert(id);
    for (int64_t id : Range(5000, 2)) want.insert(id);
    EXPECT_EQ(seen, want) << trainers << " trainers";
  }
}

TEST(ExampleStreamTest, InFileOrderWithoutShuffle) {
  const std::string dir = TestDir("order");
  WriteFile(dir + "/a", Lines(0, 600));
  WriteFile(dir + "/b.gz", Lines(600, 300), /*gzip=*/true);
  std::vector<int64_t> ids = ReadIds({DataShard{dir + "/a"}, DataShard{dir + "/b.gz"}});
  EXPECT_EQ(ids, Range(0, 900));
}

TEST(ExampleStreamTest, ShuffleBufferIsASeededPermutation) {
  const std::string dir = TestDir("shuffle");
  WriteFile(dir + "/a", Lines(0, 1000));
  const std::vector<DataShard> shards = {DataShard{dir + "/a"}};
  ExampleStreamOptions o;
  o.shuffle_buffer = 100;
  o.shuffle_seed = 7;
  std::vector<int64_t> first = ReadIds(shards, o);
  EXPECT_EQ(first, ReadIds(shards, o));  // the same sequence every time
  o.shuffle_seed = 8;
  std::vector<int64_t> other = ReadIds(shards, o);
  EXPECT_NE(first, other);
  EXPECT_NE(first, Range(0, 1000));
  std::sort(first.begin(), first.end());
  std::sort(other.begin(), other.end());
  EXPECT_EQ(first, Range(0, 1000));
  EXPECT_EQ(other, Range(0, 1000));
  // A buffer of 100 moves an example at most ~100 places ahead of its file position.
  o.shuffle_seed = 7;
  std::vector<int64_t> local = ReadIds(shards, o);
  for (size_t i = 0; i < local.size(); ++i) EXPECT_LE(local[i], static_cast<int64_t>(i) + 100);
}

TEST(ExampleStreamTest, ReadsAheadOnlyAsFarAsTheQueue) {
  const std::string dir = TestDir("bounded");
  WriteFile(dir + "/a", Lines(0, 20000));
  ExampleStreamOptions o;
  o.format = Format();
  o.queue_examples = 1024;
  auto stream = ExampleStream::Open({DataShard{dir + "/a"}}, o);
  ASSERT_TRUE(stream.ok());
  // Without a consumer the reader stops at the queue's bound (plus the chunk being filled).
  int64_t parsed = -1;
  for (int i = 0; i < 100; ++i) {  // until it stops growing, at most ~2 s
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    const int64_t now = (*stream)->stats().examples;
    if (now == parsed && now > 0) break;
    parsed = now;
  }
  EXPECT_GT(parsed, 0);
  EXPECT_LE(parsed, 1024);
  Example e;
  ASSERT_TRUE(*(*stream)->Next(&e));
  EXPECT_EQ(e.sparse[0], 0);
  // Skip and NextBatch continue where Next stopped.
  EXPECT_EQ(*(*stream)->Skip(9), 9);
  std::vector<Example> batch;
  EXPECT_EQ(*(*stream)->NextBatch(5, &batch), 5);
  EXPECT_EQ(batch[0].sparse[0], 10);
  EXPECT_EQ(*(*stream)->Skip(1 << 20), 20000 - 15);
  EXPECT_EQ(*(*stream)->NextBatch(5, &batch), 0);
}

TEST(ExampleStreamTest, ErrorsNameTheFileAndLineAfterTheExamplesBefore) {
  const std::string dir = TestDir("errors");
  WriteFile(dir + "/a", Lines(0, 3));
  WriteFile(dir + "/b", Lines(3, 2) + "1\tx\t7\n" + Lines(5, 1));
  ExampleStreamOptions o;
  o.format = Format();
  auto stream = ExampleStream::Open({DataShard{dir + "/a"}, DataShard{dir + "/b"}}, o);
  ASSERT_TRUE(stream.ok());
  std::vector<Example> batch;
  EXPECT_EQ(*(*stream)->NextBatch(5, &batch), 5);
  Example e;
  absl::StatusOr<bool> bad = (*stream)->Next(&e);
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(std::string(bad.status().message()), HasSubstr(dir + "/b:3: field 2 (I1)"));
  EXPECT_FALSE((*stream)->Next(&e).ok());  // stays failed

  // A budget of bad lines spans the shards; a missing file names itself.
  WriteFile(dir + "/c", "junk\n" + Lines(6, 1));
  o.format.max_bad_lines = 2;
  auto lenient = ExampleStream::Open({DataShard{dir + "/b"}, DataShard{dir + "/c"}}, o);
  EXPECT_EQ(*(*lenient)->Skip(100), 4);  // ids 3, 4, 5 and 6
  EXPECT_EQ((*lenient)->stats().bad_lines, 2);
  EXPECT_THAT((*lenient)->stats().first_bad_line, HasSubstr(dir + "/b:3"));
  o.format.max_bad_lines = 1;
  auto strict = ExampleStream::Open({DataShard{dir + "/b"}, DataShard{dir + "/c"}}, o);
  absl::StatusOr<int64_t> over = (*strict)->Skip(100);
  ASSERT_FALSE(over.ok());
  EXPECT_THAT(std::string(over.status().message()), HasSubstr("more than --max_bad_lines=1"));
  auto missing = ExampleStream::Open({DataShard{dir + "/nope"}}, o);
  absl::StatusOr<bool> gone = (*missing)->Next(&e);
  ASSERT_FALSE(gone.ok());
  EXPECT_EQ(gone.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(gone.status().message()), HasSubstr(dir + "/nope"));
  EXPECT_FALSE(StatDataFiles({dir + "/nope"}).ok());
}

TEST(ExampleStreamTest, ByteRangeErrorsNameTheByteOffset) {
  const std::string dir = TestDir("range_error");
  WriteFile(dir + "/a", Lines(0, 10) + "1\tx\t7\n");
  const int64_t bad_at = static_cast<int64_t>(Lines(0, 10).size());
  ExampleStreamOptions o;
  o.format = Format();
  auto stream = ExampleStream::Open({DataShard{dir + "/a", 5, -1}}, o);
  absl::StatusOr<int64_t> read = (*stream)->Skip(100);
  ASSERT_FALSE(read.ok());
  EXPECT_THAT(std::string(read.status().message()),
              HasSubstr(absl::StrCat(dir, "/a: line at byte ", bad_at, ": field 2")));
}

}  // namespace
}  // namespace data
}  // namespace tessera
