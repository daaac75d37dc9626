#include "server/coordinator/eval_run.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/model/reference_trainer.h"
#include "common/util/annotate.h"
#include "common/util/status_macros.h"
#include "common/wire/tensor_key.h"
#include "pipetrain/v1/worker_control.pb.h"
#include "server/coordinator/step_batch.h"

namespace pipetrain::coordinator {

absl::StatusOr<EvalBatch> SplitEvalBatch(const v1::EvaluateRequest& request,
                                         const model::Model& net) {
  if (request.samples() <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("Evaluate: samples must be >= 1, got ", request.samples()));
  }
  if (request.chunk_samples() < 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "Evaluate: chunk_samples must be >= 0 (0: the default), got ", request.chunk_samples()));
  }
  const int64_t chunk = model::EvalChunkSamples(
      net, request.chunk_samples() == 0 ? kDefaultEvalChunkSamples : request.chunk_samples());
  const int64_t chunks = (request.samples() + chunk - 1) / chunk;
  if (chunks > kMaxEvalChunks) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "Evaluate: ", request.samples(), " samples make ", chunks, " chunks of ", chunk,
        ", more than the ", kMaxEvalChunks, " one request may hold: send fewer samples"));
  }
  PT_ASSIGN_OR_RETURN(math::Matrix inputs, DenseTensorToMatrix(request.inputs(), "inputs"));
  PT_ASSIGN_OR_RETURN(math::Matrix targets, DenseTensorToMatrix(request.targets(), "targets"));
  if (request.samples() > inputs.rows()) {  // every sample has at least one row.
    return absl::InvalidArgumentError(
        absl::StrCat(request.samples(), " samples cannot fit in ", inputs.rows(), " input rows"));
  }
  PT_RETURN_IF_ERROR(
      net.ValidateBatch(math::AsConstMap(inputs), math::AsConstMap(targets), request.samples()));
  EvalBatch batch;
  batch.samples = request.samples();
  batch.chunk_samples = chunk;
  const int64_t per_sample = inputs.rows() / request.samples();
  for (int64_t begin = 0; begin < batch.samples; begin += chunk) {
    const int64_t rows = std::min(chunk, batch.samples - begin) * per_sample;
    batch.rows.push_back(rows);
    batch.inputs.push_back(
        std::make_shared<const math::Matrix>(inputs.middleRows(begin * per_sample, rows)));
    batch.targets.push_back(
        std::make_shared<const math::Matrix>(targets.middleRows(begin * per_sample, rows)));
  }
  return batch;
}

absl::StatusOr<v1::EvaluateResult> CoordinatorCore::Evaluate(const v1::EvaluateRequest& request) {
  EvalRun run(*this, request);
  return run.Run();
}

absl::StatusOr<v1::EvaluateResult> EvalRun::Run() {
  PT_RETURN_IF_ERROR(Admit());
  const absl::Status feed = Feed();
  absl::MutexLock lock(&core_.mu_);
  job_->mu.AssertHeld();
  PT_RETURN_IF_ERROR(Start(feed));  // a failed start has ended the run already.
  if (absl::Status waited = Await(); !waited.ok()) return Fail(waited);
  return Reduce();
}

absl::Status EvalRun::Admit() {
  std::shared_ptr<const model::Model> net;
  {
    absl::MutexLock lock(&core_.mu_);
    if (core_.shutting_down_) return absl::CancelledError("coordinator shutting down");
    PT_ASSIGN_OR_RETURN(job_, core_.ReadyJob(request_.job()));
    job_->mu.AssertHeld();
    net = job_->model;
  }
  // The samples are checked before any worker hears of them (no lock: pure compute).
  PT_ASSIGN_OR_RETURN(batch_, SplitEvalBatch(request_, *net));
  absl::MutexLock lock(&core_.mu_);
  job_->mu.AssertHeld();
  return AdmitJob();
}

absl::Status EvalRun::AdmitJob() {
  PT_RETURN_IF_ERROR(CheckReady(*job_));
  PT_RETURN_IF_ERROR(CheckClaimCurrent(*job_));
  core_.RestartLease(*job_);  // a client's call for the job, as a Checkpoint is.
  deadline_ = Deadline();
  // Every run a rank was sent is answered (an aborted step's answer may trail its failure), so
  // that the answer counted next is this run's.
  if (!job_->op.UnansweredRanks().empty()) {
    job_->op.error = absl::OkStatus();
    PT_RETURN_IF_ERROR(core_.AwaitOp(
        *job_,
        [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(job_->mu) {
          return job_->state != JobState::kReady || job_->op.UnansweredRanks().empty();
        },
        deadline_, "the answers to an aborted step"));
    PT_RETURN_IF_ERROR(CheckReady(*job_));
  }
  // The weights evaluated are those of the last step on every rank.
  PT_RETURN_IF_ERROR(core_.ConfirmCommit(*job_));
  // Replica 0 runs it (every replica holds the same weights), in its own share's numbering.
  per_step_ = std::max(1, job::MicrobatchesPerReplica(job_->spec));
  step_ = kEvalStepBase + job_->eval_runs;
  job_->eval_runs += wire::EvalSteps(static_cast<int64_t>(batch_.rows.size()), per_step_);
  generation_ = job_->generation;
  job_->op.step = step_;
  job_->op.error = absl::OkStatus();
  job_->op.evals.assign(ShapeOf(job_->spec).stages, std::nullopt);
  job_->state = JobState::kTraining;
  feed_ = core_.FeedTargets(*job_);
  return absl::OkStatus();
}

absl::Status EvalRun::Feed() {
  // The job's links are its thread's: no lock.
  PT_RETURN_IF_ERROR(core_.EnsureFeedLinks(job_, feed_.first, feed_.second));
  // Evaluation runs through one copy of the stages (the down copy, under dualpipe).
  const int last_chunk = feed_.first.copy_chunks - 1;
  for (int mb = 0; mb < static_cast<int>(batch_.inputs.size()); ++mb) {
    for (const bool input : {true, false}) {
      const FeedTarget& target = input ? feed_.first : feed_.second;
      const wire::TensorKey key =
          wire::EvalKey(step_, mb, per_step_, input ? 0 : last_chunk,
                        input ? wire::TensorKind::kInput : wire::TensorKind::kTarget);
      const absl::Status sent =
          job_->links[target.rank]->Send(key, input ? batch_.inputs[mb] : batch_.targets[mb]);
      if (!sent.ok()) {
        return util::Annotate(sent, absl::StrCat("data link to rank ", target.rank));
      }
    }
  }
  return absl::OkStatus();
}

absl::Status EvalRun::Start(const absl::Status& feed) {
  // EvalRun follows even when the feed failed, as RunStep does: the run is then aborted on every
  // rank, which drops what reached it. Not after a recovery began meanwhile.
  const bool run_sent = job_->state == JobState::kTraining && job_->generation == generation_;
  if (run_sent) {
    v1::WorkerCommand command;
    v1::EvalRun* run = command.mutable_eval_run();
    run->set_job(job_->id);
    run->set_generation(generation_);
    run->set_step(step_);
    for (int64_t rows : batch_.rows) run->add_microbatch_rows(rows);
    for (int rank = 0; rank < ShapeOf(job_->spec).stages; ++rank) {
      core_.SendToRank(*job_, rank, command);
      ++job_->op.runs_sent[rank];
    }
  }
  if (!feed.ok()) return Fail(util::Annotate(feed, "feeding the evaluation"));
  if (!run_sent) {
    const absl::Status why = CheckReady(*job_);
    return Fail(why.ok() ? absl::AbortedError(absl::StrCat("the evaluation of job '", job_->id,
                                                           "' was interrupted"))
                         : why);
  }
  return absl::OkStatus();
}

absl::Status EvalRun::Await() {
  auto answered = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(job_->mu) {
    for (const auto& e : job_->op.evals) {
      if (!e.has_value()) return false;
    }
    return true;
  };
  absl::Status waited = core_.AwaitOp(*job_, answered, deadline_, "EvalDone of the evaluation");
  if (!absl::IsDeadlineExceeded(waited)) return waited;
  std::vector<int> missing;
  for (int rank = 0; rank < static_cast<int>(job_->op.evals.size()); ++rank) {
    if (!job_->op.evals[rank].has_value()) missing.push_back(rank);
  }
  return absl::DeadlineExceededError(
      absl::StrCat(waited.message(), " from ", CoordinatorCore::RankLabels(*job_, missing)));
}

absl::StatusOr<v1::EvaluateResult> EvalRun::Reduce() {
  const int last_rank = feed_.second.rank;
  const v1::EvalDone& last = *job_->op.evals[last_rank];
  const int chunks = static_cast<int>(batch_.rows.size());
  if (last.loss_sums_size() != chunks || last.correct_size() != chunks) {
    return Fail(absl::InternalError(absl::StrCat(
        WorkerLabel(job_->workers[last_rank], last_rank), " reported ", last.loss_sums_size(),
        " losses and ", last.correct_size(), " counts for ", chunks, " evaluation chunks")));
  }
  v1::EvaluateResult result;
  result.set_step(job_->steps_done);
  result.set_chunk_samples(batch_.chunk_samples);
  const int64_t per_sample = job_->model->tokens_per_sample();
  double loss_sum = 0;  // folded in chunk order, as ReferenceTrainer::Evaluate folds it.
  for (int c = 0; c < chunks; ++c) {
    v1::EvaluateChunk* chunk = result.add_chunks();
    chunk->set_samples(batch_.rows[c] / per_sample);
    chunk->set_rows(batch_.rows[c]);
    chunk->set_loss_sum(last.loss_sums(c));
    chunk->set_correct(last.correct(c));
    loss_sum += last.loss_sums(c);
    result.set_rows(result.rows() + batch_.rows[c]);
    result.set_correct(result.correct() + last.correct(c));
  }
  result.set_samples(batch_.samples);
  result.set_loss(loss_sum / static_cast<double>(result.rows()));
  result.set_accuracy(static_cast<double>(result.correct()) / static_cast<double>(result.rows()));
  result.set_eval_ms(absl::ToDoubleMilliseconds(absl::Now() - start_));
  job_->state = JobState::kReady;
  job_->op.step = -1;
  job_->op.evals.clear();
  core_.Log(absl::StrFormat(
      "job %s step %d evaluated: %d samples, loss %.9g, accuracy %.4f, %.3f ms", job_->id,
      result.step(), result.samples(), result.loss(), result.accuracy(), result.eval_ms()));
  return result;
}

absl::Status EvalRun::Fail(absl::Status status) {
  return core_.FailForwardRun(*job_, step_, std::move(status));
}

absl::Status CoordinatorCore::FailForwardRun(Job& job, int64_t step, absl::Status status) {
  // As StepRun::Fail: a recoverable job's transport failure waits a moment for the lost worker
  // to be noticed, so the client hears "recovering" (ABORTED).
  if (IsTransportFailure(status) && job.spec.recover() && job.state == JobState::kTraining) {
    const absl::Time until = absl::Now() + options_.loss_grace;
    while (job.state == JobState::kTraining && !shutting_down_ && absl::Now() < until) {
      WaitUntil(until);
    }
  }
  if (job.state == JobState::kRecovering) status = CheckReady(job);
  if (job.state == JobState::kTraining) {
    AbortStep(job, step, status.ToString());
    job.state = JobState::kReady;
  }
  job.op.step = -1;
  job.op.evals.clear();
  job.op.gens.clear();
  return status;
}

absl::Duration EvalRun::Deadline() const {
  double flops = 0;
  for (int64_t l = 0; l < job_->model->num_layers(); ++l) {
    flops += job_->model->layer(l).Flops(batch_.rows.front()).forward;
  }
  flops *= static_cast<double>(batch_.rows.size());
  return core_.ForwardRunDeadline(*job_, flops);
}

absl::Duration CoordinatorCore::ForwardRunDeadline(const Job& job, double flops) const {
  double slowest = 0;
  for (const std::string& name : job.workers) {
    const WorkerRecord* w = workers_.Find(name);
    const double speed = w == nullptr ? 1e9 : w->info.gflops() * 1e9;
    slowest = slowest == 0 ? speed : std::min(slowest, speed);
  }
  const double predicted_s = slowest > 0 ? flops / slowest : 0;
  return std::max(options_.step_deadline_floor,
                  absl::Seconds(predicted_s * options_.step_deadline_factor));
}

}  // namespace pipetrain::coordinator
