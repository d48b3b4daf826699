#include "common/data/criteo.h"

#include <dirent.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <zlib.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <iterator>
#include <limits>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/data/synthetic.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tessera {
namespace data {
namespace {

using ::testing::HasSubstr;

// A fresh, empty directory for one test.
std::string TestDir(const std::string& name) {
  std::string dir = absl::StrCat(::testing::TempDir(), "/criteo_test_", name, "_XXXXXX");
  EXPECT_NE(mkdtemp(dir.data()), nullptr) << dir;
  return dir;
}

std::vector<std::string> ListDir(const std::string& dir) {
  std::vector<std::string> names;
  DIR* d = opendir(dir.c_str());
  if (d == nullptr) return names;
  while (dirent* e = readdir(d)) {
    const std::string name = e->d_name;
    if (name != "." && name != "..") names.push_back(name);
  }
  closedir(d);
  return names;
}

void WriteText(const std::string& path, const std::string& text) {
  std::ofstream(path, std::ios::binary) << text;
}

// label, 13 dense, 26 categorical fields; `dense` and `cats` fill the first fields given.
std::string Line(const std::string& label, std::vector<std::string> dense,
                 std::vector<std::string> cats) {
  dense.resize(kCriteoNumDense, "1");
  cats.resize(kCriteoNumSparse, "68fd1e64");
  return absl::StrCat(label, "\t", absl::StrJoin(dense, "\t"), "\t", absl::StrJoin(cats, "\t"));
}

std::string ErrorOf(absl::string_view line) {
  absl::StatusOr<Example> ex = ParseCriteoLine(line);
  EXPECT_FALSE(ex.ok());
  EXPECT_EQ(ex.status().code(), absl::StatusCode::kInvalidArgument);
  const std::string msg(ex.status().message());
  EXPECT_EQ(msg.find('\n'), std::string::npos) << msg;
  return msg;
}

TEST(CriteoIdTest, FormatAndParseCoverAllInt64) {
  EXPECT_EQ(FormatId(0), "0000000000000000");
  EXPECT_EQ(FormatId(255), "00000000000000ff");
  EXPECT_EQ(FormatId(-1), "ffffffffffffffff");
  EXPECT_EQ(FormatId(std::numeric_limits<int64_t>::min()), "8000000000000000");
  EXPECT_EQ(FormatId(std::numeric_limits<int64_t>::max()), "7fffffffffffffff");
  EXPECT_EQ(*ParseId("ff"), 255);
  EXPECT_EQ(*ParseId("68fd1e64"), 0x68fd1e64);
  EXPECT_EQ(*ParseId("FFFFFFFFFFFFFFFF"), -1);
  EXPECT_EQ(*ParseId("8000000000000000"), std::numeric_limits<int64_t>::min());
  for (int64_t id : {int64_t{0}, int64_t{1}, int64_t{-2}, int64_t{0x123456789abcdef0},
                     std::numeric_limits<int64_t>::min()}) {
    EXPECT_EQ(*ParseId(FormatId(id)), id);
  }
  for (const char* bad : {"", "0123456789abcdef0", "xyz", "-1", "12 ", "0x12"}) {
    EXPECT_FALSE(ParseId(bad).ok()) << bad;
  }
}

TEST(CriteoDenseTest, TransformAndInverse) {
  EXPECT_EQ(DenseFromCount(0), 0.0f);
  EXPECT_EQ(DenseFromCount(-5), 0.0f);
  EXPECT_FLOAT_EQ(DenseFromCount(1), std::log(2.0f));
  EXPECT_FLOAT_EQ(DenseFromCount(99), std::log(100.0f));
  // Every count below 10^6 survives value -> count exactly.
  for (int64_t c = 0; c < 1000000; ++c) {
    ASSERT_EQ(CountFromDense(DenseFromCount(c)), c);
  }
}

TEST(CriteoParseTest, ParsesFieldsAndMissingValues) {
  std::vector<std::string> dense = {"0", "5", "", "-3", "+7", "1000000"};
  std::vector<std::string> cats = {"ff", "", "FFFFFFFFFFFFFFFF", "0"};
  absl::StatusOr<Example> ex = ParseCriteoLine(Line("1", dense, cats));
  ASSERT_TRUE(ex.ok()) << ex.status();
  EXPECT_EQ(ex->label, 1.0f);
  ASSERT_EQ(ex->dense.size(), 13u);
  ASSERT_EQ(ex->sparse.size(), 26u);
  EXPECT_EQ(ex->dense[0], 0.0f);
  EXPECT_FLOAT_EQ(ex->dense[1], std::log(6.0f));
  EXPECT_EQ(ex->dense[2], 0.0f);  // Missing.
  EXPECT_EQ(ex->dense[3], 0.0f);  // Negative count.
  EXPECT_FLOAT_EQ(ex->dense[4], std::log(8.0f));
  EXPECT_FLOAT_EQ(ex->dense[5], static_cast<float>(std::log1p(1e6)));
  EXPECT_FLOAT_EQ(ex->dense[6], std::log(2.0f));
  EXPECT_EQ(ex->sparse[0], 255);
  EXPECT_EQ(ex->sparse[1], 0);  // Missing.
  EXPECT_EQ(ex->sparse[2], -1);
  EXPECT_EQ(ex->sparse[3], 0);
  EXPECT_EQ(ex->sparse[4], 0x68fd1e64);

  ex = ParseCriteoLine(Line("0", {}, {}));
  ASSERT_TRUE(ex.ok());
  EXPECT_EQ(ex->label, 0.0f);

  // Other field counts.
  ex = ParseCriteoLine("1\t3\t\tab", 2, 1);
  ASSERT_TRUE(ex.ok()) << ex.status();
  EXPECT_EQ(ex->dense, (std::vector<float>{std::log(4.0f), 0.0f}));
  EXPECT_EQ(ex->sparse, (std::vector<int64_t>{0xab}));
  ex = ParseCriteoLine("0", 0, 0);
  ASSERT_TRUE(ex.ok()) << ex.status();
  EXPECT_TRUE(ex->dense.empty() && ex->sparse.empty());
}

TEST(CriteoParseTest, EachErrorNamesFieldAndText) {
  std::string msg = ErrorOf(Line("2", {}, {}));
  EXPECT_THAT(msg, HasSubstr("field 1 (label)"));
  EXPECT_THAT(msg, HasSubstr("'2'"));
  msg = ErrorOf(Line("", {}, {}));
  EXPECT_THAT(msg, HasSubstr("field 1 (label)"));

  msg = ErrorOf(Line("1", {"3", "abc"}, {}));
  EXPECT_THAT(msg, HasSubstr("field 3 (I2)"));
  EXPECT_THAT(msg, HasSubstr("not an integer"));
  EXPECT_THAT(msg, HasSubstr("'abc'"));
  msg = ErrorOf(Line("1", {"1.5"}, {}));
  EXPECT_THAT(msg, HasSubstr("field 2 (I1)"));
  EXPECT_THAT(msg, HasSubstr("'1.5'"));
  msg = ErrorOf(Line("1", {"99999999999999999999"}, {}));  // Overflows int64.
  EXPECT_THAT(msg, HasSubstr("field 2 (I1)"));

  msg = ErrorOf(Line("1", {}, {"68fd1e64", "zz"}));
  EXPECT_THAT(msg, HasSubstr("field 16 (C2)"));
  EXPECT_THAT(msg, HasSubstr("hex"));
  EXPECT_THAT(msg, HasSubstr("'zz'"));
  msg = ErrorOf(Line("1", {}, {"0123456789abcdef0"}));
  EXPECT_THAT(msg, HasSubstr("field 15 (C1)"));
  msg = ErrorOf(Line("1", {}, {"-1"}));
  EXPECT_THAT(msg, HasSubstr("field 15 (C1)"));
  msg = ErrorOf(Line("1", {}, std::vector<std::string>(26, "1a")) + "\t");
  EXPECT_THAT(msg, HasSubstr("expected 40 tab-separated fields"));
  EXPECT_THAT(msg, HasSubstr("got 41"));

  const std::string line = Line("1", {}, {});
  msg = ErrorOf(line.substr(0, line.rfind('\t')));
  EXPECT_THAT(msg, HasSubstr("got 39"));
  // Long bad text is shortened and control characters escaped, keeping one line.
  msg = ErrorOf(std::string(500, 'x') + "\x01");
  EXPECT_LT(msg.size(), 200u);
  EXPECT_THAT(msg, HasSubstr("..."));
  msg = ErrorOf(Line("1", {"4\x02"}, {}));
  EXPECT_THAT(msg, HasSubstr("'4\\x02'"));
}

// Multi-hot fields after the categorical ones: ','-separated ids, an empty field an empty list.
TEST(CriteoParseTest, MultiHotFieldsParseAndRoundTrip) {
  Example e;
  ASSERT_TRUE(ParseCriteoLine("1\t3\ta\tff,10,ffffffffffffffff\t", 1, 1, &e, 2).ok());
  EXPECT_EQ(e.sparse, std::vector<int64_t>{10});
  ASSERT_EQ(e.multi.size(), 2u);
  EXPECT_EQ(e.multi[0], (std::vector<int64_t>{255, 16, -1}));
  EXPECT_TRUE(e.multi[1].empty());

  absl::Status bad = ParseCriteoLine("1\t3\ta\tff,,1\t", 1, 1, &e, 2);
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(std::string(bad.message()), HasSubstr("field 4 (M1): multi-hot ids are not"));
  bad = ParseCriteoLine("1\t3\ta\tff", 1, 1, &e, 2);
  EXPECT_THAT(std::string(bad.message()), HasSubstr("(label, 1 dense, 1 categorical, 2 multi-hot)"));

  Dataset d;
  d.num_dense = 1;
  d.num_sparse = 1;
  d.num_multi = 2;
  Example a;
  a.dense = {DenseFromCount(4)};
  a.sparse = {-7};
  a.multi = {{1, 2, 3}, {}};
  a.label = 1;
  Example b = a;
  b.multi = {{}, {std::numeric_limits<int64_t>::min()}};
  b.label = 0;
  d.examples = {a, b};
  const std::string path = absl::StrCat(testing::TempDir(), "/multi.txt");
  ASSERT_TRUE(WriteCriteoFile(path, d).ok());
  absl::StatusOr<Dataset> back = ReadCriteoFile(path, 1, 1, kDefaultMaxLineBytes, 2);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, d);
}

TEST(CriteoFileTest, ReadErrorsNameFileAndLine) {
  const std::string dir = TestDir("read_errors");
  const std::string path = dir + "/bad.txt";
  WriteText(path, Line("1", {}, {}) + "\n\n" + Line("0", {}, {}) + "\r\n" +
                      Line("1", {"7", "x7"}, {}) + "\n");
  absl::StatusOr<Dataset> data = ReadCriteoFile(path);
  ASSERT_FALSE(data.ok());
  EXPECT_EQ(data.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(data.status().message()),
              HasSubstr(path + ":4: field 3 (I2): dense value is not an integer: 'x7'"));

  // The reader gives the good lines first, then the error; a blank line and CRLF are fine.
  absl::StatusOr<std::unique_ptr<CriteoReader>> reader = CriteoReader::Open(path);
  ASSERT_TRUE(reader.ok());
  Example ex;
  EXPECT_TRUE(*(*reader)->Next(&ex));
  EXPECT_EQ(ex.label, 1.0f);
  EXPECT_TRUE(*(*reader)->Next(&ex));
  EXPECT_EQ(ex.label, 0.0f);
  EXPECT_EQ((*reader)->line_number(), 3);
  EXPECT_FALSE((*reader)->Next(&ex).ok());
  EXPECT_FALSE((*reader)->Next(&ex).ok());

  WriteText(path, Line("1", {}, {}) + "\n" + Line("1", {}, {}).substr(3) + "\n");
  data = ReadCriteoFile(path);
  ASSERT_FALSE(data.ok());
  EXPECT_THAT(std::string(data.status().message()),
              HasSubstr(path + ":2: expected 40 tab-separated fields"));

  data = ReadCriteoFile(dir + "/missing.txt");
  EXPECT_EQ(data.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(data.status().message()), HasSubstr(dir + "/missing.txt"));
  EXPECT_EQ(ReadCriteoFile(path, -1, 3).status().code(), absl::StatusCode::kInvalidArgument);
}

// Writes `text` gzip-compressed to `path`.
void WriteGzip(const std::string& path, const std::string& text) {
  gzFile f = gzopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr) << path;
  ASSERT_EQ(gzwrite(f, text.data(), static_cast<unsigned>(text.size())),
            static_cast<int>(text.size()));
  ASSERT_EQ(gzclose(f), Z_OK);
}

// Labels of every example, in order.
std::string Labels(const Dataset& d) {
  std::string s;
  for (const Example& e : d.examples) s += e.label > 0.5f ? '1' : '0';
  return s;
}

TEST(CriteoDataTest, GzipFilesReadLikeTheirText) {
  const std::string dir = TestDir("gzip");
  const std::string text = Line("1", {"5"}, {"abc"}) + "\n" + Line("0", {}, {}) + "\n";
  WriteText(dir + "/plain.txt", text);
  WriteGzip(dir + "/packed.gz", text);
  absl::StatusOr<Dataset> plain = ReadCriteoFile(dir + "/plain.txt");
  absl::StatusOr<Dataset> packed = ReadCriteoFile(dir + "/packed.gz");
  ASSERT_TRUE(plain.ok()) << plain.status();
  ASSERT_TRUE(packed.ok()) << packed.status();
  EXPECT_EQ(*plain, *packed);
  EXPECT_EQ(packed->examples.size(), 2u);

  // A truncated gzip file is refused by name, not read as shorter data.
  std::ifstream in(dir + "/packed.gz", std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  WriteText(dir + "/cut.gz", bytes.substr(0, bytes.size() - 12));
  absl::StatusOr<Dataset> cut = ReadCriteoFile(dir + "/cut.gz");
  ASSERT_FALSE(cut.ok());
  // The complete lines before a truncation are read first; the error names the line cut off.
  std::string many;
  for (int i = 0; i < 3000; ++i) many += Line(i % 2 ? "1" : "0", {absl::StrCat(i)}, {}) + "\n";
  WriteGzip(dir + "/many.gz", many);
  std::ifstream many_in(dir + "/many.gz", std::ios::binary);
  std::string many_bytes((std::istreambuf_iterator<char>(many_in)),
                         std::istreambuf_iterator<char>());
  WriteText(dir + "/many_cut.gz", many_bytes.substr(0, many_bytes.size() / 2));
  auto reader = CriteoReader::Open(dir + "/many_cut.gz");
  ASSERT_TRUE(reader.ok());
  Example e;
  int64_t read = 0;
  absl::StatusOr<bool> more;
  while ((more = (*reader)->Next(&e)).ok() && *more) ++read;
  ASSERT_FALSE(more.ok());
  EXPECT_GT(read, 100);
  EXPECT_LT(read, 3000);
  EXPECT_EQ(more.status().code(), absl::StatusCode::kDataLoss);
  EXPECT_THAT(std::string(more.status().message()),
              HasSubstr(absl::StrCat(dir, "/many_cut.gz:", read + 1,
                                     ": gzip data truncated or corrupt")));
  EXPECT_THAT(std::string(cut.status().message()),
              HasSubstr(dir + "/cut.gz:"));
  EXPECT_THAT(std::string(cut.status().message()), HasSubstr("gzip data truncated or corrupt"));
}

TEST(CriteoDataTest, SpecsNameFilesDirectoriesAndPatternsInOrder) {
  const std::string dir = TestDir("specs");
  ASSERT_EQ(mkdir((dir + "/day").c_str(), 0755), 0);
  WriteGzip(dir + "/day/part-1.gz", Line("1", {}, {}) + "\n");
  WriteText(dir + "/day/part-0", Line("0", {}, {}) + "\n");
  WriteText(dir + "/day/.hidden", "not data\n");
  WriteText(dir + "/day/_SUCCESS", "");  // a Hadoop / Spark marker
  WriteText(dir + "/extra.txt", Line("1", {}, {}) + "\n" + Line("1", {}, {}) + "\n");
  absl::StatusOr<std::vector<std::string>> paths =
      ExpandDataPaths(dir + "/extra.txt," + dir + "/day," + dir + "/day/part-*.gz");
  ASSERT_TRUE(paths.ok()) << paths.status();
  EXPECT_EQ(*paths, (std::vector<std::string>{dir + "/extra.txt", dir + "/day/part-0",
                                              dir + "/day/part-1.gz", dir + "/day/part-1.gz"}));
  CriteoReadStats stats;
  absl::StatusOr<Dataset> d = ReadCriteoData(dir + "/day," + dir + "/extra.txt", {}, &stats);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(Labels(*d), "0111");
  EXPECT_EQ(stats.files, 3);

  EXPECT_THAT(std::string(ExpandDataPaths(dir + "/day/*.bz2").status().message()),
              HasSubstr("data pattern '" + dir + "/day/*.bz2' matches no file"));
  EXPECT_THAT(std::string(ExpandDataPaths(dir + "/d*").status().message()),
              HasSubstr("matches no file"));  // only the directory "day": files only
  ASSERT_EQ(mkdir((dir + "/empty").c_str(), 0755), 0);
  EXPECT_THAT(std::string(ExpandDataPaths(dir + "/empty").status().message()),
              HasSubstr("data directory " + dir + "/empty holds no file"));
  EXPECT_THAT(std::string(ExpandDataPaths(dir + "/extra.txt,").status().message()),
              HasSubstr("has an empty item"));
  EXPECT_EQ(ReadCriteoData(dir + "/nope.txt", {}).status().code(), absl::StatusCode::kNotFound);
}

TEST(CriteoDataTest, BadLinesAreSkippedUpToTheBudgetOverAllFiles) {
  const std::string dir = TestDir("bad_lines");
  const std::string good = Line("1", {}, {}) + "\n";
  const std::string bad = Line("1", {"x"}, {}) + "\n";
  WriteText(dir + "/a.txt", good + bad + good);
  WriteGzip(dir + "/b.gz", bad + good + bad);
  CriteoDataOptions o;
  EXPECT_THAT(std::string(ReadCriteoData(dir, o).status().message()),
              HasSubstr(dir + "/a.txt:2: field 2 (I1)"));
  o.max_bad_lines = 3;
  CriteoReadStats stats;
  absl::StatusOr<Dataset> d = ReadCriteoData(dir, o, &stats);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->examples.size(), 3u);
  EXPECT_EQ(stats.bad_lines, 3);
  EXPECT_THAT(stats.first_bad_line, HasSubstr(dir + "/a.txt:2: field 2 (I1)"));
  o.max_bad_lines = 2;  // the third, in the second file, is one too many
  absl::Status s = ReadCriteoData(dir, o).status();
  EXPECT_THAT(std::string(s.message()), HasSubstr(dir + "/b.gz:3: field 2 (I1)"));
  EXPECT_THAT(std::string(s.message()),
              HasSubstr("(more than --max_bad_lines=2 bad lines; the first: " + dir + "/a.txt:2"));
}

TEST(CriteoDataTest, ByteOrderMarksAndCrOnlyLineEndsSayWhatTheyAre) {
  const std::string dir = TestDir("bom_cr");
  const std::string good = Line("1", {}, {});
  WriteText(dir + "/bom.txt", "\xEF\xBB\xBF" + good + "\n");
  EXPECT_THAT(std::string(ReadCriteoFile(dir + "/bom.txt").status().message()),
              HasSubstr(dir + "/bom.txt:1: the file starts with a UTF-8 byte-order mark"));
  WriteText(dir + "/mac.txt", good + "\r" + good + "\r");
  EXPECT_THAT(std::string(ReadCriteoFile(dir + "/mac.txt").status().message()),
              HasSubstr("CR-only line ends (classic Mac)? convert them to LF"));
  // Even under a bad-line budget: a byte-order mark is the file's problem, not a line's.
  CriteoDataOptions o;
  o.max_bad_lines = 10;
  EXPECT_FALSE(ReadCriteoData(dir + "/bom.txt", o).ok());
}

TEST(CriteoFileTest, LinesLongerThanTheLimitAreRefusedByFileAndLine) {
  const std::string dir = TestDir("long_lines");
  const std::string path = dir + "/long.txt";
  const std::string good = Line("1", {}, {});
  const int64_t limit = static_cast<int64_t>(good.size());
  // A line of exactly the limit (also with CRLF) reads; one byte more is refused.
  WriteText(path, good + "\n" + good + "\r\n" + good + "\t\n" + good + "\n");
  absl::StatusOr<std::unique_ptr<CriteoReader>> reader =
      CriteoReader::Open(path, kCriteoNumDense, kCriteoNumSparse, limit);
  ASSERT_TRUE(reader.ok()) << reader.status();
  Example ex;
  EXPECT_TRUE(*(*reader)->Next(&ex));
  EXPECT_TRUE(*(*reader)->Next(&ex));
  absl::StatusOr<bool> third = (*reader)->Next(&ex);
  ASSERT_FALSE(third.ok());
  EXPECT_EQ(third.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(third.status().message()),
              HasSubstr(absl::StrCat(path, ":3: line is longer than ", limit, " bytes")));
  EXPECT_FALSE((*reader)->Next(&ex).ok());  // no reading past the error

  // A file with no line end at all (what /dev/zero is) stops at the limit, not at its end.
  const std::string binary = dir + "/binary.bin";
  WriteText(binary, std::string(4 << 20, '\0'));
  absl::StatusOr<Dataset> data =
      ReadCriteoFile(binary, kCriteoNumDense, kCriteoNumSparse, int64_t{1} << 16);
  ASSERT_FALSE(data.ok());
  EXPECT_THAT(std::string(data.status().message()),
              HasSubstr(binary + ":1: line is longer than 65536 bytes"));
  if (FILE* zero = std::fopen("/dev/zero", "r")) {
    std::fclose(zero);
    data = ReadCriteoFile("/dev/zero");
    ASSERT_FALSE(data.ok());
    EXPECT_THAT(std::string(data.status().message()),
                HasSubstr("/dev/zero:1: line is longer than 1048576 bytes"));
  }
  EXPECT_FALSE(CriteoReader::Open(path, kCriteoNumDense, kCriteoNumSparse, 0).ok());
}

TEST(CriteoFileTest, RoundTripsGeneratedData) {
  const std::string dir = TestDir("round_trip");
  const std::string path = dir + "/data.txt";
  CtrDataOptions options;
  options.seed = 3;
  absl::StatusOr<Dataset> data = MakeCtrData(2000, options);
  ASSERT_TRUE(data.ok()) << data.status();
  ASSERT_TRUE(WriteCriteoFile(path, *data).ok());
  EXPECT_EQ(ListDir(dir), std::vector<std::string>{"data.txt"});  // No temporary file left.
  absl::StatusOr<Dataset> back = ReadCriteoFile(path);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(*back == *data);

  // Extreme ids and counts, and other field counts.
  Dataset small;
  small.num_dense = 2;
  small.num_sparse = 3;
  small.examples.push_back(
      {{0.0f, DenseFromCount(999999)}, {std::numeric_limits<int64_t>::min(), -1, 0}, 1.0f});
  small.examples.push_back({{DenseFromCount(1), DenseFromCount(12)},
                            {std::numeric_limits<int64_t>::max(), 1, 42},
                            0.0f});
  ASSERT_TRUE(WriteCriteoFile(path, small).ok());  // Replaces the file.
  std::ifstream in(path);
  std::string first;
  std::getline(in, first);
  EXPECT_EQ(first, "1\t0\t999999\t8000000000000000\tffffffffffffffff\t0000000000000000");
  back = ReadCriteoFile(path, 2, 3);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_TRUE(*back == small);

  Dataset empty;
  empty.num_dense = 13;
  empty.num_sparse = 26;
  ASSERT_TRUE(WriteCriteoFile(path, empty).ok());
  back = ReadCriteoFile(path);
  ASSERT_TRUE(back.ok());
  EXPECT_TRUE(back->examples.empty());
}

TEST(CriteoFileTest, WriterIsAtomicAndRejectsBadExamples) {
  const std::string dir = TestDir("atomic");
  const std::string path = dir + "/out.txt";
  WriteText(path, "old\n");
  {
    absl::StatusOr<std::unique_ptr<CriteoWriter>> w = CriteoWriter::Open(path, 1, 1);
    ASSERT_TRUE(w.ok()) << w.status();
    ASSERT_TRUE((*w)->Write({{0.0f}, {5}, 1.0f}).ok());

    absl::Status s = (*w)->Write({{0.0f}, {5}, 0.5f});
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(s.message()), HasSubstr("example 1: label 0.5 is not 0 or 1"));
    s = (*w)->Write({{-1.0f}, {5}, 0.0f});
    EXPECT_THAT(std::string(s.message()), HasSubstr("example 1: dense value I1=-1"));
    s = (*w)->Write({{std::nanf("")}, {5}, 0.0f});
    EXPECT_THAT(std::string(s.message()), HasSubstr("dense value I1=nan"));
    s = (*w)->Write({{0.0f, 1.0f}, {5}, 0.0f});
    EXPECT_THAT(std::string(s.message()), HasSubstr("example 1 has 2 dense values, 1 ids and 0 id lists"));
    ASSERT_TRUE((*w)->Write({{0.0f}, {6}, 0.0f}).ok());  // Still usable.
    EXPECT_EQ((*w)->num_written(), 2);
    // Until Close(), the old file is untouched.
    std::ifstream in(path);
    std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    EXPECT_EQ(text, "old\n");
    // Destroyed without Close(): the temporary file goes away, the old file stays.
  }
  EXPECT_EQ(ListDir(dir), std::vector<std::string>{"out.txt"});
  std::ifstream in(path);
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(text, "old\n");

  absl::StatusOr<std::unique_ptr<CriteoWriter>> w = CriteoWriter::Open(path, 1, 1);
  ASSERT_TRUE(w.ok());
  ASSERT_TRUE((*w)->Write({{0.0f}, {5}, 1.0f}).ok());
  ASSERT_TRUE((*w)->Close().ok());
  EXPECT_FALSE((*w)->Close().ok());
  EXPECT_FALSE((*w)->Write({{0.0f}, {5}, 1.0f}).ok());
  absl::StatusOr<Dataset> back = ReadCriteoFile(path, 1, 1);
  ASSERT_TRUE(back.ok());
  ASSERT_EQ(back->examples.size(), 1u);
  EXPECT_EQ(back->examples[0].sparse[0], 5);

  absl::Status s = WriteCriteoFile(dir + "/no/such/dir/x.txt", *back);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(s.message()), HasSubstr(dir + "/no/such/dir/x.txt"));
}

}  // namespace
}  // namespace data
}  // namespace tessera
