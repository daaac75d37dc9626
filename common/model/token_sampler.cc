#include "common/model/token_sampler.h"

#include <algorithm>
#include <cassert>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "common/math/det_math.h"

namespace pipetrain::model {

absl::Status CheckSamplingOptions(const SamplingOptions& options) {
  if (!std::isfinite(options.temperature) || options.temperature < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "temperature must be a finite number >= 0 (0: greedy), got ", options.temperature));
  }
  if (options.top_k < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("top-k must be >= 0 (0: the whole vocabulary), got ", options.top_k));
  }
  return absl::OkStatus();
}

int64_t ArgMax(absl::Span<const float> logits) {
  assert(!logits.empty());
  int64_t best = 0;
  for (int64_t i = 1; i < static_cast<int64_t>(logits.size()); ++i) {
    if (logits[i] > logits[best]) best = i;
  }
  return best;
}

TokenSampler::TokenSampler(const SamplingOptions& options)
    : options_(options), rng_(options.seed) {}

double TokenSampler::Uniform() {
  return static_cast<double>(rng_() >> 11) * 0x1.0p-53;  // 53 random bits: exact in a double.
}

int64_t TokenSampler::Next(absl::Span<const float> logits) {
  const int64_t vocab = static_cast<int64_t>(logits.size());
  if (options_.temperature == 0 || options_.top_k == 1) return ArgMax(logits);
  const int64_t k = options_.top_k == 0 ? vocab : std::min(options_.top_k, vocab);
  order_.clear();
  for (int64_t i = 0; i < vocab; ++i) order_.emplace_back(logits[i], i);
  // Largest logit first, ties by increasing id: a total order, so the candidates are unique.
  auto before = [](const std::pair<float, int64_t>& a, const std::pair<float, int64_t>& b) {
    return a.first != b.first ? a.first > b.first : a.second < b.second;
  };
  std::partial_sort(order_.begin(), order_.begin() + k, order_.end(), before);
  const double z_max = order_[0].first;
  weights_.resize(static_cast<size_t>(k));
  double total = 0;
  for (int64_t i = 0; i < k; ++i) {
    weights_[i] = math::PortableExp((order_[i].first - z_max) / options_.temperature);
    total += weights_[i];
  }
  const double target = Uniform() * total;
  double running = 0;
  for (int64_t i = 0; i < k; ++i) {
    running += weights_[i];
    if (running > target) return order_[i].second;
  }
  return order_[k - 1].second;
}

}  // namespace pipetrain::model
