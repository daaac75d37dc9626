#include "client/cli/progress.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_format.h"
#include "absl/time/clock.h"

namespace pipetrain::cli {
std::string FormatClock(absl::Duration d) {
  const int64_t s = std::max<int64_t>(0, absl::ToInt64Seconds(d));
  if (s >= 3600) return absl::StrFormat("%d:%02d:%02d", s / 3600, s / 60 % 60, s % 60);
  return absl::StrFormat("%d:%02d", s / 60, s % 60);
}

std::string PlainStepLine(int64_t step, float loss, double samples_per_second,
                          std::optional<std::pair<double, double>> bubbles) {
  std::string line =
      absl::StrFormat("step %6d  loss %.6f  %.0f samples/s", step, loss, samples_per_second);
  if (bubbles.has_value()) {
    line += absl::StrFormat("  bubble %.1f%% (predicted %.1f%%)", 100 * bubbles->first,
                            100 * bubbles->second);
  }
  return line;
}

ProgressLine::ProgressLine(std::ostream& out, ProgressOptions options)
    : out_(out), options_(std::move(options)), start_(Now()), window_start_(start_) {}

ProgressLine::~ProgressLine() { Finish(); }

absl::Time ProgressLine::Now() const { return options_.now ? options_.now() : absl::Now(); }

void ProgressLine::Step(const ProgressStep& s) {
  if (finished_) return;
  ++count_;
  last_ = s;
  window_samples_ += s.samples;
  total_samples_ += s.samples;
  window_bubble_ += s.bubble_fraction;
  window_predicted_ += s.predicted_bubble_fraction;
  ++window_steps_;
  const absl::Time now = Now();
  const double secs = absl::ToDoubleSeconds(now - window_start_);
  if (!options_.terminal) {
    if (s.step % options_.log_every != 0 && count_ != 1 && count_ != options_.steps) return;
    std::optional<std::pair<double, double>> bubbles;
    if (options_.pipeline) {
      bubbles.emplace(window_bubble_ / window_steps_, window_predicted_ / window_steps_);
    }
    out_ << PlainStepLine(s.step, s.loss, secs > 0 ? window_samples_ / secs : 0.0, bubbles) << "\n";
    out_.flush();
    StartWindow(now);
    return;
  }
  if (drawn_ && count_ < options_.steps && now - last_draw_ < options_.min_redraw_interval) return;
  if (secs > 0) rate_ = window_samples_ / secs;
  bubble_ = window_bubble_ / window_steps_;
  predicted_ = window_predicted_ / window_steps_;
  StartWindow(now);
  Draw();
}

void ProgressLine::StartWindow(absl::Time now) {
  window_start_ = now;
  window_samples_ = 0;
  window_bubble_ = 0;
  window_predicted_ = 0;
  window_steps_ = 0;
}

void ProgressLine::Clear() {
  if (!options_.terminal || !drawn_) return;
  out_ << kEraseLine;
  out_.flush();
  drawn_ = false;
}

void ProgressLine::Redraw() {
  if (!options_.terminal || !last_.has_value() || finished_ || drawn_) return;
  Draw();
}

void ProgressLine::Finish() {
  if (finished_) return;
  finished_ = true;
  if (!options_.terminal || !last_.has_value()) return;
  out_ << kEraseLine << LiveText(/*final=*/true) << "\n";
  out_.flush();
  drawn_ = false;
}

void ProgressLine::Draw() {
  out_ << kEraseLine << LiveText(/*final=*/false);
  out_.flush();
  drawn_ = true;
  last_draw_ = Now();
}

std::string ProgressLine::LiveText(bool final) const {
  if (!last_.has_value()) return "";
  const ProgressStep& s = *last_;
  const absl::Duration elapsed = Now() - start_;
  // The run's last step number: resumed runs count on from the checkpoint's step.
  const int64_t total = s.step - count_ + options_.steps;
  const double rate =
      final ? (elapsed > absl::ZeroDuration() ? total_samples_ / absl::ToDoubleSeconds(elapsed) : 0)
            : rate_;
  std::string text =
      absl::StrFormat("step %d/%d  loss %.6f  %.0f samples/s", s.step, total, s.loss, rate);
  if (options_.pipeline) {
    text += absl::StrFormat("  bubble %.1f%% (predicted %.1f%%)", 100 * bubble_, 100 * predicted_);
  }
  if (final) {
    text += "  in " + FormatClock(elapsed);
  } else {
    const int64_t left = std::max<int64_t>(0, options_.steps - count_);
    text += "  ETA " + FormatClock(elapsed / count_ * left);
  }
  if (options_.columns > 1 && static_cast<int>(text.size()) > options_.columns - 1) {
    text.resize(options_.columns - 1);
  }
  return text;
}

}  // namespace pipetrain::cli
