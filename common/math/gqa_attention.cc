#include "common/math/gqa_attention.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#if defined(__AVX2__) || defined(__AVX512F__)
#include <immintrin.h>
#endif

#include "common/math/det_math.h"

namespace pipetrain::math {
namespace {

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

// Partial sums of a softmax row: kRowSumLanes of them, so that the additions run in vectors.
constexpr int64_t kRowSumLanes = 8;

// Σ_j a_j (b == nullptr) or Σ_j a_j b_j over j < n in double (each product exact): partial sum l
// adds the terms j ≡ l (mod 8) in increasing j, then ((s0 + s1) + (s2 + s3)) + ((s4 + s5) +
// (s6 + s7)). The order is the code's, so the bits do not depend on the vector width.
double RowSum(const float* a, const float* b, int64_t n) {
  double s[kRowSumLanes] = {};
  int64_t j = 0;
  if (b == nullptr) {
    for (; j + kRowSumLanes <= n; j += kRowSumLanes) {
      for (int64_t l = 0; l < kRowSumLanes; ++l) s[l] += a[j + l];
    }
    for (int64_t l = 0; j + l < n; ++l) s[l] += a[j + l];
  } else {
    for (; j + kRowSumLanes <= n; j += kRowSumLanes) {
      for (int64_t l = 0; l < kRowSumLanes; ++l) {
        s[l] += static_cast<double>(a[j + l]) * b[j + l];
      }
    }
    for (int64_t l = 0; j + l < n; ++l) s[l] += static_cast<double>(a[j + l]) * b[j + l];
  }
  return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

// One softmax row: ar[0..count) scaled and replaced by its probabilities: the shifted scores in
// float, their exponentials through PortableExpFloatArray, the sum in double (RowSum).
void SoftmaxRow(int64_t count, float scale, float* ar) {
  float mx = -std::numeric_limits<float>::infinity();
  for (int64_t j = 0; j < count; ++j) {
    ar[j] *= scale;
    mx = std::max(mx, ar[j]);
  }
  for (int64_t j = 0; j < count; ++j) ar[j] -= mx;
  PortableExpFloatArray(ar, count, ar);
  const double sum = RowSum(ar, nullptr, count);
  for (int64_t j = 0; j < count; ++j) ar[j] = static_cast<float>(ar[j] / sum);
}

// The attention products' vectors (docs/numerics.md, "Causal attention"): one output column per
// lane, each lane's sum in increasing depth, fused multiply-adds at x86-64-v3 and -v4 (one rounding
// per term), a multiply and an add elsewhere. A lane's bits do not depend on the vector width.
#if defined(__AVX512F__)
constexpr int64_t kAttnLanes = 16;
using AttnVec = __m512;
inline AttnVec AttnZero() { return _mm512_setzero_ps(); }
inline AttnVec AttnSplat(float x) { return _mm512_set1_ps(x); }
inline AttnVec AttnLoad(const float* p) { return _mm512_loadu_ps(p); }
inline void AttnStore(float* p, AttnVec v) { _mm512_storeu_ps(p, v); }
inline AttnVec AttnFma(AttnVec a, AttnVec b, AttnVec c) { return _mm512_fmadd_ps(a, b, c); }
#elif defined(__AVX2__) && defined(__FMA__)
constexpr int64_t kAttnLanes = 8;
using AttnVec = __m256;
inline AttnVec AttnZero() { return _mm256_setzero_ps(); }
inline AttnVec AttnSplat(float x) { return _mm256_set1_ps(x); }
inline AttnVec AttnLoad(const float* p) { return _mm256_loadu_ps(p); }
inline void AttnStore(float* p, AttnVec v) { _mm256_storeu_ps(p, v); }
inline AttnVec AttnFma(AttnVec a, AttnVec b, AttnVec c) { return _mm256_fmadd_ps(a, b, c); }
#else
constexpr int64_t kAttnLanes = 4;
using AttnVec = float __attribute__((vector_size(kAttnLanes * sizeof(float))));
inline AttnVec AttnZero() { return AttnVec{}; }
inline AttnVec AttnSplat(float x) { return AttnVec{} + x; }
inline AttnVec AttnLoad(const float* p) {
  AttnVec v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
inline void AttnStore(float* p, AttnVec v) { std::memcpy(p, &v, sizeof v); }
// Two roundings: the library is compiled with -ffp-contract=off.
inline AttnVec AttnFma(AttnVec a, AttnVec b, AttnVec c) { return a * b + c; }
#endif

// Rows of C a register tile holds: 8 x 2 vectors of accumulators fit AVX-512's 32 registers, 4 x 2
// the 16 of AVX2 and SSE. The bits do not depend on it.
#if defined(__AVX512F__)
constexpr int kRegisterRows = 8;
#else
constexpr int kRegisterRows = 4;
#endif
static_assert(kCausalTileRows % kRegisterRows == 0);

int64_t RoundUpLanes(int64_t n) { return (n + kAttnLanes - 1) / kAttnLanes * kAttnLanes; }

// Floats of one packed operand of `rows` rows of width hd, either layout (PackTransposed,
// PackRows).
int64_t PackedFloats(int64_t rows, int64_t hd) {
  return std::max(hd * RoundUpLanes(rows), rows * RoundUpLanes(hd));
}

// A buffer of at least n floats owned by the calling thread, kept across calls (grown, never
// shrunk); valid until the thread's next call.
float* AttentionScratch(int64_t n) {
  thread_local std::vector<float> buffer;
  if (buffer.size() < static_cast<size_t>(n)) buffer.resize(static_cast<size_t>(n));
  return buffer.data();
}

// out [hd, RoundUpLanes(rows)] = the first `rows` rows of m transposed, zero after column rows.
void PackTransposed(ConstStridedMap m, int64_t rows, float* out) {
  const int64_t ld = RoundUpLanes(rows);
  for (int64_t c = 0; c < m.cols(); ++c) {
    float* o = out + c * ld;
    for (int64_t j = 0; j < rows; ++j) o[j] = m(j, c);
    std::fill(o + rows, o + ld, 0.0f);
  }
}

// out [rows, RoundUpLanes(hd)] = the first `rows` rows of m, zero after column hd.
void PackRows(ConstStridedMap m, int64_t rows, float* out) {
  const int64_t hd = m.cols();
  const int64_t ld = RoundUpLanes(hd);
  for (int64_t j = 0; j < rows; ++j) {
    std::memcpy(out + j * ld, m.data() + j * m.outerStride(), static_cast<size_t>(hd) * 4);
    std::fill(out + j * ld + hd, out + (j + 1) * ld, 0.0f);
  }
}

// A matrix the tile kernel reads rows of: row k at data + k * ld, readable up to RoundUpLanes of
// its width.
struct RowsOperand {
  const float* data;
  int64_t ld;
};

// The first `rows` rows of m as a RowsOperand, packed into `buffer` (PackedFloats(rows, m.cols())
// floats) with PackRows: contiguous rows, where m's rows are the strided columns of one head (read
// in place they were slower: rows a multiple of 4 KiB apart share cache sets).
RowsOperand RowsOf(ConstStridedMap m, int64_t rows, float* buffer) {
  PackRows(m, rows, buffer);
  return {buffer, RoundUpLanes(m.cols())};
}

// The left operand of one tile of rows of C = A B: A(r, k) = a[r * ra + k * ka]; row r sums over
// k in [lo[r], hi[r]).
struct TileLeft {
  const float* a;
  int64_t ra, ka;
  int64_t lo[kRegisterRows], hi[kRegisterRows];
};

// acc[r][c] = sum over k in [lo[r], hi[r]), increasing, of A(r, k) * b[k * ldb + c * lanes ..]:
// first the k some rows skip (per row), then the k every row takes, then again per row.
template <int R, int NV>
inline void TileSums(const TileLeft& t, const float* b, int64_t ldb, AttnVec (&acc)[R][NV]) {
  int64_t lo_min = t.lo[0], lo_max = t.lo[0], hi_min = t.hi[0], hi_max = t.hi[0];
  for (int r = 0; r < R; ++r) {
    for (int c = 0; c < NV; ++c) acc[r][c] = AttnZero();
    lo_min = std::min(lo_min, t.lo[r]);
    lo_max = std::max(lo_max, t.lo[r]);
    hi_min = std::min(hi_min, t.hi[r]);
    hi_max = std::max(hi_max, t.hi[r]);
  }
  auto some_rows = [&](int64_t k) {
    for (int r = 0; r < R; ++r) {
      if (k < t.lo[r] || k >= t.hi[r]) continue;
      const AttnVec a = AttnSplat(t.a[r * t.ra + k * t.ka]);
      for (int c = 0; c < NV; ++c) {
        acc[r][c] = AttnFma(a, AttnLoad(b + k * ldb + c * kAttnLanes), acc[r][c]);
      }
    }
  };
  const int64_t all_hi = std::max(hi_min, lo_max);
  for (int64_t k = lo_min; k < lo_max; ++k) some_rows(k);
  for (int64_t k = lo_max; k < all_hi; ++k) {
    AttnVec bv[NV];
    for (int c = 0; c < NV; ++c) bv[c] = AttnLoad(b + k * ldb + c * kAttnLanes);
    for (int r = 0; r < R; ++r) {
      const AttnVec a = AttnSplat(t.a[r * t.ra + k * t.ka]);
      for (int c = 0; c < NV; ++c) acc[r][c] = AttnFma(a, bv[c], acc[r][c]);
    }
  }
  for (int64_t k = all_hi; k < hi_max; ++k) some_rows(k);
}

// Rows r < R of c (row stride ldc), columns [c0, c0 + NV lanes) below `cols`: = acc, or += acc
// when `accumulate`.
template <int R, int NV>
inline void TileStore(const AttnVec (&acc)[R][NV], int64_t c0, int64_t cols, bool accumulate,
                      float* c, int64_t ldc) {
  for (int r = 0; r < R; ++r) {
    for (int v = 0; v < NV; ++v) {
      const int64_t col = c0 + v * kAttnLanes;
      const int64_t n = std::min(kAttnLanes, cols - col);
      if (n <= 0) break;
      float* dst = c + r * ldc + col;
      if (n == kAttnLanes) {
        AttnStore(dst, accumulate ? AttnLoad(dst) + acc[r][v] : acc[r][v]);
        continue;
      }
      float lanes[kAttnLanes];
      AttnStore(lanes, acc[r][v]);
      for (int64_t i = 0; i < n; ++i) dst[i] = accumulate ? dst[i] + lanes[i] : lanes[i];
    }
  }
}

// One tile's rows of C, columns [0, cols), two vectors at a time. b has readable columns up to
// RoundUpLanes(cols).
template <int R>
void TileColumns(const TileLeft& t, const float* b, int64_t ldb, int64_t cols, bool accumulate,
                 float* c, int64_t ldc) {
  int64_t c0 = 0;
  for (; c0 + kAttnLanes < cols; c0 += 2 * kAttnLanes) {
    AttnVec acc[R][2];
    TileSums<R, 2>(t, b + c0, ldb, acc);
    TileStore<R, 2>(acc, c0, cols, accumulate, c, ldc);
  }
  if (c0 < cols) {
    AttnVec acc[R][1];
    TileSums<R, 1>(t, b + c0, ldb, acc);
    TileStore<R, 1>(acc, c0, cols, accumulate, c, ldc);
  }
}

// C (= or += when `accumulate`) A B over rows [0, m) of C (row stride ldc) in tiles of
// kCausalTileRows rows: A(i, k) = a[i * ra + k * ka]; range(i, &lo, &hi) gives row i's k range;
// cols(i0, rows) the columns the tile of rows i0 .. i0+rows-1 computes. b [k, ldb] is readable up
// to RoundUpLanes of every tile's columns.
template <typename Cols, typename Range>
void TileProduct(int64_t m, const float* a, int64_t ra, int64_t ka, const float* b, int64_t ldb,
                 Cols cols, Range range, bool accumulate, float* c, int64_t ldc) {
  for (int64_t i0 = 0; i0 < m; i0 += kCausalTileRows) {
    const int64_t n = cols(i0, std::min(kCausalTileRows, m - i0));
    for (int64_t g = i0; g < std::min(i0 + kCausalTileRows, m); g += kRegisterRows) {
      const int64_t rows = std::min<int64_t>(kRegisterRows, m - g);
      float* ct = c + g * ldc;
      TileLeft t{a + g * ra, ra, ka, {}, {}};
      for (int64_t r = 0; r < rows; ++r) range(g + r, &t.lo[r], &t.hi[r]);
      if (rows == kRegisterRows) {
        TileColumns<kRegisterRows>(t, b, ldb, n, accumulate, ct, ldc);
        continue;
      }
      for (int64_t r = 0; r < rows; ++r) {
        const TileLeft one{t.a + r * ra, ra, ka, {t.lo[r]}, {t.hi[r]}};
        TileColumns<1>(one, b, ldb, n, accumulate, ct + r * ldc, ldc);
      }
    }
  }
}

// CausalHeadForward on packed keys and values: kt = k[0:len]^T (PackTransposed), vr = v[0:len]
// (RowsOf). Query rows in passes of kCausalBlock (scores, softmax, context while in cache).
void HeadForwardPacked(ConstStridedMap q, const float* kt, RowsOperand vr, int64_t len,
                       int64_t first, float scale, float* p, StridedMap out) {
  const int64_t n = q.rows();
  const int64_t hd = q.cols();
  for (int64_t r0 = 0; r0 < n; r0 += kCausalBlock) {
    const int64_t rows = std::min(kCausalBlock, n - r0);
    const int64_t pos = first + r0;  // the position of the pass's first row
    float* block = p + r0 * len;
    TileProduct(
        rows, q.data() + r0 * q.outerStride(), q.outerStride(), 1, kt, RoundUpLanes(len),
        [pos](int64_t i0, int64_t tile) { return pos + i0 + tile; },
        [hd](int64_t, int64_t* lo, int64_t* hi) { *lo = 0, *hi = hd; }, false, block, len);
    CausalSoftmaxRows(rows, len, pos, scale, block);
    TileProduct(
        rows, block, len, 1, vr.data, vr.ld, [hd](int64_t, int64_t) { return hd; },
        [pos](int64_t i, int64_t* lo, int64_t* hi) { *lo = 0, *hi = pos + i + 1; }, false,
        out.data() + r0 * out.outerStride(), out.outerStride());
  }
}

// The operands of one head's backward: v^T (PackTransposed, PackedFloats(T, hd) floats), k, q and
// dout (RowsOf).
struct BackwardOperands {
  float* vt;
  RowsOperand k, q, dout;
};

// CausalHeadBackward on packed operands.
void HeadBackwardPacked(const BackwardOperands& ops, int64_t t, int64_t hd, const float* p,
                        double scale, float* ds, bool accumulate, StridedMap dq, StridedMap dk,
                        StridedMap dv) {
  auto all_columns = [hd](int64_t, int64_t) { return hd; };
  for (int64_t r0 = 0; r0 < t; r0 += kCausalBlock) {
    const int64_t rows = std::min(kCausalBlock, t - r0);
    TileProduct(
        rows, ops.dout.data + r0 * ops.dout.ld, ops.dout.ld, 1, ops.vt, RoundUpLanes(t),
        [r0](int64_t i0, int64_t tile) { return r0 + i0 + tile; },
        [hd](int64_t, int64_t* lo, int64_t* hi) { *lo = 0, *hi = hd; }, false, ds + r0 * t, t);
    CausalSoftmaxBackwardRows(rows, t, r0, scale, p + r0 * t, ds + r0 * t);
    TileProduct(
        rows, ds + r0 * t, t, 1, ops.k.data, ops.k.ld, all_columns,
        [r0](int64_t i, int64_t* lo, int64_t* hi) { *lo = 0, *hi = r0 + i + 1; }, false,
        dq.data() + r0 * dq.outerStride(), dq.outerStride());
  }
  // Key rows j: dv_j = sum over i >= j of P_ij dout_i, dk_j of dS_ij q_i (A = P^T, dS^T).
  auto below = [t](int64_t j, int64_t* lo, int64_t* hi) { *lo = j, *hi = t; };
  TileProduct(t, p, 1, t, ops.dout.data, ops.dout.ld, all_columns, below, accumulate, dv.data(),
              dv.outerStride());
  TileProduct(t, ds, 1, t, ops.q.data, ops.q.ld, all_columns, below, accumulate, dk.data(),
              dk.outerStride());
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
    const double dot = RowSum(ar, dr, count);
    for (int64_t j = 0; j < count; ++j) dr[j] = static_cast<float>(scale * ar[j] * (dr[j] - dot));
    std::fill(dr + count, dr + len, 0.0f);
  }
}

void CausalHeadForward(ConstStridedMap q, ConstStridedMap k, ConstStridedMap v, int64_t first,
                       float scale, float* p, StridedMap out) {
  const int64_t len = first + q.rows();
  assert(k.rows() >= len && v.rows() >= len && out.rows() == q.rows());
  const int64_t hd = q.cols();
  float* kt = AttentionScratch(2 * PackedFloats(len, hd));
  PackTransposed(k, len, kt);
  const RowsOperand vr = RowsOf(v, len, kt + PackedFloats(len, hd));
  HeadForwardPacked(q, kt, vr, len, first, scale, p, out);
}

void CausalHeadBackward(ConstStridedMap q, ConstStridedMap k, ConstStridedMap v, const float* p,
                        ConstStridedMap dout, double scale, float* ds, bool accumulate,
                        StridedMap dq, StridedMap dk, StridedMap dv) {
  const int64_t t = q.rows();
  const int64_t hd = q.cols();
  const int64_t packed = PackedFloats(t, hd);
  float* buffers = AttentionScratch(4 * packed);
  PackTransposed(v, t, buffers);
  const BackwardOperands ops{buffers, RowsOf(k, t, buffers + packed),
                             RowsOf(q, t, buffers + 2 * packed),
                             RowsOf(dout, t, buffers + 3 * packed)};
  HeadBackwardPacked(ops, t, hd, p, scale, ds, accumulate, dq, dk, dv);
}

double CausalScoreEntries(int64_t context) {
  double entries = 0;
  for (int64_t i0 = 0; i0 < context; i0 += kCausalTileRows) {
    const int64_t rows = std::min(kCausalTileRows, context - i0);
    entries += static_cast<double>(rows) * static_cast<double>(i0 + rows);
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
  // Each kv head's keys and values packed once for the query heads of its group.
  float* kt = AttentionScratch(2 * PackedFloats(t, hd));
  float* v_buffer = kt + PackedFloats(t, hd);
  for (int64_t s = 0; s < samples; ++s) {
    for (int64_t j = 0; j < shape.kv_heads; ++j) {
      PackTransposed(HeadOf(k, s * t, t, j, hd), t, kt);
      const RowsOperand vr = RowsOf(HeadOf(v, s * t, t, j, hd), t, v_buffer);
      for (int64_t h = j * group; h < (j + 1) * group; ++h) {
        HeadForwardPacked(HeadOf(q, s * t, t, h, hd), kt, vr, t, 0, scale,
                          probs + (s * shape.heads + h) * t * t, HeadOf(out, s * t, t, h, hd));
      }
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
  const int64_t packed = PackedFloats(t, hd);
  float* buffers = AttentionScratch(4 * packed);
  BackwardOperands ops{buffers, {}, {}, {}};
  for (int64_t s = 0; s < samples; ++s) {
    for (int64_t j = 0; j < shape.kv_heads; ++j) {
      PackTransposed(HeadOf(v, s * t, t, j, hd), t, ops.vt);
      ops.k = RowsOf(HeadOf(k, s * t, t, j, hd), t, buffers + packed);
      // The query heads of the group in increasing order, the first assigning dk_j, dv_j.
      for (int64_t h = j * group; h < (j + 1) * group; ++h) {
        ops.q = RowsOf(HeadOf(q, s * t, t, h, hd), t, buffers + 2 * packed);
        ops.dout = RowsOf(HeadOf(dout, s * t, t, h, hd), t, buffers + 3 * packed);
        HeadBackwardPacked(ops, t, hd, probs + (s * shape.heads + h) * t * t, scale, scratch,
                           /*accumulate=*/h != j * group, HeadOf(dq, s * t, t, h, hd),
                           HeadOf(dk, s * t, t, j, hd), HeadOf(dv, s * t, t, j, hd));
      }
    }
  }
}

}  // namespace pipetrain::math
