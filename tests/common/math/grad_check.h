// Test helpers for pipetrain_math: random inputs, a central-difference gradient checker, a driver
// that checks every input and parameter gradient of a Layer, and the full and incremental (KV
// cache) forward runs the incremental tests compare.
#ifndef PIPETRAIN_TESTS_COMMON_MATH_GRAD_CHECK_H_
#define PIPETRAIN_TESTS_COMMON_MATH_GRAD_CHECK_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "common/math/layer.h"
#include "common/math/tensor.h"

namespace pipetrain::math::testing {

// [rows, cols] with entries uniform in [lo, hi), reproducible from `seed`.
Matrix RandomMatrix(int64_t rows, int64_t cols, uint64_t seed, float lo = -1.0f, float hi = 1.0f);
// Random values in [lo, hi) with random sign and magnitude at least `min_abs` (away from kinks).
Matrix RandomMatrixAwayFromZero(int64_t rows, int64_t cols, uint64_t seed, float min_abs,
                                float max_abs);

struct GradCheckOptions {
  // Perturbation h = step * max(1, |v|); the derivative is the Richardson extrapolation
  // (4 D(h/2) - D(h)) / 3 of central differences D, each divided by the float difference actually
  // applied.
  double step = 1e-2;
  // Element error = |numeric - analytic| / max(|numeric|, |analytic|, floor), where
  // floor = floor_fraction * max_k |analytic_k| (so tiny entries are judged relative to the
  // gradient's scale) and at least 1e-7. The check passes iff every element error <= rel_tol.
  double rel_tol = 1e-2;
  double floor_fraction = 1e-2;
};

struct GradCheckResult {
  bool ok = true;
  double max_error = 0;  // largest element error (see GradCheckOptions)
  int64_t worst = -1;    // its index
  double numeric = 0;    // values at `worst`
  double analytic = 0;
  std::string ToString() const;
};

// Central differences (Richardson-extrapolated) of `objective` with respect to each of the n floats
// at `values` (each is perturbed in place and restored bit-exactly), compared with `analytic`.
GradCheckResult CheckGradient(const std::function<double()>& objective, float* values, int64_t n,
                              const float* analytic, const GradCheckOptions& options = {});

// Sum_{r,j} a_rj b_rj in double.
double Dot(ConstMatrixMap a, ConstMatrixMap b);

// For L = sum(Forward(params, x) .* upstream): checks dL/dx (unless check_input is false) and
// dL/dparams[i] for every parameter against central differences, with GoogleTest expectations
// naming the tensor. Analytic gradients come from BackwardInput(dy = upstream) and
// BackwardWeight into zeroed grads.
void ExpectLayerGradientsMatch(const Layer& layer, std::vector<Tensor> params, Matrix x,
                               const Matrix& upstream, bool check_input,
                               const GradCheckOptions& options = {});

// Everything one forward + backward of a layer produces.
struct LayerRun {
  Matrix y;
  Matrix dx;
  std::vector<Tensor> grads;
  Stash stash;
};

// Runs Forward, BackwardInput (dx requested iff want_dx) and BackwardWeight into zeroed grads,
// on `stash` as Forward gets it (default: empty).
LayerRun RunLayer(const Layer& layer, const std::vector<Tensor>& params, const Matrix& x,
                  const Matrix& dy, bool want_dx = true, Stash stash = {});

// Every stash element the layer reads it has written first (a Stash leaves the elements a resize
// adds uninitialised, layer.h): a run on a stash of the right size filled with NaN gives the bits
// of a run on an empty one (y, dx, every gradient).
void ExpectNanStashGivesTheBitsOfAnEmptyOne(const Layer& layer, const std::vector<Tensor>& params,
                                            const Matrix& x, const Matrix& dy);

// Runs the layer on copies of (params, x, dy) placed one float past an aligned address and checks
// that y, dx and every gradient are bitwise equal to RunLayer's on aligned buffers, and that a
// second aligned run repeats the bits. Proves results do not depend on buffer addresses.
void ExpectBitwiseStableUnderRealignment(const Layer& layer, const std::vector<Tensor>& params,
                                         const Matrix& x, const Matrix& dy);

// Runs the layer twice on (params, x, dy) with Eigen's products on 1 thread, then on 2, and
// expects each pair's y, dx and gradients to have the same bits (restores Eigen's thread count).
void ExpectBitwiseRepeatableForEachThreadCount(const Layer& layer,
                                               const std::vector<Tensor>& params, const Matrix& x,
                                               const Matrix& dy);

// A read-only view of a mutable map (Eigen does not convert Map<T> to Map<const T>).
inline ConstMatrixMap Const(const MatrixMap& m) {
  return ConstMatrixMap(m.data(), m.rows(), m.cols());
}

// Forward of `layer` on `x` (with a fresh stash): its output.
Matrix FullForward(const Layer& layer, const std::vector<Tensor>& params, const Matrix& x);

// Runs x's rows through layer.ForwardIncremental from position 0 in calls of `chunks[i]` rows each
// (in order, summing to x.rows()) on `state`, expecting the state to count the positions run;
// returns the outputs of all rows.
Matrix IncrementalForward(const Layer& layer, const std::vector<Tensor>& params, const Matrix& x,
                          const std::vector<int64_t>& chunks, IncrementalState* state);

// The largest |a - b| / (|b| + 1) over two equally shaped matrices.
double MaxRelativeError(const Matrix& a, const Matrix& b);

// max_i |v_i| (0 for an empty vector).
float MaxAbs(const std::vector<float>& v);

// True iff a and b have the same shape and identical bits.
bool BitwiseEqual(ConstMatrixMap a, ConstMatrixMap b);
bool BitwiseEqual(const std::vector<float>& a, const std::vector<float>& b);

}  // namespace pipetrain::math::testing

#endif  // PIPETRAIN_TESTS_COMMON_MATH_GRAD_CHECK_H_
