// Picks the next token from a language model's logits: greedy, or temperature and top-k sampling
// with one uniform draw from a seeded, portable generator (docs/inference.md, "Sampling").
#ifndef PIPETRAIN_COMMON_MODEL_TOKEN_SAMPLER_H_
#define PIPETRAIN_COMMON_MODEL_TOKEN_SAMPLER_H_

#include <cstdint>
#include <random>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/types/span.h"

namespace pipetrain::model {

struct SamplingOptions {
  // Logits are divided by it before the softmax; 0: greedy (the largest logit, the lowest token
  // id among equal ones), no random draw. Finite, >= 0. Default 1.
  double temperature = 1.0;
  // Sample only among the k largest logits (ties: lower ids first); 0: the whole vocabulary.
  // >= 0; k = 1 is greedy.
  int64_t top_k = 0;
  // Seed of the generator: the same seed, model and prompt give the same tokens.
  uint64_t seed = 0;
};

// INVALID_ARGUMENT naming the field when `options` is out of range (temperature negative or not
// finite, top_k negative).
absl::Status CheckSamplingOptions(const SamplingOptions& options);

// The sampling procedure, the same on every platform:
//   1. greedy (temperature 0 or top_k 1): the argmax, ties to the lowest id; no draw.
//   2. candidates: the token ids ordered by logit, largest first, ties by increasing id; the first
//      top_k of them (all when top_k is 0 or >= the vocabulary).
//   3. weights w_i = PortableExp((z_i - z_max) / T) in double (z_max the largest logit, T the
//      temperature), total W = their sum in candidate order.
//   4. one draw u = (g() >> 11) * 2^-53 in [0, 1) from std::mt19937_64 g seeded with `seed`
//      (the C++ standard fixes its output); the token is the first candidate whose running sum
//      of weights exceeds u * W (the last candidate if rounding leaves none).
// Not thread-safe: one sequence at a time.
class TokenSampler {
 public:
  // `options` must pass CheckSamplingOptions.
  explicit TokenSampler(const SamplingOptions& options);

  // The next token id for `logits` (one per vocabulary entry, at least one; every one finite).
  // Advances the generator by one draw unless greedy.
  int64_t Next(absl::Span<const float> logits);

  // The draw of step 4, for tests: advances the generator.
  double Uniform();

 private:
  SamplingOptions options_;
  std::mt19937_64 rng_;
  std::vector<std::pair<float, int64_t>> order_;  // candidates (scratch).
  std::vector<double> weights_;                   // (scratch).
};

// The largest logit's id, the lowest among equal ones. `logits` non-empty.
int64_t ArgMax(absl::Span<const float> logits);

}  // namespace pipetrain::model

#endif  // PIPETRAIN_COMMON_MODEL_TOKEN_SAMPLER_H_
