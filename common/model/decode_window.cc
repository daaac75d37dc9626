#include "common/model/decode_window.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

namespace pipetrain::model {

absl::StatusOr<DecodeRun> DecodeWindow::Start(absl::Span<const int64_t> prompt) {
  if (prompt.empty()) {
    return absl::InvalidArgumentError("the prompt is empty: generation needs at least one token");
  }
  for (size_t i = 0; i < prompt.size(); ++i) {
    if (prompt[i] < 0 || prompt[i] >= vocab_) {
      return absl::InvalidArgumentError(absl::StrCat("prompt token ", i, " is ", prompt[i],
                                                     ", outside the vocabulary [0, ", vocab_, ")"));
    }
  }
  const size_t keep = std::min(prompt.size(), static_cast<size_t>(context_));
  window_.assign(prompt.end() - keep, prompt.end());
  slides_ = 0;
  started_ = true;
  return DecodeRun{0, true};
}

absl::StatusOr<DecodeRun> DecodeWindow::Append(int64_t token) {
  if (!started_) return absl::FailedPreconditionError("Append before Start");
  if (token < 0 || token >= vocab_) {
    return absl::InvalidArgumentError(
        absl::StrCat("token ", token, " is outside the vocabulary [0, ", vocab_, ")"));
  }
  if (static_cast<int64_t>(window_.size()) < context_) {
    window_.push_back(token);
    return DecodeRun{static_cast<int64_t>(window_.size()) - 1, false};
  }
  // Slide: keep the last ceil(T/2) - 1 tokens and the new one, from position 0 again.
  const int64_t keep = (context_ + 1) / 2;
  window_.erase(window_.begin(), window_.end() - (keep - 1));
  window_.push_back(token);
  ++slides_;
  return DecodeRun{0, true};
}

}  // namespace pipetrain::model
