#include "common/math/embedding.h"

#include <cassert>

#include "common/math/init.h"

namespace pipetrain::math {

Embedding::Embedding(int64_t vocab_size, int64_t dim, int64_t context, bool position_table)
    : vocab_(vocab_size), dim_(dim), context_(context), position_table_(position_table) {
  assert(vocab_ > 0 && dim_ > 0 && context_ > 0);
}

std::vector<ParamSpec> Embedding::params() const {
  if (!position_table_) return {{"token.weight", {vocab_, dim_}}};
  return {{"token.weight", {vocab_, dim_}}, {"position.weight", {context_, dim_}}};
}

void Embedding::Init(uint64_t seed, int64_t layer_index, std::vector<Tensor>* params) const {
  AllocateParams(this->params(), params);
  FillNormal(seed, layer_index, 0, 0.0, 0.02, &(*params)[0]);
  if (position_table_) FillNormal(seed, layer_index, 1, 0.0, 0.01, &(*params)[1]);
}

FlopCount Embedding::Flops(int64_t rows) const {
  const double n = static_cast<double>(rows) * static_cast<double>(dim_);
  return {n, 0.0, position_table_ ? 2.0 * n : n};
}

void Embedding::Forward(absl::Span<const Tensor> params, ConstMatrixMap x, MatrixMap y,
                        Stash* stash) const {
  assert(x.cols() == 1 && y.rows() == x.rows() && y.cols() == dim_ && x.rows() % context_ == 0);
  stash->data.clear();
  const float* tok = params[0].data.data();
  const float* pos = position_table_ ? params[1].data.data() : nullptr;
  for (int64_t r = 0; r < x.rows(); ++r) {
    const int64_t id = static_cast<int64_t>(x(r, 0));
    assert(id >= 0 && id < vocab_);
    const float* t = tok + id * dim_;
    float* yr = y.data() + r * dim_;
    if (pos == nullptr) {
      for (int64_t j = 0; j < dim_; ++j) yr[j] = t[j];
      continue;
    }
    const float* p = pos + (r % context_) * dim_;
    for (int64_t j = 0; j < dim_; ++j) yr[j] = t[j] + p[j];
  }
}

void Embedding::ForwardIncremental(absl::Span<const Tensor> params, int64_t position,
                                   ConstMatrixMap x, IncrementalState* state, Stash* scratch,
                                   MatrixMap y) const {
  assert(x.cols() == 1 && y.rows() == x.rows() && y.cols() == dim_ && position >= 0 &&
         position + x.rows() <= context_);
  const float* tok = params[0].data.data();
  const float* pos = position_table_ ? params[1].data.data() : nullptr;
  for (int64_t r = 0; r < x.rows(); ++r) {
    const int64_t id = static_cast<int64_t>(x(r, 0));
    assert(id >= 0 && id < vocab_);
    const float* t = tok + id * dim_;
    float* yr = y.data() + r * dim_;
    if (pos == nullptr) {  // positions come later (rotary, in the attention).
      for (int64_t j = 0; j < dim_; ++j) yr[j] = t[j];
      continue;
    }
    const float* p = pos + (position + r) * dim_;
    for (int64_t j = 0; j < dim_; ++j) yr[j] = t[j] + p[j];
  }
}

void Embedding::BackwardInput(absl::Span<const Tensor> params, ConstMatrixMap x, ConstMatrixMap dy,
                              Stash* stash, MatrixMap dx) const {
  if (dx.rows() == 0) return;
  dx.setZero();
}

void Embedding::BackwardWeight(absl::Span<const Tensor> params, ConstMatrixMap x, ConstMatrixMap dy,
                               const Stash& stash, absl::Span<Tensor> grads) const {
  float* gtok = grads[0].data.data();
  float* gpos = position_table_ ? grads[1].data.data() : nullptr;
  for (int64_t r = 0; r < x.rows(); ++r) {
    const int64_t id = static_cast<int64_t>(x(r, 0));
    const float* dyr = dy.data() + r * dim_;
    float* t = gtok + id * dim_;
    for (int64_t j = 0; j < dim_; ++j) t[j] += dyr[j];
    if (gpos == nullptr) continue;
    float* p = gpos + (r % context_) * dim_;
    for (int64_t j = 0; j < dim_; ++j) p[j] += dyr[j];
  }
}

}  // namespace pipetrain::math
