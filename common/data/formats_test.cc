#include "common/data/formats.h"

#include <stdlib.h>

#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/data/criteo.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tessera {
namespace data {
namespace {

using ::testing::HasSubstr;

std::string TestFile(const std::string& name, const std::string& text) {
  std::string dir = absl::StrCat(::testing::TempDir(), "/formats_test_XXXXXX");
  EXPECT_NE(mkdtemp(dir.data()), nullptr);
  const std::string path = dir + "/" + name;
  std::ofstream(path, std::ios::binary) << text;
  return path;
}

std::vector<Example> ReadAll(CriteoReader* reader) {
  std::vector<Example> out;
  Example e;
  while (true) {
    absl::StatusOr<bool> more = reader->Next(&e);
    EXPECT_TRUE(more.ok()) << more.status();
    if (!more.ok() || !*more) return out;
    out.push_back(e);
  }
}

DataSchema Schema(DataFormat format, int dense, int sparse, int multi) {
  DataSchema s;
  s.format = format;
  s.num_dense = dense;
  s.num_sparse = sparse;
  s.num_multi = multi;
  return s;
}

TEST(FormatsTest, NamesAndColumnSpecs) {
  EXPECT_EQ(*ParseDataFormat("csv"), DataFormat::kCsv);
  EXPECT_EQ(std::string(DataFormatName(*ParseDataFormat("multislot"))), "multislot");
  EXPECT_THAT(std::string(ParseDataFormat("parquet").status().message()), HasSubstr("'parquet'"));
  auto c = ParseCsvColumns("label=click;dense=age,income;slots=country;multi=tags");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->label, "click");
  EXPECT_EQ(c->dense, (std::vector<std::string>{"age", "income"}));
  EXPECT_EQ(c->slots, (std::vector<std::string>{"country"}));
  EXPECT_EQ(c->multi, (std::vector<std::string>{"tags"}));
  EXPECT_THAT(std::string(ParseCsvColumns("labels=x").status().message()), HasSubstr("'labels=x'"));
  EXPECT_FALSE(ParseCsvColumns("label=a,b").ok());
  EXPECT_FALSE(ParseCsvColumns("dense").ok());
}

TEST(FormatsTest, CsvPicksColumnsByNameQuotesAndHashesText) {
  DataSchema s = Schema(DataFormat::kCsv, 2, 2, 1);
  s.csv = *ParseCsvColumns("label=click;dense=age,income;slots=country,user;multi=tags");
  const std::string path = TestFile("a.csv",
                                    "user,unused,click,age,income,country,tags\r\n"
                                    "42,x,1,31,\"1200.5\",US,7|8|9\n"
                                    "-3,\"say \"\"hi\"\"\",0,,0.5,\"\",\n");
  auto reader = CriteoReader::Open(path, s);
  ASSERT_TRUE(reader.ok()) << reader.status();
  std::vector<Example> got = ReadAll(reader->get());
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].label, 1);
  EXPECT_EQ(got[0].dense, (std::vector<float>{31, 1200.5f}));
  EXPECT_EQ(got[0].sparse, (std::vector<int64_t>{HashId("US"), 42}));
  EXPECT_EQ(got[0].multi[0], (std::vector<int64_t>{7, 8, 9}));
  EXPECT_EQ(got[1].label, 0);
  EXPECT_EQ(got[1].dense, (std::vector<float>{0, 0.5f}));
  EXPECT_EQ(got[1].sparse, (std::vector<int64_t>{0, -3}));
  EXPECT_TRUE(got[1].multi[0].empty());
  EXPECT_NE(HashId("US"), HashId("UK"));
  // A comma inside quotes belongs to the field.
  auto parser = NewLineParser(s);
  ASSERT_TRUE((*parser)->Header("user,unused,click,age,income,country,tags").ok());
  Example e;
  EXPECT_THAT(std::string((*parser)->Parse("1,x,1,31,\"1,200.5\",US,", &e).message()),
              HasSubstr("field 5 (income): dense value is not a finite number: '1,200.5'"));
  EXPECT_THAT(std::string((*parser)->Parse("1,\"x,1,31,0,US,", &e).message()),
              HasSubstr("a quote is not closed"));
}

TEST(FormatsTest, CsvErrorsNameTheColumnOrTheLine) {
  DataSchema s = Schema(DataFormat::kCsv, 1, 0, 0);
  s.csv.dense = {"age"};
  const std::string missing = TestFile("m.csv", "label,height\n1,2\n");
  auto reader = CriteoReader::Open(missing, s);
  Example e;
  absl::StatusOr<bool> r = (*reader)->Next(&e);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(),
            missing + ":1: the CSV header has no column 'age' (it has: label,height)");
  const std::string bad = TestFile("b.csv", "label,age\n1,2\n0,x\n1,2,3\n");
  reader = CriteoReader::Open(bad, s);
  EXPECT_TRUE(*(*reader)->Next(&e));
  r = (*reader)->Next(&e);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().message(),
            bad + ":3: field 2 (age): dense value is not a finite number: 'x'");
  (*reader.value()).set_max_bad_lines(0);
  s.csv.dense = {"a", "b"};
  EXPECT_THAT(std::string(NewLineParser(s).status().message()),
              HasSubstr("2 dense columns named, the model feeds 1"));
}

// A CSV file cut into byte ranges anywhere: every range reads the header first, and together
// they read every record once, in order.
TEST(FormatsTest, CsvByteRangesEachReadTheHeader) {
  DataSchema s = Schema(DataFormat::kCsv, 1, 1, 0);
  std::string text = "label,I1,C1\n";
  for (int i = 0; i < 40; ++i) absl::StrAppend(&text, i % 2, ",", i, ",id", i, "\n");
  const std::string path = TestFile("r.csv", text);
  auto whole = CriteoReader::Open(path, s);
  const std::vector<Example> want = ReadAll(whole->get());
  ASSERT_EQ(want.size(), 40u);
  for (int64_t cut : {int64_t{3}, int64_t{12}, int64_t{13}, int64_t{100}}) {
    std::vector<Example> got;
    for (auto [begin, end] : {std::make_pair(int64_t{0}, cut), std::make_pair(cut, int64_t{-1})}) {
      auto r = CriteoReader::Open(path, s);
      ASSERT_TRUE((*r)->Restrict(begin, end).ok());
      for (Example& e : ReadAll(r->get())) got.push_back(e);
    }
    EXPECT_TRUE(got == want) << "cut at " << cut << ": " << got.size() << " examples";
  }
}

TEST(FormatsTest, CriteoWithFloatDenseValues) {
  DataSchema s = Schema(DataFormat::kCriteo, 2, 1, 0);
  s.float_dense = true;
  const std::string path = TestFile("f.txt", "1\t260.0\t-1.5e3\tab\n0\t\t7\t1\n");
  auto reader = CriteoReader::Open(path, s);
  std::vector<Example> got = ReadAll(reader->get());
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].dense, (std::vector<float>{260.0f, -1500.0f}));
  EXPECT_EQ(got[1].dense, (std::vector<float>{0, 7}));
  Example e;
  EXPECT_THAT(std::string(ParseCriteoLine("1\tnan\t1\tab", 2, 1, &e, 0, true).message()),
              HasSubstr("field 2 (I1): dense value is not a finite number: 'nan'"));
  // Without float_dense a float is not a count.
  EXPECT_FALSE(ParseCriteoLine("1\t260.0\t1\tab", 2, 1, &e).ok());
}

TEST(FormatsTest, LibsvmFillsDenseAndOneSlotOfIds) {
  auto parser = NewLineParser(Schema(DataFormat::kLibsvm, 3, 0, 1));
  ASSERT_TRUE(parser.ok()) << parser.status();
  Example e;
  ASSERT_TRUE((*parser)->Parse("+1 0:0.5 2:-2\t17:1 9:1", &e).ok());
  EXPECT_EQ(e.label, 1);
  EXPECT_EQ(e.dense, (std::vector<float>{0.5f, 0, -2}));
  EXPECT_EQ(e.multi[0], (std::vector<int64_t>{17, 9}));
  ASSERT_TRUE((*parser)->Parse("-1 1:3", &e).ok());
  EXPECT_EQ(e.label, 0);
  EXPECT_EQ(e.dense, (std::vector<float>{0, 3, 0}));
  EXPECT_TRUE(e.multi[0].empty());
  EXPECT_THAT(std::string((*parser)->Parse("1 4:2", &e).message()), HasSubstr("must have value 1"));
  EXPECT_THAT(std::string((*parser)->Parse("1 x:1", &e).message()),
              HasSubstr("field 2 (feature): not index:value"));
  auto dense_only = NewLineParser(Schema(DataFormat::kLibsvm, 2, 0, 0));
  EXPECT_THAT(std::string((*dense_only)->Parse("1 5:1", &e).message()),
              HasSubstr("not below the dense count"));
  EXPECT_FALSE(NewLineParser(Schema(DataFormat::kLibsvm, 2, 1, 0)).ok());
}

TEST(FormatsTest, MultiSlotCountsThenValues) {
  auto parser = NewLineParser(Schema(DataFormat::kMultiSlot, 2, 1, 2));
  ASSERT_TRUE(parser.ok());
  Example e;
  ASSERT_TRUE((*parser)->Parse("1 1 2 0.5 1.5 1 42 3 7 8 -9 0", &e).ok());
  EXPECT_EQ(e.label, 1);
  EXPECT_EQ(e.dense, (std::vector<float>{0.5f, 1.5f}));
  EXPECT_EQ(e.sparse, (std::vector<int64_t>{42}));
  EXPECT_EQ(e.multi[0], (std::vector<int64_t>{7, 8, -9}));
  EXPECT_TRUE(e.multi[1].empty());
  EXPECT_THAT(std::string((*parser)->Parse("1 0 2 x 1.5 1 42 0 0", &e).message()),
              HasSubstr("field 4 (dense): value is not a finite number: 'x'"));
  EXPECT_THAT(std::string((*parser)->Parse("1 1 3 0.5 1.5 1 1 42 0 0", &e).message()),
              HasSubstr("(count of dense): must be 2"));
  EXPECT_THAT(std::string((*parser)->Parse("1 1 2 0.5 1.5 1 42 5 1 2", &e).message()),
              HasSubstr("is not a count of the values that follow"));
  EXPECT_THAT(std::string((*parser)->Parse("1 1 2 0.5 1.5 1 42 0 0 7", &e).message()),
              HasSubstr("more values than the slots hold"));
  EXPECT_THAT(std::string((*parser)->Parse("1 1 2 0.5 1.5 1 42 0", &e).message()),
              HasSubstr("the line ends before slot M2"));
}

}  // namespace
}  // namespace data
}  // namespace tessera
