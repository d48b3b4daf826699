// IDX files (LeCun's MNIST format, used by MNIST and Fashion-MNIST), plain or gzip: a big-endian
// header (two zero bytes, the element type, the number of dimensions, then each dimension as a
// uint32) and the elements in row-major order. Only unsigned-byte elements (type 0x08) are read.
//
// As training data (--data_format=idx), a data spec names an images file of [n, rows, cols]
// and a labels file of [n]:
//   "<prefix>"                 <prefix>-images-idx3-ubyte and <prefix>-labels-idx1-ubyte, each
//                              plain or with ".gz" (e.g. /usr/share/datasets/fashion-mnist/train)
//   "<images>,<labels>"        the two files by path
// Each image becomes an Example of rows * cols dense values, the pixels scaled to [0, 1]
// (byte / 255), in row-major order, and its label (a class id) as the label.
#ifndef TESSERA_COMMON_DATA_IDX_H_
#define TESSERA_COMMON_DATA_IDX_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/data/example.h"

namespace tessera {
namespace data {

struct IdxArray {
  std::vector<int64_t> dims;
  std::vector<uint8_t> values;  // product(dims) bytes
};

// Reads one unsigned-byte IDX file. A bad magic number, an unsupported element type, a size
// that disagrees with the dimensions, or unreadable gzip data is a one-line error naming the
// path.
absl::StatusOr<IdxArray> ReadIdxFile(const std::string& path);

// The images and labels of `spec` (above) as a Dataset; `num_dense` (when > 0) must equal
// rows * cols. The two files must hold the same number of items; errors name the paths.
absl::StatusOr<Dataset> ReadIdxData(const std::string& spec, int num_dense = 0);

}  // namespace data
}  // namespace tessera

#endif  // TESSERA_COMMON_DATA_IDX_H_
