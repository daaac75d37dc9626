// Jobs that grow, against fake workers (no sockets): at a step boundary, after a checkpoint taken
// for it, a job with max_stages above its stages takes idle workers of its instruction-set level
// and re-assigns every rank with restore in a new generation; a growth that fails keeps the job
// at its shape (docs/scaling.md, "Jobs that change shape").
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/clock.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/server/coordinator/core_test_fixture.h"

namespace pipetrain::coordinator {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing::MakeBatch;
using testing::MakeSpec;

class JobGrowthTest : public testing::CoreTest {
 protected:
  void Adjust(CoordinatorOptions& options) const override {
    options.growth_dir = root_ + "/growth";
  }
  // kTestModel over 2 stages (1F1B, 2 micro-batches) that may grow to `max_stages`.
  static v1::JobSpec GrowingSpec(int max_stages, bool recover = false) {
    v1::JobSpec spec = MakeSpec(2, 2, recover);
    spec.set_max_stages(max_stages);
    return spec;
  }
  // Adds a fake worker named `name` registered with `isa_levels`.
  void AddWorker(const std::string& name, const std::vector<std::string>& isa_levels) {
    workers_.push_back(std::make_unique<testing::FakeWorker>(core_.get(), name));
    ASSERT_TRUE(workers_.back()->Register(10, isa_levels).ok());
  }
  // The job of worker `name` ("" when idle).
  std::string JobOf(const std::string& name) {
    for (const v1::WorkerInfo& w : core_->ListWorkers()) {
      if (w.name() == name) return w.job();
    }
    return "<unregistered>";
  }
};

TEST_F(JobGrowthTest, GrowsAtTheNextStepBoundaryAfterACheckpointInANewGeneration) {
  AddWorkers(2);
  absl::StatusOr<v1::JobStatus> job = CreateJob(GrowingSpec(3));
  ASSERT_TRUE(job.ok()) << job.status();
  absl::StatusOr<v1::StepResult> first = Step(MakeBatch(job->job(), 4));
  ASSERT_TRUE(first.ok()) << first.status();
  EXPECT_FALSE(first->has_shape_change());  // no idle worker yet.
  AddWorkers(1);
  absl::StatusOr<v1::StepResult> second = Step(MakeBatch(job->job(), 4, 1));
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_EQ(second->step(), 2);
  ASSERT_TRUE(second->has_shape_change());
  const v1::ShapeChange& c = second->shape_change();
  EXPECT_EQ(c.failed(), "");
  EXPECT_EQ(c.step(), 1);
  EXPECT_EQ(c.stages_before(), 2);
  EXPECT_EQ(c.stages(), 3);
  EXPECT_EQ(c.replicas_before(), 1);
  EXPECT_EQ(c.replicas(), 1);
  EXPECT_THAT(c.joined(), ElementsAre("w2"));
  EXPECT_THAT(c.workers(), ElementsAre("w0", "w1", "w2"));
  EXPECT_EQ(c.generation(), 2);
  EXPECT_EQ(c.checkpoint(), root_ + "/growth/" + job->job());
  // The checkpoint came first, at the step boundary; then every rank restored from it.
  const std::vector<std::string> kinds = workers_[0]->Received();
  const auto saved = std::find(kinds.begin(), kinds.end(), "save_shards");
  ASSERT_NE(saved, kinds.end());
  EXPECT_NE(std::find(saved, kinds.end(), "assign"), kinds.end());
  EXPECT_TRUE(std::filesystem::exists(c.checkpoint() + "/manifest.json"));
  for (int w = 0; w < 3; ++w) {
    const v1::Assign a = workers_[w]->assign();
    EXPECT_EQ(a.generation(), 2);
    EXPECT_EQ(a.rank(), w);
    EXPECT_EQ(a.stages(), 3);
    EXPECT_TRUE(a.restore());
    EXPECT_EQ(a.restore_step(), 1);
  }
  absl::StatusOr<v1::JobStatus> status = core_->GetJob(job->job());
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_EQ(status->state(), v1::JOB_STATE_READY);
  EXPECT_EQ(status->spec().stages(), 3);
  EXPECT_EQ(status->stages_size(), 3);
  EXPECT_EQ(status->generation(), 2);
  ASSERT_EQ(status->shape_changes_size(), 1);
  EXPECT_EQ(status->shape_changes(0).stages(), 3);
  // At max_stages: the next step runs in the same generation.
  absl::StatusOr<v1::StepResult> third = Step(MakeBatch(job->job(), 4, 2));
  ASSERT_TRUE(third.ok()) << third.status();
  EXPECT_FALSE(third->has_shape_change());
  EXPECT_EQ(third->step(), 3);
  // Once the job is done, its growth checkpoint goes (its thread's last task removes it).
  ASSERT_TRUE(core_->FinishJob(job->job()).ok());
  bool gone = false;
  for (int poll = 0; poll < 1000 && !gone; ++poll) {
    gone = !std::filesystem::exists(c.checkpoint());
    if (!gone) absl::SleepFor(absl::Milliseconds(10));  // polling a bounded wait.
  }
  EXPECT_TRUE(gone) << c.checkpoint();
}

TEST_F(JobGrowthTest, GrowsNoFurtherThanMaxStages) {
  AddWorkers(2);
  absl::StatusOr<v1::JobStatus> job = CreateJob(GrowingSpec(3));
  ASSERT_TRUE(job.ok()) << job.status();
  AddWorkers(2);
  absl::StatusOr<v1::StepResult> r = Step(MakeBatch(job->job(), 4));
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(r->has_shape_change());
  EXPECT_EQ(r->shape_change().stages(), 3);
  EXPECT_THAT(r->shape_change().joined(), ElementsAre("w2"));
  EXPECT_EQ(JobOf("w3"), "");  // left idle.
  r = Step(MakeBatch(job->job(), 4));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->has_shape_change());
}

// With max_replicas the job doubles its replicas before it adds stages (NextShape): 2 idle
// workers complete a second pipeline of 2 stages, so it grows to 2 stages x 2 replicas on all four,
// placed by speed (equal here: consecutive workers share a rank), and trains on in that shape.
TEST_F(JobGrowthTest, GrowsReplicasFirstWhenMaxReplicasAllows) {
  AddWorkers(2);
  v1::JobSpec spec = GrowingSpec(3);
  spec.set_max_replicas(2);
  absl::StatusOr<v1::JobStatus> job = CreateJob(spec);
  ASSERT_TRUE(job.ok()) << job.status();
  AddWorkers(2);
  absl::StatusOr<v1::StepResult> r = Step(MakeBatch(job->job(), 4));
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(r->has_shape_change());
  const v1::ShapeChange& c = r->shape_change();
  EXPECT_EQ(c.failed(), "");
  EXPECT_EQ(c.stages_before(), 2);
  EXPECT_EQ(c.stages(), 2);
  EXPECT_EQ(c.replicas_before(), 1);
  EXPECT_EQ(c.replicas(), 2);
  EXPECT_THAT(c.joined(), ElementsAre("w2", "w3"));
  EXPECT_THAT(c.workers(), ElementsAre("w0", "w2", "w1", "w3"));
  for (const std::string name : {"w0", "w1", "w2", "w3"}) EXPECT_EQ(JobOf(name), job->job());
  absl::StatusOr<v1::JobStatus> status = core_->GetJob(job->job());
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_EQ(status->spec().replicas(), 2);
  EXPECT_EQ(status->spec().stages(), 2);
  r = Step(MakeBatch(job->job(), 4));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->has_shape_change());
  EXPECT_EQ(r->microbatch_losses_size(), 2);
}

// A batch that arrives on the Train stream while the job grows (its ranks being assigned, the
// core's lock released) is the job's next step: the stream's claim moved with the generation at
// once, so the batch is not refused as a stale stream's (its client lost nothing to replay, and
// `pipetrain train` would fail on such a refusal).
TEST_F(JobGrowthTest, ABatchArrivingWhileTheJobGrowsIsItsNextStep) {
  AddWorkers(2);
  absl::StatusOr<v1::JobStatus> job = CreateJob(GrowingSpec(3));
  ASSERT_TRUE(job.ok()) << job.status();
  const int stream = 0;  // the Train stream's identity.
  ASSERT_TRUE(core_->ClaimJob(job->job(), &stream).ok());
  ASSERT_TRUE(ClientStep(MakeBatch(job->job(), 4)).ok());
  AddWorkers(1);
  workers_[2]->GateAssigns();
  absl::StatusOr<v1::StepResult> grown = absl::UnknownError("not run");
  std::thread growing([&] { grown = ClientStep(MakeBatch(job->job(), 4, 1)); });
  ASSERT_TRUE(workers_[2]->WaitFor("assign"));  // the growth waits for w2's Assigned now.
  absl::Notification third_done;
  absl::StatusOr<v1::StepResult> third = absl::UnknownError("not run");
  const absl::Status posted = core_->PostClientRequest(job->job(), [&] {
    third = core_->TrainStep(MakeBatch(job->job(), 4, 2), [] { return false; });
    third_done.Notify();
  });
  workers_[2]->OpenAssigns();
  growing.join();
  ASSERT_TRUE(posted.ok()) << posted;
  ASSERT_TRUE(grown.ok()) << grown.status();
  ASSERT_TRUE(grown->has_shape_change());
  EXPECT_EQ(grown->shape_change().stages(), 3);
  ASSERT_TRUE(third_done.WaitForNotificationWithTimeout(absl::Seconds(10)));
  ASSERT_TRUE(third.ok()) << third.status();
  EXPECT_EQ(third->step(), 3);
  core_->ReleaseJob(job->job(), &stream);
}

TEST_F(JobGrowthTest, DoesNotGrowWithoutMaxStages) {
  AddWorkers(2);
  absl::StatusOr<v1::JobStatus> job = CreateJob(MakeSpec(2, 2));
  ASSERT_TRUE(job.ok()) << job.status();
  AddWorkers(1);
  absl::StatusOr<v1::StepResult> r = Step(MakeBatch(job->job(), 4));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->has_shape_change());
  EXPECT_EQ(JobOf("w2"), "");
}

TEST_F(JobGrowthTest, DoesNotGrowOntoAnIdleWorkerOfAnotherInstructionSetLevel) {
  AddWorker("w0", {"generic", "x86-64-v3"});
  AddWorker("w1", {"generic", "x86-64-v3"});
  v1::JobSpec spec = GrowingSpec(3);
  spec.set_isa("x86-64-v3");
  absl::StatusOr<v1::JobStatus> job = CreateJob(spec);
  ASSERT_TRUE(job.ok()) << job.status();
  AddWorker("w2", {"generic"});
  absl::StatusOr<v1::StepResult> r = Step(MakeBatch(job->job(), 4));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->has_shape_change());
  EXPECT_EQ(JobOf("w2"), "");
  // One that runs the job's level is taken.
  AddWorker("w3", {"generic", "x86-64-v3"});
  r = Step(MakeBatch(job->job(), 4));
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_TRUE(r->has_shape_change());
  EXPECT_THAT(r->shape_change().joined(), ElementsAre("w3"));
}

TEST_F(JobGrowthTest, AFailingCheckpointLeavesTheJobAtItsShapeAndTraining) {
  // The growth directory cannot be made: a file is in the way.
  CoordinatorOptions options = Options();
  options.growth_dir = root_ + "/blocked/growth";
  std::ofstream(root_ + "/blocked") << "a file, not a directory";
  ReplaceCore(options);
  AddWorkers(2);
  absl::StatusOr<v1::JobStatus> job = CreateJob(GrowingSpec(3));
  ASSERT_TRUE(job.ok()) << job.status();
  AddWorkers(1);
  absl::StatusOr<v1::StepResult> r = Step(MakeBatch(job->job(), 4));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->step(), 1);
  ASSERT_TRUE(r->has_shape_change());
  EXPECT_THAT(r->shape_change().failed(), HasSubstr("the checkpoint for it failed"));
  EXPECT_EQ(r->shape_change().stages(), 2);
  EXPECT_EQ(r->shape_change().stages_before(), 2);
  EXPECT_EQ(JobOf("w2"), "");
  // Not tried again with the same idle workers: the next step just runs.
  r = Step(MakeBatch(job->job(), 4, 1));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->has_shape_change());
  EXPECT_EQ(r->step(), 2);
  absl::StatusOr<v1::JobStatus> status = core_->GetJob(job->job());
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_EQ(status->state(), v1::JOB_STATE_READY);
  EXPECT_EQ(status->generation(), 1);
  EXPECT_EQ(status->spec().stages(), 2);
  ASSERT_EQ(status->shape_changes_size(), 1);
  EXPECT_THAT(status->shape_changes(0).failed(), HasSubstr("checkpoint"));
  // The file in the way of the growth directory is nobody's to remove.
  ASSERT_TRUE(core_->FinishJob(job->job()).ok());
  EXPECT_TRUE(std::filesystem::is_regular_file(root_ + "/blocked"));
}

TEST_F(JobGrowthTest, AJoiningWorkerLostDuringTheGrowthLeavesTheJobAtItsShape) {
  AddWorkers(2);
  absl::StatusOr<v1::JobStatus> job = CreateJob(GrowingSpec(3));
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_TRUE(Step(MakeBatch(job->job(), 4)).ok());
  AddWorkers(1);
  workers_[2]->HoldAssigns();
  absl::StatusOr<v1::StepResult> r = absl::UnknownError("not run");
  std::thread step([&] { r = Step(MakeBatch(job->job(), 4, 1)); });
  ASSERT_TRUE(workers_[2]->WaitFor("assign"));
  workers_[2]->Gone();
  step.join();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->step(), 2);
  ASSERT_TRUE(r->has_shape_change());
  EXPECT_THAT(r->shape_change().failed(), HasSubstr("worker 'w2', joining job"));
  EXPECT_EQ(r->shape_change().stages(), 2);
  // Generation 2 was the growth's; 3 is the old layout restored from the growth's checkpoint.
  EXPECT_EQ(r->shape_change().generation(), 3);
  EXPECT_EQ(workers_[0]->assign().generation(), 3);
  EXPECT_EQ(workers_[1]->assign().stages(), 2);
  absl::StatusOr<v1::JobStatus> status = core_->GetJob(job->job());
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_EQ(status->state(), v1::JOB_STATE_READY);
  EXPECT_EQ(status->steps_done(), 2);
  EXPECT_EQ(status->recoveries_size(), 0);
}

class JobGrowthShortAssignTest : public JobGrowthTest {
 protected:
  void Adjust(CoordinatorOptions& options) const override {
    JobGrowthTest::Adjust(options);
    options.assign_timeout = absl::Seconds(1);
  }
};

TEST_F(JobGrowthShortAssignTest, AJoiningWorkerThatNeverAnswersIsEvictedAndTheJobKeepsItsShape) {
  AddWorkers(2);
  absl::StatusOr<v1::JobStatus> job = CreateJob(GrowingSpec(3));
  ASSERT_TRUE(job.ok()) << job.status();
  AddWorkers(1);
  workers_[2]->HoldAssigns();  // hung: it neither answers nor goes.
  absl::StatusOr<v1::StepResult> r = Step(MakeBatch(job->job(), 4, 0));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->step(), 1);
  ASSERT_TRUE(r->has_shape_change());
  EXPECT_THAT(r->shape_change().failed(), HasSubstr("assigning 3 stages failed"));
  EXPECT_EQ(r->shape_change().stages(), 2);
  EXPECT_EQ(JobOf("w2"), "<unregistered>");  // evicted: it is not chosen again.
  EXPECT_TRUE(workers_[2]->closed().has_value());
  r = Step(MakeBatch(job->job(), 4, 1));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_FALSE(r->has_shape_change());
  EXPECT_EQ(r->step(), 2);
}

TEST_F(JobGrowthShortAssignTest, AnOldWorkerLostDuringTheGrowthRecoversFromItsCheckpoint) {
  AddWorkers(2);
  absl::StatusOr<v1::JobStatus> job = CreateJob(GrowingSpec(3, /*recover=*/true));
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_TRUE(Step(MakeBatch(job->job(), 4)).ok());
  AddWorkers(1);
  workers_[2]->HoldAssigns();  // w2 hangs: evicted after the assign timeout, whoever waits.
  absl::StatusOr<v1::StepResult> r = absl::UnknownError("not run");
  std::thread step([&] { r = Step(MakeBatch(job->job(), 4, 1)); });
  ASSERT_TRUE(workers_[2]->WaitFor("assign"));
  AddWorkers(2);  // spares for the recovery.
  workers_[1]->Gone();
  step.join();
  // However the loss and the growth interleave, the job recovers from the growth's checkpoint.
  absl::StatusOr<v1::JobStatus> status = AwaitRecovered(job->job());
  ASSERT_TRUE(status.ok()) << status.status();
  ASSERT_EQ(status->recoveries_size(), 1) << status->DebugString();
  EXPECT_EQ(status->recoveries(0).restored_step(), 1);
  EXPECT_EQ(status->steps_done(), 1);
  absl::StatusOr<v1::StepResult> next = Step(MakeBatch(job->job(), 4, 1));
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(next->step(), 2);
}

}  // namespace
}  // namespace pipetrain::coordinator
