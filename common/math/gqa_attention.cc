#include "common/math/gqa_attention.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <limits>

#include "common/math/det_math.h"

namespace pipetrain::math {
namespace {

// Scores per chunk of CausalSoftmaxRows' exponentials (a buffer of doubles on the stack).
constexpr int64_t kSoftmaxChunk = 256;

float Scale(const GqaShape& shape) {
  return static_cast<float>(1.0 / std::sqrt(static_cast<double>(shape.head_dim)));
}

// Columns h*hd .. h*hd+hd-1 of rows row0 .. row0+rows-1 of m.
ConstStridedMap HeadOf(ConstMatrixMap m, int64_t row0, int64_t rows, int64_t h, int64_t hd) {
  return ConstStridedMap(m.data() + row0 * m.cols() + h * hd, rows, hd,
                         Eigen::OuterStride<>(m.cols()));
}
StridedMap HeadOf(MatrixMap m, int64_t row0, int64_t rows, int64_t h, int64_t hd) {
  return StridedMap(m.data() + row0 * m.cols() + h * hd, rows, hd, Eigen::OuterStride<>(m.cols()));
}

// One softmax row: ar[0..count) scaled and replaced by its probabilities (the sum in double in
// column order).
void SoftmaxRow(int64_t count, float scale, float* ar) {
  float mx = -std::numeric_limits<float>::infinity();
  for (int64_t j = 0; j < count; ++j) {
    ar[j] *= scale;
    mx = std::max(mx, ar[j]);
  }
  double e[kSoftmaxChunk];
  double sum = 0;
  for (int64_t start = 0; start < count; start += kSoftmaxChunk) {
    const int64_t len = std::min(kSoftmaxChunk, count - start);
    for (int64_t j = 0; j < len; ++j) e[j] = static_cast<double>(ar[start + j]) - mx;
    PortableExpArray(e, len, e);
    for (int64_t j = 0; j < len; ++j) {
      ar[start + j] = static_cast<float>(e[j]);
      sum += ar[start + j];
    }
  }
  for (int64_t j = 0; j < count; ++j) ar[j] = static_cast<float>(ar[j] / sum);
}

}  // namespace

void CausalSoftmaxRows(int64_t rows, int64_t len, int64_t first, float scale, float* a) {
  for (int64_t i = 0; i < rows; ++i) {
    float* ar = a + i * len;
    const int64_t count = first + i + 1;
    SoftmaxRow(count, scale, ar);
    std::fill(ar + count, ar + len, 0.0f);
  }
}

void CausalSoftmaxBackwardRows(int64_t rows, int64_t len, int64_t first, double scale,
                               const float* a, float* d) {
  for (int64_t i = 0; i < rows; ++i) {
    const float* ar = a + i * len;
    float* dr = d + i * len;
    const int64_t count = first + i + 1;
    double dot = 0;
    for (int64_t j = 0; j < count; ++j) dot += static_cast<double>(ar[j]) * dr[j];
    for (int64_t j = 0; j < count; ++j) dr[j] = static_cast<float>(scale * ar[j] * (dr[j] - dot));
    std::fill(dr + count, dr + len, 0.0f);
  }
}

void CausalHeadForward(ConstStridedMap q, ConstStridedMap k, ConstStridedMap v, int64_t first,
                       float scale, float* p, StridedMap out) {
  const int64_t n = q.rows();
  const int64_t len = first + n;
  assert(k.rows() >= len && v.rows() >= len && out.rows() == n);
  for (int64_t r0 = 0; r0 < n; r0 += kCausalBlock) {
    const int64_t rows = std::min(kCausalBlock, n - r0);
    const int64_t keys = first + r0 + rows;
    float* block = p + r0 * len;
    StridedMap s(block, rows, keys, Eigen::OuterStride<>(len));
    s.noalias() = q.middleRows(r0, rows) * k.topRows(keys).transpose();
    CausalSoftmaxRows(rows, len, first + r0, scale, block);
    out.middleRows(r0, rows).noalias() = s * v.topRows(keys);
  }
}

void CausalHeadBackward(ConstStridedMap q, ConstStridedMap k, ConstStridedMap v, const float* p,
                        ConstStridedMap dout, double scale, float* ds, bool accumulate,
                        StridedMap dq, StridedMap dk, StridedMap dv) {
  const int64_t t = q.rows();
  for (int64_t r0 = 0; r0 < t; r0 += kCausalBlock) {
    const int64_t rows = std::min(kCausalBlock, t - r0);
    const int64_t keys = r0 + rows;
    StridedMap d(ds + r0 * t, rows, keys, Eigen::OuterStride<>(t));
    d.noalias() = dout.middleRows(r0, rows) * v.topRows(keys).transpose();
    CausalSoftmaxBackwardRows(rows, t, r0, scale, p + r0 * t, ds + r0 * t);
    dq.middleRows(r0, rows).noalias() = d * k.topRows(keys);
  }
  const ConstStridedMap pm(p, t, t, Eigen::OuterStride<>(t));
  const ConstStridedMap dsm(ds, t, t, Eigen::OuterStride<>(t));
  for (int64_t c0 = 0; c0 < t; c0 += kCausalBlock) {
    const int64_t cols = std::min(kCausalBlock, t - c0);
    const int64_t depth = t - c0;
    const auto p_c = pm.block(c0, c0, depth, cols);
    const auto ds_c = dsm.block(c0, c0, depth, cols);
    if (accumulate) {
      dv.middleRows(c0, cols).noalias() += p_c.transpose() * dout.bottomRows(depth);
      dk.middleRows(c0, cols).noalias() += ds_c.transpose() * q.bottomRows(depth);
    } else {
      dv.middleRows(c0, cols).noalias() = p_c.transpose() * dout.bottomRows(depth);
      dk.middleRows(c0, cols).noalias() = ds_c.transpose() * q.bottomRows(depth);
    }
  }
}

double CausalScoreEntries(int64_t context) {
  double entries = 0;
  for (int64_t r0 = 0; r0 < context; r0 += kCausalBlock) {
    const int64_t rows = std::min(kCausalBlock, context - r0);
    entries += static_cast<double>(rows) * static_cast<double>(r0 + rows);
  }
  return entries;
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
      CausalHeadForward(HeadOf(q, s * t, t, h, hd), HeadOf(k, s * t, t, j, hd),
                        HeadOf(v, s * t, t, j, hd), 0, scale, probs + (s * shape.heads + h) * t * t,
                        HeadOf(out, s * t, t, h, hd));
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
  for (int64_t s = 0; s < samples; ++s) {
    for (int64_t h = 0; h < shape.heads; ++h) {
      const int64_t j = h / group;
      CausalHeadBackward(HeadOf(q, s * t, t, h, hd), HeadOf(k, s * t, t, j, hd),
                         HeadOf(v, s * t, t, j, hd), probs + (s * shape.heads + h) * t * t,
                         HeadOf(dout, s * t, t, h, hd), scale, scratch,
                         /*accumulate=*/h % group != 0, HeadOf(dq, s * t, t, h, hd),
                         HeadOf(dk, s * t, t, j, hd), HeadOf(dv, s * t, t, j, hd));
    }
  }
}

}  // namespace pipetrain::math
