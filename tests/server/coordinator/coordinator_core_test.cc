// CoordinatorCore against fake workers and feed links, without sockets: the step protocol (what
// each rank hears, in which order; what is fed; the loss), a refused data link, a lost worker's
// recovery onto a spare, a checkpoint's upload and publication, and a job restored from it; the
// state directory (one core per directory, a killed coordinator's staging directories removed)
// and the client lease on a fake clock. Each test runs in milliseconds; the gRPC shell is covered
// by coordinator_service_test.
#include "server/coordinator/coordinator_core.h"

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "common/model/checkpoint.h"
#include "common/model/model.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "pipetrain/v1/worker_control.pb.h"
#include "server/coordinator/staging_ledger.h"
#include "tests/server/coordinator/core_test_fixture.h"
#include "tests/server/coordinator/fake_worker.h"

namespace pipetrain::coordinator {
namespace {

using ::testing::ElementsAre;
using testing::FakeWorker;
using ::testing::HasSubstr;
using ::testing::Not;

using CoordinatorCoreTest = testing::CoreTest;
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
  absl::StatusOr<v1::JobStatus> status = AwaitRecovered(job->job());
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

// A client's batch or checkpoint that arrives while the job recovers is refused at once (ABORTED,
// naming the lost worker), not queued behind the recovery, which may wait long for a
// replacement: the client reports the wait and polls. The recovery restores the step the client
// is at (a loss right after a checkpoint), yet the stream that predates it is refused too, so
// that the client hears of it; a new stream continues.
TEST_F(CoordinatorCoreTest, ARecoveryAtACheckpointIsNeverHiddenFromTheClient) {
  AddWorkers(2);  // no spare: the recovery waits for one.
  absl::StatusOr<v1::JobStatus> job = CreateJob(MakeSpec(2, 2, /*recover=*/true));
  ASSERT_TRUE(job.ok()) << job.status();
  const std::string id = job->job();
  int stream = 0, next_stream = 0;  // two Train streams' identities.
  ASSERT_TRUE(core_->ClaimJob(id, &stream).ok());
  ASSERT_TRUE(ClientStep(MakeBatch(id, 4, 0)).ok());
  absl::StatusOr<v1::CheckpointResponse> saved = ClientCheckpoint(id, root_ + "/ck");
  ASSERT_TRUE(saved.ok()) << saved.status();
  EXPECT_EQ(saved->step(), 1);
  workers_[1]->Gone();
  absl::StatusOr<v1::JobStatus> status = core_->GetJob(id);
  ASSERT_TRUE(status.ok());
  ASSERT_EQ(status->state(), v1::JOB_STATE_RECOVERING);
  for (const absl::Status& refused :
       {ClientStep(MakeBatch(id, 4, 1)).status(), ClientCheckpoint(id, root_ + "/ck").status()}) {
    EXPECT_EQ(refused.code(), absl::StatusCode::kAborted) << refused;
    EXPECT_THAT(refused.message(), HasSubstr("is recovering (worker 'w1' lost)"));
  }
  AddWorkers(1);  // the replacement.
  status = AwaitRecovered(id);
  ASSERT_TRUE(status.ok()) << status.status();
  ASSERT_EQ(status->steps_done(), 1);  // the client's step: nothing to replay.
  // The old stream's next batch names the right step and is still refused, as is a checkpoint
  // while it holds the job; posted or already queued, both are checked.
  const std::string recovered = absl::StrCat(
      "job '", id, "' went through a recovery (lost: worker 'w1', after step 1) since its Train ",
      "stream began: it restarted from step 1 in generation 2");
  for (const absl::Status& refused :
       {ClientStep(MakeBatch(id, 4, 1)).status(), Step(MakeBatch(id, 4, 1)).status(),
        ClientCheckpoint(id, root_ + "/ck").status(), Checkpoint(id, root_ + "/ck").status()}) {
    EXPECT_EQ(refused.code(), absl::StatusCode::kAborted) << refused;
    EXPECT_THAT(refused.message(), HasSubstr(recovered));
  }
  core_->ReleaseJob(id, &stream);
  ASSERT_TRUE(core_->ClaimJob(id, &next_stream).ok());
  absl::StatusOr<v1::StepResult> r = ClientStep(MakeBatch(id, 4, 1));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->step(), 2);
  saved = ClientCheckpoint(id, root_ + "/ck");
  ASSERT_TRUE(saved.ok()) << saved.status();
  EXPECT_EQ(saved->step(), 2);
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
  absl::StatusOr<v1::JobStatus> status = AwaitRecovered(job->job());
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

// ------------------------------------------------------------------ the state directory

// A coordinator killed while its workers uploaded a checkpoint left the staging ledger's record
// and the staging directory; the next coordinator on the state directory removes that directory
// and nothing else beside the checkpoint. Its own checkpoints leave no record behind.
TEST_F(CoordinatorCoreTest, ARestartRemovesTheStagingDirectoryAKilledCoordinatorLeft) {
  const std::string state = root_ + "/state";
  const std::string ck = root_ + "/ck";
  std::string staging;
  {
    // What the killed coordinator had done (CoordinatorCore::RecordedCheckpoint): the record,
    // then the staging directory, half uploaded.
    absl::StatusOr<std::unique_ptr<StagingLedger>> ledger = StagingLedger::Open(state);
    ASSERT_TRUE(ledger.ok()) << ledger.status();
    ASSERT_TRUE((*ledger)->Begin("job-0123abcd-1", ck).ok());
    absl::StatusOr<std::string> made = model::BeginCheckpointStaging(ck);
    ASSERT_TRUE(made.ok()) << made.status();
    staging = *made;
    std::ofstream(staging + "/layer-00000.safetensors") << "half a layer";
  }
  // Not its own: another process's staging directory of the same checkpoint, a user's directory.
  const std::string others = absl::StrCat(ck, ".tmp-", getpid() + 1, "-0123456789abcdef");
  const std::string users = ck + ".tmp-mine";
  std::filesystem::create_directories(others);
  std::filesystem::create_directories(users);
  ASSERT_TRUE(core_->OpenJournal(state).ok());
  EXPECT_FALSE(std::filesystem::exists(staging));
  EXPECT_TRUE(std::filesystem::exists(others));
  EXPECT_TRUE(std::filesystem::exists(users));
  EXPECT_TRUE(std::filesystem::is_empty(state + "/staging"));
  // A checkpoint that completes drops its record.
  AddWorkers(2);
  absl::StatusOr<v1::JobStatus> job = CreateJob(MakeSpec(2, 2));
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_TRUE(Checkpoint(job->job(), ck).ok());
  EXPECT_TRUE(std::filesystem::is_empty(state + "/staging"));
  EXPECT_TRUE(model::VerifyCheckpoint(ck).ok());
}

// Two coordinators on one state directory would both continue its jobs, and the first to end one
// would delete the other's journal record: the second is refused, naming the first.
TEST_F(CoordinatorCoreTest, ASecondCoreOnTheSameStateDirectoryIsRefused) {
  const std::string state = root_ + "/state";
  ASSERT_TRUE(core_->OpenJournal(state, "127.0.0.1:0").ok());
  core_->RecordListenAddress("127.0.0.1:7070");
  CoordinatorCore second(Options(), links_);
  const absl::Status refused = second.OpenJournal(state, "127.0.0.1:7071");
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition) << refused;
  EXPECT_THAT(refused.message(),
              HasSubstr(absl::StrCat("state directory ", state,
                                     " is in use by another coordinator (pid ", getpid())));
  EXPECT_THAT(refused.message(), HasSubstr("serving on 127.0.0.1:7070"));
  EXPECT_THAT(refused.message(), HasSubstr("one coordinator per state directory"));
  ReplaceCore(Options());  // the first one is gone: its lock with it.
  EXPECT_TRUE(second.OpenJournal(state).ok());
}

// ------------------------------------------------------------------ the client lease

// A clock that moves only when the test moves it.
class FakeClock {
 public:
  absl::Time Now() const {
    absl::MutexLock lock(&mu_);
    return now_;
  }
  void Advance(absl::Duration d) {
    absl::MutexLock lock(&mu_);
    now_ += d;
  }

 private:
  mutable absl::Mutex mu_;
  absl::Time now_ ABSL_GUARDED_BY(mu_) = absl::FromUnixSeconds(1800000000);
};

// The lease on a fake clock, looked at only when the test runs a housekeeping pass.
class CoordinatorLeaseCoreTest : public CoordinatorCoreTest {
 protected:
  void SetUp() override {
    CoordinatorCoreTest::SetUp();
    CoordinatorOptions options = Options();
    options.client_lease = absl::Minutes(5);
    options.housekeeping_interval = absl::Hours(24);
    options.clock = [this] { return clock_.Now(); };
    ReplaceCore(options);
  }

  // The job's state after a housekeeping pass at the clock's time.
  v1::JobState StateAfterHousekeeping(const std::string& job) {
    core_->RunHousekeeping();
    absl::StatusOr<v1::JobStatus> status = core_->GetJob(job);
    return status.ok() ? status->state() : v1::JOB_STATE_UNSPECIFIED;
  }

  FakeClock clock_;
};

// `pipetrain status` polled every 10 s kept a dead client's job and its workers forever.
TEST_F(CoordinatorLeaseCoreTest, ReadOnlyQueriesDoNotRenewTheClientLease) {
  AddWorkers(2);
  absl::StatusOr<v1::JobStatus> job = CreateJob(MakeSpec(2, 2));
  ASSERT_TRUE(job.ok()) << job.status();
  for (int poll = 1; poll < 30; ++poll) {
    clock_.Advance(absl::Seconds(10));
    ASSERT_TRUE(core_->GetJob(job->job()).ok());
    EXPECT_EQ(core_->ListJobs().size(), 1u);
    EXPECT_EQ(core_->ListWorkers().size(), 2u);
    ASSERT_EQ(StateAfterHousekeeping(job->job()), v1::JOB_STATE_READY) << poll * 10 << " s";
  }
  clock_.Advance(absl::Seconds(10));  // 5 minutes since it became READY.
  EXPECT_EQ(StateAfterHousekeeping(job->job()), v1::JOB_STATE_CANCELLED);
  absl::StatusOr<v1::JobStatus> ended = core_->GetJob(job->job());
  ASSERT_TRUE(ended.ok());
  EXPECT_THAT(ended->reason(), HasSubstr("client gone: no Train stream or Checkpoint for 5m"));
  for (const auto& w : workers_) EXPECT_TRUE(w->WaitFor("release")) << w->name();
}

// The training client's own calls hold the lease while they last and renew it when they end.
TEST_F(CoordinatorLeaseCoreTest, TheClientsTrainStreamAndCheckpointsHoldAndRenewTheLease) {
  AddWorkers(2);
  absl::StatusOr<v1::JobStatus> job = CreateJob(MakeSpec(2, 2));
  ASSERT_TRUE(job.ok()) << job.status();
  const std::string id = job->job();
  clock_.Advance(absl::Minutes(4));
  int stream = 0;  // a Train stream's identity.
  ASSERT_TRUE(core_->ClaimJob(id, &stream).ok());
  clock_.Advance(absl::Hours(1));
  EXPECT_EQ(StateAfterHousekeeping(id), v1::JOB_STATE_READY);  // held by the open stream.
  core_->ReleaseJob(id, &stream);
  clock_.Advance(absl::Minutes(5) - absl::Seconds(1));
  EXPECT_EQ(StateAfterHousekeeping(id), v1::JOB_STATE_READY);
  ASSERT_TRUE(Checkpoint(id, root_ + "/ck").ok());  // renews the lease when it is over.
  clock_.Advance(absl::Minutes(5) - absl::Seconds(1));
  EXPECT_EQ(StateAfterHousekeeping(id), v1::JOB_STATE_READY);
  clock_.Advance(absl::Seconds(1));
  EXPECT_EQ(StateAfterHousekeeping(id), v1::JOB_STATE_CANCELLED);
}

// While a job recovers, its client can only wait (polling GetJob, which renews nothing): the
// lease stops, and starts again in full when the job is READY.
TEST_F(CoordinatorLeaseCoreTest, ARecoveringJobsLeaseStartsAgainWhenItIsReady) {
  AddWorkers(2);
  absl::StatusOr<v1::JobStatus> job = CreateJob(MakeSpec(2, 2, /*recover=*/true));
  ASSERT_TRUE(job.ok()) << job.status();
  const std::string id = job->job();
  clock_.Advance(absl::Minutes(4));
  workers_[1]->Gone();  // no spare yet: the job waits for one.
  clock_.Advance(absl::Hours(1));
  EXPECT_EQ(StateAfterHousekeeping(id), v1::JOB_STATE_RECOVERING);
  AddWorkers(1);
  absl::StatusOr<v1::JobStatus> status = AwaitRecovered(id);
  ASSERT_TRUE(status.ok()) << status.status();
  ASSERT_EQ(status->state(), v1::JOB_STATE_READY);
  clock_.Advance(absl::Minutes(5) - absl::Seconds(1));
  EXPECT_EQ(StateAfterHousekeeping(id), v1::JOB_STATE_READY);
  clock_.Advance(absl::Seconds(1));
  EXPECT_EQ(StateAfterHousekeeping(id), v1::JOB_STATE_CANCELLED);
}

// ---------------------------------------------------------------- where a job saves

// A Checkpoint of `request` on its job's thread, as the service runs it.
absl::StatusOr<v1::CheckpointResponse> RunCheckpoint(CoordinatorCore* core,
                                                     const v1::CheckpointRequest& request) {
  absl::Notification done;
  absl::StatusOr<v1::CheckpointResponse> result = absl::UnknownError("not run");
  const absl::Status posted = core->PostToJob(request.job(), [&] {
    result = core->Checkpoint(request);
    done.Notify();
  });
  if (!posted.ok()) return posted;
  done.WaitForNotification();
  return result;
}

// JobSpec.save_to is checked when the job is created, as a Checkpoint into it would be, before
// any worker hears of the job: a run is refused before it trains, never when it saves.
TEST_F(CoordinatorCoreTest, ASaveDirectoryIsCheckedWhenTheJobIsCreated) {
  AddWorkers(2);
  v1::JobSpec spec = MakeSpec(2, 2);
  spec.set_save_to("/etc/ck");
  absl::StatusOr<v1::JobStatus> job = CreateJob(spec);
  EXPECT_EQ(job.status().code(), absl::StatusCode::kPermissionDenied) << job.status();
  EXPECT_THAT(job.status().message(),
              HasSubstr(absl::StrCat("save_to: '/etc/ck' is outside the checkpoint root ")));
  EXPECT_THAT(job.status().message(), HasSubstr(std::filesystem::canonical(root_).string()));
  spec.set_save_to(root_);  // earlier checkpoints would go beside the root, outside it.
  spec.set_keep_checkpoints(2);
  EXPECT_EQ(CreateJob(spec).status().code(), absl::StatusCode::kInvalidArgument);
  std::filesystem::create_directories(root_ + "/busy");
  std::ofstream(root_ + "/busy/notes.txt") << "mine";
  spec.set_save_to(root_ + "/busy");  // a save would delete notes.txt.
  job = CreateJob(spec);
  EXPECT_EQ(job.status().code(), absl::StatusCode::kFailedPrecondition) << job.status();
  EXPECT_THAT(job.status().message(), HasSubstr("notes.txt"));
  spec.set_save_to(std::string("/etc/ck\0x", 9));  // the system calls would use "/etc/ck".
  EXPECT_EQ(CreateJob(spec).status().code(), absl::StatusCode::kInvalidArgument);
  for (const auto& w : workers_) EXPECT_THAT(w->Received(), ::testing::IsEmpty());
  EXPECT_THAT(core_->ListJobs(), ::testing::IsEmpty());
  // A relative path is under the root; the job runs with the confined path.
  spec.set_save_to("runs/ck");
  job = CreateJob(spec);
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->spec().save_to(), root_ + "/runs/ck");
  EXPECT_EQ(job->spec().keep_checkpoints(), 2);
}

// One job writes a checkpoint directory at a time: the one it declared (save_to) and the one it
// last checkpointed into are its own until it ends; a CreateJob or Checkpoint naming them, a
// directory inside them, one they lie in or their kept checkpoints is refused, naming the job
// (unless the caller may not see it).
TEST_F(CoordinatorCoreTest, OneJobWritesACheckpointDirectoryAtATime) {
  AddWorkers(3);
  const std::string d = root_ + "/d";
  v1::JobSpec spec = MakeSpec(1, 2);
  spec.set_save_to(d);
  absl::StatusOr<v1::JobStatus> a = CreateJob(spec, "alice");
  ASSERT_TRUE(a.ok()) << a.status();
  const std::vector<std::pair<std::string, std::string>> refused = {
      {d, "is written by job " + a->job() + " (its save_to)"},
      {d + "/x", "lies inside '" + d + "', written by job " + a->job()},
      {root_, "holds '" + d + "'"},
      {d + ".step-000000000003", "is a kept checkpoint or staging directory of '" + d + "'"}};
  for (const auto& [path, words] : refused) {
    SCOPED_TRACE(path);
    spec.set_save_to(path);
    const absl::Status second = CreateJob(spec, "alice").status();
    EXPECT_EQ(second.code(), absl::StatusCode::kFailedPrecondition) << second;
    EXPECT_THAT(std::string(second.message()), HasSubstr(words));
    EXPECT_THAT(std::string(second.message()),
                HasSubstr("one job writes a checkpoint directory at a time"));
  }
  spec.set_save_to(d);
  const absl::Status hidden = CreateJob(spec, "bob").status();
  EXPECT_THAT(std::string(hidden.message()), HasSubstr("written by another client's job"));
  EXPECT_THAT(std::string(hidden.message()), Not(HasSubstr(a->job())));

  spec.set_save_to(root_ + "/e");
  absl::StatusOr<v1::JobStatus> b = CreateJob(spec, "alice");
  ASSERT_TRUE(b.ok()) << b.status();
  ASSERT_TRUE(Step(MakeBatch(b->job(), 4)).ok());
  const absl::Status into_a = Checkpoint(b->job(), d + "/x").status();
  EXPECT_EQ(into_a.code(), absl::StatusCode::kFailedPrecondition) << into_a;
  EXPECT_THAT(std::string(into_a.message()), HasSubstr("written by job " + a->job()));
  // A directory a job checkpointed into without declaring it is its own too.
  ASSERT_TRUE(Checkpoint(b->job(), root_ + "/f").ok());
  spec.set_save_to(root_ + "/f");
  const absl::Status into_b = CreateJob(spec, "alice").status();
  EXPECT_THAT(std::string(into_b.message()),
              HasSubstr("written by job " + b->job() + " (its last checkpoint)"));
  ASSERT_TRUE(Step(MakeBatch(a->job(), 4)).ok());
  EXPECT_TRUE(Checkpoint(a->job(), d).ok());
  // Once the job ended, its directories are free.
  ASSERT_TRUE(core_->CancelJob(a->job(), "done").ok());
  absl::StatusOr<v1::CheckpointResponse> taken = Checkpoint(b->job(), d);
  ASSERT_TRUE(taken.ok()) << taken.status();
  EXPECT_EQ(taken->step(), 1);
}

// The client's data position goes into the manifest, and stays with the job for that step: a
// retry of a failed save without one (`pipetrain checkpoint`) writes it too; a later step's
// checkpoint does not.
TEST_F(CoordinatorCoreTest, ACheckpointKeepsTheClientsDataPositionForARetry) {
  AddWorkers(2);
  absl::StatusOr<v1::JobStatus> job = CreateJob(MakeSpec(2, 2));
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_TRUE(Step(MakeBatch(job->job(), 4)).ok());
  v1::CheckpointRequest request;
  request.set_job(job->job());
  request.set_directory(root_ + "/gone/ck");
  request.mutable_data_position()->set_data("digits");
  request.mutable_data_position()->set_batch_size(16);
  request.mutable_data_position()->set_cursor_epoch(2);
  request.mutable_data_position()->set_cursor_batch(-1);
  absl::StatusOr<v1::CheckpointResponse> saved = RunCheckpoint(core_.get(), request);
  EXPECT_EQ(saved.status().code(), absl::StatusCode::kInvalidArgument) << saved.status();
  EXPECT_THAT(saved.status().message(), HasSubstr("data_position.cursor_batch"));
  request.mutable_data_position()->set_cursor_batch(5);
  std::ofstream(root_ + "/gone") << "not a directory";
  saved = RunCheckpoint(core_.get(), request);
  EXPECT_FALSE(saved.ok());
  absl::StatusOr<v1::JobStatus> status = core_->GetJob(job->job());
  ASSERT_TRUE(status.ok());
  EXPECT_EQ(status->state(), v1::JOB_STATE_READY);  // the weights are still there.

  std::filesystem::remove(root_ + "/gone");
  request.clear_data_position();
  saved = RunCheckpoint(core_.get(), request);
  ASSERT_TRUE(saved.ok()) << saved.status();
  EXPECT_EQ(saved->data_position().data(), "digits");
  absl::StatusOr<model::CheckpointManifest> manifest = model::VerifyCheckpoint(root_ + "/gone/ck");
  ASSERT_TRUE(manifest.ok()) << manifest.status();
  EXPECT_EQ(manifest->step, 1);
  EXPECT_EQ(manifest->data, "digits");
  EXPECT_EQ(manifest->batch_size, 16);
  EXPECT_EQ(manifest->data_cursor.epoch, 2);
  EXPECT_EQ(manifest->data_cursor.batch, 5);

  ASSERT_TRUE(Step(MakeBatch(job->job(), 4)).ok());
  saved = RunCheckpoint(core_.get(), request);
  ASSERT_TRUE(saved.ok()) << saved.status();
  EXPECT_FALSE(saved->has_data_position());
  manifest = model::VerifyCheckpoint(root_ + "/gone/ck");
  ASSERT_TRUE(manifest.ok()) << manifest.status();
  EXPECT_EQ(manifest->step, 2);
  EXPECT_EQ(manifest->data, "");
  EXPECT_EQ(manifest->batch_size, 0);
}

}  // namespace
}  // namespace pipetrain::coordinator
