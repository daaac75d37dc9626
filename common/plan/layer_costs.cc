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
      options.threads > 1024 || !(options.min_seconds >= 0 && options.min_seconds <= 60)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "measuring needs repeats in [1, 1000], threads in [1, 1024] and min_seconds in [0, 60], "
        "got ",
        options.repeats, ", ", options.threads, " and ", options.min_seconds));
  }
  return absl::OkStatus();
}

// The lower quartile of the repeats (their CPU seconds): what an op costs when the core and its
// caches are the worker's. A first touch, or caches flushed by another process of a shared host
// (under 3 busy processes per CPU an op's median moved by 2x from one measurement to the next),
// is an outlier, not the rule.
double LowerQuartile(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 4];
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

absl::Status CheckWorkerChunks(const model::Model& model, const std::vector<LayerRange>& chunks) {
  if (chunks.empty()) return absl::InvalidArgumentError("a worker to time holds no chunk");
  int64_t previous_last = 0;
  for (const LayerRange& c : chunks) {
    if (c.first < previous_last || c.first >= c.last || c.last > model.num_layers()) {
      return absl::InvalidArgumentError(
          absl::StrCat("chunk [", c.first, ", ", c.last, ") is not a layer range of a model of ",
                       model.num_layers(), " layers after the worker's previous chunk (ending at ",
                       previous_last, ")"));
    }
    previous_last = c.last;
  }
  return absl::OkStatus();
}

// Most repeats a measurement takes to reach MeasureOptions::min_seconds.
constexpr int kMaxRepeats = 1000;

// One chunk of a worker being timed: its stage and the micro-batch it runs; each op returns its
// CPU seconds / the compute threads.

class ChunkRig {
 public:
  static absl::StatusOr<ChunkRig> Create(const model::Model& model, const LayerRange& range,
                                         int64_t samples, const math::OptimizerConfig& optimizer,
                                         const MeasureOptions& options) {
    PT_ASSIGN_OR_RETURN(model::Stage stage, model::Stage::Create(&model, range.first, range.last,
                                                                 options.seed, optimizer));
    stage.set_weight_grad_defer_bytes(0);
    const int64_t rows = samples * model.tokens_per_sample();
    const math::Layer& in = model.layer(range.first);
    const math::Layer& out = model.layer(range.last - 1);
    ChunkRig rig(std::move(stage), &model, options.threads, range.first > 0,
                 range.last == model.num_layers());
    rig.x_ = TimingInput(rows, in.in_features(), 1.0f, EmbeddingVocab(in));
    rig.dy_ = TimingInput(rows, out.out_features(), 1e-3f, 0);
    // Class 0 for every row (a valid target of both losses).
    if (rig.loss_) rig.targets_ = math::Matrix::Zero(rows, model.target_features());
    rig.dpred_.resize(rows, out.out_features());
    return rig;
  }

  double Forward(model::MicrobatchState* mb) {
    return Timed([&] {
      const math::Matrix& pred = stage_.Forward(math::AsConstMap(x_), mb);
      if (loss_) {
        model_->loss().LossAndGrad(math::AsConstMap(pred), math::AsConstMap(targets_),
                                   1.0 / static_cast<double>(x_.rows()), math::AsMap(dpred_));
      }
    });
  }
  double BackwardInput(model::MicrobatchState* mb) {
    return Timed(
        [&] { stage_.BackwardInput(math::AsConstMap(loss_ ? dpred_ : dy_), needs_dx_, mb); });
  }
  double BackwardWeight(model::MicrobatchState* mb) {
    return Timed([&] { stage_.BackwardWeight(mb); });
  }
  double Update(int step) {
    return Timed([&] { stage_.ApplyOptimizer(step, 1.0f); });
  }

 private:
  ChunkRig(model::Stage stage, const model::Model* model, int threads, bool needs_dx, bool loss)
      : stage_(std::move(stage)),
        model_(model),
        threads_(threads),
        needs_dx_(needs_dx),
        loss_(loss) {}

  template <typename Op>
  double Timed(Op&& op) const {
    const double t0 = ProcessCpuSeconds();
    op();
    return (ProcessCpuSeconds() - t0) / threads_;
  }

  model::Stage stage_;
  const model::Model* model_;
  int threads_;
  bool needs_dx_;
  bool loss_;
  math::Matrix x_, dy_, targets_, dpred_;
};

// One chunk's figures over the repeats.
struct ChunkSamples {
  std::vector<double> f, i, w, opt;
  void Add(const ChunkSeconds& s) {
    f.push_back(s.forward);
    i.push_back(s.backward_input);
    w.push_back(s.backward_weight);
    opt.push_back(s.optimizer);
  }
  ChunkSeconds LowerQuartiles() {
    return {LowerQuartile(std::move(f)), LowerQuartile(std::move(i)), LowerQuartile(std::move(w)),
            LowerQuartile(std::move(opt))};
  }
};

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
    PT_ASSIGN_OR_RETURN(
        std::vector<ChunkSeconds> s,
        MeasureWorkerChunkSeconds(model, {{l, l + 1}}, samples, optimizer, options));
    cost.forward = s[0].forward;
    cost.backward_input = s[0].backward_input;
    cost.backward_weight = s[0].backward_weight;
    cost.optimizer = s[0].optimizer;
    costs.layers.push_back(cost);
  }
  return costs;
}

absl::StatusOr<std::vector<ChunkSeconds>> MeasureWorkerChunkSeconds(
    const model::Model& model, const std::vector<LayerRange>& chunks, int64_t samples,
    const math::OptimizerConfig& optimizer, const MeasureOptions& options, int in_flight) {
  PT_RETURN_IF_ERROR(CheckCostArguments(samples, 1));
  PT_RETURN_IF_ERROR(CheckMeasureOptions(options));
  PT_RETURN_IF_ERROR(CheckWorkerChunks(model, chunks));
  if (in_flight < 1 || in_flight > kMaxTimedInFlight) {
    return absl::InvalidArgumentError(absl::StrCat("micro-batches in flight must be in [1, ",
                                                   kMaxTimedInFlight, "], got ", in_flight));
  }
  model.kernels().ConfigureEigen(options.threads);
  std::vector<ChunkRig> rigs;
  rigs.reserve(chunks.size());
  for (const LayerRange& range : chunks) {
    PT_ASSIGN_OR_RETURN(ChunkRig rig, ChunkRig::Create(model, range, samples, optimizer, options));
    rigs.push_back(std::move(rig));
  }
  std::vector<ChunkSamples> times(chunks.size());
  double timed = 0;  // CPU seconds of the timed repeats.
  const double per_mb = 1.0 / in_flight;
  for (int r = 0; r <= options.repeats || (timed < options.min_seconds && r <= kMaxRepeats); ++r) {
    // [mb][chunk]: K micro-batches' states, all alive from their F to their W.
    std::vector<std::vector<model::MicrobatchState>> mbs(
        in_flight, std::vector<model::MicrobatchState>(rigs.size()));
    std::vector<ChunkSeconds> s(rigs.size());
    for (int mb = 0; mb < in_flight; ++mb) {
      for (size_t k = 0; k < rigs.size(); ++k)
        s[k].forward += rigs[k].Forward(&mbs[mb][k]) * per_mb;
    }
    for (int mb = 0; mb < in_flight; ++mb) {
      for (size_t k = rigs.size(); k-- > 0;) {
        s[k].backward_input += rigs[k].BackwardInput(&mbs[mb][k]) * per_mb;
        s[k].backward_weight += rigs[k].BackwardWeight(&mbs[mb][k]) * per_mb;
      }
      mbs[mb].clear();  // its stashes freed, as W frees them.
    }
    for (size_t k = 0; k < rigs.size(); ++k) s[k].optimizer = rigs[k].Update(r + 1);
    if (r == 0) continue;  // warm-up: first touches, parameter caches.
    for (size_t k = 0; k < rigs.size(); ++k) {
      times[k].Add(s[k]);
      timed +=
          (s[k].forward + s[k].backward_input + s[k].backward_weight) * in_flight + s[k].optimizer;
    }
  }
  std::vector<ChunkSeconds> out;
  for (ChunkSamples& t : times) out.push_back(t.LowerQuartiles());
  return out;
}

absl::StatusOr<ChunkSeconds> MeasureChunkSeconds(const model::Model& model, int64_t first,
                                                 int64_t last, int64_t samples,
                                                 const math::OptimizerConfig& optimizer,
                                                 const MeasureOptions& options) {
  PT_ASSIGN_OR_RETURN(
      std::vector<ChunkSeconds> s,
      MeasureWorkerChunkSeconds(model, {LayerRange{first, last}}, samples, optimizer, options));
  return s[0];
}

}  // namespace pipetrain::plan
