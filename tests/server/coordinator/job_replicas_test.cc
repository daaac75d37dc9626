// Data-parallel replicas in the coordinator core, against fake workers and feed links: the
// layout of R x S workers and each position's Assign, each replica fed its share of the batch and
// the step's losses in the step's order, Commit to every worker, checkpoints from replica 0 only
// and restored by every worker, a lost worker of any replica replaced, a job without a spare
// dropping to R / 2 replicas, evaluation on replica 0 (docs/scaling.md, "Replicas").
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "pipetrain/v1/worker_control.pb.h"
#include "server/coordinator/coordinator_core.h"
#include "tests/server/coordinator/core_test_fixture.h"
#include "tests/server/coordinator/fake_worker.h"

namespace pipetrain::coordinator {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing::MakeBatch;

// With equal speeds the workers w0..w3 of a 2 x 2 job sit at positions w0, w2 (replica 0, ranks
// 0 and 1) and w1, w3 (replica 1): ArrangePositions groups consecutive workers by rank.
class JobReplicasTest : public testing::CoreTest {
 protected:
  static v1::JobSpec Spec(int stages, int replicas, int microbatches, bool recover = false) {
    v1::JobSpec spec = testing::MakeSpec(stages, microbatches, recover);
    spec.set_replicas(replicas);
    return spec;
  }
  testing::FakeWorker& W(int i) { return *workers_[i]; }
};

TEST_F(JobReplicasTest, EveryPositionIsAssignedItsRankReplicaShareAndPeers) {
  AddWorkers(4);
  absl::StatusOr<v1::JobStatus> job = CreateJob(Spec(2, 2, 4));
  ASSERT_TRUE(job.ok()) << job.status();
  EXPECT_EQ(job->replicas(), 2);
  ASSERT_EQ(job->stages_size(), 4);
  const std::vector<std::string> names = {"w0", "w2", "w1", "w3"};
  for (int p = 0; p < 4; ++p) {
    EXPECT_EQ(job->stages(p).worker(), names[p]);
    EXPECT_EQ(job->stages(p).rank(), p % 2);
    EXPECT_EQ(job->stages(p).replica(), p / 2);
    EXPECT_EQ(job->stages(p).chunks_size(), 1);
  }
  const v1::Assign a = W(1).assign();  // rank 0 of replica 1
  EXPECT_EQ(a.rank(), 0);
  EXPECT_EQ(a.replica(), 1);
  EXPECT_EQ(a.replicas(), 2);
  EXPECT_EQ(a.stages(), 2);
  EXPECT_EQ(a.microbatches(), 2);  // M / R: the plan of one replica's share
  EXPECT_THAT(a.worker_addresses(), ElementsAre("w1:1", "w3:1"));
  EXPECT_THAT(a.replica_addresses(), ElementsAre("w0:1", "w1:1"));
  const v1::Assign b = W(2).assign();  // rank 1 of replica 0
  EXPECT_EQ(b.rank(), 1);
  EXPECT_EQ(b.replica(), 0);
  EXPECT_THAT(b.worker_addresses(), ElementsAre("w0:1", "w2:1"));
  EXPECT_THAT(b.replica_addresses(), ElementsAre("w2:1", "w3:1"));
  // Every replica runs the same chunks and action list.
  EXPECT_EQ(a.chunks_size(), W(0).assign().chunks_size());
  ASSERT_EQ(a.actions_size(), W(0).assign().actions_size());
  for (int i = 0; i < a.actions_size(); ++i) {
    EXPECT_EQ(a.actions(i).SerializeAsString(), W(0).assign().actions(i).SerializeAsString());
  }
  // Workers and jobs list each worker's replica.
  for (const v1::WorkerInfo& info : core_->ListWorkers()) {
    if (info.name() == "w1") {
      EXPECT_EQ(info.rank(), 0);
      EXPECT_EQ(info.replica(), 1);
    }
    if (info.name() == "w2") {
      EXPECT_EQ(info.rank(), 1);
      EXPECT_EQ(info.replica(), 0);
    }
  }
}

TEST_F(JobReplicasTest, EachReplicaIsFedItsShareAndTheLossesComeInTheStepsOrder) {
  AddWorkers(4);
  absl::StatusOr<v1::JobStatus> job = CreateJob(Spec(2, 2, 4));
  ASSERT_TRUE(job.ok()) << job.status();
  absl::StatusOr<v1::StepResult> r = Step(MakeBatch(job->job(), 8));
  ASSERT_TRUE(r.ok()) << r.status();
  // Replica 0 (positions 0, 1) gets micro-batches 0 and 1, replica 1 (positions 2, 3) the
  // step's 2 and 3 as its 0 and 1: rows 0, 2 | 4, 6, whose first inputs are 0.04 x row.
  EXPECT_THAT(links_->Sent(0), ElementsAre("input step 1 mb 0 rows 2", "input step 1 mb 1 rows 2"));
  EXPECT_THAT(links_->Sent(2), ElementsAre("input step 1 mb 0 rows 2", "input step 1 mb 1 rows 2"));
  EXPECT_THAT(links_->Sent(3),
              ElementsAre("target step 1 mb 0 rows 2", "target step 1 mb 1 rows 2"));
  EXPECT_THAT(links_->FirstValues(0), ElementsAre(0.0f, 0.01f * 8));
  EXPECT_THAT(links_->FirstValues(2), ElementsAre(0.01f * 16, 0.01f * 24));
  // Targets: row % 3 of rows 4 and 6.
  EXPECT_THAT(links_->FirstValues(3), ElementsAre(1.0f, 0.0f));
  // The losses of the step's micro-batches 0..3 (the fake's 0.25 (mb + 1)), summed in order.
  EXPECT_THAT(r->microbatch_losses(), ElementsAre(0.25f, 0.5f, 0.75f, 1.0f));
  float loss = 0;
  for (float l : {0.25f, 0.5f, 0.75f, 1.0f}) loss += l;
  EXPECT_EQ(r->loss(), loss);
  // RunStep and Commit reach every worker of every replica.
  for (const auto& w : workers_) {
    EXPECT_THAT(w->Received(), ElementsAre("assign", "open_links", "run_step", "commit"))
        << w->name();
  }
}

// A job that clips takes the global norm from replica 0; a replica that reports other norms (its
// gradients were not reduced to the same bits) fails the step, which is aborted everywhere.
TEST_F(JobReplicasTest, ReplicasMustReportTheSameGradientNorms) {
  AddWorkers(4);
  v1::JobSpec spec = Spec(2, 2, 4);
  spec.mutable_optimizer()->set_clip_norm(1.0f);
  absl::StatusOr<v1::JobStatus> job = CreateJob(spec);
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_TRUE(Step(MakeBatch(job->job(), 8)).ok());
  W(3).SkewGradNorms(0.5);  // rank 1 of replica 1
  const absl::Status s = Step(MakeBatch(job->job(), 8)).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal) << s;
  EXPECT_THAT(s.message(), HasSubstr("worker 'w3' (rank 1, replica 1) reported gradient norms "
                                     "that differ from replica 0's"));
  EXPECT_TRUE(W(3).WaitFor("abort"));
  absl::StatusOr<v1::JobStatus> status = core_->GetJob(job->job());
  ASSERT_TRUE(status.ok());
  EXPECT_EQ(status->steps_done(), 1);
  EXPECT_EQ(status->state(), v1::JOB_STATE_READY);
}

TEST_F(JobReplicasTest, TooFewWorkersForTheShapeIsFailedPrecondition) {
  AddWorkers(3);
  const absl::Status s = CreateJob(Spec(2, 2, 4)).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(s.message(), HasSubstr("job needs 4 workers (2 stages x 2 replicas), 3 idle"));
}

TEST_F(JobReplicasTest, ReplicaZeroSavesAndEveryWorkerOfAReplacementRestores) {
  AddWorkers(5);  // w4 is the spare.
  absl::StatusOr<v1::JobStatus> job = CreateJob(Spec(2, 2, 4, /*recover=*/true));
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_TRUE(Step(MakeBatch(job->job(), 8)).ok());
  absl::StatusOr<v1::CheckpointResponse> saved = Checkpoint(job->job(), root_ + "/ck");
  ASSERT_TRUE(saved.ok()) << saved.status();
  ASSERT_TRUE(model::VerifyCheckpoint(root_ + "/ck").ok());
  for (int i : {0, 2}) {
    EXPECT_THAT(W(i).Received(), ::testing::Contains("save_shards")) << W(i).name();
  }
  for (int i : {1, 3}) {
    EXPECT_THAT(W(i).Received(), ::testing::Not(::testing::Contains("save_shards"))) << W(i).name();
  }
  // Another replica's upload is refused.
  v1::PutStateRequest upload;
  upload.set_job(job->job());
  upload.set_generation(1);
  upload.set_step(1);
  upload.set_worker("w3");
  const absl::Status refused = core_->AcceptUpload(upload).status();
  EXPECT_EQ(refused.code(), absl::StatusCode::kPermissionDenied) << refused;
  EXPECT_THAT(refused.message(), HasSubstr("only replica 0 writes checkpoints"));
  // w3 (rank 1 of replica 1) is lost: the spare takes its position, the job keeps 2 replicas.
  W(3).Gone();
  absl::StatusOr<v1::JobStatus> status = AwaitRecovered(job->job());
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_EQ(status->replicas(), 2);
  EXPECT_EQ(status->recoveries(0).replicas(), 2);
  EXPECT_EQ(status->recoveries(0).stages(), 2);
  EXPECT_THAT(status->recoveries(0).workers(), ElementsAre("w0", "w2", "w1", "w4"));
  const v1::Assign a = W(4).assign();
  EXPECT_EQ(a.replica(), 1);
  EXPECT_EQ(a.rank(), 1);
  EXPECT_TRUE(a.restore());
  EXPECT_EQ(a.restore_step(), 1);
  // Every worker fetches its rank's files: the replacement the same as rank 1 of replica 0.
  auto files_of = [&](const std::string& worker) {
    v1::FetchStateRequest fetch;
    fetch.set_job(job->job());
    fetch.set_generation(2);
    fetch.set_worker(worker);
    std::vector<std::string> names;
    absl::StatusOr<std::vector<StateFile>> files = core_->StateFilesFor(fetch);
    EXPECT_TRUE(files.ok()) << files.status();
    if (files.ok()) {
      for (const StateFile& f : *files) names.push_back(f.shard.file);
    }
    return names;
  };
  EXPECT_FALSE(files_of("w4").empty());
  EXPECT_EQ(files_of("w4"), files_of("w2"));
  EXPECT_EQ(files_of("w1"), files_of("w0"));
  EXPECT_NE(files_of("w1"), files_of("w4"));
}

TEST_F(JobReplicasTest, WithoutASpareAJobThatMayShrinkDropsToHalfItsReplicas) {
  AddWorkers(4);
  v1::JobSpec spec = Spec(2, 2, 4, /*recover=*/true);
  spec.set_min_stages(2);  // it may shrink, but keeps its 2 stages
  spec.set_replace_timeout_ms(20);
  absl::StatusOr<v1::JobStatus> job = CreateJob(spec);
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_TRUE(Step(MakeBatch(job->job(), 8)).ok());
  W(3).Gone();
  absl::StatusOr<v1::JobStatus> status = AwaitRecovered(job->job());
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_EQ(status->replicas(), 1);
  EXPECT_EQ(status->spec().stages(), 2);
  ASSERT_EQ(status->stages_size(), 2);
  EXPECT_EQ(status->recoveries(0).replicas(), 1);
  EXPECT_EQ(status->recoveries(0).stages(), 2);
  EXPECT_THAT(status->recoveries(0).workers(), ElementsAre("w0", "w2"));
  EXPECT_TRUE(W(1).WaitFor("release"));
  const v1::Assign a = W(0).assign();
  EXPECT_EQ(a.generation(), 2);
  EXPECT_EQ(a.replicas(), 1);
  EXPECT_EQ(a.microbatches(), 4);  // one replica runs the whole step
  // Step 1 again, on one replica: the same four losses, in the same order.
  absl::StatusOr<v1::StepResult> r = Step(MakeBatch(job->job(), 8, /*expected_steps_done=*/0));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_THAT(r->microbatch_losses(), ElementsAre(0.25f, 0.5f, 0.75f, 1.0f));
}

TEST_F(JobReplicasTest, EvaluationRunsOnReplicaZero) {
  AddWorkers(4);
  absl::StatusOr<v1::JobStatus> job = CreateJob(Spec(2, 2, 4));
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_TRUE(Step(MakeBatch(job->job(), 8)).ok());
  const v1::TrainRequest batch = MakeBatch(job->job(), 4);
  v1::EvaluateRequest request;
  request.set_job(job->job());
  request.set_samples(4);
  *request.mutable_inputs() = batch.inputs();
  *request.mutable_targets() = batch.targets();
  request.set_chunk_samples(2);
  absl::StatusOr<v1::EvaluateResult> r =
      ClientRequest<v1::EvaluateResult>(job->job(), [&] { return core_->Evaluate(request); });
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->samples(), 4);
  for (int i : {0, 2}) EXPECT_THAT(W(i).Received(), ::testing::Contains("eval_run"));
  for (int i : {1, 3}) {
    EXPECT_THAT(W(i).Received(), ::testing::Not(::testing::Contains("eval_run")));
  }
  // Its chunks went to replica 0's first chunk owner only.
  EXPECT_EQ(links_->Sent(0).size(), 2u + 2u);
  EXPECT_EQ(links_->Sent(2).size(), 2u);
}

}  // namespace
}  // namespace pipetrain::coordinator
