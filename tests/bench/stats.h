// Summary statistics of benchmark repeats.
#ifndef TESSERA_TESTS_BENCH_STATS_H_
#define TESSERA_TESTS_BENCH_STATS_H_

#include <algorithm>
#include <vector>

namespace tessera {
namespace bench {

// The median of `v` (the mean of the middle two for an even count; 0 when empty).
inline double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 == 1 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

}  // namespace bench
}  // namespace tessera

#endif  // TESSERA_TESTS_BENCH_STATS_H_
