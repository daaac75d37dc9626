#include "common/math/linear.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <vector>

#include "common/math/init.h"
#include "common/math/packed_gemm.h"
#include "common/math/tree_sum.h"

namespace pipetrain::math {

void LinearForward(ConstMatrixMap x, ConstMatrixMap w, const float* b, MatrixMap y,
                   PackedWeight* packed) {
  assert(x.cols() == w.cols() && y.rows() == x.rows() && y.cols() == w.rows());
  ProductXWt(x, w, y, packed);
  if (b != nullptr) y.rowwise() += Eigen::Map<const RowVector>(b, w.rows());
}

void LinearBackwardInput(ConstMatrixMap dy, ConstMatrixMap w, MatrixMap dx, PackedWeight* packed) {
  assert(dy.cols() == w.rows() && dx.rows() == dy.rows() && dx.cols() == w.cols());
  ProductDyW(dy, w, dx, packed);
}

void LinearBackwardWeight(ConstMatrixMap x, ConstMatrixMap dy, MatrixMap gw, float* gb) {
  assert(x.rows() == dy.rows() && gw.rows() == dy.cols() && gw.cols() == x.cols());
  gw.noalias() += dy.transpose() * x;
  if (gb != nullptr) AccumulateColumnSums(dy, gb);
}

void LinearBackwardWeightMany(absl::Span<const WeightGradInputs> inputs, MatrixMap gw, float* gb) {
  std::vector<DyTxTerm> terms;
  terms.reserve(inputs.size());
  for (const WeightGradInputs& in : inputs) {
    assert(in.x.rows() == in.dy.rows() && gw.rows() == in.dy.cols() && gw.cols() == in.x.cols());
    terms.push_back({in.dy, in.x});
  }
  AccumulateDyTx(terms, gw);
  // gw and gb are separate sums: each still receives the micro-batches in order.
  if (gb != nullptr) {
    for (const WeightGradInputs& in : inputs) AccumulateColumnSums(in.dy, gb);
  }
}

bool LinearBackwardWeightNode(absl::Span<const WeightGradInputs> inputs, int64_t leaf_size,
                              MatrixMap gw, float* gb) {
  std::vector<DyTxTerm> terms;
  terms.reserve(inputs.size());
  for (const WeightGradInputs& in : inputs) {
    assert(in.x.rows() == in.dy.rows() && gw.rows() == in.dy.cols() && gw.cols() == in.x.cols());
    terms.push_back({in.dy, in.x});
  }
  if (!AccumulateDyTxNode(terms, leaf_size, gw)) return false;
  if (gb == nullptr) return true;
  // The bias's tree on `out`-float slots: a leaf is its micro-batches' column sums added to zeros.
  const int64_t leaves = static_cast<int64_t>(inputs.size()) / leaf_size;
  const size_t out = static_cast<size_t>(gw.rows());
  std::vector<float> slots(static_cast<size_t>(TreeSlots(leaves)) * out);
  auto slot = [&](int s) { return absl::MakeSpan(slots.data() + s * out, out); };
  EvaluateTree(
      leaves,
      [&](int64_t j, int s) {
        std::fill(slot(s).begin(), slot(s).end(), 0.0f);
        for (int64_t t = j * leaf_size; t < (j + 1) * leaf_size; ++t) {
          AccumulateColumnSums(inputs[t].dy, slot(s).data());
        }
      },
      [](int64_t, int) { return false; }, [&](int s) { AddInTreeOrder(slot(s + 1), slot(s)); });
  AddInTreeOrder(slot(0), absl::MakeSpan(gb, out));
  return true;
}

void AccumulateColumnSums(ConstMatrixMap dy, float* g) {
  Eigen::Map<RowVector> acc(g, dy.cols());
  for (Eigen::Index r = 0; r < dy.rows(); ++r) acc += dy.row(r);
}

double LinearGemmFlops(int64_t rows, int64_t in, int64_t out) {
  return 2.0 * static_cast<double>(rows) * static_cast<double>(in) * static_cast<double>(out);
}

namespace {

// The weight packed for y = x W^T and for dx = dy W.
class LinearParamCache final : public ParamCache {
 public:
  void ParamsChanged() override {
    forward.Invalidate();
    backward_input.Invalidate();
  }
  void Refresh(absl::Span<const Tensor> params) override {
    const ConstMatrixMap w(params[0].data.data(), params[0].shape[0], params[0].shape[1]);
    RepackXWt(w, &forward);
    RepackDyW(w, &backward_input);
  }
  int64_t bytes() const override { return forward.bytes() + backward_input.bytes(); }

  PackedWeight forward;
  PackedWeight backward_input;
};

}  // namespace

Linear::Linear(int64_t in_features, int64_t out_features, bool bias)
    : in_(in_features), out_(out_features), bias_(bias) {
  assert(in_ > 0 && out_ > 0);
}

std::vector<ParamSpec> Linear::params() const {
  std::vector<ParamSpec> specs = {{"weight", {out_, in_}}};
  if (bias_) specs.push_back({"bias", {out_}});
  return specs;
}

void Linear::Init(uint64_t seed, int64_t layer_index, std::vector<Tensor>* params) const {
  AllocateParams(this->params(), params);
  const double bound = 1.0 / std::sqrt(static_cast<double>(in_));
  FillUniform(seed, layer_index, 0, -bound, bound, &(*params)[0]);
  if (bias_) FillUniform(seed, layer_index, 1, -bound, bound, &(*params)[1]);
}

FlopCount Linear::Flops(int64_t rows) const {
  const double gemm = LinearGemmFlops(rows, in_, out_);
  const double bias = bias_ ? static_cast<double>(rows) * static_cast<double>(out_) : 0.0;
  return {gemm + bias, gemm, gemm + bias};
}

void Linear::Forward(absl::Span<const Tensor> params, ConstMatrixMap x, MatrixMap y,
                     Stash* stash) const {
  ForwardCached(params, nullptr, x, y, stash);
}

void Linear::BackwardInput(absl::Span<const Tensor> params, ConstMatrixMap x, ConstMatrixMap dy,
                           Stash* stash, MatrixMap dx) const {
  BackwardInputCached(params, nullptr, x, dy, stash, dx);
}

void Linear::BackwardWeight(absl::Span<const Tensor> params, ConstMatrixMap x, ConstMatrixMap dy,
                            const Stash& stash, absl::Span<Tensor> grads) const {
  LinearBackwardWeight(x, dy, MatrixMap(grads[0].data.data(), out_, in_),
                       bias_ ? grads[1].data.data() : nullptr);
}

void Linear::BackwardWeightMany(absl::Span<const Tensor> params,
                                absl::Span<const WeightGradInputs> inputs,
                                absl::Span<Tensor> grads) const {
  LinearBackwardWeightMany(inputs, MatrixMap(grads[0].data.data(), out_, in_),
                           bias_ ? grads[1].data.data() : nullptr);
}

bool Linear::BackwardWeightNode(absl::Span<const Tensor> params,
                                absl::Span<const WeightGradInputs> inputs, int64_t leaf_size,
                                absl::Span<Tensor> grads) const {
  return LinearBackwardWeightNode(inputs, leaf_size, MatrixMap(grads[0].data.data(), out_, in_),
                                  bias_ ? grads[1].data.data() : nullptr);
}

std::unique_ptr<ParamCache> Linear::NewParamCache() const {
  return std::make_unique<LinearParamCache>();
}

void Linear::ForwardCached(absl::Span<const Tensor> params, ParamCache* cache, ConstMatrixMap x,
                           MatrixMap y, Stash* stash) const {
  stash->data.clear();
  LinearForward(x, ConstMatrixMap(params[0].data.data(), out_, in_),
                bias_ ? params[1].data.data() : nullptr, y,
                cache != nullptr ? &static_cast<LinearParamCache*>(cache)->forward : nullptr);
}

void Linear::BackwardInputCached(absl::Span<const Tensor> params, ParamCache* cache,
                                 ConstMatrixMap x, ConstMatrixMap dy, Stash* stash,
                                 MatrixMap dx) const {
  if (dx.rows() == 0) return;
  LinearBackwardInput(
      dy, ConstMatrixMap(params[0].data.data(), out_, in_), dx,
      cache != nullptr ? &static_cast<LinearParamCache*>(cache)->backward_input : nullptr);
}

}  // namespace pipetrain::math
