#include "common/plan/layer_costs.h"

#include <algorithm>
#include <chrono>
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

absl::Status CheckMeasureOptions(const MeasureOptions& options) {
  if (options.repeats < 1 || options.repeats > 1000 || options.threads < 1 ||
      options.threads > 1024) {
    return absl::InvalidArgumentError(
        absl::StrCat("measuring needs repeats in [1, 1000] and threads in [1, 1024], got ",
                     options.repeats, " and ", options.threads));
  }
  return absl::OkStatus();
}

// The median of the repeats: what a step will typically see on this machine as it is loaded now
// (the speed a worker registers is the idle one instead: speed_probe.h).
double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double SecondsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Times layer `l` alone (see MeasureLayerCosts) and fills the seconds of `cost`.
absl::Status TimeLayer(const model::Model& model, int64_t l, int64_t rows,
                       const math::OptimizerConfig& optimizer, const MeasureOptions& options,
                       LayerCost* cost) {
  PT_ASSIGN_OR_RETURN(model::Stage stage,
                      model::Stage::Create(&model, l, l + 1, options.seed, optimizer));
  stage.set_weight_grad_defer_bytes(0);
  const math::Layer& layer = model.layer(l);
  const bool tokens = layer.kind() == "embedding";
  const math::Matrix x = math::Matrix::Constant(rows, layer.in_features(), tokens ? 0.0f : 0.5f);
  const math::Matrix dy = math::Matrix::Constant(rows, layer.out_features(), 1e-3f);
  std::vector<double> f, i, w, opt;
  for (int r = 0; r <= options.repeats; ++r) {
    model::MicrobatchState mb;
    auto t0 = std::chrono::steady_clock::now();
    stage.Forward(math::AsConstMap(x), &mb);
    const double tf = SecondsSince(t0);
    t0 = std::chrono::steady_clock::now();
    stage.BackwardInput(math::AsConstMap(dy), l > 0, &mb);
    const double ti = SecondsSince(t0);
    t0 = std::chrono::steady_clock::now();
    stage.BackwardWeight(&mb);
    const double tw = SecondsSince(t0);
    t0 = std::chrono::steady_clock::now();
    stage.ApplyOptimizer(r + 1, 1.0f);
    const double to = SecondsSince(t0);
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
  const bool tokens = model.layer(first).kind() == "embedding";
  const math::Matrix x =
      math::Matrix::Constant(rows, model.layer(first).in_features(), tokens ? 0.0f : 0.5f);
  const math::Matrix dy = math::Matrix::Constant(rows, model.layer(last - 1).out_features(), 1e-3f);
  const bool loss = last == model.num_layers();
  const math::Matrix targets = math::Matrix::Zero(rows, model.target_features());
  math::Matrix dpred(rows, model.layer(last - 1).out_features());
  std::vector<double> f, i, w, opt;
  for (int r = 0; r <= options.repeats; ++r) {
    model::MicrobatchState mb;
    auto t0 = std::chrono::steady_clock::now();
    const math::Matrix& pred = stage.Forward(math::AsConstMap(x), &mb);
    if (loss) {
      model.loss().LossAndGrad(math::AsConstMap(pred), math::AsConstMap(targets), 1.0 / rows,
                               math::AsMap(dpred));
    }
    const double tf = SecondsSince(t0);
    t0 = std::chrono::steady_clock::now();
    stage.BackwardInput(math::AsConstMap(loss ? dpred : dy), first > 0, &mb);
    const double ti = SecondsSince(t0);
    t0 = std::chrono::steady_clock::now();
    stage.BackwardWeight(&mb);
    const double tw = SecondsSince(t0);
    t0 = std::chrono::steady_clock::now();
    stage.ApplyOptimizer(r + 1, 1.0f);
    const double to = SecondsSince(t0);
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
