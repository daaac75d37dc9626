// CoordinatorCore against fake workers and feed links, without sockets: the step protocol (what
// each rank hears, in which order; what is fed; the loss), a refused data link, a lost worker's
// recovery onto a spare, a checkpoint's upload and publication, and a job restored from it. Each
// test runs in milliseconds; the gRPC shell is covered by coordinator_service_test.
#include "server/coordinator/coordinator_core.h"

#include <filesystem>
#include <fstream>
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
#include "tests/server/coordinator/fake_worker.h"

namespace pipetrain::coordinator {
namespace {

using ::testing::ElementsAre;
using testing::FakeFeedLinks;
using testing::FakeWorker;
using ::testing::HasSubstr;
using ::testing::Not;

constexpr char kModel[] = R"pb(
  input_features: 4
  layers { linear { out_features: 8 } }
  layers { relu {} }
  layers { linear { out_features: 3 } }
  loss { softmax_cross_entropy {} }
)pb";

v1::JobSpec MakeSpec(int stages, int microbatches, bool recover = false) {
  v1::JobSpec spec;
  absl::StatusOr<v1::ModelSpec> model = model::ParseModelSpecText(kModel, "test");
  EXPECT_TRUE(model.ok()) << model.status();
  *spec.mutable_model() = *model;
  spec.mutable_optimizer()->mutable_sgd()->set_lr(0.1f);
  spec.set_schedule("1f1b");
  spec.set_stages(stages);
  spec.set_microbatches(microbatches);
  spec.set_seed(1);
  spec.set_threads(1);
  spec.set_recover(recover);
  spec.set_replace_timeout_ms(5000);
  return spec;
}

// A batch of `samples` rows of 4 features with class labels 0..2.
v1::TrainRequest MakeBatch(const std::string& job, int samples, int64_t expected_steps_done = -1) {
  v1::TrainRequest r;
  r.set_job(job);
  r.set_samples(samples);
  v1::DenseTensor* x = r.mutable_inputs();
  x->set_dtype(v1::DTYPE_F32);
  x->add_shape(samples);
  x->add_shape(4);
  std::vector<float> xs(static_cast<size_t>(samples) * 4);
  for (size_t i = 0; i < xs.size(); ++i) xs[i] = 0.01f * static_cast<float>(i);
  x->set_data(std::string(reinterpret_cast<const char*>(xs.data()), xs.size() * sizeof(float)));
  v1::DenseTensor* y = r.mutable_targets();
  y->set_dtype(v1::DTYPE_F32);
  y->add_shape(samples);
  y->add_shape(1);
  std::vector<float> ys(static_cast<size_t>(samples));
  for (size_t i = 0; i < ys.size(); ++i) ys[i] = static_cast<float>(i % 3);
  y->set_data(std::string(reinterpret_cast<const char*>(ys.data()), ys.size() * sizeof(float)));
  if (expected_steps_done >= 0) r.set_expected_steps_done(expected_steps_done);
  return r;
}

class CoordinatorCoreTest : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = ::testing::TempDir() + "core_test_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name();
    std::filesystem::remove_all(root_);
    std::filesystem::create_directories(root_);
    CoordinatorOptions options;
    options.checkpoint_root = root_;
    options.loss_grace = absl::Milliseconds(200);
    options.log = [](logging::LogLevel, const std::string&) {};
    links_ = std::make_shared<FakeFeedLinks>();
    core_ = std::make_unique<CoordinatorCore>(options, links_);
  }
  void TearDown() override {
    workers_.clear();  // their streams end before the core goes.
    core_.reset();
    std::filesystem::remove_all(root_);
  }

  void AddWorkers(int n) {
    for (int i = 0; i < n; ++i) {
      workers_.push_back(
          std::make_unique<FakeWorker>(core_.get(), absl::StrCat("w", workers_.size())));
      ASSERT_TRUE(workers_.back()->Register().ok());
    }
  }

  absl::StatusOr<v1::JobStatus> CreateJob(const v1::JobSpec& spec, const std::string& owner = "") {
    absl::Notification done;
    absl::StatusOr<v1::JobStatus> result;
    core_->CreateJob(spec, owner, [&](absl::StatusOr<v1::JobStatus> status) {
      result = std::move(status);
      done.Notify();
    });
    done.WaitForNotification();
    return result;
  }

  // One step on the job's thread, as the Train stream runs it.
  absl::StatusOr<v1::StepResult> Step(const v1::TrainRequest& request) {
    absl::Notification done;
    absl::StatusOr<v1::StepResult> result = absl::UnknownError("not run");
    const absl::Status posted = core_->PostToJob(request.job(), [&] {
      result = core_->TrainStep(request, [] { return false; });
      done.Notify();
    });
    if (!posted.ok()) return posted;
    done.WaitForNotification();
    return result;
  }

  absl::StatusOr<v1::CheckpointResponse> Checkpoint(const std::string& job,
                                                    const std::string& dir) {
    v1::CheckpointRequest request;
    request.set_job(job);
    request.set_directory(dir);
    absl::Notification done;
    absl::StatusOr<v1::CheckpointResponse> result = absl::UnknownError("not run");
    const absl::Status posted = core_->PostToJob(job, [&] {
      result = core_->Checkpoint(request);
      done.Notify();
    });
    if (!posted.ok()) return posted;
    done.WaitForNotification();
    return result;
  }

  // Polls the job's status until `ready` holds (at most 10 s).
  absl::StatusOr<v1::JobStatus> AwaitJob(const std::string& job,
                                         const std::function<bool(const v1::JobStatus&)>& ready) {
    const absl::Time until = absl::Now() + absl::Seconds(10);
    for (;;) {
      absl::StatusOr<v1::JobStatus> status = core_->GetJob(job);
      if (!status.ok() || ready(*status) || absl::Now() > until) return status;
      absl::SleepFor(absl::Milliseconds(2));
    }
  }

  std::string root_;
  std::shared_ptr<FakeFeedLinks> links_;
  std::unique_ptr<CoordinatorCore> core_;
  std::vector<std::unique_ptr<FakeWorker>> workers_;
};

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
