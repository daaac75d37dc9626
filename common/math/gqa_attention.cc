#include "common/math/gqa_attention.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <limits>

#include "common/math/det_math.h"

namespace pipetrain::math {
namespace {

float Scale(const GqaShape& shape) {
  return static_cast<float>(1.0 / std::sqrt(static_cast<double>(shape.head_dim)));
}

}  // namespace

void CausalSoftmaxRows(int64_t rows, int64_t len, int64_t first, float scale, float* a) {
  for (int64_t i = 0; i < rows; ++i) {
    float* ar = a + i * len;
    const int64_t last = first + i;
    float mx = -std::numeric_limits<float>::infinity();
    for (int64_t j = 0; j <= last; ++j) {
      ar[j] *= scale;
      mx = std::max(mx, ar[j]);
    }
    double sum = 0;
    for (int64_t j = 0; j <= last; ++j) {
      ar[j] = static_cast<float>(PortableExp(static_cast<double>(ar[j]) - mx));
      sum += ar[j];
    }
    for (int64_t j = 0; j <= last; ++j) ar[j] = static_cast<float>(ar[j] / sum);
    for (int64_t j = last + 1; j < len; ++j) ar[j] = 0.0f;
  }
}

void CausalSoftmaxBackwardRows(int64_t t, double scale, const float* a, float* d) {
  for (int64_t i = 0; i < t; ++i) {
    const float* ar = a + i * t;
    float* dr = d + i * t;
    double dot = 0;
    for (int64_t j = 0; j <= i; ++j) dot += static_cast<double>(ar[j]) * dr[j];
    for (int64_t j = 0; j <= i; ++j) dr[j] = static_cast<float>(scale * ar[j] * (dr[j] - dot));
    for (int64_t j = i + 1; j < t; ++j) dr[j] = 0.0f;
  }
}

int64_t GqaProbabilityFloats(const GqaShape& shape, int64_t rows) {
  return rows / shape.context * shape.heads * shape.context * shape.context;
}

void GqaAttentionForward(const GqaShape& shape, ConstMatrixMap q, ConstMatrixMap k,
                         ConstMatrixMap v, float* probs, MatrixMap out) {
  const int64_t t = shape.context;
  const int64_t hd = shape.head_dim;
  const int64_t group = shape.heads / shape.kv_heads;
  assert(q.cols() == shape.heads * hd && k.cols() == shape.kv_heads * hd && q.rows() % t == 0);
  const int64_t samples = q.rows() / t;
  const float scale = Scale(shape);
  for (int64_t s = 0; s < samples; ++s) {
    for (int64_t h = 0; h < shape.heads; ++h) {
      const int64_t j = h / group;
      float* a_data = probs + (s * shape.heads + h) * t * t;
      MatrixMap a(a_data, t, t);
      a.noalias() = q.block(s * t, h * hd, t, hd) * k.block(s * t, j * hd, t, hd).transpose();
      CausalSoftmaxRows(t, t, 0, scale, a_data);
      out.block(s * t, h * hd, t, hd).noalias() = a * v.block(s * t, j * hd, t, hd);
    }
  }
}

void GqaAttentionBackward(const GqaShape& shape, ConstMatrixMap q, ConstMatrixMap k,
                          ConstMatrixMap v, const float* probs, ConstMatrixMap dout, float* scratch,
                          MatrixMap dq, MatrixMap dk, MatrixMap dv) {
  const int64_t t = shape.context;
  const int64_t hd = shape.head_dim;
  const int64_t group = shape.heads / shape.kv_heads;
  const int64_t samples = q.rows() / t;
  const double scale = Scale(shape);
  MatrixMap ds(scratch, t, t);
  for (int64_t s = 0; s < samples; ++s) {
    for (int64_t h = 0; h < shape.heads; ++h) {
      const int64_t j = h / group;
      const bool first = h % group == 0;
      const auto q_h = q.block(s * t, h * hd, t, hd);
      const auto k_j = k.block(s * t, j * hd, t, hd);
      const auto v_j = v.block(s * t, j * hd, t, hd);
      const auto dout_h = dout.block(s * t, h * hd, t, hd);
      const float* a_data = probs + (s * shape.heads + h) * t * t;
      ConstMatrixMap a(a_data, t, t);
      auto dv_j = dv.block(s * t, j * hd, t, hd);
      auto dk_j = dk.block(s * t, j * hd, t, hd);
      ds.noalias() = dout_h * v_j.transpose();
      if (first) {
        dv_j.noalias() = a.transpose() * dout_h;
      } else {
        dv_j.noalias() += a.transpose() * dout_h;
      }
      CausalSoftmaxBackwardRows(t, scale, a_data, scratch);
      dq.block(s * t, h * hd, t, hd).noalias() = ds * k_j;
      if (first) {
        dk_j.noalias() = ds.transpose() * q_h;
      } else {
        dk_j.noalias() += ds.transpose() * q_h;
      }
    }
  }
}

}  // namespace pipetrain::math
