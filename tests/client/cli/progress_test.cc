#include "client/cli/progress.h"

#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pipetrain::cli {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kErase[] = "\r\x1b[K";

// Occurrences of `what` in `text`.
int Count(const std::string& text, const std::string& what) {
  int n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// A ProgressLine on a string stream with a clock the test moves.
class ProgressTest : public ::testing::Test {
 protected:
  ProgressOptions Options(bool terminal, int64_t steps) {
    ProgressOptions o;
    o.terminal = terminal;
    o.steps = steps;
    o.now = [this] { return now_; };
    return o;
  }
  // Advances the clock by `d`, then records step `step` of 64 samples.
  void StepAfter(ProgressLine& p, absl::Duration d, int64_t step, float loss = 2.0f) {
    now_ += d;
    p.Step({step, loss, 64, 0.25, 0.125});
  }

  absl::Time now_ = absl::FromUnixSeconds(1000);
  std::ostringstream out_;
};

TEST_F(ProgressTest, PlainLinesOnTheFirstEveryNthAndLastStepWithTheWindowsRate) {
  ProgressOptions o = Options(/*terminal=*/false, /*steps=*/25);
  o.log_every = 10;
  {
    ProgressLine p(out_, o);
    for (int s = 1; s <= 25; ++s) StepAfter(p, absl::Milliseconds(500), s, 1.0f / s);
    p.Clear();  // no-ops off a terminal
    p.Redraw();
    p.Finish();
  }
  // 64 samples every 0.5 s: 128 samples/s in every window (1 step, then 9, 10 and 5).
  EXPECT_EQ(out_.str(),
            "step      1  loss 1.000000  128 samples/s\n"
            "step     10  loss 0.100000  128 samples/s\n"
            "step     20  loss 0.050000  128 samples/s\n"
            "step     25  loss 0.040000  128 samples/s\n");
}

TEST_F(ProgressTest, PlainPipelineLinesShowTheMeasuredAndPredictedBubble) {
  ProgressOptions o = Options(/*terminal=*/false, /*steps=*/2);
  o.pipeline = true;
  ProgressLine p(out_, o);
  StepAfter(p, absl::Seconds(1), 1);
  now_ += absl::Seconds(1);
  p.Step({2, 1.5f, 32, 0.5, 0.375});
  EXPECT_EQ(out_.str(),
            "step      1  loss 2.000000  64 samples/s  bubble 25.0% (predicted 12.5%)\n"
            "step      2  loss 1.500000  32 samples/s  bubble 50.0% (predicted 37.5%)\n");
}

// Each line's bubbles are the means over the steps since the previous line, as its samples/s is.
TEST_F(ProgressTest, PipelineLinesShowTheBubblesMeanOverTheirWindow) {
  ProgressOptions o = Options(/*terminal=*/false, /*steps=*/5);
  o.pipeline = true;
  o.log_every = 4;
  {
    ProgressLine p(out_, o);
    const double measured[] = {0.9, 0.5, 0.7, 0.3, 0.2};
    const double predicted[] = {0.6, 0.4, 0.4, 0.4, 0.1};
    for (int s = 1; s <= 5; ++s) {
      now_ += absl::Seconds(1);
      p.Step({s, 1.0f, 64, measured[s - 1], predicted[s - 1]});
    }
  }
  EXPECT_EQ(out_.str(),
            "step      1  loss 1.000000  64 samples/s  bubble 90.0% (predicted 60.0%)\n"
            "step      4  loss 1.000000  64 samples/s  bubble 50.0% (predicted 40.0%)\n"
            "step      5  loss 1.000000  64 samples/s  bubble 20.0% (predicted 10.0%)\n");
  // On a terminal: the steps since the previous draw (held back at steps 2 and 3).
  out_.str("");
  o.terminal = true;
  o.min_redraw_interval = absl::Milliseconds(2500);
  ProgressLine p(out_, o);
  const double measured[] = {0.9, 0.5, 0.7, 0.3};
  for (int s = 1; s <= 4; ++s) {
    now_ += absl::Seconds(1);
    p.Step({s, 1.0f, 64, measured[s - 1], 0.25});
  }
  EXPECT_THAT(out_.str(), ::testing::EndsWith("step 4/5  loss 1.000000  64 samples/s  bubble "
                                              "50.0% (predicted 25.0%)  ETA 0:01"));
}

TEST_F(ProgressTest, TerminalRedrawsInPlaceAtMostOncePerIntervalAndEndsWithANewline) {
  ProgressOptions o = Options(/*terminal=*/true, /*steps=*/10);
  o.min_redraw_interval = absl::Milliseconds(2500);
  ProgressLine p(out_, o);
  StepAfter(p, absl::Seconds(1), 1);
  // The first step is drawn at once: 64 samples in 1 s, 9 steps of 1 s left.
  EXPECT_EQ(out_.str(), absl::StrCat(kErase, "step 1/10  loss 2.000000  64 samples/s  ETA 0:09"));
  StepAfter(p, absl::Seconds(1), 2);
  StepAfter(p, absl::Seconds(1), 3);
  EXPECT_EQ(Count(out_.str(), kErase), 1) << "held back: 2 s since the last draw";
  StepAfter(p, absl::Seconds(1), 4);
  EXPECT_EQ(Count(out_.str(), kErase), 2);
  EXPECT_THAT(out_.str(), HasSubstr(absl::StrCat(kErase,
                                                 "step 4/10  loss 2.000000  64 samples/s  "
                                                 "ETA 0:06")));
  for (int s = 5; s <= 9; ++s) StepAfter(p, absl::Seconds(1), s);
  EXPECT_EQ(Count(out_.str(), kErase), 3) << "drawn at step 7 only";
  StepAfter(p, absl::Milliseconds(10), 10);  // the last step is always drawn
  EXPECT_EQ(Count(out_.str(), kErase), 4);
  EXPECT_THAT(out_.str(), Not(HasSubstr("\n")));
  p.Finish();
  p.Finish();  // idempotent
  const std::string final_line = "step 10/10  loss 2.000000  71 samples/s  in 0:09\n";
  EXPECT_EQ(out_.str().substr(out_.str().size() - final_line.size() - 4),
            absl::StrCat(kErase, final_line));
  EXPECT_EQ(Count(out_.str(), "\n"), 1);
}

TEST_F(ProgressTest, ClearErasesTheLineAndRedrawDrawsItAgainAtOnce) {
  ProgressLine p(out_, Options(/*terminal=*/true, /*steps=*/5));
  p.Redraw();  // nothing to draw before the first step
  p.Clear();
  EXPECT_EQ(out_.str(), "");
  StepAfter(p, absl::Seconds(2), 1);
  p.Clear();
  out_ << "checkpoint of step 1 written\n";
  p.Redraw();
  const std::string line = "step 1/5  loss 2.000000  32 samples/s  ETA 0:08";
  EXPECT_EQ(out_.str(),
            absl::StrCat(kErase, line, kErase, "checkpoint of step 1 written\n", kErase, line));
  // After a Clear, the next step draws even within the interval.
  p.Clear();
  StepAfter(p, absl::Milliseconds(1), 2);
  EXPECT_THAT(out_.str(),
              ::testing::EndsWith("step 2/5  loss 2.000000  64000 samples/s  ETA 0:03"));
}

TEST_F(ProgressTest, ResumedRunCountsOnFromTheCheckpointAndPipelineShowsTheBubble) {
  ProgressOptions o = Options(/*terminal=*/true, /*steps=*/10);
  o.pipeline = true;
  {
    ProgressLine p(out_, o);
    StepAfter(p, absl::Seconds(1), 101);
  }  // the destructor ends the line
  EXPECT_EQ(out_.str(), absl::StrCat(kErase,
                                     "step 101/110  loss 2.000000  64 samples/s  bubble 25.0% "
                                     "(predicted 12.5%)  ETA 0:09",
                                     kErase,
                                     "step 101/110  loss 2.000000  64 samples/s  bubble 25.0% "
                                     "(predicted 12.5%)  in 0:01\n"));
}

TEST_F(ProgressTest, LineIsCutToTheTerminalWidthSoItNeverWraps) {
  ProgressOptions o = Options(/*terminal=*/true, /*steps=*/3);
  o.columns = 20;
  ProgressLine p(out_, o);
  StepAfter(p, absl::Seconds(1), 1);
  EXPECT_EQ(out_.str(), absl::StrCat(kErase, "step 1/3  loss 2.00"));
}

TEST_F(ProgressTest, HoursInTheTimeLeft) {
  ProgressLine p(out_, Options(/*terminal=*/true, /*steps=*/3));
  StepAfter(p, absl::Minutes(61), 1);
  EXPECT_THAT(out_.str(), ::testing::EndsWith("ETA 2:02:00"));
}

}  // namespace
}  // namespace pipetrain::cli
