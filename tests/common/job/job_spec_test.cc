#include "common/job/job_spec.h"

#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/io/digest.h"
#include "common/io/tokenizer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace pipetrain::job {
namespace {

using ::testing::HasSubstr;

// An MLP of `hidden` linear+relu pairs and an output layer: 2 * hidden + 1 layers.
v1::JobSpec MlpSpec(int hidden, int stages, int microbatches) {
  v1::JobSpec spec;
  v1::ModelSpec* model = spec.mutable_model();
  model->set_input_features(4);
  for (int i = 0; i < hidden; ++i) {
    model->add_layers()->mutable_linear()->set_out_features(8);
    model->add_layers()->mutable_relu();
  }
  model->add_layers()->mutable_linear()->set_out_features(3);
  model->mutable_loss()->mutable_softmax_cross_entropy();
  spec.mutable_optimizer()->mutable_sgd()->set_lr(0.1f);
  spec.set_schedule("1f1b");
  spec.set_stages(stages);
  spec.set_microbatches(microbatches);
  return spec;
}

TEST(JobSpecTest, FillsDefaultsAndReturnsThePlanAndModel) {
  v1::JobSpec spec = MlpSpec(2, 2, 4);
  spec.set_schedule("interleaved");
  absl::StatusOr<CheckedJobSpec> checked = CheckJobSpec(JobLimits(), &spec);
  ASSERT_TRUE(checked.ok()) << checked.status();
  EXPECT_EQ(spec.threads(), 1);
  EXPECT_EQ(spec.virtual_stages(), 2);  // interleaved's default
  EXPECT_EQ(checked->model->num_layers(), 5);
  EXPECT_EQ(checked->plan.num_chunks(), 4);
}

// dualpipe: two copies of S stages. The layers are cut S ways (3 layers suffice for S = 2, where
// the V-shape would need 4), chunk S + k repeats chunk k's layers on rank S-1-k, and each stage
// is cut for the slower of its two ranks.
TEST(JobSpecTest, DualPipeCutsTheLayersIntoTwoCopiesOfTheStages) {
  v1::JobSpec spec = MlpSpec(1, 2, 4);  // 3 layers
  spec.set_schedule("dualpipe");
  absl::StatusOr<CheckedJobSpec> checked = CheckJobSpec(JobLimits(), &spec);
  ASSERT_TRUE(checked.ok()) << checked.status();
  EXPECT_EQ(spec.virtual_stages(), 2);
  EXPECT_EQ(checked->plan.num_chunks(), 4);
  absl::StatusOr<std::pair<std::vector<v1::ChunkSpec>, double>> cut =
      PartitionChunks(spec, *checked->model, checked->plan, {1.0, 1.0});
  ASSERT_TRUE(cut.ok()) << cut.status();
  const std::vector<v1::ChunkSpec>& chunks = cut->first;
  ASSERT_EQ(chunks.size(), 4u);
  const int ranks[] = {0, 1, 1, 0};
  for (int c = 0; c < 4; ++c) {
    EXPECT_EQ(chunks[c].chunk(), c);
    EXPECT_EQ(chunks[c].rank(), ranks[c]) << c;
    EXPECT_EQ(chunks[c].first_layer(), chunks[c % 2].first_layer()) << c;
    EXPECT_EQ(chunks[c].last_layer(), chunks[c % 2].last_layer()) << c;
  }
  EXPECT_EQ(chunks[0].first_layer(), 0);
  EXPECT_EQ(chunks[0].last_layer(), chunks[1].first_layer());
  EXPECT_EQ(chunks[1].last_layer(), 3);
  // Its rules: S even, M even.
  v1::JobSpec odd_m = MlpSpec(1, 2, 3);
  odd_m.set_schedule("dualpipe");
  EXPECT_THAT(CheckJobSpec(JobLimits(), &odd_m).status().message(),
              HasSubstr("dualpipe needs an even number of microbatches (got 3)"));
}

TEST(JobSpecTest, LayerCapAtTheLimitPassesOneOverIsResourceExhausted) {
  JobLimits limits;
  limits.max_layers = 5;
  v1::JobSpec at = MlpSpec(2, 2, 2);  // 5 layers
  ASSERT_TRUE(CheckJobSpec(limits, &at).ok());
  v1::JobSpec over = MlpSpec(3, 2, 2);  // 7 layers
  const absl::Status s = CheckJobSpec(limits, &over).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_THAT(s.message(), HasSubstr("the model has 7 layers, more than the limit of 5"));
  EXPECT_THAT(s.message(), HasSubstr("--max-layers"));
}

TEST(JobSpecTest, LayerCapIsCheckedBeforeTheModelIsBuilt) {
  // 100000 layers: refused for the count alone, before any is looked at.
  v1::JobSpec spec = MlpSpec(0, 1, 1);
  for (int i = 0; i < 100000; ++i) spec.mutable_model()->add_layers()->mutable_relu();
  const absl::Status s = CheckJobSpec(JobLimits(), &spec).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_THAT(s.message(), HasSubstr("100001 layers, more than the limit of 4096"));
}

TEST(JobSpecTest, ModelSpecSizeCapAtTheLimitPassesOneOverIsResourceExhausted) {
  v1::JobSpec spec = MlpSpec(1, 2, 2);
  // Pad the model's name to exactly kMaxModelSpecBytes (its length prefix grows with it).
  int64_t length = 0;
  for (int i = 0; i < 8 && static_cast<int64_t>(spec.model().ByteSizeLong()) != kMaxModelSpecBytes;
       ++i) {
    length += kMaxModelSpecBytes - static_cast<int64_t>(spec.model().ByteSizeLong());
    spec.mutable_model()->set_name(std::string(static_cast<size_t>(length), 'n'));
  }
  ASSERT_EQ(static_cast<int64_t>(spec.model().ByteSizeLong()), kMaxModelSpecBytes);
  v1::JobSpec at = spec;
  EXPECT_TRUE(CheckJobSpec(JobLimits(), &at).ok());
  spec.mutable_model()->mutable_name()->push_back('n');
  const absl::Status s = CheckJobSpec(JobLimits(), &spec).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_THAT(s.message(), HasSubstr("the model spec has 1048577 bytes, more than the limit of "
                                     "1048576"));
}

TEST(JobSpecTest, MicrobatchCapAtTheLimitPassesOneOverIsResourceExhausted) {
  JobLimits limits;
  limits.max_microbatches = 16;
  v1::JobSpec at = MlpSpec(1, 2, 16);
  ASSERT_TRUE(CheckJobSpec(limits, &at).ok());
  v1::JobSpec over = MlpSpec(1, 2, 17);
  const absl::Status s = CheckJobSpec(limits, &over).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_THAT(s.message(), HasSubstr("microbatches 17 is more than the limit of 16"));
  EXPECT_THAT(s.message(), HasSubstr("--max-microbatches"));
  // The default cap.
  v1::JobSpec big = MlpSpec(1, 2, 1025);
  EXPECT_EQ(CheckJobSpec(JobLimits(), &big).status().code(), absl::StatusCode::kResourceExhausted);
}

TEST(JobSpecTest, InvalidFieldsAreInvalidArgument) {
  v1::JobSpec bad_threads = MlpSpec(1, 2, 2);
  bad_threads.set_threads(-1);
  EXPECT_EQ(CheckJobSpec(JobLimits(), &bad_threads).status().code(),
            absl::StatusCode::kInvalidArgument);
  v1::JobSpec too_few_layers = MlpSpec(0, 2, 2);  // 1 layer, 2 chunks
  const absl::Status s = CheckJobSpec(JobLimits(), &too_few_layers).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(s.message(), HasSubstr("fewer than the 2 chunks"));
  v1::JobSpec no_schedule = MlpSpec(1, 2, 2);
  no_schedule.set_schedule("pipedream");
  EXPECT_EQ(CheckJobSpec(JobLimits(), &no_schedule).status().code(),
            absl::StatusCode::kInvalidArgument);
  v1::JobSpec zero_microbatches = MlpSpec(1, 2, 0);
  EXPECT_EQ(CheckJobSpec(JobLimits(), &zero_microbatches).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// planned_steps and keep_checkpoints are checked here, not only by the coordinator, so
// that the CLI refuses them before it calls CreateJob.
TEST(JobSpecTest, PlannedStepsAndKeptCheckpointsAreInRange) {
  v1::JobSpec spec = MlpSpec(1, 2, 2);
  spec.set_planned_steps((int64_t{1} << 53) - 1);
  spec.set_keep_checkpoints(3);
  EXPECT_TRUE(CheckJobSpec(JobLimits(), &spec).ok());
  v1::JobSpec steps = MlpSpec(1, 2, 2);
  steps.set_planned_steps(int64_t{1} << 53);
  absl::Status s = CheckJobSpec(JobLimits(), &steps).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_EQ(s.message(), "planned_steps must be in [0, 2^53), got 9007199254740992");
  v1::JobSpec keep = MlpSpec(1, 2, 2);
  keep.set_keep_checkpoints(-1);
  s = CheckJobSpec(JobLimits(), &keep).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_EQ(s.message(), "keep_checkpoints must be >= 0, got -1");
}

TEST(JobSpecTest, ReplicasDefaultToOneAndPlanOneReplicasShare) {
  v1::JobSpec one = MlpSpec(2, 2, 4);
  ASSERT_TRUE(CheckJobSpec(JobLimits(), &one).ok());
  EXPECT_EQ(one.replicas(), 1);
  v1::JobSpec two = MlpSpec(2, 2, 8);
  two.set_replicas(2);
  two.set_max_replicas(4);
  two.set_max_stages(2);
  absl::StatusOr<CheckedJobSpec> checked = CheckJobSpec(JobLimits(), &two);
  ASSERT_TRUE(checked.ok()) << checked.status();
  EXPECT_EQ(ReplicasOf(two), 2);
  EXPECT_EQ(MicrobatchesPerReplica(two), 4);
  EXPECT_EQ(checked->plan.microbatches, 4);  // the plan of one replica's share
}

TEST(JobSpecTest, ReplicasMustSplitTheStepIntoNodesOfTheGradientTree) {
  v1::JobSpec odd = MlpSpec(2, 1, 6);
  odd.set_replicas(4);
  absl::Status s = CheckJobSpec(JobLimits(), &odd).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(s.message(), HasSubstr("replicas 4 does not divide microbatches 6 into a node of "
                                     "the gradient tree; supported: 1, 2"));
  v1::JobSpec three = MlpSpec(2, 1, 6);
  three.set_replicas(3);  // divides 6, but not a power of two
  s = CheckJobSpec(JobLimits(), &three).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(s.message(), HasSubstr("supported: 1, 2"));
  v1::JobSpec negative = MlpSpec(2, 1, 4);
  negative.set_replicas(-2);
  s = CheckJobSpec(JobLimits(), &negative).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_EQ(s.message(), "replicas must be >= 1, got -2");
  v1::JobSpec eight = MlpSpec(2, 1, 8);
  eight.set_replicas(8);
  EXPECT_TRUE(CheckJobSpec(JobLimits(), &eight).ok());
}

TEST(JobSpecTest, TheScheduleIsCheckedWithOneReplicasMicrobatches) {
  // Interleaved needs M >= S: 4 micro-batches over 2 replicas leave 2 per replica < 4 stages.
  v1::JobSpec spec = MlpSpec(4, 4, 4);
  spec.set_schedule("interleaved");
  ASSERT_TRUE(CheckJobSpec(JobLimits(), &spec).ok());
  spec.set_replicas(2);
  const absl::Status s = CheckJobSpec(JobLimits(), &spec).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(s.message(), HasSubstr("with 2 replicas each runs microbatches / replicas = 2"));
  EXPECT_THAT(s.message(), HasSubstr("needs microbatches (2) >= stages (4)"));
}

TEST(JobSpecTest, GrowthCapsAreZeroOrAtLeastTheShape) {
  v1::JobSpec replicas = MlpSpec(2, 2, 4);
  replicas.set_replicas(2);
  replicas.set_max_replicas(1);
  absl::Status s = CheckJobSpec(JobLimits(), &replicas).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_EQ(s.message(), "max_replicas must be 0 or in [replicas = 2, 4096], got 1");
  v1::JobSpec stages = MlpSpec(2, 2, 4);
  stages.set_max_stages(1);
  s = CheckJobSpec(JobLimits(), &stages).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_EQ(s.message(), "max_stages must be 0 or in [stages = 2, 4096], got 1");
}

TEST(JobSpecTest, GrowthBoundsAreZeroOrAtLeastTheShape) {
  v1::JobSpec spec = MlpSpec(2, 2, 4);
  spec.set_max_stages(3);
  spec.set_max_replicas(1);
  ASSERT_TRUE(CheckJobSpec(JobLimits(), &spec).ok());
  spec = MlpSpec(2, 2, 4);
  spec.set_max_stages(1);
  absl::Status s = CheckJobSpec(JobLimits(), &spec).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(s.message(), HasSubstr("max_stages must be 0 or in [stages = 2, 4096], got 1"));
  spec = MlpSpec(2, 2, 4);
  spec.set_max_replicas(-1);
  s = CheckJobSpec(JobLimits(), &spec).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(s.message(), HasSubstr("max_replicas must be 0 or in [replicas = 1, 4096], got -1"));
}

TEST(JobSpecTest, IsaMustNameALevel) {
  v1::JobSpec spec = MlpSpec(1, 1, 1);
  EXPECT_TRUE(CheckJobIsa(spec).ok());
  spec.set_isa("x86-64-v4");
  EXPECT_TRUE(CheckJobIsa(spec).ok());
  spec.set_isa("avx2");
  const absl::Status s = CheckJobIsa(spec);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(s.message(),
            "isa 'avx2' is not an instruction-set level (x86-64-v3, x86-64-v4, generic)");
  EXPECT_EQ(CheckJobSpec(JobLimits(), &spec).status().code(), absl::StatusCode::kInvalidArgument);
}

// A client that does not know its coordinator's flags checks a job without the flags' caps, and
// still with the rules that hold everywhere.
TEST(JobSpecTest, UnlimitedKeepsOnlyTheFixedRules) {
  JobLimits limits;
  limits.max_layers = 3;
  v1::JobSpec over = MlpSpec(2, 1, 1);  // 5 layers
  EXPECT_EQ(CheckJobSpec(limits, &over).status().code(), absl::StatusCode::kResourceExhausted);
  v1::JobSpec unlimited = MlpSpec(2, 1, 2000);
  EXPECT_TRUE(CheckJobSpec(JobLimits::Unlimited(), &unlimited).ok());
  v1::JobSpec too_few_layers = MlpSpec(2, 4, 4);  // 5 layers, 8 chunks
  too_few_layers.set_schedule("zb-v");
  const absl::Status s = CheckJobSpec(JobLimits::Unlimited(), &too_few_layers).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("fewer than the 8 chunks of 4 stages x 2 virtual stages"));
  EXPECT_THAT(s.message(), HasSubstr("use 2 stages or fewer"));
}

// A tokenizer of `vocab` pieces trained on a small text.
std::string TrainedTokenizer(int64_t vocab) {
  std::string text;
  for (int i = 0; i < 200; ++i) {
    absl::StrAppend(&text, "the quick brown fox ", i, " jumps over the lazy dog\n");
  }
  io::TokenizerTrainOptions options;
  options.vocab_size = vocab;
  absl::StatusOr<std::string> model = io::TrainTokenizer(text, "text", options);
  EXPECT_TRUE(model.ok()) << model.status();
  return model.ok() ? *model : "";
}

// A tiny GPT whose embedding has `vocab` tokens.
v1::JobSpec GptSpec(int64_t vocab) {
  v1::JobSpec spec;
  v1::ModelSpec* model = spec.mutable_model();
  model->set_input_features(1);
  v1::EmbeddingSpec* e = model->add_layers()->mutable_embedding();
  e->set_vocab_size(vocab);
  e->set_dim(8);
  e->set_context(4);
  model->add_layers()->mutable_linear()->set_out_features(vocab);
  model->mutable_loss()->mutable_softmax_cross_entropy();
  spec.mutable_optimizer()->mutable_sgd()->set_lr(0.1f);
  spec.set_schedule("1f1b");
  spec.set_stages(2);
  spec.set_microbatches(1);
  return spec;
}

TEST(JobSpecTokenizerTest, TokenizerIsCheckedAgainstTheModel) {
  if (!io::TokenizersAvailable()) GTEST_SKIP() << "no tokenizers in a sanitizer build";
  const std::string tokenizer = TrainedTokenizer(60);
  v1::JobSpec fits = GptSpec(60);
  fits.set_tokenizer(tokenizer);
  EXPECT_TRUE(CheckJobSpec(JobLimits(), &fits).ok());

  v1::JobSpec small = GptSpec(40);
  small.set_tokenizer(tokenizer);
  absl::Status s = CheckJobSpec(JobLimits(), &small).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(s.message(), HasSubstr("tokenizer has 60 pieces, more than the model's embedding "
                                     "vocab_size 40"));

  v1::JobSpec garbage = GptSpec(60);
  garbage.set_tokenizer("not a model");
  s = CheckJobSpec(JobLimits(), &garbage).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(s.message(), HasSubstr("tokenizer: not a SentencePiece model"));

  v1::JobSpec huge = GptSpec(60);
  huge.set_tokenizer(std::string(io::kMaxTokenizerBytes + 1, 'x'));
  s = CheckJobSpec(JobLimits(), &huge).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
}

TEST(JobSpecTokenizerTest, ResumeNeedsTheCheckpointsTokenizer) {
  if (!io::TokenizersAvailable()) GTEST_SKIP() << "no tokenizers in a sanitizer build";
  const std::string a = TrainedTokenizer(60), b = TrainedTokenizer(50);
  model::CheckpointManifest none;
  model::CheckpointManifest with_a = none;
  with_a.tokenizer = model::CheckpointFile{"tokenizer.model", io::DigestBytes(a)->sha256,
                                           static_cast<int64_t>(a.size())};
  EXPECT_TRUE(CheckResumeTokenizer("/ckpt", none, "").ok());
  EXPECT_TRUE(CheckResumeTokenizer("/ckpt", with_a, a).ok());
  absl::Status s = CheckResumeTokenizer("/ckpt", with_a, b);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(s.message(), HasSubstr("resume_from /ckpt: the checkpoint was trained with "
                                     "tokenizer SHA-256"));
  s = CheckResumeTokenizer("/ckpt", with_a, "");
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(s.message(), HasSubstr("the job has no tokenizer (byte-level text)"));
  s = CheckResumeTokenizer("/ckpt", none, a);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_THAT(s.message(), HasSubstr("trained with no tokenizer (byte-level text)"));
}

// Hand-made costs of MlpSpec(2, 2, 1)'s 5 layers: layer 0 as costly as the rest together goes
// alone on rank 0, the last layer as costly as the rest alone on rank 1 (FLOPs would cut neither
// way: a relu costs next to nothing), each cut perfectly balanced.
TEST(JobSpecTest, PartitionsByTheSpecsLayerCostsWhenGiven) {
  const auto cut = [](const std::vector<double>& costs) {
    v1::JobSpec spec = MlpSpec(2, 2, 1);
    for (double c : costs) spec.add_layer_costs(c);
    absl::StatusOr<CheckedJobSpec> checked = CheckJobSpec(JobLimits(), &spec);
    EXPECT_TRUE(checked.ok()) << checked.status();
    absl::StatusOr<std::pair<std::vector<v1::ChunkSpec>, double>> chunks =
        PartitionChunks(spec, *checked->model, checked->plan, {1.0, 1.0});
    EXPECT_TRUE(chunks.ok()) << chunks.status();
    return std::make_pair(chunks->first[0].last_layer(), chunks->second);
  };
  EXPECT_EQ(cut({4, 1, 1, 1, 1}).first, 1);
  EXPECT_DOUBLE_EQ(cut({4, 1, 1, 1, 1}).second, 1.0);
  EXPECT_EQ(cut({1, 1, 1, 1, 4}).first, 4);
  EXPECT_DOUBLE_EQ(cut({1, 1, 1, 1, 4}).second, 1.0);
}

TEST(JobSpecTest, LayerCostsOfTheWrongSizeOrValueAreInvalidArgument) {
  const auto check = [](const std::vector<double>& costs) {
    v1::JobSpec spec = MlpSpec(2, 2, 1);
    for (double c : costs) spec.add_layer_costs(c);
    return CheckJobSpec(JobLimits(), &spec).status();
  };
  EXPECT_TRUE(check({}).ok());
  absl::Status s = check({1, 1, 1});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("layer_costs has 3 costs; the model has 5 layers"));
  s = check({1, 1, -1, 1, 1});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("layer_costs[2] must be in [0, 1e+30], got -1"));
  s = check({1, 1, std::numeric_limits<double>::quiet_NaN(), 1, 1});
  EXPECT_THAT(s.message(), HasSubstr("layer_costs[2]"));
  s = check({0, 0, 0, 0, 0});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("all 0"));
}

}  // namespace
}  // namespace pipetrain::job
