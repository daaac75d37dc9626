// The Layer interface: three pure functions per layer so that zero-bubble schedules can run the
// input gradient (I) and the weight gradient (W) of a backward pass apart.
//
// Conventions for every layer:
//  - x is the layer's input  [rows, in_features()], y its output [rows, out_features()].
//    Rows are samples (or tokens for token models) and pass through unchanged.
//  - A layer object holds only its configuration; parameters live outside in `params`
//    (one Tensor per ParamSpec, in params() order) so that workers and the reference trainer own
//    them. Gradients live in `grads` with the same layout and are ACCUMULATED into (+=).
//  - Forward writes into `stash` whatever BackwardInput/BackwardWeight need beyond x and dy
//    (caller keeps x alive until the backward of that micro-batch finished). BackwardInput may
//    add to the stash what BackwardWeight needs (e.g. internal gradients of a composite block).
//    The caller never interprets a Stash; it only keeps it per (micro-batch, layer).
//  - dx with zero rows means "the caller needs no input gradient" (first layer of the model):
//    BackwardInput then skips computing it but still prepares the stash for BackwardWeight.
//  - Functions are deterministic: the same inputs and the same Eigen thread count give bitwise
//    identical outputs. They do no I/O, take no locks and are safe to call concurrently on
//    distinct outputs. Shapes are the caller's contract (checked once when a model is built);
//    they are asserted only in debug builds.
#ifndef PIPETRAIN_COMMON_MATH_LAYER_H_
#define PIPETRAIN_COMMON_MATH_LAYER_H_

#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "absl/strings/string_view.h"
#include "absl/types/span.h"
#include "common/math/tensor.h"

namespace pipetrain::math {

// Name (e.g. "weight", "attn.qkv.bias") and shape of one parameter tensor of a layer.
// Linear weights are [out_features, in_features] (PyTorch layout): y = x W^T + b.
struct ParamSpec {
  std::string name;
  std::vector<int64_t> shape;
};

// Floating-point operations of one call on a micro-batch (multiply-add = 2 FLOPs).
struct FlopCount {
  double forward = 0;
  double backward_input = 0;
  double backward_weight = 0;
  double total() const { return forward + backward_input + backward_weight; }
};

// The allocator of a Stash's floats: like std::allocator, except that an element constructed
// without a value is left uninitialised (default-initialised), so that resizing a stash costs no
// pass over its memory.
template <typename T>
struct UninitializedAllocator : std::allocator<T> {
  template <typename U>
  struct rebind {
    using other = UninitializedAllocator<U>;
  };
  UninitializedAllocator() = default;
  template <typename U>
  UninitializedAllocator(const UninitializedAllocator<U>&) noexcept {}
  template <typename U>
  void construct(U* p) noexcept(std::is_nothrow_default_constructible_v<U>) {
    ::new (static_cast<void*>(p)) U;
  }
  template <typename U, typename... Args>
  void construct(U* p, Args&&... args) {
    ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
  }
};

// Per-(micro-batch, layer) scratch kept from Forward to the end of backward. Layer-defined layout.
// Elements a resize adds are uninitialised: a layer writes every element of its stash before it
// reads it (the block tests run their passes on stashes filled with NaN beforehand).
struct Stash {
  std::vector<float, UninitializedAllocator<float>> data;
};

// What one micro-batch's BackwardWeight reads: its input, its output gradient and its stash.
struct WeightGradInputs {
  ConstMatrixMap x;
  ConstMatrixMap dy;
  const Stash* stash;
};

// Data a layer derives from its parameters to make Forward and BackwardInput faster across calls
// (a Linear's weight packed for the GEMM kernel). Made by Layer::NewParamCache; owned by the
// caller, one per layer and parameter set, used by one thread at a time. The caller calls
// ParamsChanged() whenever the parameters' values change; the layer rebuilds it on next use.
class ParamCache {
 public:
  virtual ~ParamCache() = default;
  virtual void ParamsChanged() = 0;
  // Rebuilds now, from `params` (the layer's current parameters), what ParamsChanged discarded,
  // for the shapes last used, so that the next call need not; nothing by default. Never
  // required: a cache not refreshed is rebuilt on its next use.
  virtual void Refresh(absl::Span<const Tensor> params) {}
  // Bytes it holds now.
  virtual int64_t bytes() const = 0;
};

// What the earlier positions of one sequence leave for a layer's incremental forward
// (Layer::ForwardIncremental): an attention block's keys and values (its KV cache). Made by
// Layer::NewIncrementalState; owned by the caller, one per layer and sequence; one thread at a
// time.
class IncrementalState {
 public:
  virtual ~IncrementalState() = default;
  // Positions held: the first position of the next ForwardIncremental call.
  virtual int64_t positions() const = 0;
  // Forgets every position (the next call starts at position 0); keeps the memory.
  virtual void Clear() = 0;
  // Bytes it holds now.
  virtual int64_t bytes() const = 0;
};

class Layer {
 public:
  virtual ~Layer() = default;

  // Short kind name used in messages, e.g. "linear", "transformer_block".
  virtual absl::string_view kind() const = 0;
  virtual int64_t in_features() const = 0;
  virtual int64_t out_features() const = 0;
  // Rows of a micro-batch must be a multiple of this (context length for token layers, else 1).
  virtual int64_t row_multiple() const { return 1; }

  // Parameter tensors, in a fixed order (empty for parameter-free layers).
  virtual std::vector<ParamSpec> params() const = 0;

  // Fills `params` (resized here to params()) with initial values that depend only on
  // (seed, layer_index): never on other layers or on which process runs this.
  virtual void Init(uint64_t seed, int64_t layer_index, std::vector<Tensor>* params) const = 0;

  // FLOPs of Forward / BackwardInput (with dx requested) / BackwardWeight for `rows` rows.
  virtual FlopCount Flops(int64_t rows) const = 0;
  // Bytes Forward leaves in the stash for `rows` rows (excluding x, which the caller keeps).
  virtual int64_t StashBytes(int64_t rows) const = 0;

  // y = f(x). `y` is pre-sized [rows, out_features()]. Resizes and fills `stash`.
  virtual void Forward(absl::Span<const Tensor> params, ConstMatrixMap x, MatrixMap y,
                       Stash* stash) const = 0;
  // dx = dL/dx given dy = dL/dy; `dx` pre-sized [rows, in_features()] or zero rows (skip).
  virtual void BackwardInput(absl::Span<const Tensor> params, ConstMatrixMap x, ConstMatrixMap dy,
                             Stash* stash, MatrixMap dx) const = 0;
  // A cache for ForwardCached / BackwardInputCached, or null if this layer keeps none.
  virtual std::unique_ptr<ParamCache> NewParamCache() const { return nullptr; }
  // Forward and BackwardInput with `cache` (from this layer's NewParamCache, or null): bitwise the
  // same results; they may fill the cache.
  virtual void ForwardCached(absl::Span<const Tensor> params, ParamCache* cache, ConstMatrixMap x,
                             MatrixMap y, Stash* stash) const {
    Forward(params, x, y, stash);
  }
  virtual void BackwardInputCached(absl::Span<const Tensor> params, ParamCache* cache,
                                   ConstMatrixMap x, ConstMatrixMap dy, Stash* stash,
                                   MatrixMap dx) const {
    BackwardInput(params, x, dy, stash, dx);
  }

  // Incremental forward, for decoding one sequence a few positions at a time (a KV cache;
  // docs/inference.md). Whether this layer has one: by default the layers whose rows are
  // independent of each other (row_multiple() == 1), for which it is Forward on the new rows.
  // A layer with a context (embedding, attention) overrides all three functions.
  virtual bool SupportsIncremental() const { return row_multiple() == 1; }
  // The per-sequence state ForwardIncremental needs (null: none, as for row-wise layers).
  virtual std::unique_ptr<IncrementalState> NewIncrementalState() const { return nullptr; }
  // x [n, in_features()] are the inputs of positions `position` .. position+n-1 of one sequence
  // (n >= 1) whose positions 0 .. position-1 went through earlier calls with the same `state`
  // (state->positions() == position; `state` from NewIncrementalState, null if that is null);
  // y [n, out_features()] gets the outputs Forward gives those rows of the whole sequence, up to
  // the summation order of products of other shapes (docs/inference.md, "Numerics"). For a layer
  // with a context, position + n <= that context. `scratch` is the layer's to resize and reuse
  // across calls. Requires SupportsIncremental().
  virtual void ForwardIncremental(absl::Span<const Tensor> params, int64_t position,
                                  ConstMatrixMap x, IncrementalState* state, Stash* scratch,
                                  MatrixMap y) const {
    Forward(params, x, y, scratch);
  }

  // grads[i] += dL/dparams[i]. Must run after BackwardInput of the same micro-batch.
  virtual void BackwardWeight(absl::Span<const Tensor> params, ConstMatrixMap x, ConstMatrixMap dy,
                              const Stash& stash, absl::Span<Tensor> grads) const = 0;
  // BackwardWeight of several micro-batches, `inputs` in micro-batch order: bitwise the gradients
  // of calling BackwardWeight on each in turn, which the default does. A layer may override it to
  // make fewer passes over its gradients (Linear: one instead of one per micro-batch).
  virtual void BackwardWeightMany(absl::Span<const Tensor> params,
                                  absl::Span<const WeightGradInputs> inputs,
                                  absl::Span<Tensor> grads) const {
    for (const WeightGradInputs& in : inputs) BackwardWeight(params, in.x, in.dy, *in.stash, grads);
  }
  // grads[i] = grads[i] + N[i] elementwise, N the weight gradient of a node of the canonical
  // accumulation tree (docs/numerics.md, "Accumulation order"): `inputs` are, in micro-batch
  // order, the micro-batches of 2^u leaves (inputs.size() / leaf_size a power of two) of
  // `leaf_size` consecutive micro-batches each; a leaf is BackwardWeightMany of its micro-batches
  // into zeroed gradients, an inner node the elementwise sum lower + upper of its children.
  // Returns true having done so; false, having changed nothing, where the layer has no routine
  // of its own for it (the default): the caller then computes the leaves with BackwardWeightMany
  // into zeroed buffers and adds them in tree order (model::AddWeightGradNode), with the same
  // bits. A Linear computes the tree block by block of its gradient, in cache.
  virtual bool BackwardWeightNode(absl::Span<const Tensor> params,
                                  absl::Span<const WeightGradInputs> inputs, int64_t leaf_size,
                                  absl::Span<Tensor> grads) const {
    return false;
  }
};

}  // namespace pipetrain::math

#endif  // PIPETRAIN_COMMON_MATH_LAYER_H_
