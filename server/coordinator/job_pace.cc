#include "server/coordinator/job_pace.h"

#include <algorithm>

namespace pipetrain::coordinator {

void JobPace::OnCommitted(const v1::StepCommitted& step, absl::Time now) {
  last_ = step;
  last_at_ = now;
  window_.push_back(Commit{now, step.samples()});
  if (window_.size() > kWindow) window_.pop_front();
}

double JobPace::SecondsPerStep() const {
  if (window_.empty()) return 0;
  if (window_.size() == 1) return last_.step_ms() / 1000;
  return absl::ToDoubleSeconds(window_.back().at - window_.front().at) /
         static_cast<double>(window_.size() - 1);
}

double JobPace::SamplesPerSecond() const {
  if (window_.empty()) return 0;
  if (window_.size() == 1) {
    return last_.step_ms() > 0 ? static_cast<double>(last_.samples()) * 1000 / last_.step_ms() : 0;
  }
  // The samples of the steps committed after the window's first, over the time they took.
  int64_t samples = 0;
  for (size_t i = 1; i < window_.size(); ++i) samples += window_[i].samples;
  const double seconds = absl::ToDoubleSeconds(window_.back().at - window_.front().at);
  return seconds > 0 ? static_cast<double>(samples) / seconds : 0;
}

v1::JobProgress JobPace::Progress(int64_t steps_done, int64_t target_step, bool live) const {
  v1::JobProgress p;
  p.set_target_step(target_step);
  if (last_.step() == 0) return p;
  p.set_step(last_.step());
  p.set_loss(last_.loss());
  p.set_step_ms(last_.step_ms());
  p.set_samples_per_second(SamplesPerSecond());
  p.set_updated_unix_ms(absl::ToUnixMillis(last_at_));
  if (live && target_step > 0 && !window_.empty()) {
    const int64_t left = std::max<int64_t>(0, target_step - steps_done);
    p.set_eta_seconds(static_cast<double>(left) * SecondsPerStep());
  }
  return p;
}

}  // namespace pipetrain::coordinator
