#include "common/math/transformer_block.h"

#include <algorithm>
#include <cassert>
#include <cmath>

#include "common/math/activations.h"
#include "common/math/gqa_attention.h"
#include "common/math/init.h"
#include "common/math/layer_norm.h"
#include "common/math/linear.h"
#include "common/math/packed_gemm.h"

namespace pipetrain::math {
namespace {

enum Param : int {
  kLn1W = 0,
  kLn1B,
  kQkvW,
  kQkvB,
  kProjW,
  kProjB,
  kLn2W,
  kLn2B,
  kFcW,
  kFcB,
  kFc2W,
  kFc2B,
  kNumParams
};

constexpr float kLnEps = 1e-5f;
constexpr int64_t kRegionAlign = 16;  // floats (64 bytes).

// Rough FLOPs per attention score entry (documented in docs/numerics.md).
constexpr double kSoftmaxForwardFlopsPerScore = 8;   // scale, max, exp (~4), sum, divide
constexpr double kSoftmaxBackwardFlopsPerScore = 5;  // dot, subtract, two multiplies, scale

int64_t AlignUp(int64_t n) { return (n + kRegionAlign - 1) / kRegionAlign * kRegionAlign; }

ConstMatrixMap AsConst(const MatrixMap& m) { return ConstMatrixMap(m.data(), m.rows(), m.cols()); }

}  // namespace

TransformerBlock::TransformerBlock(int64_t dim, int64_t heads, int64_t context, int64_t mlp_ratio)
    : dim_(dim),
      heads_(heads),
      context_(context),
      hidden_(mlp_ratio * dim),
      head_dim_(heads > 0 ? dim / heads : 0) {
  assert(dim_ > 0 && heads_ > 0 && context_ > 0 && mlp_ratio > 0 && dim_ % heads_ == 0);
}

std::vector<ParamSpec> TransformerBlock::params() const {
  const int64_t d = dim_;
  const int64_t h = hidden_;
  return {{"ln1.weight", {d}},
          {"ln1.bias", {d}},
          {"attn.qkv.weight", {3 * d, d}},
          {"attn.qkv.bias", {3 * d}},
          {"attn.proj.weight", {d, d}},
          {"attn.proj.bias", {d}},
          {"ln2.weight", {d}},
          {"ln2.bias", {d}},
          {"mlp.fc.weight", {h, d}},
          {"mlp.fc.bias", {h}},
          {"mlp.proj.weight", {d, h}},
          {"mlp.proj.bias", {d}}};
}

void TransformerBlock::Init(uint64_t seed, int64_t layer_index, std::vector<Tensor>* params) const {
  AllocateParams(this->params(), params);
  FillConstant(1.0f, &(*params)[kLn1W]);
  FillConstant(1.0f, &(*params)[kLn2W]);
  for (int p : {kQkvW, kProjW, kFcW, kFc2W}) {
    FillNormal(seed, layer_index, p, 0.0, 0.02, &(*params)[p]);
  }
  // Biases and LN shifts stay 0 (AllocateParams zero-fills).
}

TransformerBlock::Layout TransformerBlock::MakeLayout(int64_t rows) const {
  const int64_t n = rows;
  const int64_t d = dim_;
  const int64_t samples = rows / context_;
  Layout l;
  int64_t at = 0;
  auto take = [&at](int64_t size) {
    const int64_t start = at;
    at += AlignUp(size);
    return start;
  };
  l.mean1 = take(n);
  l.rstd1 = take(n);
  l.ln1 = take(n * d);
  l.qkv = take(n * 3 * d);
  l.att = take(samples * heads_ * context_ * context_);
  l.attn = take(n * d);
  l.h = take(n * d);
  l.mean2 = take(n);
  l.rstd2 = take(n);
  l.ln2 = take(n * d);
  l.fc = take(n * hidden_);
  l.gelu = take(n * hidden_);
  l.dfc = take(n * hidden_);
  l.dh = take(n * d);
  l.dln2 = take(n * d);
  l.dqkv = take(n * 3 * d);
  l.dln1 = take(n * d);
  l.scratch = take(context_ * context_);
  l.total = at;
  return l;
}

int64_t TransformerBlock::StashBytes(int64_t rows) const {
  return MakeLayout(rows).total * static_cast<int64_t>(sizeof(float));
}

FlopCount TransformerBlock::Flops(int64_t rows) const {
  const double n = static_cast<double>(rows);
  const double d = static_cast<double>(dim_);
  const double hid = static_cast<double>(hidden_);
  // Keys per query row the causal products compute (T when T <= kCausalBlock).
  const double keys = CausalScoreEntries(context_) / static_cast<double>(context_);
  const double scores = n * static_cast<double>(heads_) * keys;  // samples * heads * entries
  // GEMMs: weights 2 n (3d d + d d + d hid + hid d); attention 2 n keys d per causal product.
  const double weight_gemm = 2.0 * n * (4.0 * d * d + 2.0 * d * hid);
  const double attn_gemm = 2.0 * n * keys * d;
  const double biases = n * (5.0 * d + hid);
  FlopCount f;
  f.forward = weight_gemm + 2.0 * attn_gemm + biases +
              2.0 * kLayerNormForwardFlopsPerElement * n * d +
              kSoftmaxForwardFlopsPerScore * scores + kGeluForwardFlopsPerElement * n * hid +
              2.0 * n * d;  // residuals
  f.backward_input =
      weight_gemm + 4.0 * attn_gemm + 2.0 * (kLayerNormBackwardInputFlopsPerElement + 1.0) * n * d +
      kSoftmaxBackwardFlopsPerScore * scores + kGeluBackwardFlopsPerElement * n * hid;
  f.backward_weight = weight_gemm + biases + 2.0 * kLayerNormBackwardWeightFlopsPerElement * n * d;
  return f;
}

namespace {

// Columns col0 .. col0+cols-1 of rows row0 .. row0+rows-1 of m.
ConstStridedMap ColumnsOf(ConstMatrixMap m, int64_t row0, int64_t rows, int64_t col0,
                          int64_t cols) {
  return ConstStridedMap(m.data() + row0 * m.cols() + col0, rows, cols,
                         Eigen::OuterStride<>(m.cols()));
}
StridedMap ColumnsOf(MatrixMap m, int64_t row0, int64_t rows, int64_t col0, int64_t cols) {
  return StridedMap(m.data() + row0 * m.cols() + col0, rows, cols, Eigen::OuterStride<>(m.cols()));
}

}  // namespace

void TransformerBlock::AttentionForward(ConstMatrixMap qkv, float* att, MatrixMap out) const {
  const int64_t t = context_;
  const int64_t hd = head_dim_;
  const int64_t d = dim_;
  const int64_t samples = qkv.rows() / t;
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(hd)));
  for (int64_t s = 0; s < samples; ++s) {
    for (int64_t h = 0; h < heads_; ++h) {
      CausalHeadForward(ColumnsOf(qkv, s * t, t, h * hd, hd),
                        ColumnsOf(qkv, s * t, t, d + h * hd, hd),
                        ColumnsOf(qkv, s * t, t, 2 * d + h * hd, hd), 0, scale,
                        att + (s * heads_ + h) * t * t, ColumnsOf(out, s * t, t, h * hd, hd));
    }
  }
}

void TransformerBlock::AttentionBackward(ConstMatrixMap qkv, const float* att, ConstMatrixMap dout,
                                         float* scratch, MatrixMap dqkv) const {
  const int64_t t = context_;
  const int64_t hd = head_dim_;
  const int64_t d = dim_;
  const int64_t samples = qkv.rows() / t;
  const double scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(hd)));
  for (int64_t s = 0; s < samples; ++s) {
    for (int64_t h = 0; h < heads_; ++h) {
      CausalHeadBackward(
          ColumnsOf(qkv, s * t, t, h * hd, hd), ColumnsOf(qkv, s * t, t, d + h * hd, hd),
          ColumnsOf(qkv, s * t, t, 2 * d + h * hd, hd), att + (s * heads_ + h) * t * t,
          ColumnsOf(dout, s * t, t, h * hd, hd), scale, scratch, /*accumulate=*/false,
          ColumnsOf(dqkv, s * t, t, h * hd, hd), ColumnsOf(dqkv, s * t, t, d + h * hd, hd),
          ColumnsOf(dqkv, s * t, t, 2 * d + h * hd, hd));
    }
  }
}

namespace {

// The weights a TransformerBlockParamCache packs, in its arrays' order.
constexpr int kPackedWeights[] = {kQkvW, kProjW, kFcW, kFc2W};
constexpr int kNumPacked = 4;

// Each matrix of kPackedWeights packed for y = x W^T and for dx = dy W.
class TransformerBlockParamCache final : public ParamCache {
 public:
  void ParamsChanged() override {
    for (int i = 0; i < kNumPacked; ++i) {
      forward[i].Invalidate();
      backward_input[i].Invalidate();
    }
  }
  void Refresh(absl::Span<const Tensor> params) override {
    for (int i = 0; i < kNumPacked; ++i) {
      const Tensor& w = params[kPackedWeights[i]];
      const ConstMatrixMap m(w.data.data(), w.shape[0], w.shape[1]);
      RepackXWt(m, &forward[i]);
      RepackDyW(m, &backward_input[i]);
    }
  }
  int64_t bytes() const override {
    int64_t total = 0;
    for (int i = 0; i < kNumPacked; ++i) total += forward[i].bytes() + backward_input[i].bytes();
    return total;
  }

  PackedWeight forward[kNumPacked];
  PackedWeight backward_input[kNumPacked];
};

// The packing of params[param] in `cache` (null: none) for the forward or input-gradient product.
PackedWeight* PackedFor(ParamCache* cache, int param, bool forward) {
  if (cache == nullptr) return nullptr;
  auto* c = static_cast<TransformerBlockParamCache*>(cache);
  for (int i = 0; i < kNumPacked; ++i) {
    if (kPackedWeights[i] == param) return forward ? &c->forward[i] : &c->backward_input[i];
  }
  return nullptr;
}

}  // namespace

std::unique_ptr<ParamCache> TransformerBlock::NewParamCache() const {
  return std::make_unique<TransformerBlockParamCache>();
}

void TransformerBlock::Forward(absl::Span<const Tensor> params, ConstMatrixMap x, MatrixMap y,
                               Stash* stash) const {
  ForwardCached(params, nullptr, x, y, stash);
}

void TransformerBlock::BackwardInput(absl::Span<const Tensor> params, ConstMatrixMap x,
                                     ConstMatrixMap dy, Stash* stash, MatrixMap dx) const {
  BackwardInputCached(params, nullptr, x, dy, stash, dx);
}

void TransformerBlock::ForwardCached(absl::Span<const Tensor> params, ParamCache* cache,
                                     ConstMatrixMap x, MatrixMap y, Stash* stash) const {
  assert(x.cols() == dim_ && y.rows() == x.rows() && y.cols() == dim_ && x.rows() % context_ == 0 &&
         params.size() == kNumParams);
  const int64_t n = x.rows();
  const int64_t d = dim_;
  const Layout l = MakeLayout(n);
  if (stash->data.size() != static_cast<size_t>(l.total)) {
    stash->data.resize(static_cast<size_t>(l.total));
  }
  float* s = stash->data.data();
  auto p = [&params](int i) { return params[i].data.data(); };

  MatrixMap ln1(s + l.ln1, n, d);
  LayerNormForward(x, p(kLn1W), p(kLn1B), kLnEps, ln1, s + l.mean1, s + l.rstd1);
  MatrixMap qkv(s + l.qkv, n, 3 * d);
  LinearForward(AsConst(ln1), ConstMatrixMap(p(kQkvW), 3 * d, d), p(kQkvB), qkv,
                PackedFor(cache, kQkvW, true));
  MatrixMap attn(s + l.attn, n, d);
  AttentionForward(AsConst(qkv), s + l.att, attn);
  MatrixMap h(s + l.h, n, d);
  LinearForward(AsConst(attn), ConstMatrixMap(p(kProjW), d, d), p(kProjB), h,
                PackedFor(cache, kProjW, true));
  h += x;
  MatrixMap ln2(s + l.ln2, n, d);
  LayerNormForward(AsConst(h), p(kLn2W), p(kLn2B), kLnEps, ln2, s + l.mean2, s + l.rstd2);
  MatrixMap fc(s + l.fc, n, hidden_);
  LinearForward(AsConst(ln2), ConstMatrixMap(p(kFcW), hidden_, d), p(kFcB), fc,
                PackedFor(cache, kFcW, true));
  GeluForward(s + l.fc, n * hidden_, s + l.gelu);
  LinearForward(ConstMatrixMap(s + l.gelu, n, hidden_), ConstMatrixMap(p(kFc2W), d, hidden_),
                p(kFc2B), y, PackedFor(cache, kFc2W, true));
  y += h;
}

void TransformerBlock::BackwardInputCached(absl::Span<const Tensor> params, ParamCache* cache,
                                           ConstMatrixMap x, ConstMatrixMap dy, Stash* stash,
                                           MatrixMap dx) const {
  const int64_t n = x.rows();
  const int64_t d = dim_;
  const Layout l = MakeLayout(n);
  assert(stash->data.size() == static_cast<size_t>(l.total));
  float* s = stash->data.data();
  auto p = [&params](int i) { return params[i].data.data(); };

  // MLP: dfc = (dy Wfc2) * gelu'(fc); dln2 = dfc Wfc; dh = dy + LN2'(dln2).
  MatrixMap dfc(s + l.dfc, n, hidden_);
  LinearBackwardInput(dy, ConstMatrixMap(p(kFc2W), d, hidden_), dfc,
                      PackedFor(cache, kFc2W, false));
  GeluBackward(s + l.fc, s + l.dfc, n * hidden_, s + l.dfc);
  MatrixMap dln2(s + l.dln2, n, d);
  LinearBackwardInput(AsConst(dfc), ConstMatrixMap(p(kFcW), hidden_, d), dln2,
                      PackedFor(cache, kFcW, false));
  MatrixMap dh(s + l.dh, n, d);
  dh = dy;
  LayerNormBackwardInput(ConstMatrixMap(s + l.h, n, d), AsConst(dln2), p(kLn2W), s + l.mean2,
                         s + l.rstd2, /*accumulate=*/true, dh);
  // Attention: d(attn) = dh Wproj (held in the dln1 region until dln1 is written), then dqkv.
  MatrixMap dattn(s + l.dln1, n, d);
  LinearBackwardInput(AsConst(dh), ConstMatrixMap(p(kProjW), d, d), dattn,
                      PackedFor(cache, kProjW, false));
  MatrixMap dqkv(s + l.dqkv, n, 3 * d);
  AttentionBackward(ConstMatrixMap(s + l.qkv, n, 3 * d), s + l.att, AsConst(dattn), s + l.scratch,
                    dqkv);
  MatrixMap dln1(s + l.dln1, n, d);
  LinearBackwardInput(AsConst(dqkv), ConstMatrixMap(p(kQkvW), 3 * d, d), dln1,
                      PackedFor(cache, kQkvW, false));
  if (dx.rows() == 0) return;
  // dx = dh + LN1'(dln1).
  dx = dh;
  LayerNormBackwardInput(x, AsConst(dln1), p(kLn1W), s + l.mean1, s + l.rstd1, /*accumulate=*/true,
                         dx);
}

void TransformerBlock::BackwardWeight(absl::Span<const Tensor> params, ConstMatrixMap x,
                                      ConstMatrixMap dy, const Stash& stash,
                                      absl::Span<Tensor> grads) const {
  const int64_t n = x.rows();
  const int64_t d = dim_;
  const Layout l = MakeLayout(n);
  assert(stash.data.size() == static_cast<size_t>(l.total));
  const float* s = stash.data.data();
  auto g = [&grads](int i) { return grads[i].data.data(); };

  LinearBackwardWeight(ConstMatrixMap(s + l.gelu, n, hidden_), dy, MatrixMap(g(kFc2W), d, hidden_),
                       g(kFc2B));
  LinearBackwardWeight(ConstMatrixMap(s + l.ln2, n, d), ConstMatrixMap(s + l.dfc, n, hidden_),
                       MatrixMap(g(kFcW), hidden_, d), g(kFcB));
  LayerNormBackwardWeight(ConstMatrixMap(s + l.h, n, d), ConstMatrixMap(s + l.dln2, n, d),
                          s + l.mean2, s + l.rstd2, g(kLn2W), g(kLn2B));
  LinearBackwardWeight(ConstMatrixMap(s + l.attn, n, d), ConstMatrixMap(s + l.dh, n, d),
                       MatrixMap(g(kProjW), d, d), g(kProjB));
  LinearBackwardWeight(ConstMatrixMap(s + l.ln1, n, d), ConstMatrixMap(s + l.dqkv, n, 3 * d),
                       MatrixMap(g(kQkvW), 3 * d, d), g(kQkvB));
  LayerNormBackwardWeight(x, ConstMatrixMap(s + l.dln1, n, d), s + l.mean1, s + l.rstd1, g(kLn1W),
                          g(kLn1B));
}

// ---- Incremental forward (KV cache) ----

namespace {

// The keys and values of the positions one sequence has been through, [context, dim] each, in
// qkv's column order (head h in columns h*hd .. h*hd+hd-1).
class KvCache final : public IncrementalState {
 public:
  KvCache(int64_t context, int64_t dim)
      : keys_(static_cast<size_t>(context * dim)), values_(static_cast<size_t>(context * dim)) {}

  int64_t positions() const override { return positions_; }
  void Clear() override { positions_ = 0; }
  int64_t bytes() const override {
    return static_cast<int64_t>((keys_.size() + values_.size()) * sizeof(float));
  }

  float* keys() { return keys_.data(); }
  float* values() { return values_.data(); }
  void set_positions(int64_t positions) { positions_ = positions; }

 private:
  std::vector<float> keys_;
  std::vector<float> values_;
  int64_t positions_ = 0;
};

}  // namespace

std::unique_ptr<IncrementalState> TransformerBlock::NewIncrementalState() const {
  return std::make_unique<KvCache>(context_, dim_);
}

TransformerBlock::StepLayout TransformerBlock::MakeStepLayout(int64_t n, int64_t len) const {
  const int64_t d = dim_;
  StepLayout l;
  int64_t at = 0;
  auto take = [&at](int64_t size) {
    const int64_t start = at;
    at += AlignUp(size);
    return start;
  };
  l.mean1 = take(n);
  l.rstd1 = take(n);
  l.ln1 = take(n * d);
  l.qkv = take(n * 3 * d);
  l.att = take(n * len);
  l.attn = take(n * d);
  l.h = take(n * d);
  l.mean2 = take(n);
  l.rstd2 = take(n);
  l.ln2 = take(n * d);
  l.fc = take(n * hidden_);
  l.gelu = take(n * hidden_);
  l.total = at;
  return l;
}

void TransformerBlock::AttentionIncremental(ConstMatrixMap qkv, int64_t position, const float* keys,
                                            const float* values, float* att, MatrixMap out) const {
  const int64_t n = qkv.rows();
  const int64_t len = position + n;
  const int64_t hd = head_dim_;
  const int64_t d = dim_;
  // The same scale, softmax arithmetic and products as AttentionForward, on n query rows.
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(hd)));
  const ConstMatrixMap k_all(keys, len, d);
  const ConstMatrixMap v_all(values, len, d);
  for (int64_t h = 0; h < heads_; ++h) {
    // Row i is position position+i.
    CausalHeadForward(ColumnsOf(qkv, 0, n, h * hd, hd), ColumnsOf(k_all, 0, len, h * hd, hd),
                      ColumnsOf(v_all, 0, len, h * hd, hd), position, scale, att,
                      ColumnsOf(out, 0, n, h * hd, hd));
  }
}

void TransformerBlock::ForwardIncremental(absl::Span<const Tensor> params, int64_t position,
                                          ConstMatrixMap x, IncrementalState* state, Stash* scratch,
                                          MatrixMap y) const {
  const int64_t n = x.rows();
  const int64_t d = dim_;
  auto* cache = static_cast<KvCache*>(state);
  assert(cache != nullptr && cache->positions() == position && n >= 1 && position + n <= context_ &&
         x.cols() == d && y.rows() == n && y.cols() == d && params.size() == kNumParams);
  const StepLayout l = MakeStepLayout(n, position + n);
  if (scratch->data.size() < static_cast<size_t>(l.total)) {
    scratch->data.resize(static_cast<size_t>(l.total));
  }
  float* s = scratch->data.data();
  auto p = [&params](int i) { return params[i].data.data(); };

  // As Forward: LN1, the qkv projection, then this call's keys and values join the cache.
  MatrixMap ln1(s + l.ln1, n, d);
  LayerNormForward(x, p(kLn1W), p(kLn1B), kLnEps, ln1, s + l.mean1, s + l.rstd1);
  MatrixMap qkv(s + l.qkv, n, 3 * d);
  LinearForward(AsConst(ln1), ConstMatrixMap(p(kQkvW), 3 * d, d), p(kQkvB), qkv);
  MatrixMap(cache->keys() + position * d, n, d) = qkv.block(0, d, n, d);
  MatrixMap(cache->values() + position * d, n, d) = qkv.block(0, 2 * d, n, d);
  cache->set_positions(position + n);
  MatrixMap attn(s + l.attn, n, d);
  AttentionIncremental(AsConst(qkv), position, cache->keys(), cache->values(), s + l.att, attn);
  // The rest is Forward's, row by row.
  MatrixMap h(s + l.h, n, d);
  LinearForward(AsConst(attn), ConstMatrixMap(p(kProjW), d, d), p(kProjB), h);
  h += x;
  MatrixMap ln2(s + l.ln2, n, d);
  LayerNormForward(AsConst(h), p(kLn2W), p(kLn2B), kLnEps, ln2, s + l.mean2, s + l.rstd2);
  MatrixMap fc(s + l.fc, n, hidden_);
  LinearForward(AsConst(ln2), ConstMatrixMap(p(kFcW), hidden_, d), p(kFcB), fc);
  GeluForward(s + l.fc, n * hidden_, s + l.gelu);
  LinearForward(ConstMatrixMap(s + l.gelu, n, hidden_), ConstMatrixMap(p(kFc2W), d, hidden_),
                p(kFc2B), y);
  y += h;
}

}  // namespace pipetrain::math
