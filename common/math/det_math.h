// Portable elementary functions whose bits do not depend on the C library or the CPU, and the
// switch that makes Eigen's GEMM blocking independent of the CPU.
//
// std::exp/std::log/std::tanh/std::cos come from libm; glibc on x86-64 picks FMA or non-FMA
// variants of several of them at run time (ifunc) according to the CPU, and neither variant is
// correctly rounded, so the same binary may return different bits on two machines. pipetrain
// promises bitwise-identical training on any worker, so every transcendental function in the
// numerics goes through this file instead: each is built from IEEE-754 basic operations
// (+ - * /, sqrt, floor, frexp/ldexp) only, which are correctly rounded everywhere. The library is
// compiled with -ffp-contract=off so the compiler never fuses a*b+c into an FMA.
//
// Accuracy: a few double ulps (far below float resolution); results are then rounded to float by
// callers where needed. All functions are pure, thread-safe and allocation-free.
#ifndef PIPETRAIN_COMMON_MATH_DET_MATH_H_
#define PIPETRAIN_COMMON_MATH_DET_MATH_H_

#include <cstdint>

namespace pipetrain::math {

// e^x. Returns +inf above ~709.78, 0 below ~-745.13, NaN for NaN.
double PortableExp(double x);

// y[i] = PortableExp(x[i]) for i < n, bitwise: the same IEEE-754 operations in the same order.
// With AVX-512 (x86-64-v4) 8 arguments at a time in vector registers (GCC/Clang vector
// extensions), with AVX2 (x86-64-v3) 4 at a time (intrinsics); arguments outside [-700, 700] or
// NaN through PortableExp itself; without AVX2 PortableExp one argument at a time. x and y may be
// the same array (not otherwise overlapping). n >= 0.
void PortableExpArray(const double* x, int64_t n, double* y);

// e^x in float: y[i] = e^(x[i]) for i < n, within 2 float ulps of the exact value (Cephes' expf:
// Cody-Waite reduction by ln 2, a degree-5 polynomial, scaling by 2^k), each element through the
// same IEEE-754 float operations in the same order (no FMA) in 16-lane vectors, whatever the
// instruction set the code is compiled for (the compiler splits them into AVX-512, AVX2 or SSE
// registers), so the bits are the same at every level. Returns 0 below -87.336544 (where e^x
// leaves the normal floats), +inf above 88.376262 (~2.4e38; the exact value overflows only past
// 88.7228), NaN for NaN. x and y may be the same array (not otherwise overlapping). n >= 0.
void PortableExpFloatArray(const float* x, int64_t n, float* y);

// PortableExpFloatArray of one argument.
float PortableExpFloat(float x);

// Natural logarithm. Returns -inf for 0, NaN for negative or NaN arguments, +inf for +inf.
double PortableLog(double x);

// tanh(x). Exactly +-1 for |x| >= 20 (tanh rounds to 1 in double there), NaN for NaN.
double PortableTanh(double x);

// *s = sin(2*pi*u), *c = cos(2*pi*u) for u in [0, 1] (used by Box-Muller).
void PortableSinCos2Pi(double u, double* s, double* c);

// Eigen's GEMM splits the depth (k) of a product into blocks of kc and adds the partial products
// block by block, so kc fixes the summation order. Eigen derives kc from the L1 cache size it reads
// from CPUID (and from the thread count), so by default the same binary can round differently on
// two machines (e.g. 32 KiB vs 48 KiB L1d). This pins the cache sizes Eigen plans with to fixed
// values (L1 32 KiB, L2 1 MiB, L3 8 MiB), making GEMM bits depend only on shapes, thread count and
// compile flags. Call it once at process start, before any thread runs an Eigen product, in every
// process whose numerics must agree (reference trainer, workers, tests comparing them). Process-
// wide; not thread-safe against concurrent Eigen products.
void PinEigenBlockingForReproducibility();

}  // namespace pipetrain::math

#endif  // PIPETRAIN_COMMON_MATH_DET_MATH_H_
