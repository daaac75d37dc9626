#include "common/model/grad_tree.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/math/tree_sum.h"

namespace pipetrain::model {
namespace {

// The micro-batches of a Sequential tree: one leaf that no step reaches the end of.
constexpr int64_t kSequentialMicrobatches = int64_t{1} << 62;

// Zeroed tensors of the shapes of `like`.
std::vector<math::Tensor> ZerosLike(absl::Span<const math::Tensor> like) {
  std::vector<math::Tensor> out(like.size());
  for (size_t i = 0; i < like.size(); ++i) {
    out[i].shape = like[i].shape;
    out[i].data.assign(like[i].data.size(), 0.0f);
  }
  return out;
}

void AddTensors(absl::Span<const math::Tensor> upper, absl::Span<math::Tensor> lower) {
  for (size_t i = 0; i < lower.size(); ++i) {
    math::AddInTreeOrder(upper[i].data, absl::MakeSpan(lower[i].data));
  }
}

void ZeroTensors(absl::Span<math::Tensor> tensors) {
  for (math::Tensor& t : tensors) std::fill(t.data.begin(), t.data.end(), 0.0f);
}

}  // namespace

absl::StatusOr<GradTree> GradTree::Create(int64_t microbatches) {
  if (microbatches < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("a step's gradient tree needs at least 1 micro-batch, got ", microbatches));
  }
  int64_t leaf = microbatches;
  while (leaf % 2 == 0) leaf /= 2;
  return GradTree(microbatches, leaf);
}

GradTree GradTree::Sequential() {
  return GradTree(kSequentialMicrobatches, kSequentialMicrobatches);
}

bool GradTree::IsNode(MicrobatchRange range) const {
  const int64_t size = range.hi - range.lo;
  if (range.lo < 0 || range.hi > microbatches_ || size < leaf_size_ || size % leaf_size_ != 0) {
    return false;
  }
  const int64_t leaves = size / leaf_size_;
  // The nodes of a perfect binary tree over the leaves: 2^u leaves starting at a multiple of 2^u.
  return math::Log2OfPowerOfTwo(leaves) >= 0 && (range.lo / leaf_size_) % leaves == 0 &&
         range.lo % leaf_size_ == 0;
}

bool GradTree::SupportsReplicas(int64_t replicas) const {
  return math::Log2OfPowerOfTwo(replicas) >= 0 && replicas <= leaves();
}

absl::StatusOr<MicrobatchRange> GradTree::ReplicaShare(int64_t replicas, int64_t replica) const {
  if (!SupportsReplicas(replicas)) {
    return absl::InvalidArgumentError(absl::StrCat(
        replicas, " replicas cannot share a step of ", microbatches_,
        " micro-batches in the canonical gradient order: the replica count must be a power of two "
        "dividing ",
        leaves(), " (the largest power of two dividing the micro-batch count)"));
  }
  if (replica < 0 || replica >= replicas) {
    return absl::InvalidArgumentError(
        absl::StrCat("replica ", replica, " is not in [0, ", replicas, ")"));
  }
  const int64_t share = microbatches_ / replicas;
  return MicrobatchRange{replica * share, (replica + 1) * share};
}

absl::Status CombinePartialGradients(std::vector<math::Tensor>* lower,
                                     const std::vector<math::Tensor>& upper) {
  if (lower->size() != upper.size()) {
    return absl::InvalidArgumentError(absl::StrCat("combining partial gradients of ", lower->size(),
                                                   " and ", upper.size(), " tensors"));
  }
  for (size_t i = 0; i < upper.size(); ++i) {
    const math::Tensor& a = (*lower)[i];
    const math::Tensor& b = upper[i];
    if (a.shape != b.shape || a.data.size() != b.data.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "combining partial gradients: tensor ", i, " has shape [", absl::StrJoin(a.shape, ","),
          "] (", a.data.size(), " floats) in the lower and [", absl::StrJoin(b.shape, ","), "] (",
          b.data.size(), " floats) in the upper partial"));
    }
  }
  AddTensors(upper, absl::MakeSpan(*lower));
  return absl::OkStatus();
}

void AddWeightGradNode(const math::Layer& layer, absl::Span<const math::Tensor> params,
                       absl::Span<const math::WeightGradInputs> inputs, int64_t leaf_size,
                       bool grads_zero, absl::Span<math::Tensor> grads) {
  const int64_t leaves = static_cast<int64_t>(inputs.size()) / leaf_size;
  if (leaves == 1 && grads_zero) {
    layer.BackwardWeightMany(params, inputs, grads);  // 0 + leaf is the leaf.
    return;
  }
  if (layer.BackwardWeightNode(params, inputs, leaf_size, grads)) return;
  // Slot 0 is `grads` itself when it holds zeros; the other slots are buffers of this call.
  std::vector<std::vector<math::Tensor>> buffers(math::TreeSlots(leaves));
  auto slot = [&](int s) -> absl::Span<math::Tensor> {
    if (s == 0 && grads_zero) return grads;
    if (buffers[s].empty()) buffers[s] = ZerosLike(grads);
    return absl::MakeSpan(buffers[s]);
  };
  math::EvaluateTree(
      leaves,
      [&](int64_t j, int s) {
        absl::Span<math::Tensor> out = slot(s);
        ZeroTensors(out);
        layer.BackwardWeightMany(params, inputs.subspan(j * leaf_size, leaf_size), out);
      },
      [](int64_t, int) { return false; }, [&](int s) { AddTensors(slot(s + 1), slot(s)); });
  if (!grads_zero) AddTensors(slot(0), grads);
}

absl::StatusOr<GradTreeFolder> GradTreeFolder::Create(const GradTree& tree, MicrobatchRange share) {
  if (!tree.IsNode(share)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "micro-batches [", share.lo, ", ", share.hi, ") are not a node of the gradient tree of ",
        tree.microbatches(), " micro-batches (leaves of ", tree.leaf_size(), ")"));
  }
  return GradTreeFolder(tree, share);
}

std::vector<FoldOp> GradTreeFolder::Fold(const std::vector<int64_t>& available,
                                         std::vector<int64_t>* consumed) {
  std::vector<FoldOp> ops;
  consumed->clear();
  available_.clear();
  for (int64_t i : available) {
    if (i >= share_.lo && i < share_.hi) available_.push_back(i);
  }
  std::sort(available_.begin(), available_.end());
  available_.erase(std::unique(available_.begin(), available_.end()), available_.end());
  consumed_ = consumed;
  if (closed_) {
    for (int64_t i : available_) {
      ops.push_back({FoldOp::Kind::kAccumulate, 0, 0, {i, i + 1}, false});
      Consume({i, i + 1});
    }
  } else if (!complete_) {
    complete_ = Visit(share_, &ops) >= 0;
  }
  consumed_ = nullptr;
  available_.clear();
  std::sort(consumed->begin(), consumed->end());
  return ops;
}

void GradTreeFolder::Restart() {
  complete_ = false;
  closed_ = false;
  done_.clear();
  leaves_.clear();
  free_buffers_.clear();
  next_buffer_ = 1;
}

std::vector<FoldOp> GradTreeFolder::Close() {
  std::vector<FoldOp> ops;
  if (closed_ || complete_) return ops;
  std::map<int64_t, int> pending;  // first micro-batch -> buffer, increasing.
  for (const auto& [range, buffer] : done_) pending[range.lo] = buffer;
  for (const auto& [lo, leaf] : leaves_) pending[lo] = leaf.buffer;
  for (const auto& [lo, buffer] : pending) {
    if (buffer != 0) ops.push_back({FoldOp::Kind::kCombine, 0, buffer, {}, false});
  }
  done_.clear();
  leaves_.clear();
  closed_ = true;
  return ops;
}

bool GradTreeFolder::Fresh(MicrobatchRange r) const {
  auto it = std::lower_bound(available_.begin(), available_.end(), r.lo);
  return available_.end() - it >= r.hi - r.lo && *(it + (r.hi - r.lo - 1)) == r.hi - 1 &&
         *it == r.lo;
}

void GradTreeFolder::Consume(MicrobatchRange r) {
  for (int64_t i = r.lo; i < r.hi; ++i) consumed_->push_back(i);
}

int GradTreeFolder::NewBuffer(MicrobatchRange r) {
  if (r.lo == share_.lo) return 0;  // the leftmost nodes live in the gradients themselves.
  if (!free_buffers_.empty()) {
    const int b = free_buffers_.back();
    free_buffers_.pop_back();
    return b;
  }
  return next_buffer_++;
}

void GradTreeFolder::FreeBuffer(int b) {
  if (b != 0) free_buffers_.push_back(b);
}

int GradTreeFolder::VisitLeaf(MicrobatchRange r, std::vector<FoldOp>* ops) {
  auto it = leaves_.find(r.lo);
  Leaf leaf = it != leaves_.end() ? it->second : Leaf{r.lo, -1};
  auto next = std::lower_bound(available_.begin(), available_.end(), leaf.next);
  int64_t end = leaf.next;
  while (next != available_.end() && *next == end && end < r.hi) {
    ++end;
    ++next;
  }
  if (end > leaf.next) {
    const bool fresh = leaf.buffer < 0;
    if (fresh) leaf.buffer = NewBuffer(r);
    ops->push_back({FoldOp::Kind::kAccumulate, leaf.buffer, 0, {leaf.next, end}, fresh});
    Consume({leaf.next, end});
    leaf.next = end;
  }
  if (leaf.next == r.hi) {
    if (it != leaves_.end()) leaves_.erase(it);
    return leaf.buffer;
  }
  if (leaf.buffer >= 0) leaves_[r.lo] = leaf;
  return -1;
}

int GradTreeFolder::Visit(MicrobatchRange r, std::vector<FoldOp>* ops) {
  if (auto it = done_.find(r); it != done_.end()) {
    const int buffer = it->second;
    done_.erase(it);
    return buffer;
  }
  if (r.hi - r.lo == tree_.leaf_size()) return VisitLeaf(r, ops);
  if (Fresh(r)) {
    const int buffer = NewBuffer(r);
    ops->push_back({FoldOp::Kind::kAddNode, buffer, 0, r, true});
    Consume(r);
    return buffer;
  }
  const int64_t mid = r.lo + (r.hi - r.lo) / 2;
  const MicrobatchRange lower{r.lo, mid};
  const MicrobatchRange upper{mid, r.hi};
  const int l = Visit(lower, ops);
  if (l >= 0 && Fresh(upper)) {
    ops->push_back({FoldOp::Kind::kAddNode, l, 0, upper, false});
    Consume(upper);
    return l;
  }
  const int u = Visit(upper, ops);
  if (l >= 0 && u >= 0) {
    ops->push_back({FoldOp::Kind::kCombine, l, u, {}, false});
    FreeBuffer(u);
    return l;
  }
  if (l >= 0) done_[lower] = l;
  if (u >= 0) done_[upper] = u;
  return -1;
}

}  // namespace pipetrain::model
