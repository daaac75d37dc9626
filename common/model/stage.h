// A Stage owns the parameters, gradients and optimizer state of a contiguous range of a model's
// layers and runs Forward (F), BackwardInput (I) and BackwardWeight (W) of that range for one
// micro-batch. The single-process reference trainer runs one Stage over all layers; a stage
// worker runs one per model chunk it holds. Both therefore execute the same arithmetic in the
// same order, which is what makes pipeline results bitwise equal to the reference.
#ifndef PIPETRAIN_COMMON_MODEL_STAGE_H_
#define PIPETRAIN_COMMON_MODEL_STAGE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/math/layer.h"
#include "common/math/optimizer.h"
#include "common/math/tensor.h"
#include "common/model/model.h"

namespace pipetrain::model {

// Everything one micro-batch leaves in a Stage between F and the end of W. Owned by the caller
// (one per in-flight micro-batch); reusable after BackwardWeight.
// The output (inputs[n]) and dL/dx (grads[0]) are not read by any later phase: a caller may move
// them out (e.g. to hand them to the network without a copy) once F, respectively I, returned.
struct MicrobatchState {
  std::vector<math::Matrix> inputs;  // inputs[k]: input of layer first+k; inputs[n] = output.
  std::vector<math::Stash> stashes;  // per layer.
  std::vector<math::Matrix> grads;   // grads[k]: dL/d(input of layer first+k); grads[n] = dy.
  bool forward_done = false;
  bool input_grad_done = false;
};

// Thread-compatible: one thread at a time (Forward and BackwardInput are const but fill the
// layers' parameter caches, math::ParamCache).
class Stage {
 public:
  // A stage over layers [first, last) of `model` (which must outlive it), with parameters
  // initialised from `seed` exactly as in any other process. INVALID_ARGUMENT on a bad range;
  // RESOURCE_EXHAUSTED, before allocating anything, if the range's weights, gradients and
  // `optimizer`'s state would take more than model->limits().max_parameter_bytes, or if the
  // allocation fails; FAILED_PRECONDITION if this CPU cannot run model->isa().
  static absl::StatusOr<Stage> Create(const Model* model, int64_t first, int64_t last,
                                      uint64_t seed, const math::OptimizerConfig& optimizer);

  Stage(Stage&&) = default;
  Stage& operator=(Stage&&) = default;

  int64_t first_layer() const { return first_; }
  int64_t last_layer() const { return last_; }  // exclusive

  // F: runs the range on `x` ([rows, in_features of layer first]) and returns the output,
  // which stays in `mb` until BackwardWeight.
  const math::Matrix& Forward(math::ConstMatrixMap x, MicrobatchState* mb) const;
  // The same, keeping `x` itself as the stashed input instead of a copy of it.
  const math::Matrix& Forward(math::Matrix&& x, MicrobatchState* mb) const;

  // I: given dL/d(output), computes each layer's input gradient and returns dL/dx (empty when
  // `need_input_grad` is false, as for the first stage). Requires Forward on `mb`.
  const math::Matrix& BackwardInput(math::ConstMatrixMap dy, bool need_input_grad,
                                    MicrobatchState* mb) const;
  // The same, keeping `dy` itself instead of a copy of it.
  const math::Matrix& BackwardInput(math::Matrix&& dy, bool need_input_grad,
                                    MicrobatchState* mb) const;

  // W: adds the weight gradients of `mb` to this stage's gradients and frees what `mb` held.
  // Requires BackwardInput on `mb`. Callers must call it in increasing micro-batch order.
  // The stage may defer the arithmetic: it then keeps what the layers' W reads (their inputs,
  // output gradients and stashes, moved out of `mb`) and adds the deferred micro-batches together,
  // in order, once they hold more than weight_grad_defer_bytes(), at the call with
  // `grad_norm_sq`, or before anything reads the gradients. The gradients are bitwise the same
  // as without deferring (math::Layer::BackwardWeightMany); only the time and memory differ.
  // With `grad_norm_sq` (for the step's last micro-batch) it also sets *grad_norm_sq to what
  // GradNormSqPerLayer() returns afterwards, bit for bit, each layer's sum taken as soon as its
  // gradient is complete (while it is in cache, instead of another pass over every gradient).
  void BackwardWeight(MicrobatchState* mb, std::vector<double>* grad_norm_sq = nullptr);

  // The most bytes of deferred micro-batches BackwardWeight keeps before it adds them; by default
  // what the stage's weights, gradients and optimizer state take (so deferring at most doubles
  // the stage's parameter memory). 0: never defer.
  int64_t weight_grad_defer_bytes() const { return weight_grad_defer_bytes_; }
  // True when the optimizer clips the global gradient norm (clip_norm > 0), so that a step needs
  // every layer's gradient norm before its update; without clipping nobody reads them.
  bool clips_gradients() const { return optimizer_.clip_norm > 0; }
  void set_weight_grad_defer_bytes(int64_t bytes);
  // Bytes deferred micro-batches hold now.
  int64_t DeferredWeightGradBytes() const { return deferred_bytes_; }
  // Adds every deferred micro-batch's weight gradients now, in order, and drops them. With
  // `grad_norm_sq` (after the step's last BackwardWeight) it sets *grad_norm_sq as BackwardWeight
  // with `grad_norm_sq` does.
  void AddDeferredWeightGrads(std::vector<double>* grad_norm_sq = nullptr);

  // Sets all gradients to zero (start of a step), dropping deferred micro-batches. Free when they
  // are zero already: fresh, or since the last ApplyOptimizer or ZeroGrads with no BackwardWeight
  // in between.
  void ZeroGrads();
  // Sum of squares of each layer's gradients (params in order, elements in order, in double).
  std::vector<double> GradNormSqPerLayer();
  // Applies optimizer update number `step` (1-based) with gradients scaled by `clip_scale`, and
  // leaves the gradients zero (each tensor cleared right after its update, while in cache).
  void ApplyOptimizer(int64_t step, float clip_scale);

  // Bytes the layers' parameter caches hold (math::ParamCache: the Linear weights packed for the
  // forward and input-gradient products, about twice their size once used).
  int64_t ParamCacheBytes() const;

  // Tensors keyed by global names: "layers.<l>.<param>" and "optim.<l>.<param>.<state>".
  std::map<std::string, math::Tensor> ExportState() const;
  // Loads every tensor this stage owns from `tensors` (extra entries for other layers are
  // ignored). INVALID_ARGUMENT / NOT_FOUND naming the tensor on a missing or mis-shaped entry.
  absl::Status ImportState(const std::map<std::string, math::Tensor>& tensors);

  // Parameters of global layer `l` (first <= l < last).
  const std::vector<math::Tensor>& params(int64_t l) const { return params_[l - first_]; }
  // Parameters of every layer, [l - first] for global layer l (as model::ChunkDecoder takes them).
  absl::Span<const std::vector<math::Tensor>> layer_params() const { return params_; }
  const std::vector<math::Tensor>& grads(int64_t l) {
    AddDeferredWeightGrads(nullptr);
    return grads_[l - first_];
  }

 private:
  Stage() = default;

  // Allocates and initialises params_, grads_ and state_ of layers [first_, last_). Throws
  // std::bad_alloc when out of memory (Create catches it).
  void AllocateParameters(uint64_t seed);

  // What W of one deferred micro-batch reads, per local layer (empty for layers without
  // parameters).
  struct DeferredWeightGrad {
    std::vector<math::Matrix> inputs;
    std::vector<math::Matrix> output_grads;
    std::vector<math::Stash> stashes;
  };

  // Adds local layer k's deferred weight gradients.
  void AddDeferredWeightGradsOfLayer(int64_t k);
  // Drops every deferred micro-batch.
  void DropDeferredWeightGrads();
  // Bytes entry `d` holds for local layer k.
  static int64_t DeferredBytes(const DeferredWeightGrad& d, int64_t k);
  // Sum of squares of the gradients of local layer k (params in order, elements in order).
  double LayerGradNormSq(int64_t k) const;
  // F over mb->inputs[0] (already set, inputs sized n + 1).
  const math::Matrix& ForwardFromInput(MicrobatchState* mb) const;
  // I from mb->grads[n] (already set, grads sized n + 1).
  const math::Matrix& BackwardInputFromOutputGrad(bool need_input_grad, MicrobatchState* mb) const;

  const Model* model_ = nullptr;
  int64_t first_ = 0;
  int64_t last_ = 0;
  math::OptimizerConfig optimizer_;
  std::vector<std::string> state_names_;
  std::vector<std::vector<math::Tensor>> params_;  // [layer][param]
  std::vector<std::vector<math::Tensor>> grads_;   // [layer][param]
  // [layer]: what the layer derives from params_[layer] (null if nothing); told of every change.
  mutable std::vector<std::unique_ptr<math::ParamCache>> caches_;
  bool grads_zero_ = true;                    // every gradient is known to be zero.
  std::vector<DeferredWeightGrad> deferred_;  // in micro-batch order.
  int64_t deferred_bytes_ = 0;
  int64_t weight_grad_defer_bytes_ = 0;
  std::vector<std::vector<std::vector<std::vector<float>>>> state_;  // [layer][param][state]
};

}  // namespace pipetrain::model

#endif  // PIPETRAIN_COMMON_MODEL_STAGE_H_
