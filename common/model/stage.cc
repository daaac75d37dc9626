#include "common/model/stage.h"

#include <algorithm>
#include <cassert>
#include <iterator>
#include <new>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/math/tree_sum.h"
#include "common/util/checked_math.h"
#include "common/util/status_macros.h"

namespace pipetrain::model {
namespace {

std::string ParamName(int64_t layer, const std::string& param) {
  return absl::StrCat("layers.", layer, ".", param);
}
std::string StateName(int64_t layer, const std::string& param, const std::string& state) {
  return absl::StrCat("optim.", layer, ".", param, ".", state);
}

absl::Status CopyTensor(const std::map<std::string, math::Tensor>& tensors, const std::string& name,
                        const std::vector<int64_t>& shape, std::vector<float>* out) {
  auto it = tensors.find(name);
  if (it == tensors.end()) return absl::NotFoundError(absl::StrCat("tensor ", name, " is missing"));
  if (it->second.shape != shape) {
    return absl::InvalidArgumentError(
        absl::StrCat("tensor ", name, " has shape [", absl::StrJoin(it->second.shape, ","),
                     "], expected [", absl::StrJoin(shape, ","), "]"));
  }
  *out = it->second.data;
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<Stage> Stage::Create(const Model* model, int64_t first, int64_t last, uint64_t seed,
                                    const math::OptimizerConfig& optimizer) {
  if (first < 0 || first >= last || last > model->num_layers()) {
    return absl::InvalidArgumentError(absl::StrCat("stage layer range [", first, ", ", last,
                                                   ") is not within the model's ",
                                                   model->num_layers(), " layers"));
  }
  if (!math::CpuSupportsIsa(model->isa())) {
    return absl::FailedPreconditionError(absl::StrCat(
        "this CPU cannot run the model's instruction set ", math::IsaName(model->isa()),
        " (it runs ", math::IsaListName(math::SupportedIsas()), ")"));
  }
  Stage s;
  s.model_ = model;
  s.first_ = first;
  s.last_ = last;
  s.optimizer_ = optimizer;
  s.state_names_ = math::OptimizerStateNames(optimizer);
  // What the loop below allocates: every parameter, its gradient and its optimizer state tensors.
  // Model::Build checked each layer, so the sums cannot overflow for any sane layer count; they
  // are checked anyway.
  const std::vector<int64_t> layer_bytes = model->LayerParamBytes();
  const int64_t copies = 2 + static_cast<int64_t>(s.state_names_.size());
  std::optional<int64_t> bytes = 0;
  for (int64_t l = first; l < last && bytes.has_value(); ++l) {
    bytes = util::CheckedAdd(*bytes, layer_bytes[l]);
  }
  if (bytes.has_value()) bytes = util::CheckedMul(*bytes, copies);
  const int64_t limit = model->limits().max_parameter_bytes;
  if (!bytes.has_value() || *bytes > limit) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "stage of layers [", first, ", ", last, ") needs ", util::CheckedToString(bytes),
        " bytes for its parameters (weights, gradients and ", copies - 2,
        " optimizer state tensors), more than the limit of ", limit,
        " bytes (ModelLimits::max_parameter_bytes); split the model into more stages"));
  }
  // Deferred weight gradients may hold as much as the parameters, gradients and optimizer state.
  s.weight_grad_defer_bytes_ = *bytes;
  // The check above bounds the allocation; this catches a machine with less memory than that.
  try {
    s.AllocateParameters(seed);
  } catch (const std::bad_alloc&) {
    return absl::ResourceExhaustedError(
        absl::StrCat("stage of layers [", first, ", ", last, "): out of memory allocating ", *bytes,
                     " bytes of parameters, gradients and optimizer state"));
  }
  return s;
}

void Stage::AllocateParameters(uint64_t seed) {
  for (int64_t l = first_; l < last_; ++l) {
    std::vector<math::Tensor> params;
    model_->layer(l).Init(seed, l, &params);
    if (model_->tie().has_value() && l == model_->tie()->head_layer) {
      // The head's copy of the tied table starts as the embedding's table: the same bits on
      // whichever stage holds either.
      const int64_t e = model_->tie()->embedding_layer;
      std::vector<math::Tensor> table;
      model_->layer(e).Init(seed, e, &table);
      params[TiedEmbedding::kParam] = std::move(table[TiedEmbedding::kParam]);
    }
    std::vector<math::Tensor> grads = params;
    std::vector<std::vector<std::vector<float>>> state(params.size());
    for (size_t p = 0; p < params.size(); ++p) {
      std::fill(grads[p].data.begin(), grads[p].data.end(), 0.0f);
      state[p].assign(state_names_.size(), std::vector<float>(params[p].data.size(), 0.0f));
    }
    params_.push_back(std::move(params));
    caches_.push_back(model_->layer(l).NewParamCache());
    grads_.push_back(std::move(grads));
    state_.push_back(std::move(state));
  }
}

const math::Matrix& Stage::Forward(math::ConstMatrixMap x, MicrobatchState* mb) const {
  mb->inputs.resize(last_ - first_ + 1);
  mb->inputs[0] = x;
  return ForwardFromInput(mb);
}

const math::Matrix& Stage::Forward(math::Matrix&& x, MicrobatchState* mb) const {
  mb->inputs.resize(last_ - first_ + 1);
  mb->inputs[0] = std::move(x);
  return ForwardFromInput(mb);
}

const math::Matrix& Stage::ForwardFromInput(MicrobatchState* mb) const {
  const int64_t n = last_ - first_;
  mb->stashes.resize(n);
  mb->grads.resize(n + 1);
  for (int64_t k = 0; k < n; ++k) {
    const math::Layer& layer = model_->layer(first_ + k);
    const math::Matrix& in = mb->inputs[k];
    math::Matrix& out = mb->inputs[k + 1];
    out.resize(in.rows(), layer.out_features());
    layer.ForwardCached(params_[k], caches_[k].get(), math::AsConstMap(in), math::AsMap(out),
                        &mb->stashes[k]);
  }
  mb->forward_done = true;
  mb->input_grad_done = false;
  return mb->inputs[n];
}

const math::Matrix& Stage::BackwardInput(math::ConstMatrixMap dy, bool need_input_grad,
                                         MicrobatchState* mb) const {
  mb->grads.back() = dy;
  return BackwardInputFromOutputGrad(need_input_grad, mb);
}

const math::Matrix& Stage::BackwardInput(math::Matrix&& dy, bool need_input_grad,
                                         MicrobatchState* mb) const {
  mb->grads.back() = std::move(dy);
  return BackwardInputFromOutputGrad(need_input_grad, mb);
}

const math::Matrix& Stage::BackwardInputFromOutputGrad(bool need_input_grad,
                                                       MicrobatchState* mb) const {
  const int64_t n = last_ - first_;
  for (int64_t k = n - 1; k >= 0; --k) {
    const math::Layer& layer = model_->layer(first_ + k);
    const math::Matrix& in = mb->inputs[k];
    math::Matrix& dx = mb->grads[k];
    const bool need = k > 0 || need_input_grad;
    dx.resize(need ? in.rows() : 0, layer.in_features());
    layer.BackwardInputCached(params_[k], caches_[k].get(), math::AsConstMap(in),
                              math::AsConstMap(mb->grads[k + 1]), &mb->stashes[k], math::AsMap(dx));
  }
  mb->input_grad_done = true;
  return mb->grads[0];
}

absl::Status Stage::SetGradTree(const GradTree& tree, MicrobatchRange share) {
  PT_ASSIGN_OR_RETURN(GradTreeFolder folder, GradTreeFolder::Create(tree, share));
  next_folder_ = std::move(folder);
  if (weight_grads_this_step_ == 0 && deferred_.empty()) RestartGradTree();
  return absl::OkStatus();
}

void Stage::RestartGradTree() {
  if (next_folder_.has_value()) {
    folder_ = std::move(*next_folder_);
    next_folder_.reset();
  } else {
    folder_.Restart();
  }
  weight_grads_this_step_ = 0;
  added_.clear();
}

void Stage::BackwardWeight(MicrobatchState* mb, std::vector<double>* grad_norm_sq) {
  // The share's next micro-batch: valid and new while the step has fewer W than the share.
  const absl::Status status =
      BackwardWeightAt(folder_.share().lo + weight_grads_this_step_, mb, grad_norm_sq);
  assert(status.ok());
  (void)status;
}

absl::Status Stage::BackwardWeightAt(int64_t microbatch, MicrobatchState* mb,
                                     std::vector<double>* grad_norm_sq) {
  const MicrobatchRange share = folder_.share();
  if (microbatch < share.lo || microbatch >= share.hi) {
    return absl::InvalidArgumentError(absl::StrCat("W of micro-batch ", microbatch,
                                                   " outside the stage's share [", share.lo, ", ",
                                                   share.hi, ") of the step"));
  }
  if (!added_.insert(microbatch).second) {
    return absl::FailedPreconditionError(
        absl::StrCat("W of micro-batch ", microbatch, " was already added this step"));
  }
  ++weight_grads_this_step_;
  const int64_t n = last_ - first_;
  DeferredWeightGrad d;
  d.inputs.resize(n);
  d.output_grads.resize(n);
  d.stashes.resize(n);
  for (int64_t k = 0; k < n; ++k) {
    if (params_[k].empty()) continue;
    d.inputs[k] = std::move(mb->inputs[k]);
    d.output_grads[k] = std::move(mb->grads[k + 1]);
    d.stashes[k] = std::move(mb->stashes[k]);
    deferred_bytes_ += DeferredBytes(d, k);
  }
  deferred_.emplace(microbatch, std::move(d));
  // Free the rest of the micro-batch's memory but keep the vectors for reuse.
  for (auto& m : mb->inputs) m.resize(0, 0);
  for (auto& m : mb->grads) m.resize(0, 0);
  for (auto& s : mb->stashes) s.data.clear();
  mb->forward_done = false;
  mb->input_grad_done = false;
  if (grad_norm_sq != nullptr || deferred_bytes_ > weight_grad_defer_bytes_) {
    AddDeferredWeightGrads(grad_norm_sq);
  }
  return absl::OkStatus();
}

int64_t Stage::DeferredBytes(const DeferredWeightGrad& d, int64_t k) {
  return static_cast<int64_t>(
      (d.inputs[k].size() + d.output_grads[k].size() + d.stashes[k].data.size()) * sizeof(float));
}

absl::Span<math::Tensor> Stage::GradBuffer(int64_t k, int b) {
  if (b == 0) return absl::MakeSpan(grads_[k]);
  if (spare_.size() < static_cast<size_t>(b)) spare_.resize(b);
  std::vector<std::vector<math::Tensor>>& buffer = spare_[b - 1];
  if (buffer.empty()) buffer.resize(last_ - first_);
  if (buffer[k].size() != grads_[k].size()) buffer[k] = grads_[k];  // shapes; zeroed by the op.
  return absl::MakeSpan(buffer[k]);
}

void Stage::RunFoldOps(int64_t k, const std::vector<FoldOp>& ops) {
  if (params_[k].empty()) return;
  const math::Layer& layer = model_->layer(first_ + k);
  std::vector<math::WeightGradInputs> inputs;
  for (const FoldOp& op : ops) {
    absl::Span<math::Tensor> dest = GradBuffer(k, op.dest);
    if (op.kind == FoldOp::Kind::kCombine) {
      for (size_t p = 0; p < dest.size(); ++p) {
        math::AddInTreeOrder(GradBuffer(k, op.src)[p].data, absl::MakeSpan(dest[p].data));
      }
      continue;
    }
    // A new spare buffer starts at zero; buffer 0 (the gradients) is zero at a step's start.
    const bool zero = op.dest_zero && (op.dest != 0 || grads_zero_);
    if (op.dest_zero && op.dest != 0) {
      for (math::Tensor& t : dest) std::fill(t.data.begin(), t.data.end(), 0.0f);
    }
    inputs.clear();
    for (int64_t i = op.range.lo; i < op.range.hi; ++i) {
      const DeferredWeightGrad& d = deferred_.at(i);
      inputs.push_back(
          {math::AsConstMap(d.inputs[k]), math::AsConstMap(d.output_grads[k]), &d.stashes[k]});
    }
    if (op.kind == FoldOp::Kind::kAccumulate) {
      layer.BackwardWeightMany(params_[k], inputs, dest);
    } else {
      AddWeightGradNode(layer, params_[k], inputs, folder_.tree().leaf_size(), zero, dest);
    }
  }
}

void Stage::RunFold(const std::vector<FoldOp>& ops, const std::vector<int64_t>& consumed,
                    std::vector<double>* grad_norm_sq) {
  const int64_t n = last_ - first_;
  if (grad_norm_sq != nullptr) grad_norm_sq->assign(n, 0.0);
  for (int64_t k = n - 1; k >= 0; --k) {
    if (!ops.empty()) RunFoldOps(k, ops);
    if (grad_norm_sq != nullptr) (*grad_norm_sq)[k] = LayerGradNormSq(k);
  }
  if (!ops.empty()) grads_zero_ = false;
  for (int64_t i : consumed) {
    auto it = deferred_.find(i);
    for (int64_t k = 0; k < n; ++k) deferred_bytes_ -= DeferredBytes(it->second, k);
    deferred_.erase(it);
  }
}

void Stage::AddDeferredWeightGrads(std::vector<double>* grad_norm_sq) {
  std::vector<int64_t> available;
  available.reserve(deferred_.size());
  for (const auto& [i, d] : deferred_) available.push_back(i);
  std::vector<int64_t> consumed;
  const std::vector<FoldOp> ops = folder_.Fold(available, &consumed);
  RunFold(ops, consumed, grad_norm_sq);
}

void Stage::FinishGradsForRead(std::vector<double>* grad_norm_sq) {
  std::vector<int64_t> available;
  for (const auto& [i, d] : deferred_) available.push_back(i);
  std::vector<int64_t> consumed;
  std::vector<FoldOp> ops = folder_.Fold(available, &consumed);
  if (!folder_.complete() && weight_grads_this_step_ > 0) {
    // Micro-batches a leaf could not take yet are added in order after its pending part.
    for (const FoldOp& op : folder_.Close()) ops.push_back(op);
    std::vector<int64_t> left;
    std::set_difference(available.begin(), available.end(), consumed.begin(), consumed.end(),
                        std::back_inserter(left));
    std::vector<int64_t> rest;
    for (const FoldOp& op : folder_.Fold(left, &rest)) ops.push_back(op);
    consumed.insert(consumed.end(), rest.begin(), rest.end());
  }
  RunFold(ops, consumed, grad_norm_sq);
}

int64_t Stage::GradTreeBufferBytes() const {
  int64_t bytes = 0;
  for (const auto& buffer : spare_) {
    for (const auto& layer : buffer) {
      for (const math::Tensor& t : layer) {
        bytes += static_cast<int64_t>(t.data.size() * sizeof(float));
      }
    }
  }
  return bytes;
}

void Stage::DropDeferredWeightGrads() {
  deferred_.clear();
  deferred_bytes_ = 0;
}

void Stage::set_weight_grad_defer_bytes(int64_t bytes) {
  weight_grad_defer_bytes_ = std::max<int64_t>(0, bytes);
  if (deferred_bytes_ > weight_grad_defer_bytes_) AddDeferredWeightGrads(nullptr);
}

void Stage::ZeroGrads() {
  DropDeferredWeightGrads();
  RestartGradTree();
  if (grads_zero_) return;
  for (auto& layer : grads_) {
    for (auto& g : layer) std::fill(g.data.begin(), g.data.end(), 0.0f);
  }
  grads_zero_ = true;
}

double Stage::LayerGradNormSq(int64_t k) const {
  double sum = 0;
  for (size_t p = 0; p < grads_[k].size(); ++p) {
    if (!IsTiedHeadCopy(k, p)) sum += math::SumOfSquares(grads_[k][p].data);
  }
  return sum;
}

bool Stage::IsTiedHeadCopy(int64_t k, size_t p) const {
  return p == TiedEmbedding::kParam && k == TiedLocalLayer(TieEnd::kHead);
}

int64_t Stage::TiedLocalLayer(TieEnd end) const {
  if (!model_->tie().has_value()) return -1;
  const int64_t l =
      end == TieEnd::kEmbedding ? model_->tie()->embedding_layer : model_->tie()->head_layer;
  return l >= first_ && l < last_ ? l - first_ : -1;
}

bool Stage::holds_tied(TieEnd end) const { return TiedLocalLayer(end) >= 0; }

absl::StatusOr<math::Tensor> Stage::TiedGradPart(TieEnd end) {
  const int64_t k = TiedLocalLayer(end);
  if (k < 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "stage of layers [", first_, ", ", last_, ") holds no ",
        end == TieEnd::kEmbedding ? "embedding" : "head", " copy of a tied embedding table"));
  }
  AddDeferredWeightGrads(nullptr);
  return grads_[k][TiedEmbedding::kParam];
}

absl::StatusOr<double> Stage::SetTiedGrad(TieEnd end, const math::Tensor& sum) {
  const int64_t k = TiedLocalLayer(end);
  if (k < 0) return TiedGradPart(end).status();  // the FAILED_PRECONDITION above.
  AddDeferredWeightGrads(nullptr);
  math::Tensor& grad = grads_[k][TiedEmbedding::kParam];
  if (sum.shape != grad.shape || sum.data.size() != grad.data.size()) {
    return absl::InvalidArgumentError(
        absl::StrCat("tied gradient of shape [", absl::StrJoin(sum.shape, ","), "] with ",
                     sum.data.size(), " floats for layer ", first_ + k, "'s table of shape [",
                     absl::StrJoin(grad.shape, ","), "]"));
  }
  grad.data = sum.data;
  grads_zero_ = false;
  return LayerGradNormSq(k);
}

int64_t Stage::NumGradFloats() const {
  int64_t n = 0;
  for (const std::vector<math::Tensor>& layer : grads_) {
    for (const math::Tensor& g : layer) n += static_cast<int64_t>(g.data.size());
  }
  return n;
}

void Stage::CopyGradsTo(std::vector<float>* flat) {
  FinishGradsForRead(nullptr);
  flat->resize(static_cast<size_t>(NumGradFloats()));
  float* out = flat->data();
  for (const std::vector<math::Tensor>& layer : grads_) {
    for (const math::Tensor& g : layer) out = std::copy(g.data.begin(), g.data.end(), out);
  }
}

absl::Status Stage::SetGradsFrom(absl::Span<const float> flat) {
  if (static_cast<int64_t>(flat.size()) != NumGradFloats()) {
    return absl::InvalidArgumentError(absl::StrCat("gradients of layers [", first_, ", ", last_,
                                                   "): ", flat.size(), " floats given, ",
                                                   NumGradFloats(), " expected"));
  }
  FinishGradsForRead(nullptr);
  const float* in = flat.data();
  for (std::vector<math::Tensor>& layer : grads_) {
    for (math::Tensor& g : layer) {
      std::copy(in, in + g.data.size(), g.data.begin());
      in += g.data.size();
    }
  }
  grads_zero_ = false;
  return absl::OkStatus();
}

void Stage::CombineTiedGrads() {
  const int64_t e = TiedLocalLayer(TieEnd::kEmbedding);
  const int64_t h = TiedLocalLayer(TieEnd::kHead);
  if (e < 0 || h < 0) return;
  AddDeferredWeightGrads(nullptr);
  // Model::Build checked that both copies have the table's shape, so the sum cannot fail.
  absl::StatusOr<math::Tensor> sum =
      SumTiedGradients(grads_[e][TiedEmbedding::kParam], grads_[h][TiedEmbedding::kParam]);
  if (!sum.ok()) return;
  grads_[h][TiedEmbedding::kParam].data = sum->data;
  grads_[e][TiedEmbedding::kParam].data = std::move(sum->data);
  grads_zero_ = false;
}

std::pair<int64_t, std::string> Stage::CheckpointParam(int64_t k, size_t p) const {
  if (IsTiedHeadCopy(k, p)) {
    const int64_t e = model_->tie()->embedding_layer;
    return {e, model_->layer(e).params()[TiedEmbedding::kParam].name};
  }
  return {first_ + k, model_->layer(first_ + k).params()[p].name};
}

std::vector<double> Stage::GradNormSqPerLayer() {
  std::vector<double> out;
  FinishGradsForRead(&out);
  return out;
}

void Stage::ApplyOptimizer(int64_t step, float clip_scale) {
  FinishGradsForRead(nullptr);
  RestartGradTree();
  for (size_t k = 0; k < params_.size(); ++k) {
    for (size_t p = 0; p < params_[k].size(); ++p) {
      std::vector<float>& grad = grads_[k][p].data;
      math::OptimizerStep(optimizer_, step, clip_scale, grad, absl::MakeSpan(params_[k][p].data),
                          absl::MakeSpan(state_[k][p]));
      std::fill(grad.begin(), grad.end(), 0.0f);
    }
    if (caches_[k] != nullptr) {
      // Repacked now, while the new weights are in cache, rather than in the next step's first
      // products (often on its critical path).
      caches_[k]->ParamsChanged();
      caches_[k]->Refresh(params_[k]);
    }
  }
  grads_zero_ = true;
}

int64_t Stage::ParamCacheBytes() const {
  int64_t bytes = 0;
  for (const auto& cache : caches_) {
    if (cache != nullptr) bytes += cache->bytes();
  }
  return bytes;
}

std::map<std::string, math::Tensor> Stage::ExportState() const {
  std::map<std::string, math::Tensor> out;
  for (size_t k = 0; k < params_.size(); ++k) {
    const int64_t l = first_ + static_cast<int64_t>(k);
    const std::vector<math::ParamSpec> specs = model_->layer(l).params();
    for (size_t p = 0; p < specs.size(); ++p) {
      if (IsTiedHeadCopy(static_cast<int64_t>(k), p)) continue;  // stored as the embedding's.
      out[ParamName(l, specs[p].name)] = params_[k][p];
      for (size_t s = 0; s < state_names_.size(); ++s) {
        out[StateName(l, specs[p].name, state_names_[s])] =
            math::Tensor{specs[p].shape, state_[k][p][s]};
      }
    }
  }
  return out;
}

absl::Status Stage::ImportState(const std::map<std::string, math::Tensor>& tensors) {
  // Deferred micro-batches belong to the parameters they were computed with.
  FinishGradsForRead(nullptr);
  // Copy into fresh storage first so that a failure leaves the stage unchanged.
  auto params = params_;
  auto state = state_;
  for (size_t k = 0; k < params.size(); ++k) {
    const int64_t l = first_ + static_cast<int64_t>(k);
    const std::vector<math::ParamSpec> specs = model_->layer(l).params();
    for (size_t p = 0; p < specs.size(); ++p) {
      const auto [from, name] = CheckpointParam(static_cast<int64_t>(k), p);
      if (auto s = CopyTensor(tensors, ParamName(from, name), specs[p].shape, &params[k][p].data);
          !s.ok()) {
        return s;
      }
      for (size_t st = 0; st < state_names_.size(); ++st) {
        if (auto s = CopyTensor(tensors, StateName(from, name, state_names_[st]), specs[p].shape,
                                &state[k][p][st]);
            !s.ok()) {
          return s;
        }
      }
    }
  }
  params_ = std::move(params);
  state_ = std::move(state);
  for (auto& cache : caches_) {
    if (cache != nullptr) cache->ParamsChanged();
  }
  return absl::OkStatus();
}

}  // namespace pipetrain::model
