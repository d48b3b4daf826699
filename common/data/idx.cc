#include "common/data/idx.h"

#include <zlib.h>

#include <cerrno>
#include <cstring>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "common/io/file_system.h"
#include "common/base/status.h"

namespace tessera {
namespace data {

namespace {

constexpr uint8_t kUnsignedByte = 0x08;

struct GzCloser {
  void operator()(gzFile f) const { gzclose(f); }
};

// The whole file, decompressed when it is gzip (zlib reads plain files as they are).
absl::StatusOr<std::string> ReadAll(const std::string& path) {
  std::unique_ptr<gzFile_s, GzCloser> f(gzopen(path.c_str(), "rb"));
  if (f == nullptr) {
    return absl::NotFoundError(absl::StrCat(path, ": cannot open: ", std::strerror(errno)));
  }
  gzbuffer(f.get(), 1 << 20);
  std::string data;
  char buf[1 << 16];
  for (;;) {
    const int n = gzread(f.get(), buf, sizeof(buf));
    if (n < 0) {
      int code = 0;
      const char* msg = gzerror(f.get(), &code);
      return absl::DataLossError(absl::StrCat(path, ": unreadable: ", msg));
    }
    if (n == 0) break;
    data.append(buf, static_cast<size_t>(n));
  }
  return data;
}

uint32_t BigEndian32(const std::string& s, size_t at) {
  return (static_cast<uint32_t>(static_cast<uint8_t>(s[at])) << 24) |
         (static_cast<uint32_t>(static_cast<uint8_t>(s[at + 1])) << 16) |
         (static_cast<uint32_t>(static_cast<uint8_t>(s[at + 2])) << 8) |
         static_cast<uint32_t>(static_cast<uint8_t>(s[at + 3]));
}

// <prefix>-<kind>-idx<d>-ubyte, or the same with ".gz".
absl::StatusOr<std::string> FindIdx(const std::string& prefix, const std::string& kind, int dims) {
  const std::string plain = absl::StrCat(prefix, "-", kind, "-idx", dims, "-ubyte");
  io::FileSystem* fs = io::PosixFileSystem::Default();
  if (fs->Exists(plain)) return plain;
  if (fs->Exists(plain + ".gz")) return plain + ".gz";
  return absl::NotFoundError(
      absl::StrCat("IDX data '", prefix, "': neither ", plain, " nor ", plain, ".gz exists"));
}

}  // namespace

absl::StatusOr<IdxArray> ReadIdxFile(const std::string& path) {
  TS_ASSIGN_OR_RETURN(std::string data, ReadAll(path));
  if (data.size() < 4) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": ", data.size(), " bytes is too short for an IDX header"));
  }
  const uint32_t magic = BigEndian32(data, 0);
  const uint8_t type = static_cast<uint8_t>(data[2]);
  const int rank = static_cast<uint8_t>(data[3]);
  if (data[0] != 0 || data[1] != 0 || rank == 0) {
    char hex[16];
    std::snprintf(hex, sizeof(hex), "0x%08x", magic);
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": bad IDX magic number ", hex,
                     " (expected 0x000008NN: two zero bytes, type, rank)"));
  }
  if (type != kUnsignedByte) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": IDX element type 0x", absl::Hex(type),
                                                   " is not supported (0x08, unsigned byte)"));
  }
  const size_t header = 4 + 4 * static_cast<size_t>(rank);
  if (data.size() < header) {
    return absl::InvalidArgumentError(
        absl::StrCat(path, ": truncated IDX header (", rank, " dimensions)"));
  }
  IdxArray a;
  uint64_t count = 1;
  for (int i = 0; i < rank; ++i) {
    a.dims.push_back(BigEndian32(data, 4 + 4 * static_cast<size_t>(i)));
    count *= static_cast<uint64_t>(a.dims.back());
    if (count > data.size()) break;  // the size check below fails
  }
  if (data.size() - header != count) {
    return absl::InvalidArgumentError(absl::StrCat(path, ": IDX dimensions hold ", count,
                                                   " bytes but the file has ", data.size() - header,
                                                   " after its header"));
  }
  a.values.assign(data.begin() + static_cast<std::ptrdiff_t>(header), data.end());
  return a;
}

absl::StatusOr<Dataset> ReadIdxData(const std::string& spec, int num_dense) {
  std::string images_path, labels_path;
  std::vector<std::string> parts = absl::StrSplit(spec, ',');
  if (parts.size() == 2) {
    images_path = parts[0];
    labels_path = parts[1];
  } else if (parts.size() == 1 && !spec.empty()) {
    TS_ASSIGN_OR_RETURN(images_path, FindIdx(spec, "images", 3));
    TS_ASSIGN_OR_RETURN(labels_path, FindIdx(spec, "labels", 1));
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("IDX data '", spec,
                     "' must be a prefix (<prefix>-images-idx3-ubyte[.gz]) or "
                     "'<images>,<labels>'"));
  }
  TS_ASSIGN_OR_RETURN(IdxArray images, ReadIdxFile(images_path));
  TS_ASSIGN_OR_RETURN(IdxArray labels, ReadIdxFile(labels_path));
  if (images.dims.size() != 3) {
    return absl::InvalidArgumentError(absl::StrCat(images_path,
                                                   ": images must have 3 IDX "
                                                   "dimensions [n, rows, cols], not ",
                                                   images.dims.size()));
  }
  if (labels.dims.size() != 1) {
    return absl::InvalidArgumentError(absl::StrCat(labels_path,
                                                   ": labels must have 1 IDX "
                                                   "dimension [n], not ",
                                                   labels.dims.size()));
  }
  if (images.dims[0] != labels.dims[0]) {
    return absl::InvalidArgumentError(absl::StrCat(images_path, " holds ", images.dims[0],
                                                   " images but ", labels_path, " holds ",
                                                   labels.dims[0], " labels"));
  }
  const int64_t n = images.dims[0];
  const int64_t pixels = images.dims[1] * images.dims[2];
  if (num_dense > 0 && pixels != num_dense) {
    return absl::InvalidArgumentError(
        absl::StrCat(images_path, ": images of ", images.dims[1], "x", images.dims[2], " = ",
                     pixels, " pixels do not fit the model's ", num_dense, " dense features"));
  }
  Dataset d;
  d.num_dense = static_cast<int>(pixels);
  d.examples.resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    Example& e = d.examples[static_cast<size_t>(i)];
    e.dense.resize(static_cast<size_t>(pixels));
    const uint8_t* p = images.values.data() + i * pixels;
    for (int64_t k = 0; k < pixels; ++k) e.dense[static_cast<size_t>(k)] = p[k] / 255.0f;
    e.label = static_cast<float>(labels.values[static_cast<size_t>(i)]);
  }
  return d;
}

}  // namespace data
}  // namespace tessera
