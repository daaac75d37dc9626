// The coordinator core's Generate (GenerateRun) against fake workers: one decode round per token
// with every prompt a micro-batch under the round's own mailbox steps, the first round opening
// and the last closing the workers' caches, the tokens sampled from the last rank's logits and
// fed back through each prompt's window; and how a refused request, a worker's error, the
// client's cancellation and a lost worker end it.
#include "server/coordinator/generate_run.h"

#include <atomic>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/model/decode_window.h"
#include "common/model/model.h"
#include "common/wire/eval_key.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/server/coordinator/core_test_fixture.h"
#include "tests/server/coordinator/fake_worker.h"

namespace pipetrain::coordinator {
namespace {

using ::testing::ElementsAre;
using ::testing::ElementsAreArray;
using testing::FakeNextToken;
using ::testing::HasSubstr;
using testing::MakeSpec;
using wire::kEvalStepBase;

constexpr int64_t kVocab = 11;
constexpr int64_t kContext = 4;

// MakeSpec's job with a small GPT (vocabulary 11, context 4) instead of its classifier.
v1::JobSpec LmSpec(int stages, int microbatches, bool recover = false) {
  v1::JobSpec spec = MakeSpec(stages, microbatches, recover);
  absl::StatusOr<v1::ModelSpec> model = model::ParseModelSpecText(
      "name: 'tiny_gpt' input_features: 1 "
      "layers { embedding { vocab_size: 11 dim: 8 context: 4 } } "
      "layers { transformer_block { heads: 2 } } layers { transformer_block { heads: 2 } } "
      "layers { layer_norm {} } layers { linear { out_features: 11 } } "
      "loss { softmax_cross_entropy {} }",
      "test");
  EXPECT_TRUE(model.ok()) << model.status();
  *spec.mutable_model() = *model;
  return spec;
}

v1::GenerateRequest Request(const std::string& job,
                            const std::vector<std::vector<int64_t>>& prompts, int64_t tokens) {
  v1::GenerateRequest request;
  request.set_job(job);
  for (const auto& p : prompts) request.add_prompts()->mutable_tokens()->Add(p.begin(), p.end());
  request.set_max_tokens(tokens);
  request.set_temperature(0);  // greedy: the fake's one-hot logits decide.
  return request;
}

// The tokens greedy decoding of `prompt` picks from the fake workers' logits (FakeNextToken),
// through the window the coordinator keeps.
std::vector<int64_t> FakeTokens(const std::vector<int64_t>& prompt, int64_t sequence,
                                int64_t tokens) {
  model::DecodeWindow window(kContext, kVocab);
  absl::StatusOr<model::DecodeRun> run = window.Start(prompt);
  std::vector<int64_t> out;
  for (int64_t i = 0; i < tokens && run.ok(); ++i) {
    v1::DecodeMicrobatch mb;
    mb.set_sequence(sequence);
    mb.set_position(run->position);
    mb.set_rows(static_cast<int64_t>(window.RunTokens(*run).size()));
    out.push_back(FakeNextToken(mb, kVocab));
    run = window.Append(out.back());
  }
  return out;
}

class GenerateRunTest : public testing::CoreTest {
 protected:
  absl::StatusOr<v1::GenerateResult> Generate(const v1::GenerateRequest& request,
                                              const std::function<bool()>& cancelled = nullptr) {
    return ClientRequest<v1::GenerateResult>(request.job(),
                                             [&] { return core_->Generate(request, cancelled); });
  }
};

TEST_F(GenerateRunTest, DecodesEveryPromptARoundPerTokenAndFeedsTheSampledTokensBack) {
  AddWorkers(2);
  absl::StatusOr<v1::JobStatus> job = CreateJob(LmSpec(2, 2));
  ASSERT_TRUE(job.ok()) << job.status();
  const std::vector<std::vector<int64_t>> prompts = {{1, 2, 3}, {7}, {4, 4, 9, 10, 0, 5}};
  absl::StatusOr<v1::GenerateResult> r = Generate(Request(job->job(), prompts, 6));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->step(), 0);
  EXPECT_EQ(r->rounds(), 6);
  ASSERT_EQ(r->sequences_size(), 3);
  for (int p = 0; p < 3; ++p) {
    EXPECT_THAT(r->sequences(p).tokens(), ElementsAreArray(FakeTokens(prompts[p], p, 6)))
        << "prompt " << p;
  }
  // Every rank runs six rounds of three micro-batches: the first opens the caches, the last
  // closes them; the third prompt's last 4 tokens start at position 0.
  for (const auto& w : workers_) {
    const std::vector<v1::GenRun> runs = w->GenRuns();
    ASSERT_EQ(runs.size(), 6u) << w->name();
    for (size_t i = 0; i < runs.size(); ++i) {
      EXPECT_EQ(runs[i].open(), i == 0);
      EXPECT_EQ(runs[i].close(), i == 5);
      EXPECT_EQ(runs[i].sequences(), 3);
      EXPECT_EQ(runs[i].runs_size(), 3);
      EXPECT_EQ(runs[i].request(), runs[0].request());
    }
    EXPECT_EQ(runs[0].runs(2).rows(), kContext);
    EXPECT_TRUE(runs[0].runs(2).restart());
    EXPECT_EQ(runs[1].runs(0).position(), 3);
    EXPECT_EQ(runs[1].runs(0).rows(), 1);
  }
  // Keyed at most M = 2 per mailbox step: round r's prompts at kEvalStepBase + 2r (mb 0, 1) and
  // + 2r + 1 (mb 0), only to the first chunk's owner.
  const std::vector<std::string> sent = links_->Sent(0);
  ASSERT_EQ(sent.size(), 18u);
  EXPECT_EQ(sent[0], absl::StrCat("input step ", kEvalStepBase, " mb 0 rows 3"));
  EXPECT_EQ(sent[2], absl::StrCat("input step ", kEvalStepBase + 1, " mb 0 rows 4"));
  EXPECT_EQ(sent[3], absl::StrCat("input step ", kEvalStepBase + 2, " mb 0 rows 1"));
  EXPECT_TRUE(links_->Sent(1).empty());
  absl::StatusOr<v1::JobStatus> status = core_->GetJob(job->job());
  ASSERT_TRUE(status.ok());
  EXPECT_EQ(status->state(), v1::JOB_STATE_READY);
}

TEST_F(GenerateRunTest, ABadRequestIsRefusedBeforeAnyWorkerHearsOfIt) {
  AddWorkers(2);
  absl::StatusOr<v1::JobStatus> job = CreateJob(LmSpec(2, 2));
  ASSERT_TRUE(job.ok()) << job.status();
  auto expect = [&](const v1::GenerateRequest& request, absl::StatusCode code,
                    const std::string& message) {
    absl::StatusOr<v1::GenerateResult> r = Generate(request);
    EXPECT_EQ(r.status().code(), code) << r.status();
    EXPECT_THAT(r.status().message(), HasSubstr(message));
  };
  expect(Request(job->job(), {}, 4), absl::StatusCode::kInvalidArgument, "no prompt");
  expect(Request(job->job(), {{1}, {}}, 4), absl::StatusCode::kInvalidArgument,
         "prompt 1 is empty");
  expect(Request(job->job(), {{1, 11}}, 4), absl::StatusCode::kInvalidArgument,
         "prompt 0 token 1 is 11, outside the vocabulary [0, 11)");
  expect(Request(job->job(), {{1}}, 0), absl::StatusCode::kInvalidArgument,
         "max_tokens must be >= 1, got 0");
  expect(Request(job->job(), {{1}}, kMaxGenerateRounds + 1), absl::StatusCode::kResourceExhausted,
         "max_tokens 4097 is more than the 4096");
  expect(Request(job->job(), std::vector<std::vector<int64_t>>(65, {1}), 4),
         absl::StatusCode::kResourceExhausted, "65 prompts, more than the 64");
  expect(Request(job->job(), {std::vector<int64_t>(kMaxGeneratePromptTokens + 1, 1)}, 4),
         absl::StatusCode::kResourceExhausted, "has 65537 tokens, more than 65536");
  v1::GenerateRequest cold = Request(job->job(), {{1}}, 4);
  cold.set_temperature(-1);
  expect(cold, absl::StatusCode::kInvalidArgument, "temperature");
  expect(Request("job-none", {{1}}, 4), absl::StatusCode::kNotFound, "job-none");
  EXPECT_TRUE(links_->Sent(0).empty());
  EXPECT_THAT(workers_[0]->Received(), ElementsAre("assign", "open_links"));
}

// A large vocabulary bounds the prompts per request: their logits come back every round.
TEST(CheckGenerateRequestTest, TheLogitsOfARoundAreBounded) {
  absl::StatusOr<v1::ModelSpec> spec = model::ParseModelSpecText(
      "name: 'wide' input_features: 1 layers { embedding { vocab_size: 70000 dim: 8 context: 4 } } "
      "layers { linear { out_features: 70000 } } loss { softmax_cross_entropy {} }",
      "test");
  ASSERT_TRUE(spec.ok()) << spec.status();
  absl::StatusOr<std::unique_ptr<model::Model>> net = model::Model::Build(*spec);
  ASSERT_TRUE(net.ok()) << net.status();
  v1::GenerateRequest request = Request("job", std::vector<std::vector<int64_t>>(59, {1}), 4);
  EXPECT_TRUE(CheckGenerateRequest(request, **net).ok());
  request.add_prompts()->add_tokens(1);  // 60 x 70000 x 4 bytes > 16 MiB
  const absl::Status refused = CheckGenerateRequest(request, **net);
  EXPECT_EQ(refused.code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(refused.message(), HasSubstr("send at most 59 prompts per request"));
}

TEST_F(GenerateRunTest, ANonLanguageModelIsRefused) {
  AddWorkers(2);
  absl::StatusOr<v1::JobStatus> job = CreateJob(MakeSpec(2, 2));
  ASSERT_TRUE(job.ok()) << job.status();
  absl::StatusOr<v1::GenerateResult> r = Generate(Request(job->job(), {{1}}, 4));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition) << r.status();
  EXPECT_THAT(r.status().message(), HasSubstr("generation needs a language model"));
}

TEST_F(GenerateRunTest, AWorkersErrorFailsTheRequestAbortsItEverywhereAndLeavesTheJobReady) {
  AddWorkers(2);
  absl::StatusOr<v1::JobStatus> job = CreateJob(LmSpec(2, 2));
  ASSERT_TRUE(job.ok()) << job.status();
  workers_[1]->FailRunSteps(absl::ResourceExhaustedError("out of memory"));
  absl::StatusOr<v1::GenerateResult> r = Generate(Request(job->job(), {{1, 2}}, 3));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted) << r.status();
  EXPECT_THAT(r.status().message(), HasSubstr("worker 'w1' (rank 1)"));
  // Every rank is told to drop the round (and with it the request's caches).
  for (const auto& w : workers_) ASSERT_TRUE(w->WaitFor("abort")) << w->name();
  absl::StatusOr<v1::JobStatus> status = core_->GetJob(job->job());
  ASSERT_TRUE(status.ok());
  EXPECT_EQ(status->state(), v1::JOB_STATE_READY);
  workers_[1]->FailRunSteps(absl::OkStatus());
  r = Generate(Request(job->job(), {{1, 2}}, 3));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_THAT(r->sequences(0).tokens(), ElementsAreArray(FakeTokens({1, 2}, 0, 3)));
}

TEST_F(GenerateRunTest, TheClientsCancellationEndsItBetweenRoundsAndFreesTheCaches) {
  AddWorkers(2);
  absl::StatusOr<v1::JobStatus> job = CreateJob(LmSpec(2, 2));
  ASSERT_TRUE(job.ok()) << job.status();
  std::atomic<int> asked{0};
  absl::StatusOr<v1::GenerateResult> r =
      Generate(Request(job->job(), {{1, 2}}, 10), [&] { return ++asked >= 2; });
  EXPECT_EQ(r.status().code(), absl::StatusCode::kCancelled) << r.status();
  for (const auto& w : workers_) {
    ASSERT_TRUE(w->WaitFor("abort")) << w->name();
    EXPECT_THAT(w->Received(), ElementsAre("assign", "open_links", "gen_run", "gen_run", "abort"));
  }
  absl::StatusOr<v1::JobStatus> status = core_->GetJob(job->job());
  ASSERT_TRUE(status.ok());
  EXPECT_EQ(status->state(), v1::JOB_STATE_READY);
}

TEST_F(GenerateRunTest, AWorkerLostMidRequestFailsItAndTheJobRecoversAsForAStep) {
  AddWorkers(3);  // w2 is the spare.
  absl::StatusOr<v1::JobStatus> job = CreateJob(LmSpec(2, 2, /*recover=*/true));
  ASSERT_TRUE(job.ok()) << job.status();
  workers_[0]->HoldRunSteps();
  absl::StatusOr<v1::GenerateResult> r = absl::UnknownError("not run");
  std::thread client([&] { r = Generate(Request(job->job(), {{1, 2}}, 4)); });
  ASSERT_TRUE(workers_[0]->WaitFor("gen_run"));
  workers_[1]->Gone();
  client.join();
  EXPECT_EQ(r.status().code(), absl::StatusCode::kAborted) << r.status();
  absl::StatusOr<v1::JobStatus> status = AwaitRecovered(job->job());
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_EQ(status->recoveries(0).lost_worker(), "w1");
  EXPECT_EQ(workers_[0]->assign().generation(), 2);
}

}  // namespace
}  // namespace pipetrain::coordinator
