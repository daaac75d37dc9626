#include "common/math/optimizer.h"

#include <cmath>
#include <limits>
#include <map>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/util/decimal_number.h"

namespace pipetrain::math {
namespace {

bool InUnitInterval(float v) { return v >= 0.0f && v < 1.0f; }

// `text` (stripped) as a decimal number: an optional sign, digits with an optional point, an
// optional exponent ("1e-3", "+.5", "2."), or inf, infinity, nan in any case; rounded once to the
// nearest float. No hexadecimal ("0x10", which absl::SimpleAtof would read as 16) and no digit
// separators: the Python client reads exactly these (pipetrain/client.py, _number).
bool ParseDecimalFloat(absl::string_view text, float* out) {
  absl::string_view rest = text;
  if (!rest.empty() && (rest[0] == '+' || rest[0] == '-')) rest.remove_prefix(1);
  for (absl::string_view special : {"inf", "infinity", "nan"}) {
    if (absl::EqualsIgnoreCase(rest, special)) return absl::SimpleAtof(text, out);
  }
  size_t i = 0, digits = 0;
  while (i < rest.size() && absl::ascii_isdigit(rest[i])) ++i, ++digits;
  if (i < rest.size() && rest[i] == '.') {
    ++i;
    while (i < rest.size() && absl::ascii_isdigit(rest[i])) ++i, ++digits;
  }
  if (digits == 0) return false;
  if (i < rest.size() && (rest[i] == 'e' || rest[i] == 'E')) {
    ++i;
    if (i < rest.size() && (rest[i] == '+' || rest[i] == '-')) ++i;
    size_t exponent_digits = 0;
    while (i < rest.size() && absl::ascii_isdigit(rest[i])) ++i, ++exponent_digits;
    if (exponent_digits == 0) return false;
  }
  return i == rest.size() && absl::SimpleAtof(text, out);
}

// `text` as a decimal integer with an optional sign (no hexadecimal, no digit separators).
bool ParseDecimalInt(absl::string_view text, int64_t* out) {
  absl::string_view rest = text;
  if (!rest.empty() && (rest[0] == '+' || rest[0] == '-')) rest.remove_prefix(1);
  if (rest.empty()) return false;
  for (char c : rest) {
    if (!absl::ascii_isdigit(c)) return false;
  }
  return absl::SimpleAtoi(text, out);
}

// Sets a schedule key of `c`; false if `key` is not one.
absl::StatusOr<bool> SetScheduleField(OptimizerConfig* c, absl::string_view key,
                                      absl::string_view value) {
  LrSchedule& s = c->schedule;
  if (key == "lr_schedule") {
    absl::StatusOr<LrScheduleKind> kind = ParseLrScheduleKind(value);
    if (!kind.ok()) return kind.status();
    s.kind = *kind;
    return true;
  }
  int64_t* steps = key == "warmup_steps"  ? &s.warmup_steps
                   : key == "decay_steps" ? &s.decay_steps
                                          : nullptr;
  if (steps != nullptr) {
    if (!ParseDecimalInt(value, steps)) {
      return absl::InvalidArgumentError(
          absl::StrCat("optimizer: ", key, " must be an integer, got '", value, "'"));
    }
    return true;
  }
  if (key == "lr_min") {
    if (!ParseDecimalFloat(value, &s.min_lr)) {
      return absl::InvalidArgumentError(
          absl::StrCat("optimizer: lr_min must be a decimal number, got '", value, "'"));
    }
    if (!util::IsDecimalNumber(value)) {
      return absl::InvalidArgumentError(
          absl::StrCat("optimizer: lr_min must be a decimal number, got '", value, "'"));
    }
    return true;
  }
  return false;
}

// The keys that apply to `kind` (the schedule's apply to both).
bool KeyAppliesTo(OptimizerKind kind, absl::string_view key) {
  for (absl::string_view k : {"lr", "weight_decay", "clip_norm"}) {
    if (key == k) return true;
  }
  if (kind == OptimizerKind::kSgd) return key == "momentum" || key == "nesterov";
  return key == "beta1" || key == "beta2" || key == "eps";
}

absl::Status SetField(OptimizerConfig* c, absl::string_view key, absl::string_view value) {
  absl::StatusOr<bool> schedule = SetScheduleField(c, key, value);
  if (!schedule.ok()) return schedule.status();
  if (*schedule) return absl::OkStatus();
  float* field = nullptr;
  if (key == "lr") field = &c->lr;
  if (key == "weight_decay") field = &c->weight_decay;
  if (key == "momentum") field = &c->momentum;
  if (key == "beta1") field = &c->beta1;
  if (key == "beta2") field = &c->beta2;
  if (key == "eps") field = &c->eps;
  if (key == "clip_norm") field = &c->clip_norm;
  if (field == nullptr && key != "nesterov") {
    return absl::InvalidArgumentError(absl::StrCat(
        "optimizer: unknown key '", key,
        "' (known: lr, weight_decay, momentum, nesterov, beta1, beta2, eps, clip_norm, "
        "lr_schedule, warmup_steps, decay_steps, lr_min)"));
  }
  // A hyper-parameter of the other kind would be ignored: refused, so that it is not mistaken for
  // one in effect.
  if (!KeyAppliesTo(c->kind, key)) {
    const bool sgd = c->kind == OptimizerKind::kSgd;
    return absl::InvalidArgumentError(absl::StrCat(
        "optimizer: ", key, " is not a key of ", sgd ? "sgd" : "adamw", " (it takes ",
        sgd ? "lr, weight_decay, momentum, nesterov" : "lr, weight_decay, beta1, beta2, eps",
        ", clip_norm and the schedule's keys)"));
  }
  if (key == "nesterov") {
    if (value == "1" || value == "true") {
      c->nesterov = true;
    } else if (value == "0" || value == "false") {
      c->nesterov = false;
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("optimizer: nesterov must be 0, 1, true or false, got '", value, "'"));
    }
    return absl::OkStatus();
  }
  if (!ParseDecimalFloat(value, field)) {
    return absl::InvalidArgumentError(
        absl::StrCat("optimizer: ", key, " must be a decimal number, got '", value, "'"));
  }
  if (!util::IsDecimalNumber(value)) {
    return absl::InvalidArgumentError(
        absl::StrCat("optimizer: ", key, " must be a decimal number, got '", value, "'"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::string_view OptimizerKindName(OptimizerKind kind) {
  return kind == OptimizerKind::kSgd ? "sgd" : "adamw";
}

absl::Status ValidateOptimizerConfig(const OptimizerConfig& c) {
  auto bad = [](absl::string_view what, float v, absl::string_view rule) {
    return absl::InvalidArgumentError(
        absl::StrCat("optimizer: ", what, " = ", v, " is out of range: ", rule));
  };
  if (!std::isfinite(c.lr) || c.lr <= 0) return bad("lr", c.lr, "must be finite and > 0");
  if (!std::isfinite(c.weight_decay) || c.weight_decay < 0) {
    return bad("weight_decay", c.weight_decay, "must be finite and >= 0");
  }
  if (!std::isfinite(c.clip_norm) || c.clip_norm < 0) {
    return bad("clip_norm", c.clip_norm, "must be finite and >= 0 (0 disables clipping)");
  }
  if (c.kind == OptimizerKind::kSgd) {
    if (!InUnitInterval(c.momentum)) return bad("momentum", c.momentum, "must be in [0, 1)");
    if (c.nesterov && c.momentum == 0) {
      return absl::InvalidArgumentError("optimizer: nesterov needs momentum > 0");
    }
  } else {
    if (!InUnitInterval(c.beta1)) return bad("beta1", c.beta1, "must be in [0, 1)");
    if (!InUnitInterval(c.beta2)) return bad("beta2", c.beta2, "must be in [0, 1)");
    if (!std::isfinite(c.eps) || c.eps <= 0) return bad("eps", c.eps, "must be finite and > 0");
  }
  return ValidateLrSchedule(c.schedule, c.lr);
}

absl::StatusOr<OptimizerConfig> ParseOptimizerConfig(absl::string_view text) {
  std::pair<absl::string_view, absl::string_view> kind_and_args =
      absl::StrSplit(text, absl::MaxSplits(':', 1));
  const absl::string_view kind = absl::StripAsciiWhitespace(kind_and_args.first);
  OptimizerConfig config;
  if (kind == "sgd") {
    config.kind = OptimizerKind::kSgd;
    config.lr = kDefaultSgdLr;
  } else if (kind == "adamw") {
    config.kind = OptimizerKind::kAdamW;
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat("optimizer: unknown kind '", kind, "' (expected sgd or adamw)"));
  }
  if (!absl::StripAsciiWhitespace(kind_and_args.second).empty()) {
    // Each key at most once: a repeated key is a mistake, not an override.
    std::map<absl::string_view, absl::string_view> seen;  // key -> its item
    for (absl::string_view item : absl::StrSplit(kind_and_args.second, ',')) {
      std::vector<absl::string_view> kv = absl::StrSplit(item, '=');
      const absl::string_view key =
          kv.size() == 2 ? absl::StripAsciiWhitespace(kv[0]) : absl::string_view();
      const absl::string_view value =
          kv.size() == 2 ? absl::StripAsciiWhitespace(kv[1]) : absl::string_view();
      if (key.empty() || value.empty()) {
        return absl::InvalidArgumentError(
            absl::StrCat("optimizer: expected key=value, got '", item, "'"));
      }
      if (auto [it, inserted] = seen.emplace(key, item); !inserted) {
        return absl::InvalidArgumentError(absl::StrCat(
            "optimizer: key '", key, "' is given twice ('", it->second, "' and '", item, "')"));
      }
      if (auto s = SetField(&config, key, value); !s.ok()) return s;
    }
  }
  if (auto s = ValidateOptimizerConfig(config); !s.ok()) return s;
  return config;
}

std::string FormatOptimizerConfig(const OptimizerConfig& c) {
  // %.9g round-trips every float exactly.
  auto f = [](float v) { return absl::StrFormat("%.9g", v); };
  std::string schedule;
  if (c.schedule != LrSchedule()) {
    const LrSchedule& s = c.schedule;
    schedule =
        absl::StrCat(",lr_schedule=", LrScheduleKindName(s.kind), ",warmup_steps=", s.warmup_steps,
                     ",decay_steps=", s.decay_steps, ",lr_min=", f(s.min_lr));
  }
  if (c.kind == OptimizerKind::kSgd) {
    return absl::StrCat("sgd:lr=", f(c.lr), ",weight_decay=", f(c.weight_decay),
                        ",momentum=", f(c.momentum), ",nesterov=", c.nesterov ? 1 : 0,
                        ",clip_norm=", f(c.clip_norm), schedule);
  }
  return absl::StrCat("adamw:lr=", f(c.lr), ",weight_decay=", f(c.weight_decay),
                      ",beta1=", f(c.beta1), ",beta2=", f(c.beta2), ",eps=", f(c.eps),
                      ",clip_norm=", f(c.clip_norm), schedule);
}

std::vector<std::string> OptimizerStateNames(const OptimizerConfig& config) {
  if (config.kind == OptimizerKind::kAdamW) return {"exp_avg", "exp_avg_sq"};
  if (config.momentum > 0) return {"momentum_buffer"};
  return {};
}

namespace {

// The update loops. Each reads the hyper-parameters from locals and the arrays through restrict
// pointers, so that the compiler vectorises it (the loop over a struct's fields through a
// float pointer that might alias them stayed scalar: ~1 ms per step for the deep MLP's 2M
// parameters per rank). Every element still goes through the same float operations in the same
// order (no contraction: -ffp-contract=off), so the results are those of the scalar loop bit for
// bit; the divisions and square roots are IEEE-exact in either form.

void SgdUpdate(size_t n, float grad_scale, float weight_decay, float lr,
               const float* __restrict grad, float* __restrict param) {
  for (size_t i = 0; i < n; ++i) {
    const float g = grad[i] * grad_scale + weight_decay * param[i];
    param[i] -= lr * g;
  }
}

// PyTorch initialises the buffer with the first gradient; with a zero buffer at step 1
// momentum * 0 + g == g exactly, so one formula serves both.
void SgdMomentumUpdate(size_t n, float grad_scale, float weight_decay, float lr, float momentum,
                       bool nesterov, const float* __restrict grad, float* __restrict param,
                       float* __restrict buf) {
  if (nesterov) {
    for (size_t i = 0; i < n; ++i) {
      const float g = grad[i] * grad_scale + weight_decay * param[i];
      buf[i] = momentum * buf[i] + g;
      param[i] -= lr * (g + momentum * buf[i]);
    }
  } else {
    for (size_t i = 0; i < n; ++i) {
      const float g = grad[i] * grad_scale + weight_decay * param[i];
      buf[i] = momentum * buf[i] + g;
      param[i] -= lr * buf[i];
    }
  }
}

void AdamWUpdate(size_t n, float grad_scale, float decay, float beta1, float beta2, float step_size,
                 float bias2_sqrt, float eps, const float* __restrict grad, float* __restrict param,
                 float* __restrict m, float* __restrict v) {
  const float one_minus_beta1 = 1.0f - beta1;
  const float one_minus_beta2 = 1.0f - beta2;
  for (size_t i = 0; i < n; ++i) {
    const float g = grad[i] * grad_scale;
    const float p = param[i] * decay;
    m[i] = beta1 * m[i] + one_minus_beta1 * g;
    v[i] = beta2 * v[i] + one_minus_beta2 * g * g;
    const float denom = std::sqrt(v[i]) / bias2_sqrt + eps;
    param[i] = p - step_size * m[i] / denom;
  }
}

}  // namespace

void OptimizerStep(const OptimizerConfig& c, int64_t step, float grad_scale,
                   absl::Span<const float> grad, absl::Span<float> param,
                   absl::Span<std::vector<float>> state) {
  const size_t n = param.size();
  const float lr = LearningRateAt(c.schedule, c.lr, step);
  if (c.kind == OptimizerKind::kSgd) {
    if (state.empty()) {
      SgdUpdate(n, grad_scale, c.weight_decay, lr, grad.data(), param.data());
    } else {
      SgdMomentumUpdate(n, grad_scale, c.weight_decay, lr, c.momentum, c.nesterov, grad.data(),
                        param.data(), state[0].data());
    }
    return;
  }
  const float bias1 = static_cast<float>(1.0 - std::pow(static_cast<double>(c.beta1), step));
  const float bias2 = static_cast<float>(1.0 - std::pow(static_cast<double>(c.beta2), step));
  AdamWUpdate(n, grad_scale, 1.0f - lr * c.weight_decay, c.beta1, c.beta2, lr / bias1,
              std::sqrt(bias2), c.eps, grad.data(), param.data(), state[0].data(), state[1].data());
}

double SumOfSquares(absl::Span<const float> values) {
  // Element i goes to partial sum i mod 8; the partial sums are combined in the fixed order
  // below. The order is this code's, not the compiler's (no -ffast-math, no contraction), so
  // every process gets the same bits, with eight independent addition chains instead of one
  // (one chain is bound by the add latency: ~4 ms per step for the deep MLP's 4M parameters).
  double lane[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  const size_t n = values.size();
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    for (size_t k = 0; k < 8; ++k) {
      const double x = values[i + k];
      lane[k] += x * x;
    }
  }
  for (size_t k = 0; i < n; ++i, ++k) {
    const double x = values[i];
    lane[k] += x * x;
  }
  return ((lane[0] + lane[4]) + (lane[1] + lane[5])) + ((lane[2] + lane[6]) + (lane[3] + lane[7]));
}

float ClipScale(double global_norm_sq, float clip_norm) {
  if (clip_norm <= 0) return 1.0f;
  const double norm = std::sqrt(global_norm_sq);
  const double scale = clip_norm / (norm + 1e-6);
  return scale < 1.0 ? static_cast<float>(scale) : 1.0f;
}

}  // namespace pipetrain::math
