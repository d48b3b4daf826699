#include "common/data/idx.h"

#include <zlib.h>

#include <cstdio>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/data/criteo.h"
#include "gtest/gtest.h"

namespace tessera {
namespace data {
namespace {

std::string Header(uint8_t type, const std::vector<uint32_t>& dims) {
  std::string h = {0, 0, static_cast<char>(type), static_cast<char>(dims.size())};
  for (uint32_t d : dims) {
    for (int shift = 24; shift >= 0; shift -= 8) h.push_back(static_cast<char>(d >> shift));
  }
  return h;
}

std::string TempPath(const std::string& name) {
  return absl::StrCat(::testing::TempDir(), "/", name);
}

void WritePlain(const std::string& path, const std::string& bytes) {
  FILE* f = std::fopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr) << path;
  std::fwrite(bytes.data(), 1, bytes.size(), f);
  std::fclose(f);
}

void WriteGzip(const std::string& path, const std::string& bytes) {
  gzFile f = gzopen(path.c_str(), "wb");
  ASSERT_NE(f, nullptr) << path;
  gzwrite(f, bytes.data(), static_cast<unsigned>(bytes.size()));
  gzclose(f);
}

// Three 2x3 images (pixel k of image i is 40 i + k) and labels 7, 0, 9.
void WriteSet(const std::string& prefix, bool gzip) {
  std::string images = Header(0x08, {3, 2, 3});
  for (int i = 0; i < 3; ++i)
    for (int k = 0; k < 6; ++k) images.push_back(static_cast<char>(40 * i + k));
  std::string labels = Header(0x08, {3}) + std::string{7, 0, 9};
  auto write = gzip ? WriteGzip : WritePlain;
  write(prefix + "-images-idx3-ubyte" + (gzip ? ".gz" : ""), images);
  write(prefix + "-labels-idx1-ubyte" + (gzip ? ".gz" : ""), labels);
}

TEST(IdxTest, ReadsPlainAndGzipByPrefix) {
  for (bool gzip : {false, true}) {
    const std::string prefix = TempPath(gzip ? "gz" : "plain");
    WriteSet(prefix, gzip);
    absl::StatusOr<Dataset> d = ReadIdxData(prefix, 6);
    ASSERT_TRUE(d.ok()) << d.status();
    ASSERT_EQ(d->examples.size(), 3u);
    EXPECT_EQ(d->num_dense, 6);
    EXPECT_EQ(d->examples[2].label, 9.0f);
    EXPECT_FLOAT_EQ(d->examples[2].dense[5], 85 / 255.0f);
    EXPECT_EQ(d->examples[0].dense[0], 0.0f);
  }
}

TEST(IdxTest, ReadsTwoPathsThroughReadCriteoData) {
  const std::string prefix = TempPath("paths");
  WriteSet(prefix, false);
  CriteoDataOptions o;
  o.format = DataFormat::kIdx;
  o.num_dense = 6;
  o.num_sparse = 0;
  absl::StatusOr<Dataset> d =
      ReadCriteoData(absl::StrCat(prefix, "-images-idx3-ubyte,", prefix, "-labels-idx1-ubyte"), o);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->examples[0].label, 7.0f);
  o.num_dense = 784;
  d = ReadCriteoData(prefix, o);
  EXPECT_NE(d.status().message().find("2x3 = 6 pixels do not fit the model's 784"),
            std::string::npos)
      << d.status();
  o.num_dense = 6;
  o.num_sparse = 26;
  EXPECT_NE(ReadCriteoData(prefix, o).status().message().find("26 categorical"), std::string::npos);
}

TEST(IdxTest, OneLineErrors) {
  const std::string prefix = TempPath("bad");
  WriteSet(prefix, false);
  const std::string images = prefix + "-images-idx3-ubyte";
  // Bad magic.
  WritePlain(images, std::string{1, 2, 8, 3} + std::string(12, '\0'));
  absl::Status s = ReadIdxData(prefix).status();
  EXPECT_NE(s.message().find(images + ": bad IDX magic number 0x01020803"), std::string::npos) << s;
  // Count mismatch between the files.
  std::string four = Header(0x08, {4, 2, 3}) + std::string(24, '\1');
  WritePlain(images, four);
  s = ReadIdxData(prefix).status();
  EXPECT_NE(s.message().find("holds 4 images but"), std::string::npos) << s;
  EXPECT_NE(s.message().find("holds 3 labels"), std::string::npos) << s;
  // Truncated data, and an unsupported element type.
  WritePlain(images, four.substr(0, four.size() - 1));
  s = ReadIdxData(prefix).status();
  EXPECT_NE(s.message().find("hold 24 bytes but the file has 23"), std::string::npos) << s;
  WritePlain(images, Header(0x0D, {1, 1, 1}) + std::string(4, '\0'));
  s = ReadIdxData(prefix).status();
  EXPECT_NE(s.message().find("element type 0xd is not supported"), std::string::npos) << s;
  // Missing files and a bad spec.
  s = ReadIdxData(TempPath("none")).status();
  EXPECT_NE(s.message().find("none-images-idx3-ubyte.gz exists"), std::string::npos) << s;
  EXPECT_FALSE(ReadIdxData("a,b,c").ok());
  EXPECT_NE(ParseDataFormat("idx").value_or(DataFormat::kCriteo), DataFormat::kCriteo);
}

}  // namespace
}  // namespace data
}  // namespace tessera
