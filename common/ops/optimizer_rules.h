// The per-element update rules of the sgd, momentum, adagrad and adam optimizers: the one
// definition that the dense CPU kernels (common/ops/optimizer_ops.cc), the pserver's SparseTable
// (pserver/sparse_table.cc) and the CUDA kernel (common/device/cuda/gpu_kernels.cu) all call.
//
// Each rule updates a parameter element `p` and its optimizer state in place from its gradient
// element `g`, with the L2 term first (g' = g + coeff * p, from p before the update):
//   sgd       p -= lr * g'
//   momentum  v = mu * v + g';  p -= lr * v,  or with nesterov  p -= lr * (g' + mu * v)
//   adagrad   m += g'^2;  p -= lr * g' / (sqrt(m) + eps)
//   adam      m1 = b1 * m1 + (1 - b1) * g';  m2 = b2 * m2 + (1 - b2) * g'^2;
//             p -= lr_t * m1 / (sqrt(m2) + eps),  lr_t = AdamBiasCorrectedLr(lr, b1^t, b2^t)
// written as one sequence of operations in the element type (float or double, no wider
// intermediates), left to right ("lr * g' / d" is (lr * g') / d), g'^2 = g' * g'.
//
// Scalars and Eigen arrays. P and G may be float / double (host and device), or, on the host,
// Eigen array expressions (an Eigen::Map of an Array for p and the state, any array expression
// for g): the CPU code updates whole rows at once (through optimizer_rows.h, which applies the
// rules to fixed-size groups of a row so that short rows stay in packets). Instantiate the
// array forms only with -DEIGEN_FAST_MATH=0, as common/ops:optimizer_ops and pserver:sparse_table
// do (Eigen's default packet sqrt is an approximation; a second instantiation built without the
// flag would also break the one-definition rule).
//
// Bits. Without multiply-add fusion the array and scalar forms give the same bits at every
// alignment. The repository builds with -mfma, and GCC then fuses multiply-adds by default
// (-ffp-contract=fast, also in -std=c++17), choosing per form and context: the dense ops and
// SparseTable call the same array instantiations and agree bit for bit
// (pserver:sparse_table_test), while the scalar form may differ from the array form in the last
// bits (adam does). nvcc fuses too (--fmad=true) and the GPU sums a sparse gradient's duplicate
// rows with atomics: its results are compared with the CPU kernels' within a tolerance
// (common/device/cuda:gpu_ops_test). optimizer_rules_test pins the forms and the dense ops.
//
// Adam's beta powers b1^t, b2^t are not part of these rules: the dense ops (CPU and GPU) read
// them from their Beta1Pow / Beta2Pow inputs (advanced once per run, pow * beta in double, then
// rounded to the input's dtype), SparseTable computes std::pow(beta, step) in double. The two
// agree exactly only where the powers are exact (dyadic betas); with the default 0.9 / 0.999
// they differ well above float rounding (see SparseTable). All pure, header-only, thread-safe.
#ifndef TESSERA_COMMON_OPS_OPTIMIZER_RULES_H_
#define TESSERA_COMMON_OPS_OPTIMIZER_RULES_H_

#include <math.h>

#ifndef TS_HOST_DEVICE
#ifdef __CUDACC__
#define TS_HOST_DEVICE __host__ __device__
#else
#define TS_HOST_DEVICE
#endif
#endif

// The rules are inlined into their callers, as the expressions they replace were: GCC would
// otherwise call the array forms out of line, which made SparseTable's adagrad and adam updates
// of cached rows about 1.7x slower. (nvcc inlines device functions anyway.)
#if defined(__GNUC__) && !defined(__CUDACC__)
#define TS_OPTIMIZER_RULE inline __attribute__((always_inline))
#else
#define TS_OPTIMIZER_RULE inline
#endif

namespace tessera {
namespace optimizer_rules {

// Square and square root of a scalar (IEEE, correctly rounded), or of an Eigen array (host only).
TS_HOST_DEVICE inline float Square(float x) { return x * x; }
TS_HOST_DEVICE inline double Square(double x) { return x * x; }
template <typename A>
inline auto Square(const A& a) -> decltype(a.square()) {
  return a.square();
}
TS_HOST_DEVICE inline float Sqrt(float x) { return sqrtf(x); }
TS_HOST_DEVICE inline double Sqrt(double x) { return sqrt(x); }
template <typename A>
inline auto Sqrt(const A& a) -> decltype(a.sqrt()) {
  return a.sqrt();
}

// sgd: p -= lr * (g + coeff * p).
template <typename P, typename G, typename S>
TS_HOST_DEVICE TS_OPTIMIZER_RULE void SgdUpdate(P& p, const G& g, S lr, S coeff) {
  p -= lr * (g + coeff * p);
}

// momentum: v = mu * v + g'; p -= lr * v, or with nesterov p -= lr * (g' + mu * v).
template <typename P, typename G, typename S>
TS_HOST_DEVICE TS_OPTIMIZER_RULE void MomentumUpdate(P& p, P& v, const G& g, S lr, S mu, S coeff,
                                                     bool nesterov) {
  const auto gr = g + coeff * p;  // an Eigen expression (read lazily, before p changes) or a value
  v = mu * v + gr;
  if (nesterov) {
    p -= lr * (gr + mu * v);
  } else {
    p -= lr * v;
  }
}

// adagrad: m += g'^2; p -= lr * g' / (sqrt(m) + eps).
template <typename P, typename G, typename S>
TS_HOST_DEVICE TS_OPTIMIZER_RULE void AdagradUpdate(P& p, P& m, const G& g, S lr, S eps, S coeff) {
  const auto gr = g + coeff * p;
  m += Square(gr);
  p -= lr * gr / (Sqrt(m) + eps);
}

// adam, with the bias-corrected learning rate lr_t (AdamBiasCorrectedLr):
// m1 = b1 m1 + (1 - b1) g'; m2 = b2 m2 + (1 - b2) g'^2; p -= lr_t m1 / (sqrt(m2) + eps).
template <typename P, typename G, typename S>
TS_HOST_DEVICE TS_OPTIMIZER_RULE void AdamUpdate(P& p, P& m1, P& m2, const G& g, S lr_t, S beta1,
                                                 S beta2, S eps, S coeff) {
  const auto gr = g + coeff * p;
  m1 = beta1 * m1 + (S(1) - beta1) * gr;
  m2 = beta2 * m2 + (S(1) - beta2) * Square(gr);
  p -= lr_t * m1 / (Sqrt(m2) + eps);
}

// Adam's learning rate at a step whose beta powers are beta1_pow = b1^t, beta2_pow = b2^t
// (t >= 1): lr * sqrt(1 - b2^t) / (1 - b1^t), in double; callers round it to the element type.
TS_HOST_DEVICE inline double AdamBiasCorrectedLr(double lr, double beta1_pow, double beta2_pow) {
  return lr * sqrt(1.0 - beta2_pow) / (1.0 - beta1_pow);
}

}  // namespace optimizer_rules
}  // namespace tessera

#endif  // TESSERA_COMMON_OPS_OPTIMIZER_RULES_H_
