#include "client/cli/training_options.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <system_error>

#include "absl/strings/str_cat.h"

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

absl::Status CheckTrainingOptions(const TrainingOptions& o) {
  if (o.model_path.empty()) return absl::InvalidArgumentError("--model is required");
  if (o.steps < 1) {
    return absl::InvalidArgumentError(absl::StrCat("--steps must be >= 1, got ", o.steps));
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
  return absl::OkStatus();
}

absl::Status CheckSaveDirectory(const TrainingOptions& o) {
  if (o.save_dir.empty()) return absl::OkStatus();
  return CheckWritableDirectory("--save", o.save_dir);
}

bool CheckpointDue(const TrainingOptions& o, int64_t step, bool last) {
  if (o.save_dir.empty()) return false;
  return last || (o.checkpoint_every > 0 && step % o.checkpoint_every == 0);
}

}  // namespace pipetrain::cli
