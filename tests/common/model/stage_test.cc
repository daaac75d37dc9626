// Stage: the overloads that take their input by rvalue compute exactly what the copying ones do,
// and the output and dL/dx may be moved out of the micro-batch state without changing what the
// later phases compute (the executor hands both to the network that way).
#include "common/model/stage.h"

#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "common/math/tensor.h"
#include "common/util/heap_tuning.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/common/math/grad_check.h"
#include "tests/common/model/test_models.h"

namespace pipetrain::model {
namespace {

using testing::BuildOrDie;
using testing::kGptSpec;
using testing::kMlpSpec;
using testing::MakeBatch;

bool BitwiseEqual(const math::Matrix& a, const math::Matrix& b) {
  return math::testing::BitwiseEqual(math::AsConstMap(a), math::AsConstMap(b));
}

// A deterministic [rows, cols] matrix varying with `salt`.
math::Matrix Pattern(int64_t rows, int64_t cols, int salt) {
  math::Matrix m(rows, cols);
  for (int64_t i = 0; i < m.size(); ++i) {
    m.data()[i] = 0.01f * static_cast<float>((i * 13 + salt * 7) % 97) - 0.4f;
  }
  return m;
}

// Runs F, I and W of two micro-batches through two identical stages over layers [first, last):
// one with the copying overloads, one with the moving overloads, taking the output and dx out of
// the state after F and I. Outputs, input gradients and accumulated weight gradients must be
// bitwise equal.
void ExpectMovingEqualsCopying(const char* spec, int64_t first, int64_t last) {
  auto model = BuildOrDie(spec);
  ASSERT_NE(model, nullptr);
  math::OptimizerConfig optimizer;
  auto copying = Stage::Create(model.get(), first, last, 11, optimizer);
  auto moving = Stage::Create(model.get(), first, last, 11, optimizer);
  ASSERT_TRUE(copying.ok()) << copying.status();
  ASSERT_TRUE(moving.ok()) << moving.status();
  copying->ZeroGrads();
  moving->ZeroGrads();

  for (int mb = 0; mb < 2; ++mb) {
    math::Matrix x;
    if (first == 0) {
      x = MakeBatch(*model, 3, mb).inputs;
    } else {
      x = Pattern(3 * model->tokens_per_sample(), model->layer(first).in_features(), mb);
    }
    MicrobatchState a, b;
    const math::Matrix y_copying = copying->Forward(math::AsConstMap(x), &a);
    math::Matrix x_moved = x;
    moving->Forward(std::move(x_moved), &b);
    math::Matrix y_moving = std::move(b.inputs.back());
    EXPECT_TRUE(BitwiseEqual(y_copying, y_moving)) << "output, micro-batch " << mb;

    const math::Matrix dy = Pattern(y_copying.rows(), y_copying.cols(), 100 + mb);
    const bool need_dx = first > 0;
    const math::Matrix dx_copying = copying->BackwardInput(math::AsConstMap(dy), need_dx, &a);
    math::Matrix dy_moved = dy;
    moving->BackwardInput(std::move(dy_moved), need_dx, &b);
    math::Matrix dx_moving = std::move(b.grads[0]);
    EXPECT_TRUE(BitwiseEqual(dx_copying, dx_moving)) << "dx, micro-batch " << mb;
    if (need_dx) {
      EXPECT_GT(dx_moving.size(), 0);
    }

    copying->BackwardWeight(&a);
    moving->BackwardWeight(&b);
  }
  for (int64_t l = first; l < last; ++l) {
    const auto& ga = copying->grads(l);
    const auto& gb = moving->grads(l);
    ASSERT_EQ(ga.size(), gb.size());
    for (size_t p = 0; p < ga.size(); ++p) {
      ASSERT_EQ(ga[p].data.size(), gb[p].data.size());
      EXPECT_EQ(
          std::memcmp(ga[p].data.data(), gb[p].data.data(), sizeof(float) * ga[p].data.size()), 0)
          << "layer " << l << " param " << p;
    }
  }
}

TEST(StageTest, MovingOverloadsMatchCopyingOnesMlp) {
  ExpectMovingEqualsCopying(kMlpSpec, 0, 3);  // first stage: no dx.
  ExpectMovingEqualsCopying(kMlpSpec, 2, 5);  // a middle stage.
}

TEST(StageTest, MovingOverloadsMatchCopyingOnesGpt) {
  ExpectMovingEqualsCopying(kGptSpec, 0, 2);
  ExpectMovingEqualsCopying(kGptSpec, 1, 4);
}

// Both stages hold bitwise the same weights and optimizer state.
void ExpectSameState(const Stage& a, const Stage& b) {
  const auto sa = a.ExportState();
  const auto sb = b.ExportState();
  ASSERT_EQ(sa.size(), sb.size());
  for (const auto& [name, tensor] : sa) {
    const math::Tensor& other = sb.at(name);
    ASSERT_EQ(tensor.data.size(), other.data.size()) << name;
    EXPECT_EQ(
        std::memcmp(tensor.data.data(), other.data.data(), sizeof(float) * tensor.data.size()), 0)
        << name;
  }
}

// One step of two micro-batches: F, I, W of each; the last W sets *norms when given.
void RunStep(const Model& model, Stage* stage, int step, std::vector<double>* norms = nullptr) {
  for (int mb = 0; mb < 2; ++mb) {
    const math::Matrix x = MakeBatch(model, 3, 10 * step + mb).inputs;
    MicrobatchState state;
    const math::Matrix y = stage->Forward(math::AsConstMap(x), &state);
    const math::Matrix dy = Pattern(y.rows(), y.cols(), 10 * step + mb);
    stage->BackwardInput(math::AsConstMap(dy), /*need_input_grad=*/false, &state);
    stage->BackwardWeight(&state, mb == 1 ? norms : nullptr);
  }
}

// The norms the last W takes layer by layer are those GradNormSqPerLayer computes afterwards,
// bit for bit (the worker reports the former, the reference trainer the latter).
TEST(StageTest, TheLastWeightGradientGivesTheNormsOfGradNormSqPerLayer) {
  for (const char* spec : {kMlpSpec, kGptSpec}) {
    auto model = BuildOrDie(spec);
    ASSERT_NE(model, nullptr);
    auto stage = Stage::Create(model.get(), 0, model->num_layers(), 3, math::OptimizerConfig{});
    ASSERT_TRUE(stage.ok()) << stage.status();
    std::vector<double> norms;
    RunStep(*model, &*stage, 1, &norms);
    ASSERT_EQ(static_cast<int64_t>(norms.size()), model->num_layers());
    EXPECT_GT(*std::max_element(norms.begin(), norms.end()), 0.0);
    EXPECT_EQ(norms, stage->GradNormSqPerLayer()) << spec;
  }
}

// The flat gradients (a data-parallel replica's reduction): CopyGradsTo lays out every layer's
// parameters in order, SetGradsFrom puts such a vector back (the norms are then those of the new
// values), and a vector of another length is INVALID_ARGUMENT and changes nothing.
TEST(StageTest, FlatGradientsRoundTripInLayerAndParameterOrder) {
  auto model = BuildOrDie(kGptSpec);
  ASSERT_NE(model, nullptr);
  auto stage = Stage::Create(model.get(), 0, model->num_layers(), 3, math::OptimizerConfig{});
  ASSERT_TRUE(stage.ok()) << stage.status();
  RunStep(*model, &*stage, 1);
  std::vector<float> flat;
  stage->CopyGradsTo(&flat);
  ASSERT_EQ(static_cast<int64_t>(flat.size()), stage->NumGradFloats());
  std::vector<float> want;
  for (int64_t l = 0; l < model->num_layers(); ++l) {
    for (const math::Tensor& g : stage->grads(l))
      want.insert(want.end(), g.data.begin(), g.data.end());
  }
  ASSERT_EQ(flat.size(), want.size());
  EXPECT_EQ(std::memcmp(flat.data(), want.data(), sizeof(float) * flat.size()), 0);

  std::vector<float> doubled(flat);
  for (float& v : doubled) v *= 2.0f;  // exact: a power of two.
  ASSERT_TRUE(stage->SetGradsFrom(doubled).ok());
  std::vector<float> back;
  stage->CopyGradsTo(&back);
  EXPECT_EQ(std::memcmp(back.data(), doubled.data(), sizeof(float) * back.size()), 0);
  const std::vector<double> norms = stage->GradNormSqPerLayer();

  doubled.pop_back();
  const absl::Status wrong = stage->SetGradsFrom(doubled);
  EXPECT_EQ(wrong.code(), absl::StatusCode::kInvalidArgument) << wrong;
  EXPECT_THAT(std::string(wrong.message()), ::testing::HasSubstr("floats given"));
  stage->CopyGradsTo(&back);
  doubled.push_back(2.0f * flat.back());
  EXPECT_EQ(std::memcmp(back.data(), doubled.data(), sizeof(float) * back.size()), 0);
  EXPECT_EQ(stage->GradNormSqPerLayer(), norms);
}

// ApplyOptimizer leaves every gradient zero (the worker's next RunStep relies on it instead of
// clearing them again), and ZeroGrads still clears gradients that a discarded step left (as an
// aborted step does): both stages end bitwise equal, for an optimizer with state (AdamW) and one
// without (SGD).
TEST(StageTest, ApplyOptimizerLeavesTheGradientsZero) {
  auto model = BuildOrDie(kMlpSpec);
  ASSERT_NE(model, nullptr);
  for (const math::OptimizerKind kind : {math::OptimizerKind::kSgd, math::OptimizerKind::kAdamW}) {
    math::OptimizerConfig optimizer;
    optimizer.kind = kind;
    optimizer.lr = 0.05f;
    auto implicit = Stage::Create(model.get(), 0, model->num_layers(), 5, optimizer);
    auto explicit_zero = Stage::Create(model.get(), 0, model->num_layers(), 5, optimizer);
    ASSERT_TRUE(implicit.ok()) << implicit.status();
    ASSERT_TRUE(explicit_zero.ok()) << explicit_zero.status();
    for (int step = 1; step <= 3; ++step) {
      RunStep(*model, &*explicit_zero, 7 + step);  // a step that is then discarded.
      explicit_zero->ZeroGrads();
      RunStep(*model, &*implicit, step);
      RunStep(*model, &*explicit_zero, step);
      const std::vector<double> norms = implicit->GradNormSqPerLayer();
      EXPECT_GT(*std::max_element(norms.begin(), norms.end()), 0.0) << "step " << step;
      EXPECT_EQ(norms, explicit_zero->GradNormSqPerLayer()) << "step " << step;
      implicit->ApplyOptimizer(step, 1.0f);
      explicit_zero->ApplyOptimizer(step, 1.0f);
      for (double n : implicit->GradNormSqPerLayer()) EXPECT_EQ(n, 0.0) << "step " << step;
      for (int64_t l = 0; l < model->num_layers(); ++l) {
        for (const math::Tensor& g : implicit->grads(l)) {
          for (float v : g.data) ASSERT_EQ(v, 0.0f) << "layer " << l << " step " << step;
        }
      }
    }
    ExpectSameState(*implicit, *explicit_zero);
  }
}

// The Linear layers keep their weights packed between micro-batches (math::ParamCache): after an
// update, and after ImportState, a stage computes exactly what a fresh stage holding the same
// state computes (a stale packing would compute with the old weights).
TEST(StageTest, UpdatedAndImportedWeightsAreThoseTheProductsUse) {
  constexpr char kWideMlp[] = R"pb(
    name: "wide"
    input_features: 64
    layers { linear { out_features: 96 } }
    layers { relu {} }
    layers { linear { out_features: 80 } }
    layers { relu {} }
    layers { linear { out_features: 10 } }
    loss { softmax_cross_entropy {} }
  )pb";
  auto model = BuildOrDie(kWideMlp);
  ASSERT_NE(model, nullptr);
  model->kernels().ConfigureEigen(1);  // one Eigen thread, as workers run: the packed products.
  math::OptimizerConfig optimizer;
  optimizer.kind = math::OptimizerKind::kSgd;
  optimizer.lr = 0.5f;
  auto trained = Stage::Create(model.get(), 0, model->num_layers(), 3, optimizer);
  ASSERT_TRUE(trained.ok()) << trained.status();
  const auto initial = trained->ExportState();
  const math::Matrix x = MakeBatch(*model, 24, 99).inputs;
  const math::Matrix dy = Pattern(24, 10, 5);

  // F and I of `x` and `dy` on `stage`.
  auto outputs = [&](Stage& stage) {
    MicrobatchState state;
    const math::Matrix y = stage.Forward(math::AsConstMap(x), &state);
    const math::Matrix dx = stage.BackwardInput(math::AsConstMap(dy), true, &state);
    return std::make_pair(y, dx);
  };
  // What a stage built afresh from `state` computes.
  auto fresh_outputs = [&](const std::map<std::string, math::Tensor>& state) {
    auto fresh = Stage::Create(model.get(), 0, model->num_layers(), 77, optimizer);
    EXPECT_TRUE(fresh.ok()) << fresh.status();
    EXPECT_TRUE(fresh->ImportState(state).ok());
    return outputs(*fresh);
  };

  EXPECT_EQ(trained->ParamCacheBytes(), 0);
  const auto before = outputs(*trained);
  EXPECT_GE(trained->ParamCacheBytes(), int64_t{2 * 4 * (64 * 96 + 96 * 80 + 80 * 10)});
  for (int step = 1; step <= 2; ++step) {
    for (int mb = 0; mb < 2; ++mb) {
      MicrobatchState state;
      const math::Matrix in = MakeBatch(*model, 24, 10 * step + mb).inputs;
      trained->Forward(math::AsConstMap(in), &state);
      trained->BackwardInput(math::AsConstMap(Pattern(24, 10, step + mb)), false, &state);
      trained->BackwardWeight(&state);
    }
    trained->ApplyOptimizer(step, 1.0f);
    const auto after = outputs(*trained);
    const auto expected = fresh_outputs(trained->ExportState());
    EXPECT_FALSE(BitwiseEqual(after.first, before.first)) << "step " << step;
    EXPECT_TRUE(BitwiseEqual(after.first, expected.first)) << "step " << step;
    EXPECT_TRUE(BitwiseEqual(after.second, expected.second)) << "step " << step;
  }

  ASSERT_TRUE(trained->ImportState(initial).ok());
  const auto reloaded = outputs(*trained);
  EXPECT_TRUE(BitwiseEqual(reloaded.first, before.first));
  EXPECT_TRUE(BitwiseEqual(reloaded.second, before.second));
}

// BackwardWeight may defer the weight gradients and add several micro-batches together: never
// deferring, deferring until the step's last micro-batch (the default limit) and deferring a few
// at a time give bitwise the same gradients, norms and updated weights, for five micro-batches
// of which the last is shorter, over three steps; the deferred bytes are reported and dropped by
// ZeroGrads.
TEST(StageTest, DeferredWeightGradientsAreBitwiseThoseAddedAtOnce) {
  constexpr char kDeepMlp[] = R"pb(
    name: "deep"
    input_features: 64
    layers { linear { out_features: 128 } }
    layers { relu {} }
    layers { linear { out_features: 128 } }
    layers { layer_norm {} }
    layers { linear { out_features: 10 } }
    loss { softmax_cross_entropy {} }
  )pb";
  for (const char* spec : {kDeepMlp, kGptSpec}) {
    auto model = BuildOrDie(spec);
    ASSERT_NE(model, nullptr);
    model->kernels().ConfigureEigen(1);
    math::OptimizerConfig optimizer;
    optimizer.kind = math::OptimizerKind::kAdamW;
    optimizer.lr = 0.01f;
    std::vector<Stage> stages;
    for (int i = 0; i < 3; ++i) {
      auto stage = Stage::Create(model.get(), 0, model->num_layers(), 21, optimizer);
      ASSERT_TRUE(stage.ok()) << stage.status();
      stages.push_back(std::move(*stage));
    }
    Stage& immediate = stages[0];
    Stage& deferred = stages[1];
    Stage& in_groups = stages[2];
    // The default limit: the bytes of the weights, gradients and AdamW's two state tensors.
    int64_t weight_bytes = 0;
    for (int64_t l = 0; l < model->num_layers(); ++l) {
      for (const math::Tensor& p : deferred.params(l)) {
        weight_bytes += static_cast<int64_t>(p.data.size() * sizeof(float));
      }
    }
    EXPECT_EQ(deferred.weight_grad_defer_bytes(), 4 * weight_bytes);
    // The small GPT's stashes outweigh its weights: defer regardless, for the comparison.
    deferred.set_weight_grad_defer_bytes(int64_t{1} << 40);
    immediate.set_weight_grad_defer_bytes(0);
    const int64_t rows = 4 * model->tokens_per_sample();
    {
      // The third stage adds every two micro-batches: its limit is just under two's bytes.
      MicrobatchState probe;
      const math::Matrix x = MakeBatch(*model, 4, 1).inputs;
      const math::Matrix y = deferred.Forward(math::AsConstMap(x), &probe);
      deferred.BackwardInput(math::AsConstMap(Pattern(y.rows(), y.cols(), 1)), false, &probe);
      deferred.BackwardWeight(&probe);
      const int64_t one = deferred.DeferredWeightGradBytes();
      EXPECT_GT(one, 0) << spec;
      in_groups.set_weight_grad_defer_bytes(2 * one - 1);
      deferred.ZeroGrads();  // drops it.
      EXPECT_EQ(deferred.DeferredWeightGradBytes(), 0);
    }
    for (int step = 1; step <= 3; ++step) {
      std::vector<std::vector<double>> norms(3);
      for (int mb = 0; mb < 5; ++mb) {
        const int64_t mb_rows = mb == 4 ? rows / 2 : rows;
        const math::Matrix x =
            MakeBatch(*model, mb_rows / model->tokens_per_sample(), 10 * step + mb).inputs;
        for (int i = 0; i < 3; ++i) {
          MicrobatchState state;
          const math::Matrix y = stages[i].Forward(math::AsConstMap(x), &state);
          const math::Matrix dy = Pattern(y.rows(), y.cols(), 10 * step + mb);
          stages[i].BackwardInput(math::AsConstMap(dy), /*need_input_grad=*/false, &state);
          stages[i].BackwardWeight(&state, mb == 4 ? &norms[i] : nullptr);
          if (i == 0) {
            EXPECT_EQ(immediate.DeferredWeightGradBytes(), 0);
          }
        }
        if (mb == 0) {
          EXPECT_GT(deferred.DeferredWeightGradBytes(), 0) << spec;
          EXPECT_GT(in_groups.DeferredWeightGradBytes(), 0) << spec;
        }
        if (mb == 3) {
          EXPECT_EQ(in_groups.DeferredWeightGradBytes(), 0) << spec;  // added after mb 1 and 3.
        }
      }
      EXPECT_EQ(deferred.DeferredWeightGradBytes(), 0);  // added at the last micro-batch.
      EXPECT_GT(*std::max_element(norms[0].begin(), norms[0].end()), 0.0) << spec;
      EXPECT_EQ(norms[0], norms[1]) << spec << " step " << step;
      EXPECT_EQ(norms[0], norms[2]) << spec << " step " << step;
      for (Stage& stage : stages) stage.ApplyOptimizer(step, 1.0f);
    }
    ExpectSameState(immediate, deferred);
    ExpectSameState(immediate, in_groups);

    // A step that is discarded: ZeroGrads drops what was deferred.
    MicrobatchState state;
    const math::Matrix x = MakeBatch(*model, 2, 99).inputs;
    const math::Matrix y = deferred.Forward(math::AsConstMap(x), &state);
    deferred.BackwardInput(math::AsConstMap(Pattern(y.rows(), y.cols(), 1)), false, &state);
    deferred.BackwardWeight(&state);
    EXPECT_GT(deferred.DeferredWeightGradBytes(), 0);
    deferred.ZeroGrads();
    EXPECT_EQ(deferred.DeferredWeightGradBytes(), 0);
    for (double n : deferred.GradNormSqPerLayer()) EXPECT_EQ(n, 0.0) << spec;
  }
}

// Create checks exactly what it will allocate (weights, gradients and the optimizer's state
// tensors) against the model's max_parameter_bytes, before allocating.
TEST(StageTest, CreateRefusesARangeOverTheParameterLimit) {
  auto spec = ParseModelSpecText(kMlpSpec, "mlp");
  ASSERT_TRUE(spec.ok());
  // kMlpSpec's parameters per layer: 56, 0, 16, 72, 0, 36 (180 in all). Each layer fits 2000 bytes
  // with AdamW (at most 72 x 16 = 1152), the whole model does not (180 x 16 = 2880).
  ModelLimits limits;
  limits.max_parameter_bytes = 2000;
  auto model = Model::Build(*spec, limits);
  ASSERT_TRUE(model.ok()) << model.status();
  math::OptimizerConfig adamw;
  auto stage = Stage::Create(model->get(), 0, 6, 1, adamw);
  EXPECT_EQ(stage.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(std::string(stage.status().message()),
              ::testing::HasSubstr("stage of layers [0, 6) needs 2880 bytes for its parameters "
                                   "(weights, gradients and 2 optimizer state tensors), more "
                                   "than the limit of 2000 bytes"));
  // Split in two, each half fits.
  EXPECT_TRUE(Stage::Create(model->get(), 0, 3, 1, adamw).ok());
  EXPECT_TRUE(Stage::Create(model->get(), 3, 6, 1, adamw).ok());
  // Plain SGD keeps no state: 180 x 8 = 1440 bytes fit.
  math::OptimizerConfig sgd;
  sgd.kind = math::OptimizerKind::kSgd;
  EXPECT_TRUE(Stage::Create(model->get(), 0, 6, 1, sgd).ok());
}

// In a child process: limits the address space to what is in use now plus 64 MiB, creates a stage
// over `model`'s layer 0 (whose 128 MiB weight cannot then be allocated), prints the status and
// exits 0 if it is RESOURCE_EXHAUSTED.
[[noreturn]] void CreateStageUnderAddressSpaceLimit(const Model* model) {
  long pages = 0;
  FILE* statm = std::fopen("/proc/self/statm", "r");
  if (statm == nullptr || std::fscanf(statm, "%ld", &pages) != 1) std::_Exit(2);
  std::fclose(statm);
  struct rlimit rl;
  rl.rlim_cur = static_cast<rlim_t>(pages) * static_cast<rlim_t>(::sysconf(_SC_PAGESIZE)) +
                (rlim_t{64} << 20);
  rl.rlim_max = rl.rlim_cur;
  if (::setrlimit(RLIMIT_AS, &rl) != 0) std::_Exit(3);
  auto stage = Stage::Create(model, 0, 1, 1, math::OptimizerConfig());
  std::fprintf(stderr, "%s\n", stage.status().ToString().c_str());
  std::_Exit(stage.status().code() == absl::StatusCode::kResourceExhausted ? 0 : 1);
}

// The last line of defence: an allocation that fails although the limit allowed it (the machine,
// here RLIMIT_AS, has less memory) is RESOURCE_EXHAUSTED, not an abort. Runs in a child process
// so that the address-space limit does not outlive the test.
TEST(StageDeathTest, AllocationFailureIsAnError) {
  if (util::kSanitizerAllocator) {
    GTEST_SKIP() << "a sanitizer's operator new reports out of memory and aborts instead of "
                    "throwing std::bad_alloc, whatever allocator_may_return_null says";
  }
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  auto spec = ParseModelSpecText(R"pb(input_features: 4096
                                      layers { linear { out_features: 8192 no_bias: true } }
                                      loss { mse {} })pb",
                                 "big");
  ASSERT_TRUE(spec.ok());
  ModelLimits limits;
  limits.max_parameter_bytes = int64_t{1} << 40;  // let the allocation be tried
  auto model = Model::Build(*spec, limits);
  ASSERT_TRUE(model.ok()) << model.status();
  EXPECT_EXIT(CreateStageUnderAddressSpaceLimit(model->get()), ::testing::ExitedWithCode(0),
              "out of memory allocating 536870912 bytes");
}

}  // namespace
}  // namespace pipetrain::model
