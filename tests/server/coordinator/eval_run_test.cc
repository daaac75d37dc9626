// The coordinator core's Evaluate (EvalRun) against fake workers: the feed under the run's own
// mailbox step, the forward-only EvalRun to every rank, the figures folded in chunk order, and
// how a refused request, a worker's error and a cancelled job end it.
#include "server/coordinator/eval_run.h"

#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/server/coordinator/core_test_fixture.h"
#include "tests/server/coordinator/fake_worker.h"

namespace pipetrain::coordinator {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using testing::MakeBatch;
using testing::MakeSpec;

class EvalRunTest : public testing::CoreTest {
 protected:
  // `samples` held-out samples of the fixture's model in chunks of `chunk` samples.
  static v1::EvaluateRequest Request(const std::string& job, int samples, int chunk) {
    const v1::TrainRequest batch = MakeBatch(job, samples);
    v1::EvaluateRequest request;
    request.set_job(job);
    request.set_samples(samples);
    *request.mutable_inputs() = batch.inputs();
    *request.mutable_targets() = batch.targets();
    request.set_chunk_samples(chunk);
    return request;
  }
  absl::StatusOr<v1::EvaluateResult> Evaluate(const v1::EvaluateRequest& request) {
    return ClientRequest<v1::EvaluateResult>(request.job(),
                                             [&] { return core_->Evaluate(request); });
  }
};

TEST_F(EvalRunTest, FeedsItsOwnStepRunsForwardOnlyAndFoldsTheLastRanksFigures) {
  AddWorkers(2);
  absl::StatusOr<v1::JobStatus> job = CreateJob(MakeSpec(2, 2));
  ASSERT_TRUE(job.ok()) << job.status();
  ASSERT_TRUE(Step(MakeBatch(job->job(), 4)).ok());
  absl::StatusOr<v1::EvaluateResult> r = Evaluate(Request(job->job(), 5, 2));
  ASSERT_TRUE(r.ok()) << r.status();
  // Chunks of 2, 2 and 1 rows: the fake's loss sums 0.5 R (mb + 1) are 1, 2 and 1.5.
  EXPECT_EQ(r->step(), 1);
  EXPECT_EQ(r->chunk_samples(), 2);
  ASSERT_EQ(r->chunks_size(), 3);
  EXPECT_EQ(r->chunks(2).samples(), 1);
  EXPECT_EQ(r->chunks(2).loss_sum(), 1.5);
  EXPECT_EQ(r->loss(), (1.0 + 2.0 + 1.5) / 5.0);
  EXPECT_EQ(r->correct(), 0 + 1 + 2);
  EXPECT_EQ(r->accuracy(), 3.0 / 5.0);
  EXPECT_EQ(r->samples(), 5);
  // Keyed at most M = 2 per mailbox step: chunk 2 is (first step + 1, mb 0).
  const int64_t key = kEvalStepBase;
  EXPECT_THAT(links_->Sent(0), ElementsAre("input step 1 mb 0 rows 2", "input step 1 mb 1 rows 2",
                                           absl::StrCat("input step ", key, " mb 0 rows 2"),
                                           absl::StrCat("input step ", key, " mb 1 rows 2"),
                                           absl::StrCat("input step ", key + 1, " mb 0 rows 1")));
  for (const auto& w : workers_) {
    EXPECT_THAT(w->Received(),
                ElementsAre("assign", "open_links", "run_step", "commit", "eval_run"))
        << w->name();
  }
  // Nothing of the job changed: the next batch is step 2, the next evaluation has a new step.
  absl::StatusOr<v1::StepResult> next = Step(MakeBatch(job->job(), 4, /*expected_steps_done=*/1));
  ASSERT_TRUE(next.ok()) << next.status();
  EXPECT_EQ(next->step(), 2);
  r = Evaluate(Request(job->job(), 4, 0));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->step(), 2);
  EXPECT_EQ(r->chunk_samples(), kDefaultEvalChunkSamples);
  EXPECT_THAT(links_->Sent(1).back(),
              HasSubstr(absl::StrCat("target step ", kEvalStepBase + 2, " mb 0 rows 4")));
  // The fake's figures of one chunk of 4 rows: a loss sum of 2, over 4 rows.
  EXPECT_EQ(r->loss(), 0.5);
}

TEST_F(EvalRunTest, ABadRequestIsRefusedBeforeAnyWorkerHearsOfIt) {
  AddWorkers(2);
  absl::StatusOr<v1::JobStatus> job = CreateJob(MakeSpec(2, 2));
  ASSERT_TRUE(job.ok()) << job.status();
  v1::EvaluateRequest none = Request(job->job(), 4, 0);
  none.set_samples(0);
  absl::StatusOr<v1::EvaluateResult> r = Evaluate(none);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("samples must be >= 1, got 0"));
  r = Evaluate(Request(job->job(), 4, -1));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("chunk_samples must be >= 0"));
  r = Evaluate(Request(job->job(), kMaxEvalChunks + 1, 1));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(r.status().message(), HasSubstr("more than the 4096 one request may hold"));
  v1::EvaluateRequest short_targets = Request(job->job(), 4, 0);
  short_targets.mutable_targets()->set_data("");
  r = Evaluate(short_targets);
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("targets"));
  v1::EvaluateRequest unknown = Request("job-none", 4, 0);
  EXPECT_EQ(Evaluate(unknown).status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(links_->Sent(0).empty());
  EXPECT_THAT(workers_[0]->Received(), ElementsAre("assign", "open_links"));
}

TEST_F(EvalRunTest, AWorkersErrorFailsTheEvaluationAbortsItEverywhereAndLeavesTheJobReady) {
  AddWorkers(2);
  absl::StatusOr<v1::JobStatus> job = CreateJob(MakeSpec(2, 2));
  ASSERT_TRUE(job.ok()) << job.status();
  workers_[1]->FailRunSteps(absl::ResourceExhaustedError("out of memory"));
  absl::StatusOr<v1::EvaluateResult> r = Evaluate(Request(job->job(), 4, 0));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted) << r.status();
  EXPECT_THAT(r.status().message(), HasSubstr("worker 'w1' (rank 1)"));
  EXPECT_THAT(r.status().message(), HasSubstr("out of memory"));
  // Every rank is told to drop it.
  for (const auto& w : workers_) ASSERT_TRUE(w->WaitFor("abort")) << w->name();
  absl::StatusOr<v1::JobStatus> status = core_->GetJob(job->job());
  ASSERT_TRUE(status.ok());
  EXPECT_EQ(status->state(), v1::JOB_STATE_READY);
  workers_[1]->FailRunSteps(absl::OkStatus());
  absl::StatusOr<v1::StepResult> step = Step(MakeBatch(job->job(), 4));
  ASSERT_TRUE(step.ok()) << step.status();
  EXPECT_EQ(step->step(), 1);
  r = Evaluate(Request(job->job(), 4, 0));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->step(), 1);
}

TEST_F(EvalRunTest, CancellingTheJobEndsAnEvaluationInFlight) {
  AddWorkers(2);
  absl::StatusOr<v1::JobStatus> job = CreateJob(MakeSpec(2, 2));
  ASSERT_TRUE(job.ok()) << job.status();
  for (const auto& w : workers_) w->HoldRunSteps();
  absl::StatusOr<v1::EvaluateResult> r = absl::UnknownError("not run");
  std::thread client([&] { r = Evaluate(Request(job->job(), 4, 0)); });
  ASSERT_TRUE(workers_[1]->WaitFor("eval_run"));
  ASSERT_TRUE(core_->CancelJob(job->job(), "the test cancels it").ok());
  client.join();
  EXPECT_EQ(r.status().code(), absl::StatusCode::kCancelled) << r.status();
  EXPECT_THAT(r.status().message(), HasSubstr("the test cancels it"));
}

TEST_F(EvalRunTest, AWorkerLostMidEvaluationFailsItAndTheJobRecoversAsForAStep) {
  AddWorkers(3);  // w2 is the spare.
  absl::StatusOr<v1::JobStatus> job = CreateJob(MakeSpec(2, 2, /*recover=*/true));
  ASSERT_TRUE(job.ok()) << job.status();
  workers_[0]->HoldRunSteps();
  absl::StatusOr<v1::EvaluateResult> r = absl::UnknownError("not run");
  std::thread client([&] { r = Evaluate(Request(job->job(), 4, 0)); });
  ASSERT_TRUE(workers_[0]->WaitFor("eval_run"));
  workers_[1]->Gone();
  client.join();
  // The client hears of the recovery (ABORTED) and may evaluate again once the job is READY.
  EXPECT_EQ(r.status().code(), absl::StatusCode::kAborted) << r.status();
  absl::StatusOr<v1::JobStatus> status = AwaitRecovered(job->job());
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_EQ(status->recoveries(0).lost_worker(), "w1");
  // The rank still running the evaluation drops it with its generation: it is assigned anew.
  EXPECT_EQ(workers_[0]->assign().generation(), 2);
  EXPECT_EQ(workers_[2]->assign().generation(), 2);
}

}  // namespace
}  // namespace pipetrain::coordinator
