#include "common/math/llama_block.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <memory>

#include "common/math/det_math.h"
#include "common/math/init.h"
#include "common/math/linear.h"
#include "common/math/packed_gemm.h"
#include "common/math/rms_norm.h"

namespace pipetrain::math {
namespace {

enum Param : int { kNorm1W = 0, kQW, kKW, kVW, kOW, kNorm2W, kGateW, kUpW, kDownW, kNumParams };

constexpr int64_t kRegionAlign = 16;  // floats (64 bytes).

// Rough FLOPs per element (documented in docs/numerics.md).
constexpr double kRopeFlopsPerElement = 3;           // two multiplies and an add
constexpr double kSwiGluForwardFlopsPerElement = 8;  // exp (~4), add, divide, 2 multiplies
constexpr double kSwiGluBackwardFlopsPerElement = 12;

int64_t AlignUp(int64_t n) { return (n + kRegionAlign - 1) / kRegionAlign * kRegionAlign; }

ConstMatrixMap AsConst(const MatrixMap& m) { return ConstMatrixMap(m.data(), m.rows(), m.cols()); }

// The SwiGLU passes: silu(g) = g sigmoid(g), sigmoid(g) = 1 / (1 + e^-g) in double (e^-g in float,
// PortableExpFloat), rounded to float; its derivative s (1 + g (1 - s)), s = sigmoid(g), rounded to
// float. Elements per chunk: their exponentials go through PortableExpFloatArray from a buffer of
// this many floats on the stack.
constexpr int64_t kSwiGluChunk = 256;

// e[i] = PortableExpFloat(-g[i]) for i < len.
void NegExpChunk(const float* g, int64_t len, float* e) {
  for (int64_t i = 0; i < len; ++i) e[i] = -g[i];
  PortableExpFloatArray(e, len, e);
}

// m = silu(g) u over n elements; bitwise Silu(g[i]) * u[i].
void SwiGluForward(const float* g, const float* u, int64_t n, float* m) {
  float e[kSwiGluChunk];
  for (int64_t start = 0; start < n; start += kSwiGluChunk) {
    const int64_t len = std::min(kSwiGluChunk, n - start);
    NegExpChunk(g + start, len, e);
    for (int64_t i = 0; i < len; ++i) {
      const double gd = g[start + i];
      m[start + i] = static_cast<float>(gd * (1.0 / (1.0 + e[i]))) * u[start + i];
    }
  }
}

// Given dm (in du): dg = dm u silu'(g) and du = dm silu(g), bitwise SiluGrad's and Silu's.
void SwiGluBackward(const float* g, const float* u, int64_t n, float* dg, float* du) {
  float e[kSwiGluChunk];
  for (int64_t start = 0; start < n; start += kSwiGluChunk) {
    const int64_t len = std::min(kSwiGluChunk, n - start);
    NegExpChunk(g + start, len, e);
    for (int64_t i = 0; i < len; ++i) {
      const int64_t at = start + i;
      const double gd = g[at];
      const double sig = 1.0 / (1.0 + e[i]);
      const float dm = du[at];
      dg[at] = dm * u[at] * static_cast<float>(sig * (1.0 + gd * (1.0 - sig)));
      du[at] = dm * static_cast<float>(gd * sig);
    }
  }
}

// The weights a LlamaBlockParamCache packs, in its arrays' order.
constexpr int kLlamaPackedWeights[] = {kQW, kKW, kVW, kOW, kGateW, kUpW, kDownW};
constexpr int kLlamaNumPacked = 7;

// Each matrix of kLlamaPackedWeights packed for y = x W^T, and for dx = dy W where that product
// assigns (attn.o, attn.q, mlp.gate, mlp.down; the accumulating ones stay unpacked).
class LlamaBlockParamCache final : public ParamCache {
 public:
  void ParamsChanged() override {
    for (int i = 0; i < kLlamaNumPacked; ++i) {
      forward[i].Invalidate();
      backward_input[i].Invalidate();
    }
  }
  void Refresh(absl::Span<const Tensor> params) override {
    for (int i = 0; i < kLlamaNumPacked; ++i) {
      const Tensor& w = params[kLlamaPackedWeights[i]];
      const ConstMatrixMap m(w.data.data(), w.shape[0], w.shape[1]);
      RepackXWt(m, &forward[i]);
      RepackDyW(m, &backward_input[i]);  // nothing for the weights never packed for it
    }
  }
  int64_t bytes() const override {
    int64_t total = 0;
    for (int i = 0; i < kLlamaNumPacked; ++i) {
      total += forward[i].bytes() + backward_input[i].bytes();
    }
    return total;
  }

  PackedWeight forward[kLlamaNumPacked];
  PackedWeight backward_input[kLlamaNumPacked];
};

// The packing of params[param] in `cache` (null: none) for its forward or input-gradient product.
PackedWeight* LlamaPacked(ParamCache* cache, int param, bool forward) {
  if (cache == nullptr) return nullptr;
  auto* c = static_cast<LlamaBlockParamCache*>(cache);
  for (int i = 0; i < kLlamaNumPacked; ++i) {
    if (kLlamaPackedWeights[i] == param) return forward ? &c->forward[i] : &c->backward_input[i];
  }
  return nullptr;
}

}  // namespace

LlamaBlock::LlamaBlock(const LlamaBlockConfig& config)
    : config_(config),
      head_dim_(config.heads > 0 ? config.dim / config.heads : 0),
      kv_dim_(config.kv_heads * head_dim_),
      shape_{config.heads, config.kv_heads, head_dim_, config.context},
      rope_(head_dim_, config.context, config.rope_theta) {
  assert(config_.dim > 0 && config_.heads > 0 && config_.kv_heads > 0 && config_.context > 0 &&
         config_.hidden > 0 && config_.dim % config_.heads == 0 &&
         config_.heads % config_.kv_heads == 0 && head_dim_ % 2 == 0 && config_.norm_eps > 0);
}

std::vector<ParamSpec> LlamaBlock::params() const {
  const int64_t d = config_.dim;
  const int64_t hid = config_.hidden;
  return {
      {"attn_norm.weight", {d}},       {"attn.q.weight", {d, d}},   {"attn.k.weight", {kv_dim_, d}},
      {"attn.v.weight", {kv_dim_, d}}, {"attn.o.weight", {d, d}},   {"mlp_norm.weight", {d}},
      {"mlp.gate.weight", {hid, d}},   {"mlp.up.weight", {hid, d}}, {"mlp.down.weight", {d, hid}}};
}

void LlamaBlock::Init(uint64_t seed, int64_t layer_index, std::vector<Tensor>* params) const {
  AllocateParams(this->params(), params);
  FillConstant(1.0f, &(*params)[kNorm1W]);
  FillConstant(1.0f, &(*params)[kNorm2W]);
  for (int p : {kQW, kKW, kVW, kOW, kGateW, kUpW, kDownW}) {
    FillNormal(seed, layer_index, p, 0.0, 0.02, &(*params)[p]);
  }
}

LlamaBlock::Layout LlamaBlock::MakeLayout(int64_t rows) const {
  const int64_t n = rows;
  const int64_t d = config_.dim;
  const int64_t hid = config_.hidden;
  Layout l;
  int64_t at = 0;
  auto take = [&at](int64_t size) {
    const int64_t start = at;
    at += AlignUp(size);
    return start;
  };
  l.rstd1 = take(n);
  l.a = take(n * d);
  l.q = take(n * d);
  l.k = take(n * kv_dim_);
  l.v = take(n * kv_dim_);
  l.att = take(GqaProbabilityFloats(shape_, n));
  l.o = take(n * d);
  l.h = take(n * d);
  l.rstd2 = take(n);
  l.b = take(n * d);
  l.g = take(n * hid);
  l.u = take(n * hid);
  l.m = take(n * hid);
  l.dg = take(n * hid);
  l.du = take(n * hid);
  l.dh = take(n * d);
  l.db = take(n * d);
  l.dq = take(n * d);
  l.dk = take(n * kv_dim_);
  l.dv = take(n * kv_dim_);
  l.da = take(n * d);
  l.scratch = take(config_.context * config_.context);
  l.total = at;
  return l;
}

int64_t LlamaBlock::StashBytes(int64_t rows) const {
  return MakeLayout(rows).total * static_cast<int64_t>(sizeof(float));
}

FlopCount LlamaBlock::Flops(int64_t rows) const {
  const double n = static_cast<double>(rows);
  const double d = static_cast<double>(config_.dim);
  const double kvd = static_cast<double>(kv_dim_);
  const double hid = static_cast<double>(config_.hidden);
  // Keys per query row the causal products compute (T when T <= kCausalBlock).
  const double keys = CausalScoreEntries(config_.context) / static_cast<double>(config_.context);
  const double scores = n * static_cast<double>(config_.heads) * keys;  // samples * H * entries
  // Weight GEMMs: q, o (d x d), k, v (K hd x d), gate, up, down (hidden x d).
  const double weight_gemm = 2.0 * n * (2.0 * d * d + 2.0 * d * kvd + 3.0 * d * hid);
  const double attn_gemm = 2.0 * n * keys * d;  // one causal product per sample, all heads
  const double rope = kRopeFlopsPerElement * n * (d + kvd);
  FlopCount f;
  f.forward = weight_gemm + 2.0 * attn_gemm + 2.0 * kRmsNormForwardFlopsPerElement * n * d +
              kGqaSoftmaxForwardFlopsPerScore * scores + rope +
              kSwiGluForwardFlopsPerElement * n * hid + 2.0 * n * d;  // residuals
  f.backward_input =
      weight_gemm + 4.0 * attn_gemm + 2.0 * (kRmsNormBackwardInputFlopsPerElement + 1.0) * n * d +
      kGqaSoftmaxBackwardFlopsPerScore * scores + rope + kSwiGluBackwardFlopsPerElement * n * hid;
  f.backward_weight = weight_gemm + 2.0 * kRmsNormBackwardWeightFlopsPerElement * n * d;
  return f;
}

void LlamaBlock::AttentionForward(absl::Span<const Tensor> params, ConstMatrixMap x,
                                  const Layout& l, float* s, ParamCache* cache) const {
  const int64_t n = x.rows();
  const int64_t d = config_.dim;
  auto w = [&params](int i, int64_t rows, int64_t cols) {
    return ConstMatrixMap(params[i].data.data(), rows, cols);
  };
  MatrixMap a(s + l.a, n, d);
  RmsNormForward(x, params[kNorm1W].data.data(), config_.norm_eps, a, s + l.rstd1);
  MatrixMap q(s + l.q, n, d);
  MatrixMap k(s + l.k, n, kv_dim_);
  MatrixMap v(s + l.v, n, kv_dim_);
  LinearForward(AsConst(a), w(kQW, d, d), nullptr, q, LlamaPacked(cache, kQW, true));
  LinearForward(AsConst(a), w(kKW, kv_dim_, d), nullptr, k, LlamaPacked(cache, kKW, true));
  LinearForward(AsConst(a), w(kVW, kv_dim_, d), nullptr, v, LlamaPacked(cache, kVW, true));
  rope_.Apply(q);
  rope_.Apply(k);
  MatrixMap o(s + l.o, n, d);
  GqaAttentionForward(shape_, AsConst(q), AsConst(k), AsConst(v), s + l.att, o);
  MatrixMap h(s + l.h, n, d);
  LinearForward(AsConst(o), w(kOW, d, d), nullptr, h, LlamaPacked(cache, kOW, true));
  h += x;
}

template <typename L>
void LlamaBlock::MlpForward(absl::Span<const Tensor> params, const L& l, float* s, MatrixMap y,
                            ParamCache* cache) const {
  const int64_t n = y.rows();
  const int64_t d = config_.dim;
  const int64_t hid = config_.hidden;
  const ConstMatrixMap h(s + l.h, n, d);
  MatrixMap b(s + l.b, n, d);
  RmsNormForward(h, params[kNorm2W].data.data(), config_.norm_eps, b, s + l.rstd2);
  MatrixMap g(s + l.g, n, hid);
  MatrixMap u(s + l.u, n, hid);
  LinearForward(AsConst(b), ConstMatrixMap(params[kGateW].data.data(), hid, d), nullptr, g,
                LlamaPacked(cache, kGateW, true));
  LinearForward(AsConst(b), ConstMatrixMap(params[kUpW].data.data(), hid, d), nullptr, u,
                LlamaPacked(cache, kUpW, true));
  float* m = s + l.m;
  SwiGluForward(g.data(), u.data(), n * hid, m);
  LinearForward(ConstMatrixMap(m, n, hid), ConstMatrixMap(params[kDownW].data.data(), d, hid),
                nullptr, y, LlamaPacked(cache, kDownW, true));
  y += h;
}

std::unique_ptr<ParamCache> LlamaBlock::NewParamCache() const {
  return std::make_unique<LlamaBlockParamCache>();
}

void LlamaBlock::Forward(absl::Span<const Tensor> params, ConstMatrixMap x, MatrixMap y,
                         Stash* stash) const {
  ForwardCached(params, nullptr, x, y, stash);
}

void LlamaBlock::BackwardInput(absl::Span<const Tensor> params, ConstMatrixMap x, ConstMatrixMap dy,
                               Stash* stash, MatrixMap dx) const {
  BackwardInputCached(params, nullptr, x, dy, stash, dx);
}

void LlamaBlock::ForwardCached(absl::Span<const Tensor> params, ParamCache* cache, ConstMatrixMap x,
                               MatrixMap y, Stash* stash) const {
  assert(x.cols() == config_.dim && y.rows() == x.rows() && y.cols() == config_.dim &&
         x.rows() % config_.context == 0 && params.size() == kNumParams);
  const Layout l = MakeLayout(x.rows());
  if (stash->data.size() != static_cast<size_t>(l.total)) {
    stash->data.resize(static_cast<size_t>(l.total));
  }
  float* s = stash->data.data();
  AttentionForward(params, x, l, s, cache);
  MlpForward(params, l, s, y, cache);
}

void LlamaBlock::MlpBackwardInput(absl::Span<const Tensor> params, ConstMatrixMap dy,
                                  const Layout& l, float* s, ParamCache* cache) const {
  const int64_t n = dy.rows();
  const int64_t d = config_.dim;
  const int64_t hid = config_.hidden;
  // dm = dy Wd (in the du region); dg = dm u silu'(g), du = dm silu(g).
  MatrixMap du(s + l.du, n, hid);
  LinearBackwardInput(dy, ConstMatrixMap(params[kDownW].data.data(), d, hid), du,
                      LlamaPacked(cache, kDownW, false));
  SwiGluBackward(s + l.g, s + l.u, n * hid, s + l.dg, du.data());
  // db = dg Wg + du Wu; dh = dy + RMSNorm2'(db).
  MatrixMap db(s + l.db, n, d);
  LinearBackwardInput(ConstMatrixMap(s + l.dg, n, hid),
                      ConstMatrixMap(params[kGateW].data.data(), hid, d), db,
                      LlamaPacked(cache, kGateW, false));
  db.noalias() += AsConst(du) * ConstMatrixMap(params[kUpW].data.data(), hid, d);
  MatrixMap dh(s + l.dh, n, d);
  dh = dy;
  RmsNormBackwardInput(ConstMatrixMap(s + l.h, n, d), AsConst(db), params[kNorm2W].data.data(),
                       s + l.rstd2, /*accumulate=*/true, dh);
}

void LlamaBlock::AttentionBackwardInput(absl::Span<const Tensor> params, int64_t rows,
                                        const Layout& l, float* s, ParamCache* cache) const {
  const int64_t n = rows;
  const int64_t d = config_.dim;
  auto w = [&params](int i, int64_t r, int64_t c) {
    return ConstMatrixMap(params[i].data.data(), r, c);
  };
  // do = dh Wo (held in the da region until da is written).
  MatrixMap dout(s + l.da, n, d);
  LinearBackwardInput(ConstMatrixMap(s + l.dh, n, d), w(kOW, d, d), dout,
                      LlamaPacked(cache, kOW, false));
  MatrixMap dq(s + l.dq, n, d);
  MatrixMap dk(s + l.dk, n, kv_dim_);
  MatrixMap dv(s + l.dv, n, kv_dim_);
  GqaAttentionBackward(shape_, ConstMatrixMap(s + l.q, n, d), ConstMatrixMap(s + l.k, n, kv_dim_),
                       ConstMatrixMap(s + l.v, n, kv_dim_), s + l.att, AsConst(dout), s + l.scratch,
                       dq, dk, dv);
  // Gradients of the pre-rotation q and k.
  rope_.ApplyTranspose(dq);
  rope_.ApplyTranspose(dk);
  // da = dq Wq + dk Wk + dv Wv (in that order).
  MatrixMap da(s + l.da, n, d);
  LinearBackwardInput(AsConst(dq), w(kQW, d, d), da, LlamaPacked(cache, kQW, false));
  da.noalias() += AsConst(dk) * w(kKW, kv_dim_, d);
  da.noalias() += AsConst(dv) * w(kVW, kv_dim_, d);
}

void LlamaBlock::BackwardInputCached(absl::Span<const Tensor> params, ParamCache* cache,
                                     ConstMatrixMap x, ConstMatrixMap dy, Stash* stash,
                                     MatrixMap dx) const {
  const int64_t n = x.rows();
  const int64_t d = config_.dim;
  const Layout l = MakeLayout(n);
  assert(stash->data.size() == static_cast<size_t>(l.total));
  float* s = stash->data.data();
  MlpBackwardInput(params, dy, l, s, cache);
  AttentionBackwardInput(params, n, l, s, cache);
  if (dx.rows() == 0) return;
  // dx = dh + RMSNorm1'(da).
  dx = ConstMatrixMap(s + l.dh, n, d);
  RmsNormBackwardInput(x, ConstMatrixMap(s + l.da, n, d), params[kNorm1W].data.data(), s + l.rstd1,
                       /*accumulate=*/true, dx);
}

void LlamaBlock::BackwardWeight(absl::Span<const Tensor> params, ConstMatrixMap x,
                                ConstMatrixMap dy, const Stash& stash,
                                absl::Span<Tensor> grads) const {
  const int64_t n = x.rows();
  const int64_t d = config_.dim;
  const int64_t hid = config_.hidden;
  const Layout l = MakeLayout(n);
  assert(stash.data.size() == static_cast<size_t>(l.total));
  const float* s = stash.data.data();
  auto g = [&grads](int i, int64_t r, int64_t c) { return MatrixMap(grads[i].data.data(), r, c); };
  LinearBackwardWeight(ConstMatrixMap(s + l.m, n, hid), dy, g(kDownW, d, hid), nullptr);
  const ConstMatrixMap b(s + l.b, n, d);
  LinearBackwardWeight(b, ConstMatrixMap(s + l.dg, n, hid), g(kGateW, hid, d), nullptr);
  LinearBackwardWeight(b, ConstMatrixMap(s + l.du, n, hid), g(kUpW, hid, d), nullptr);
  RmsNormBackwardWeight(ConstMatrixMap(s + l.h, n, d), ConstMatrixMap(s + l.db, n, d), s + l.rstd2,
                        grads[kNorm2W].data.data());
  LinearBackwardWeight(ConstMatrixMap(s + l.o, n, d), ConstMatrixMap(s + l.dh, n, d), g(kOW, d, d),
                       nullptr);
  const ConstMatrixMap a(s + l.a, n, d);
  LinearBackwardWeight(a, ConstMatrixMap(s + l.dq, n, d), g(kQW, d, d), nullptr);
  LinearBackwardWeight(a, ConstMatrixMap(s + l.dk, n, kv_dim_), g(kKW, kv_dim_, d), nullptr);
  LinearBackwardWeight(a, ConstMatrixMap(s + l.dv, n, kv_dim_), g(kVW, kv_dim_, d), nullptr);
  RmsNormBackwardWeight(x, ConstMatrixMap(s + l.da, n, d), s + l.rstd1, grads[kNorm1W].data.data());
}

}  // namespace pipetrain::math

// ---- Incremental forward (KV cache) ----

namespace pipetrain::math {
namespace {

// The rotated keys and the values of the positions one sequence has been through, [context,
// K hd] each, in the k/v projections' column order (kv head j in columns j*hd .. j*hd+hd-1).
class LlamaKvCache final : public IncrementalState {
 public:
  LlamaKvCache(int64_t context, int64_t kv_dim)
      : keys_(static_cast<size_t>(context * kv_dim)),
        values_(static_cast<size_t>(context * kv_dim)) {}

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

std::unique_ptr<IncrementalState> LlamaBlock::NewIncrementalState() const {
  return std::make_unique<LlamaKvCache>(config_.context, kv_dim_);
}

LlamaBlock::StepLayout LlamaBlock::MakeStepLayout(int64_t n, int64_t len) const {
  const int64_t d = config_.dim;
  const int64_t hid = config_.hidden;
  StepLayout l;
  int64_t at = 0;
  auto take = [&at](int64_t size) {
    const int64_t start = at;
    at += AlignUp(size);
    return start;
  };
  l.rstd1 = take(n);
  l.a = take(n * d);
  l.q = take(n * d);
  l.att = take(n * len);
  l.o = take(n * d);
  l.h = take(n * d);
  l.rstd2 = take(n);
  l.b = take(n * d);
  l.g = take(n * hid);
  l.u = take(n * hid);
  l.m = take(n * hid);
  l.total = at;
  return l;
}

void LlamaBlock::AttentionIncremental(ConstMatrixMap q, int64_t position, const float* keys,
                                      const float* values, float* att, MatrixMap out) const {
  const int64_t n = q.rows();
  const int64_t len = position + n;
  const int64_t hd = head_dim_;
  const int64_t group = config_.heads / config_.kv_heads;
  // The same scale, softmax arithmetic and products as GqaAttentionForward, on n query rows.
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(hd)));
  const ConstMatrixMap k_all(keys, len, kv_dim_);
  const ConstMatrixMap v_all(values, len, kv_dim_);
  auto head = [](ConstMatrixMap m, int64_t rows, int64_t col0, int64_t cols) {
    return ConstStridedMap(m.data() + col0, rows, cols, Eigen::OuterStride<>(m.cols()));
  };
  for (int64_t h = 0; h < config_.heads; ++h) {
    const int64_t j = h / group;
    // Row i is position position+i.
    CausalHeadForward(head(q, n, h * hd, hd), head(k_all, len, j * hd, hd),
                      head(v_all, len, j * hd, hd), position, scale, att,
                      StridedMap(out.data() + h * hd, n, hd, Eigen::OuterStride<>(out.cols())));
  }
}

void LlamaBlock::ForwardIncremental(absl::Span<const Tensor> params, int64_t position,
                                    ConstMatrixMap x, IncrementalState* state, Stash* scratch,
                                    MatrixMap y) const {
  const int64_t n = x.rows();
  const int64_t d = config_.dim;
  auto* cache = static_cast<LlamaKvCache*>(state);
  assert(cache != nullptr && cache->positions() == position && n >= 1 &&
         position + n <= config_.context && x.cols() == d && y.rows() == n && y.cols() == d &&
         params.size() == kNumParams);
  const StepLayout l = MakeStepLayout(n, position + n);
  if (scratch->data.size() < static_cast<size_t>(l.total)) {
    scratch->data.resize(static_cast<size_t>(l.total));
  }
  float* s = scratch->data.data();
  auto w = [&params](int i, int64_t rows, int64_t cols) {
    return ConstMatrixMap(params[i].data.data(), rows, cols);
  };
  // As Forward: RMSNorm1, the projections, RoPE at the rows' own positions; this call's keys
  // and values join the cache before the attention reads it.
  MatrixMap a(s + l.a, n, d);
  RmsNormForward(x, params[kNorm1W].data.data(), config_.norm_eps, a, s + l.rstd1);
  MatrixMap q(s + l.q, n, d);
  MatrixMap k(cache->keys() + position * kv_dim_, n, kv_dim_);
  MatrixMap v(cache->values() + position * kv_dim_, n, kv_dim_);
  LinearForward(AsConst(a), w(kQW, d, d), nullptr, q);
  LinearForward(AsConst(a), w(kKW, kv_dim_, d), nullptr, k);
  LinearForward(AsConst(a), w(kVW, kv_dim_, d), nullptr, v);
  rope_.ApplyFrom(q, position);
  rope_.ApplyFrom(k, position);
  cache->set_positions(position + n);
  MatrixMap o(s + l.o, n, d);
  AttentionIncremental(AsConst(q), position, cache->keys(), cache->values(), s + l.att, o);
  MatrixMap h(s + l.h, n, d);
  LinearForward(AsConst(o), w(kOW, d, d), nullptr, h);
  h += x;
  MlpForward(params, l, s, y);
}

}  // namespace pipetrain::math
