// JobEventLog: a bounded log whose watches read through a position — a watch behind the log's
// oldest event gets one `skipped` marker, a watch that read everything is handed the next event,
// the `ended` event is never skipped over by a new watch, and watches are capped and closed.
#include "server/coordinator/job_event_log.h"

#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pipetrain::coordinator {
namespace {

using ::testing::ElementsAre;

// Keeps what the log hands it.
class Recorder final : public JobWatcher {
 public:
  void OnJobEvent(v1::JobEvent event) override { events.push_back(std::move(event)); }
  void OnWatchClosed(const absl::Status& why) override { closed.push_back(why); }
  std::vector<v1::JobEvent> events;
  std::vector<absl::Status> closed;
};

v1::JobEvent Step(int64_t step) {
  v1::JobEvent e;
  e.mutable_step()->set_step(step);
  e.mutable_step()->set_loss(0.5f * static_cast<float>(step));
  return e;
}

// "step N" / "skipped N up to S" / "ended" for each event the watch reads until none is left.
std::vector<std::string> ReadAll(JobEventLog& log, int64_t watch) {
  std::vector<std::string> read;
  for (int i = 0; i < 100; ++i) {
    absl::StatusOr<std::optional<v1::JobEvent>> next = log.Next(watch);
    EXPECT_TRUE(next.ok()) << next.status();
    if (!next.ok() || !next->has_value()) break;
    const v1::JobEvent& e = **next;
    if (e.has_step()) {
      EXPECT_EQ(e.sequence(), e.step().step());
      read.push_back("step " + std::to_string(e.step().step()));
    } else if (e.has_skipped()) {
      read.push_back("skipped " + std::to_string(e.skipped().count()) + " up to " +
                     std::to_string(e.sequence()));
    } else if (e.has_ended()) {
      read.push_back("ended");
    }
  }
  return read;
}

TEST(JobEventLogTest, KeepsTheLastEventsAndMarksWhatAWatchMissed) {
  JobEventLog log(3);
  Recorder watcher;
  absl::StatusOr<int64_t> slow = log.AddWatch(&watcher, 0, 8);
  ASSERT_TRUE(slow.ok());
  for (int64_t s = 1; s <= 5; ++s) EXPECT_EQ(log.Append(Step(s), absl::Now()), s);
  EXPECT_EQ(log.size(), 3u);
  EXPECT_EQ(log.last_sequence(), 5);
  // Events 1 and 2 were dropped before the watch read them.
  EXPECT_THAT(ReadAll(log, *slow), ElementsAre("skipped 2 up to 2", "step 3", "step 4", "step 5"));
  EXPECT_TRUE(watcher.events.empty());  // it was reading, not waiting.
  // A late watch asking for everything gets the same; one that saw event 3 gets 4 and 5.
  absl::StatusOr<int64_t> late = log.AddWatch(&watcher, 0, 8);
  ASSERT_TRUE(late.ok());
  EXPECT_THAT(ReadAll(log, *late), ElementsAre("skipped 2 up to 2", "step 3", "step 4", "step 5"));
  absl::StatusOr<int64_t> resumed = log.AddWatch(&watcher, 3, 8);
  ASSERT_TRUE(resumed.ok());
  EXPECT_THAT(ReadAll(log, *resumed), ElementsAre("step 4", "step 5"));
}

TEST(JobEventLogTest, AWaitingWatchIsHandedTheNextEventOnce) {
  JobEventLog log(4);
  Recorder watcher;
  absl::StatusOr<int64_t> watch = log.AddWatch(&watcher, 0, 8);
  ASSERT_TRUE(watch.ok());
  log.Append(Step(1), absl::Now());
  EXPECT_TRUE(watcher.events.empty());  // not waiting yet: it reads event 1 itself.
  EXPECT_THAT(ReadAll(log, *watch), ElementsAre("step 1"));  // ...and now waits.
  log.Append(Step(2), absl::Now());
  log.Append(Step(3), absl::Now());
  // Only event 2 is handed over: the watch reads again before it gets more.
  ASSERT_EQ(watcher.events.size(), 1u);
  EXPECT_EQ(watcher.events[0].step().step(), 2);
  EXPECT_EQ(watcher.events[0].sequence(), 2);
  EXPECT_GT(watcher.events[0].unix_ms(), 0);
  EXPECT_THAT(ReadAll(log, *watch), ElementsAre("step 3"));
  log.RemoveWatch(*watch);
  log.Append(Step(4), absl::Now());
  EXPECT_EQ(watcher.events.size(), 1u);
  EXPECT_EQ(log.Next(*watch).status().code(), absl::StatusCode::kNotFound);
}

TEST(JobEventLogTest, AWatchOfAnEndedJobAlwaysReadsItsEnd) {
  JobEventLog log(4);
  Recorder watcher;
  log.Append(Step(1), absl::Now());
  v1::JobEvent ended;
  ended.mutable_ended()->set_state(v1::JOB_STATE_DONE);
  log.Append(ended, absl::Now());
  for (int64_t after : {0, 1, 2, 99}) {
    absl::StatusOr<int64_t> watch = log.AddWatch(&watcher, after, 8);
    ASSERT_TRUE(watch.ok());
    const std::vector<std::string> read = ReadAll(log, *watch);
    ASSERT_FALSE(read.empty()) << after;
    EXPECT_EQ(read.back(), "ended") << after;
  }
}

TEST(JobEventLogTest, WatchesAreCappedAndClosedWithTheReason) {
  JobEventLog log(2);
  Recorder a, b;
  ASSERT_TRUE(log.AddWatch(&a, 0, 2).ok());
  ASSERT_TRUE(log.AddWatch(&b, 0, 2).ok());
  const absl::Status third = log.AddWatch(&a, 0, 2).status();
  EXPECT_EQ(third.code(), absl::StatusCode::kResourceExhausted) << third;
  log.CloseWatches(absl::CancelledError("shutting down"));
  ASSERT_EQ(a.closed.size(), 1u);
  EXPECT_EQ(a.closed[0], absl::CancelledError("shutting down"));
  EXPECT_EQ(b.closed.size(), 1u);
  EXPECT_EQ(log.watches(), 0u);
  log.Append(Step(1), absl::Now());
  EXPECT_TRUE(a.events.empty());
}

}  // namespace
}  // namespace pipetrain::coordinator
