#include "server/worker/executor.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/model/reference_trainer.h"
#include "common/util/status_macros.h"
#include "common/wire/eval_key.h"
#include "server/worker/action_list.h"
#include "server/worker/gradient_exchange.h"

namespace pipetrain::worker {
namespace {

using schedule::Action;
using schedule::Op;
using wire::TensorKey;
using wire::TensorKind;

// The executor's data plane as an ExchangeTransport: sends through the Sender, takes from the
// mailbox with the executor's input timeout.
class MailboxTransport final : public ExchangeTransport {
 public:
  MailboxTransport(Sender* sender, Mailbox* mailbox, absl::Duration timeout)
      : sender_(sender), mailbox_(mailbox), timeout_(timeout) {}
  void Send(const TensorKey& key, math::Matrix tensor) override {
    sender_->Send(key, std::move(tensor));
  }
  absl::StatusOr<math::Matrix> Take(const TensorKey& key) override {
    return mailbox_->Take(key, timeout_ == absl::InfiniteDuration() ? absl::InfiniteFuture()
                                                                    : absl::Now() + timeout_);
  }

 private:
  Sender* const sender_;
  Mailbox* const mailbox_;
  const absl::Duration timeout_;
};

// Checks that `chunks` (sorted by chunk index) fit `routes` and `model`: each chunk in range and
// held once, the first chunk of a copy starts at layer 0, its last ends at the model's end, and
// two chunks of one copy held here are in layer order with room for the chunks between them.
absl::Status CheckChunkLayers(const model::Model& model, const std::vector<OwnedChunk>& chunks,
                              const ChunkRoutes& routes) {
  const int64_t layers = model.num_layers();
  for (size_t i = 0; i < chunks.size(); ++i) {
    const OwnedChunk& c = chunks[i];
    const model::Stage& s = c.stage;
    if (c.chunk < 0 || c.chunk >= routes.num_chunks()) {
      return absl::InvalidArgumentError(
          absl::StrCat("chunk ", c.chunk, " is outside [0, ", routes.num_chunks(), ")"));
    }
    if (routes.IsFirst(c.chunk) && s.first_layer() != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("chunk ", c.chunk, " starts at layer ", s.first_layer(), ", not 0"));
    }
    if (routes.IsLast(c.chunk) && s.last_layer() != layers) {
      return absl::InvalidArgumentError(absl::StrCat("last chunk ", c.chunk, " ends at layer ",
                                                     s.last_layer(), ", not at the model's end ",
                                                     layers));
    }
    if (s.last_layer() > layers) {
      return absl::InvalidArgumentError(absl::StrCat("chunk ", c.chunk, " ends at layer ",
                                                     s.last_layer(), " beyond the model's ", layers,
                                                     " layers"));
    }
    for (size_t j = 0; j < i; ++j) {
      const OwnedChunk& p = chunks[j];
      if (p.chunk == c.chunk) {
        return absl::InvalidArgumentError(absl::StrCat("chunk ", c.chunk, " is given twice"));
      }
      if (routes.StageOf(p.chunk) == routes.StageOf(c.chunk)) {
        return absl::InvalidArgumentError(
            absl::StrCat("chunks ", p.chunk, " and ", c.chunk, " are both copies of stage ",
                         routes.StageOf(c.chunk), ": the two copies must be on two workers"));
      }
    }
    if (i == 0 || routes.IsDown(chunks[i - 1].chunk) != routes.IsDown(c.chunk)) continue;
    const OwnedChunk& p = chunks[i - 1];
    // Every chunk in between needs at least one layer; adjacent chunks must touch.
    const int64_t between = c.chunk - p.chunk - 1;
    const int64_t gap = s.first_layer() - p.stage.last_layer();
    if (between == 0 ? gap != 0 : gap < between) {
      return absl::InvalidArgumentError(absl::StrCat(
          "chunk ", p.chunk, " (layers [", p.stage.first_layer(), ", ", p.stage.last_layer(),
          ")) and chunk ", c.chunk, " (layers [", s.first_layer(), ", ", s.last_layer(),
          ")) are not in layer order with room for the ", between, " chunks between them"));
    }
  }
  return absl::OkStatus();
}

// Prefixes `status`'s message with `context`, keeping its code.
absl::Status WithContext(const absl::Status& status, absl::string_view context) {
  return absl::Status(status.code(), absl::StrCat(context, ": ", status.message()));
}

}  // namespace

absl::StatusOr<double> CombineLayerNormSq(const std::vector<const StepReport*>& reports,
                                          int64_t num_layers) {
  if (num_layers < 1) {
    return absl::InvalidArgumentError(absl::StrCat("num_layers must be >= 1, got ", num_layers));
  }
  std::vector<double> per_layer(num_layers, 0.0);
  std::vector<bool> seen(num_layers, false);
  for (size_t r = 0; r < reports.size(); ++r) {
    for (const LayerNormSq& e : reports[r]->layer_grad_norm_sq) {
      if (e.layer < 0 || e.layer >= num_layers) {
        return absl::InvalidArgumentError(
            absl::StrCat("report ", r, " has layer ", e.layer, " outside [0, ", num_layers, ")"));
      }
      if (seen[e.layer]) {
        return absl::InvalidArgumentError(
            absl::StrCat("layer ", e.layer, " is reported twice (again by report ", r, ")"));
      }
      seen[e.layer] = true;
      per_layer[e.layer] = e.norm_sq;
    }
  }
  for (int64_t l = 0; l < num_layers; ++l) {
    if (!seen[l]) {
      return absl::InvalidArgumentError(absl::StrCat("no report has layer ", l));
    }
  }
  return model::SumLayerNormSq(per_layer);
}

absl::StatusOr<std::unique_ptr<StepExecutor>> StepExecutor::Create(const model::Model* model,
                                                                   std::vector<OwnedChunk> chunks,
                                                                   int num_chunks, Mailbox* mailbox,
                                                                   Sender* sender,
                                                                   const ExecutorOptions& options) {
  if (model == nullptr || mailbox == nullptr || sender == nullptr) {
    return absl::InvalidArgumentError("executor needs a model, a mailbox and a sender");
  }
  if (chunks.empty()) return absl::InvalidArgumentError("executor needs at least one chunk");
  if (options.input_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(absl::StrCat("input timeout must be positive, got ",
                                                   absl::FormatDuration(options.input_timeout)));
  }
  if (options.replicas < 1 || AllReduceRounds(options.replicas) < 0 || options.replica < 0 ||
      options.replica >= options.replicas) {
    return absl::InvalidArgumentError(
        absl::StrCat("replica ", options.replica, " of ", options.replicas,
                     ": the replica count must be a power of two >= 1, the replica in [0, ",
                     options.replicas, ")"));
  }
  const int copies = options.two_copies ? 2 : 1;
  if (num_chunks < 1 || num_chunks > copies * model->num_layers()) {
    return absl::InvalidArgumentError(
        absl::StrCat("num_chunks ", num_chunks, " is not in [1, ", copies * model->num_layers(),
                     "] (", copies == 2 ? "two copies of " : "", "the model's layers)"));
  }
  ChunkRoutes routes = ChunkRoutes::OneCopy(num_chunks);
  if (options.two_copies) {
    PT_ASSIGN_OR_RETURN(routes, ChunkRoutes::TwoCopies(num_chunks));
  }
  std::sort(chunks.begin(), chunks.end(),
            [](const OwnedChunk& a, const OwnedChunk& b) { return a.chunk < b.chunk; });
  PT_RETURN_IF_ERROR(CheckChunkLayers(*model, chunks, routes));
  if (options.two_copies && options.replicas > 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("two copies of the stages (dualpipe) with ", options.replicas,
                     " data-parallel replicas: dualpipe runs with one replica"));
  }
  std::unique_ptr<StepExecutor> executor(
      new StepExecutor(model, std::move(chunks), routes, mailbox, sender, options));
  if (options.replicas > 1 || options.two_copies) {
    PT_ASSIGN_OR_RETURN(executor->reducer_,
                        ReplicaReducer::Create(sender, mailbox, options.input_timeout));
  }
  return executor;
}

StepExecutor::StepExecutor(const model::Model* model, std::vector<OwnedChunk> chunks,
                           const ChunkRoutes& routes, Mailbox* mailbox, Sender* sender,
                           const ExecutorOptions& options)
    : model_(model),
      num_chunks_(routes.num_chunks()),
      mailbox_(mailbox),
      sender_(sender),
      options_(options),
      local_of_chunk_(routes.num_chunks(), -1),
      routes_(routes),
      chunks_(std::move(chunks)) {
  for (size_t i = 0; i < chunks_.size(); ++i) {
    local_of_chunk_[chunks_[i].chunk] = i;
    take_norms_ = take_norms_ || chunks_[i].stage.clips_gradients();
  }
}

std::vector<int> StepExecutor::chunk_indices() const {
  std::vector<int> out;
  out.reserve(chunks_.size());
  for (const OwnedChunk& c : chunks_) out.push_back(c.chunk);
  return out;
}

absl::StatusOr<StepReport> StepExecutor::RunStep(int64_t step, const std::vector<Action>& actions,
                                                 int64_t batch_rows) {
  const Clock::time_point t0 = Clock::now();
  if (phase_ == Phase::kAwaitingCommit) {
    return absl::FailedPreconditionError(
        absl::StrCat("RunStep(", step, "): the previous step awaits Commit or Abort"));
  }
  if (phase_ == Phase::kFailed) {
    return absl::FailedPreconditionError(
        absl::StrCat("RunStep(", step, "): the previous step failed and was not aborted"));
  }
  const absl::StatusOr<int> microbatches = CheckActionList(actions, local_of_chunk_, &routes_);
  if (!microbatches.ok()) return WithContext(microbatches.status(), absl::StrCat("step ", step));
  const int m = *microbatches;
  // The step's micro-batches: this replica's m, times the replicas.
  const int64_t step_m = int64_t{m} * options_.replicas;
  if (batch_rows < 1 || batch_rows % step_m != 0 ||
      (batch_rows / step_m) % model_->tokens_per_sample()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "step ", step, ": batch of ", batch_rows, " rows does not split into ", step_m,
        " micro-batches (", m, " per replica x ", options_.replicas,
        " replicas) of whole samples (", model_->tokens_per_sample(), " rows per sample)"));
  }
  StepReport report;
  report.step = step;
  report.started = t0;
  for (const OwnedChunk& c : chunks_) {
    if (routes_.IsLast(c.chunk)) report.microbatch_losses.assign(m, 0.0f);
  }
  report.timings.reserve(actions.size());
  ApplyPendingUpdate();
  report.update_time = std::exchange(unreported_update_time_, absl::ZeroDuration());
  DiscardInFlight();
  PT_RETURN_IF_ERROR(StartGradients(step, m));
  absl::Status status = RunStepImpl(step, actions, batch_rows, step_m, t0, &report);
  status = FinishGradients(step, status, &report);
  if (!status.ok()) {
    phase_ = Phase::kFailed;
    return status;
  }
  for (const ActionTiming& t : report.timings) {
    report.wait_time += t.wait();
    report.compute_time += t.compute();
  }
  report.wall_time = absl::FromChrono(Clock::now() - t0);
  phase_ = Phase::kAwaitingCommit;
  return report;
}

absl::Status StepExecutor::StartGradients(int64_t step, int m) {
  // The step's gradients are added in the canonical tree order of its m x replicas micro-batches
  // (model::GradTree), the reference trainer's; this replica's share is a node of it (with two
  // copies of the stages, each copy's half is).
  PT_ASSIGN_OR_RETURN(const model::GradTree tree,
                      model::GradTree::Create(int64_t{m} * options_.replicas));
  if (routes_.two_copies() && !tree.SupportsReplicas(2)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "step ", step, ": the two copies of the stages (dualpipe) each add half of the ", m,
        " micro-batches, and that half must be a node of the step's gradient tree "
        "(model::GradTree::SupportsReplicas(2)); it is not for M = ",
        m));
  }
  grad_share_lo_ = int64_t{options_.replica} * m;
  weight_grads_due_.clear();
  for (OwnedChunk& c : chunks_) {
    const model::MicrobatchRange share =
        routes_.two_copies() ? routes_.Share(c.chunk, m)
                             : model::MicrobatchRange{grad_share_lo_, grad_share_lo_ + m};
    PT_RETURN_IF_ERROR(c.stage.SetGradTree(tree, share));
    c.stage.ZeroGrads();  // free after a commit (Stage::ZeroGrads).
    weight_grads_due_.push_back(static_cast<int>(share.hi - share.lo));
  }
  step_microbatches_ = m;
  weight_grads_done_.assign(chunks_.size(), 0);
  chunk_norms_.assign(chunks_.size(), {});
  if (reducer_ != nullptr) reducer_->Start(step);
  return absl::OkStatus();
}

absl::Status StepExecutor::FinishGradients(int64_t step, absl::Status status, StepReport* report) {
  if (reducer_ != nullptr) {
    if (!status.ok()) {
      // The step is lost: end the reductions still waiting for a peer, then drain them.
      reducer_->Cancel();
      reducer_->Finish().IgnoreError();
      return status;
    }
    PT_RETURN_IF_ERROR(ApplyReducedSums(step, report));
  }
  if (!status.ok()) return status;
  MailboxTransport transport(sender_, mailbox_, options_.input_timeout);
  PT_RETURN_IF_ERROR(ExchangeTiedGradients(step, &transport));
  return ReportNorms(step, report);
}

absl::Status StepExecutor::ReportNorms(int64_t step, StepReport* report) {
  for (size_t local = 0; take_norms_ && local < chunks_.size(); ++local) {
    model::Stage& stage = chunks_[local].stage;
    const int chunk = chunks_[local].chunk;
    // With two copies the down copy reports the stage's norms of the summed gradient; the up
    // copy's are the same numbers and would count the stage twice.
    if (!routes_.IsDown(chunk)) continue;
    if (routes_.two_copies()) chunk_norms_[local] = stage.GradNormSqPerLayer();
    // Otherwise each chunk's norms were taken by its last W (CheckActionList: one W per
    // micro-batch of its share, in order), and by the tied exchange for the table's layer.
    const std::vector<double>& norms = chunk_norms_[local];
    if (static_cast<int64_t>(norms.size()) != stage.last_layer() - stage.first_layer()) {
      return absl::InternalError(absl::StrCat("step ", step, ": chunk ", chunk,
                                              " has no gradient norms after its last W"));
    }
    for (size_t k = 0; k < norms.size(); ++k) {
      report->layer_grad_norm_sq.push_back(
          LayerNormSq{stage.first_layer() + static_cast<int64_t>(k), norms[k]});
    }
  }
  return absl::OkStatus();
}

absl::Status StepExecutor::RunStepImpl(int64_t step, const std::vector<Action>& actions,
                                       int64_t batch_rows, int64_t microbatches,
                                       Clock::time_point t0, StepReport* report) {
  const int64_t mb_rows = batch_rows / microbatches;
  const double loss_scale = 1.0 / static_cast<double>(batch_rows);
  for (size_t i = 0; i < actions.size(); ++i) {
    const Action& a = actions[i];
    const int local = local_of_chunk_[a.chunk];
    const Clock::time_point start = Clock::now();
    Clock::time_point ready = start;
    std::optional<Clock::time_point> output;
    absl::Status s;
    switch (a.op) {
      case Op::kForward:
        s = Forward(step, a, local, mb_rows, loss_scale, report, &ready);
        break;
      case Op::kBackward:
        s = InputGrad(step, a, local, &ready);
        output = Clock::now();
        if (s.ok()) s = WeightGrad(a, local);
        break;
      case Op::kInputGrad:
        s = InputGrad(step, a, local, &ready);
        break;
      case Op::kWeightGrad:
        s = WeightGrad(a, local);
        break;
    }
    if (!s.ok()) return WithContext(s, absl::StrCat("step ", step, " ", ActionAt(i, a)));
    const Clock::time_point end = Clock::now();
    report->timings.push_back(ActionTiming{a, absl::FromChrono(start - t0),
                                           absl::FromChrono(ready - t0), absl::FromChrono(end - t0),
                                           absl::FromChrono(output.value_or(end) - t0)});
    report->peak_in_flight =
        std::max(report->peak_in_flight, static_cast<int64_t>(in_flight_.size()));
    report->peak_stashed_bytes = std::max(report->peak_stashed_bytes, InFlightBytes());
  }
  if (!in_flight_.empty()) {
    // CheckActionList makes this unreachable; kept so a bug cannot leak state into the next step.
    return absl::InternalError(
        absl::StrCat("step ", step, ": ", in_flight_.size(), " micro-batch states left in flight"));
  }
  return absl::OkStatus();
}

absl::StatusOr<math::Matrix> StepExecutor::TakeChecked(const TensorKey& key, int64_t rows,
                                                       int64_t cols) {
  const absl::Time deadline = options_.input_timeout == absl::InfiniteDuration()
                                  ? absl::InfiniteFuture()
                                  : absl::Now() + options_.input_timeout;
  PT_ASSIGN_OR_RETURN(math::Matrix x, mailbox_->Take(key, deadline));
  if ((rows >= 0 && x.rows() != rows) || x.cols() != cols) {
    return absl::InvalidArgumentError(absl::StrCat(key.ToString(), " has shape [", x.rows(), ", ",
                                                   x.cols(), "], expected [", rows, ", ", cols,
                                                   "]"));
  }
  return x;
}

int64_t StepExecutor::InFlightBytes() const {
  int64_t floats = 0;
  for (const auto& [key, f] : in_flight_) {
    for (const math::Matrix& m : f->state.inputs) floats += m.size();
    for (const math::Stash& st : f->state.stashes) floats += static_cast<int64_t>(st.data.size());
    for (const math::Matrix& m : f->state.grads) floats += m.size();
    floats += f->dpred.size();
  }
  int64_t deferred = 0;
  for (const OwnedChunk& c : chunks_) deferred += c.stage.DeferredWeightGradBytes();
  return floats * static_cast<int64_t>(sizeof(float)) + deferred;
}

StepExecutor::InFlight* StepExecutor::FindInFlight(int mb, int local) {
  auto it = in_flight_.find(std::make_pair(mb, local));
  return it == in_flight_.end() ? nullptr : it->second.get();
}

StepExecutor::InFlight* StepExecutor::AcquireInFlight(int mb, int local) {
  std::unique_ptr<InFlight> f;
  if (pool_.empty()) {
    f = std::make_unique<InFlight>();
  } else {
    f = std::move(pool_.back());
    pool_.pop_back();
  }
  InFlight* raw = f.get();
  in_flight_[std::make_pair(mb, local)] = std::move(f);
  return raw;
}

void StepExecutor::ReleaseInFlight(int mb, int local) {
  auto it = in_flight_.find(std::make_pair(mb, local));
  if (it == in_flight_.end()) return;
  std::unique_ptr<InFlight> f = std::move(it->second);
  in_flight_.erase(it);
  f->dpred.resize(0, 0);
  f->input_grad_done = false;
  pool_.push_back(std::move(f));
}

void StepExecutor::DiscardInFlight() {
  for (auto& [key, f] : in_flight_) {
    f->state = model::MicrobatchState();  // frees the stashed activations.
    f->dpred.resize(0, 0);
    f->input_grad_done = false;
    pool_.push_back(std::move(f));
  }
  in_flight_.clear();
}

absl::Status StepExecutor::Forward(int64_t step, const Action& a, int local, int64_t mb_rows,
                                   double loss_scale, StepReport* report,
                                   Clock::time_point* ready) {
  if (FindInFlight(a.mb, local) != nullptr) {
    return absl::FailedPreconditionError("the micro-batch is already in flight on this chunk");
  }
  model::Stage& stage = chunks_[local].stage;
  const bool first = routes_.IsFirst(a.chunk);
  const bool last = routes_.IsLast(a.chunk);
  const TensorKey in_key{step, a.mb, a.chunk, first ? TensorKind::kInput : TensorKind::kActivation};
  PT_ASSIGN_OR_RETURN(
      math::Matrix x,
      TakeChecked(in_key, mb_rows, model_->layer(stage.first_layer()).in_features()));
  math::Matrix target;
  if (last) {
    const TensorKey target_key{step, a.mb, a.chunk, TensorKind::kTarget};
    PT_ASSIGN_OR_RETURN(target, TakeChecked(target_key, mb_rows, model_->target_features()));
    if (absl::Status s =
            model_->loss().CheckTargets(math::AsConstMap(target), model_->output_features());
        !s.ok()) {
      return WithContext(s, target_key.ToString());
    }
  }
  *ready = Clock::now();
  InFlight* f = AcquireInFlight(a.mb, local);
  const math::Matrix& y = stage.Forward(std::move(x), &f->state);
  f->out_rows = y.rows();
  f->out_cols = y.cols();
  if (last) {
    f->dpred.resize(y.rows(), y.cols());
    const double loss = model_->loss().LossAndGrad(math::AsConstMap(y), math::AsConstMap(target),
                                                   loss_scale, math::AsMap(f->dpred));
    report->microbatch_losses[a.mb] = static_cast<float>(loss);
  } else {
    // The output is not needed here any more (model::MicrobatchState): hand it over.
    sender_->Send(TensorKey{step, a.mb, a.chunk + 1, TensorKind::kActivation},
                  std::move(f->state.inputs.back()));
  }
  return absl::OkStatus();
}

absl::StatusOr<EvalReport> StepExecutor::RunForward(int64_t first_step,
                                                    const std::vector<int64_t>& microbatch_rows,
                                                    int per_step) {
  if (phase_ != Phase::kIdle) {
    return absl::FailedPreconditionError(absl::StrCat("evaluation ", first_step, ": the last step ",
                                                      phase_ == Phase::kAwaitingCommit
                                                          ? "awaits Commit or Abort"
                                                          : "failed and was not aborted"));
  }
  if (microbatch_rows.empty() || per_step < 1) {
    return absl::InvalidArgumentError(absl::StrCat("evaluation ", first_step, ": ",
                                                   microbatch_rows.size(), " micro-batches, ",
                                                   per_step, " per step"));
  }
  const int64_t per_sample = model_->tokens_per_sample();
  for (size_t mb = 0; mb < microbatch_rows.size(); ++mb) {
    if (microbatch_rows[mb] < 1 || microbatch_rows[mb] % per_sample != 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("evaluation ", first_step, ": micro-batch ", mb, " has ",
                       microbatch_rows[mb], " rows, not whole samples of ", per_sample, " rows"));
    }
  }
  ApplyPendingUpdate();
  EvalReport report;
  report.step = first_step;
  if (HoldsDownLast()) {
    report.loss_sums.assign(microbatch_rows.size(), 0.0);
    report.correct.assign(microbatch_rows.size(), 0);
  }
  for (size_t local = 0; local < chunks_.size(); ++local) {
    if (!routes_.IsDown(chunks_[local].chunk)) continue;  // evaluation runs down only.
    for (size_t mb = 0; mb < microbatch_rows.size(); ++mb) {
      const absl::Status s = ForwardOnly(first_step, static_cast<int>(mb), per_step,
                                         static_cast<int>(local), microbatch_rows[mb], &report);
      if (!s.ok()) {
        return WithContext(s, absl::StrCat("evaluation ", first_step, " F(mb=", mb,
                                           ", chunk=", chunks_[local].chunk, ")"));
      }
    }
  }
  return report;
}

absl::Status StepExecutor::ForwardOnly(int64_t first_step, int mb, int per_step, int local,
                                       int64_t rows, EvalReport* report) {
  const model::Stage& stage = chunks_[local].stage;
  const int chunk = chunks_[local].chunk;
  const bool first = routes_.IsFirst(chunk);
  const bool last = routes_.IsLast(chunk);
  const TensorKey in_key = wire::EvalKey(first_step, mb, per_step, chunk,
                                         first ? TensorKind::kInput : TensorKind::kActivation);
  PT_ASSIGN_OR_RETURN(math::Matrix x,
                      TakeChecked(in_key, rows, model_->layer(stage.first_layer()).in_features()));
  math::Matrix target;
  if (last) {
    const TensorKey target_key =
        wire::EvalKey(first_step, mb, per_step, chunk, TensorKind::kTarget);
    PT_ASSIGN_OR_RETURN(target, TakeChecked(target_key, rows, model_->target_features()));
    if (absl::Status s =
            model_->loss().CheckTargets(math::AsConstMap(target), model_->output_features());
        !s.ok()) {
      return WithContext(s, target_key.ToString());
    }
  }
  model::MicrobatchState state;  // dropped when this F returns: nothing is stashed.
  const math::Matrix& y = stage.Forward(std::move(x), &state);
  if (!last) {
    sender_->Send(wire::EvalKey(first_step, mb, per_step, chunk + 1, TensorKind::kActivation),
                  std::move(state.inputs.back()));
    return absl::OkStatus();
  }
  // As ReferenceTrainer::Evaluate: the loss with scale 1 (its gradient is not used) and the count.
  math::Matrix dpred(y.rows(), y.cols());
  report->loss_sums[mb] = model_->loss().LossAndGrad(math::AsConstMap(y), math::AsConstMap(target),
                                                     1.0, math::AsMap(dpred));
  report->correct[mb] = model_->loss().CountCorrect(math::AsConstMap(y), math::AsConstMap(target));
  return absl::OkStatus();
}

absl::Status StepExecutor::InputGrad(int64_t step, const Action& a, int local,
                                     Clock::time_point* ready) {
  InFlight* f = FindInFlight(a.mb, local);
  if (f == nullptr || !f->state.forward_done) {
    return absl::FailedPreconditionError("no forward state for this micro-batch and chunk");
  }
  if (f->input_grad_done) {
    return absl::FailedPreconditionError("the input gradient was already computed");
  }
  model::Stage& stage = chunks_[local].stage;
  const bool last = routes_.IsLast(a.chunk);
  const bool first = routes_.IsFirst(a.chunk);
  math::Matrix dy;
  if (!last) {
    PT_ASSIGN_OR_RETURN(dy, TakeChecked(TensorKey{step, a.mb, a.chunk, TensorKind::kGradient},
                                        f->out_rows, f->out_cols));
  }
  *ready = Clock::now();
  stage.BackwardInput(last ? std::move(f->dpred) : std::move(dy),
                      /*need_input_grad=*/!first, &f->state);
  if (!first) {
    // dL/dx is not read by W (model::MicrobatchState): hand it over.
    sender_->Send(TensorKey{step, a.mb, a.chunk - 1, TensorKind::kGradient},
                  std::move(f->state.grads[0]));
  }
  f->dpred.resize(0, 0);
  f->input_grad_done = true;
  return absl::OkStatus();
}

absl::Status StepExecutor::WeightGrad(const Action& a, int local) {
  InFlight* f = FindInFlight(a.mb, local);
  if (f == nullptr || !f->input_grad_done) {
    return absl::FailedPreconditionError("no input gradient state for this micro-batch and chunk");
  }
  model::Stage& stage = chunks_[local].stage;
  const int64_t microbatch = grad_share_lo_ + a.mb;  // the step's number.
  if (reducer_ != nullptr) {
    // Replicas or two copies: a chunk's gradients are final after its last W; its reduction
    // starts at once and runs beside the actions that follow. Norms are taken after it.
    PT_RETURN_IF_ERROR(stage.BackwardWeightAt(microbatch, &f->state, nullptr));
    ReleaseInFlight(a.mb, local);
    if (++weight_grads_done_[local] == weight_grads_due_[local]) {
      std::vector<float> flat;
      stage.CopyGradsTo(&flat);  // adds the chunk's deferred W first.
      const int chunk = chunks_[local].chunk;
      PT_RETURN_IF_ERROR(reducer_->Submit(
          routes_.two_copies()
              ? ReductionGroup::Copies(routes_.StageOf(chunk), chunk, routes_.OtherCopy(chunk),
                                       routes_.IsDown(chunk))
              : ReductionGroup::Replicas(chunk, options_.replica, options_.replicas),
          std::move(flat)));
    }
    return absl::OkStatus();
  }
  // The stages may defer weight gradients (model::Stage::BackwardWeight). A chunk whose W are
  // done while another chunk of this worker still has W to run keeps its deferred ones until
  // the worker's last W, so that adding them does not delay its later actions on the step's
  // critical path.
  ++weight_grads_done_[local];
  bool all_done = true;
  for (size_t c = 0; c < weight_grads_done_.size(); ++c) {
    all_done = all_done && weight_grads_done_[c] == weight_grads_due_[c];
  }
  auto norms = [&](size_t chunk) { return take_norms_ ? &chunk_norms_[chunk] : nullptr; };
  PT_RETURN_IF_ERROR(
      stage.BackwardWeightAt(microbatch, &f->state, all_done ? norms(local) : nullptr));
  if (all_done) {
    // Every deferred weight gradient is added now, in this action, with or without norms: the
    // step's gradients are complete when it reports done.
    if (!take_norms_) stage.AddDeferredWeightGrads(nullptr);
    for (size_t other = 0; other < chunks_.size(); ++other) {
      if (static_cast<int>(other) != local) {
        chunks_[other].stage.AddDeferredWeightGrads(norms(other));
      }
    }
  }
  ReleaseInFlight(a.mb, local);
  return absl::OkStatus();
}

absl::Status StepExecutor::ApplyReducedSums(int64_t step, StepReport* report) {
  absl::StatusOr<std::map<int, std::vector<float>>> sums = reducer_->Finish();
  const ReplicaReduceStats stats = reducer_->stats();
  report->replica_bytes_sent = stats.bytes_sent;
  report->replica_reduce_time = stats.busy;
  if (!sums.ok()) return sums.status();
  for (size_t local = 0; local < chunks_.size(); ++local) {
    model::Stage& stage = chunks_[local].stage;
    auto it = sums->find(chunks_[local].chunk);
    if (it == sums->end()) {
      return absl::InternalError(absl::StrCat("step ", step, ": chunk ", chunks_[local].chunk,
                                              " has no reduced gradients"));
    }
    PT_RETURN_IF_ERROR(stage.SetGradsFrom(it->second));
    // The sum's norms, bit for bit what the reference's whole-batch gradients give (with two
    // copies ReportNorms takes the down copies' after the tied exchange).
    if (take_norms_ && !routes_.two_copies()) chunk_norms_[local] = stage.GradNormSqPerLayer();
  }
  return absl::OkStatus();
}

absl::Status StepExecutor::ExchangeTiedGradients(int64_t step, ExchangeTransport* transport) {
  if (!model_->tie().has_value()) return absl::OkStatus();
  const int last = num_chunks_ - 1;
  int e = local_of_chunk_[0];
  int h = local_of_chunk_[last];
  if (routes_.two_copies()) {
    // After the copies' sum the up copy's embedding (chunk S) and the down copy's head (chunk
    // S-1) hold the whole step's parts too, and they are on one rank: each rank with an end has
    // both (rank 0: chunks 0 and 2S-1; rank S-1: chunks S and S-1) and sums them itself.
    if (e < 0) e = local_of_chunk_[routes_.copy_chunks()];
    if (h < 0) h = local_of_chunk_[routes_.copy_chunks() - 1];
  }
  if (e < 0 && h < 0) return absl::OkStatus();
  using model::TieEnd;
  absl::StatusOr<math::Tensor> sum;
  if (e >= 0 && h >= 0) {
    PT_ASSIGN_OR_RETURN(const math::Tensor embedding_part,
                        chunks_[e].stage.TiedGradPart(TieEnd::kEmbedding));
    PT_ASSIGN_OR_RETURN(const math::Tensor head_part, chunks_[h].stage.TiedGradPart(TieEnd::kHead));
    sum = model::SumTiedGradients(embedding_part, head_part);
  } else {
    // One end here, the other on a peer: send ours to the owner of the other end's chunk.
    const bool embedding = e >= 0;
    PT_ASSIGN_OR_RETURN(const math::Tensor part,
                        chunks_[embedding ? e : h].stage.TiedGradPart(embedding ? TieEnd::kEmbedding
                                                                                : TieEnd::kHead));
    sum =
        SumWithPeer(transport, TensorKey{step, 0, embedding ? last : 0, TensorKind::kTiedGradient},
                    TensorKey{step, 0, embedding ? 0 : last, TensorKind::kTiedGradient}, part,
                    /*mine_is_lower=*/embedding);
  }
  if (!sum.ok()) return WithContext(sum.status(), absl::StrCat("step ", step, ": tied embedding"));
  for (const auto& [local, end] : {std::pair(e, TieEnd::kEmbedding), std::pair(h, TieEnd::kHead)}) {
    if (local < 0) continue;
    model::Stage& stage = chunks_[local].stage;
    PT_ASSIGN_OR_RETURN(const double norm_sq, stage.SetTiedGrad(end, *sum));
    const int64_t layer =
        end == TieEnd::kEmbedding ? model_->tie()->embedding_layer : model_->tie()->head_layer;
    std::vector<double>& norms = chunk_norms_[local];
    const size_t k = static_cast<size_t>(layer - stage.first_layer());
    if (take_norms_ && k < norms.size()) norms[k] = norm_sq;
  }
  return absl::OkStatus();
}

absl::Status StepExecutor::CheckCommit(int64_t optimizer_step, float clip_scale) const {
  if (phase_ != Phase::kAwaitingCommit) {
    return absl::FailedPreconditionError(
        "Commit without a successful step awaiting it (step failed, aborted or committed)");
  }
  if (optimizer_step < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("optimizer step must be >= 1, got ", optimizer_step));
  }
  if (!std::isfinite(clip_scale) || clip_scale <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("clip scale must be finite and > 0, got ", clip_scale));
  }
  return absl::OkStatus();
}

absl::Status StepExecutor::Commit(int64_t optimizer_step, float clip_scale, bool defer) {
  PT_RETURN_IF_ERROR(CheckCommit(optimizer_step, clip_scale));
  pending_update_.emplace(optimizer_step, clip_scale);
  phase_ = Phase::kIdle;
  if (!defer) ApplyPendingUpdate();
  return absl::OkStatus();
}

void StepExecutor::ApplyPendingUpdate() {
  if (!pending_update_.has_value()) return;
  const Clock::time_point start = Clock::now();
  // The optimizer leaves the gradients zero, so the next RunStep need not clear them.
  for (OwnedChunk& c : chunks_) {
    c.stage.ApplyOptimizer(pending_update_->first, pending_update_->second);
  }
  pending_update_.reset();
  unreported_update_time_ += absl::FromChrono(Clock::now() - start);
}

void StepExecutor::Abort() {
  ApplyPendingUpdate();  // a committed step stands; only the current one is discarded.
  DiscardInFlight();
  EndDecode();
  for (OwnedChunk& c : chunks_) c.stage.ZeroGrads();
  phase_ = Phase::kIdle;
}

std::vector<LayerNormSq> StepExecutor::GradNormSqPerLayer() {
  ApplyPendingUpdate();
  std::vector<LayerNormSq> out;
  for (OwnedChunk& c : chunks_) {
    const std::vector<double> norms = c.stage.GradNormSqPerLayer();
    for (size_t k = 0; k < norms.size(); ++k) {
      out.push_back(LayerNormSq{c.stage.first_layer() + static_cast<int64_t>(k), norms[k]});
    }
  }
  return out;
}

std::map<std::string, math::Tensor> StepExecutor::ExportState() {
  ApplyPendingUpdate();
  std::map<std::string, math::Tensor> out;
  for (const OwnedChunk& c : chunks_) out.merge(c.stage.ExportState());
  return out;
}

}  // namespace pipetrain::worker
