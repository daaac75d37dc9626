#include "common/math/det_math.h"

#include <cmath>
#include <limits>

namespace pipetrain::math {
namespace {

// ln 2 split so that k * kLn2Hi is exact for |k| < 2^20 (fdlibm's constants).
constexpr double kLn2Hi = 6.93147180369123816490e-01;
constexpr double kLn2Lo = 1.90821492927058770002e-10;
constexpr double kInvLn2 = 1.44269504088896338700e+00;
constexpr double kSqrtHalf = 0.70710678118654752440;
constexpr double kTwoPi = 6.28318530717958647692;

}  // namespace

double PortableExp(double x) {
  if (std::isnan(x)) return x;
  if (x > 709.782712893383973096) return std::numeric_limits<double>::infinity();
  if (x < -745.133219101941108420) return 0.0;
  // x = k ln2 + r with |r| <= ln2/2, e^x = 2^k e^r.
  const double k = std::floor(x * kInvLn2 + 0.5);
  const double r = (x - k * kLn2Hi) - k * kLn2Lo;
  // Taylor series of e^r to r^13 (truncation error < 5e-18 for |r| <= 0.347), Horner form.
  double p = 1.0 / 6227020800.0;  // 1/13!
  p = p * r + 1.0 / 479001600.0;  // 1/12!
  p = p * r + 1.0 / 39916800.0;
  p = p * r + 1.0 / 3628800.0;
  p = p * r + 1.0 / 362880.0;
  p = p * r + 1.0 / 40320.0;
  p = p * r + 1.0 / 5040.0;
  p = p * r + 1.0 / 720.0;
  p = p * r + 1.0 / 120.0;
  p = p * r + 1.0 / 24.0;
  p = p * r + 1.0 / 6.0;
  p = p * r + 0.5;
  p = p * r + 1.0;
  p = p * r + 1.0;
  return std::ldexp(p, static_cast<int>(k));
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

}  // namespace pipetrain::math
