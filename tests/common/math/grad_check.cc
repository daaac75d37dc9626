#include "tests/common/math/grad_check.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <limits>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/types/span.h"
#include "gtest/gtest.h"

namespace pipetrain::math::testing {
namespace {

// PIPETRAIN_GRADCHECK_VERBOSE=1 prints every check's worst error (to see the margins).
bool Verbose() {
  const char* v = std::getenv("PIPETRAIN_GRADCHECK_VERBOSE");
  return v != nullptr && v[0] == '1';
}

}  // namespace

Matrix RandomMatrix(int64_t rows, int64_t cols, uint64_t seed, float lo, float hi) {
  std::mt19937_64 rng(seed);
  Matrix m(rows, cols);
  for (int64_t i = 0; i < m.size(); ++i) {
    const double u = static_cast<double>(rng() >> 11) * (1.0 / 9007199254740992.0);
    m.data()[i] = static_cast<float>(lo + (hi - lo) * u);
  }
  return m;
}

Matrix RandomMatrixAwayFromZero(int64_t rows, int64_t cols, uint64_t seed, float min_abs,
                                float max_abs) {
  Matrix m = RandomMatrix(rows, cols, seed, min_abs, max_abs);
  Matrix sign = RandomMatrix(rows, cols, seed ^ 0x5eed, -1.0f, 1.0f);
  for (int64_t i = 0; i < m.size(); ++i) {
    if (sign.data()[i] < 0) m.data()[i] = -m.data()[i];
  }
  return m;
}

std::string GradCheckResult::ToString() const {
  return absl::StrCat(ok ? "ok" : "MISMATCH", ": max element error ", max_error, " at index ",
                      worst, " (numeric ", numeric, ", analytic ", analytic, ")");
}

GradCheckResult CheckGradient(const std::function<double()>& objective, float* values, int64_t n,
                              const float* analytic, const GradCheckOptions& options) {
  double scale = 0;
  for (int64_t i = 0; i < n; ++i) scale = std::max(scale, std::fabs(double{analytic[i]}));
  const double floor = std::max(1e-7, options.floor_fraction * scale);
  GradCheckResult result;
  for (int64_t i = 0; i < n; ++i) {
    const float saved = values[i];
    // Central difference over the step actually representable in float.
    auto central = [&](double h) {
      const float plus = static_cast<float>(saved + h);
      const float minus = static_cast<float>(saved - h);
      values[i] = plus;
      const double f_plus = objective();
      values[i] = minus;
      const double f_minus = objective();
      values[i] = saved;
      return (f_plus - f_minus) / (double{plus} - double{minus});
    };
    const double h = options.step * std::max(1.0, std::fabs(double{saved}));
    // Richardson extrapolation cancels the h^2 truncation term: error O(h^4) + rounding.
    const double numeric = (4.0 * central(0.5 * h) - central(h)) / 3.0;
    const double a = analytic[i];
    const double err = std::fabs(numeric - a) / std::max({std::fabs(numeric), std::fabs(a), floor});
    if (err > result.max_error || result.worst < 0) {
      result.max_error = err;
      result.worst = i;
      result.numeric = numeric;
      result.analytic = a;
    }
  }
  result.ok = result.max_error <= options.rel_tol;
  return result;
}

double Dot(ConstMatrixMap a, ConstMatrixMap b) {
  double s = 0;
  for (int64_t i = 0; i < a.size(); ++i) s += double{a.data()[i]} * double{b.data()[i]};
  return s;
}

LayerRun RunLayer(const Layer& layer, const std::vector<Tensor>& params, const Matrix& x,
                  const Matrix& dy, bool want_dx, Stash stash) {
  LayerRun run;
  run.stash = std::move(stash);
  run.y.resize(x.rows(), layer.out_features());
  layer.Forward(params, AsConstMap(x), AsMap(run.y), &run.stash);
  run.dx.resize(want_dx ? x.rows() : 0, layer.in_features());
  layer.BackwardInput(params, AsConstMap(x), AsConstMap(dy), &run.stash, AsMap(run.dx));
  run.grads.resize(params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    run.grads[i].shape = params[i].shape;
    run.grads[i].data.assign(params[i].data.size(), 0.0f);
  }
  layer.BackwardWeight(params, AsConstMap(x), AsConstMap(dy), run.stash, absl::MakeSpan(run.grads));
  return run;
}

void ExpectLayerGradientsMatch(const Layer& layer, std::vector<Tensor> params, Matrix x,
                               const Matrix& upstream, bool check_input,
                               const GradCheckOptions& options) {
  const LayerRun run = RunLayer(layer, params, x, upstream, check_input);
  Matrix y(x.rows(), layer.out_features());
  Stash stash;
  auto objective = [&]() {
    layer.Forward(params, AsConstMap(x), AsMap(y), &stash);
    return Dot(AsConstMap(y), AsConstMap(upstream));
  };
  if (check_input) {
    const GradCheckResult r = CheckGradient(objective, x.data(), x.size(), run.dx.data(), options);
    EXPECT_TRUE(r.ok) << layer.kind() << " input gradient: " << r.ToString();
    if (Verbose()) std::cout << layer.kind() << " input: " << r.ToString() << "\n";
  }
  const std::vector<ParamSpec> specs = layer.params();
  for (size_t i = 0; i < params.size(); ++i) {
    const GradCheckResult r =
        CheckGradient(objective, params[i].data.data(), static_cast<int64_t>(params[i].data.size()),
                      run.grads[i].data.data(), options);
    EXPECT_TRUE(r.ok) << layer.kind() << " gradient of " << specs[i].name << ": " << r.ToString();
    if (Verbose())
      std::cout << layer.kind() << " " << specs[i].name << ": " << r.ToString() << "\n";
  }
}

float MaxAbs(const std::vector<float>& v) {
  float m = 0;
  for (float x : v) m = std::max(m, std::fabs(x));
  return m;
}

bool BitwiseEqual(ConstMatrixMap a, ConstMatrixMap b) {
  return a.rows() == b.rows() && a.cols() == b.cols() &&
         (a.size() == 0 ||
          std::memcmp(a.data(), b.data(), sizeof(float) * static_cast<size_t>(a.size())) == 0);
}

bool BitwiseEqual(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), sizeof(float) * a.size()) == 0);
}

namespace {

// A float buffer whose first element sits 4 bytes past a 64-byte boundary.
class MisalignedBuffer {
 public:
  explicit MisalignedBuffer(int64_t n) : storage_(static_cast<size_t>(n) + 32) {
    const auto addr = reinterpret_cast<uintptr_t>(storage_.data());
    const size_t skip = ((64 - addr % 64) % 64) / sizeof(float) + 1;
    data_ = storage_.data() + skip;
  }
  float* data() { return data_; }

 private:
  std::vector<float> storage_;
  float* data_;
};

}  // namespace

void ExpectBitwiseStableUnderRealignment(const Layer& layer, const std::vector<Tensor>& params,
                                         const Matrix& x, const Matrix& dy) {
  const LayerRun ref = RunLayer(layer, params, x, dy);
  const LayerRun again = RunLayer(layer, params, x, dy);
  EXPECT_TRUE(BitwiseEqual(AsConstMap(ref.y), AsConstMap(again.y))) << layer.kind() << ": y";
  EXPECT_TRUE(BitwiseEqual(AsConstMap(ref.dx), AsConstMap(again.dx))) << layer.kind() << ": dx";

  const int64_t rows = x.rows();
  MisalignedBuffer xb(x.size()), dyb(dy.size()), yb(rows * layer.out_features()),
      dxb(rows * layer.in_features());
  std::copy(x.data(), x.data() + x.size(), xb.data());
  std::copy(dy.data(), dy.data() + dy.size(), dyb.data());
  ConstMatrixMap xm(xb.data(), rows, x.cols());
  ConstMatrixMap dym(dyb.data(), rows, dy.cols());
  MatrixMap ym(yb.data(), rows, layer.out_features());
  MatrixMap dxm(dxb.data(), rows, layer.in_features());
  Stash stash;
  layer.Forward(params, xm, ym, &stash);
  layer.BackwardInput(params, xm, dym, &stash, dxm);
  std::vector<Tensor> grads(params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    grads[i].shape = params[i].shape;
    grads[i].data.assign(params[i].data.size(), 0.0f);
  }
  layer.BackwardWeight(params, xm, dym, stash, absl::MakeSpan(grads));
  EXPECT_TRUE(BitwiseEqual(AsConstMap(ref.y), Const(ym)))
      << layer.kind() << ": y after realignment";
  EXPECT_TRUE(BitwiseEqual(AsConstMap(ref.dx), Const(dxm)))
      << layer.kind() << ": dx after realignment";
  const std::vector<ParamSpec> specs = layer.params();
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_TRUE(BitwiseEqual(ref.grads[i].data, again.grads[i].data))
        << layer.kind() << ": repeat gradient of " << specs[i].name;
    EXPECT_TRUE(BitwiseEqual(ref.grads[i].data, grads[i].data))
        << layer.kind() << ": gradient of " << specs[i].name << " after realignment";
  }
}

void ExpectBitwiseRepeatableForEachThreadCount(const Layer& layer,
                                               const std::vector<Tensor>& params, const Matrix& x,
                                               const Matrix& dy) {
  const int saved = Eigen::nbThreads();
  for (int threads : {1, 2}) {
    Eigen::setNbThreads(threads);
    const LayerRun a = RunLayer(layer, params, x, dy);
    const LayerRun b = RunLayer(layer, params, x, dy);
    EXPECT_TRUE(BitwiseEqual(AsConstMap(a.y), AsConstMap(b.y))) << threads;
    EXPECT_TRUE(BitwiseEqual(AsConstMap(a.dx), AsConstMap(b.dx))) << threads;
    for (size_t i = 0; i < params.size(); ++i) {
      EXPECT_TRUE(BitwiseEqual(a.grads[i].data, b.grads[i].data)) << threads << " " << i;
    }
  }
  Eigen::setNbThreads(saved);
}

void ExpectNanStashGivesTheBitsOfAnEmptyOne(const Layer& layer, const std::vector<Tensor>& params,
                                            const Matrix& x, const Matrix& dy) {
  const LayerRun want = RunLayer(layer, params, x, dy);
  Stash nan;
  nan.data.resize(want.stash.data.size());
  std::fill(nan.data.begin(), nan.data.end(), std::numeric_limits<float>::quiet_NaN());
  const LayerRun got = RunLayer(layer, params, x, dy, /*want_dx=*/true, std::move(nan));
  EXPECT_TRUE(BitwiseEqual(AsConstMap(got.y), AsConstMap(want.y)));
  EXPECT_TRUE(BitwiseEqual(AsConstMap(got.dx), AsConstMap(want.dx)));
  for (size_t i = 0; i < params.size(); ++i) {
    EXPECT_TRUE(BitwiseEqual(got.grads[i].data, want.grads[i].data)) << layer.params()[i].name;
  }
}

Matrix FullForward(const Layer& layer, const std::vector<Tensor>& params, const Matrix& x) {
  Matrix y(x.rows(), layer.out_features());
  Stash stash;
  layer.Forward(params, AsConstMap(x), AsMap(y), &stash);
  return y;
}

Matrix IncrementalForward(const Layer& layer, const std::vector<Tensor>& params, const Matrix& x,
                          const std::vector<int64_t>& chunks, IncrementalState* state) {
  Matrix y(x.rows(), layer.out_features());
  Stash scratch;
  int64_t position = 0;
  for (const int64_t n : chunks) {
    EXPECT_EQ(state->positions(), position);
    layer.ForwardIncremental(params, position,
                             ConstMatrixMap(x.data() + position * x.cols(), n, x.cols()), state,
                             &scratch, MatrixMap(y.data() + position * y.cols(), n, y.cols()));
    position += n;
  }
  EXPECT_EQ(position, x.rows());
  EXPECT_EQ(state->positions(), position);
  return y;
}

double MaxRelativeError(const Matrix& a, const Matrix& b) {
  double worst = 0;
  for (int64_t i = 0; i < a.size(); ++i) {
    const double d = std::abs(static_cast<double>(a.data()[i]) - b.data()[i]);
    worst = std::max(worst, d / (std::abs(static_cast<double>(b.data()[i])) + 1.0));
  }
  return worst;
}

}  // namespace pipetrain::math::testing
