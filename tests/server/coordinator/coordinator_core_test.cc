// CoordinatorCore against fake workers and feed links, without sockets: the step protocol (what
// each rank hears, in which order; what is fed; the loss), a refused data link, a lost worker's
// recovery onto a spare, a checkpoint's upload and publication, and a job restored from it. Each
// test runs in milliseconds; the gRPC shell is covered by coordinator_service_test.
#include "server/coordinator/coordinator_core.h"

#include <filesystem>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/model/checkpoint.h"
#include "common/model/model.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "pipetrain/v1/worker_control.pb.h"
#include "tests/server/coordinator/core_test_fixture.h"
#include "tests/server/coordinator/fake_worker.h"

namespace pipetrain::coordinator {
namespace {

using testing::CoordinatorCoreTest;
using ::testing::ElementsAre;
using testing::FakeWorker;
using ::testing::HasSubstr;
using testing::MakeBatch;
using testing::MakeSpec;

TEST_F(CoordinatorCoreTest, AStepFeedsRunsReducesAndCommitsInOrder) {
  AddWorkers(2);
  absl::StatusOr<v1::JobStatus> job = CreateJob(MakeSpec(2, 2));
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->state(), v1::JOB_STATE_READY);
  absl::StatusOr<v1::StepResult> r = Step(MakeBatch(job->job(), 4));
  ASSERT_TRUE(r.ok()) << r.status();
  // The last chunk's owner reported 0.25 and 0.5 for step 1: the loss is their sum, in order.
  EXPECT_EQ(r->step(), 1);
  EXPECT_EQ(r->loss(), 0.25f + 0.5f);
  EXPECT_THAT(r->microbatch_losses(), ElementsAre(0.25f, 0.5f));
  // Inputs to the first chunk's owner, targets to the last's, two rows per micro-batch.
  EXPECT_THAT(links_->Sent(0), ElementsAre("input step 1 mb 0 rows 2", "input step 1 mb 1 rows 2"));
  EXPECT_THAT(links_->Sent(1),
              ElementsAre("target step 1 mb 0 rows 2", "target step 1 mb 1 rows 2"));
  for (const auto& w : workers_) {
    EXPECT_THAT(w->Received(), ElementsAre("assign", "open_links", "run_step", "commit"))
        << w->name();
  }
  absl::StatusOr<v1::JobStatus> status = core_->GetJob(job->job());
  ASSERT_TRUE(status.ok());
  EXPECT_EQ(status->steps_done(), 1);
  EXPECT_EQ(status->state(), v1::JOB_STATE_READY);
  // The next batch is step 2: a batch for step 1 again is refused as applied.
  absl::StatusOr<v1::StepResult> again = Step(MakeBatch(job->job(), 4, /*expected_steps_done=*/0));
  EXPECT_EQ(again.status().code(), absl::StatusCode::kFailedPrecondition) << again.status();
  // A step count past 2^53 is no step (and no overflow in the message).
  absl::StatusOr<v1::StepResult> huge =
      Step(MakeBatch(job->job(), 4, std::numeric_limits<int64_t>::max()));
  EXPECT_EQ(huge.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(huge.status().message(), HasSubstr("must be in [0, 2^53), got 9223372036854775807"));
  r = Step(MakeBatch(job->job(), 4, /*expected_steps_done=*/1));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->step(), 2);
  EXPECT_EQ(r->loss(), 1.25f + 1.5f);
}

TEST_F(CoordinatorCoreTest, ABadBatchIsRefusedBeforeAnyWorkerHearsOfIt) {
  AddWorkers(2);
  absl::StatusOr<v1::JobStatus> job = CreateJob(MakeSpec(2, 2));
  ASSERT_TRUE(job.ok()) << job.status();
  absl::StatusOr<v1::StepResult> r = Step(MakeBatch(job->job(), 3));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("not divisible by the job's 2 micro-batches"));
  EXPECT_TRUE(links_->Sent(0).empty());
  EXPECT_THAT(workers_[0]->Received(), ElementsAre("assign", "open_links"));
}

TEST_F(CoordinatorCoreTest, ARefusedDataLinkAbortsTheStepOnEveryRankAndNamesTheLink) {
  AddWorkers(2);
  links_->Refuse(0, absl::UnavailableError("refused by the test"));
  absl::StatusOr<v1::JobStatus> job = CreateJob(MakeSpec(2, 2));
  ASSERT_TRUE(job.ok()) << job.status();
  for (const auto& w : workers_) w->HoldRunSteps();
  absl::StatusOr<v1::StepResult> r = Step(MakeBatch(job->job(), 4));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kUnavailable) << r.status();
  EXPECT_THAT(r.status().message(), HasSubstr("data link to rank 0: refused by the test"));
  for (const auto& w : workers_) {
    ASSERT_TRUE(w->WaitFor("abort"));
    EXPECT_THAT(w->Received(), ElementsAre("assign", "open_links", "run_step", "abort"));
  }
  absl::StatusOr<v1::JobStatus> status = core_->GetJob(job->job());
  ASSERT_TRUE(status.ok());
  EXPECT_EQ(status->state(), v1::JOB_STATE_READY);
  EXPECT_EQ(status->steps_done(), 0);
}

TEST_F(CoordinatorCoreTest, AWorkerErrorFailsTheStepAndLeavesTheJobReady) {
  AddWorkers(2);
  absl::StatusOr<v1::JobStatus> job = CreateJob(MakeSpec(2, 2));
  ASSERT_TRUE(job.ok()) << job.status();
  workers_[1]->FailRunSteps(absl::ResourceExhaustedError("out of memory"));
  absl::StatusOr<v1::StepResult> r = Step(MakeBatch(job->job(), 4));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted) << r.status();
  EXPECT_THAT(r.status().message(), HasSubstr("worker 'w1' (rank 1), step 1: out of memory"));
  ASSERT_TRUE(workers_[0]->WaitFor("abort"));
  workers_[1]->FailRunSteps(absl::OkStatus());
  r = Step(MakeBatch(job->job(), 4));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->step(), 1);
}

TEST_F(CoordinatorCoreTest, ALostWorkerIsReplacedByASpareInANewGeneration) {
  AddWorkers(3);  // w2 is the spare.
  absl::StatusOr<v1::JobStatus> job = CreateJob(MakeSpec(2, 2, /*recover=*/true));
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_TRUE(Step(MakeBatch(job->job(), 4)).ok());
  workers_[1]->Gone();
  absl::StatusOr<v1::JobStatus> status = AwaitJob(job->job(), [](const v1::JobStatus& s) {
    return s.state() == v1::JOB_STATE_READY && s.recoveries_size() == 1;
  });
  ASSERT_TRUE(status.ok()) << status.status();
  ASSERT_EQ(status->recoveries_size(), 1);
  const v1::RecoveryEvent& event = status->recoveries(0);
  EXPECT_EQ(event.lost_worker(), "w1");
  EXPECT_EQ(event.cause(), "lost");
  EXPECT_EQ(event.rank(), 1);
  EXPECT_EQ(event.generation(), 2);
  EXPECT_THAT(event.workers(), ElementsAre("w0", "w2"));
  // No checkpoint: every rank restarts from the initial weights, step 0.
  EXPECT_EQ(status->steps_done(), 0);
  EXPECT_EQ(workers_[2]->assign().generation(), 2);
  EXPECT_EQ(workers_[2]->assign().rank(), 1);
  EXPECT_EQ(workers_[0]->assign().generation(), 2);
  // The client replays: a batch for step 2 is refused (ABORTED, replay from step 1).
  absl::StatusOr<v1::StepResult> stale = Step(MakeBatch(job->job(), 4, /*expected_steps_done=*/1));
  EXPECT_EQ(stale.status().code(), absl::StatusCode::kAborted) << stale.status();
  EXPECT_THAT(stale.status().message(), HasSubstr("replay from step 1"));
  absl::StatusOr<v1::StepResult> r = Step(MakeBatch(job->job(), 4, /*expected_steps_done=*/0));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->step(), 1);
}

TEST_F(CoordinatorCoreTest, ALostWorkerFailsAJobThatDoesNotRecover) {
  AddWorkers(2);
  absl::StatusOr<v1::JobStatus> job = CreateJob(MakeSpec(2, 2));
  ASSERT_TRUE(job.ok()) << job.status();
  workers_[0]->Gone();
  absl::StatusOr<v1::JobStatus> status = core_->GetJob(job->job());
  ASSERT_TRUE(status.ok());
  EXPECT_EQ(status->state(), v1::JOB_STATE_FAILED);
  EXPECT_THAT(status->reason(), HasSubstr("worker 'w0' (rank 0) was lost"));
  // Its other worker is idle again, and was told so.
  ASSERT_TRUE(workers_[1]->WaitFor("release"));
  for (const v1::WorkerInfo& w : core_->ListWorkers()) {
    EXPECT_EQ(w.job(), "") << w.name();
    EXPECT_EQ(w.rank(), -1) << w.name();
  }
}

TEST_F(CoordinatorCoreTest, ACheckpointIsUploadedPublishedAndRestoredAfterALoss) {
  AddWorkers(3);
  absl::StatusOr<v1::JobStatus> job = CreateJob(MakeSpec(2, 2, /*recover=*/true));
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_TRUE(Step(MakeBatch(job->job(), 4)).ok());
  ASSERT_TRUE(Step(MakeBatch(job->job(), 4)).ok());
  absl::StatusOr<v1::CheckpointResponse> saved = Checkpoint(job->job(), root_ + "/ck");
  ASSERT_TRUE(saved.ok()) << saved.status();
  EXPECT_EQ(saved->step(), 2);
  absl::StatusOr<model::CheckpointManifest> manifest = model::VerifyCheckpoint(root_ + "/ck");
  ASSERT_TRUE(manifest.ok()) << manifest.status();
  EXPECT_EQ(manifest->step, 2);
  EXPECT_EQ(manifest->seed, 1);
  // A loss now restarts every rank from the checkpoint: step 2, in generation 2.
  workers_[0]->Gone();
  absl::StatusOr<v1::JobStatus> status = AwaitJob(job->job(), [](const v1::JobStatus& s) {
    return s.state() == v1::JOB_STATE_READY && s.recoveries_size() == 1;
  });
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_EQ(status->steps_done(), 2);
  EXPECT_EQ(status->recoveries(0).restored_step(), 2);
  EXPECT_TRUE(workers_[2]->assign().restore());
  EXPECT_EQ(workers_[2]->assign().restore_step(), 2);
  // The new rank fetches the files of its layers from there.
  v1::FetchStateRequest fetch;
  fetch.set_job(job->job());
  fetch.set_generation(2);
  fetch.set_worker("w2");
  absl::StatusOr<std::vector<StateFile>> files = core_->StateFilesFor(fetch);
  ASSERT_TRUE(files.ok()) << files.status();
  ASSERT_FALSE(files->empty());
  for (const StateFile& f : *files) EXPECT_THAT(f.path, HasSubstr(root_ + "/ck/"));
  // An earlier generation's request is fenced.
  fetch.set_generation(1);
  EXPECT_EQ(core_->StateFilesFor(fetch).status().code(), absl::StatusCode::kAborted);
}

// A job resumes a checkpoint only with the optimizer kind it was trained with (the kind decides
// the state tensors it holds); the hyper-parameters may change.
TEST_F(CoordinatorCoreTest, ResumingWithAnotherOptimizerKindIsRefused) {
  AddWorkers(2);
  absl::StatusOr<v1::JobStatus> job = CreateJob(MakeSpec(2, 2));
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_TRUE(Step(MakeBatch(job->job(), 4)).ok());
  ASSERT_TRUE(Checkpoint(job->job(), root_ + "/ck").ok());
  ASSERT_TRUE(core_->CancelJob(job->job(), "done").ok());
  v1::JobSpec adamw = MakeSpec(2, 2);
  adamw.set_resume_from(root_ + "/ck");
  adamw.mutable_optimizer()->mutable_adamw()->set_lr(0.001f);
  absl::StatusOr<v1::JobStatus> refused = CreateJob(adamw);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kFailedPrecondition) << refused.status();
  EXPECT_THAT(refused.status().message(), HasSubstr("trained with optimizer sgd"));
  v1::JobSpec sgd = MakeSpec(2, 2);
  sgd.set_resume_from(root_ + "/ck");
  sgd.mutable_optimizer()->mutable_sgd()->set_lr(0.05f);
  absl::StatusOr<v1::JobStatus> resumed = CreateJob(sgd);
  ASSERT_TRUE(resumed.ok()) << resumed.status();
  EXPECT_EQ(resumed->steps_done(), 1);
}

TEST_F(CoordinatorCoreTest, ACheckpointOutsideTheRootIsRefusedBeforeAnyWorkerSaves) {
  AddWorkers(2);
  absl::StatusOr<v1::JobStatus> job = CreateJob(MakeSpec(2, 2));
  ASSERT_TRUE(job.ok()) << job.status();
  absl::StatusOr<v1::CheckpointResponse> saved = Checkpoint(job->job(), "/etc/ck");
  EXPECT_EQ(saved.status().code(), absl::StatusCode::kPermissionDenied) << saved.status();
  for (const auto& w : workers_) {
    EXPECT_THAT(w->Received(), ElementsAre("assign", "open_links"));
  }
}

TEST_F(CoordinatorCoreTest, AnUploadOfAnotherRanksLayersIsRefused) {
  AddWorkers(2);
  absl::StatusOr<v1::JobStatus> job = CreateJob(MakeSpec(2, 2));
  ASSERT_TRUE(job.ok()) << job.status();
  v1::PutStateRequest first;
  first.set_job(job->job());
  first.set_generation(1);
  first.set_step(0);
  first.set_worker("w0");
  // No checkpoint in progress.
  EXPECT_EQ(core_->AcceptUpload(first).status().code(), absl::StatusCode::kFailedPrecondition);
  first.set_worker("stranger");
  EXPECT_EQ(core_->AcceptUpload(first).status().code(), absl::StatusCode::kPermissionDenied);
}

TEST_F(CoordinatorCoreTest, RegistrationIsValidatedAndNamesAreUnique) {
  FakeWorker a(core_.get(), "same");
  ASSERT_TRUE(a.Register().ok());
  FakeWorker b(core_.get(), "same");
  EXPECT_EQ(b.Register().code(), absl::StatusCode::kAlreadyExists);
  FakeWorker slow(core_.get(), "slow");
  const absl::Status refused = slow.Register(/*gflops=*/-1);
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.message(), HasSubstr("gflops must be in [1e-06, 1e+09], got -1"));
  ASSERT_EQ(core_->ListWorkers().size(), 1u);
  EXPECT_EQ(core_->ListWorkers()[0].rank(), -1);
}

// A job belongs to the principal that created it: another sees no such job (NOT_FOUND, as an
// unknown one), cannot train, cancel or finish it; admin and unauthenticated callers see all.
TEST_F(CoordinatorCoreTest, OnlyItsOwnerAndAdminSeeAJob) {
  AddWorkers(4);
  absl::StatusOr<v1::JobStatus> alices = CreateJob(MakeSpec(2, 2), "alice");
  ASSERT_TRUE(alices.ok()) << alices.status();
  EXPECT_EQ(alices->owner(), "alice");
  absl::StatusOr<v1::JobStatus> bobs = CreateJob(MakeSpec(2, 2), "bob");
  ASSERT_TRUE(bobs.ok()) << bobs.status();
  const std::string id = alices->job();
  const absl::Status hidden = core_->GetJob(id, "bob").status();
  EXPECT_EQ(hidden.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(hidden.message(), absl::StrCat("unknown job '", id, "'"));  // as for no such job.
  EXPECT_EQ(core_->CancelJob(id, "mine now", "bob").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(core_->FinishJob(id, "bob").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(core_->ClaimJob(id, this, "bob").code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(core_->CheckCaller(id, "bob").code(), absl::StatusCode::kNotFound);
  auto ids = [this](const std::string& caller) {
    std::vector<std::string> out;
    for (const v1::JobStatus& j : core_->ListJobs(caller)) out.push_back(j.owner());
    return out;
  };
  EXPECT_THAT(ids("bob"), ElementsAre("bob"));
  EXPECT_THAT(ids("alice"), ElementsAre("alice"));
  EXPECT_THAT(ids("admin"), ElementsAre("alice", "bob"));
  EXPECT_THAT(ids(""), ElementsAre("alice", "bob"));
  EXPECT_TRUE(core_->CheckCaller(id, "alice").ok());
  EXPECT_TRUE(core_->GetJob(id, "admin").ok());
  absl::StatusOr<v1::JobStatus> cancelled = core_->CancelJob(id, "by the admin", "admin");
  ASSERT_TRUE(cancelled.ok()) << cancelled.status();
  EXPECT_EQ(cancelled->state(), v1::JOB_STATE_CANCELLED);
}

TEST_F(CoordinatorCoreTest, TooFewIdleWorkersIsFailedPrecondition) {
  AddWorkers(1);
  absl::StatusOr<v1::JobStatus> job = CreateJob(MakeSpec(2, 2));
  EXPECT_EQ(job.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(job.status().message(), HasSubstr("job needs 2 workers, 1 idle: 1 missing"));
}

}  // namespace
}  // namespace pipetrain::coordinator
