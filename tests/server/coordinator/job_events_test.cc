// The core's per-job progress (JobStatus.progress) and event log (WatchJob) against fake workers:
// the figures of the last step and the ETA toward the planned steps, a late watcher that reads
// the history and then follows, a bounded log that a slow watcher skips through, an ended job's
// watch, a recovery with its new layout, the owner rule, that watching keeps no job alive, and
// the watches closed at shutdown.
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/coordinator/coordinator_core.h"
#include "tests/server/coordinator/core_test_fixture.h"

namespace pipetrain::coordinator {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing::MakeBatch;
using testing::MakeSpec;

// A watch's other end: keeps what the core hands it (under the core's lock, as a reactor would).
class RecordingWatcher final : public JobWatcher {
 public:
  void OnJobEvent(v1::JobEvent event) override {
    absl::MutexLock lock(&mu_);
    handed_.push_back(std::move(event));
  }
  void OnWatchClosed(const absl::Status& why) override {
    absl::MutexLock lock(&mu_);
    closed_ = why;
  }
  // Waits (at most 10 s) until `count` events were handed over; they, or what came.
  std::vector<v1::JobEvent> Handed(size_t count) {
    absl::MutexLock lock(&mu_);
    auto enough = [this, count]()
                      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return handed_.size() >= count; };
    mu_.AwaitWithTimeout(absl::Condition(&enough), absl::Seconds(10));
    return handed_;
  }
  std::optional<absl::Status> closed() {
    absl::MutexLock lock(&mu_);
    return closed_;
  }

 private:
  absl::Mutex mu_;
  std::vector<v1::JobEvent> handed_ ABSL_GUARDED_BY(mu_);
  std::optional<absl::Status> closed_ ABSL_GUARDED_BY(mu_);
};

// One word per event: "step 3 loss 0.75", "checkpoint 2", "recovering w1", "recovered 2 -> 2
// stages", "ended cancelled", "skipped 2".
std::string Describe(const v1::JobEvent& e) {
  if (e.has_step()) return absl::StrCat("step ", e.step().step(), " loss ", e.step().loss());
  if (e.has_checkpoint()) return absl::StrCat("checkpoint ", e.checkpoint().step());
  if (e.has_recovering()) return absl::StrCat("recovering ", e.recovering().lost_worker());
  if (e.has_recovered()) {
    return absl::StrCat("recovered ", e.recovered().stages_before(), " -> ",
                        e.recovered().stages_size(), " stages");
  }
  if (e.has_ended()) return absl::StrCat("ended ", v1::JobState_Name(e.ended().state()));
  if (e.has_skipped()) return absl::StrCat("skipped ", e.skipped().count());
  return "?";
}

class JobEventsTest : public testing::CoreTest {
 protected:
  void Adjust(CoordinatorOptions& options) const override {
    options.job_events = 4;
    options.max_watches_per_job = 3;
  }

  // What the watch reads until it has read everything (at most 100 events).
  std::vector<std::string> ReadAll(const std::string& job, int64_t watch) {
    std::vector<std::string> read;
    for (int i = 0; i < 100; ++i) {
      absl::StatusOr<std::optional<v1::JobEvent>> next = core_->NextWatchEvent(job, watch);
      EXPECT_TRUE(next.ok()) << next.status();
      if (!next.ok() || !next->has_value()) break;
      read.push_back(Describe(**next));
    }
    return read;
  }

  // The watches' other ends: they outlive every watch (the core is gone before them).
  RecordingWatcher watcher_;
  RecordingWatcher others_;
};

TEST_F(JobEventsTest, ProgressHasTheLastStepAndAnEtaTowardThePlannedSteps) {
  AddWorkers(2);
  v1::JobSpec spec = MakeSpec(2, 2);
  spec.set_planned_steps(10);
  absl::StatusOr<v1::JobStatus> job = CreateJob(spec);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->progress().step(), 0);
  EXPECT_EQ(job->progress().target_step(), 10);
  EXPECT_FALSE(job->progress().has_eta_seconds());  // no pace yet.
  absl::StatusOr<v1::StepResult> last;
  for (int i = 0; i < 3; ++i) {
    last = Step(MakeBatch(job->job(), 4));
    ASSERT_TRUE(last.ok()) << last.status();
  }
  absl::StatusOr<v1::JobStatus> status = core_->GetJob(job->job());
  ASSERT_TRUE(status.ok());
  const v1::JobProgress& p = status->progress();
  EXPECT_EQ(p.step(), 3);
  EXPECT_EQ(p.loss(), last->loss());
  EXPECT_EQ(p.step_ms(), last->step_ms());
  EXPECT_GT(p.samples_per_second(), 0);
  EXPECT_GT(p.updated_unix_ms(), 0);
  EXPECT_EQ(p.target_step(), 10);
  ASSERT_TRUE(p.has_eta_seconds());
  EXPECT_GE(p.eta_seconds(), 0);
  // An ended job has no ETA; its last figures stay.
  absl::StatusOr<v1::JobStatus> done = core_->FinishJob(job->job());
  ASSERT_TRUE(done.ok());
  EXPECT_FALSE(done->progress().has_eta_seconds());
  EXPECT_EQ(done->progress().loss(), last->loss());
}

TEST_F(JobEventsTest, TheTargetCountsFromTheResumedStepAndIsUnknownWithoutPlannedSteps) {
  AddWorkers(2);
  absl::StatusOr<v1::JobStatus> job = CreateJob(MakeSpec(2, 2));
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_TRUE(Step(MakeBatch(job->job(), 4)).ok());
  ASSERT_TRUE(Step(MakeBatch(job->job(), 4)).ok());
  absl::StatusOr<v1::JobStatus> status = core_->GetJob(job->job());
  ASSERT_TRUE(status.ok());
  EXPECT_EQ(status->progress().target_step(), 0);
  EXPECT_FALSE(status->progress().has_eta_seconds());
  ASSERT_TRUE(Checkpoint(job->job(), root_ + "/ck").ok());
  ASSERT_TRUE(core_->CancelJob(job->job(), "resume it").ok());
  v1::JobSpec resumed = MakeSpec(2, 2);
  resumed.set_resume_from(root_ + "/ck");
  resumed.set_planned_steps(5);
  absl::StatusOr<v1::JobStatus> again = CreateJob(resumed);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->progress().target_step(), 7);
  v1::JobSpec bad = MakeSpec(2, 2);
  bad.set_planned_steps(-1);
  EXPECT_EQ(CreateJob(bad).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(JobEventsTest, ALateWatcherReadsTheHistoryThenFollowsTheJob) {
  AddWorkers(2);
  absl::StatusOr<v1::JobStatus> job = CreateJob(MakeSpec(2, 2));
  ASSERT_TRUE(job.ok()) << job.status();
  absl::StatusOr<v1::StepResult> r1 = Step(MakeBatch(job->job(), 4));
  ASSERT_TRUE(r1.ok()) << r1.status();
  ASSERT_TRUE(Checkpoint(job->job(), root_ + "/ck").ok());
  absl::StatusOr<CoordinatorCore::WatchStart> start =
      core_->OpenWatch(job->job(), "", 0, &watcher_);
  ASSERT_TRUE(start.ok()) << start.status();
  EXPECT_EQ(start->status.steps_done(), 1);
  EXPECT_EQ(start->status.state(), v1::JOB_STATE_READY);
  EXPECT_THAT(ReadAll(job->job(), start->watch),
              ElementsAre(absl::StrCat("step 1 loss ", r1->loss()), "checkpoint 1"));
  // It read everything: the next step is handed to it as it commits, then the job's end.
  absl::StatusOr<v1::StepResult> r2 = Step(MakeBatch(job->job(), 4));
  ASSERT_TRUE(r2.ok()) << r2.status();
  std::vector<v1::JobEvent> handed = watcher_.Handed(1);
  ASSERT_EQ(handed.size(), 1u);
  EXPECT_EQ(Describe(handed[0]), absl::StrCat("step 2 loss ", r2->loss()));
  EXPECT_EQ(handed[0].step().step_ms(), r2->step_ms());
  EXPECT_EQ(handed[0].step().samples(), 4);
  EXPECT_EQ(handed[0].sequence(), 3);
  EXPECT_TRUE(ReadAll(job->job(), start->watch).empty());
  ASSERT_TRUE(core_->FinishJob(job->job()).ok());
  handed = watcher_.Handed(2);
  ASSERT_EQ(handed.size(), 2u);
  EXPECT_EQ(Describe(handed[1]), "ended JOB_STATE_DONE");
  EXPECT_EQ(handed[1].ended().steps_done(), 2);
  core_->CloseWatch(job->job(), start->watch);
}

TEST_F(JobEventsTest, TheLogIsBoundedAndASlowWatcherSkipsWhatWasDropped) {
  AddWorkers(2);
  absl::StatusOr<v1::JobStatus> job = CreateJob(MakeSpec(2, 2));
  ASSERT_TRUE(job.ok()) << job.status();
  absl::StatusOr<CoordinatorCore::WatchStart> slow = core_->OpenWatch(job->job(), "", 0, &watcher_);
  ASSERT_TRUE(slow.ok()) << slow.status();
  std::vector<float> losses;
  for (int i = 0; i < 6; ++i) {
    absl::StatusOr<v1::StepResult> r = Step(MakeBatch(job->job(), 4));
    ASSERT_TRUE(r.ok()) << r.status();
    losses.push_back(r->loss());
  }
  // The log keeps 4 events (job_events): steps 1 and 2 are gone, and the watch that did not read
  // them meanwhile is told so, once.
  EXPECT_THAT(
      ReadAll(job->job(), slow->watch),
      ElementsAre("skipped 2", absl::StrCat("step 3 loss ", losses[2]),
                  absl::StrCat("step 4 loss ", losses[3]), absl::StrCat("step 5 loss ", losses[4]),
                  absl::StrCat("step 6 loss ", losses[5])));
  EXPECT_TRUE(watcher_.Handed(0).empty());
  // At most 3 watches per job (max_watches_per_job).
  ASSERT_TRUE(core_->OpenWatch(job->job(), "", 0, &others_).ok());
  ASSERT_TRUE(core_->OpenWatch(job->job(), "", 0, &others_).ok());
  const absl::Status fourth = core_->OpenWatch(job->job(), "", 0, &others_).status();
  EXPECT_EQ(fourth.code(), absl::StatusCode::kResourceExhausted) << fourth;
  EXPECT_THAT(fourth.message(), HasSubstr(job->job()));
  // Closing one makes room.
  core_->CloseWatch(job->job(), slow->watch);
  EXPECT_TRUE(core_->OpenWatch(job->job(), "", 0, &others_).ok());
}

TEST_F(JobEventsTest, AnEndedJobsWatchReadsItsEnd) {
  AddWorkers(2);
  absl::StatusOr<v1::JobStatus> job = CreateJob(MakeSpec(2, 2));
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_TRUE(Step(MakeBatch(job->job(), 4)).ok());
  ASSERT_TRUE(core_->CancelJob(job->job(), "wrong data").ok());
  // Even asked for the events after a later number, the watch reads the job's end.
  absl::StatusOr<CoordinatorCore::WatchStart> start =
      core_->OpenWatch(job->job(), "", 1000, &watcher_);
  ASSERT_TRUE(start.ok()) << start.status();
  EXPECT_EQ(start->status.state(), v1::JOB_STATE_CANCELLED);
  absl::StatusOr<std::optional<v1::JobEvent>> next =
      core_->NextWatchEvent(job->job(), start->watch);
  ASSERT_TRUE(next.ok() && next->has_value()) << next.status();
  EXPECT_EQ((*next)->ended().state(), v1::JOB_STATE_CANCELLED);
  EXPECT_EQ((*next)->ended().reason(), "wrong data");
  EXPECT_EQ((*next)->ended().steps_done(), 1);
  // From the start: the whole (short) history.
  absl::StatusOr<CoordinatorCore::WatchStart> all = core_->OpenWatch(job->job(), "", 0, &watcher_);
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(ReadAll(job->job(), all->watch).back(), "ended JOB_STATE_CANCELLED");
}

TEST_F(JobEventsTest, ARecoveryIsLoggedWithItsNewLayout) {
  AddWorkers(3);  // w2 is the spare.
  absl::StatusOr<v1::JobStatus> job = CreateJob(MakeSpec(2, 2, /*recover=*/true));
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_TRUE(Step(MakeBatch(job->job(), 4)).ok());
  absl::StatusOr<CoordinatorCore::WatchStart> start =
      core_->OpenWatch(job->job(), "", 1, &watcher_);
  ASSERT_TRUE(start.ok()) << start.status();
  EXPECT_TRUE(ReadAll(job->job(), start->watch).empty());  // it waits for what comes next.
  workers_[1]->Gone();
  std::vector<v1::JobEvent> handed = watcher_.Handed(1);
  ASSERT_EQ(handed.size(), 1u);
  EXPECT_EQ(Describe(handed[0]), "recovering w1");
  EXPECT_EQ(handed[0].recovering().cause(), "lost");
  EXPECT_EQ(handed[0].recovering().steps_done(), 1);
  ASSERT_TRUE(AwaitRecovered(job->job()).ok());
  const std::vector<std::string> rest = ReadAll(job->job(), start->watch);
  ASSERT_THAT(rest, ElementsAre("recovered 2 -> 2 stages"));
  absl::StatusOr<CoordinatorCore::WatchStart> late = core_->OpenWatch(job->job(), "", 2, &watcher_);
  ASSERT_TRUE(late.ok());
  absl::StatusOr<std::optional<v1::JobEvent>> recovered =
      core_->NextWatchEvent(job->job(), late->watch);
  ASSERT_TRUE(recovered.ok() && recovered->has_value());
  const v1::JobRecovered& r = (*recovered)->recovered();
  EXPECT_THAT(r.recovery().workers(), ElementsAre("w0", "w2"));
  EXPECT_EQ(r.recovery().generation(), 2);
  ASSERT_EQ(r.stages_size(), 2);
  EXPECT_EQ(r.stages(1).worker(), "w2");
  EXPECT_GT(r.stages(1).chunks_size(), 0);
}

TEST_F(JobEventsTest, OnlyTheOwnerAndAdminMayWatch) {
  AddWorkers(2);
  absl::StatusOr<v1::JobStatus> job = CreateJob(MakeSpec(2, 2), "alice");
  ASSERT_TRUE(job.ok()) << job.status();
  const absl::Status hidden = core_->OpenWatch(job->job(), "bob", 0, &watcher_).status();
  EXPECT_EQ(hidden.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(hidden.message(), absl::StrCat("unknown job '", job->job(), "'"));  // as no such job.
  EXPECT_EQ(core_->OpenWatch("job-none", "alice", 0, &watcher_).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_TRUE(core_->OpenWatch(job->job(), "alice", 0, &watcher_).ok());
  EXPECT_TRUE(core_->OpenWatch(job->job(), "admin", 0, &watcher_).ok());
}

TEST_F(JobEventsTest, ShutdownClosesTheWatches) {
  AddWorkers(2);
  absl::StatusOr<v1::JobStatus> job = CreateJob(MakeSpec(2, 2));
  ASSERT_TRUE(job.ok()) << job.status();
  absl::StatusOr<CoordinatorCore::WatchStart> start =
      core_->OpenWatch(job->job(), "", 0, &watcher_);
  ASSERT_TRUE(start.ok());
  core_->Shutdown();
  ASSERT_TRUE(watcher_.closed().has_value());
  EXPECT_EQ(watcher_.closed()->code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(core_->NextWatchEvent(job->job(), start->watch).status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(core_->OpenWatch(job->job(), "", 0, &watcher_).status().code(),
            absl::StatusCode::kCancelled);
}

// A short client lease: a watched job with no Train stream and no client call is still cancelled
// when its lease runs out, however busily it is watched.
class WatchLeaseTest : public testing::CoreTest {
 protected:
  void Adjust(CoordinatorOptions& options) const override {
    options.client_lease = absl::Milliseconds(300);
    options.housekeeping_interval = absl::Milliseconds(10);
  }
  RecordingWatcher watcher_;
};

TEST_F(WatchLeaseTest, WatchingDoesNotRenewTheClientLease) {
  AddWorkers(2);
  absl::StatusOr<v1::JobStatus> job = CreateJob(MakeSpec(2, 2));
  ASSERT_TRUE(job.ok()) << job.status();
  // Watches opened and read again and again while the lease runs: the job still ends.
  std::optional<v1::JobEvent> ended;
  const absl::Time until = absl::Now() + absl::Seconds(10);
  while (!ended.has_value() && absl::Now() < until) {
    absl::StatusOr<CoordinatorCore::WatchStart> start =
        core_->OpenWatch(job->job(), "", 0, &watcher_);
    ASSERT_TRUE(start.ok()) << start.status();
    for (int i = 0; i < 10; ++i) {
      absl::StatusOr<std::optional<v1::JobEvent>> next =
          core_->NextWatchEvent(job->job(), start->watch);
      ASSERT_TRUE(next.ok()) << next.status();
      if (!next->has_value()) break;
      if ((*next)->has_ended()) ended = **next;
    }
    core_->CloseWatch(job->job(), start->watch);
    absl::SleepFor(absl::Milliseconds(5));
  }
  ASSERT_TRUE(ended.has_value()) << "the watched job was never cancelled";
  EXPECT_EQ(ended->ended().state(), v1::JOB_STATE_CANCELLED);
  EXPECT_THAT(ended->ended().reason(), HasSubstr("client gone"));
}

}  // namespace
}  // namespace pipetrain::coordinator
