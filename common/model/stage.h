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
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/math/layer.h"
#include "common/math/optimizer.h"
#include "common/math/tensor.h"
#include "common/model/grad_tree.h"
#include "common/model/model.h"
#include "common/model/tied_embedding.h"

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

  // The step's gradient tree (grad_tree.h) and this stage's share of it, a node of the tree
  // ([0, M) unless the stage is one data-parallel replica): at the end of the share's W the
  // gradients are that node's, bitwise, however W were grouped, deferred or ordered. Takes
  // effect at the next step start (now if no W of this step was added or deferred yet).
  // INVALID_ARGUMENT if the share is not a node of `tree`. Until it is called a stage adds its
  // micro-batches in increasing order (GradTree::Sequential()).
  absl::Status SetGradTree(const GradTree& tree, MicrobatchRange share);
  // SetGradTree(tree, the whole step).
  absl::Status SetGradTree(const GradTree& tree) {
    return SetGradTree(tree, MicrobatchRange{0, tree.microbatches()});
  }
  const GradTree& grad_tree() const { return folder_.tree(); }
  MicrobatchRange grad_share() const { return folder_.share(); }

  // W of micro-batch `microbatch` (an index in the share): adds the weight gradients of `mb` to
  // this stage's gradients in the tree's order and frees what `mb` held. Requires BackwardInput
  // on `mb`. Micro-batches may come in any order; a node is added when both of its children are
  // complete. The stage may defer the arithmetic: it then keeps what the layers' W reads (their
  // inputs, output gradients and stashes, moved out of `mb`) and adds the deferred micro-batches
  // together once they hold more than weight_grad_defer_bytes(), at the call with
  // `grad_norm_sq`, or before anything reads the gradients. The gradients are bitwise the same as
  // without deferring; only the time and memory differ.
  // With `grad_norm_sq` (for the share's last micro-batch) it also sets *grad_norm_sq to what
  // GradNormSqPerLayer() returns afterwards, bit for bit, each layer's sum taken as soon as its
  // gradient is complete (while it is in cache, instead of another pass over every gradient).
  // INVALID_ARGUMENT (nothing changed) if `microbatch` is not in the share; FAILED_PRECONDITION
  // if its W was already added this step.
  absl::Status BackwardWeightAt(int64_t microbatch, MicrobatchState* mb,
                                std::vector<double>* grad_norm_sq = nullptr);
  // BackwardWeightAt of the next micro-batch of the share in increasing order (the first W of a
  // step is the share's first micro-batch): for callers that run W in order. Requires fewer W
  // this step than the share has micro-batches (asserted in debug builds; else nothing is added).
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
  // Adds the deferred micro-batches' weight gradients now, as far as the tree's order allows (a
  // leaf's micro-batches only after its earlier ones), and drops them. With `grad_norm_sq` (after
  // the share's last W) it sets *grad_norm_sq as BackwardWeight with `grad_norm_sq` does.
  void AddDeferredWeightGrads(std::vector<double>* grad_norm_sq = nullptr);

  // Sets all gradients to zero and starts a step (the first W is the share's first micro-batch),
  // dropping deferred micro-batches and pending tree nodes. Free when the gradients are zero
  // already: fresh, or since the last ApplyOptimizer or ZeroGrads with no W in between.
  void ZeroGrads();
  // Sum of squares of each layer's gradients (params in order, elements in order, in double).
  // Like everything that reads the gradients (grads, ApplyOptimizer, ImportState), it first adds
  // what is deferred; if the share is not complete yet, it also adds the pending nodes to the
  // gradients in increasing micro-batch order (not the canonical order, which only a complete
  // share has) and the step's later W are added in increasing order.
  std::vector<double> GradNormSqPerLayer();
  // Applies optimizer update number `step` (1-based) with gradients scaled by `clip_scale`, and
  // leaves the gradients zero (each tensor cleared right after its update, while in cache); the
  // next W starts a step.
  void ApplyOptimizer(int64_t step, float clip_scale);

  // The tied embedding (Model::tie(), model/tied_embedding.h): whether this stage holds the copy
  // of the tied table at `end` (false for every end of an untied model).
  bool holds_tied(TieEnd end) const;
  // This stage's part of the tied table's gradient: the gradient of its copy at `end` (the
  // embedding's token-table gradient or the head's weight gradient), accumulated over the step's
  // micro-batches so far, deferred ones included. FAILED_PRECONDITION unless holds_tied(end).
  absl::StatusOr<math::Tensor> TiedGradPart(TieEnd end);
  // Sets the gradient of the copy at `end` to the tied gradient `sum` (SumTiedGradients of both
  // parts), after the step's last BackwardWeight and before ApplyOptimizer, and returns the new
  // squared gradient norm of that copy's layer (GradNormSqPerLayer's entry for it).
  // FAILED_PRECONDITION unless holds_tied(end); INVALID_ARGUMENT if `sum` is not of the table's
  // shape.
  absl::StatusOr<double> SetTiedGrad(TieEnd end, const math::Tensor& sum);
  // For a stage that holds both copies (the reference trainer's, or S=1): sets both gradients to
  // the tied gradient of its two parts. Does nothing otherwise. Call after the step's last
  // BackwardWeight, before GradNormSqPerLayer and ApplyOptimizer.
  void CombineTiedGrads();

  // The step's gradients as one flat vector -- every layer's parameters in order, each tensor's
  // elements in order (a tied head's copy of the table included) -- to be reduced over the
  // replicas or summed with the other copy of the stage under bidirectional DualPipe (both by
  // server/worker/replica_reducer.h), and put back.
  // The floats of that vector.
  int64_t NumGradFloats() const;
  // Copies the gradients, as grads() reads them (deferred W added first), into *flat, resized to
  // NumGradFloats().
  void CopyGradsTo(std::vector<float>* flat);
  // Replaces the gradients by `flat` (CopyGradsTo's layout), after the step's last W and before
  // anything reads them. INVALID_ARGUMENT (nothing changed) if `flat` does not hold
  // NumGradFloats() floats.
  absl::Status SetGradsFrom(absl::Span<const float> flat);

  // Bytes the layers' parameter caches hold (math::ParamCache: the Linear weights packed for the
  // forward and input-gradient products, about twice their size once used).
  int64_t ParamCacheBytes() const;

  // Tensors keyed by global names: "layers.<l>.<param>" and "optim.<l>.<param>.<state>". A tied
  // head's copy of the table is not among them (it is the embedding's "token.weight").
  std::map<std::string, math::Tensor> ExportState() const;
  // Loads every tensor this stage owns from `tensors` (extra entries for other layers are
  // ignored); a tied head's copy of the table from the embedding's "token.weight" and its
  // optimizer state. INVALID_ARGUMENT / NOT_FOUND naming the tensor on a missing or mis-shaped
  // entry.
  absl::Status ImportState(const std::map<std::string, math::Tensor>& tensors);

  // Parameters of global layer `l` (first <= l < last).
  const std::vector<math::Tensor>& params(int64_t l) const { return params_[l - first_]; }
  // Parameters of every layer, [l - first] for global layer l (as model::ChunkDecoder takes them).
  absl::Span<const std::vector<math::Tensor>> layer_params() const { return params_; }
  const std::vector<math::Tensor>& grads(int64_t l) {
    FinishGradsForRead(nullptr);
    return grads_[l - first_];
  }
  // Spare gradient buffers the tree holds (kept between steps): nodes complete before their
  // sibling, when W are added in more than one pass per step (at most log2 of the share's leaves
  // with W in increasing order; none when every W of the share is deferred to its last).
  int64_t GradTreeBufferBytes() const;

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

  // Runs `ops` (GradTreeFolder::Fold) on local layer k's gradients.
  void RunFoldOps(int64_t k, const std::vector<FoldOp>& ops);
  // The gradient buffer `b` of local layer k (0: grads_[k]; else a spare, allocated zero).
  absl::Span<math::Tensor> GradBuffer(int64_t k, int b);
  // AddDeferredWeightGrads, then, if the share is incomplete, the folder's Close().
  void FinishGradsForRead(std::vector<double>* grad_norm_sq);
  // Runs `ops` on every layer (last first), taking each layer's norm after its ops when
  // grad_norm_sq is set, and drops the micro-batches in `consumed`.
  void RunFold(const std::vector<FoldOp>& ops, const std::vector<int64_t>& consumed,
               std::vector<double>* grad_norm_sq);
  // Starts a step: a fresh folder for the tree and share, no W added.
  void RestartGradTree();
  // Drops every deferred micro-batch.
  void DropDeferredWeightGrads();
  // Bytes entry `d` holds for local layer k.
  static int64_t DeferredBytes(const DeferredWeightGrad& d, int64_t k);
  // Sum of squares of the gradients of local layer k (params in order, elements in order; a tied
  // head's copy of the table left out: the embedding's layer counts the tied gradient once).
  double LayerGradNormSq(int64_t k) const;
  // Local layer index of the copy at `end`, or -1 if this stage does not hold it.
  int64_t TiedLocalLayer(TieEnd end) const;
  // The (global layer, parameter name) under which local layer k's parameter p and its optimizer
  // state are stored in a checkpoint: the embedding's table for a tied head's copy.
  std::pair<int64_t, std::string> CheckpointParam(int64_t k, size_t p) const;
  // Whether local layer k's parameter p is a tied head's copy of the table.
  bool IsTiedHeadCopy(int64_t k, size_t p) const;
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
  bool grads_zero_ = true;  // every gradient is known to be zero.
  // The step's tree and this stage's share; pending nodes live in spare_[buffer - 1][layer].
  GradTreeFolder folder_ = GradTreeFolder::Sequential();
  std::optional<GradTreeFolder> next_folder_;  // SetGradTree's, for the next step.
  int64_t weight_grads_this_step_ = 0;         // W calls since the step started.
  std::set<int64_t> added_;                    // micro-batches whose W came this step.
  std::vector<std::vector<std::vector<math::Tensor>>> spare_;  // [buffer - 1][layer][param]
  std::map<int64_t, DeferredWeightGrad> deferred_;             // by micro-batch.
  int64_t deferred_bytes_ = 0;
  int64_t weight_grad_defer_bytes_ = 0;
  std::vector<std::vector<std::vector<std::vector<float>>>> state_;  // [layer][param][state]
};

}  // namespace pipetrain::model

#endif  // PIPETRAIN_COMMON_MODEL_STAGE_H_
