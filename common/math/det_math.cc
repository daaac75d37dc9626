#include "common/math/det_math.h"

#include <Eigen/Core>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#if defined(__AVX2__) && !defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace pipetrain::math {
namespace {

// ln 2 split so that k * kLn2Hi is exact for |k| < 2^20 (fdlibm's constants).
constexpr double kLn2Hi = 6.93147180369123816490e-01;
constexpr double kLn2Lo = 1.90821492927058770002e-10;
constexpr double kThirtyTwoOverLn2 = 32 * 1.44269504088896338700e+00;  // exact scaling by 32
constexpr double kLn2Over32Hi = kLn2Hi / 32;  // exact; n * kLn2Over32Hi exact for |n| < 2^21
constexpr double kLn2Over32Lo = kLn2Lo / 32;
// 2^(j/32), j = 0..31, each correctly rounded (computed to 60 digits with Python's decimal).
constexpr double kExp2Table[32] = {
    0x1.0000000000000p+0, 0x1.059b0d3158574p+0, 0x1.0b5586cf9890fp+0, 0x1.11301d0125b51p+0,
    0x1.172b83c7d517bp+0, 0x1.1d4873168b9aap+0, 0x1.2387a6e756238p+0, 0x1.29e9df51fdee1p+0,
    0x1.306fe0a31b715p+0, 0x1.371a7373aa9cbp+0, 0x1.3dea64c123422p+0, 0x1.44e086061892dp+0,
    0x1.4bfdad5362a27p+0, 0x1.5342b569d4f82p+0, 0x1.5ab07dd485429p+0, 0x1.6247eb03a5585p+0,
    0x1.6a09e667f3bcdp+0, 0x1.71f75e8ec5f74p+0, 0x1.7a11473eb0187p+0, 0x1.82589994cce13p+0,
    0x1.8ace5422aa0dbp+0, 0x1.93737b0cdc5e5p+0, 0x1.9c49182a3f090p+0, 0x1.a5503b23e255dp+0,
    0x1.ae89f995ad3adp+0, 0x1.b7f76f2fb5e47p+0, 0x1.c199bdd85529cp+0, 0x1.cb720dcef9069p+0,
    0x1.d5818dcfba487p+0, 0x1.dfc97337b9b5fp+0, 0x1.ea4afa2a490dap+0, 0x1.f50765b6e4540p+0};
#if defined(__AVX512F__)
// PortableExpArray's vectors: the lanes an AVX-512 register holds (x86-64-v4 only; see
// PortableExpArray).
constexpr int kExpLanes = 8;
using VecD = double __attribute__((vector_size(kExpLanes * sizeof(double))));
using VecL = int64_t __attribute__((vector_size(kExpLanes * sizeof(int64_t))));
// Arguments PortableExpLanes takes: its result is then p * 2^m with -1022 < m < 1023.
constexpr double kExpLaneLimit = 700.0;

// y[l] = PortableExp(x[l]) for the kExpLanes values at x whose magnitude is at most
// kExpLaneLimit: PortableExp's arithmetic lane by lane (vectors stay local: no vector crosses a
// function boundary, so no ABI depends on the level). Other lanes get garbage; the caller redoes
// them. Returns whether every lane was in range.
inline bool PortableExpLanes(const double* x, double* y) {
  // (VecL)d and (VecD)l reinterpret the bits (vector casts of equal size).
  VecD v;
  std::memcpy(&v, x, sizeof v);
  const VecL in_range = (v >= -kExpLaneLimit) & (v <= kExpLaneLimit);
  v = (VecD)((VecL)v & in_range);  // NaN and out-of-range lanes become 0.
  const VecD t = v * kThirtyTwoOverLn2;
  const VecL negative = t < 0.0;
  const VecL half_bits = ((VecL)(VecD{} + 0.5) & ~negative) | ((VecL)(VecD{} - 0.5) & negative);
  // n = (int)(t +- 1/2): truncation, as PortableExp's cvttsd2si.
  const VecL n = __builtin_convertvector(t + (VecD)half_bits, VecL);
  const VecD nd = __builtin_convertvector(n, VecD);
  const VecD r = (v - nd * kLn2Over32Hi) - nd * kLn2Over32Lo;
  const VecL j = n & 31;
  const VecL m = (n - j) >> 5;  // exact: n - j is a multiple of 32
  VecD q = VecD{} + 1.0 / 720.0;
  q = q * r + 1.0 / 120.0;
  q = q * r + 1.0 / 24.0;
  q = q * r + 1.0 / 6.0;
  q = q * r + 0.5;
  q = q * r + 1.0;
  q = q * r;
  VecD tj;
#if defined(__GNUC__) && !defined(__clang__)
  // The table as four vectors: two two-vector permutes (vpermt2pd at x86-64-v4) and a select by
  // j's bit 4 instead of eight scalar loads.
  VecD t0, t1, t2, t3;
  std::memcpy(&t0, kExp2Table, sizeof t0);
  std::memcpy(&t1, kExp2Table + 8, sizeof t1);
  std::memcpy(&t2, kExp2Table + 16, sizeof t2);
  std::memcpy(&t3, kExp2Table + 24, sizeof t3);
  const VecL low = j & 15;
  const VecL high_half = -((j >> 4) & 1);  // all ones where j >= 16
  tj = (VecD)(((VecL)__builtin_shuffle(t0, t1, low) & ~high_half) |
              ((VecL)__builtin_shuffle(t2, t3, low) & high_half));
#else
  for (int l = 0; l < kExpLanes; ++l) tj[l] = kExp2Table[j[l]];
#endif
  const VecD p = tj + tj * q;
  const VecD out = p * (VecD)((m + 1023) << 52);
  std::memcpy(y, &out, sizeof out);
  int64_t all = -1;
  for (int l = 0; l < kExpLanes; ++l) all &= in_range[l];
  return all != 0;
}
#elif defined(__AVX2__)
// PortableExpArray's vectors at x86-64-v3: four doubles per AVX register. AVX2 has no 64-bit
// integer conversions, so n (|n| < 2^15 for |x| <= kExpLaneLimit) goes through 32-bit lanes
// (cvttpd2dq truncates as PortableExp's cvttsd2si), the table through a gather and 2^m through a
// widening to 64 bits and a shift.
constexpr int kExpLanes = 4;
constexpr double kExpLaneLimit = 700.0;

// As the AVX-512 PortableExpLanes above: y[l] = PortableExp(x[l]) for the kExpLanes values at x
// whose magnitude is at most kExpLaneLimit, the same operations in the same order (separate
// multiplies and adds: intrinsics are never contracted under -ffp-contract=off). Other lanes get
// garbage; returns whether every lane was in range.
inline bool PortableExpLanes(const double* x, double* y) {
  __m256d v = _mm256_loadu_pd(x);
  const __m256d in_range =
      _mm256_and_pd(_mm256_cmp_pd(v, _mm256_set1_pd(-kExpLaneLimit), _CMP_GE_OQ),
                    _mm256_cmp_pd(v, _mm256_set1_pd(kExpLaneLimit), _CMP_LE_OQ));
  v = _mm256_and_pd(v, in_range);  // NaN and out-of-range lanes become 0.
  const __m256d t = _mm256_mul_pd(v, _mm256_set1_pd(kThirtyTwoOverLn2));
  // t + (t >= 0 ? 0.5 : -0.5), truncated.
  const __m256d half = _mm256_blendv_pd(_mm256_set1_pd(0.5), _mm256_set1_pd(-0.5),
                                        _mm256_cmp_pd(t, _mm256_setzero_pd(), _CMP_LT_OQ));
  const __m128i n = _mm256_cvttpd_epi32(_mm256_add_pd(t, half));
  const __m256d nd = _mm256_cvtepi32_pd(n);
  const __m256d r = _mm256_sub_pd(_mm256_sub_pd(v, _mm256_mul_pd(nd, _mm256_set1_pd(kLn2Over32Hi))),
                                  _mm256_mul_pd(nd, _mm256_set1_pd(kLn2Over32Lo)));
  const __m128i j = _mm_and_si128(n, _mm_set1_epi32(31));
  const __m128i m = _mm_srai_epi32(_mm_sub_epi32(n, j), 5);  // exact: n - j is a multiple of 32
  __m256d q = _mm256_set1_pd(1.0 / 720.0);
  q = _mm256_add_pd(_mm256_mul_pd(q, r), _mm256_set1_pd(1.0 / 120.0));
  q = _mm256_add_pd(_mm256_mul_pd(q, r), _mm256_set1_pd(1.0 / 24.0));
  q = _mm256_add_pd(_mm256_mul_pd(q, r), _mm256_set1_pd(1.0 / 6.0));
  q = _mm256_add_pd(_mm256_mul_pd(q, r), _mm256_set1_pd(0.5));
  q = _mm256_add_pd(_mm256_mul_pd(q, r), _mm256_set1_pd(1.0));
  q = _mm256_mul_pd(q, r);
  // The masked form with a zero source: the plain one trips GCC 12's -Wmaybe-uninitialized on its
  // own _mm256_undefined_pd (GCC PR 105593).
  const __m256d tj =
      _mm256_mask_i32gather_pd(_mm256_setzero_pd(), kExp2Table, j,
                               _mm256_castsi256_pd(_mm256_set1_epi64x(-1)), sizeof(double));
  const __m256d p = _mm256_add_pd(tj, _mm256_mul_pd(tj, q));
  const __m256i scale_bits =
      _mm256_slli_epi64(_mm256_cvtepi32_epi64(_mm_add_epi32(m, _mm_set1_epi32(1023))), 52);
  _mm256_storeu_pd(y, _mm256_mul_pd(p, _mm256_castsi256_pd(scale_bits)));
  return _mm256_movemask_pd(in_range) == (1 << kExpLanes) - 1;
}
#endif  // __AVX512F__, __AVX2__

constexpr double kSqrtHalf = 0.70710678118654752440;
constexpr double kTwoPi = 6.28318530717958647692;

}  // namespace

double PortableExp(double x) {
  if (std::isnan(x)) return x;
  if (x > 709.782712893383973096) return std::numeric_limits<double>::infinity();
  if (x < -745.133219101941108420) return 0.0;
  // x = (32 m + j) ln2/32 + r, |r| <= ln2/64 (+ a hair): e^x = 2^m 2^(j/32) e^r. n = round(32
  // x/ln2) by truncating t +- 1/2 (cvttsd2si: exact, no libm call).
  const double t = x * kThirtyTwoOverLn2;
  const int n = static_cast<int>(t + (t >= 0 ? 0.5 : -0.5));
  const double nd = n;
  const double r = (x - nd * kLn2Over32Hi) - nd * kLn2Over32Lo;  // n * hi is exact
  const int j = n & 31;
  const int m = (n - j) / 32;  // exact floor(n / 32)
  // e^r - 1 to r^6 (truncation < 4e-18 for |r| <= 0.0109), Horner form.
  double q = 1.0 / 720.0;
  q = q * r + 1.0 / 120.0;
  q = q * r + 1.0 / 24.0;
  q = q * r + 1.0 / 6.0;
  q = q * r + 0.5;
  q = q * r + 1.0;
  q = q * r;
  const double tj = kExp2Table[j];
  const double p = tj + tj * q;  // 2^(j/32) e^r, in [2^(-1/64), 2^(63/64)]
  if (m > -1022 && m < 1023) {
    // p * 2^m with 2^m built from its bits: an exact scaling for normal results.
    const uint64_t bits = static_cast<uint64_t>(m + 1023) << 52;
    double scale;
    std::memcpy(&scale, &bits, sizeof scale);
    return p * scale;
  }
  return std::ldexp(p, m);  // overflow/subnormal edges: correctly rounded scaling.
}

void PortableExpArray(const double* x, int64_t n, double* y) {
  int64_t i = 0;
#if defined(__AVX512F__) || defined(__AVX2__)
  for (; i + kExpLanes <= n; i += kExpLanes) {
    double args[kExpLanes];
    std::memcpy(args, x + i, sizeof args);
    if (PortableExpLanes(args, y + i)) continue;
    for (int l = 0; l < kExpLanes; ++l) {
      if (!(std::fabs(args[l]) <= kExpLaneLimit)) y[i + l] = PortableExp(args[l]);
    }
  }
#endif
  // The remainder (and, without AVX2, everything): one argument at a time.
  for (; i < n; ++i) y[i] = PortableExp(x[i]);
}

namespace {

// PortableExpFloatArray's vectors: 16 floats (one AVX-512 register, two AVX2 or four SSE ones).
constexpr int kExpFloatLanes = 16;
using VecF = float __attribute__((vector_size(kExpFloatLanes * sizeof(float))));
using VecI = int32_t __attribute__((vector_size(kExpFloatLanes * sizeof(int32_t))));
// Cephes' expf constants: the argument range, log2(e), ln 2 = kExpFloatC1 - kExpFloatC2 with
// n * kExpFloatC1 exact (9 significant bits), the polynomial of e^r - 1 - r over r^2.
constexpr float kExpFloatLo = -87.3365447505531f;  // round(x log2 e) >= -126: 2^k normal
constexpr float kExpFloatHi = 88.3762626647949f;   // round(x log2 e) <= 127
constexpr float kLog2eFloat = 1.44269504088896341f;
constexpr float kExpFloatC1 = 0.693359375f;
constexpr float kExpFloatC2 = -2.12194440e-4f;
constexpr float kRoundMagic = 12582912.0f;  // 1.5 * 2^23: x + it - it rounds x to an integer.

// *v = e^*v per lane; every lane the same float operations. (By pointer: a 64-byte vector passed
// by value would depend on the level's calling convention.)
void ExpFloatLanes(VecF* v) {
  const VecF x = *v;
  const VecF lo = kExpFloatLo - VecF{};
  const VecF hi = kExpFloatHi - VecF{};
  VecF xc = x > lo ? x : lo;  // NaN lanes become lo here and NaN again at the end.
  xc = xc < hi ? xc : hi;
  VecF n = xc * kLog2eFloat + kRoundMagic;
  n = n - kRoundMagic;  // round(x log2 e), ties to even: -126 <= n <= 127
  VecF r = xc - n * kExpFloatC1;
  r = r - n * kExpFloatC2;
  const VecF z = r * r;
  VecF p = 1.9875691500e-4f * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * z + r;
  p = p + 1.0f;                                     // e^r, r in [-ln2/2, ln2/2]
  const VecI k = __builtin_convertvector(n, VecI);  // n is integral: exact
  const VecI bits = (k + 127) << 23;
  VecF scale;
  std::memcpy(&scale, &bits, sizeof scale);
  VecF y = p * scale;  // exact scaling unless the result is subnormal (then correctly rounded)
  const VecF zero = VecF{};
  const VecF inf = std::numeric_limits<float>::infinity() - VecF{};
  y = x < lo ? zero : y;
  y = x > hi ? inf : y;
  *v = x != x ? x : y;
}

}  // namespace

void PortableExpFloatArray(const float* x, int64_t n, float* y) {
  int64_t i = 0;
  for (; i + kExpFloatLanes <= n; i += kExpFloatLanes) {
    VecF v;
    std::memcpy(&v, x + i, sizeof v);
    ExpFloatLanes(&v);
    std::memcpy(y + i, &v, sizeof v);
  }
  if (i == n) return;
  // The rest through the same lanes, padded with zeros.
  VecF v = VecF{};
  std::memcpy(&v, x + i, static_cast<size_t>(n - i) * sizeof(float));
  ExpFloatLanes(&v);
  std::memcpy(y + i, &v, static_cast<size_t>(n - i) * sizeof(float));
}

float PortableExpFloat(float x) {
  float y;
  PortableExpFloatArray(&x, 1, &y);
  return y;
}

double PortableLog(double x) {
  if (std::isnan(x) || x < 0) return std::numeric_limits<double>::quiet_NaN();
  if (x == 0) return -std::numeric_limits<double>::infinity();
  if (std::isinf(x)) return x;
  int e = 0;
  double m = std::frexp(x, &e);  // x = m 2^e, m in [0.5, 1); exact.
  if (m < kSqrtHalf) {
    m *= 2;
    --e;
  }
  // m in [sqrt(1/2), sqrt(2)): log m = 2 atanh(s), s = (m-1)/(m+1), |s| <= 0.1716.
  const double s = (m - 1.0) / (m + 1.0);
  const double s2 = s * s;
  // atanh(s)/s - 1 = s^2/3 + s^4/5 + ... (to s^22/23: truncation < 1e-18).
  double p = 1.0 / 23.0;
  p = p * s2 + 1.0 / 21.0;
  p = p * s2 + 1.0 / 19.0;
  p = p * s2 + 1.0 / 17.0;
  p = p * s2 + 1.0 / 15.0;
  p = p * s2 + 1.0 / 13.0;
  p = p * s2 + 1.0 / 11.0;
  p = p * s2 + 1.0 / 9.0;
  p = p * s2 + 1.0 / 7.0;
  p = p * s2 + 1.0 / 5.0;
  p = p * s2 + 1.0 / 3.0;
  p = p * s2;
  const double two_s = 2.0 * s;
  const double log_m = two_s + two_s * p;
  const double de = static_cast<double>(e);
  return de * kLn2Hi + (de * kLn2Lo + log_m);
}

double PortableTanh(double x) {
  if (std::isnan(x)) return x;
  const double a = std::fabs(x);
  double t;
  if (a < 0.03125) {
    // Odd series: a - a^3/3 + 2a^5/15 - 17a^7/315 + 62a^9/2835 (next term < 1e-15 relative).
    const double a2 = a * a;
    double p = 62.0 / 2835.0;
    p = p * a2 - 17.0 / 315.0;
    p = p * a2 + 2.0 / 15.0;
    p = p * a2 - 1.0 / 3.0;
    t = a + a * (a2 * p);
  } else if (a >= 20.0) {
    t = 1.0;
  } else {
    const double e = PortableExp(2.0 * a);
    t = (e - 1.0) / (e + 1.0);
  }
  return x < 0 ? -t : t;
}

void PortableSinCos2Pi(double u, double* s, double* c) {
  // u = n/4 + f with |f| <= 1/8: 2 pi u = n pi/2 + a with |a| <= pi/4.
  const double n = std::floor(4.0 * u + 0.5);
  const double f = u - 0.25 * n;
  const double a = kTwoPi * f;
  const double a2 = a * a;
  // Taylor series to a^17 (sin) and a^18 (cos): truncation < 1e-19 for |a| <= pi/4.
  double ps = -1.0 / 355687428096000.0;  // -1/17!
  ps = ps * a2 + 1.0 / 1307674368000.0;  // 1/15!
  ps = ps * a2 - 1.0 / 6227020800.0;
  ps = ps * a2 + 1.0 / 39916800.0;
  ps = ps * a2 - 1.0 / 362880.0;
  ps = ps * a2 + 1.0 / 5040.0;
  ps = ps * a2 - 1.0 / 120.0;
  ps = ps * a2 + 1.0 / 6.0;
  const double sin_a = a - a * (a2 * ps);
  double pc = 1.0 / 6402373705728000.0;   // 1/18!
  pc = pc * a2 - 1.0 / 20922789888000.0;  // -1/16!
  pc = pc * a2 + 1.0 / 87178291200.0;
  pc = pc * a2 - 1.0 / 479001600.0;
  pc = pc * a2 + 1.0 / 3628800.0;
  pc = pc * a2 - 1.0 / 40320.0;
  pc = pc * a2 + 1.0 / 720.0;
  pc = pc * a2 - 1.0 / 24.0;
  pc = pc * a2 + 0.5;
  const double cos_a = 1.0 - a2 * pc;
  switch (static_cast<int>(n) & 3) {
    case 0:
      *s = sin_a;
      *c = cos_a;
      break;
    case 1:
      *s = cos_a;
      *c = -sin_a;
      break;
    case 2:
      *s = -sin_a;
      *c = -cos_a;
      break;
    default:
      *s = -cos_a;
      *c = sin_a;
      break;
  }
}

void PinEigenBlockingForReproducibility() {
  Eigen::setCpuCacheSizes(32 * 1024, 1024 * 1024, 8 * 1024 * 1024);
}

}  // namespace pipetrain::math
