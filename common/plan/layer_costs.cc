#include "common/plan/layer_costs.h"

#include <time.h>

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/model/stage.h"
#include "common/util/status_macros.h"

namespace pipetrain::plan {
namespace {

// The byte figures of layer `l` for micro-batches of `rows` rows.
LayerCost LayerBytes(const model::Model& model, int64_t l, int64_t rows,
                     const std::vector<int64_t>& param_bytes, double state_factor) {
  const math::Layer& layer = model.layer(l);
  LayerCost cost;
  cost.activation_bytes = static_cast<double>(rows) * layer.in_features() * 4 +
                          static_cast<double>(layer.StashBytes(rows));
  cost.output_bytes = static_cast<double>(rows) * layer.out_features() * 4;
  cost.state_bytes = state_factor * static_cast<double>(param_bytes[l]);
  cost.gradient_bytes = static_cast<double>(param_bytes[l]);
  return cost;
}

absl::Status CheckCostArguments(int64_t samples, double gflops) {
  if (samples < 1 || samples > (int64_t{1} << 30)) {
    return absl::InvalidArgumentError(
        absl::StrCat("samples per micro-batch must be in [1, 2^30], got ", samples));
  }
  if (!(gflops > 0 && gflops <= 1e9)) {
    return absl::InvalidArgumentError(absl::StrCat("gflops must be in (0, 1e9], got ", gflops));
  }
  return absl::OkStatus();
}

// The vocabulary of an embedding layer (its table's rows); 0 for other layers.
int64_t EmbeddingVocab(const math::Layer& layer) {
  const std::vector<math::ParamSpec> params = layer.params();
  if (layer.kind() != "embedding" || params.empty() || params[0].shape.empty()) return 0;
  return params[0].shape[0];
}

// [rows, cols] of values spread over [-scale, scale] (a fixed pseudo-random sequence), or token
// ids below `vocab` when it is > 0: inputs and gradients as varied as training's, so that e.g. an
// attention's softmax meets the range of exponents it meets there (constant inputs make every
// score equal).
math::Matrix TimingInput(int64_t rows, int64_t cols, float scale, int64_t vocab) {
  math::Matrix m(rows, cols);
  uint64_t state = 0x9E3779B97F4A7C15ull;
  for (int64_t i = 0; i < m.size(); ++i) {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    const uint32_t bits = static_cast<uint32_t>(state >> 33);
    m.data()[i] = vocab > 0 ? static_cast<float>(bits % vocab)
                            : scale * (static_cast<float>(bits) / 2147483648.0f - 1.0f);
  }
  return m;
}

absl::Status CheckMeasureOptions(const MeasureOptions& options) {
  if (options.repeats < 1 || options.repeats > 1000 || options.threads < 1 ||
      options.threads > 1024) {
    return absl::InvalidArgumentError(
        absl::StrCat("measuring needs repeats in [1, 1000] and threads in [1, 1024], got ",
                     options.repeats, " and ", options.threads));
  }
  return absl::OkStatus();
}

// The median of the repeats (their CPU seconds: a first touch or a cache flushed by another
// process is an outlier, not the rule).
double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// The CPU seconds this process has used: what an op costs a core, without the time other
// processes held the core (on a shared host the wall time of an op is mostly theirs). The
// timing thread is the only busy one while it measures; with T compute threads an op's time is
// its CPU seconds / T.
double ProcessCpuSeconds() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

// Times layer `l` alone (see MeasureLayerCosts) and fills the seconds of `cost`.
absl::Status TimeLayer(const model::Model& model, int64_t l, int64_t rows,
                       const math::OptimizerConfig& optimizer, const MeasureOptions& options,
                       LayerCost* cost) {
  PT_ASSIGN_OR_RETURN(model::Stage stage,
                      model::Stage::Create(&model, l, l + 1, options.seed, optimizer));
  stage.set_weight_grad_defer_bytes(0);
  const math::Layer& layer = model.layer(l);
  const math::Matrix x = TimingInput(rows, layer.in_features(), 1.0f, EmbeddingVocab(layer));
  const math::Matrix dy = TimingInput(rows, layer.out_features(), 1e-3f, 0);
  std::vector<double> f, i, w, opt;
  for (int r = 0; r <= options.repeats; ++r) {
    model::MicrobatchState mb;
    double t0 = ProcessCpuSeconds();
    stage.Forward(math::AsConstMap(x), &mb);
    const double tf = (ProcessCpuSeconds() - t0) / options.threads;
    t0 = ProcessCpuSeconds();
    stage.BackwardInput(math::AsConstMap(dy), l > 0, &mb);
    const double ti = (ProcessCpuSeconds() - t0) / options.threads;
    t0 = ProcessCpuSeconds();
    stage.BackwardWeight(&mb);
    const double tw = (ProcessCpuSeconds() - t0) / options.threads;
    t0 = ProcessCpuSeconds();
    stage.ApplyOptimizer(r + 1, 1.0f);
    const double to = (ProcessCpuSeconds() - t0) / options.threads;
    if (r == 0) continue;  // warm-up: first touches, parameter caches.
    f.push_back(tf);
    i.push_back(ti);
    w.push_back(tw);
    opt.push_back(to);
  }
  cost->forward = Median(std::move(f));
  cost->backward_input = Median(std::move(i));
  cost->backward_weight = Median(std::move(w));
  cost->optimizer = Median(std::move(opt));
  return absl::OkStatus();
}

}  // namespace

double StateBytesPerParamByte(const math::OptimizerConfig& optimizer) {
  return 2.0 + static_cast<double>(math::OptimizerStateNames(optimizer).size());
}

absl::StatusOr<ModelCosts> CostsFromFlops(const model::Model& model, int64_t samples,
                                          const math::OptimizerConfig& optimizer, double gflops) {
  PT_RETURN_IF_ERROR(CheckCostArguments(samples, gflops));
  ModelCosts costs;
  costs.samples = samples;
  costs.gflops = gflops;
  const int64_t rows = samples * model.tokens_per_sample();
  const std::vector<int64_t> params = model.LayerParamBytes();
  const double factor = StateBytesPerParamByte(optimizer);
  for (int64_t l = 0; l < model.num_layers(); ++l) {
    LayerCost cost = LayerBytes(model, l, rows, params, factor);
    const math::FlopCount flops = model.layer(l).Flops(rows);
    cost.forward = flops.forward / (gflops * 1e9);
    cost.backward_input = flops.backward_input / (gflops * 1e9);
    cost.backward_weight = flops.backward_weight / (gflops * 1e9);
    costs.layers.push_back(cost);
  }
  return costs;
}

absl::StatusOr<ModelCosts> MeasureLayerCosts(const model::Model& model, int64_t samples,
                                             const math::OptimizerConfig& optimizer, double gflops,
                                             const MeasureOptions& options) {
  PT_RETURN_IF_ERROR(CheckCostArguments(samples, gflops));
  PT_RETURN_IF_ERROR(CheckMeasureOptions(options));
  PT_RETURN_IF_ERROR(model.CheckMicrobatchActivations(samples));
  model.kernels().ConfigureEigen(options.threads);
  ModelCosts costs;
  costs.samples = samples;
  costs.gflops = gflops;
  const int64_t rows = samples * model.tokens_per_sample();
  const std::vector<int64_t> params = model.LayerParamBytes();
  const double factor = StateBytesPerParamByte(optimizer);
  for (int64_t l = 0; l < model.num_layers(); ++l) {
    LayerCost cost = LayerBytes(model, l, rows, params, factor);
    PT_RETURN_IF_ERROR(TimeLayer(model, l, rows, optimizer, options, &cost));
    costs.layers.push_back(cost);
  }
  return costs;
}

absl::StatusOr<ChunkSeconds> MeasureChunkSeconds(const model::Model& model, int64_t first,
                                                 int64_t last, int64_t samples,
                                                 const math::OptimizerConfig& optimizer,
                                                 const MeasureOptions& options) {
  PT_RETURN_IF_ERROR(CheckCostArguments(samples, 1));
  PT_RETURN_IF_ERROR(CheckMeasureOptions(options));
  if (first < 0 || first >= last || last > model.num_layers()) {
    return absl::InvalidArgumentError(absl::StrCat("chunk [", first, ", ", last,
                                                   ") is not a layer range of a model of ",
                                                   model.num_layers(), " layers"));
  }
  model.kernels().ConfigureEigen(options.threads);
  PT_ASSIGN_OR_RETURN(model::Stage stage,
                      model::Stage::Create(&model, first, last, options.seed, optimizer));
  stage.set_weight_grad_defer_bytes(0);
  const int64_t rows = samples * model.tokens_per_sample();
  const math::Matrix x =
      TimingInput(rows, model.layer(first).in_features(), 1.0f, EmbeddingVocab(model.layer(first)));
  const math::Matrix dy = TimingInput(rows, model.layer(last - 1).out_features(), 1e-3f, 0);
  const bool loss = last == model.num_layers();
  // Class 0 for every row (a valid target of both losses).
  const math::Matrix targets = math::Matrix::Zero(rows, model.target_features());
  math::Matrix dpred(rows, model.layer(last - 1).out_features());
  std::vector<double> f, i, w, opt;
  for (int r = 0; r <= options.repeats; ++r) {
    model::MicrobatchState mb;
    double t0 = ProcessCpuSeconds();
    const math::Matrix& pred = stage.Forward(math::AsConstMap(x), &mb);
    if (loss) {
      model.loss().LossAndGrad(math::AsConstMap(pred), math::AsConstMap(targets), 1.0 / rows,
                               math::AsMap(dpred));
    }
    const double tf = (ProcessCpuSeconds() - t0) / options.threads;
    t0 = ProcessCpuSeconds();
    stage.BackwardInput(math::AsConstMap(loss ? dpred : dy), first > 0, &mb);
    const double ti = (ProcessCpuSeconds() - t0) / options.threads;
    t0 = ProcessCpuSeconds();
    stage.BackwardWeight(&mb);
    const double tw = (ProcessCpuSeconds() - t0) / options.threads;
    t0 = ProcessCpuSeconds();
    stage.ApplyOptimizer(r + 1, 1.0f);
    const double to = (ProcessCpuSeconds() - t0) / options.threads;
    if (r == 0) continue;
    f.push_back(tf);
    i.push_back(ti);
    w.push_back(tw);
    opt.push_back(to);
  }
  return ChunkSeconds{Median(std::move(f)), Median(std::move(i)), Median(std::move(w)),
                      Median(std::move(opt))};
}

}  // namespace pipetrain::plan
