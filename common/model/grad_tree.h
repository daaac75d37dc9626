// The canonical order in which a step's micro-batch weight gradients are added, whatever the
// number of data-parallel replicas, stages or the schedule (docs/numerics.md, "Accumulation
// order"): the halving tree over micro-batch indices [0, M). With 2^v the largest power of two
// dividing M and L = M / 2^v, the leaves are the 2^v runs [jL, (j+1)L) of L micro-batches, each
// summed in increasing order starting from zero; an inner node [lo, hi) is node(lo, mid) +
// node(mid, hi), elementwise, mid = lo + (hi - lo) / 2. R = 2^j replicas (2^j <= 2^v) run equal
// shares [rM/R, (r+1)M/R) which are nodes; combining their partial gradients pairwise in the tree
// (CombinePartialGradients, lower + upper) gives the whole batch's bits.
#ifndef PIPETRAIN_COMMON_MODEL_GRAD_TREE_H_
#define PIPETRAIN_COMMON_MODEL_GRAD_TREE_H_

#include <cstdint>
#include <map>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "common/math/layer.h"
#include "common/math/tensor.h"

namespace pipetrain::model {

// A range [lo, hi) of micro-batch indices.
struct MicrobatchRange {
  int64_t lo = 0;
  int64_t hi = 0;
  bool operator==(const MicrobatchRange& o) const { return lo == o.lo && hi == o.hi; }
  bool operator<(const MicrobatchRange& o) const { return lo != o.lo ? lo < o.lo : hi < o.hi; }
};

// The shape of the tree of a step of M micro-batches. Immutable, copyable, thread-safe.
class GradTree {
 public:
  // M >= 1 (INVALID_ARGUMENT otherwise).
  static absl::StatusOr<GradTree> Create(int64_t microbatches);
  // The tree of a step whose size is not known: one leaf [0, 2^62), micro-batches added in
  // increasing order (what a Stage does before it is told its step's tree).
  static GradTree Sequential();

  int64_t microbatches() const { return microbatches_; }
  // L: micro-batches of a leaf, added sequentially.
  int64_t leaf_size() const { return leaf_size_; }
  // 2^v: the leaves; also the most replicas the tree supports.
  int64_t leaves() const { return microbatches_ / leaf_size_; }

  // Whether [range.lo, range.hi) is a node of the tree (the root, a leaf or an inner node).
  bool IsNode(MicrobatchRange range) const;
  // Replica counts whose equal shares are nodes: the powers of two up to leaves().
  bool SupportsReplicas(int64_t replicas) const;
  // The share of replica `replica` (0-based) of `replicas`: [replica·M/R, (replica+1)·M/R).
  // INVALID_ARGUMENT naming M and the supported counts if `replicas` is not supported, or if
  // `replica` is not in [0, replicas).
  absl::StatusOr<MicrobatchRange> ReplicaShare(int64_t replicas, int64_t replica) const;

 private:
  GradTree(int64_t microbatches, int64_t leaf_size)
      : microbatches_(microbatches), leaf_size_(leaf_size) {}

  int64_t microbatches_;
  int64_t leaf_size_;
};

// The tree's combine: lower = lower + upper, tensor by tensor and element by element (one float
// addition each, `lower` the first operand) — the partial gradients of two sibling nodes, `lower`
// the node of the smaller micro-batch indices. INVALID_ARGUMENT naming the first tensor whose
// count or shape differs (lower is then unchanged). Pure; thread-compatible.
absl::Status CombinePartialGradients(std::vector<math::Tensor>* lower,
                                     const std::vector<math::Tensor>& upper);

// grads = grads + N (Layer::BackwardWeightNode) for the node over `inputs` (2^u leaves of
// `leaf_size` micro-batches, in order): the layer's own routine where it has one, else the
// leaves computed with BackwardWeightMany into zeroed buffers and added in tree order. With
// `grads_zero` (grads hold +0 everywhere, so grads + N is N) the first leaf is computed in `grads`
// itself. Allocates the tree's buffers (log2 of the leaves + 1 gradients at most).
void AddWeightGradNode(const math::Layer& layer, absl::Span<const math::Tensor> params,
                       absl::Span<const math::WeightGradInputs> inputs, int64_t leaf_size,
                       bool grads_zero, absl::Span<math::Tensor> grads);

// One step of folding a stage's weight gradients into the tree (GradTreeFolder::Fold). Buffer 0 is
// the stage's gradients; others are the stage's spare gradient buffers.
struct FoldOp {
  enum class Kind {
    kAccumulate,  // buffer[dest] += W of micro-batches [range) one after another (a leaf's part).
    kAddNode,     // buffer[dest] = buffer[dest] + N(range) (AddWeightGradNode).
    kCombine,     // buffer[dest] = buffer[dest] + buffer[src]; buffer[src] is free afterwards.
  };
  Kind kind;
  int dest = 0;
  int src = 0;
  MicrobatchRange range;
  bool dest_zero = false;  // buffer[dest] is new for this op: the executor zeroes it first.
};

// The bookkeeping of one stage's share of a step: which nodes are complete, which are still
// pending in which buffer. Fold() turns the micro-batches whose W are available into FoldOps;
// a node is combined as soon as both of its children are complete, so W may arrive in any order.
// With W in increasing order it holds at most log2(leaves of the share) buffers besides buffer 0.
// Thread-compatible.
class GradTreeFolder {
 public:
  // A folder for the share `share` of `tree` (a node of it; a Sequential tree takes [0, 2^62)).
  // INVALID_ARGUMENT if the share is not a node.
  static absl::StatusOr<GradTreeFolder> Create(const GradTree& tree, MicrobatchRange share);
  // The folder of GradTree::Sequential()'s whole share.
  static GradTreeFolder Sequential() {
    return GradTreeFolder(GradTree::Sequential(), {0, GradTree::Sequential().microbatches()});
  }

  const GradTree& tree() const { return tree_; }
  MicrobatchRange share() const { return share_; }

  // The operations that add the W of every micro-batch in `available` (indices in the share,
  // not added before; others are ignored) as far as the tree's order allows, in execution order.
  // Micro-batches the order cannot add yet (a leaf's later ones before its earlier ones) are
  // left out: *consumed lists those added.
  std::vector<FoldOp> Fold(const std::vector<int64_t>& available, std::vector<int64_t>* consumed);
  // Forgets every micro-batch added: a new step of the same tree and share.
  void Restart();
  // Whether every micro-batch of the share has been added: buffer 0 holds the share's node.
  bool complete() const { return complete_; }
  // Buffers Fold's operations have used so far (1 + the most spare buffers used at once).
  int buffers_used() const { return next_buffer_; }
  // Operations that add every pending node to buffer 0 in increasing micro-batch order, for a
  // step read before its share is complete (not the canonical order: only a complete share is).
  // Afterwards the folder adds later micro-batches to buffer 0 in increasing order.
  std::vector<FoldOp> Close();

 private:
  GradTreeFolder(const GradTree& tree, MicrobatchRange share) : tree_(tree), share_(share) {}

  // Folds node `r`; returns the buffer holding it if it is complete now (not yet combined with
  // its sibling), else -1.
  int Visit(MicrobatchRange r, std::vector<FoldOp>* ops);
  int VisitLeaf(MicrobatchRange r, std::vector<FoldOp>* ops);
  // Whether every micro-batch of `r` is available and none was added.
  bool Fresh(MicrobatchRange r) const;
  void Consume(MicrobatchRange r);
  int NewBuffer(MicrobatchRange r);
  void FreeBuffer(int b);

  struct Leaf {
    int64_t next;  // first micro-batch not yet added.
    int buffer;
  };

  GradTree tree_;
  MicrobatchRange share_;
  bool complete_ = false;
  bool closed_ = false;  // after Close(): later micro-batches go to buffer 0 in order.
  std::map<MicrobatchRange, int> done_;  // complete nodes awaiting their sibling -> buffer.
  std::map<int64_t, Leaf> leaves_;       // leaves partly added, by their first micro-batch.
  std::vector<int64_t> available_;       // sorted; during Fold.
  std::vector<int64_t>* consumed_ = nullptr;
  std::vector<int> free_buffers_;
  int next_buffer_ = 1;
};

}  // namespace pipetrain::model

#endif  // PIPETRAIN_COMMON_MODEL_GRAD_TREE_H_
