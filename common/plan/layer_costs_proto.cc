#include "common/plan/layer_costs_proto.h"

#include <cmath>

#include "absl/strings/str_cat.h"

namespace pipetrain::plan {
namespace {

// The longest one op of one layer may take, in seconds: anything above is a corrupt figure.
constexpr double kMaxOpSeconds = 3600;

bool Plausible(double seconds) {
  return std::isfinite(seconds) && seconds >= 0 && seconds <= kMaxOpSeconds;
}

}  // namespace

v1::SampleLayerCosts LayerSecondsToProto(const ModelCosts& costs) {
  v1::SampleLayerCosts out;
  out.set_samples(costs.samples);
  for (const LayerCost& l : costs.layers) {
    v1::LayerSeconds* s = out.add_layers();
    s->set_forward(l.forward);
    s->set_backward_input(l.backward_input);
    s->set_backward_weight(l.backward_weight);
    s->set_optimizer(l.optimizer);
  }
  return out;
}

absl::StatusOr<ModelCosts> LayerSecondsFromProto(const v1::SampleLayerCosts& proto, int64_t layers,
                                                 double gflops, absl::string_view source) {
  if (!(gflops > 0 && gflops <= 1e9)) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": layer costs at ", gflops, " GFLOP/s (must be in (0, 1e9])"));
  }
  if (proto.samples() < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ": layer costs for ", proto.samples(), " samples (must be >= 1)"));
  }
  if (proto.layers_size() != layers) {
    return absl::InvalidArgumentError(absl::StrCat(source, ": layer costs for ", proto.samples(),
                                                   " samples have ", proto.layers_size(),
                                                   " layers; the model has ", layers));
  }
  ModelCosts costs;
  costs.samples = proto.samples();
  costs.gflops = gflops;
  costs.layers.reserve(proto.layers_size());
  for (int l = 0; l < proto.layers_size(); ++l) {
    const v1::LayerSeconds& s = proto.layers(l);
    for (double x : {s.forward(), s.backward_input(), s.backward_weight(), s.optimizer()}) {
      if (!Plausible(x)) {
        return absl::InvalidArgumentError(
            absl::StrCat(source, ": layer ", l, " at ", proto.samples(), " samples has ", x,
                         " seconds for an op (must be in [0, ", kMaxOpSeconds, "])"));
      }
    }
    LayerCost c;
    c.forward = s.forward();
    c.backward_input = s.backward_input();
    c.backward_weight = s.backward_weight();
    c.optimizer = s.optimizer();
    costs.layers.push_back(c);
  }
  return costs;
}

}  // namespace pipetrain::plan
