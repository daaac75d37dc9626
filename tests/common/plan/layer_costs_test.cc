#include "common/plan/layer_costs.h"

#include <cmath>
#include <memory>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/model/model.h"
#include "gtest/gtest.h"

namespace pipetrain::plan {
namespace {

std::unique_ptr<model::Model> SmallModel() {
  absl::StatusOr<v1::ModelSpec> spec = model::ParseModelSpecText(
      "input_features: 8 "
      "layers { linear { out_features: 16 } } layers { relu {} } "
      "layers { linear { out_features: 4 } } loss { softmax_cross_entropy {} }",
      "test");
  EXPECT_TRUE(spec.ok()) << spec.status();
  absl::StatusOr<std::unique_ptr<model::Model>> m = model::Model::Build(*spec);
  EXPECT_TRUE(m.ok()) << m.status();
  return std::move(m).value();
}

TEST(LayerCostsTest, FromFlopsDividesEachOpsFlopsByTheSpeed) {
  std::unique_ptr<model::Model> m = SmallModel();
  const math::OptimizerConfig adamw;  // weights, gradients and two moments: 4 x.
  absl::StatusOr<ModelCosts> c = CostsFromFlops(*m, 3, adamw, 2.0);
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_EQ(c->layers.size(), 3u);
  EXPECT_EQ(c->samples, 3);
  EXPECT_EQ(c->gflops, 2.0);
  const math::FlopCount f = m->layer(0).Flops(3);
  EXPECT_DOUBLE_EQ(c->layers[0].forward, f.forward / 2e9);
  EXPECT_DOUBLE_EQ(c->layers[0].backward_input, f.backward_input / 2e9);
  EXPECT_DOUBLE_EQ(c->layers[0].backward_weight, f.backward_weight / 2e9);
  EXPECT_EQ(c->layers[0].optimizer, 0);
  EXPECT_DOUBLE_EQ(c->layers[0].output_bytes, 3 * 16 * 4);
  EXPECT_DOUBLE_EQ(c->layers[0].activation_bytes, 3 * 8 * 4 + m->layer(0).StashBytes(3));
  EXPECT_DOUBLE_EQ(c->layers[0].state_bytes, 4.0 * (16 * 8 + 16) * 4);
  EXPECT_DOUBLE_EQ(c->layers[1].state_bytes, 0);  // relu: no parameters.
  math::OptimizerConfig sgd;
  sgd.kind = math::OptimizerKind::kSgd;
  EXPECT_EQ(StateBytesPerParamByte(sgd), 2.0);
}

// The timing itself is not asserted (no timing in tests): only that every figure is there, finite
// and non-negative, and that the byte figures are those of the FLOPs model.
TEST(LayerCostsTest, MeasuredCostsHaveEveryFigure) {
  std::unique_ptr<model::Model> m = SmallModel();
  const math::OptimizerConfig adamw;
  MeasureOptions options;
  options.repeats = 3;
  absl::StatusOr<ModelCosts> measured = MeasureLayerCosts(*m, 2, adamw, 50, options);
  ASSERT_TRUE(measured.ok()) << measured.status();
  absl::StatusOr<ModelCosts> flops = CostsFromFlops(*m, 2, adamw, 50);
  ASSERT_TRUE(flops.ok());
  ASSERT_EQ(measured->layers.size(), 3u);
  for (size_t l = 0; l < 3; ++l) {
    const LayerCost& c = measured->layers[l];
    for (double t : {c.forward, c.backward_input, c.backward_weight, c.optimizer}) {
      EXPECT_TRUE(std::isfinite(t) && t >= 0) << l;
    }
    EXPECT_EQ(c.activation_bytes, flops->layers[l].activation_bytes);
    EXPECT_EQ(c.output_bytes, flops->layers[l].output_bytes);
    EXPECT_EQ(c.state_bytes, flops->layers[l].state_bytes);
  }
}

TEST(LayerCostsTest, ChunkSecondsHaveEveryFigureAndCheckTheRange) {
  std::unique_ptr<model::Model> m = SmallModel();
  const math::OptimizerConfig adamw;
  MeasureOptions options;
  options.repeats = 3;
  for (auto [first, last] : {std::pair<int, int>{0, 3}, {0, 1}, {1, 3}}) {
    absl::StatusOr<ChunkSeconds> c = MeasureChunkSeconds(*m, first, last, 2, adamw, options);
    ASSERT_TRUE(c.ok()) << c.status();
    for (double t : {c->forward, c->backward_input, c->backward_weight, c->optimizer}) {
      EXPECT_TRUE(std::isfinite(t) && t >= 0) << first << "-" << last;
    }
  }
  for (auto [first, last] : {std::pair<int, int>{2, 2}, {-1, 1}, {0, 4}}) {
    absl::Status s = MeasureChunkSeconds(*m, first, last, 2, adamw, options).status();
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << first << "-" << last;
    EXPECT_NE(s.message().find("is not a layer range"), std::string::npos) << s;
  }
}

// A worker's chunks timed together: one figure per chunk, each of every op; ranges must be
// ascending and disjoint.
TEST(LayerCostsTest, WorkerChunkSecondsHaveAFigurePerChunk) {
  std::unique_ptr<model::Model> m = SmallModel();
  const math::OptimizerConfig adamw;
  MeasureOptions options;
  options.repeats = 3;
  absl::StatusOr<std::vector<ChunkSeconds>> s =
      MeasureWorkerChunkSeconds(*m, {{0, 1}, {2, 3}}, 2, adamw, options);
  ASSERT_TRUE(s.ok()) << s.status();
  ASSERT_EQ(s->size(), 2u);
  for (const ChunkSeconds& c : *s) {
    for (double t : {c.forward, c.backward_input, c.backward_weight, c.optimizer}) {
      EXPECT_TRUE(std::isfinite(t) && t >= 0);
    }
  }
  for (const std::vector<LayerRange>& bad : std::vector<std::vector<LayerRange>>{
           {}, {{1, 2}, {0, 1}}, {{0, 2}, {1, 3}}, {{0, 1}, {1, 4}}}) {
    absl::Status st = MeasureWorkerChunkSeconds(*m, bad, 2, adamw, options).status();
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << bad.size();
  }
  // With micro-batches in flight: still a figure per chunk and op, per micro-batch.
  s = MeasureWorkerChunkSeconds(*m, {{0, 1}, {2, 3}}, 2, adamw, options, kMaxTimedInFlight);
  ASSERT_TRUE(s.ok()) << s.status();
  ASSERT_EQ(s->size(), 2u);
  for (const ChunkSeconds& c : *s) {
    for (double t : {c.forward, c.backward_input, c.backward_weight, c.optimizer}) {
      EXPECT_TRUE(std::isfinite(t) && t >= 0);
    }
  }
  for (const int in_flight : {0, kMaxTimedInFlight + 1}) {
    absl::Status st =
        MeasureWorkerChunkSeconds(*m, {{0, 1}}, 2, adamw, options, in_flight).status();
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << in_flight;
    EXPECT_EQ(st.message(),
              absl::StrCat("micro-batches in flight must be in [1, 16], got ", in_flight));
  }
}

TEST(LayerCostsTest, RefusesArgumentsOutOfRange) {
  std::unique_ptr<model::Model> m = SmallModel();
  const math::OptimizerConfig adamw;
  EXPECT_EQ(CostsFromFlops(*m, 0, adamw, 1).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CostsFromFlops(*m, 1, adamw, 0).status().code(), absl::StatusCode::kInvalidArgument);
  MeasureOptions none;
  none.repeats = 0;
  absl::Status s = MeasureLayerCosts(*m, 1, adamw, 1, none).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("repeats"), std::string::npos) << s;
}

}  // namespace
}  // namespace pipetrain::plan
