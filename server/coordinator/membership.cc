// The core's membership hooks: a worker registers, reports on its job's operation, and goes
// (its stream ended, or the coordinator evicted it).
#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/util/status_macros.h"
#include "pipetrain/v1/worker_control.pb.h"
#include "server/control/control_proto.h"
#include "server/coordinator/coordinator_core.h"
#include "server/coordinator/job_isa.h"

namespace pipetrain::coordinator {
namespace {

// Targets of one ProbeLinks, and links kept per worker (worker_control.proto).
constexpr int kMaxProbeTargets = 64;

std::string CodeName(const v1::WorkerError& e) {
  return absl::StatusCodeToString(static_cast<absl::StatusCode>(e.code()));
}

}  // namespace

absl::Status CoordinatorCore::OnWorkerEvent(WorkerChannel* channel, std::string* name,
                                            const v1::WorkerEvent& event) {
  absl::MutexLock lock(&mu_);
  if (name->empty()) {
    if (!event.has_register_()) {
      return absl::FailedPreconditionError(
          "the first event on a Join stream must be RegisterWorker");
    }
    return RegisterWorker(channel, event.register_(), name);
  }
  if (event.has_register_()) {
    return absl::FailedPreconditionError(
        absl::StrCat("worker '", *name, "' is already registered on this stream"));
  }
  if (event.event_case() == v1::WorkerEvent::EVENT_NOT_SET) {
    return absl::InvalidArgumentError(absl::StrCat("worker '", *name, "' sent an empty event"));
  }
  if (event.has_layers_profiled()) {
    RecordProfile(channel, *name, event.layers_profiled());
    return absl::OkStatus();
  }
  WorkerRecord* const worker = workers_.Find(*name);
  if (event.has_links_probed() && worker != nullptr && worker->channel == channel) {
    RecordLinksProbed(*worker, event.links_probed());
    return absl::OkStatus();
  }
  if (worker == nullptr || worker->channel != channel || worker->job.empty()) {
    return absl::OkStatus();  // stale: an evicted or idle worker's late report.
  }
  return RecordJobEvent(*worker, event);
}

absl::Status CoordinatorCore::RegisterWorker(WorkerChannel* channel, const v1::RegisterWorker& r,
                                             std::string* name) {
  PT_RETURN_IF_ERROR(WorkerRegistry::CheckRegistration(r));
  if (shutting_down_) return absl::UnavailableError("coordinator shutting down");
  if (const WorkerRecord* old = workers_.Find(r.name()); old != nullptr) {
    if (r.incarnation() <= old->info.incarnation()) {
      return absl::AlreadyExistsError(
          absl::StrCat("a live worker named '", r.name(), "' is already registered (incarnation ",
                       old->info.incarnation(), "; this one is ", r.incarnation(), ")"));
    }
    // A restart of a worker whose old stream has not broken yet (hung, or its host gone without
    // a reset): the newer incarnation takes over; the job it held fails.
    const std::string why =
        absl::StrCat("worker '", r.name(), "' was replaced by a newer incarnation (restarted)");
    Log(why, logging::LogLevel::kWarning);
    const std::string job_id = old->job;
    const int rank = old->rank;
    old->channel->Close(absl::CancelledError(why));
    workers_.Remove(r.name());
    if (auto it = jobs_.find(job_id); it != jobs_.end()) {
      Job& job = *it->second;
      job.mu.AssertHeld();
      if (!IsTerminal(job.state)) {
        FailJob(job, absl::StrCat(WorkerLabel(r.name(), rank), " was lost: ", why));
      }
    }
  }
  const WorkerRecord& added = workers_.Add(r, channel);
  *name = r.name();
  Log(absl::StrFormat("worker '%s' registered from %s: %d cores, %.2f GFLOP/s, instruction sets %s",
                      r.name(), r.address(), r.cores(), r.gflops(),
                      math::IsaListName(WorkerIsas(r))));
  if (options_.probe_links) SendProbeLinks(added);
  event_cv_.SignalAll();  // a recovery may be waiting for an idle worker.
  return absl::OkStatus();
}

void CoordinatorCore::SendProbeLinks(const WorkerRecord& worker) {
  v1::WorkerCommand command;
  v1::ProbeLinks* probe = command.mutable_probe_links();
  for (const WorkerRecord* other : workers_.Idle()) {
    if (other == &worker) continue;
    if (probe->targets_size() == kMaxProbeTargets) break;
    v1::LinkProbeTarget* target = probe->add_targets();
    target->set_name(other->info.name());
    target->set_address(other->info.address());
  }
  if (probe->targets_size() > 0) worker.channel->Send(command);
}

void CoordinatorCore::RecordLinksProbed(WorkerRecord& worker, const v1::LinksProbed& probed) {
  const std::string& name = worker.info.name();
  for (const v1::MeasuredLink& l : probed.links()) {
    const bool figures_ok =
        l.error().empty()
            ? std::isfinite(l.latency_seconds()) && l.latency_seconds() > 0 &&
                  std::isfinite(l.bytes_per_second()) && l.bytes_per_second() > 0 &&
                  std::isfinite(l.cpu_seconds_per_message()) && l.cpu_seconds_per_message() > 0
            : l.error().size() <= 4096;
    if (l.from() != name || l.to().empty() || l.to() == name || !figures_ok ||
        worker.links.size() >= kMaxProbeTargets) {
      Log(absl::StrCat("worker '", name, "' reported a malformed measured link (from '", l.from(),
                       "' to '", l.to(), "'): dropped"),
          logging::LogLevel::kWarning);
      continue;
    }
    worker.links[l.to()] = l;
    Log(l.error().empty()
            ? absl::StrFormat("link %s -> %s measured: %.0f us, %.3g B/s, %.1f us CPU per message",
                              name, l.to(), l.latency_seconds() * 1e6, l.bytes_per_second(),
                              l.cpu_seconds_per_message() * 1e6)
            : absl::StrCat("link ", name, " -> ", l.to(), " not measured: ", l.error()));
  }
}

absl::Status CoordinatorCore::RecordJobEvent(const WorkerRecord& worker,
                                             const v1::WorkerEvent& event) {
  auto jit = jobs_.find(worker.job);
  if (jit == jobs_.end()) return absl::OkStatus();
  Job& job = *jit->second;
  job.mu.AssertHeld();
  const int rank = worker.rank;
  if (IsTerminal(job.state) || rank < 0 || rank >= static_cast<int>(job.workers.size())) {
    return absl::OkStatus();
  }
  // Every event names (job, generation[, step]); anything else is from an earlier assignment.
  auto current = [&job](const std::string& j, int64_t generation) ABSL_EXCLUSIVE_LOCKS_REQUIRED(
                     job.mu) { return j == job.id && generation == job.generation; };
  switch (event.event_case()) {
    case v1::WorkerEvent::kAssigned:
      if (current(event.assigned().job(), event.assigned().generation()))
        job.op.assigned[rank] = true;
      break;
    case v1::WorkerEvent::kStepDone:
      if (current(event.step_done().job(), event.step_done().generation())) {
        RecordStepDone(job, rank, event.step_done());
      }
      break;
    case v1::WorkerEvent::kEvalDone:
      if (current(event.eval_done().job(), event.eval_done().generation())) {
        RecordEvalDone(job, rank, event.eval_done());
      }
      break;
    case v1::WorkerEvent::kGenDone:
      if (current(event.gen_done().job(), event.gen_done().generation())) {
        RecordGenDone(job, rank, event.gen_done());
      }
      break;
    case v1::WorkerEvent::kCommitted: {
      const v1::Committed& c = event.committed();
      if (current(c.job(), c.generation()) && c.step() == job.commit.step) {
        job.commit.committed[rank] = true;
      }
      break;
    }
    case v1::WorkerEvent::kShardsSaved: {
      const v1::ShardsSaved& s = event.shards_saved();
      if (current(s.job(), s.generation()) && s.step() == job.op.step) job.op.saved[rank] = true;
      break;
    }
    case v1::WorkerEvent::kError:
      if (current(event.error().job(), event.error().generation())) {
        RecordWorkerError(job, worker, event.error());
      }
      break;
    default:
      break;
  }
  event_cv_.SignalAll();
  return absl::OkStatus();
}

void CoordinatorCore::RecordStepDone(Job& job, int rank, const v1::StepDone& done) {
  // Only the answer to the latest RunStep belongs to the current attempt; an earlier one is left
  // over from an aborted attempt of the same step number.
  if (job.op.runs_answered[rank] >= job.op.runs_sent[rank]) return;
  ++job.op.runs_answered[rank];
  if (job.op.runs_answered[rank] == job.op.runs_sent[rank] && done.step() == job.op.step) {
    job.op.reports[rank] = done;
  }
}

void CoordinatorCore::RecordEvalDone(Job& job, int rank, const v1::EvalDone& done) {
  // Counted as a RunStep's answer: an evaluation run is one more run on the rank's stream.
  if (job.op.runs_answered[rank] >= job.op.runs_sent[rank]) return;
  ++job.op.runs_answered[rank];
  if (job.op.runs_answered[rank] == job.op.runs_sent[rank] && done.step() == job.op.step &&
      rank < static_cast<int>(job.op.evals.size())) {
    job.op.evals[rank] = done;
  }
}

void CoordinatorCore::RecordGenDone(Job& job, int rank, const v1::GenDone& done) {
  // Counted as a RunStep's answer: a decode round is one more run on the rank's stream.
  if (job.op.runs_answered[rank] >= job.op.runs_sent[rank]) return;
  ++job.op.runs_answered[rank];
  if (job.op.runs_answered[rank] == job.op.runs_sent[rank] && done.step() == job.op.step &&
      rank < static_cast<int>(job.op.gens.size())) {
    job.op.gens[rank] = done;
  }
}

void CoordinatorCore::RecordWorkerError(Job& job, const WorkerRecord& worker,
                                        const v1::WorkerError& e) {
  const int rank = worker.rank;
  const std::string label = WorkerLabel(worker.info.name(), rank);
  if (job.commit.step >= 0 && e.step() == job.commit.step && !job.commit.committed[rank]) {
    // About the unconfirmed Commit (a refusal, or a link that failed before the rank confirmed
    // it), never the answer to a later RunStep, which names that later step.
    Log(absl::StrCat("job ", job.id, " step ", e.step(), " (commit): ", label, " reported ",
                     CodeName(e), ": ", e.message()),
        logging::LogLevel::kWarning);
    if (job.commit.refusal.ok()) {
      job.commit.refusal =
          control::StatusFromWorkerError(e, absl::StrCat(label, ", step ", e.step()));
    }
    return;
  }
  // While a RunStep is unanswered, an error is its answer (see RecordStepDone): one answering an
  // earlier attempt must not fail the current one. Otherwise it concerns the current operation
  // (Assign, SaveShards, a link) if it names its step; during assignment any step counts.
  bool this_op = job.state == JobState::kAssigning || job.state == JobState::kRecovering ||
                 e.step() == job.op.step;
  if (job.op.runs_answered[rank] < job.op.runs_sent[rank]) {
    ++job.op.runs_answered[rank];
    this_op = this_op && job.op.runs_answered[rank] == job.op.runs_sent[rank];
  }
  Log(absl::StrCat("job ", job.id, " step ", e.step(), ": ", label, " at ", worker.info.address(),
                   " reported ", CodeName(e), ": ", e.message()),
      logging::LogLevel::kWarning);
  if (this_op && job.op.error.ok()) {
    job.op.error = control::StatusFromWorkerError(e, absl::StrCat(label, ", step ", e.step()));
  }
}

void CoordinatorCore::OnWorkerGone(WorkerChannel* channel, const std::string& name) {
  absl::MutexLock lock(&mu_);
  if (name.empty()) return;
  const WorkerRecord* worker = workers_.Find(name);
  if (worker == nullptr || worker->channel != channel) return;
  const std::string job_id = worker->job;
  const int rank = worker->rank;
  Log(absl::StrCat("worker '", name, "' at ", worker->info.address(), " is gone",
                   job_id.empty() ? "" : absl::StrCat(" (job ", job_id, ", rank ", rank, ")")),
      logging::LogLevel::kWarning);
  workers_.Remove(name);
  LoseRank(job_id, name, rank, "lost", "its Join stream ended");
  event_cv_.SignalAll();
}

void CoordinatorCore::EvictWorker(const std::string& name, const std::string& cause,
                                  const std::string& why) {
  const WorkerRecord* worker = workers_.Find(name);
  if (worker == nullptr) return;
  Log(absl::StrCat("evicting worker '", name, "': ", why), logging::LogLevel::kWarning);
  const std::string job_id = worker->job;
  const int rank = worker->rank;
  worker->channel->Close(absl::AbortedError(absl::StrCat("evicted: ", why)));
  workers_.Remove(name);  // OnWorkerGone then finds nothing to do.
  LoseRank(job_id, name, rank, cause, absl::StrCat("evicted: ", why));
  event_cv_.SignalAll();
}

void CoordinatorCore::LoseRank(const std::string& job_id, const std::string& name, int rank,
                               const std::string& cause, const std::string& why) {
  if (job_id.empty()) return;
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return;
  Job& job = *it->second;
  job.mu.AssertHeld();
  if (IsTerminal(job.state)) return;
  if (std::find(job.joining.begin(), job.joining.end(), name) != job.joining.end()) {
    // A worker joining a growth: the growth fails and the job keeps its shape (job_growth.cc).
    if (job.op.error.ok()) {
      job.op.error = absl::AbortedError(
          absl::StrCat("worker '", name, "', joining job '", job.id, "', was ", cause, ": ", why));
    }
    return;
  }
  if (job.spec.recover()) {
    BeginRecovery(job, name, rank, cause);
  } else {
    FailJob(job,
            absl::StrCat(WorkerLabel(name, rank), " was ", cause == "lost" ? "lost: " : "", why));
  }
}

void CoordinatorCore::EvictRanks(Job& job, const std::vector<int>& ranks, const std::string& why) {
  std::vector<std::string> names;
  for (int rank : ranks) names.push_back(job.workers[rank]);
  for (const std::string& name : names) EvictWorker(name, "deadline", why);
}

}  // namespace pipetrain::coordinator
