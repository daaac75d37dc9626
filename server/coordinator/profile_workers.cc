// ProfileWorkers: every idle worker times the layers of a model (ProfileLayers on its control
// stream) and the coordinator gathers their answers, each worker's error apart, by a deadline.
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/plan/layer_costs_proto.h"
#include "common/util/status_macros.h"
#include "server/coordinator/coordinator_core.h"
#include "server/coordinator/job_isa.h"

namespace pipetrain::coordinator {
namespace {

// The request's bounds (the workers check the same).
constexpr int kMaxSampleCounts = plan::kMaxProfileSampleCounts;
constexpr int64_t kMaxSamples = plan::kMaxProfileSamples;
constexpr int kMaxThreads = 1024;
constexpr int64_t kMaxDeadlineMs = plan::kMaxProfileDeadlineMs;
constexpr int64_t kDefaultDeadlineMs = plan::kDefaultProfileDeadlineMs;

absl::Status CheckProfileRequest(const v1::ProfileWorkersRequest& r) {
  if (r.model().layers_size() == 0) {
    return absl::InvalidArgumentError("ProfileWorkers: model has no layers");
  }
  if (r.samples_size() < 1 || r.samples_size() > kMaxSampleCounts) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ProfileWorkers: ", r.samples_size(), " sample counts; ask for 1 to ", kMaxSampleCounts));
  }
  for (int64_t s : r.samples()) {
    if (s < 1 || s > kMaxSamples) {
      return absl::InvalidArgumentError(
          absl::StrCat("ProfileWorkers: samples ", s, " is outside [1, ", kMaxSamples, "]"));
    }
  }
  if (r.threads() < 0 || r.threads() > kMaxThreads) {
    return absl::InvalidArgumentError(absl::StrCat("ProfileWorkers: threads ", r.threads(),
                                                   " is outside [0, ", kMaxThreads, "]"));
  }
  if (r.deadline_ms() < 0 || r.deadline_ms() > kMaxDeadlineMs) {
    return absl::InvalidArgumentError(absl::StrCat("ProfileWorkers: deadline_ms ", r.deadline_ms(),
                                                   " is outside [0, ", kMaxDeadlineMs, "]"));
  }
  return absl::OkStatus();
}

void SetError(v1::WorkerLayerProfile* entry, const absl::Status& status) {
  entry->set_code(static_cast<int32_t>(status.code()));
  entry->set_message(std::string(status.message()));
}

}  // namespace

void CoordinatorCore::ProfileWorkers(
    const v1::ProfileWorkersRequest& request,
    std::function<void(absl::StatusOr<v1::ProfileWorkersResponse>)> done) {
  {
    absl::MutexLock lock(&mu_);
    if (shutting_down_) {
      done(absl::UnavailableError("coordinator shutting down"));
      return;
    }
    if (profile_busy_) {
      done(absl::ResourceExhaustedError(
          "ProfileWorkers: another layer profile is running on the workers; retry when it ends"));
      return;
    }
    profile_busy_ = true;
  }
  const bool posted = profiler_->Post([this, request, done] {
    absl::StatusOr<v1::ProfileWorkersResponse> result = RunProfile(request);
    {
      absl::MutexLock lock(&mu_);
      profile_busy_ = false;
    }
    done(std::move(result));
  });
  if (!posted) {
    absl::MutexLock lock(&mu_);
    profile_busy_ = false;
    done(absl::UnavailableError("coordinator shutting down"));
  }
}

absl::Status CoordinatorCore::StartProfile(const v1::ProfileWorkersRequest& request,
                                           v1::ProfileWorkersResponse* response) {
  if (shutting_down_) return absl::UnavailableError("coordinator shutting down");
  std::vector<WorkerRecord*> idle = workers_.Idle();
  if (idle.empty()) {
    return absl::FailedPreconditionError(absl::StrCat("ProfileWorkers: no idle worker to profile (",
                                                      workers_.Busy(), " busy with jobs)"));
  }
  v1::JobSpec level;  // what ChooseJobIsa reads: the level asked for, if any.
  level.set_isa(request.isa());
  std::vector<const v1::RegisterWorker*> infos;
  for (const WorkerRecord* w : idle) infos.push_back(&w->info);
  PT_ASSIGN_OR_RETURN(const math::Isa isa, ChooseJobIsa(level, infos));
  response->set_isa(std::string(math::IsaName(isa)));
  ProfileRound round;
  round.id = next_profile_++;
  v1::WorkerCommand command;
  v1::ProfileLayers* p = command.mutable_profile_layers();
  p->set_profile(round.id);
  *p->mutable_model() = request.model();
  *p->mutable_samples() = request.samples();
  p->set_threads(request.threads() == 0 ? 1 : request.threads());
  *p->mutable_optimizer() = request.optimizer();
  p->set_isa(response->isa());
  p->set_deadline_ms(request.deadline_ms() == 0 ? kDefaultDeadlineMs : request.deadline_ms());
  for (WorkerRecord* w : idle) {
    v1::WorkerLayerProfile* entry = response->add_workers();
    entry->set_name(w->info.name());
    entry->set_gflops(w->info.gflops());
    round.asked[w->info.name()].channel = w->channel;
    w->channel->Send(command);
  }
  Log(absl::StrCat("profile ", round.id, ": ", idle.size(), " idle workers time ",
                   request.model().layers_size(), " layers at ", response->isa()));
  profile_ = std::move(round);
  return absl::OkStatus();
}

bool CoordinatorCore::ProfileSettled() const {
  for (const auto& [name, ask] : profile_->asked) {
    const WorkerRecord* w = workers_.Find(name);
    const bool gone = w == nullptr || w->channel != ask.channel;
    if (!ask.answer.has_value() && !gone) return false;
  }
  return true;
}

void CoordinatorCore::RecordProfile(WorkerChannel* channel, const std::string& name,
                                    const v1::LayersProfiled& p) {
  if (!profile_.has_value() || p.profile() != profile_->id) return;  // an earlier round's.
  auto it = profile_->asked.find(name);
  if (it == profile_->asked.end() || it->second.channel != channel) return;
  if (!it->second.answer.has_value()) it->second.answer = p;
  event_cv_.SignalAll();
}

absl::StatusOr<v1::ProfileWorkersResponse> CoordinatorCore::RunProfile(
    const v1::ProfileWorkersRequest& request) {
  PT_RETURN_IF_ERROR(CheckProfileRequest(request));
  const int64_t deadline_ms =
      request.deadline_ms() == 0 ? kDefaultDeadlineMs : request.deadline_ms();
  const absl::Time deadline = absl::Now() + absl::Milliseconds(deadline_ms);
  v1::ProfileWorkersResponse response;
  absl::MutexLock lock(&mu_);
  PT_RETURN_IF_ERROR(StartProfile(request, &response));
  // Each wait ends at an event (an answer, a lost worker, shutdown) or at the deadline.
  while (!shutting_down_ && !ProfileSettled()) {
    if (event_cv_.WaitWithDeadline(&mu_, deadline)) break;
  }
  const ProfileRound round = *std::move(profile_);
  profile_.reset();
  for (v1::WorkerLayerProfile& entry : *response.mutable_workers()) {
    const ProfileAsk& ask = round.asked.at(entry.name());
    const WorkerRecord* w = workers_.Find(entry.name());
    if (ask.answer.has_value()) {
      const v1::LayersProfiled& a = *ask.answer;
      entry.set_code(a.code());
      entry.set_message(a.message());
      entry.set_cpu_seconds(a.cpu_seconds());
      if (a.code() == 0 && a.costs_size() != request.samples_size()) {
        SetError(&entry, absl::InternalError(absl::StrCat("worker '", entry.name(), "' answered ",
                                                          a.costs_size(), " sample counts for the ",
                                                          request.samples_size(), " asked")));
      } else if (a.code() == 0) {
        *entry.mutable_costs() = a.costs();
      }
    } else if (w == nullptr || w->channel != ask.channel) {
      SetError(&entry, absl::UnavailableError(absl::StrCat("worker '", entry.name(),
                                                           "' was lost before it answered")));
    } else if (shutting_down_) {
      SetError(&entry, absl::UnavailableError("coordinator shutting down"));
    } else {
      SetError(&entry,
               absl::DeadlineExceededError(absl::StrCat(
                   "worker '", entry.name(), "' did not answer within ", deadline_ms, " ms")));
    }
  }
  Log(absl::StrCat("profile ", round.id, " done"));
  return response;
}

}  // namespace pipetrain::coordinator
