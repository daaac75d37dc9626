// Optimizers (SGD with momentum, AdamW) and global-norm gradient clipping.
//
// Updates are elementwise and run in index order, so the same parameters, gradients, state and
// step give bitwise-identical results in any process. Semantics follow PyTorch's torch.optim.SGD
// and torch.optim.AdamW so that users can reason about hyper-parameters the usual way.
#ifndef PIPETRAIN_COMMON_MATH_OPTIMIZER_H_
#define PIPETRAIN_COMMON_MATH_OPTIMIZER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/math/lr_schedule.h"

namespace pipetrain::math {

enum class OptimizerKind { kSgd, kAdamW };

// The learning rate of SGD when none is given (AdamW's is OptimizerConfig::lr's default).
inline constexpr float kDefaultSgdLr = 0.1f;

// Hyper-parameters of one optimizer. Fields that do not apply to `kind` are ignored.
struct OptimizerConfig {
  OptimizerKind kind = OptimizerKind::kAdamW;
  float lr = 1e-3f;           // learning rate, > 0.
  float weight_decay = 0.0f;  // SGD: L2 added to the gradient; AdamW: decoupled decay. >= 0.
  float momentum = 0.0f;      // SGD only, in [0, 1).
  bool nesterov = false;      // SGD only; needs momentum > 0.
  float beta1 = 0.9f;         // AdamW only, in [0, 1).
  float beta2 = 0.999f;       // AdamW only, in [0, 1).
  float eps = 1e-8f;          // AdamW only, > 0.
  float clip_norm = 0.0f;     // > 0: clip the global gradient L2 norm to this. 0: off.
  // How the rate of each update derives from `lr` (lr_schedule.h); default: `lr` throughout.
  LrSchedule schedule;
};

// "sgd" or "adamw": the kind as ParseOptimizerConfig spells it.
absl::string_view OptimizerKindName(OptimizerKind kind);

// INVALID_ARGUMENT naming the first out-of-range hyper-parameter.
absl::Status ValidateOptimizerConfig(const OptimizerConfig& config);

// Parses "sgd" or "adamw", optionally followed by ":key=value,key=value" with keys lr,
// weight_decay and clip_norm, SGD's momentum and nesterov (0/1/true/false), AdamW's beta1, beta2
// and eps, and the schedule's lr_schedule (constant|warmup-cosine|warmup-linear), warmup_steps,
// decay_steps (integers) and lr_min. ASCII whitespace around the kind, a key or a value is
// ignored; a number is decimal ("1e-3", "+0.5", "2"; not "0x1p-3", "inf" or "nan"), rounded once
// to the nearest float. Unset keys keep the defaults above (SGD's default lr is 0.1).
// INVALID_ARGUMENT for an unknown kind or key, a key of the other kind, a key given twice
// ("adamw:lr=1,lr=2"), an item that is not one key=value, a value that does not parse, or a
// config ValidateOptimizerConfig refuses. The Python client's pipetrain.optimizer_spec reads the
// same text the same way (tests/client/conformance/optimizer_texts.json).
absl::StatusOr<OptimizerConfig> ParseOptimizerConfig(absl::string_view text);

// Canonical text of `config` that ParseOptimizerConfig reads back to an equal config. The
// schedule's keys appear only when it is not the default (constant, no warm-up), so the text of
// an unscheduled optimizer is what it was before schedules existed.
std::string FormatOptimizerConfig(const OptimizerConfig& config);

// Names of the state tensors kept per parameter, in order: SGD with momentum {"momentum_buffer"},
// SGD without {}, AdamW {"exp_avg", "exp_avg_sq"}. Each has the parameter's shape.
std::vector<std::string> OptimizerStateNames(const OptimizerConfig& config);

// Applies update number `step` (1-based; AdamW's bias correction and the learning-rate schedule
// use it) to `param`, using
// `grad` multiplied by `grad_scale` (the clip scale; 1 for none). `state` holds the tensors named
// by OptimizerStateNames, each param.size() long, zero before the first step. All spans have the
// same length. Thread-compatible: distinct parameters may be updated concurrently.
void OptimizerStep(const OptimizerConfig& config, int64_t step, float grad_scale,
                   absl::Span<const float> grad, absl::Span<float> param,
                   absl::Span<std::vector<float>> state);

// Sum of squares of `values` in double: element i is added to partial sum s[i mod 8] in index
// order, and the result is ((s0 + s4) + (s1 + s5)) + ((s2 + s6) + (s3 + s7)). A fixed order, so
// the same bits in every process; pure and thread-safe.
double SumOfSquares(absl::Span<const float> values);

// The factor min(1, clip_norm / (sqrt(global_norm_sq) + 1e-6)) by which every gradient is scaled
// (1 when clip_norm <= 0). global_norm_sq must be summed over layers in increasing global layer
// index so that every process computes the same value.
float ClipScale(double global_norm_sq, float clip_norm);

}  // namespace pipetrain::math

#endif  // PIPETRAIN_COMMON_MATH_OPTIMIZER_H_
