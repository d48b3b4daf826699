// In-memory training examples: a fixed number of dense (float) features and of categorical
// slots with one int64 id each, plus a label. Plain values; thread-compatible.
#ifndef TESSERA_COMMON_DATA_EXAMPLE_H_
#define TESSERA_COMMON_DATA_EXAMPLE_H_

#include <cstdint>
#include <vector>

namespace tessera {
namespace data {

struct Example {
  std::vector<float> dense;     // Dataset::num_dense values.
  std::vector<int64_t> sparse;  // Dataset::num_sparse ids, one per categorical slot; any int64.
  float label = 0;              // 0/1 for click data; a real target for regression data.

  bool operator==(const Example& o) const {
    return dense == o.dense && sparse == o.sparse && label == o.label;
  }
  bool operator!=(const Example& o) const { return !(*this == o); }
};

struct Dataset {
  int num_dense = 0;
  int num_sparse = 0;
  // Every example has exactly num_dense dense values and num_sparse ids.
  std::vector<Example> examples;

  bool operator==(const Dataset& o) const {
    return num_dense == o.num_dense && num_sparse == o.num_sparse && examples == o.examples;
  }
};

}  // namespace data
}  // namespace tessera

#endif  // TESSERA_COMMON_DATA_EXAMPLE_H_
