// The update rules of optimizer_rules.h on rows of float or double, a vector register's worth of
// elements at a time (host only; the dense CPU kernels and the pserver's SparseTable call them).
//
// Eigen's own loop over a row of unknown alignment runs the row's unaligned head and its tail
// through scalar code and only the aligned middle in packets. Most of a short row is head and
// tail: a 9-float row of a fused table (the CTR job's emb_i + wide_i) took about 8 of its 9
// square roots and divisions one at a time, and SparseTable's adam was the largest item of a
// pserver's profile. Here a row goes through fixed-size groups of kGroup<T> elements (32 bytes:
// 8 floats, 4 doubles), loaded and stored unaligned, so every element takes the same packet
// code. An update still depends neither on where a row lies in memory nor on where an element
// lies in its row, and it gives the bits of the array form (the rules on Eigen maps of the
// whole row; optimizer_rules_test pins it): the same operations on the same values.
//
// Instantiate only with -DEIGEN_FAST_MATH=0 (see optimizer_rules.h): Eigen's default packet
// sqrt is an approximation. Pure and thread-safe.
#ifndef TESSERA_COMMON_OPS_OPTIMIZER_ROWS_H_
#define TESSERA_COMMON_OPS_OPTIMIZER_ROWS_H_

#include <cstdint>
#include <cstring>

#include "Eigen/Core"
#include "common/ops/optimizer_rules.h"

#if defined(EIGEN_FAST_MATH) && EIGEN_FAST_MATH
#error "optimizer_rows.h needs -DEIGEN_FAST_MATH=0 (the exact packet sqrt)"
#endif

namespace tessera {
namespace optimizer_rows {

// Elements per group: 32 bytes, an AVX register.
template <typename T>
constexpr int64_t kGroup = 32 / sizeof(T);

// Calls update(P, S1, S2, G) on the n-element rows p, s1, s2 (updated in place; s1 and s2 may
// be null where the rule has no such state) and g: on groups of kGroup<T> elements (Eigen
// arrays of fixed size), or, for a row shorter than a group, once on the whole row (Eigen maps:
// its scalar code, which gives the packets' bits).
//
// A row whose length is not a multiple of kGroup<T> ends in a partial group. That one is
// computed first, on the row's last kGroup<T> elements while they still hold their old values;
// the whole groups follow, and of the first result only the partial group's elements are
// stored, last. So every element takes the same instructions, and no load reads memory that a
// store has just partly written (a padded or masked tail group made the row slower than
// Eigen's scalar code: its loads waited for the stores before them).
template <typename T, typename Update>
TS_OPTIMIZER_RULE void ForEachGroup(int64_t n, T* p, T* s1, T* s2, const T* g, Update&& update) {
  constexpr int64_t kSize = kGroup<T>;
  T* rows[3] = {p, s1, s2};
  if (n < kSize) {
    using Row = Eigen::Map<Eigen::Array<T, Eigen::Dynamic, 1>>;
    Row r0(p, n), r1(s1 != nullptr ? s1 : p, n), r2(s2 != nullptr ? s2 : p, n);
    update(r0, r1, r2, Eigen::Map<const Eigen::Array<T, Eigen::Dynamic, 1>>(g, n));
    return;
  }
  using Group = Eigen::Array<T, kSize, 1>;
  const int64_t tail = n % kSize;
  Group kept[3];
  for (int64_t j = tail != 0 ? -1 : 0; j < n / kSize; ++j) {
    const int64_t at = j < 0 ? n - kSize : j * kSize;
    Group v[3];
    for (int r = 0; r < 3; ++r) {
      if (rows[r] != nullptr) v[r] = Eigen::Map<const Group>(rows[r] + at);
    }
    const Group gv = Eigen::Map<const Group>(g + at);
    update(v[0], v[1], v[2], gv);
    for (int r = 0; r < 3; ++r) {
      if (rows[r] == nullptr) continue;
      if (j < 0) {
        kept[r] = v[r];
      } else {
        Eigen::Map<Group>(rows[r] + at) = v[r];
      }
    }
  }
  for (int r = 0; r < 3 && tail != 0; ++r) {
    if (rows[r] != nullptr) {
      std::memcpy(rows[r] + n - tail, kept[r].data() + kSize - tail, sizeof(T) * tail);
    }
  }
}

// sgd (optimizer_rules::SgdUpdate) on n elements.
template <typename T>
TS_OPTIMIZER_RULE void SgdRow(T* p, const T* g, int64_t n, T lr, T coeff) {
  ForEachGroup<T>(n, p, nullptr, nullptr, g, [&](auto& P, auto&, auto&, const auto& G) {
    optimizer_rules::SgdUpdate(P, G, lr, coeff);
  });
}

// momentum (optimizer_rules::MomentumUpdate) on n elements; v is the velocity.
template <typename T>
TS_OPTIMIZER_RULE void MomentumRow(T* p, T* v, const T* g, int64_t n, T lr, T mu, T coeff,
                                   bool nesterov) {
  ForEachGroup<T>(n, p, v, nullptr, g, [&](auto& P, auto& V, auto&, const auto& G) {
    optimizer_rules::MomentumUpdate(P, V, G, lr, mu, coeff, nesterov);
  });
}

// adagrad (optimizer_rules::AdagradUpdate) on n elements; m is the squares' sum.
template <typename T>
TS_OPTIMIZER_RULE void AdagradRow(T* p, T* m, const T* g, int64_t n, T lr, T eps, T coeff) {
  ForEachGroup<T>(n, p, m, nullptr, g, [&](auto& P, auto& M, auto&, const auto& G) {
    optimizer_rules::AdagradUpdate(P, M, G, lr, eps, coeff);
  });
}

// adam (optimizer_rules::AdamUpdate, with the bias-corrected lr_t) on n elements.
template <typename T>
TS_OPTIMIZER_RULE void AdamRow(T* p, T* m1, T* m2, const T* g, int64_t n, T lr_t, T beta1, T beta2,
                               T eps, T coeff) {
  ForEachGroup<T>(n, p, m1, m2, g, [&](auto& P, auto& M1, auto& M2, const auto& G) {
    optimizer_rules::AdamUpdate(P, M1, M2, G, lr_t, beta1, beta2, eps, coeff);
  });
}

}  // namespace optimizer_rows
}  // namespace tessera

#endif  // TESSERA_COMMON_OPS_OPTIMIZER_ROWS_H_
