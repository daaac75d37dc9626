#include "client/cli/training_options.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <system_error>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/model/checkpoint.h"
#include "common/util/status_macros.h"

namespace pipetrain::cli {
namespace {

// Creates `dir` (and its parents) if missing, then creates and removes a probe file in it.
// FAILED_PRECONDITION naming `flag` and `dir` if either fails.
// TODO: use common/io's CheckWritableDirectory once it lands.
absl::Status CheckWritableDirectory(const std::string& flag, const std::string& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    return absl::FailedPreconditionError(
        absl::StrCat(flag, " ", dir, ": cannot create the directory: ", ec.message()));
  }
  if (!std::filesystem::is_directory(dir, ec)) {
    return absl::FailedPreconditionError(absl::StrCat(flag, " ", dir, ": not a directory"));
  }
  const std::string probe = absl::StrCat(dir, "/.pipetrain-write-probe-", getpid());
  const int fd = open(probe.c_str(), O_CREAT | O_WRONLY | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(flag, " ", dir, ": directory is not writable: ", std::strerror(errno)));
  }
  close(fd);
  unlink(probe.c_str());
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<math::OptimizerConfig> OptimizerConfigFor(const TrainingOptions& o) {
  absl::StatusOr<math::OptimizerConfig> config = math::ParseOptimizerConfig(o.optimizer);
  if (!config.ok()) return config.status();
  math::LrSchedule& s = config->schedule;
  if (o.lr_schedule.has_value()) {
    absl::StatusOr<math::LrScheduleKind> kind = math::ParseLrScheduleKind(*o.lr_schedule);
    if (!kind.ok())
      return absl::InvalidArgumentError(absl::StrCat("--lr-schedule: ", kind.status().message()));
    s.kind = *kind;
  }
  if (o.warmup_steps.has_value()) s.warmup_steps = *o.warmup_steps;
  if (o.lr_min.has_value()) s.min_lr = *o.lr_min;
  if (o.lr_decay_steps.has_value()) {
    s.decay_steps = *o.lr_decay_steps;
  } else if (s.kind != math::LrScheduleKind::kConstant && s.decay_steps == 0) {
    s.decay_steps = o.steps;
  }
  if (s.warmup_steps < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--warmup-steps must be >= 0, got ", s.warmup_steps));
  }
  if (s.kind != math::LrScheduleKind::kConstant) {
    if (s.decay_steps <= s.warmup_steps) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--lr-decay-steps (", s.decay_steps, o.lr_decay_steps ? "" : ", from --steps",
          ") must be greater than --warmup-steps (", s.warmup_steps, ")"));
    }
    if (!(s.min_lr >= 0 && s.min_lr <= config->lr)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--lr-min must be in [0, lr = ", config->lr, "], got ", s.min_lr));
    }
  }
  if (absl::Status valid = math::ValidateOptimizerConfig(*config); !valid.ok()) return valid;
  return config;
}

absl::Status CheckTrainingOptions(const TrainingOptions& o) {
  if (o.model_path.empty()) {
    return absl::InvalidArgumentError(
        "--model FILE is required: the model to train, a ModelSpec in protobuf text format (e.g. "
        "examples/mlp_digits.textproto)");
  }
  // Below 2^53 like every step counter of a checkpoint (steps become doubles), so that the last
  // step of a resumed run (its checkpoint's step + --steps) cannot overflow either.
  if (o.steps < 1 || o.steps >= model::kMaxManifestCount) {
    return absl::InvalidArgumentError(absl::StrCat("--steps must be in [1, 2^53), got ", o.steps));
  }
  if (o.batch < 1) {
    return absl::InvalidArgumentError(absl::StrCat("--batch must be >= 1, got ", o.batch));
  }
  if (o.microbatches < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--microbatches must be >= 1, got ", o.microbatches));
  }
  if (o.batch % o.microbatches != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--batch ", o.batch, " is not divisible by --microbatches ", o.microbatches));
  }
  if (o.eval_every < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--eval-every must be >= 0, got ", o.eval_every));
  }
  if (o.threads < 1) {
    return absl::InvalidArgumentError(absl::StrCat("--threads must be >= 1, got ", o.threads));
  }
  if (o.eval_samples.has_value() && *o.eval_samples < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--eval-samples must be >= 0 (0: all), got ", *o.eval_samples));
  }
  if (o.log_every < 1) {
    return absl::InvalidArgumentError(absl::StrCat("--log-every must be >= 1, got ", o.log_every));
  }
  if (o.checkpoint_every < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--checkpoint-every must be >= 0, got ", o.checkpoint_every));
  }
  if (o.checkpoint_every > 0 && o.save_dir.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--checkpoint-every ", o.checkpoint_every,
                     " needs --save DIR (the directory the checkpoints are written to)"));
  }
  if (o.keep_checkpoints < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--keep-checkpoints must be >= 1, got ", o.keep_checkpoints));
  }
  for (auto [flag, value] : {std::pair<const char*, const std::string*>{"--isa", &o.isa},
                             std::pair<const char*, const std::string*>{"--max-isa", &o.max_isa}}) {
    if (absl::StatusOr<std::optional<math::Isa>> isa = math::ParseOptionalIsa(*value); !isa.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(flag, ": ", isa.status().message()));
    }
  }
  if (!o.isa.empty() && !o.max_isa.empty() &&
      *math::IsaFromName(o.isa) > *math::IsaFromName(o.max_isa)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--isa ", o.isa, " is above --max-isa ", o.max_isa));
  }
  return absl::OkStatus();
}

absl::StatusOr<math::Isa> ReferenceIsaFor(const TrainingOptions& o) {
  PT_RETURN_IF_ERROR(CheckTrainingOptions(o));
  const std::optional<math::Isa> max = math::IsaFromName(o.max_isa);
  if (o.isa.empty()) {
    absl::StatusOr<math::Isa> best = math::HighestSupportedIsa(max);
    if (!best.ok()) {
      return absl::FailedPreconditionError(absl::StrCat("--max-isa: ", best.status().message()));
    }
    return best;
  }
  const math::Isa isa = *math::IsaFromName(o.isa);
  if (!math::CpuSupportsIsa(isa)) {
    return absl::FailedPreconditionError(
        absl::StrCat("--isa ", o.isa, ": this CPU cannot run it (it runs ",
                     math::IsaListName(math::SupportedIsas()), ")"));
  }
  return isa;
}

absl::Status CheckSaveDirectory(const TrainingOptions& o) {
  if (o.save_dir.empty()) return absl::OkStatus();
  return CheckWritableDirectory("--save", o.save_dir);
}

ProgressOptions ProgressOptionsFor(const TrainingOptions& o, bool pipeline) {
  ProgressOptions p;
  p.terminal = o.terminal;
  p.columns = o.terminal_columns;
  p.steps = o.steps;
  p.log_every = o.log_every;
  p.pipeline = pipeline;
  return p;
}

bool CheckpointDue(const TrainingOptions& o, int64_t step, bool last) {
  if (o.save_dir.empty()) return false;
  return last || (o.checkpoint_every > 0 && step % o.checkpoint_every == 0);
}

}  // namespace pipetrain::cli
