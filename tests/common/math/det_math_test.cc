#include "common/math/det_math.h"

#include <Eigen/Core>
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "common/math/tensor.h"
#include "gtest/gtest.h"

namespace pipetrain::math {
namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

double RelErr(double got, double want) {
  return want == 0 ? std::fabs(got) : std::fabs(got - want) / std::fabs(want);
}

TEST(PortableExpTest, MatchesStdExpToAFewUlps) {
  double worst = 0;
  // Normal results only (below -708 the result is subnormal and has fewer bits).
  for (double x = -708.0; x <= 709.0; x += 0.0137) {
    worst = std::max(worst, RelErr(PortableExp(x), std::exp(x)));
  }
  for (double x = -2.0; x <= 2.0; x += 1.0 / 1024 + 1e-9) {
    worst = std::max(worst, RelErr(PortableExp(x), std::exp(x)));
  }
  EXPECT_LT(worst, 1e-15);
  for (double x = -745.0; x < -708.0; x += 0.0731) {
    EXPECT_NEAR(PortableExp(x), std::exp(x), 2 * std::numeric_limits<double>::denorm_min()) << x;
  }
}

TEST(PortableExpTest, SpecialValues) {
  EXPECT_EQ(PortableExp(0.0), 1.0);
  EXPECT_EQ(PortableExp(710.0), kInf);
  EXPECT_EQ(PortableExp(-746.0), 0.0);
  EXPECT_EQ(PortableExp(-kInf), 0.0);
  EXPECT_EQ(PortableExp(kInf), kInf);
  EXPECT_TRUE(std::isnan(PortableExp(std::nan(""))));
}

// Bit pattern of a double (so that NaN compares equal to itself).
uint64_t Bits(double x) {
  uint64_t b;
  std::memcpy(&b, &x, sizeof b);
  return b;
}

TEST(PortableExpArrayTest, BitwisePortableExpForEveryArgumentAndLength) {
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<double> wide(-800.0, 800.0), narrow(-30.0, 5.0);
  std::vector<double> x;
  for (int i = 0; i < 4000; ++i) x.push_back(i % 2 == 0 ? narrow(rng) : wide(rng));
  // Every special case and range edge, at every lane position (the vector path and its fallback).
  const double specials[] = {0.0,    -0.0,   700.0, -700.0, 700.0001,     -700.0001, 709.9,
                             -745.2, -744.9, kInf,  -kInf,  std::nan(""), 1e-300,    -1e-300};
  for (int shift = 0; shift < 8; ++shift) {
    for (int k = 0; k < shift; ++k) x.push_back(narrow(rng));
    for (double s : specials) x.push_back(s);
  }
  for (int64_t n : {int64_t{0}, int64_t{1}, int64_t{7}, int64_t{8}, int64_t{9},
                    static_cast<int64_t>(x.size())}) {
    std::vector<double> y(static_cast<size_t>(n), -1.0);
    PortableExpArray(x.data(), n, y.data());
    for (int64_t i = 0; i < n; ++i) {
      ASSERT_EQ(Bits(y[i]), Bits(PortableExp(x[i]))) << "x[" << i << "] = " << x[i] << ", n " << n;
    }
  }
  // In place.
  std::vector<double> y = x;
  PortableExpArray(y.data(), static_cast<int64_t>(y.size()), y.data());
  for (size_t i = 0; i < x.size(); ++i) ASSERT_EQ(Bits(y[i]), Bits(PortableExp(x[i]))) << x[i];
}

uint32_t FloatBits(float x) {
  uint32_t b;
  std::memcpy(&b, &x, sizeof b);
  return b;
}

// Every 997th float bit pattern (4.3M arguments of every sign and magnitude, NaNs included).
std::vector<float> FloatGrid() {
  std::vector<float> x;
  for (uint64_t b = 0; b <= 0xFFFFFFFFull; b += 997) {
    const uint32_t bits = static_cast<uint32_t>(b);
    float f;
    std::memcpy(&f, &bits, sizeof f);
    x.push_back(f);
  }
  return x;
}

TEST(PortableExpFloatTest, WithinOneUlpOfTheExactValueAndEdgesAsDocumented) {
  const std::vector<float> x = FloatGrid();
  std::vector<float> y(x.size());
  PortableExpFloatArray(x.data(), static_cast<int64_t>(x.size()), y.data());
  double worst_ulps = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    if (std::isnan(x[i])) {
      ASSERT_TRUE(std::isnan(y[i])) << i;
    } else if (x[i] < -87.3365447505531f) {
      ASSERT_EQ(FloatBits(y[i]), FloatBits(0.0f)) << x[i];
    } else if (x[i] > 88.3762626647949f) {
      ASSERT_EQ(y[i], std::numeric_limits<float>::infinity()) << x[i];
    } else {
      const double want = std::exp(static_cast<double>(x[i]));
      const float wf = static_cast<float>(want);
      const double ulp = static_cast<double>(std::nextafter(wf, 1e38f)) - wf;
      worst_ulps = std::max(worst_ulps, std::fabs(y[i] - want) / ulp);
    }
  }
  EXPECT_LT(worst_ulps, 1.0);  // measured 0.94 (x = 70.39)
  EXPECT_EQ(PortableExpFloat(0.0f), 1.0f);
  EXPECT_EQ(PortableExpFloat(-0.0f), 1.0f);
  EXPECT_EQ(PortableExpFloat(-std::numeric_limits<float>::infinity()), 0.0f);
  EXPECT_EQ(PortableExpFloat(std::numeric_limits<float>::infinity()),
            std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(PortableExpFloat(std::nanf(""))));
  EXPECT_GT(PortableExpFloat(-87.3365f), 0.0f);
  EXPECT_LT(PortableExpFloat(88.37626f), std::numeric_limits<float>::infinity());
}

// The same bits at every instruction-set level: the checksum of the grid's results, the same when
// this file and det_math.cc are compiled at -march=x86-64, x86-64-v3 and x86-64-v4 (checked by
// hand with GCC 12 and Clang 14; the build runs it at PIPETRAIN_ARCH), and every length, offset and
// in-place call gives the bits of one argument at a time.
TEST(PortableExpFloatTest, BitsArePinnedAndIndependentOfLengthAndPlace) {
  const std::vector<float> x = FloatGrid();
  std::vector<float> y(x.size());
  PortableExpFloatArray(x.data(), static_cast<int64_t>(x.size()), y.data());
  uint64_t hash = 1469598103934665603ull;  // FNV-1a over the results' bits
  for (float v : y) hash = (hash ^ FloatBits(v)) * 1099511628211ull;
  EXPECT_EQ(hash, 0x80c3cc78b14548b5ull);
  EXPECT_EQ(FloatBits(PortableExpFloat(1.0f)), 0x402df854u);
  std::vector<float> args(x.begin() + 100000, x.begin() + 100050);
  for (int64_t offset = 0; offset < 3; ++offset) {
    for (int64_t n = 0; n + offset <= 50; ++n) {
      std::vector<float> out(static_cast<size_t>(n), -1.0f);
      PortableExpFloatArray(args.data() + offset, n, out.data());
      for (int64_t i = 0; i < n; ++i) {
        ASSERT_EQ(FloatBits(out[i]), FloatBits(PortableExpFloat(args[offset + i]))) << n;
      }
    }
  }
  std::vector<float> in_place = args;
  PortableExpFloatArray(in_place.data(), 50, in_place.data());
  for (int i = 0; i < 50; ++i)
    ASSERT_EQ(FloatBits(in_place[i]), FloatBits(PortableExpFloat(args[i])));
}

TEST(PortableLogTest, MatchesStdLog) {
  double worst_rel = 0;
  double worst_abs = 0;
  for (double x = 1e-300; x < 1e300; x *= 1.37) {
    worst_rel = std::max(worst_rel, RelErr(PortableLog(x), std::log(x)));
  }
  for (double x = 0.5; x <= 2.0; x += 1.0 / 4096 + 1e-10) {
    worst_abs = std::max(worst_abs, std::fabs(PortableLog(x) - std::log(x)));
  }
  EXPECT_LT(worst_rel, 1e-15);
  EXPECT_LT(worst_abs, 4e-16);
  // Near 1 the relative error must stay small too (no cancellation).
  EXPECT_LT(RelErr(PortableLog(1.0 + 1e-12), std::log(1.0 + 1e-12)), 1e-12);
  EXPECT_LT(RelErr(PortableLog(1.0 - 1e-12), std::log(1.0 - 1e-12)), 1e-12);
}

TEST(PortableLogTest, SpecialValues) {
  EXPECT_EQ(PortableLog(1.0), 0.0);
  EXPECT_EQ(PortableLog(0.0), -kInf);
  EXPECT_EQ(PortableLog(kInf), kInf);
  EXPECT_TRUE(std::isnan(PortableLog(-1.0)));
  EXPECT_TRUE(std::isnan(PortableLog(std::nan(""))));
  EXPECT_NEAR(PortableLog(std::numeric_limits<double>::denorm_min()),
              std::log(4.9406564584124654e-324), 1e-12);
}

TEST(PortableTanhTest, MatchesStdTanh) {
  double worst = 0;
  for (double x = -25.0; x <= 25.0; x += 0.00731)
    worst = std::max(worst, RelErr(PortableTanh(x), std::tanh(x)));
  for (double x = 1e-30; x < 0.1; x *= 1.1)
    worst = std::max(worst, RelErr(PortableTanh(x), std::tanh(x)));
  EXPECT_LT(worst, 1e-13);
  EXPECT_EQ(PortableTanh(0.0), 0.0);
  EXPECT_EQ(PortableTanh(30.0), 1.0);
  EXPECT_EQ(PortableTanh(-30.0), -1.0);
  EXPECT_TRUE(std::isnan(PortableTanh(std::nan(""))));
}

TEST(PortableSinCos2PiTest, MatchesStd) {
  double worst = 0;
  for (double u = 0; u <= 1.0; u += 1.0 / 10007) {
    double s = 0;
    double c = 0;
    PortableSinCos2Pi(u, &s, &c);
    const double a = 2 * M_PI * u;
    worst = std::max({worst, std::fabs(s - std::sin(a)), std::fabs(c - std::cos(a))});
  }
  EXPECT_LT(worst, 2e-15);
  double s = 0;
  double c = 0;
  PortableSinCos2Pi(0.0, &s, &c);
  EXPECT_EQ(s, 0.0);
  EXPECT_EQ(c, 1.0);
}

// The GEMM's summation order follows Eigen's cache-size plan: unpinned, a machine with another L1
// size rounds differently; pinned, the bits no longer depend on what CPUID reported.
TEST(PinEigenBlockingTest, GemmBitsDependOnlyOnThePinnedPlan) {
  const std::ptrdiff_t l1 = Eigen::l1CacheSize(), l2 = Eigen::l2CacheSize(),
                       l3 = Eigen::l3CacheSize();
  const int threads = Eigen::nbThreads();
  Eigen::setNbThreads(1);
  std::mt19937 gen(1);
  Matrix x(16, 3000), w(24, 3000);
  for (int64_t i = 0; i < x.size(); ++i) x.data()[i] = static_cast<float>(gen() % 2001) / 1000 - 1;
  for (int64_t i = 0; i < w.size(); ++i) w.data()[i] = static_cast<float>(gen() % 2001) / 1000 - 1;
  auto product = [&] {
    Matrix y(16, 24);
    y.noalias() = x * w.transpose();
    return y;
  };
  auto same = [](const Matrix& a, const Matrix& b) {
    return std::memcmp(a.data(), b.data(), sizeof(float) * a.size()) == 0;
  };
  Eigen::setCpuCacheSizes(48 * 1024, 2 << 20, 32 << 20);  // e.g. a recent Xeon
  const Matrix big_l1 = product();
  Eigen::setCpuCacheSizes(32 * 1024, 1 << 20, 8 << 20);  // e.g. an older one
  const Matrix small_l1 = product();
  EXPECT_FALSE(same(big_l1, small_l1)) << "Eigen no longer blocks on L1: revisit the pinning";
  Eigen::setCpuCacheSizes(48 * 1024, 2 << 20, 32 << 20);
  PinEigenBlockingForReproducibility();
  const Matrix pinned_a = product();
  Eigen::setCpuCacheSizes(16 * 1024, 256 << 10, 4 << 20);
  PinEigenBlockingForReproducibility();
  const Matrix pinned_b = product();
  EXPECT_TRUE(same(pinned_a, pinned_b));
  Eigen::setCpuCacheSizes(l1, l2, l3);
  Eigen::setNbThreads(threads);
}

}  // namespace
}  // namespace pipetrain::math
