// The planner's cost model of a model on a worker: per layer and micro-batch, the seconds of its
// forward (F), backward-input (I) and backward-weight (W) ops and of its optimizer update, and the
// bytes it stashes, sends and keeps. Two sources:
//
//  - CostsFromFlops: each op's FLOPs (math::Layer::Flops) at a given GFLOP/s. Exact for the ratio
//    between layers of one kind, blind to how well each kind uses the CPU.
//  - MeasureLayerCosts: the ops timed on this machine, through the code a stage worker runs
//    (model::Stage over one layer at a time), the lower quartile of several repeats, in CPU seconds
//    of this process (divided by the compute threads): what an op costs a core, without the
//    time other processes of a shared host held it. Small layers (layer norms, embeddings, short
//    micro-batches) run far below the GEMM rate, which FLOPs cannot see.
//  - MeasureWorkerChunkSeconds: a worker's chunks timed together, as it runs them: what the
//    planner uses (`pipetrain plan`), since layers or chunks timed alone miss how they share the
//    caches.
//
// Either way the seconds hold at `gflops` (the speed probe's figure of the machine they were
// measured on, or the rate given); a worker of speed s takes seconds * gflops / s.
#ifndef PIPETRAIN_COMMON_PLAN_LAYER_COSTS_H_
#define PIPETRAIN_COMMON_PLAN_LAYER_COSTS_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "common/math/optimizer.h"
#include "common/model/model.h"

namespace pipetrain::plan {

// One layer's figures for one micro-batch.
struct LayerCost {
  double forward = 0;           // seconds of F.
  double backward_input = 0;    // seconds of I (dX; still prepares W when dX is not needed).
  double backward_weight = 0;   // seconds of W (dW).
  double optimizer = 0;         // seconds of its optimizer update (once per step).
  double activation_bytes = 0;  // kept from F to the end of W: its input and its stash.
  double output_bytes = 0;      // its output; its gradient, sent back, is as large.
  double state_bytes = 0;       // weights, gradients and optimizer state.
  double gradient_bytes = 0;  // its weight gradient (its parameters' bytes): what replicas reduce.
};

// A model's costs for micro-batches of `samples` samples.
struct ModelCosts {
  int64_t samples = 0;
  double gflops = 0;              // the speed the seconds hold at, > 0.
  std::vector<LayerCost> layers;  // [layer]
};

// Bytes per parameter byte of weights, gradients and `optimizer`'s state (2 + its state tensors:
// SGD 2 or 3, AdamW 4).
double StateBytesPerParamByte(const math::OptimizerConfig& optimizer);

// Costs from FLOPs at `gflops` (> 0, at most 1e9), optimizer updates free. INVALID_ARGUMENT for
// samples < 1 or gflops out of range.
absl::StatusOr<ModelCosts> CostsFromFlops(const model::Model& model, int64_t samples,
                                          const math::OptimizerConfig& optimizer, double gflops);

struct MeasureOptions {
  int repeats = 5;  // timed repeats per layer (after one untimed warm-up), in [1, 1000].
  // More repeats (up to 1000) while the timed ones add up to less than this many CPU seconds, so
  // that short ops get as many samples as their noise needs. In [0, 60].
  double min_seconds = 0.02;
  int threads = 1;    // compute threads (Eigen's), as the job's --threads, in [1, 1024].
  uint64_t seed = 1;  // parameters' seed (the timing does not depend on it).
};

// Costs timed on this machine: for each layer, a model::Stage over that layer alone runs F, I
// (dX skipped for layer 0, as the first stage does), W (not deferred) and an optimizer update on
// a micro-batch of `samples` samples (token ids and values from a fixed pseudo-random sequence);
// each figure is the lower quartile of the repeats (CPU seconds / threads). `gflops` is this
// machine's speed probe. Allocates one layer's parameters and one micro-batch at a time. Errors:
// INVALID_ARGUMENT for arguments out of range, those of model::Stage::Create (RESOURCE_EXHAUSTED
// when a layer does not fit). Sets the model's Eigen thread count; not thread-safe against other
// compute at the model's level.
absl::StatusOr<ModelCosts> MeasureLayerCosts(const model::Model& model, int64_t samples,
                                             const math::OptimizerConfig& optimizer, double gflops,
                                             const MeasureOptions& options);

// One chunk's seconds for one micro-batch (the sums of its layers' ops, timed together).
struct ChunkSeconds {
  double forward = 0;
  double backward_input = 0;
  double backward_weight = 0;
  double optimizer = 0;  // once per step.
};

// The layers [first, last) of one chunk.
struct LayerRange {
  int64_t first = 0;
  int64_t last = 0;
  bool operator==(const LayerRange& o) const { return first == o.first && last == o.last; }
  bool operator<(const LayerRange& o) const {
    return first != o.first ? first < o.first : last < o.last;
  }
};

// Times the chunks one worker holds (ascending, disjoint layer ranges) on this machine as the
// worker runs them: per repeat, every chunk's F in order (the chunk holding the last layer adds
// the loss), then every chunk's I (no dX for the chunk starting at layer 0) and W (the stage's own
// W deferral) in reverse order, each of one micro-batch of `samples` samples, then each chunk's
// optimizer update. So between two uses of a chunk's weights the worker has touched all its other
// chunks' weights and activations, as an interleaved schedule does: chunks timed alone keep
// theirs in the core's cache and come out faster than they run (gpt_char on 4 chunks of one
// worker: 10 % faster than one chunk of the same layers, where the run is 6 % slower). Lower
// quartiles of the repeats after a warm-up, as MeasureLayerCosts; [k] is chunks[k]'s. With
// `in_flight` K > 1 micro-batches, each repeat runs every chunk's F for K micro-batches before
// their I and W (each figure the mean over the K): the worker's caches then hold K micro-batches'
// stashes at once, as a schedule that keeps K in flight makes them (gpt_char on one worker, GPipe
// with 8 in flight: 0.63 of the prediction timed with one). Errors as MeasureLayerCosts, and
// INVALID_ARGUMENT for no chunk, a range that is empty, outside the model or not after the
// previous one, or `in_flight` outside [1, kMaxTimedInFlight].
inline constexpr int kMaxTimedInFlight = 16;
absl::StatusOr<std::vector<ChunkSeconds>> MeasureWorkerChunkSeconds(
    const model::Model& model, const std::vector<LayerRange>& chunks, int64_t samples,
    const math::OptimizerConfig& optimizer, const MeasureOptions& options, int in_flight = 1);

// One chunk alone: MeasureWorkerChunkSeconds(model, {{first, last}}, ...)[0]. Layers timed
// together share the caches as they do on a worker, which layers timed alone do not (a model
// whose chunks' weights outgrow a core's cache runs each layer slower than alone).
absl::StatusOr<ChunkSeconds> MeasureChunkSeconds(const model::Model& model, int64_t first,
                                                 int64_t last, int64_t samples,
                                                 const math::OptimizerConfig& optimizer,
                                                 const MeasureOptions& options);

}  // namespace pipetrain::plan

#endif  // PIPETRAIN_COMMON_PLAN_LAYER_COSTS_H_
