#include "common/math/init.h"

#include <cmath>
#include <cstddef>

#include "common/math/det_math.h"

namespace pipetrain::math {
namespace {

constexpr double kTwoPow53Inv = 1.0 / 9007199254740992.0;  // 2^-53

}  // namespace

uint64_t SplitMix64(uint64_t x) {
  uint64_t z = x + 0x9E3779B97F4A7C15ULL;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

uint64_t ParamSeed(uint64_t seed, int64_t layer_index, int64_t param_index) {
  return SplitMix64(SplitMix64(SplitMix64(seed) ^ static_cast<uint64_t>(layer_index)) ^
                    static_cast<uint64_t>(param_index));
}

double ParamRng::NextUniform() { return static_cast<double>(engine_() >> 11) * kTwoPow53Inv; }

double ParamRng::NextUniformPositive() {
  return static_cast<double>((engine_() >> 11) + 1) * kTwoPow53Inv;
}

void ParamRng::NextNormalPair(double* z0, double* z1) {
  const double u1 = NextUniformPositive();
  const double u2 = NextUniform();
  const double r = std::sqrt(-2.0 * PortableLog(u1));  // sqrt is correctly rounded (IEEE).
  double s = 0;
  double c = 0;
  PortableSinCos2Pi(u2, &s, &c);
  *z0 = r * c;
  *z1 = r * s;
}

void AllocateParams(const std::vector<ParamSpec>& specs, std::vector<Tensor>* params) {
  params->resize(specs.size());
  for (size_t i = 0; i < specs.size(); ++i) {
    Tensor& t = (*params)[i];
    t.shape = specs[i].shape;
    t.data.assign(static_cast<size_t>(NumElements(t.shape)), 0.0f);
  }
}

void FillConstant(float value, Tensor* t) {
  for (float& v : t->data) v = value;
}

void FillUniform(uint64_t seed, int64_t layer_index, int64_t param_index, double lo, double hi,
                 Tensor* t) {
  ParamRng rng(seed, layer_index, param_index);
  const double width = hi - lo;
  for (float& v : t->data) v = static_cast<float>(lo + width * rng.NextUniform());
}

void FillNormal(uint64_t seed, int64_t layer_index, int64_t param_index, double mean, double stddev,
                Tensor* t) {
  ParamRng rng(seed, layer_index, param_index);
  const size_t n = t->data.size();
  for (size_t i = 0; i < n; i += 2) {
    double z0 = 0;
    double z1 = 0;
    rng.NextNormalPair(&z0, &z1);
    t->data[i] = static_cast<float>(mean + stddev * z0);
    if (i + 1 < n) t->data[i + 1] = static_cast<float>(mean + stddev * z1);
  }
}

}  // namespace pipetrain::math
