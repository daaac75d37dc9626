#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/io/confined_path.h"
#include "common/io/file_util.h"
#include "common/math/optimizer.h"
#include "common/model/checkpoint.h"
#include "common/model/optimizer_proto.h"
#include "common/model/reference_trainer.h"
#include "common/net/token_auth.h"
#include "common/partition/partitioner.h"
#include "common/schedule/generator.h"
#include "common/schedule/simulator.h"
#include "common/schedule/timeline.h"
#include "common/schedule/validator.h"
#include "common/util/status_macros.h"
#include "common/wire/grpc_status.h"
#include "common/wire/tensor_key.h"
#include "server/control/control_proto.h"
#include "server/coordinator/coordinator_service.h"
#include "server/coordinator/job_isa.h"
#include "server/coordinator/job_spec.h"
#include "server/coordinator/reactors.h"
#include "server/coordinator/step_timeline.h"
#include "server/metrics/coordinator_metrics.h"

// The coordinator's blocking job operations: creation (admission thread), assignment, training
// steps and checkpoints (each on the job's OpThread).
namespace pipetrain::coordinator {
namespace {

// A failure of the transport (a peer unreachable, a stream cut, a deadline): one that a lost or
// stopped worker causes, as opposed to an error a worker reports about its work.
bool IsTransportFailure(const absl::Status& status) {
  return absl::IsUnavailable(status) || absl::IsAborted(status) || absl::IsCancelled(status) ||
         absl::IsDeadlineExceeded(status);
}

}  // namespace

void CoordinatorService::DoCreateJob(const v1::JobSpec& request,
                                     std::function<void(absl::StatusOr<v1::JobStatus>)> done) {
  v1::JobSpec spec = request;
  absl::StatusOr<CheckedJobSpec> checked = CheckJobSpec(options_.job_limits, &spec);
  if (!checked.ok()) {
    done(checked.status());
    return;
  }
  const std::shared_ptr<const model::Model> net = checked->model;
  const schedule::Plan* const plan = &checked->plan;
  // A checkpoint to start from is verified (every file's checksum) before any worker is taken.
  std::optional<model::CheckpointManifest> resume;
  if (!spec.resume_from().empty()) {
    absl::StatusOr<std::string> confined = CheckpointPath(spec.resume_from(), "resume_from");
    if (!confined.ok()) {
      done(confined.status());
      return;
    }
    spec.set_resume_from(*confined);
    absl::StatusOr<model::CheckpointManifest> manifest =
        model::VerifyCheckpoint(spec.resume_from());
    absl::Status fits = manifest.status();
    if (fits.ok() && manifest->model_spec.SerializeAsString() != net->spec().SerializeAsString()) {
      fits = absl::FailedPreconditionError(absl::StrCat(
          "resume_from ", spec.resume_from(), ": the checkpoint is of another model spec"));
    } else if (fits.ok() && manifest->seed != spec.seed()) {
      fits = absl::FailedPreconditionError(absl::StrCat(
          "resume_from ", spec.resume_from(), ": the checkpoint was trained with seed ",
          manifest->seed, ", the job has seed ", spec.seed()));
    }
    if (!fits.ok()) {
      done(fits);
      return;
    }
    resume = *std::move(manifest);
  }
  const int S = spec.stages();
  std::string id;
  std::vector<double> speeds;
  {
    absl::MutexLock lock(&mu_);
    if (shutting_down_) {
      done(absl::CancelledError("coordinator shutting down"));
      return;
    }
    std::vector<WorkerConn*> idle = IdleWorkers();
    // A job forced to one instruction-set level takes only workers that run it.
    const std::optional<math::Isa> forced = math::IsaFromName(spec.isa());
    if (forced.has_value()) {
      idle.erase(
          std::remove_if(idle.begin(), idle.end(),
                         [&](const WorkerConn* w) { return !WorkerRunsIsa(w->info, *forced); }),
          idle.end());
    }
    int busy = 0;
    for (auto& [name, conn] : workers_) {
      if (conn.reactor != nullptr && !conn.job.empty()) ++busy;
    }
    const int live = static_cast<int>(idle.size());
    if (live < S) {
      done(absl::FailedPreconditionError(absl::StrCat(
          "job needs ", S, " workers", forced.has_value() ? " that run isa " + spec.isa() : "",
          ", ", live, " idle: ", S - live, " missing",
          busy > 0 ? absl::StrCat(" (", busy, " more are busy with other jobs)") : "")));
      return;
    }
    // The one level every rank (and the client's reference) runs.
    std::vector<const v1::RegisterWorker*> ranks;
    for (int rank = 0; rank < S; ++rank) ranks.push_back(&idle[rank]->info);
    absl::StatusOr<math::Isa> isa = ChooseJobIsa(spec, ranks);
    if (!isa.ok()) {
      done(isa.status());
      return;
    }
    spec.set_isa(std::string(math::IsaName(*isa)));
    if (resume.has_value() && resume->isa != spec.isa()) {
      Log(absl::StrCat("job resumes from ", spec.resume_from(), " written at instruction set ",
                       resume->isa.empty() ? "(unrecorded)" : resume->isa, " and runs at ",
                       spec.isa(), ": its bits will differ from a run that stayed on one level"));
    }
    auto job = std::make_unique<Job>();
    id = absl::StrCat(id_prefix_, next_job_++);
    job->id = id;
    for (int rank = 0; rank < S; ++rank) {
      job->workers.push_back(idle[rank]->info.name());
      speeds.push_back(idle[rank]->info.gflops());
      idle[rank]->job = id;
      idle[rank]->rank = rank;
    }
    job->spec = spec;
    job->model = net;
    job->plan = *plan;
    job->assigned.assign(S, false);
    job->runs_sent.assign(S, 0);
    job->runs_answered.assign(S, 0);
    if (resume.has_value()) {
      job->resume_dir = spec.resume_from();
      job->steps_done = resume->step;
      job->restore_dir = job->resume_dir;
      job->restore = resume;
      job->resume = std::move(resume);
    }
    job->created = absl::Now();
    job->lease_expiry = job->created + options_.client_lease;
    job->ops = std::make_unique<OpThread>();
    jobs_[id] = std::move(job);
    if (journal_ != nullptr) journal_->Track(id);
  }

  // Partition (no lock: pure compute on this thread's own data).
  absl::StatusOr<std::pair<std::vector<v1::ChunkSpec>, double>> cut =
      PartitionChunks(spec, *net, *plan, speeds);

  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(id);  // by id: the job may have been cancelled and pruned meanwhile.
  if (it == jobs_.end()) {
    done(absl::CancelledError(absl::StrCat("job '", id, "' ended while it was being created")));
    return;
  }
  Job& job = *it->second;
  if (!cut.ok()) FailJob(job, cut.status().ToString());
  if (IsTerminal(job.state)) {
    done(cut.ok() ? EndedError(job) : cut.status());
    return;
  }
  job.chunks = std::move(cut->first);
  job.imbalance = cut->second;
  Job* raw = &job;  // lives while its OpThread runs this task.
  if (!job.ops->Post([this, raw, id, done] {
        absl::StatusOr<v1::JobStatus> ready = DoAssign(raw);
        if (ready.ok()) {
          JournalJob(id);
          // Before CreateJob answers: the first step does not wait for these handshakes.
          OpenLinksEarly(raw);
        }
        done(std::move(ready));
      })) {
    done(EndedError(job));
  }
}

absl::StatusOr<v1::JobStatus> CoordinatorService::DoAssign(Job* job) {
  // A new secret for every epoch: streams of an earlier epoch's peers no longer get in.
  absl::StatusOr<std::string> secret = net::NewSecret();
  absl::MutexLock lock(&mu_);
  if (shutting_down_) return absl::CancelledError("coordinator shutting down");
  if (IsTerminal(job->state)) return EndedError(*job);
  if (!secret.ok()) {
    FailJob(*job, absl::StrCat("cannot make the data links' secret: ", secret.status().message()));
    return secret.status();
  }
  job->link_secret = *std::move(secret);
  const int S = static_cast<int>(job->workers.size());
  const std::vector<std::string> addresses = RankAddresses(*job);
  for (int rank = 0; rank < S; ++rank) {
    v1::WorkerCommand command;
    v1::Assign* a = command.mutable_assign();
    a->set_job(job->id);
    a->set_epoch(job->epoch);
    a->set_rank(rank);
    *a->mutable_model() = job->model->spec();
    *a->mutable_optimizer() = job->spec.optimizer();
    a->set_seed(job->spec.seed());
    a->set_threads(job->spec.threads());
    a->set_stages(S);
    a->set_virtual_stages(job->spec.virtual_stages());
    a->set_microbatches(job->spec.microbatches());
    for (const v1::ChunkSpec& c : job->chunks) *a->add_chunks() = c;
    for (const std::string& address : addresses) a->add_worker_addresses(address);
    for (const schedule::Action& action : job->plan.actions[rank]) {
      *a->add_actions() = control::ActionToProto(action);
    }
    if (job->restore.has_value()) {
      a->set_restore(true);
      a->set_restore_step(job->restore->step);
    }
    a->set_link_secret(job->link_secret);
    a->set_isa(job->spec.isa());
    SendToRank(*job, rank, command);
  }
  job->op_error = absl::OkStatus();
  const absl::Status waited = AwaitOp(
      *job,
      [job] {
        for (bool b : job->assigned) {
          if (!b) return false;
        }
        return true;
      },
      options_.assign_timeout, "every worker's Assigned");
  if (!waited.ok()) {
    if (!IsTerminal(job->state)) FailJob(*job, waited.ToString());
    return waited;
  }
  job->state = JobState::kReady;
  Log(absl::StrCat("job ", job->id, " ready in epoch ", job->epoch, ": ", job->workers.size(),
                   " stages (", job->spec.schedule(), ") on ", absl::StrJoin(job->workers, ", "),
                   " at instruction set ", job->spec.isa()));
  if (options_.metrics != nullptr) options_.metrics->RecordIsa(job->id, job->spec.isa());
  return StatusOf(*job);
}

std::vector<int> CoordinatorService::UnansweredRanks(const Job& job) {
  std::vector<int> ranks;
  for (size_t rank = 0; rank < job.runs_sent.size(); ++rank) {
    if (job.runs_answered[rank] < job.runs_sent[rank]) ranks.push_back(static_cast<int>(rank));
  }
  return ranks;
}

absl::Status CoordinatorService::AwaitAbortedRuns(Job& job, int64_t mb_rows) {
  auto unanswered = [&job]() ABSL_NO_THREAD_SAFETY_ANALYSIS {  // mu_ held.
    std::vector<std::string> who;
    for (int rank : UnansweredRanks(job)) who.push_back(WorkerLabel(job.workers[rank], rank));
    return absl::StrJoin(who, ", ");
  };
  if (UnansweredRanks(job).empty()) return absl::OkStatus();
  job.op_error = absl::OkStatus();
  const std::string job_id = job.id;
  PT_RETURN_IF_ERROR(AwaitOp(
      job, [&] { return job.state != JobState::kReady || UnansweredRanks(job).empty(); },
      StepDeadline(job, mb_rows), "the answers to an aborted step",
      [&](absl::Duration waited_so_far) ABSL_NO_THREAD_SAFETY_ANALYSIS {
        Log(absl::StrCat("job ", job_id, ": waiting for ", unanswered(),
                         " to answer an aborted step before the next batch goes out, for ",
                         absl::ToInt64Seconds(waited_so_far), " s"),
            logging::LogLevel::kWarning);
      }));
  return CheckReady(job);
}

absl::StatusOr<v1::StepResult> CoordinatorService::DoTrainStep(
    const v1::TrainRequest& request, const std::function<bool()>& next_queued) {
  const absl::Time t0 = absl::Now();
  Job* job = nullptr;
  std::shared_ptr<const model::Model> net;
  int M = 0;
  {
    absl::MutexLock lock(&mu_);
    if (shutting_down_) return absl::CancelledError("coordinator shutting down");
    PT_ASSIGN_OR_RETURN(job, ReadyJob(request.job()));
    net = job->model;
    M = job->spec.microbatches();
  }

  // Validate the batch before any worker hears of it.
  if (request.samples() <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("samples must be >= 1, got ", request.samples()));
  }
  if (request.samples() % M != 0) {
    return absl::InvalidArgumentError(absl::StrCat("a batch of ", request.samples(),
                                                   " samples is not divisible by the job's ", M,
                                                   " micro-batches"));
  }
  PT_ASSIGN_OR_RETURN(math::Matrix inputs, DenseTensorToMatrix(request.inputs(), "inputs"));
  PT_ASSIGN_OR_RETURN(math::Matrix targets, DenseTensorToMatrix(request.targets(), "targets"));
  if (request.samples() > inputs.rows()) {  // every sample has at least one row.
    return absl::InvalidArgumentError(
        absl::StrCat(request.samples(), " samples cannot fit in ", inputs.rows(), " input rows"));
  }
  PT_RETURN_IF_ERROR(
      net->ValidateBatch(math::AsConstMap(inputs), math::AsConstMap(targets), request.samples()));
  const int64_t rows = inputs.rows();
  const int64_t mb_rows = rows / M;
  std::vector<std::shared_ptr<const math::Matrix>> mb_inputs, mb_targets;
  for (int mb = 0; mb < M; ++mb) {
    mb_inputs.push_back(
        std::make_shared<const math::Matrix>(inputs.middleRows(mb * mb_rows, mb_rows)));
    mb_targets.push_back(
        std::make_shared<const math::Matrix>(targets.middleRows(mb * mb_rows, mb_rows)));
  }

  const int S = static_cast<int>(job->workers.size());
  const int C = job->plan.num_chunks();
  const int first_rank = job->plan.placement.OwnerOf(0);
  const int last_rank = job->plan.placement.OwnerOf(C - 1);
  int64_t step = 0;
  int64_t epoch = 0;
  std::string secret;
  std::vector<std::string> addresses;
  {
    absl::MutexLock lock(&mu_);
    PT_RETURN_IF_ERROR(CheckReady(*job));
    PT_RETURN_IF_ERROR(AwaitAbortedRuns(*job, mb_rows));
    secret = job->link_secret;
    // Steps are numbered from 0 on the control and data planes: step n is the (n+1)-th
    // optimizer update (StepResult.step reports n + 1).
    step = job->steps_done;
    if (request.has_expected_step() && request.expected_step() != step) {
      // The job is not where the client thinks: a recovery restored it between two steps (the
      // client replays from `step`), or the batch was applied already.
      const std::string where =
          absl::StrCat("job '", job->id, "' has done ", step, " steps; this batch is for step ",
                       request.expected_step() + 1);
      if (request.expected_step() > step) {
        return absl::AbortedError(
            absl::StrCat(where, ": it was restored from its last checkpoint (",
                         job->recoveries.size(), " recoveries); replay from step ", step + 1));
      }
      return absl::FailedPreconditionError(absl::StrCat(where, ", which it has applied"));
    }
    epoch = job->epoch;
    job->op_step = step;
    job->op_error = absl::OkStatus();
    job->reports.assign(S, std::nullopt);
    job->state = JobState::kTraining;
    addresses = RankAddresses(*job);
  }

  // The inputs and targets go out before RunStep (data links, job thread only: opened when the
  // job became ready, else here, and again if one failed). A worker keeps tensors of a step it
  // has not been told to run yet, and the previous step's Commit is out already: the first
  // rank's inputs then arrive while it applies its update, instead of waiting for a core behind
  // the update that RunStep wakes on a rank that deferred it (docs/performance.md).
  absl::Status feed = EnsureFeedLinks(job, epoch, secret, addresses);
  for (int mb = 0; mb < M && feed.ok(); ++mb) {
    feed = job->links[first_rank]->Send(wire::TensorKey{step, mb, 0, wire::TensorKind::kInput},
                                        mb_inputs[mb]);
    if (feed.ok()) {
      feed = job->links[last_rank]->Send(
          wire::TensorKey{step, mb, C - 1, wire::TensorKind::kTarget}, mb_targets[mb]);
    }
  }

  absl::MutexLock lock(&mu_);
  // RunStep follows even when the feed failed: the step is then aborted (fail_step below), and
  // each rank's aborted run drops whatever part of the inputs reached it, so a retry of the step
  // in this epoch is not refused as a duplicate. Not after a recovery began meanwhile: the new
  // epoch fences this one's tensors, and its ranks must not hear of this step.
  const bool run_sent = job->state == JobState::kTraining && job->epoch == epoch;
  if (run_sent) {
    v1::WorkerCommand command;
    v1::RunStep* run = command.mutable_run_step();
    run->set_job(job->id);
    run->set_epoch(epoch);
    run->set_step(step);
    run->set_batch_rows(rows);
    for (int rank = 0; rank < S; ++rank) {
      SendToRank(*job, rank, command);
      ++job->runs_sent[rank];
    }
  }
  auto fail_step = [&](absl::Status status) ABSL_NO_THREAD_SAFETY_ANALYSIS {
    // Runs with mu_ held (the lock above); lambdas are not analysed with their enclosing scope.
    // A transport failure often reaches us (a neighbour's link error, our feed) before the lost
    // worker's broken Join stream does: a recoverable job waits a moment for that, so the client
    // hears "recovering" (ABORTED) and replays instead of giving up.
    if (IsTransportFailure(status) && job->spec.recover() && job->state == JobState::kTraining) {
      const absl::Time until = absl::Now() + options_.loss_grace;
      while (job->state == JobState::kTraining && !shutting_down_ && absl::Now() < until) {
        event_cv_.WaitWithDeadline(&mu_, until);
      }
    }
    // Recovering (noticed now or before): the step will be replayed, whatever failed it.
    if (job->state == JobState::kRecovering) status = CheckReady(*job);
    return FailStep(*job, step, status);
  };
  if (!feed.ok()) {
    return fail_step(wire::Annotate(feed, absl::StrCat("feeding step ", step)));
  }
  if (!run_sent) {
    // The job left TRAINING while the batch was fed (a worker was lost: it is recovering, or it
    // ended): no worker heard of this step.
    const absl::Status why = CheckReady(*job);
    return fail_step(why.ok() ? absl::AbortedError(absl::StrCat("step ", step, " of job '", job->id,
                                                                "' was interrupted"))
                              : why);
  }
  // The previous step's Commit, if it left it to this step: every rank confirmed it before it
  // answers this RunStep (one stream, in order), so this wait overlaps the step's compute.
  if (job->commit_step >= 0) {
    if (absl::Status confirmed = ConfirmCommit(*job); !confirmed.ok()) {
      job->op_step = -1;
      return confirmed;
    }
  }
  // Ranks that have not answered, for the progress lines and the deadline's message.
  auto missing = [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS {  // mu_ held.
    std::vector<std::string> who;
    for (int rank = 0; rank < S; ++rank) {
      if (!job->reports[rank].has_value()) who.push_back(WorkerLabel(job->workers[rank], rank));
    }
    return absl::StrJoin(who, ", ");
  };
  const absl::Duration deadline = StepDeadline(*job, mb_rows);
  const std::string job_id = job->id;
  absl::Status waited = AwaitOp(
      *job,
      [job] {
        for (const auto& r : job->reports) {
          if (!r.has_value()) return false;
        }
        return true;
      },
      deadline, absl::StrCat("StepDone of step ", step),
      [&](absl::Duration waited_so_far) ABSL_NO_THREAD_SAFETY_ANALYSIS {
        Log(absl::StrCat("job ", job_id, " step ", step, ": waiting for ", missing(), " for ",
                         absl::ToInt64Seconds(waited_so_far), " s (deadline ",
                         absl::FormatDuration(deadline), ")"),
            logging::LogLevel::kWarning);
      });
  if (absl::IsDeadlineExceeded(waited)) {
    waited = absl::DeadlineExceededError(
        absl::StrCat(waited.message(), " from ", missing(),
                     " (stopped or stuck; the deadline is max(--step-deadline-floor, "
                     "--step-deadline-factor x the plan's predicted step time))"));
    Log(std::string(waited.message()), logging::LogLevel::kWarning);
    if (job->spec.recover() && job->state == JobState::kTraining) {
      // A recoverable job evicts the ranks that are stuck, not those waiting on them: the step is
      // aborted, a rank waiting for data answers that at once (its wait is cancelled), a stuck or
      // stopped one does not within loss_grace. The job recovers without the evicted ranks, and
      // what they send later is fenced by the new epoch.
      AbortStep(*job, step, "the step missed its deadline");
      auto unanswered = [&]() ABSL_NO_THREAD_SAFETY_ANALYSIS {  // mu_ held.
        std::vector<std::string> names;
        for (int rank : UnansweredRanks(*job)) names.push_back(job->workers[rank]);
        return names;
      };
      const absl::Time until = absl::Now() + options_.loss_grace;
      while (!shutting_down_ && job->state == JobState::kTraining && !unanswered().empty() &&
             absl::Now() < until) {
        event_cv_.WaitWithDeadline(&mu_, until);
      }
      const std::vector<std::string> late =
          job->state == JobState::kTraining ? unanswered() : std::vector<std::string>();
      for (const std::string& name : late) {
        EvictWorker(name, "deadline",
                    absl::StrCat("missed the deadline of step ", step, " of job ", job_id, " (",
                                 absl::FormatDuration(deadline), ")"));
      }
    }
  }
  if (!waited.ok()) return fail_step(waited);

  // Loss: the last chunk owner's micro-batch losses summed in increasing order, as float.
  const v1::StepDone& last = *job->reports[last_rank];
  if (last.microbatch_losses_size() != M) {
    return fail_step(absl::InternalError(
        absl::StrCat(WorkerLabel(job->workers[last_rank], last_rank), " reported ",
                     last.microbatch_losses_size(), " micro-batch losses, expected ", M)));
  }
  v1::StepResult result;
  float loss = 0;
  for (float l : last.microbatch_losses()) {
    loss += l;
    result.add_microbatch_losses(l);
  }
  // Global gradient norm: per-layer norms placed by layer, summed in increasing layer order —
  // only when the job clips gradients (nothing else reads it, and the workers report it only
  // then: StepDone.grad_norms).
  const float clip_norm = job->spec.optimizer().clip_norm();
  const int64_t L = clip_norm > 0 ? net->num_layers() : 0;
  std::vector<double> per_layer(L, 0.0);
  std::vector<bool> seen(L, false);
  for (int rank = 0; rank < S && L > 0; ++rank) {
    for (const v1::LayerNormSq& n : job->reports[rank]->grad_norms()) {
      if (n.layer() < 0 || n.layer() >= L || seen[n.layer()]) {
        return fail_step(absl::InternalError(
            absl::StrCat(WorkerLabel(job->workers[rank], rank), " reported layer ", n.layer(),
                         n.layer() >= 0 && n.layer() < L ? " twice" : " out of range")));
      }
      seen[n.layer()] = true;
      per_layer[n.layer()] = n.norm_sq();
    }
  }
  for (int64_t l = 0; l < L; ++l) {
    if (!seen[l]) {
      return fail_step(
          absl::InternalError(absl::StrCat("no worker reported the gradient norm of layer ", l)));
    }
  }
  const float clip = L > 0 ? math::ClipScale(model::SumLayerNormSq(per_layer), clip_norm) : 1.0f;

  v1::WorkerCommand command;
  v1::Commit* commit = command.mutable_commit();
  commit->set_job(job->id);
  commit->set_epoch(epoch);
  commit->set_step(step);
  commit->set_clip_scale(clip);
  for (int rank = 0; rank < S; ++rank) SendToRank(*job, rank, command);
  job->commit_step = step;
  job->committed.assign(S, false);
  job->commit_error = absl::OkStatus();
  job->commit_timeout = deadline;
  job->commit_deadline = absl::Now() + deadline;
  if (!next_queued()) {
    // Nothing behind this step to confirm it: confirm it now, so that what the client hears
    // next (this result, a Finish) comes after every rank applied it.
    if (absl::Status confirmed = ConfirmCommit(*job); !confirmed.ok()) {
      job->op_step = -1;
      return confirmed;
    }
  }
  job->steps_done = step + 1;
  job->state = JobState::kReady;
  job->op_step = -1;

  // Timelines: measured (compute intervals, in ms) and the simulator's replay of the same costs.
  result.set_step(step + 1);
  result.set_loss(loss);
  result.set_step_ms(absl::ToDoubleMilliseconds(absl::Now() - t0));
  std::vector<const v1::StepDone*> reports;
  for (const auto& r : job->reports) reports.push_back(&*r);
  FillStepTimeline(job->plan, reports, &result);
  RecordStepMetrics(*job, request.samples(), result);
  Log(absl::StrFormat("job %s step %d applied: loss %.9g, %.3f ms, bubble %.3f (predicted %.3f)",
                      job->id, result.step(), result.loss(), result.step_ms(),
                      result.bubble_fraction(), result.predicted_bubble_fraction()));
  return result;
}

absl::Status CoordinatorService::ConfirmCommit(Job& job) {
  if (job.commit_step < 0) return absl::OkStatus();
  const int64_t step = job.commit_step;
  auto committed_everywhere = [&job]() ABSL_NO_THREAD_SAFETY_ANALYSIS {  // mu_ held.
    for (bool b : job.committed) {
      if (!b) return false;
    }
    return true;
  };
  auto live = [this, &job]() ABSL_NO_THREAD_SAFETY_ANALYSIS {  // mu_ held.
    return !shutting_down_ && !IsTerminal(job.state) && job.state != JobState::kRecovering;
  };
  absl::Status waited;
  while (live() && !committed_everywhere()) {
    if (!job.commit_error.ok()) {
      waited = job.commit_error;
      break;
    }
    // An error of the operation in flight: in the step that committed, anything a rank reports
    // (a peer unreachable, say); in the step behind it, only a recoverable job's transport
    // failure (the rank out of reach may be one that has not committed) — any other error
    // fails that later step alone.
    if (!job.op_error.ok() &&
        (job.op_step == step || (job.spec.recover() && IsTransportFailure(job.op_error)))) {
      waited = job.op_error;
      break;
    }
    if (absl::Now() >= job.commit_deadline) {
      // Applying a step takes a fraction of computing it: a rank that has not committed within
      // the step's deadline is stuck or stopped.
      waited = absl::DeadlineExceededError(absl::StrCat("job '", job.id, "': timed out after ",
                                                        absl::FormatDuration(job.commit_timeout),
                                                        " waiting for Committed of step ", step));
      break;
    }
    event_cv_.WaitWithDeadline(&mu_, job.commit_deadline);
  }
  if (!waited.ok() && job.spec.recover() && live()) {
    // A recoverable job whose commit was interrupted (a rank refused it or reported a peer
    // unreachable, or the deadline passed): the ranks that commit within loss_grace are fine;
    // the others are stuck or stopped and are evicted, and the job recovers without them (every
    // rank restarts from the checkpoint, so a half-applied step does not matter). If all commit
    // after all, the step stands.
    const absl::Time until = absl::Now() + options_.loss_grace;
    while (live() && !committed_everywhere() && absl::Now() < until) {
      event_cv_.WaitWithDeadline(&mu_, until);
    }
    if (live() && committed_everywhere()) {
      waited = absl::OkStatus();
    } else if (live()) {
      std::vector<std::pair<std::string, int>> late;
      for (size_t rank = 0; rank < job.committed.size(); ++rank) {
        if (!job.committed[rank]) late.emplace_back(job.workers[rank], static_cast<int>(rank));
      }
      for (const auto& [name, rank] : late) {
        EvictWorker(name, "deadline",
                    absl::StrCat("did not commit step ", step, " of job ", job.id,
                                 " while its peers reported: ", waited.ToString()));
      }
    }
  }
  job.commit_step = -1;
  // Some workers may have applied the step: the replicas can no longer be trusted — unless the
  // job is recovering, which restarts every rank from its last checkpoint anyway.
  if (job.state == JobState::kRecovering) return CheckReady(job);
  if (waited.ok() && !live())
    waited =
        shutting_down_ ? absl::CancelledError("coordinator shutting down") : InterruptedError(job);
  if (!waited.ok() && !IsTerminal(job.state)) {
    FailJob(job, absl::StrCat("step ", step, " was not committed everywhere: ", waited.ToString()));
  }
  return waited;
}

absl::Status CoordinatorService::DoConfirmCommit(const std::string& job_id) {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return absl::OkStatus();
  return ConfirmCommit(*it->second);
}

absl::StatusOr<v1::CheckpointResponse> CoordinatorService::DoCheckpoint(
    const v1::CheckpointRequest& request) {
  if (request.directory().empty()) {
    return absl::InvalidArgumentError("Checkpoint: empty directory");
  }
  PT_ASSIGN_OR_RETURN(const std::string directory,
                      CheckpointPath(request.directory(), "Checkpoint directory"));
  if (request.keep() < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("Checkpoint: keep must be >= 0, got ", request.keep()));
  }
  if (request.keep() > 1 && !CheckpointPath(io::DirName(directory), "").ok()) {
    // The earlier checkpoints go beside the directory: that must be under the root too.
    return absl::InvalidArgumentError(
        absl::StrCat("Checkpoint: keeping ", request.keep(), " checkpoints of ", directory,
                     " needs its parent under the checkpoint root (earlier ones are kept beside "
                     "it); name a subdirectory"));
  }
  Job* job = nullptr;
  int64_t step = 0;
  std::shared_ptr<const model::Model> net;
  v1::JobSpec spec;
  std::string isa_note;  // the manifest's: which steps ran at another level, if any did.
  {
    absl::MutexLock lock(&mu_);
    if (shutting_down_) return absl::CancelledError("coordinator shutting down");
    PT_ASSIGN_OR_RETURN(job, ReadyJob(request.job()));
    // The shards must hold the last step everywhere (SaveShards follows its Commit on every
    // rank's stream; a rank that refused it would save the step before).
    PT_RETURN_IF_ERROR(ConfirmCommit(*job));
    step = job->steps_done;
    net = job->model;
    spec = job->spec;
    if (job->resume.has_value()) isa_note = model::IsaNoteAfterResume(*job->resume, spec.isa());
  }
  // The workers write into a staging directory, published as directory when complete
  // (file I/O outside mu_; only this job's thread runs operations on the job).
  PT_ASSIGN_OR_RETURN(const std::string staging, model::BeginCheckpointStaging(directory));
  {
    absl::MutexLock lock(&mu_);
    const int S = static_cast<int>(job->workers.size());
    job->op_step = step;
    job->op_error = absl::OkStatus();
    job->saved.assign(S, false);
    v1::WorkerCommand command;
    v1::SaveShards* save = command.mutable_save_shards();
    save->set_job(job->id);
    save->set_epoch(job->epoch);
    save->set_step(step);
    job->checkpoint_staging = staging;
    for (int rank = 0; rank < S; ++rank) SendToRank(*job, rank, command);
    // A rank that has not saved within this bound is stuck or stopped: writing and uploading its
    // weights and optimizer state (at most three tensors per parameter) at 10 MB/s takes less.
    // The floor is the step deadline's.
    const absl::Duration save_deadline =
        std::min(options_.step_timeout,
                 std::max(options_.step_deadline_floor,
                          absl::Seconds(static_cast<double>(net->NumParameters()) * 12.0 / 10e6)));
    absl::Status waited = AwaitOp(
        *job,
        [job] {
          for (bool b : job->saved) {
            if (!b) return false;
          }
          return true;
        },
        save_deadline, "every worker's ShardsSaved");
    if (absl::IsDeadlineExceeded(waited)) {
      std::vector<std::pair<std::string, int>> late;
      for (int rank = 0; rank < S; ++rank) {
        if (!job->saved[rank]) late.emplace_back(job->workers[rank], rank);
      }
      std::vector<std::string> names;
      for (const auto& [name, rank] : late) names.push_back(WorkerLabel(name, rank));
      waited = absl::DeadlineExceededError(absl::StrCat(
          waited.message(), " from ", absl::StrJoin(names, ", "), " (stopped or stuck)"));
      Log(std::string(waited.message()), logging::LogLevel::kWarning);
      if (job->spec.recover() && !IsTerminal(job->state) && job->state != JobState::kRecovering) {
        // As for a step: a recoverable job evicts the ranks that are stuck and recovers without
        // them; the client then replays from the last checkpoint and checkpoints again.
        for (const auto& [name, rank] : late) {
          EvictWorker(name, "deadline",
                      absl::StrCat("did not save the checkpoint of step ", step, " of job ",
                                   job->id, " within ", absl::FormatDuration(save_deadline)));
        }
      }
    }
    if (job->state == JobState::kRecovering && !waited.ok()) waited = CheckReady(*job);
    job->op_step = -1;
    job->checkpoint_staging.clear();  // no more uploads are accepted into it.
    if (!waited.ok()) {
      model::DiscardCheckpointStaging(staging).IgnoreError();
      return waited;
    }
  }
  // The manifest: what the coordinator knows. The data set, batch size and data cursor are the
  // client's (a client that knows them rewrites the manifest, see client/cli/train_command.cc).
  model::CheckpointManifest manifest;
  manifest.step = step;
  manifest.model_spec = net->spec();
  manifest.seed = spec.seed();
  manifest.microbatches = spec.microbatches();
  manifest.isa = spec.isa();
  manifest.isa_note = isa_note;
  absl::StatusOr<math::OptimizerConfig> optimizer = model::OptimizerFromProto(spec.optimizer());
  if (optimizer.ok()) manifest.optimizer = math::FormatOptimizerConfig(*optimizer);
  // Every worker uploaded its files (PutState) and answered ShardsSaved: digest what is there
  // (a missing file is NOT_FOUND), then publish after verifying the whole checkpoint.
  absl::StatusOr<std::vector<model::CheckpointShard>> shards =
      model::DigestCheckpointShards(staging, model::LayerShards(*net, 0, net->num_layers()));
  if (!shards.ok()) {
    model::DiscardCheckpointStaging(staging).IgnoreError();
    return shards.status();
  }
  manifest.shards = *std::move(shards);
  PT_RETURN_IF_ERROR(
      model::PublishCheckpoint(staging, directory, manifest, std::max(1, request.keep())));
  {
    // The newest state a recovery restarts from.
    absl::MutexLock lock(&mu_);
    job->restore_dir = directory;
    job->restore = manifest;
  }
  JournalJob(request.job());
  v1::CheckpointResponse response;
  response.set_step(step);
  response.set_directory(directory);
  return response;
}

absl::StatusOr<std::string> CoordinatorService::CheckpointPath(const std::string& path,
                                                               absl::string_view what) const {
  if (options_.checkpoint_root.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat(what, " '", path,
                     "': this coordinator keeps no checkpoints; start it with --checkpoint-root "
                     "DIR (checkpoint and resume directories must lie under it)"));
  }
  absl::StatusOr<std::string> confined = io::ConfinePath(options_.checkpoint_root, path);
  if (!confined.ok()) return wire::Annotate(confined.status(), std::string(what));
  return confined;
}

absl::Duration CoordinatorService::StepDeadline(const Job& job, int64_t mb_rows) const {
  // Chunk FLOPs for micro-batches of mb_rows rows, worker speeds in FLOP/s: the simulated step
  // in seconds.
  const int C = job.plan.num_chunks();
  std::vector<schedule::OpCosts> flops(C, schedule::OpCosts{0, 0, 0, 0});
  for (const v1::ChunkSpec& c : job.chunks) {
    if (c.chunk() < 0 || c.chunk() >= C) continue;
    for (int64_t l = c.first_layer(); l < c.last_layer(); ++l) {
      const math::FlopCount f = job.model->layer(l).Flops(std::max<int64_t>(mb_rows, 1));
      schedule::OpCosts& o = flops[c.chunk()];
      o.f += f.forward;
      o.i += f.backward_input;
      o.w += f.backward_weight;
      o.b += f.backward_input + f.backward_weight;
    }
  }
  std::vector<double> speeds;
  for (const std::string& name : job.workers) {
    auto it = workers_.find(name);
    speeds.push_back(it == workers_.end() ? 1e9 : it->second.info.gflops() * 1e9);
  }
  double predicted_s = 0;
  absl::StatusOr<schedule::CostModel> costs =
      schedule::CostModelFromFlops(job.plan.placement, flops, speeds);
  if (costs.ok()) {
    absl::StatusOr<schedule::SimulationResult> sim = schedule::Simulate(job.plan, *costs);
    if (sim.ok()) predicted_s = sim->stats.makespan;
  }
  return std::max(options_.step_deadline_floor,
                  absl::Seconds(predicted_s * options_.step_deadline_factor));
}

absl::StatusOr<math::Matrix> DenseTensorToMatrix(const v1::DenseTensor& tensor,
                                                 const std::string& what) {
  if (tensor.dtype() != v1::DTYPE_F32 && tensor.dtype() != v1::DTYPE_UNSPECIFIED) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": dtype ", static_cast<int>(tensor.dtype()),
                     " is not supported (only DTYPE_F32 = 1, little-endian float32)"));
  }
  if (tensor.shape_size() != 2) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": expected a rank-2 tensor, got rank ", tensor.shape_size()));
  }
  const int64_t rows = tensor.shape(0);
  const int64_t cols = tensor.shape(1);
  constexpr int64_t kMaxDim = int64_t{1} << 30;
  if (rows <= 0 || cols <= 0 || rows > kMaxDim || cols > kMaxDim || rows * cols > kMaxDim) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": bad shape [", rows, ", ", cols, "]"));
  }
  const int64_t bytes = rows * cols * static_cast<int64_t>(sizeof(float));
  if (static_cast<int64_t>(tensor.data().size()) != bytes) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": shape [", rows, ", ", cols, "] needs ",
                                                   bytes, " bytes, got ", tensor.data().size()));
  }
  math::Matrix m(rows, cols);
  std::memcpy(m.data(), tensor.data().data(), static_cast<size_t>(bytes));
  return m;
}

}  // namespace pipetrain::coordinator
