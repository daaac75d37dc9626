// Deterministic parameter initialisation.
//
// The initial value of element i of parameter p of global layer l depends only on
// (seed, l, p, i): never on other layers, on the process, or on the order of calls. Each
// (seed, l, p) gets its own std::mt19937_64 stream, seeded with ParamSeed(seed, l, p); element i
// takes the i-th uniform draw (uniform fills) or half of the (i/2)-th Box-Muller pair (normal
// fills). mt19937_64's output sequence is fixed by the C++ standard and the transforms below use
// only IEEE basic operations and det_math.h, so the bits are the same on every machine and
// standard library (std::*_distribution are implementation-defined and are not used).
#ifndef PIPETRAIN_COMMON_MATH_INIT_H_
#define PIPETRAIN_COMMON_MATH_INIT_H_

#include <cstdint>
#include <random>
#include <vector>

#include "common/math/layer.h"
#include "common/math/tensor.h"

namespace pipetrain::math {

// SplitMix64 finaliser of x + 0x9E3779B97F4A7C15 (Steele, Lea, Flood 2014): a bijection on 64 bits.
uint64_t SplitMix64(uint64_t x);

// The mt19937_64 seed of parameter `param_index` of global layer `layer_index`:
//   SplitMix64(SplitMix64(SplitMix64(seed) ^ uint64(layer_index)) ^ uint64(param_index)).
uint64_t ParamSeed(uint64_t seed, int64_t layer_index, int64_t param_index);

// A reproducible stream of uniform and normal variates for one parameter tensor.
// Not thread-safe (one object per thread); cheap to construct (~5 KB of state).
class ParamRng {
 public:
  ParamRng(uint64_t seed, int64_t layer_index, int64_t param_index)
      : engine_(ParamSeed(seed, layer_index, param_index)) {}

  // Uniform on [0, 1): the top 53 bits of the next engine output times 2^-53.
  double NextUniform();
  // Uniform on (0, 1]: (top 53 bits + 1) times 2^-53. Never 0, so its log is finite.
  double NextUniformPositive();
  // Two independent standard normal variates from one Box-Muller transform of
  // (u1 = NextUniformPositive(), u2 = NextUniform()):
  //   r = sqrt(-2 ln u1), *z0 = r cos(2 pi u2), *z1 = r sin(2 pi u2).
  void NextNormalPair(double* z0, double* z1);

 private:
  std::mt19937_64 engine_;
};

// Resizes `params` to `specs` (one Tensor per spec with its shape), every element 0.
void AllocateParams(const std::vector<ParamSpec>& specs, std::vector<Tensor>* params);

// Sets every element of `t` (already sized) to `value`. Consumes no random numbers.
void FillConstant(float value, Tensor* t);

// t[i] = float(lo + (hi - lo) * u_i), u_i the i-th NextUniform() of stream (seed, layer, param).
void FillUniform(uint64_t seed, int64_t layer_index, int64_t param_index, double lo, double hi,
                 Tensor* t);

// t[2j], t[2j+1] = float(mean + stddev * z0_j), float(mean + stddev * z1_j), (z0_j, z1_j) the j-th
// NextNormalPair() of stream (seed, layer, param); an odd last element drops z1.
void FillNormal(uint64_t seed, int64_t layer_index, int64_t param_index, double mean, double stddev,
                Tensor* t);

}  // namespace pipetrain::math

#endif  // PIPETRAIN_COMMON_MATH_INIT_H_
