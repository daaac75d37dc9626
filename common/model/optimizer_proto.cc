#include "common/model/optimizer_proto.h"

#include "absl/strings/str_cat.h"

namespace pipetrain::model {

absl::StatusOr<math::OptimizerConfig> OptimizerFromProto(const v1::OptimizerSpec& spec) {
  math::OptimizerConfig config;
  switch (spec.kind_case()) {
    case v1::OptimizerSpec::kSgd: {
      const v1::SgdSpec& sgd = spec.sgd();
      config.kind = math::OptimizerKind::kSgd;
      config.lr = sgd.has_lr() ? sgd.lr() : math::kDefaultSgdLr;
      config.momentum = sgd.momentum();
      config.weight_decay = sgd.weight_decay();
      config.nesterov = sgd.nesterov();
      break;
    }
    case v1::OptimizerSpec::kAdamw: {
      const v1::AdamWSpec& adamw = spec.adamw();
      config.kind = math::OptimizerKind::kAdamW;
      // Unset fields keep OptimizerConfig's AdamW defaults (lr 1e-3, beta1 0.9, beta2 0.999,
      // eps 1e-8); a set field is taken as is, 0 included.
      if (adamw.has_lr()) config.lr = adamw.lr();
      if (adamw.has_beta1()) config.beta1 = adamw.beta1();
      if (adamw.has_beta2()) config.beta2 = adamw.beta2();
      if (adamw.has_eps()) config.eps = adamw.eps();
      config.weight_decay = adamw.weight_decay();
      break;
    }
    case v1::OptimizerSpec::KIND_NOT_SET:
      return absl::InvalidArgumentError("optimizer spec sets neither sgd nor adamw");
  }
  config.clip_norm = spec.clip_norm();
  if (spec.has_lr_schedule()) {
    const v1::LrScheduleSpec& l = spec.lr_schedule();
    switch (l.kind()) {
      case v1::LrScheduleSpec::WARMUP_COSINE:
        config.schedule.kind = math::LrScheduleKind::kWarmupCosine;
        break;
      case v1::LrScheduleSpec::WARMUP_LINEAR:
        config.schedule.kind = math::LrScheduleKind::kWarmupLinear;
        break;
      case v1::LrScheduleSpec::CONSTANT:
        break;
      default:
        return absl::InvalidArgumentError(
            absl::StrCat("optimizer spec: unknown lr_schedule kind ", l.kind()));
    }
    config.schedule.warmup_steps = l.warmup_steps();
    config.schedule.decay_steps = l.decay_steps();
    config.schedule.min_lr = l.min_lr();
  }
  if (absl::Status s = math::ValidateOptimizerConfig(config); !s.ok()) return s;
  return config;
}

v1::OptimizerSpec OptimizerToProto(const math::OptimizerConfig& config) {
  v1::OptimizerSpec spec;
  switch (config.kind) {
    case math::OptimizerKind::kSgd: {
      v1::SgdSpec* sgd = spec.mutable_sgd();
      sgd->set_lr(config.lr);
      sgd->set_momentum(config.momentum);
      sgd->set_weight_decay(config.weight_decay);
      sgd->set_nesterov(config.nesterov);
      break;
    }
    case math::OptimizerKind::kAdamW: {
      v1::AdamWSpec* adamw = spec.mutable_adamw();
      adamw->set_lr(config.lr);
      adamw->set_beta1(config.beta1);
      adamw->set_beta2(config.beta2);
      adamw->set_eps(config.eps);
      adamw->set_weight_decay(config.weight_decay);
      break;
    }
  }
  spec.set_clip_norm(config.clip_norm);
  const math::LrSchedule& schedule = config.schedule;
  if (schedule != math::LrSchedule()) {
    v1::LrScheduleSpec* l = spec.mutable_lr_schedule();
    switch (schedule.kind) {
      case math::LrScheduleKind::kConstant:
        l->set_kind(v1::LrScheduleSpec::CONSTANT);
        break;
      case math::LrScheduleKind::kWarmupCosine:
        l->set_kind(v1::LrScheduleSpec::WARMUP_COSINE);
        break;
      case math::LrScheduleKind::kWarmupLinear:
        l->set_kind(v1::LrScheduleSpec::WARMUP_LINEAR);
        break;
    }
    l->set_warmup_steps(schedule.warmup_steps);
    l->set_decay_steps(schedule.decay_steps);
    l->set_min_lr(schedule.min_lr);
  }
  return spec;
}

}  // namespace pipetrain::model
