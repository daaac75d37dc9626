#include "server/coordinator/step_run.h"

#include <algorithm>
#include <optional>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/math/optimizer.h"
#include "common/model/reference_trainer.h"
#include "common/schedule/simulator.h"
#include "common/util/annotate.h"
#include "common/util/status_macros.h"
#include "common/wire/tensor_key.h"
#include "pipetrain/v1/worker_control.pb.h"
#include "server/coordinator/step_timeline.h"

namespace pipetrain::coordinator {
namespace {

// Step counts stay below 2^53, as in checkpoints (whose counters are JSON numbers).
constexpr int64_t kMaxStep = int64_t{1} << 53;

}  // namespace

absl::StatusOr<v1::StepResult> CoordinatorCore::TrainStep(
    const v1::TrainRequest& request, const std::function<bool()>& next_queued) {
  // A step boundary: a job with room to grow grows onto idle workers first (job_growth.cc).
  const std::optional<v1::ShapeChange> change = MaybeGrow(request.job());
  StepRun run(*this, request, next_queued);
  absl::StatusOr<v1::StepResult> result = run.Run();
  if (result.ok() && change.has_value()) *result->mutable_shape_change() = *change;
  return result;
}

absl::StatusOr<v1::StepResult> StepRun::Run() {
  PT_RETURN_IF_ERROR(Admit());
  phase_ = Phase::kFeed;
  const absl::Status feed = Feed();
  absl::MutexLock lock(&core_.mu_);
  job_->mu.AssertHeld();
  phase_ = Phase::kRun;
  PT_RETURN_IF_ERROR(Start(feed));  // a failed start has ended the step already.
  phase_ = Phase::kAwait;
  if (absl::Status waited = AwaitReports(); !waited.ok()) return Fail(waited);
  phase_ = Phase::kReduce;
  v1::StepResult result;
  absl::StatusOr<float> clip = Reduce(&result);
  if (!clip.ok()) return Fail(clip.status());
  phase_ = Phase::kCommit;
  PT_RETURN_IF_ERROR(Commit(*clip));
  phase_ = Phase::kDone;
  Finish(&result);
  return result;
}

absl::Status StepRun::Admit() {
  std::shared_ptr<const model::Model> net;
  int microbatches = 0;
  {
    absl::MutexLock lock(&core_.mu_);
    if (core_.shutting_down_) return absl::CancelledError("coordinator shutting down");
    PT_ASSIGN_OR_RETURN(job_, core_.ReadyJob(request_.job()));
    job_->mu.AssertHeld();
    net = job_->model;
    microbatches = job_->spec.microbatches();
  }
  // The batch is checked before any worker hears of it (no lock: pure compute).
  PT_ASSIGN_OR_RETURN(batch_, SplitBatch(request_, *net, microbatches));
  absl::MutexLock lock(&core_.mu_);
  job_->mu.AssertHeld();
  return AdmitJob();
}

absl::Status StepRun::AdmitJob() {
  PT_RETURN_IF_ERROR(CheckReady(*job_));
  deadline_ = Deadline();
  PT_RETURN_IF_ERROR(AwaitAbortedRuns());
  // Steps are numbered from 1: this batch is step steps_done + 1 (docs/glossary.md).
  const int64_t done = job_->steps_done;
  step_ = done + 1;
  if (request_.has_expected_steps_done() &&
      (request_.expected_steps_done() < 0 || request_.expected_steps_done() >= kMaxStep)) {
    return absl::InvalidArgumentError(absl::StrCat("expected_steps_done must be in [0, 2^53), got ",
                                                   request_.expected_steps_done()));
  }
  if (request_.has_expected_steps_done() && request_.expected_steps_done() != done) {
    // The job is not where the client thinks: a recovery restored it between two steps (the
    // client replays from step done + 1), or the batch was applied already.
    const std::string where =
        absl::StrCat("job '", job_->id, "' has done ", done, " steps; this batch is for step ",
                     request_.expected_steps_done() + 1);
    if (request_.expected_steps_done() > done) {
      return absl::AbortedError(absl::StrCat(where, ": it was restored from its last checkpoint (",
                                             job_->recoveries.size(),
                                             " recoveries); replay from step ", step_));
    }
    return absl::FailedPreconditionError(absl::StrCat(where, ", which it has applied"));
  }
  PT_RETURN_IF_ERROR(CheckClaimCurrent(*job_));
  generation_ = job_->generation;
  job_->op.step = step_;
  job_->op.error = absl::OkStatus();
  job_->op.reports.assign(job_->workers.size(), std::nullopt);
  job_->state = JobState::kTraining;
  feeds_.clear();
  for (int q = 0; q < ShapeOf(job_->spec).replicas; ++q) {
    feeds_.push_back(core_.FeedTargets(*job_, q));
  }
  return absl::OkStatus();
}

absl::Status StepRun::AwaitAbortedRuns() {
  if (job_->op.UnansweredRanks().empty()) return absl::OkStatus();
  job_->op.error = absl::OkStatus();
  PT_RETURN_IF_ERROR(core_.AwaitOp(
      *job_,
      [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(job_->mu) {
        return job_->state != JobState::kReady || job_->op.UnansweredRanks().empty();
      },
      deadline_, "the answers to an aborted step",
      [this](absl::Duration waited) ABSL_EXCLUSIVE_LOCKS_REQUIRED(job_->mu) {
        core_.Log(absl::StrCat("job ", job_->id, ": waiting for ",
                               CoordinatorCore::RankLabels(*job_, job_->op.UnansweredRanks()),
                               " to answer an aborted step before the next batch goes out, for ",
                               absl::ToInt64Seconds(waited), " s"),
                  logging::LogLevel::kWarning);
      }));
  return CheckReady(*job_);
}

absl::Status StepRun::Feed() {
  // The job's links are its thread's: no lock. Every error names the link, whichever of the
  // link's own report and this send sees the failure first. Replica q gets the step's
  // micro-batches [q M / R, (q + 1) M / R), numbered from 0 within its share, each sent along its
  // route (with two copies of the stages, half of them through the up copy).
  const int share = static_cast<int>(batch_.inputs.size()) / static_cast<int>(feeds_.size());
  for (int q = 0; q < static_cast<int>(feeds_.size()); ++q) {
    const auto& [first, last] = feeds_[q];
    PT_RETURN_IF_ERROR(core_.EnsureFeedLinks(job_, first, last));
    for (int mb = 0; mb < share; ++mb) {
      const int global = q * share + mb;
      const FeedRoute route = RouteOf(first, last, mb);
      for (const bool input : {true, false}) {
        const FeedTarget* target = input ? route.input : route.target;
        const wire::TensorKey key{step_, mb, input ? route.input_chunk : route.target_chunk,
                                  input ? wire::TensorKind::kInput : wire::TensorKind::kTarget};
        const absl::Status sent = job_->links[target->rank]->Send(
            key, input ? batch_.inputs[global] : batch_.targets[global]);
        if (!sent.ok()) {
          return util::Annotate(sent, absl::StrCat("data link to rank ", target->rank));
        }
      }
    }
  }
  return absl::OkStatus();
}

absl::Status StepRun::Start(const absl::Status& feed) {
  // RunStep follows even when the feed failed: the step is then aborted, and each rank's aborted
  // run drops whatever part of the inputs reached it, so a retry of the step in this generation is
  // not refused as a duplicate. Not after a recovery began meanwhile: the new generation fences
  // this one's tensors, and its ranks must not hear of this step.
  const bool run_sent = job_->state == JobState::kTraining && job_->generation == generation_;
  if (run_sent) {
    v1::WorkerCommand command;
    v1::RunStep* run = command.mutable_run_step();
    run->set_job(job_->id);
    run->set_generation(generation_);
    run->set_step(step_);
    run->set_batch_rows(batch_.rows);
    for (int rank = 0; rank < static_cast<int>(job_->workers.size()); ++rank) {
      core_.SendToRank(*job_, rank, command);
      ++job_->op.runs_sent[rank];
    }
  }
  if (!feed.ok()) return Fail(util::Annotate(feed, absl::StrCat("feeding step ", step_)));
  if (!run_sent) {
    // The job left TRAINING while the batch was fed: no worker heard of this step.
    const absl::Status why = CheckReady(*job_);
    return Fail(why.ok() ? absl::AbortedError(absl::StrCat("step ", step_, " of job '", job_->id,
                                                           "' was interrupted"))
                         : why);
  }
  // The previous step's Commit, if it left it to this step: every rank confirmed it before it
  // answers this RunStep (one stream, in order), so this wait overlaps the step's compute.
  if (job_->commit.step >= 0) {
    if (absl::Status confirmed = core_.ConfirmCommit(*job_); !confirmed.ok()) {
      job_->op.step = -1;
      return confirmed;
    }
  }
  return absl::OkStatus();
}

absl::Status StepRun::AwaitReports() {
  absl::Status waited = core_.AwaitOp(
      *job_, [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(job_->mu) { return job_->op.AllReported(); },
      deadline_, absl::StrCat("StepDone of step ", step_),
      [this](absl::Duration waited_so_far) ABSL_EXCLUSIVE_LOCKS_REQUIRED(job_->mu) {
        core_.Log(absl::StrCat("job ", job_->id, " step ", step_, ": waiting for ",
                               CoordinatorCore::RankLabels(*job_, job_->op.RanksWithoutReport()),
                               " for ", absl::ToInt64Seconds(waited_so_far), " s (deadline ",
                               absl::FormatDuration(deadline_), ")"),
                  logging::LogLevel::kWarning);
      });
  if (!absl::IsDeadlineExceeded(waited)) return waited;
  waited = absl::DeadlineExceededError(absl::StrCat(
      waited.message(), " from ", CoordinatorCore::RankLabels(*job_, job_->op.RanksWithoutReport()),
      " (stopped or stuck; the deadline is max(--step-deadline-floor, "
      "--step-deadline-factor x the plan's predicted step time))"));
  core_.Log(std::string(waited.message()), logging::LogLevel::kWarning);
  if (job_->spec.recover() && job_->state == JobState::kTraining) EvictStuckRanks();
  return waited;
}

void StepRun::EvictStuckRanks() {
  // A rank waiting for data answers the Abort at once (its wait is cancelled); a stuck or stopped
  // one does not within loss_grace. The job recovers without the evicted ranks, and what they
  // send later is fenced by the new generation.
  core_.AbortStep(*job_, step_, "the step missed its deadline");
  const absl::Time until = absl::Now() + core_.options_.loss_grace;
  while (!core_.shutting_down_ && job_->state == JobState::kTraining &&
         !job_->op.UnansweredRanks().empty() && absl::Now() < until) {
    core_.WaitUntil(until);
  }
  if (job_->state != JobState::kTraining) return;
  core_.EvictRanks(*job_, job_->op.UnansweredRanks(),
                   absl::StrCat("missed the deadline of step ", step_, " of job ", job_->id, " (",
                                absl::FormatDuration(deadline_), ")"));
}

absl::StatusOr<float> StepRun::Reduce(v1::StepResult* result) {
  // The loss: each micro-batch's from the owner of its route's last chunk (one rank per
  // replica, or with two copies of the stages two), replica by replica (so in the step's
  // micro-batch order), summed in increasing order, as float.
  const int share = static_cast<int>(batch_.inputs.size()) / static_cast<int>(feeds_.size());
  float loss = 0;
  for (const auto& [first, last_target] : feeds_) {
    for (int mb = 0; mb < share; ++mb) {
      const int last_rank = RouteOf(first, last_target, mb).target->rank;
      const v1::StepDone& last = *job_->op.reports[last_rank];
      if (last.microbatch_losses_size() != share) {
        return absl::InternalError(absl::StrCat(PositionLabel(*job_, last_rank), " reported ",
                                                last.microbatch_losses_size(),
                                                " micro-batch losses, expected ", share));
      }
      const float l = last.microbatch_losses(mb);
      loss += l;
      result->add_microbatch_losses(l);
    }
  }
  result->set_loss(loss);
  return ClipScale();
}

absl::StatusOr<float> StepRun::ClipScale() {
  // The global gradient norm: per-layer norms placed by layer, summed in increasing layer order —
  // only when the job clips (nothing else reads it, and workers report it only then). Every
  // replica reports the norms of the reduced gradients: replica 0's are used, the others must
  // agree bit for bit.
  const float clip_norm = job_->spec.optimizer().clip_norm();
  if (!(clip_norm > 0)) return 1.0f;
  const JobShape shape = ShapeOf(job_->spec);
  const int64_t L = job_->model->num_layers();
  std::vector<double> per_layer(L, 0.0);
  std::vector<bool> seen(L, false);
  for (int rank = 0; rank < shape.stages; ++rank) {
    for (const v1::LayerNormSq& n : job_->op.reports[rank]->grad_norms()) {
      if (n.layer() < 0 || n.layer() >= L || seen[n.layer()]) {
        return absl::InternalError(
            absl::StrCat(PositionLabel(*job_, rank), " reported layer ", n.layer(),
                         n.layer() >= 0 && n.layer() < L ? " twice" : " out of range"));
      }
      seen[n.layer()] = true;
      per_layer[n.layer()] = n.norm_sq();
    }
  }
  for (int64_t l = 0; l < L; ++l) {
    if (!seen[l]) {
      return absl::InternalError(absl::StrCat("no worker reported the gradient norm of layer ", l));
    }
  }
  for (int p = shape.stages; p < shape.positions(); ++p) {
    const auto& mine = job_->op.reports[p]->grad_norms();
    const auto& first = job_->op.reports[shape.RankOf(p)]->grad_norms();
    bool same = mine.size() == first.size();
    for (int i = 0; same && i < mine.size(); ++i) {
      same = mine[i].layer() == first[i].layer() && mine[i].norm_sq() == first[i].norm_sq();
    }
    if (!same) {
      return absl::InternalError(absl::StrCat(
          PositionLabel(*job_, p), " reported gradient norms that differ from replica 0's: the ",
          "replicas' gradients were not reduced to the same bits"));
    }
  }
  return math::ClipScale(model::SumLayerNormSq(per_layer), clip_norm);
}

absl::Status StepRun::Commit(float clip) {
  v1::WorkerCommand command;
  v1::Commit* commit = command.mutable_commit();
  commit->set_job(job_->id);
  commit->set_generation(generation_);
  commit->set_step(step_);
  commit->set_clip_scale(clip);
  core_.SendToRanks(*job_, command);
  job_->commit.step = step_;
  job_->commit.committed.assign(job_->workers.size(), false);
  job_->commit.refusal = absl::OkStatus();
  job_->commit.timeout = deadline_;
  job_->commit.deadline = absl::Now() + deadline_;
  if (next_queued_()) return absl::OkStatus();  // the next step confirms it.
  // Nothing behind this step to confirm it: confirm it now, so that what the client hears next
  // (this result, a Finish) comes after every rank applied it.
  if (absl::Status confirmed = core_.ConfirmCommit(*job_); !confirmed.ok()) {
    job_->op.step = -1;
    return confirmed;
  }
  return absl::OkStatus();
}

void StepRun::Finish(v1::StepResult* result) {
  job_->steps_done = step_;
  job_->state = JobState::kReady;
  job_->op.step = -1;
  // Timelines: measured (compute intervals, in ms) and the simulator's replay of the same costs.
  result->set_step(step_);
  result->set_step_ms(absl::ToDoubleMilliseconds(absl::Now() - start_));
  // Replica 0's timeline: every replica runs the same plan.
  std::vector<const v1::StepDone*> reports;
  for (int rank = 0; rank < ShapeOf(job_->spec).stages; ++rank) {
    reports.push_back(&*job_->op.reports[rank]);
  }
  FillStepTimeline(job_->plan, reports, result);
  core_.RecordStepMetrics(job_->id, batch_.samples, *result);
  core_.RecordStepCommitted(*job_, batch_.samples, *result);
  core_.Log(
      absl::StrFormat("job %s step %d applied: loss %.9g, %.3f ms, bubble %.3f (predicted %.3f)",
                      job_->id, result->step(), result->loss(), result->step_ms(),
                      result->bubble_fraction(), result->predicted_bubble_fraction()));
}

absl::Status StepRun::Fail(absl::Status status) {
  // A transport failure often reaches us (a neighbour's link error, our feed) before the lost
  // worker's broken Join stream does: a recoverable job waits a moment for that, so the client
  // hears "recovering" (ABORTED) and replays instead of giving up.
  if (IsTransportFailure(status) && job_->spec.recover() && job_->state == JobState::kTraining) {
    const absl::Time until = absl::Now() + core_.options_.loss_grace;
    while (job_->state == JobState::kTraining && !core_.shutting_down_ && absl::Now() < until) {
      core_.WaitUntil(until);
    }
  }
  // Recovering (noticed now or before): the step will be replayed, whatever failed it.
  if (job_->state == JobState::kRecovering) status = CheckReady(*job_);
  if (job_->state == JobState::kTraining) {
    core_.AbortStep(*job_, step_, status.ToString());
    job_->state = JobState::kReady;
  }
  job_->op.step = -1;
  return status;
}

absl::Duration StepRun::Deadline() const {
  // Chunk FLOPs for this step's micro-batches, worker speeds in FLOP/s: the simulated step.
  const int C = job_->plan.num_chunks();
  std::vector<schedule::OpCosts> flops(C, schedule::OpCosts{0, 0, 0, 0});
  for (const v1::ChunkSpec& c : job_->chunks) {
    if (c.chunk() < 0 || c.chunk() >= C) continue;
    for (int64_t l = c.first_layer(); l < c.last_layer(); ++l) {
      const math::FlopCount f = job_->model->layer(l).Flops(std::max<int64_t>(batch_.mb_rows, 1));
      schedule::OpCosts& o = flops[c.chunk()];
      o.f += f.forward;
      o.i += f.backward_input;
      o.w += f.backward_weight;
      o.b += f.backward_input + f.backward_weight;
    }
  }
  std::vector<double> speeds;  // by position, then each rank's slowest replica.
  for (const std::string& name : job_->workers) {
    const WorkerRecord* w = core_.workers_.Find(name);
    speeds.push_back(w == nullptr ? 1e9 : w->info.gflops() * 1e9);
  }
  speeds = RankSpeeds(speeds, ShapeOf(job_->spec));
  double predicted_s = 0;
  absl::StatusOr<schedule::CostModel> costs =
      schedule::CostModelFromFlops(job_->plan.placement, flops, speeds);
  if (costs.ok()) {
    absl::StatusOr<schedule::SimulationResult> sim = schedule::Simulate(job_->plan, *costs);
    if (sim.ok()) predicted_s = sim->stats.makespan;
  }
  return std::max(core_.options_.step_deadline_floor,
                  absl::Seconds(predicted_s * core_.options_.step_deadline_factor));
}

}  // namespace pipetrain::coordinator
