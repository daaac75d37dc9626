#include "server/coordinator/coordinator_core.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/net/principal.h"
#include "common/util/status_macros.h"
#include "pipetrain/v1/worker_control.pb.h"
#include "server/logging/daemon_log.h"
#include "server/metrics/coordinator_metrics.h"

// The core's frame: construction and shutdown, the jobs' life (end, status, errors), the client
// calls that answer at once, housekeeping and metrics.
namespace pipetrain::coordinator {
namespace {

// "job-<8 random hex digits>-": a fresh prefix per process, so that ids never repeat across
// restarts.
std::string NewJobIdPrefix() {
  std::random_device rd;
  return absl::StrFormat("job-%08x-", static_cast<uint32_t>(rd()));
}

std::string EndedMessage(const Job& job) ABSL_EXCLUSIVE_LOCKS_REQUIRED(job.mu) {
  return absl::StrCat("job '", job.id, "' is ", JobStateName(job.state),
                      job.reason.empty() ? "" : ": ", job.reason);
}

}  // namespace

std::string WorkerLabel(const std::string& name, int rank) {
  return absl::StrCat("worker '", name, "' (rank ", rank, ")");
}

std::string PositionLabel(const Job& job, int position) {
  const JobShape shape = ShapeOf(job.spec);
  const std::string& name = job.workers[position];
  if (shape.replicas == 1) return WorkerLabel(name, position);
  return absl::StrCat("worker '", name, "' (rank ", shape.RankOf(position), ", replica ",
                      shape.ReplicaOf(position), ")");
}

bool IsTransportFailure(const absl::Status& status) {
  return absl::IsUnavailable(status) || absl::IsAborted(status) || absl::IsCancelled(status) ||
         absl::IsDeadlineExceeded(status);
}

absl::Status CheckReady(const Job& job) {
  if (job.state == JobState::kReady) return absl::OkStatus();
  if (job.state == JobState::kRecovering) {
    const v1::RecoveryEvent& r = job.recovering;
    return absl::AbortedError(absl::StrCat(
        "job '", job.id, "' is recovering (",
        r.lost_worker().empty() ? r.cause()
                                : absl::StrCat("worker '", r.lost_worker(), "' ", r.cause()),
        "); retry once it is ready"));
  }
  if (IsTerminal(job.state)) return EndedError(job);
  return absl::FailedPreconditionError(
      absl::StrCat("job '", job.id, "' is ", JobStateName(job.state)));
}

absl::Status CheckClaimCurrent(const Job& job) {
  if (job.train_owner == nullptr || job.train_generation == job.generation) {
    return absl::OkStatus();
  }
  std::string what = "a recovery";
  if (!job.recoveries.empty()) {
    const v1::RecoveryEvent& r = job.recoveries.back();
    what = absl::StrCat("a recovery (", r.cause(),
                        r.lost_worker().empty() ? "" : ": worker '" + r.lost_worker() + "'",
                        ", after step ", r.steps_done(), ")");
  }
  return absl::AbortedError(absl::StrCat("job '", job.id, "' went through ", what,
                                         " since its Train stream began: it restarted from step ",
                                         job.steps_done, " in generation ", job.generation,
                                         "; replay from there on a new stream"));
}

absl::Status EndedError(const Job& job) { return absl::FailedPreconditionError(EndedMessage(job)); }

absl::Status InterruptedError(const Job& job) {
  switch (job.state) {
    case JobState::kCancelled:
      return absl::CancelledError(EndedMessage(job));
    case JobState::kFailed:
      return absl::UnavailableError(EndedMessage(job));
    default:
      return absl::FailedPreconditionError(EndedMessage(job));
  }
}

// ---------------------------------------------------------------- life

CoordinatorCore::CoordinatorCore(CoordinatorOptions options, std::shared_ptr<FeedLinkFactory> links)
    : options_(std::move(options)),
      link_factory_(std::move(links)),
      id_prefix_(NewJobIdPrefix()),
      housekeeping_thread_([this] { HousekeepingLoop(); }) {}

CoordinatorCore::~CoordinatorCore() {
  Shutdown();
  admission_.reset();  // runs what is queued (each CreateJob fails: shutting down) and joins.
  profiler_.reset();   // likewise for ProfileWorkers.
  {
    absl::MutexLock lock(&housekeeping_mu_);
    stop_housekeeping_ = true;
  }
  housekeeping_thread_.join();
  // Every job's thread runs what is queued (each operation sees the shutdown and returns) and
  // exits; the threads are joined as they are destroyed, outside mu_.
  std::vector<std::unique_ptr<OpThread>> threads;
  std::map<std::string, std::unique_ptr<Job>> jobs;
  {
    absl::MutexLock lock(&mu_);
    for (auto& [id, job] : jobs_) {
      job->mu.AssertHeld();
      if (job->ops != nullptr) job->ops->Close();
      threads.push_back(std::move(job->ops));
    }
    jobs.swap(jobs_);
  }
  threads.clear();
  jobs.clear();
}

void CoordinatorCore::Shutdown() {
  absl::MutexLock lock(&mu_);
  if (shutting_down_) return;
  shutting_down_ = true;
  for (const WorkerRecord* w : workers_.InOrder()) {
    w->channel->Close(absl::CancelledError("coordinator shutting down"));
  }
  for (auto& [id, job] : jobs_) {
    job->mu.AssertHeld();
    job->events.CloseWatches(absl::CancelledError("coordinator shutting down"));
  }
  event_cv_.SignalAll();
}

absl::Status CoordinatorCore::PostToJob(const std::string& id, std::function<void()> task) {
  return Post(id, /*client_request=*/false, std::move(task));
}

absl::Status CoordinatorCore::PostClientRequest(const std::string& id, std::function<void()> task) {
  return Post(id, /*client_request=*/true, std::move(task));
}

absl::Status CoordinatorCore::Post(const std::string& id, bool client_request,
                                   std::function<void()> task) {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(id);
  if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("unknown job '", id, "'"));
  Job& job = *it->second;
  job.mu.AssertHeld();
  if (IsTerminal(job.state)) return EndedError(job);
  if (client_request) {
    // Checked under the lock that BeginRecovery takes: a recovery that starts later is posted
    // behind `task`, which then finds the job RECOVERING and is refused when it runs.
    if (job.state == JobState::kRecovering) return CheckReady(job);
    PT_RETURN_IF_ERROR(CheckClaimCurrent(job));
  }
  if (job.ops == nullptr || !job.ops->Post(std::move(task))) {
    return absl::FailedPreconditionError(absl::StrCat("job '", id, "' takes no more work"));
  }
  return absl::OkStatus();
}

void CoordinatorCore::EndJob(Job& job, JobState state, const std::string& reason) {
  if (IsTerminal(job.state)) return;
  Log(absl::StrCat("job ", job.id, " ", JobStateName(state), " after ", job.steps_done, " steps",
                   reason.empty() ? "" : ": ", reason),
      state == JobState::kFailed ? logging::LogLevel::kError : logging::LogLevel::kInfo);
  if (job.state == JobState::kTraining && job.op.step >= 0) AbortStep(job, job.op.step, reason);
  v1::WorkerCommand command;
  v1::Release* release = command.mutable_release();
  release->set_job(job.id);
  release->set_generation(job.generation);
  release->set_reason(
      absl::StrCat("job ", JobStateName(state), reason.empty() ? "" : ": ", reason));
  SendToRanks(job, command);
  workers_.FreeJob(job.id);
  // An ended job must not come back after a restart: no record of it is written from now on, and
  // the job's thread removes the one on disk (an unlink and a directory fsync: never under the
  // lock, nor on a gRPC thread that may be the one ending the job).
  if (journal_ != nullptr) journal_->Untrack(job.id);
  job.state = state;
  job.reason = reason;
  job.ended = Now();
  job.lease_expiry = absl::InfiniteFuture();
  v1::JobEvent ended;
  ended.mutable_ended()->set_state(JobStateToProto(state));
  ended.mutable_ended()->set_reason(reason);
  ended.mutable_ended()->set_steps_done(job.steps_done);
  RecordEvent(job, std::move(ended));
  if (job.ops != nullptr) {
    // The operation in flight (if any) sees the end and returns; then the links close and the
    // thread exits (joined by housekeeping once the job is pruned).
    Job* raw = &job;                       // lives until its thread was joined.
    JobJournal* journal = journal_.get();  // lives as long as the core.
    const std::string id = job.id;
    job.ops->Post([this, raw, journal, id] {
      if (journal != nullptr) {
        if (const absl::Status removed = journal->Remove(id); !removed.ok()) {
          Log(absl::StrCat("job ", id, ": cannot remove its journal record: ", removed.ToString()));
        }
      }
      CloseJobLinks(raw);
    });
    job.ops->Close();
  }
  event_cv_.SignalAll();
}

void CoordinatorCore::SendToRank(const Job& job, int rank, const v1::WorkerCommand& command) const {
  workers_.SendIfHolding(job.workers[rank], job.id, command);
}

void CoordinatorCore::SendToRanks(const Job& job, const v1::WorkerCommand& command) const {
  for (int rank = 0; rank < static_cast<int>(job.workers.size()); ++rank) {
    SendToRank(job, rank, command);
  }
}

std::vector<std::string> CoordinatorCore::RankAddresses(const Job& job) const {
  std::vector<std::string> addresses;
  addresses.reserve(job.workers.size());
  for (const std::string& name : job.workers) addresses.push_back(workers_.AddressOf(name));
  return addresses;
}

void CoordinatorCore::AbortStep(const Job& job, int64_t step, const std::string& reason) const {
  v1::WorkerCommand command;
  v1::Abort* abort = command.mutable_abort();
  abort->set_job(job.id);
  abort->set_generation(job.generation);
  abort->set_step(step);
  abort->set_reason(reason);
  SendToRanks(job, command);
}

std::string CoordinatorCore::RankLabels(const Job& job, const std::vector<int>& ranks) {
  std::vector<std::string> labels;
  for (int p : ranks) labels.push_back(PositionLabel(job, p));
  return absl::StrJoin(labels, ", ");
}

absl::Status CoordinatorCore::AwaitOp(Job& job, const std::function<bool()>& done,
                                      absl::Duration timeout, const std::string& what,
                                      const std::function<void(absl::Duration)>& on_wait) {
  const absl::Time start = absl::Now();
  const absl::Time deadline = start + timeout;
  absl::Time next_report = start + options_.wait_report_interval;
  for (;;) {
    if (shutting_down_) return absl::CancelledError("coordinator shutting down");
    if (IsTerminal(job.state)) return InterruptedError(job);
    if (!job.op.error.ok()) return job.op.error;
    if (done()) return absl::OkStatus();
    const absl::Time now = absl::Now();
    if (now >= deadline) {
      return absl::DeadlineExceededError(absl::StrCat("job '", job.id, "': timed out after ",
                                                      absl::FormatDuration(timeout),
                                                      " waiting for ", what));
    }
    if (on_wait != nullptr && now >= next_report) {
      on_wait(now - start);
      next_report = now + options_.wait_report_interval;
    }
    WaitUntil(on_wait != nullptr ? std::min(deadline, next_report) : deadline);
  }
}

void CoordinatorCore::WaitUntil(absl::Time deadline) { event_cv_.WaitWithDeadline(&mu_, deadline); }

void CoordinatorCore::Log(const std::string& message, logging::LogLevel level) const {
  if (options_.log != nullptr) {
    options_.log(level, message);
    return;
  }
  logging::Log("coordinator", level, message);
}

// ---------------------------------------------------------------- housekeeping

void CoordinatorCore::HousekeepingLoop() {
  for (;;) {
    {
      absl::MutexLock lock(&housekeeping_mu_);
      if (housekeeping_mu_.AwaitWithTimeout(absl::Condition(&stop_housekeeping_),
                                            options_.housekeeping_interval)) {
        return;
      }
    }
    RunHousekeeping();
  }
}

void CoordinatorCore::RunHousekeeping() {
  std::vector<std::unique_ptr<OpThread>> finished;
  {
    absl::MutexLock lock(&mu_);
    finished = Housekeep(Now());
    RecordStateMetrics();
  }
  finished.clear();  // joins the pruned jobs' threads, outside mu_.
}

std::vector<std::unique_ptr<OpThread>> CoordinatorCore::Housekeep(absl::Time now) {
  std::vector<std::unique_ptr<OpThread>> finished;
  if (shutting_down_) return finished;
  std::vector<Job*> ended;
  for (auto& [id, job] : jobs_) {
    job->mu.AssertHeld();
    if (!LeaseHeld(*job) && now >= job->lease_expiry) {
      EndJob(*job, JobState::kCancelled,
             absl::StrCat("client gone: no Train stream or Checkpoint for ",
                          absl::FormatDuration(options_.client_lease), " (the client lease)"));
    }
    if (IsTerminal(job->state)) ended.push_back(job.get());
  }
  // Oldest ended first; drop those past the retention period or beyond the cap, once their
  // thread has run its last task.
  std::sort(ended.begin(), ended.end(), [](const Job* a, const Job* b) {
    a->mu.AssertHeld();
    b->mu.AssertHeld();
    return a->ended < b->ended;
  });
  const size_t cap = static_cast<size_t>(options_.max_ended_jobs);
  const size_t excess = ended.size() > cap ? ended.size() - cap : 0;
  for (size_t i = 0; i < ended.size(); ++i) {
    Job* job = ended[i];
    job->mu.AssertHeld();
    if (i >= excess && now - job->ended < options_.job_retention) continue;
    if (job->ops != nullptr && !job->ops->Finished()) continue;
    job->events.CloseWatches(absl::NotFoundError(
        absl::StrCat("job '", job->id, "' was pruned (it ended longer ago than the retention)")));
    finished.push_back(std::move(job->ops));
    const std::string id = job->id;
    jobs_.erase(id);
  }
  return finished;
}

void CoordinatorCore::RecordStepMetrics(const std::string& job, int64_t samples,
                                        const v1::StepResult& result) const {
  if (options_.metrics == nullptr) return;
  metrics::StepSample s;
  s.seconds = result.step_ms() / 1000;
  s.loss = result.loss();
  s.bubble = result.bubble_fraction();
  s.predicted_bubble = result.predicted_bubble_fraction();
  s.samples_per_second = s.seconds > 0 ? static_cast<double>(samples) / s.seconds : 0;
  s.samples = samples;
  options_.metrics->RecordStep(job, s);
}

void CoordinatorCore::RecordStateMetrics() const {
  if (options_.metrics == nullptr) return;
  std::map<std::string, int> jobs_by_state;
  for (JobState state :
       {JobState::kAssigning, JobState::kReady, JobState::kTraining, JobState::kRecovering,
        JobState::kDone, JobState::kFailed, JobState::kCancelled}) {
    jobs_by_state[std::string(JobStateName(state))] = 0;
  }
  std::set<std::string> known;
  for (const auto& [id, job] : jobs_) {
    job->mu.AssertHeld();
    ++jobs_by_state[std::string(JobStateName(job->state))];
    known.insert(id);
  }
  options_.metrics->RecordState(jobs_by_state, workers_.CountByState(), known);
}

}  // namespace pipetrain::coordinator
