#include "common/model/reference_trainer.h"

#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "common/model/stage.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/model/test_models.h"

namespace pipetrain::model {
namespace {

using ::testing::HasSubstr;

bool BitwiseEqual(const std::map<std::string, math::Tensor>& a,
                  const std::map<std::string, math::Tensor>& b) {
  if (a.size() != b.size()) return false;
  for (const auto& [name, t] : a) {
    auto it = b.find(name);
    if (it == b.end() || it->second.shape != t.shape ||
        std::memcmp(it->second.data.data(), t.data.data(), t.data.size() * sizeof(float)) != 0) {
      ADD_FAILURE() << "tensor " << name << " differs";
      return false;
    }
  }
  return true;
}

TrainerOptions Options(int64_t m, math::OptimizerKind kind = math::OptimizerKind::kAdamW) {
  TrainerOptions o;
  o.microbatches = m;
  o.seed = 7;
  o.optimizer.kind = kind;
  o.optimizer.lr = kind == math::OptimizerKind::kSgd ? 0.1f : 1e-2f;
  o.optimizer.momentum = 0.9f;
  o.optimizer.weight_decay = 0.01f;
  o.optimizer.clip_norm = 0.5f;  // small enough to be active
  return o;
}

std::vector<float> Train(const Model& model, const TrainerOptions& o, int steps,
                         std::map<std::string, math::Tensor>* state = nullptr,
                         int64_t samples = 8) {
  auto t = ReferenceTrainer::Create(&model, o);
  EXPECT_TRUE(t.ok()) << t.status();
  std::vector<float> losses;
  for (int s = 0; s < steps; ++s) {
    auto r = (*t)->Step(testing::MakeBatch(model, samples, s));
    EXPECT_TRUE(r.ok()) << r.status();
    losses.push_back(r->loss);
  }
  if (state != nullptr) *state = (*t)->ExportState();
  return losses;
}

class ReferenceTrainerTest : public ::testing::TestWithParam<const char*> {};

TEST_P(ReferenceTrainerTest, TwoRunsAreBitwiseIdentical) {
  auto model = testing::BuildOrDie(GetParam());
  std::map<std::string, math::Tensor> s1, s2;
  const std::vector<float> l1 = Train(*model, Options(4), 5, &s1);
  const std::vector<float> l2 = Train(*model, Options(4), 5, &s2);
  ASSERT_EQ(0, std::memcmp(l1.data(), l2.data(), l1.size() * sizeof(float)));
  EXPECT_TRUE(BitwiseEqual(s1, s2));
}

TEST_P(ReferenceTrainerTest, LossDecreasesOnARepeatedBatch) {
  auto model = testing::BuildOrDie(GetParam());
  auto t = ReferenceTrainer::Create(model.get(), Options(2));
  ASSERT_TRUE(t.ok());
  const io::Batch b = testing::MakeBatch(*model, 8, 0);
  float first = 0, last = 0;
  for (int s = 0; s < 30; ++s) {
    auto r = (*t)->Step(b);
    ASSERT_TRUE(r.ok()) << r.status();
    if (s == 0) first = r->loss;
    last = r->loss;
  }
  EXPECT_LT(last, 0.5f * first);
}

TEST_P(ReferenceTrainerTest, LossIsTheSumOfMicrobatchLossesInOrder) {
  auto model = testing::BuildOrDie(GetParam());
  auto t = ReferenceTrainer::Create(model.get(), Options(4));
  ASSERT_TRUE(t.ok());
  auto r = (*t)->Step(testing::MakeBatch(*model, 8, 3));
  ASSERT_TRUE(r.ok());
  ASSERT_EQ(r->microbatch_losses.size(), 4u);
  float sum = 0;
  for (float l : r->microbatch_losses) sum += l;
  EXPECT_EQ(sum, r->loss);
}

TEST_P(ReferenceTrainerTest, MicrobatchCountChangesOnlyRounding) {
  // The mean loss and the summed gradient are mathematically independent of M.
  auto model = testing::BuildOrDie(GetParam());
  const std::vector<float> m1 = Train(*model, Options(1), 3);
  const std::vector<float> m8 = Train(*model, Options(8), 3);
  for (size_t i = 0; i < m1.size(); ++i) EXPECT_NEAR(m1[i], m8[i], 1e-4f * std::abs(m1[i]));
}

// Emulates a pipeline: the layers cut into stages, micro-batches passed stage to stage, each
// stage accumulating its own gradients, per-layer norms combined in layer order. The result must
// equal the single-stage reference bit for bit, for every cut.
TEST_P(ReferenceTrainerTest, AnyStageSplitIsBitwiseEqualToTheReference) {
  auto model = testing::BuildOrDie(GetParam());
  const TrainerOptions o = Options(4, math::OptimizerKind::kSgd);
  std::map<std::string, math::Tensor> reference;
  const std::vector<float> ref_losses = Train(*model, o, 3, &reference);

  const int64_t n = model->num_layers();
  for (int64_t cut1 = 1; cut1 < n; ++cut1) {
    const std::vector<std::pair<int64_t, int64_t>> ranges = {{0, cut1}, {cut1, n}};
    std::vector<Stage> stages;
    for (auto [a, b] : ranges) {
      auto s = Stage::Create(model.get(), a, b, o.seed, o.optimizer);
      ASSERT_TRUE(s.ok());
      // The step's canonical gradient tree, as the workers set it.
      auto tree = GradTree::Create(o.microbatches);
      ASSERT_TRUE(tree.ok());
      ASSERT_TRUE(s->SetGradTree(*tree).ok());
      stages.push_back(std::move(*s));
    }
    std::vector<float> losses;
    for (int step = 0; step < 3; ++step) {
      const io::Batch batch = testing::MakeBatch(*model, 8, step);
      for (auto& s : stages) s.ZeroGrads();
      const int64_t mb_rows = batch.inputs.rows() / o.microbatches;
      float loss = 0;
      // GPipe order: all forwards, then all backwards in increasing micro-batch order.
      std::vector<std::vector<MicrobatchState>> state(stages.size(),
                                                      std::vector<MicrobatchState>(o.microbatches));
      std::vector<math::Matrix> dpred(o.microbatches);
      for (int64_t mb = 0; mb < o.microbatches; ++mb) {
        math::Matrix x = batch.inputs.middleRows(mb * mb_rows, mb_rows);
        for (size_t s = 0; s < stages.size(); ++s) {
          x = stages[s].Forward(math::AsConstMap(x), &state[s][mb]);
        }
        math::Matrix t = batch.targets.middleRows(mb * mb_rows, mb_rows);
        dpred[mb].resize(x.rows(), x.cols());
        loss += static_cast<float>(
            model->loss().LossAndGrad(math::AsConstMap(x), math::AsConstMap(t),
                                      1.0 / batch.inputs.rows(), math::AsMap(dpred[mb])));
      }
      for (int64_t mb = 0; mb < o.microbatches; ++mb) {
        math::Matrix dy = dpred[mb];
        for (size_t s = stages.size(); s-- > 0;) {
          dy = stages[s].BackwardInput(math::AsConstMap(dy), s > 0, &state[s][mb]);
          stages[s].BackwardWeight(&state[s][mb]);
        }
      }
      std::vector<double> norms;
      for (auto& s : stages) {
        for (double v : s.GradNormSqPerLayer()) norms.push_back(v);
      }
      const float clip = math::ClipScale(SumLayerNormSq(norms), o.optimizer.clip_norm);
      for (auto& s : stages) s.ApplyOptimizer(step + 1, clip);
      losses.push_back(loss);
    }
    ASSERT_EQ(0, std::memcmp(losses.data(), ref_losses.data(), losses.size() * sizeof(float)))
        << "cut at " << cut1;
    std::map<std::string, math::Tensor> merged;
    for (auto& s : stages) {
      auto part = s.ExportState();
      merged.insert(part.begin(), part.end());
    }
    EXPECT_TRUE(BitwiseEqual(merged, reference)) << "cut at " << cut1;
  }
}

INSTANTIATE_TEST_SUITE_P(Models, ReferenceTrainerTest,
                         ::testing::Values(testing::kMlpSpec, testing::kGptSpec));

TEST(ReferenceTrainerErrors, RejectsBadBatchesAndLeavesStateUnchanged) {
  auto model = testing::BuildOrDie(testing::kMlpSpec);
  auto t = ReferenceTrainer::Create(model.get(), Options(3));
  ASSERT_TRUE(t.ok());
  const auto before = (*t)->ExportState();
  auto r = (*t)->Step(testing::MakeBatch(*model, 8, 0));
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(r.status().message(), HasSubstr("batch of 8 samples does not split into 3"));
  io::Batch bad = testing::MakeBatch(*model, 9, 0);
  bad.targets(4, 0) = -1;
  EXPECT_EQ((*t)->Step(bad).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ((*t)->steps_done(), 0);
  EXPECT_TRUE(BitwiseEqual(before, (*t)->ExportState()));
  EXPECT_TRUE((*t)->Step(testing::MakeBatch(*model, 9, 0)).ok());
}

// A micro-batch whose activations exceed the model's max_activation_bytes is refused before any
// compute (kMlpSpec: 408 bytes per sample); evaluation shrinks its chunks to fit instead.
TEST(ReferenceTrainerErrors, RefusesMicrobatchesOverTheActivationLimit) {
  auto spec = ParseModelSpecText(testing::kMlpSpec, "mlp");
  ASSERT_TRUE(spec.ok());
  ModelLimits limits;
  limits.max_activation_bytes = 4 * 408;
  auto model = Model::Build(*spec, limits);
  ASSERT_TRUE(model.ok()) << model.status();
  auto t = ReferenceTrainer::Create(model->get(), Options(1));
  ASSERT_TRUE(t.ok());
  const auto before = (*t)->ExportState();
  auto r = (*t)->Step(testing::MakeBatch(**model, 8, 0));
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(r.status().message(),
              HasSubstr("a micro-batch of 8 samples needs 3264 bytes of activations (408 per "
                        "sample), more than the limit of 1632 bytes"));
  EXPECT_EQ((*t)->steps_done(), 0);
  EXPECT_TRUE(BitwiseEqual(before, (*t)->ExportState()));

  auto split = ReferenceTrainer::Create(model->get(), Options(2));  // micro-batches of 4
  ASSERT_TRUE(split.ok());
  EXPECT_TRUE((*split)->Step(testing::MakeBatch(**model, 8, 0)).ok());

  io::DatasetOptions d;
  d.input_features = 6;
  d.num_classes = 4;
  auto data = io::OpenDataset("synthetic:100", d);
  ASSERT_TRUE(data.ok()) << data.status();
  auto eval = (*split)->Evaluate(**data, 0);  // 20 samples in chunks of 4
  ASSERT_TRUE(eval.ok()) << eval.status();
  EXPECT_EQ(eval->samples, 20);
}

TEST(ReferenceTrainerErrors, RejectsBadOptions) {
  auto model = testing::BuildOrDie(testing::kMlpSpec);
  TrainerOptions o = Options(0);
  EXPECT_THAT(ReferenceTrainer::Create(model.get(), o).status().message(),
              HasSubstr("microbatches must be >= 1"));
  o = Options(1);
  o.threads = 0;
  EXPECT_THAT(ReferenceTrainer::Create(model.get(), o).status().message(),
              HasSubstr("threads must be in [1, 256]"));
  o = Options(1);
  o.optimizer.lr = 0;
  EXPECT_EQ(ReferenceTrainer::Create(model.get(), o).status().code(),
            absl::StatusCode::kInvalidArgument);
}

// Compute threads: bitwise reproducible for a fixed thread count; a different count changes
// only the rounding (Eigen's parallel GEMM picks its blocking by thread count). The model is wide
// enough that Eigen really splits its products across threads.
TEST(ReferenceTrainerThreads, FixedThreadCountIsBitwiseReproducible) {
  auto model = testing::BuildOrDie(R"pb(
    input_features: 96
    layers { linear { out_features: 384 } }
    layers { gelu {} }
    layers { linear { out_features: 384 } }
    layers { relu {} }
    layers { linear { out_features: 10 } }
    loss { softmax_cross_entropy {} }
  )pb");
  TrainerOptions o = Options(2);
  o.threads = 2;
  std::map<std::string, math::Tensor> a, b, one;
  const std::vector<float> la = Train(*model, o, 3, &a, 256);
  const std::vector<float> lb = Train(*model, o, 3, &b, 256);
  EXPECT_EQ(0, std::memcmp(la.data(), lb.data(), la.size() * sizeof(float)));
  EXPECT_TRUE(BitwiseEqual(a, b));
  o.threads = 1;
  const std::vector<float> l1 = Train(*model, o, 3, &one, 256);
  for (size_t i = 0; i < l1.size(); ++i) EXPECT_NEAR(l1[i], la[i], 1e-5f * std::abs(la[i]));
}

}  // namespace
}  // namespace pipetrain::model
