// The wire form of measured layer costs (plan.proto SampleLayerCosts): what a stage worker sends
// in LayersProfiled and the coordinator passes on in ProfileWorkersResponse, converted to and
// from plan::ModelCosts. Only the seconds travel; the byte figures depend on the model alone and
// come from the planning machine's ModelCosts. Pure functions; thread-safe.
#ifndef PIPETRAIN_COMMON_PLAN_LAYER_COSTS_PROTO_H_
#define PIPETRAIN_COMMON_PLAN_LAYER_COSTS_PROTO_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "common/plan/layer_costs.h"
#include "pipetrain/v1/plan.pb.h"

namespace pipetrain::plan {

// The bounds of a layer profile (ProfileWorkers, ProfileLayers), which the coordinator and the
// workers check alike: at most this many micro-batch sizes of at most kMaxProfileSamples samples
// each, a deadline of at most kMaxProfileDeadlineMs (0 stands for kDefaultProfileDeadlineMs).
inline constexpr int kMaxProfileSampleCounts = 64;
inline constexpr int64_t kMaxProfileSamples = int64_t{1} << 20;
inline constexpr int64_t kMaxProfileDeadlineMs = 3'600'000;
inline constexpr int64_t kDefaultProfileDeadlineMs = 300'000;

// The seconds of `costs` (its samples and each layer's F, I, W and optimizer seconds).
v1::SampleLayerCosts LayerSecondsToProto(const ModelCosts& costs);

// `proto`'s seconds as ModelCosts at `gflops` for a model of `layers` layers (byte figures 0).
// INVALID_ARGUMENT, naming `source` (e.g. "worker 'w1'") and the layer, for samples < 1, a layer
// count other than `layers`, or a figure that is not finite, negative or above an hour; and for
// gflops not in (0, 1e9].
absl::StatusOr<ModelCosts> LayerSecondsFromProto(const v1::SampleLayerCosts& proto, int64_t layers,
                                                 double gflops, absl::string_view source);

}  // namespace pipetrain::plan

#endif  // PIPETRAIN_COMMON_PLAN_LAYER_COSTS_PROTO_H_
