#include "common/math/rope.h"

#include <cassert>
#include <cmath>

#include "common/math/det_math.h"

namespace pipetrain::math {
namespace {

constexpr double kTwoPi = 6.28318530717958647692;

}  // namespace

RopeTable::RopeTable(int64_t head_dim, int64_t context, double theta)
    : head_dim_(head_dim), half_(head_dim / 2), context_(context) {
  assert(head_dim_ > 0 && head_dim_ % 2 == 0 && context_ > 0 && theta > 1);
  cos_.resize(static_cast<size_t>(context_ * half_));
  sin_.resize(cos_.size());
  const double log_theta = PortableLog(theta);
  for (int64_t i = 0; i < half_; ++i) {
    const double exponent = -2.0 * static_cast<double>(i) / static_cast<double>(head_dim_);
    const double inv_freq = PortableExp(exponent * log_theta);
    for (int64_t p = 0; p < context_; ++p) {
      // angle / 2pi reduced to [0, 1): PortableSinCos2Pi's domain.
      const double turns = static_cast<double>(p) * inv_freq / kTwoPi;
      double s = 0;
      double c = 1;
      PortableSinCos2Pi(turns - std::floor(turns), &s, &c);
      cos_[static_cast<size_t>(p * half_ + i)] = static_cast<float>(c);
      sin_[static_cast<size_t>(p * half_ + i)] = static_cast<float>(s);
    }
  }
}

void RopeTable::Rotate(MatrixMap x, float sign, int64_t first) const {
  assert(x.cols() % head_dim_ == 0);
  const int64_t heads = x.cols() / head_dim_;
  for (int64_t r = 0; r < x.rows(); ++r) {
    const int64_t p = (first + r) % context_;
    const float* cr = cos_.data() + p * half_;
    const float* sr = sin_.data() + p * half_;
    for (int64_t h = 0; h < heads; ++h) {
      float* a = x.data() + r * x.cols() + h * head_dim_;
      float* b = a + half_;
      for (int64_t i = 0; i < half_; ++i) {
        const float s = sign * sr[i];  // exact: sign is +-1.
        const float ai = a[i];
        const float bi = b[i];
        a[i] = ai * cr[i] - bi * s;
        b[i] = bi * cr[i] + ai * s;
      }
    }
  }
}

void RopeTable::Apply(MatrixMap x) const { Rotate(x, 1.0f); }

void RopeTable::ApplyTranspose(MatrixMap x) const { Rotate(x, -1.0f); }

void RopeTable::ApplyFrom(MatrixMap x, int64_t first) const {
  assert(first >= 0 && first + x.rows() <= context_);
  Rotate(x, 1.0f, first);
}

}  // namespace pipetrain::math
