// The tied input/output embedding: ModelSpec validation, the reference trainer's combined
// gradient, the same training state from two stages that exchange their parts (what the stage
// workers do, in one process), and the checkpoint layout that holds the table once.
#include "common/model/tied_embedding.h"

#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/model/checkpoint.h"
#include "common/model/generator.h"
#include "common/model/hf_checkpoint.h"
#include "common/model/reference_trainer.h"
#include "common/model/stage.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/model/test_models.h"

namespace pipetrain::model {
namespace {

using testing::BuildOrDie;
using ::testing::HasSubstr;
using testing::kTiedGptSpec;
using testing::MakeBatch;

constexpr int64_t kHead = 4;  // kTiedGptSpec's last layer.

absl::Status BuildStatus(const std::string& text) {
  absl::StatusOr<v1::ModelSpec> spec = ParseModelSpecText(text, "test");
  if (!spec.ok()) return spec.status();
  return Model::Build(*spec).status();
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST(TiedEmbeddingTest, RefusesImpossibleTies) {
  const std::string tail = "loss { softmax_cross_entropy {} } tie_embeddings: true";
  const absl::Status no_embedding =
      BuildStatus("input_features: 3 layers { linear { out_features: 3 no_bias: true } } " + tail);
  EXPECT_EQ(no_embedding.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(no_embedding.message(), HasSubstr("layer 0 is linear, not an embedding"));

  const std::string emb =
      "input_features: 1 layers { embedding { vocab_size: 5 dim: 4 context: 2 } } ";
  const absl::Status no_head = BuildStatus(emb + "layers { gelu {} } " + tail);
  EXPECT_EQ(no_head.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(no_head.message(), HasSubstr("the last layer 1 is gelu, not a linear head"));

  const absl::Status bias = BuildStatus(emb + "layers { linear { out_features: 5 } } " + tail);
  EXPECT_EQ(bias.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(bias.message(), HasSubstr("has a bias; a tied head must set no_bias: true"));

  const absl::Status shape =
      BuildStatus(emb + "layers { linear { out_features: 6 no_bias: true } } " + tail);
  EXPECT_EQ(shape.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(shape.message(), HasSubstr("[6, 4]) differs from the embedding's token table"));
  EXPECT_THAT(shape.message(), HasSubstr("[5, 4]"));

  EXPECT_TRUE(
      BuildStatus(emb + "layers { linear { out_features: 5 no_bias: true } } " + tail).ok());
}

TEST(TiedEmbeddingTest, SumChecksShapes) {
  math::Tensor a{{2, 2}, {1, 2, 3, 4}};
  math::Tensor b{{2, 2}, {0.5f, 0.25f, -3, 1}};
  absl::StatusOr<math::Tensor> sum = SumTiedGradients(a, b);
  ASSERT_TRUE(sum.ok()) << sum.status();
  EXPECT_EQ(sum->data, (std::vector<float>{1.5f, 2.25f, 0, 5}));
  math::Tensor c{{4, 1}, {1, 2, 3, 4}};
  EXPECT_EQ(SumTiedGradients(a, c).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(SumTiedGradients(a, c).status().message(), HasSubstr("differ in shape"));
}

TEST(TiedEmbeddingTest, ModelCountsTheTableOnce) {
  auto tied = BuildOrDie(kTiedGptSpec);
  ASSERT_TRUE(tied->tie().has_value());
  EXPECT_EQ(tied->tie()->embedding_layer, 0);
  EXPECT_EQ(tied->tie()->head_layer, kHead);
  EXPECT_EQ(tied->tie()->shape, (std::vector<int64_t>{11, 8}));
  int64_t per_layer = 0;
  for (int64_t b : tied->LayerParamBytes()) per_layer += b / 4;
  EXPECT_EQ(tied->NumParameters(), per_layer - 11 * 8);
}

// One SGD step by the reference equals the update computed from the two parts by hand: the
// table's gradient is the embedding's part plus the head's.
TEST(TiedEmbeddingTest, ReferenceUpdatesTheTableWithTheSumOfBothParts) {
  auto model = BuildOrDie(kTiedGptSpec);
  TrainerOptions options;
  options.microbatches = 2;
  options.seed = 5;
  options.optimizer.kind = math::OptimizerKind::kSgd;
  options.optimizer.lr = 0.5f;
  auto trainer = ReferenceTrainer::Create(model.get(), options);
  ASSERT_TRUE(trainer.ok()) << trainer.status();
  const io::Batch batch = MakeBatch(*model, 4, 1);

  // The same micro-batches through a stage of the same model and seed, by hand.
  auto stage = Stage::Create(model.get(), 0, model->num_layers(), 5, options.optimizer);
  ASSERT_TRUE(stage.ok()) << stage.status();
  const math::Tensor table = stage->params(0)[0];
  EXPECT_TRUE(SameBits(stage->params(kHead)[0].data, table.data)) << "the copies start equal";
  const int64_t mb_rows = batch.inputs.rows() / 2;
  for (int mb = 0; mb < 2; ++mb) {
    MicrobatchState state;
    math::ConstMatrixMap x(batch.inputs.data() + mb * mb_rows, mb_rows, 1);
    math::ConstMatrixMap t(batch.targets.data() + mb * mb_rows, mb_rows, 1);
    const math::Matrix& pred = stage->Forward(x, &state);
    math::Matrix dpred(pred.rows(), pred.cols());
    model->loss().LossAndGrad(math::AsConstMap(pred), t, 1.0 / batch.inputs.rows(),
                              math::AsMap(dpred));
    stage->BackwardInput(math::AsConstMap(dpred), false, &state);
    stage->BackwardWeight(&state);
  }
  absl::StatusOr<math::Tensor> embedding_part = stage->TiedGradPart(TieEnd::kEmbedding);
  absl::StatusOr<math::Tensor> head_part = stage->TiedGradPart(TieEnd::kHead);
  ASSERT_TRUE(embedding_part.ok() && head_part.ok());
  std::vector<float> expected = table.data;
  for (size_t i = 0; i < expected.size(); ++i) {
    expected[i] -= 0.5f * (embedding_part->data[i] + head_part->data[i]);
  }

  ASSERT_TRUE((*trainer)->Step(batch).ok());
  const std::map<std::string, math::Tensor> state = (*trainer)->ExportState();
  EXPECT_TRUE(SameBits(state.at("layers.0.token.weight").data, expected));
  EXPECT_EQ(state.count("layers.4.weight"), 0u) << "the head's copy is not stored";
  EXPECT_TRUE(SameBits((*trainer)->stage().params(kHead)[0].data, expected));
}

// Runs `steps` AdamW steps with clipping on stages over `cuts` (layer boundaries), exchanging the
// tied parts between the stages as the workers do, and returns the merged state.
std::map<std::string, math::Tensor> TrainStages(const Model& model, std::vector<int64_t> cuts,
                                                int steps, double* last_norm_sq) {
  math::OptimizerConfig optimizer;
  optimizer.clip_norm = 0.05f;
  std::vector<Stage> stages;
  for (size_t s = 0; s + 1 < cuts.size(); ++s) {
    auto stage = Stage::Create(&model, cuts[s], cuts[s + 1], 9, optimizer);
    EXPECT_TRUE(stage.ok()) << stage.status();
    stages.push_back(*std::move(stage));
  }
  for (int step = 1; step <= steps; ++step) {
    const io::Batch batch = MakeBatch(model, 4, step);
    const int64_t mb_rows = batch.inputs.rows() / 2;
    for (Stage& s : stages) s.ZeroGrads();
    for (int mb = 0; mb < 2; ++mb) {
      std::vector<MicrobatchState> states(stages.size());
      math::Matrix x = batch.inputs.middleRows(mb * mb_rows, mb_rows);
      for (size_t s = 0; s < stages.size(); ++s)
        x = stages[s].Forward(math::AsConstMap(x), &states[s]);
      math::Matrix dy(x.rows(), x.cols());
      const math::Matrix t = batch.targets.middleRows(mb * mb_rows, mb_rows);
      model.loss().LossAndGrad(math::AsConstMap(x), math::AsConstMap(t), 1.0 / batch.inputs.rows(),
                               math::AsMap(dy));
      for (size_t s = stages.size(); s-- > 0;) {
        dy = stages[s].BackwardInput(math::AsConstMap(dy), s > 0, &states[s]);
        stages[s].BackwardWeight(&states[s]);
      }
    }
    Stage& first = stages.front();
    Stage& last = stages.back();
    std::vector<double> norms;
    if (&first == &last) {
      first.CombineTiedGrads();
    } else {
      auto e = first.TiedGradPart(TieEnd::kEmbedding);
      auto h = last.TiedGradPart(TieEnd::kHead);
      auto sum = SumTiedGradients(*e, *h);
      EXPECT_TRUE(sum.ok()) << sum.status();
      EXPECT_TRUE(first.SetTiedGrad(TieEnd::kEmbedding, *sum).ok());
      EXPECT_TRUE(last.SetTiedGrad(TieEnd::kHead, *sum).ok());
    }
    for (Stage& s : stages) {
      for (double n : s.GradNormSqPerLayer()) norms.push_back(n);
    }
    *last_norm_sq = SumLayerNormSq(norms);
    const float clip = math::ClipScale(*last_norm_sq, optimizer.clip_norm);
    for (Stage& s : stages) s.ApplyOptimizer(step, clip);
  }
  EXPECT_TRUE(SameBits(stages.front().params(0)[0].data, stages.back().params(kHead)[0].data))
      << "both copies of the table stay equal";
  std::map<std::string, math::Tensor> out;
  for (const Stage& s : stages) out.merge(s.ExportState());
  return out;
}

TEST(TiedEmbeddingTest, TwoStagesExchangingTheirPartsEqualOneStageBitwise) {
  auto model = BuildOrDie(kTiedGptSpec);
  double one_norm = 0, two_norm = 0, three_norm = 0;
  const auto one = TrainStages(*model, {0, 5}, 3, &one_norm);
  const auto two = TrainStages(*model, {0, 2, 5}, 3, &two_norm);
  const auto three = TrainStages(*model, {0, 1, 4, 5}, 3, &three_norm);
  EXPECT_EQ(one_norm, two_norm);
  EXPECT_EQ(one_norm, three_norm);
  ASSERT_EQ(one.size(), two.size());
  ASSERT_EQ(one.size(), three.size());
  for (const auto& [name, t] : one) {
    EXPECT_TRUE(SameBits(t.data, two.at(name).data)) << name;
    EXPECT_TRUE(SameBits(t.data, three.at(name).data)) << name;
  }
}

TEST(TiedEmbeddingTest, CheckpointHoldsTheTableOnceAndRestoresTheHeadsCopy) {
  auto model = BuildOrDie(kTiedGptSpec);
  const std::vector<CheckpointShard> shards = LayerShards(*model, 0, model->num_layers());
  for (const CheckpointShard& s : shards) EXPECT_NE(s.first_layer, kHead) << s.file;
  EXPECT_EQ(shards.size(), 4u);  // embedding, two blocks, layer norm.

  double norm = 0;
  const auto trained = TrainStages(*model, {0, 5}, 2, &norm);
  math::OptimizerConfig optimizer;
  auto head = Stage::Create(model.get(), 3, 5, 1, optimizer);
  ASSERT_TRUE(head.ok());
  ASSERT_TRUE(head->ImportState(trained).ok());
  EXPECT_TRUE(SameBits(head->params(kHead)[0].data, trained.at("layers.0.token.weight").data));
  const auto exported = head->ExportState();
  EXPECT_EQ(exported.count("layers.4.weight"), 0u);
  EXPECT_EQ(exported.count("optim.4.weight.exp_avg"), 0u);

  std::map<std::string, math::Tensor> missing = trained;
  missing.erase("optim.0.token.weight.exp_avg");
  const absl::Status s = head->ImportState(missing);
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(s.message(), HasSubstr("optim.0.token.weight.exp_avg"));
}

// Export to Hugging Face says tie_word_embeddings and has no lm_head.weight; the import of that
// export gives the tensors back; generation reads the head's weight from the table.
TEST(TiedEmbeddingTest, ExportImportAndGenerationUseTheTableOnce) {
  auto model = BuildOrDie(kTiedGptSpec);
  double norm = 0;
  const auto trained = TrainStages(*model, {0, 5}, 1, &norm);
  absl::StatusOr<const HfArchitecture*> arch = HfArchitectureOf(*model);
  ASSERT_TRUE(arch.ok()) << arch.status();
  absl::StatusOr<std::string> config = (*arch)->config(*model);
  ASSERT_TRUE(config.ok());
  EXPECT_THAT(*config, HasSubstr("\"tie_word_embeddings\": true"));
  absl::StatusOr<std::map<std::string, math::Tensor>> hf = ToHfTensors(*model, trained);
  ASSERT_TRUE(hf.ok()) << hf.status();
  EXPECT_EQ(hf->count("lm_head.weight"), 0u);
  EXPECT_TRUE(
      SameBits(hf->at("transformer.wte.weight").data, trained.at("layers.0.token.weight").data));
  absl::StatusOr<std::map<std::string, math::Tensor>> back = FromHfTensors(*model, *hf, "test");
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->count("layers.4.weight"), 0u);
  EXPECT_TRUE(
      SameBits(back->at("layers.0.token.weight").data, trained.at("layers.0.token.weight").data));

  std::map<std::string, math::Tensor> tensors = trained;
  absl::StatusOr<ModelParams> params = TakeModelParams(*model, &tensors);
  ASSERT_TRUE(params.ok()) << params.status();
  EXPECT_TRUE(SameBits((*params)[kHead][0].data, trained.at("layers.0.token.weight").data));
}

TEST(TiedEmbeddingTest, StageRefusesTheEndItDoesNotHold) {
  auto model = BuildOrDie(kTiedGptSpec);
  auto middle = Stage::Create(model.get(), 1, 3, 1, math::OptimizerConfig());
  ASSERT_TRUE(middle.ok());
  EXPECT_FALSE(middle->holds_tied(TieEnd::kEmbedding));
  EXPECT_EQ(middle->TiedGradPart(TieEnd::kHead).status().code(),
            absl::StatusCode::kFailedPrecondition);
  auto head = Stage::Create(model.get(), 3, 5, 1, math::OptimizerConfig());
  ASSERT_TRUE(head.ok());
  const absl::StatusOr<double> wrong =
      head->SetTiedGrad(TieEnd::kHead, math::Tensor{{2, 2}, {0, 0, 0, 0}});
  EXPECT_EQ(wrong.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(wrong.status().message(), HasSubstr("layer 4's table of shape [11,8]"));
}

}  // namespace
}  // namespace pipetrain::model
