// The planner's cost model of a model on a worker: per layer and micro-batch, the seconds of its
// forward (F), backward-input (I) and backward-weight (W) ops and of its optimizer update, and the
// bytes it stashes, sends and keeps. Two sources:
//
//  - CostsFromFlops: each op's FLOPs (math::Layer::Flops) at a given GFLOP/s. Exact for the ratio
//    between layers of one kind, blind to how well each kind uses the CPU.
//  - MeasureLayerCosts: the ops timed on this machine, through the code a stage worker runs
//    (model::Stage over one layer at a time), the median of several repeats, in CPU seconds
//    of this process (divided by the compute threads): what an op costs a core, without the
//    time other processes of a shared host held it. Small layers (layer norms, embeddings, short
//    micro-batches) run far below the GEMM rate, which FLOPs cannot see.
//  - MeasureChunkSeconds: a chunk's layers timed together, as a worker runs them: what the
//    planner uses (`pipetrain plan`), since layers timed alone miss how they share the caches.
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
  int repeats = 5;    // timed repeats per layer (after one untimed warm-up), in [1, 1000].
  int threads = 1;    // compute threads (Eigen's), as the job's --threads, in [1, 1024].
  uint64_t seed = 1;  // parameters' seed (the timing does not depend on it).
};

// Costs timed on this machine: for each layer, a model::Stage over that layer alone runs F, I
// (dX skipped for layer 0, as the first stage does), W (not deferred) and an optimizer update on
// a micro-batch of `samples` samples (token ids and values from a fixed pseudo-random sequence);
// each figure is the median of the repeats (CPU seconds / threads). `gflops` is this machine's
// speed probe. Allocates one layer's parameters and one micro-batch at a time. Errors:
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

// Times a model::Stage over layers [first, last) on this machine as a stage worker runs it: per
// repeat, F, I (no dX for first == 0) and W (the stage's own W deferral) of one micro-batch of
// `samples` samples, and for the chunk holding the last layer the loss between F and I; the
// optimizer update once per repeat. Medians of options.repeats after a warm-up, as
// MeasureLayerCosts. Layers timed together share the caches as they do on a worker, which layers
// timed alone do not (a model whose chunks' weights outgrow a core's cache runs each layer slower
// than alone). Errors as MeasureLayerCosts, and INVALID_ARGUMENT for a bad range.
absl::StatusOr<ChunkSeconds> MeasureChunkSeconds(const model::Model& model, int64_t first,
                                                 int64_t last, int64_t samples,
                                                 const math::OptimizerConfig& optimizer,
                                                 const MeasureOptions& options);

}  // namespace pipetrain::plan

#endif  // PIPETRAIN_COMMON_PLAN_LAYER_COSTS_H_
