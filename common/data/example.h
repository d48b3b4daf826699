// In-memory training examples: a fixed number of dense (float) features, of categorical slots
// with one int64 id each and of multi-hot slots with a list of ids each, plus a label. Plain
// values; thread-compatible.
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
  // Dataset::num_multi lists of ids (any int64, any length, possibly empty), one per multi-hot
  // slot.
  std::vector<std::vector<int64_t>> multi;

  bool operator==(const Example& o) const {
    return dense == o.dense && sparse == o.sparse && label == o.label && multi == o.multi;
  }
  bool operator!=(const Example& o) const { return !(*this == o); }
};

struct Dataset {
  int num_dense = 0;
  int num_sparse = 0;
  int num_multi = 0;
  // Every example has exactly num_dense dense values, num_sparse ids and num_multi id lists.
  std::vector<Example> examples;

  bool operator==(const Dataset& o) const {
    return num_dense == o.num_dense && num_sparse == o.num_sparse && num_multi == o.num_multi &&
           examples == o.examples;
  }
};

}  // namespace data
}  // namespace tessera

#endif  // TESSERA_COMMON_DATA_EXAMPLE_H_
