#include "server/coordinator/coordinator_service.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/io/file_util.h"
#include "common/net/transport_security.h"
#include "common/util/status_macros.h"
#include "common/wire/grpc_status.h"
#include "server/control/control_proto.h"
#include "server/coordinator/job_isa.h"
#include "server/coordinator/reactors.h"
#include "server/logging/daemon_log.h"

namespace pipetrain::coordinator {
namespace {

// "job-<8 random hex digits>-": a fresh prefix per process, so that ids never repeat across
// restarts.
std::string NewJobIdPrefix() {
  std::random_device rd;
  return absl::StrFormat("job-%08x-", static_cast<uint32_t>(rd()));
}

}  // namespace

void AllowClientKeepalive(grpc::ServerBuilder& builder) {
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 500);
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
}

absl::Status CoordinatorOptions::Check() const {
  if (assign_timeout <= absl::ZeroDuration() || step_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("assign_timeout and step_timeout must be > 0");
  }
  if (step_deadline_floor <= absl::ZeroDuration() || !(step_deadline_factor >= 1) ||
      !std::isfinite(step_deadline_factor)) {
    return absl::InvalidArgumentError(
        absl::StrCat("the step deadline needs a floor > 0 and a factor >= 1, got ",
                     absl::FormatDuration(step_deadline_floor), " and ", step_deadline_factor));
  }
  if (wait_report_interval <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("wait_report_interval must be > 0");
  }
  if (client_lease <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("client_lease must be > 0, got ", absl::FormatDuration(client_lease)));
  }
  if (job_retention < absl::ZeroDuration() || max_ended_jobs < 0) {
    return absl::InvalidArgumentError("job_retention and max_ended_jobs must be >= 0");
  }
  if (housekeeping_interval <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("housekeeping_interval must be > 0");
  }
  if (job_limits.max_layers < 1 || job_limits.max_microbatches < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max-layers and --max-microbatches must be >= 1, got ",
                     job_limits.max_layers, " and ", job_limits.max_microbatches));
  }
  return link.Check();
}

std::string CoordinatorService::WorkerLabel(const std::string& name, int rank) {
  return absl::StrCat("worker '", name, "' (rank ", rank, ")");
}

// ---------------------------------------------------------------- service

CoordinatorService::CoordinatorService(CoordinatorOptions options)
    : options_(std::move(options)),
      id_prefix_(NewJobIdPrefix()),
      housekeeping_thread_([this] { HousekeepingLoop(); }) {}

CoordinatorService::~CoordinatorService() {
  Shutdown();
  admission_.reset();  // runs what is queued (each CreateJob fails: shutting down) and joins.
  {
    absl::MutexLock lock(&housekeeping_mu_);
    stop_housekeeping_ = true;
  }
  housekeeping_thread_.join();
  // Every job's OpThread runs what is queued (each operation sees the shutdown and returns) and
  // exits; the threads are joined as the jobs are destroyed, outside mu_.
  std::map<std::string, std::unique_ptr<Job>> jobs;
  {
    absl::MutexLock lock(&mu_);
    jobs.swap(jobs_);
  }
  for (auto& [id, job] : jobs) {
    if (job->ops != nullptr) job->ops->Close();
  }
  jobs.clear();
}

void CoordinatorService::Shutdown() {
  absl::MutexLock lock(&mu_);
  if (shutting_down_) return;
  shutting_down_ = true;
  for (auto& [name, conn] : workers_) {
    if (conn.reactor != nullptr) {
      conn.reactor->Close(grpc::Status(grpc::StatusCode::CANCELLED, "coordinator shutting down"));
    }
  }
  event_cv_.SignalAll();
}

absl::Status CoordinatorService::PostToJob(const std::string& id, std::function<void()> task) {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(id);
  if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("unknown job '", id, "'"));
  Job& job = *it->second;
  if (IsTerminal(job.state)) return EndedError(job);
  if (job.ops == nullptr || !job.ops->Post(std::move(task))) {
    return absl::FailedPreconditionError(absl::StrCat("job '", id, "' takes no more work"));
  }
  return absl::OkStatus();
}

void CoordinatorService::HousekeepingLoop() {
  for (;;) {
    {
      absl::MutexLock lock(&housekeeping_mu_);
      if (housekeeping_mu_.AwaitWithTimeout(absl::Condition(&stop_housekeeping_),
                                            options_.housekeeping_interval)) {
        return;
      }
    }
    std::vector<std::unique_ptr<OpThread>> finished;
    {
      absl::MutexLock lock(&mu_);
      finished = Housekeep(absl::Now());
      RecordStateMetrics();
    }
    finished.clear();  // joins the pruned jobs' threads, outside mu_.
  }
}

std::vector<std::unique_ptr<OpThread>> CoordinatorService::Housekeep(absl::Time now) {
  std::vector<std::unique_ptr<OpThread>> finished;
  if (shutting_down_) return finished;
  std::vector<Job*> ended;
  for (auto& [id, job] : jobs_) {
    if (!IsTerminal(job->state) && job->train_owner == nullptr && now >= job->lease_expiry) {
      EndJob(*job, JobState::kCancelled,
             absl::StrCat("client gone: no Train stream or client call for ",
                          absl::FormatDuration(options_.client_lease), " (the client lease)"));
    }
    if (IsTerminal(job->state)) ended.push_back(job.get());
  }
  // Oldest ended first; drop those past the retention period or beyond the cap, once their
  // OpThread has run its last task.
  std::sort(ended.begin(), ended.end(),
            [](const Job* a, const Job* b) { return a->ended < b->ended; });
  const size_t excess = ended.size() > static_cast<size_t>(options_.max_ended_jobs)
                            ? ended.size() - static_cast<size_t>(options_.max_ended_jobs)
                            : 0;
  for (size_t i = 0; i < ended.size(); ++i) {
    Job* job = ended[i];
    if (i >= excess && now - job->ended < options_.job_retention) continue;
    if (job->ops != nullptr && !job->ops->Finished()) continue;
    finished.push_back(std::move(job->ops));
    jobs_.erase(job->id);
  }
  return finished;
}

// ---- handlers

grpc::ServerBidiReactor<v1::WorkerEvent, v1::WorkerCommand>* CoordinatorService::Join(
    grpc::CallbackServerContext* context) {
  std::optional<std::vector<std::string>> names;
  if (options_.check_worker_certificates) {
    const std::shared_ptr<const grpc::AuthContext> auth = context->auth_context();
    names = auth == nullptr ? std::vector<std::string>() : net::PeerCertificateNames(*auth);
  }
  return new JoinReactor(this, std::move(names));
}

grpc::ServerBidiReactor<v1::TrainRequest, v1::StepResult>* CoordinatorService::Train(
    grpc::CallbackServerContext* /*context*/) {
  return new TrainReactor(this);
}

grpc::ServerUnaryReactor* CoordinatorService::CreateJob(grpc::CallbackServerContext* context,
                                                        const v1::CreateJobRequest* request,
                                                        v1::JobStatus* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  admission_->Post([this, reactor, request, response] {
    DoCreateJob(request->spec(), [reactor, response](absl::StatusOr<v1::JobStatus> status) {
      if (status.ok()) *response = *std::move(status);
      reactor->Finish(wire::ToGrpcStatus(status.status()));
    });
  });
  return reactor;
}

grpc::ServerUnaryReactor* CoordinatorService::Checkpoint(grpc::CallbackServerContext* context,
                                                         const v1::CheckpointRequest* request,
                                                         v1::CheckpointResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  const absl::Status posted = PostToJob(request->job(), [this, reactor, request, response] {
    absl::StatusOr<v1::CheckpointResponse> result = DoCheckpoint(*request);
    if (result.ok()) *response = *std::move(result);
    reactor->Finish(wire::ToGrpcStatus(result.status()));
  });
  if (!posted.ok()) reactor->Finish(wire::ToGrpcStatus(posted));
  return reactor;
}

grpc::ServerUnaryReactor* CoordinatorService::AnswerWithJob(
    grpc::CallbackServerContext* context, const std::string& id, v1::JobStatus* response,
    const std::function<absl::Status(Job&)>& act) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  absl::Status status;
  {
    absl::MutexLock lock(&mu_);
    absl::StatusOr<Job*> job = FindJob(id);
    status = job.status();
    if (job.ok()) status = act(**job);
    if (status.ok()) *response = StatusOf(**job);
  }
  reactor->Finish(wire::ToGrpcStatus(status));
  return reactor;
}

grpc::ServerUnaryReactor* CoordinatorService::GetJob(grpc::CallbackServerContext* context,
                                                     const v1::GetJobRequest* request,
                                                     v1::JobStatus* response) {
  return AnswerWithJob(context, request->job(), response, [](Job&) { return absl::OkStatus(); });
}

grpc::ServerUnaryReactor* CoordinatorService::FinishJob(grpc::CallbackServerContext* context,
                                                        const v1::FinishJobRequest* request,
                                                        v1::JobStatus* response) {
  return AnswerWithJob(
      context, request->job(), response, [this](Job& job) ABSL_NO_THREAD_SAFETY_ANALYSIS {
        // Runs under mu_ (AnswerWithJob holds it); lambdas are not analysed with their caller.
        if (IsTerminal(job.state)) return EndedError(job);
        if (job.state != JobState::kReady) {
          return absl::FailedPreconditionError(
              absl::StrCat("job '", job.id, "' is ", JobStateName(job.state),
                           ": finish it once its operation is over (end its Train stream "
                           "first), or cancel it"));
        }
        EndJob(job, JobState::kDone, "");
        return absl::OkStatus();
      });
}

grpc::ServerUnaryReactor* CoordinatorService::CancelJob(grpc::CallbackServerContext* context,
                                                        const v1::CancelJobRequest* request,
                                                        v1::JobStatus* response) {
  const std::string reason =
      request->reason().empty() ? "cancelled by a client" : request->reason();
  return AnswerWithJob(context, request->job(), response,
                       [this, &reason](Job& job) ABSL_NO_THREAD_SAFETY_ANALYSIS {
                         // Under mu_, as above.
                         if (!IsTerminal(job.state)) EndJob(job, JobState::kCancelled, reason);
                         return absl::OkStatus();
                       });
}

grpc::ServerUnaryReactor* CoordinatorService::ListJobs(grpc::CallbackServerContext* context,
                                                       const v1::ListJobsRequest* /*request*/,
                                                       v1::ListJobsResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  {
    absl::MutexLock lock(&mu_);
    std::vector<const Job*> order;
    for (const auto& [id, job] : jobs_) order.push_back(job.get());
    std::sort(order.begin(), order.end(), [](const Job* a, const Job* b) {
      return a->created != b->created ? a->created < b->created : a->id < b->id;
    });
    for (const Job* job : order) *response->add_jobs() = StatusOf(*job);
  }
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerUnaryReactor* CoordinatorService::ListWorkers(grpc::CallbackServerContext* context,
                                                          const v1::ListWorkersRequest* /*request*/,
                                                          v1::ListWorkersResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  {
    absl::MutexLock lock(&mu_);
    std::vector<const WorkerConn*> order;
    for (const auto& [name, conn] : workers_) order.push_back(&conn);
    std::sort(order.begin(), order.end(),
              [](const WorkerConn* a, const WorkerConn* b) { return a->order < b->order; });
    for (const WorkerConn* conn : order) {
      v1::WorkerInfo* w = response->add_workers();
      w->set_name(conn->info.name());
      w->set_address(conn->info.address());
      w->set_cores(conn->info.cores());
      w->set_gflops(conn->info.gflops());
      *w->mutable_isa_levels() = conn->info.isa_levels();
      w->set_memory_bytes(conn->info.memory_bytes());
      w->set_job(conn->job);
      w->set_rank(conn->rank);
    }
  }
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerWriteReactor<v1::StateChunk>* CoordinatorService::FetchState(
    grpc::CallbackServerContext* /*context*/, const v1::FetchStateRequest* request) {
  std::vector<StateFile> files;
  absl::Status status;
  {
    absl::MutexLock lock(&mu_);
    status = StateFilesFor(*request, &files);
  }
  return new StateReactor(std::move(files), status);
}

grpc::ServerReadReactor<v1::PutStateRequest>* CoordinatorService::PutState(
    grpc::CallbackServerContext* /*context*/, v1::PutStateResponse* response) {
  return new UploadReactor(this, response);
}

absl::StatusOr<const CoordinatorService::Job*> CoordinatorService::LiveJobAt(const std::string& id,
                                                                             int64_t epoch) const {
  auto it = jobs_.find(id);
  if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("unknown job '", id, "'"));
  const Job& job = *it->second;
  if (IsTerminal(job.state)) return EndedError(job);
  if (epoch != job.epoch) {
    return absl::AbortedError(
        absl::StrCat("job '", job.id, "' is at epoch ", job.epoch, ", not ", epoch));
  }
  return &job;
}

absl::StatusOr<int> CoordinatorService::RankOf(const Job& job, const std::string& worker) const {
  auto w = std::find(job.workers.begin(), job.workers.end(), worker);
  auto conn = workers_.find(worker);
  if (w == job.workers.end() || conn == workers_.end() || conn->second.job != job.id) {
    return absl::PermissionDeniedError(
        absl::StrCat("worker '", worker, "' holds no rank of job '", job.id, "'"));
  }
  return static_cast<int>(w - job.workers.begin());
}

absl::StatusOr<std::pair<std::string, std::map<std::string, model::CheckpointShard>>>
CoordinatorService::AcceptUpload(const v1::PutStateRequest& first) {
  absl::MutexLock lock(&mu_);
  PT_ASSIGN_OR_RETURN(const Job* found, LiveJobAt(first.job(), first.epoch()));
  const Job& job = *found;
  PT_ASSIGN_OR_RETURN(const int rank, RankOf(job, first.worker()));
  if (job.checkpoint_staging.empty() || first.step() != job.op_step) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job '", job.id, "' has no checkpoint of step ", first.step(), " in progress"));
  }
  std::map<std::string, model::CheckpointShard> files;
  for (const v1::ChunkSpec& c : job.chunks) {
    if (c.worker() != rank) continue;
    for (model::CheckpointShard& s :
         model::LayerShards(*job.model, c.first_layer(), c.last_layer())) {
      files.emplace(s.file, s);
    }
  }
  return std::make_pair(job.checkpoint_staging, std::move(files));
}

absl::Status CoordinatorService::StateFilesFor(const v1::FetchStateRequest& request,
                                               std::vector<StateFile>* files) {
  PT_ASSIGN_OR_RETURN(const Job* found, LiveJobAt(request.job(), request.epoch()));
  const Job& job = *found;
  if (!job.restore.has_value()) {
    return absl::FailedPreconditionError(
        absl::StrCat("job '", job.id, "' restarts from no checkpoint"));
  }
  PT_ASSIGN_OR_RETURN(const int rank, RankOf(job, request.worker()));
  for (const model::CheckpointShard& shard : job.restore->shards) {
    for (const v1::ChunkSpec& c : job.chunks) {
      if (c.worker() == rank && shard.first_layer >= c.first_layer() &&
          shard.last_layer <= c.last_layer()) {
        files->push_back(StateFile{shard, io::JoinPath(job.restore_dir, shard.file)});
        break;
      }
    }
  }
  return absl::OkStatus();
}

// ---- reactor hooks

absl::Status CoordinatorService::OnWorkerEvent(JoinReactor* reactor, std::string* name,
                                               const v1::WorkerEvent& event) {
  absl::MutexLock lock(&mu_);
  if (name->empty()) {
    if (!event.has_register_()) {
      return absl::FailedPreconditionError(
          "the first event on a Join stream must be RegisterWorker");
    }
    const v1::RegisterWorker& r = event.register_();
    if (r.name().empty()) return absl::InvalidArgumentError("RegisterWorker: empty name");
    if (r.address().empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("RegisterWorker '", r.name(), "': empty address"));
    }
    if (!(r.gflops() > 0) || !std::isfinite(r.gflops())) {
      return absl::InvalidArgumentError(
          absl::StrCat("RegisterWorker '", r.name(), "': gflops must be > 0, got ", r.gflops()));
    }
    if (r.cores() < 0 || r.memory_bytes() < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("RegisterWorker '", r.name(), "': negative cores or memory"));
    }
    // A handful of levels exist; a longer list is not a worker's (the names are logged).
    if (r.isa_levels_size() > 8) {
      return absl::InvalidArgumentError(absl::StrCat(
          "RegisterWorker '", r.name(), "': ", r.isa_levels_size(), " isa_levels, at most 8"));
    }
    for (const std::string& level : r.isa_levels()) {
      if (level.size() > 32) {
        return absl::InvalidArgumentError(absl::StrCat("RegisterWorker '", r.name(),
                                                       "': an isa_levels name of ", level.size(),
                                                       " bytes, at most 32"));
      }
    }
    if (reactor->certificate_names().has_value()) {
      // mTLS: the address peers will dial must be one the worker's certificate vouches for, so a
      // cluster member cannot advertise (and receive another's traffic at) someone else's host.
      if (absl::Status s =
              net::CheckCertificateNamesHost(*reactor->certificate_names(), r.address());
          !s.ok()) {
        const absl::Status refused =
            wire::Annotate(s, absl::StrCat("RegisterWorker '", r.name(), "'"));
        Log(std::string(refused.message()));
        return refused;
      }
    }
    if (shutting_down_) return absl::UnavailableError("coordinator shutting down");
    if (auto old = workers_.find(r.name()); old != workers_.end()) {
      if (r.incarnation() <= old->second.info.incarnation()) {
        return absl::AlreadyExistsError(
            absl::StrCat("a live worker named '", r.name(), "' is already registered (incarnation ",
                         old->second.info.incarnation(), "; this one is ", r.incarnation(), ")"));
      }
      // A restart of a worker whose old stream has not broken yet (hung, or its host gone
      // without a reset): the newer incarnation takes over.
      const std::string why =
          absl::StrCat("worker '", r.name(), "' was replaced by a newer incarnation (restarted)");
      Log(why, logging::LogLevel::kWarning);
      if (!old->second.job.empty()) {
        auto jit = jobs_.find(old->second.job);
        if (jit != jobs_.end() && !IsTerminal(jit->second->state)) {
          FailJob(*jit->second,
                  absl::StrCat(WorkerLabel(r.name(), old->second.rank), " was lost: ", why));
        }
      }
      if (old->second.reactor != nullptr) {
        old->second.reactor->Close(grpc::Status(grpc::StatusCode::CANCELLED, why));
      }
      workers_.erase(old);
    }
    WorkerConn& conn = workers_[r.name()];
    conn.info = r;
    conn.order = next_worker_order_++;
    conn.reactor = reactor;
    *name = r.name();
    Log(absl::StrFormat(
        "worker '%s' registered from %s: %d cores, %.2f GFLOP/s, instruction "
        "sets %s",
        r.name(), r.address(), r.cores(), r.gflops(), math::IsaListName(WorkerIsas(r))));
    event_cv_.SignalAll();  // a recovery may be waiting for an idle worker.
    return absl::OkStatus();
  }
  if (event.has_register_()) {
    return absl::FailedPreconditionError(
        absl::StrCat("worker '", *name, "' is already registered on this stream"));
  }
  auto wit = workers_.find(*name);
  if (wit == workers_.end() || wit->second.job.empty()) return absl::OkStatus();  // stale.
  auto jit = jobs_.find(wit->second.job);
  if (jit == jobs_.end()) return absl::OkStatus();
  Job& job = *jit->second;
  if (IsTerminal(job.state)) return absl::OkStatus();
  const int rank = wit->second.rank;
  if (rank < 0 || rank >= static_cast<int>(job.workers.size())) return absl::OkStatus();

  // Every event names (job, epoch[, step]); anything else is from an earlier assignment.
  auto current = [&](const std::string& j, int64_t epoch) {
    return j == job.id && epoch == job.epoch;
  };
  switch (event.event_case()) {
    case v1::WorkerEvent::kAssigned:
      if (current(event.assigned().job(), event.assigned().epoch())) job.assigned[rank] = true;
      break;
    case v1::WorkerEvent::kStepDone: {
      const v1::StepDone& d = event.step_done();
      if (!current(d.job(), d.epoch())) break;
      // Every RunStep gets exactly one answer (StepDone or WorkerError), in order: only the
      // answer to the latest RunStep belongs to the current attempt. An earlier one is left over
      // from an aborted attempt of the same step number.
      if (job.runs_answered[rank] >= job.runs_sent[rank]) break;
      ++job.runs_answered[rank];
      if (job.runs_answered[rank] == job.runs_sent[rank] && d.step() == job.op_step) {
        job.reports[rank] = d;
      }
      break;
    }
    case v1::WorkerEvent::kCommitted: {
      const v1::Committed& c = event.committed();
      if (current(c.job(), c.epoch()) && c.step() == job.commit_step) job.committed[rank] = true;
      break;
    }
    case v1::WorkerEvent::kShardsSaved: {
      const v1::ShardsSaved& s = event.shards_saved();
      if (current(s.job(), s.epoch()) && s.step() == job.op_step) job.saved[rank] = true;
      break;
    }
    case v1::WorkerEvent::kError: {
      const v1::WorkerError& e = event.error();
      if (!current(e.job(), e.epoch())) break;
      // While a RunStep is unanswered, an error is its answer (see kStepDone): one answering an
      // earlier attempt (e.g. the worker's report of a step the coordinator already aborted) must
      // not fail the current one. Otherwise it concerns the current operation (Assign, Commit,
      // SaveShards, a link) if it names its step; during assignment any step counts.
      if (job.commit_step >= 0 && e.step() == job.commit_step && !job.committed[rank]) {
        // About the unconfirmed Commit (a refusal, or a link that failed before the rank
        // confirmed it), never the answer to a later RunStep, which names that later step.
        Log(absl::StrCat("job ", job.id, " step ", e.step(),
                         " (commit): ", WorkerLabel(*name, rank), " reported ",
                         absl::StatusCodeToString(static_cast<absl::StatusCode>(e.code())), ": ",
                         e.message()),
            logging::LogLevel::kWarning);
        if (job.commit_error.ok()) {
          job.commit_error = control::StatusFromWorkerError(
              e, absl::StrCat(WorkerLabel(*name, rank), ", step ", e.step()));
        }
        break;
      }
      bool this_op = job.state == JobState::kAssigning || job.state == JobState::kRecovering ||
                     e.step() == job.op_step;
      if (job.runs_answered[rank] < job.runs_sent[rank]) {
        ++job.runs_answered[rank];
        this_op = this_op && job.runs_answered[rank] == job.runs_sent[rank];
      }
      Log(absl::StrCat("job ", job.id, " step ", e.step(), ": ", WorkerLabel(*name, rank), " at ",
                       wit->second.info.address(), " reported ",
                       absl::StatusCodeToString(static_cast<absl::StatusCode>(e.code())), ": ",
                       e.message()),
          logging::LogLevel::kWarning);
      if (this_op && job.op_error.ok()) {
        job.op_error = control::StatusFromWorkerError(
            e, absl::StrCat(WorkerLabel(*name, rank), ", step ", e.step()));
      }
      break;
    }
    default:
      return absl::InvalidArgumentError(absl::StrCat("worker '", *name, "' sent an empty event"));
  }
  event_cv_.SignalAll();
  return absl::OkStatus();
}

void CoordinatorService::OnWorkerGone(JoinReactor* reactor, const std::string& name) {
  absl::MutexLock lock(&mu_);
  if (name.empty()) return;
  auto it = workers_.find(name);
  if (it == workers_.end() || it->second.reactor != reactor) return;
  const std::string job_id = it->second.job;
  const int rank = it->second.rank;
  Log(absl::StrCat("worker '", name, "' at ", it->second.info.address(), " is gone",
                   job_id.empty() ? "" : absl::StrCat(" (job ", job_id, ", rank ", rank, ")")),
      logging::LogLevel::kWarning);
  workers_.erase(it);
  if (!job_id.empty()) {
    auto jit = jobs_.find(job_id);
    if (jit != jobs_.end() && !IsTerminal(jit->second->state)) {
      if (jit->second->spec.recover()) {
        BeginRecovery(*jit->second, name, rank, "lost");
      } else {
        FailJob(*jit->second,
                absl::StrCat(WorkerLabel(name, rank), " was lost: its Join stream ended"));
      }
    }
  }
  event_cv_.SignalAll();
}

void CoordinatorService::EvictWorker(const std::string& name, const std::string& cause,
                                     const std::string& why) {
  auto it = workers_.find(name);
  if (it == workers_.end()) return;
  Log(absl::StrCat("evicting worker '", name, "': ", why), logging::LogLevel::kWarning);
  const std::string job_id = it->second.job;
  const int rank = it->second.rank;
  JoinReactor* reactor = it->second.reactor;
  workers_.erase(it);  // OnWorkerGone then finds nothing to do.
  if (reactor != nullptr) {
    reactor->Close(grpc::Status(grpc::StatusCode::ABORTED, absl::StrCat("evicted: ", why)));
  }
  auto jit = jobs_.find(job_id);
  if (!job_id.empty() && jit != jobs_.end() && !IsTerminal(jit->second->state)) {
    if (jit->second->spec.recover()) {
      BeginRecovery(*jit->second, name, rank, cause);
    } else {
      FailJob(*jit->second, absl::StrCat(WorkerLabel(name, rank), " was evicted: ", why));
    }
  }
  event_cv_.SignalAll();
}

std::vector<CoordinatorService::WorkerConn*> CoordinatorService::IdleWorkers() {
  std::vector<WorkerConn*> idle;
  for (auto& [name, conn] : workers_) {
    if (conn.reactor != nullptr && conn.job.empty()) idle.push_back(&conn);
  }
  std::sort(idle.begin(), idle.end(),
            [](const WorkerConn* a, const WorkerConn* b) { return a->order < b->order; });
  return idle;
}

void CoordinatorService::BeginRecovery(Job& job, const std::string& name, int rank,
                                       const std::string& cause) {
  Log(absl::StrCat("job ", job.id, ": ", WorkerLabel(name, rank), " was ",
                   cause == "deadline" ? "evicted (step deadline)" : "lost", " at step ",
                   job.steps_done, "; recovering"),
      logging::LogLevel::kWarning);
  if (job.state == JobState::kRecovering) return;  // the recovery in progress replaces it too.
  job.state = JobState::kRecovering;
  job.recovery_start = absl::Now();
  job.recovering = v1::RecoveryEvent();
  job.recovering.set_lost_worker(name);
  job.recovering.set_rank(rank);
  job.recovering.set_cause(cause);
  job.recovering.set_failed_step(job.steps_done);
  if (job.op_error.ok()) {
    job.op_error = absl::AbortedError(
        absl::StrCat("job '", job.id, "': ", WorkerLabel(name, rank), " was lost at step ",
                     job.steps_done, "; the job is recovering (replay from its last checkpoint)"));
  }
  Job* raw = &job;  // lives while its OpThread runs tasks.
  if (job.ops != nullptr && !job.ops->Post([this, raw] { DoRecover(raw); })) {
    FailJob(job, "lost a worker while shutting down");
  }
}

absl::Status CoordinatorService::CheckReady(const Job& job) {
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

std::string CoordinatorService::EndedMessage(const Job& job) {
  return absl::StrCat("job '", job.id, "' is ", JobStateName(job.state),
                      job.reason.empty() ? "" : ": ", job.reason);
}

absl::Status CoordinatorService::EndedError(const Job& job) {
  return absl::FailedPreconditionError(EndedMessage(job));
}

absl::Status CoordinatorService::InterruptedError(const Job& job) {
  switch (job.state) {
    case JobState::kCancelled:
      return absl::CancelledError(EndedMessage(job));
    case JobState::kFailed:
      return absl::UnavailableError(EndedMessage(job));
    default:
      return absl::FailedPreconditionError(EndedMessage(job));
  }
}

absl::StatusOr<CoordinatorService::Job*> CoordinatorService::FindJob(const std::string& id) {
  auto it = jobs_.find(id);
  if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("unknown job '", id, "'"));
  Job* job = it->second.get();
  if (!IsTerminal(job->state) && job->train_owner == nullptr) {
    job->lease_expiry = absl::Now() + options_.client_lease;
  }
  return job;
}

absl::StatusOr<CoordinatorService::Job*> CoordinatorService::ReadyJob(const std::string& id) {
  PT_ASSIGN_OR_RETURN(Job * job, FindJob(id));
  PT_RETURN_IF_ERROR(CheckReady(*job));
  return job;
}

absl::Status CoordinatorService::ClaimJob(const std::string& job_id, const void* owner) {
  absl::MutexLock lock(&mu_);
  PT_ASSIGN_OR_RETURN(Job * found, FindJob(job_id));
  Job& job = *found;
  if (job.train_owner != nullptr && job.train_owner != owner) {
    return absl::FailedPreconditionError(
        absl::StrCat("job '", job_id,
                     "' already has an active Train stream; only one client may train a job at a "
                     "time"));
  }
  if (IsTerminal(job.state)) return EndedError(job);
  if (job.state == JobState::kAssigning) {
    return absl::FailedPreconditionError(absl::StrCat("job '", job_id, "' is not ready yet"));
  }
  job.train_owner = owner;
  job.lease_expiry = absl::InfiniteFuture();
  return absl::OkStatus();
}

void CoordinatorService::ReleaseJob(const std::string& job_id, const void* owner) {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end() || it->second->train_owner != owner) return;
  Job& job = *it->second;
  job.train_owner = nullptr;
  if (!IsTerminal(job.state)) job.lease_expiry = absl::Now() + options_.client_lease;
}

// ---- helpers

void CoordinatorService::SendToRank(Job& job, int rank, const v1::WorkerCommand& command) {
  auto it = workers_.find(job.workers[rank]);
  if (it == workers_.end() || it->second.job != job.id || it->second.reactor == nullptr) return;
  it->second.reactor->Send(command);
}

std::vector<std::string> CoordinatorService::RankAddresses(const Job& job) const {
  std::vector<std::string> addresses;
  addresses.reserve(job.workers.size());
  for (const std::string& name : job.workers) {
    auto it = workers_.find(name);
    addresses.push_back(it == workers_.end() ? "" : it->second.info.address());
  }
  return addresses;
}

void CoordinatorService::AbortStep(Job& job, int64_t step, const std::string& reason) {
  v1::WorkerCommand command;
  v1::Abort* abort = command.mutable_abort();
  abort->set_job(job.id);
  abort->set_epoch(job.epoch);
  abort->set_step(step);
  abort->set_reason(reason);
  for (int rank = 0; rank < static_cast<int>(job.workers.size()); ++rank) {
    SendToRank(job, rank, command);
  }
}

void CoordinatorService::EndJob(Job& job, JobState state, const std::string& reason) {
  if (IsTerminal(job.state)) return;
  Log(absl::StrCat("job ", job.id, " ", JobStateName(state), " after ", job.steps_done, " steps",
                   reason.empty() ? "" : ": ", reason),
      state == JobState::kFailed ? logging::LogLevel::kError : logging::LogLevel::kInfo);
  if (job.state == JobState::kTraining && job.op_step >= 0) AbortStep(job, job.op_step, reason);
  v1::WorkerCommand command;
  v1::Release* release = command.mutable_release();
  release->set_job(job.id);
  release->set_epoch(job.epoch);
  release->set_reason(
      absl::StrCat("job ", JobStateName(state), reason.empty() ? "" : ": ", reason));
  for (int rank = 0; rank < static_cast<int>(job.workers.size()); ++rank) {
    SendToRank(job, rank, command);
  }
  for (auto& [name, conn] : workers_) {
    if (conn.job == job.id) {
      conn.job.clear();
      conn.rank = -1;
    }
  }
  if (journal_ != nullptr) {
    // Under mu_ (an unlink and a directory fsync): an ended job must not come back after a
    // restart.
    if (const absl::Status removed = journal_->Remove(job.id); !removed.ok()) {
      Log(absl::StrCat("job ", job.id, ": cannot remove its journal record: ", removed.ToString()));
    }
  }
  job.state = state;
  job.reason = reason;
  job.ended = absl::Now();
  job.lease_expiry = absl::InfiniteFuture();
  if (job.ops != nullptr) {
    // The job's operation in flight (if any) sees the end and returns; then its links close and
    // the thread exits (joined by housekeeping once the job is pruned).
    const std::string id = job.id;
    job.ops->Post([this, id] { CloseJobLinks(id); });
    job.ops->Close();
  }
  event_cv_.SignalAll();
}

v1::JobStatus CoordinatorService::StatusOf(const Job& job) const {
  v1::JobStatus s;
  s.set_job(job.id);
  s.set_state(JobStateToProto(job.state));
  s.set_epoch(job.epoch);
  s.set_steps_done(job.steps_done);
  s.set_reason(job.reason);
  s.set_imbalance(job.imbalance);
  s.set_created_unix_ms(absl::ToUnixMillis(job.created));
  if (IsTerminal(job.state)) s.set_ended_unix_ms(absl::ToUnixMillis(job.ended));
  *s.mutable_spec() = job.spec;
  s.set_client_attached(job.train_owner != nullptr);
  for (const v1::RecoveryEvent& r : job.recoveries) *s.add_recoveries() = r;
  if (job.resume.has_value()) {
    v1::ResumedFrom* r = s.mutable_resumed_from();
    r->set_directory(job.resume_dir);
    r->set_step(job.resume->step);
    r->set_data(job.resume->data);
    r->set_batch_size(job.resume->batch_size);
    r->set_cursor_epoch(job.resume->data_cursor.epoch);
    r->set_cursor_batch(job.resume->data_cursor.batch);
  }
  const std::vector<std::string> addresses = RankAddresses(job);
  for (int rank = 0; rank < static_cast<int>(job.workers.size()); ++rank) {
    v1::StageStatus* st = s.add_stages();
    st->set_rank(rank);
    st->set_worker(job.workers[rank]);
    st->set_address(addresses[rank]);
    for (const v1::ChunkSpec& c : job.chunks) {
      if (c.worker() == rank) *st->add_chunks() = c;
    }
  }
  return s;
}

absl::Status CoordinatorService::FailStep(Job& job, int64_t step, const absl::Status& status) {
  if (job.state == JobState::kTraining) {
    AbortStep(job, step, status.ToString());
    job.state = JobState::kReady;
  }
  job.op_step = -1;
  return status;
}

absl::Status CoordinatorService::AwaitOp(Job& job, const std::function<bool()>& done,
                                         absl::Duration timeout, const std::string& what,
                                         const std::function<void(absl::Duration)>& on_wait) {
  const absl::Time start = absl::Now();
  const absl::Time deadline = start + timeout;
  absl::Time next_report = start + options_.wait_report_interval;
  for (;;) {
    if (shutting_down_) return absl::CancelledError("coordinator shutting down");
    if (IsTerminal(job.state)) return InterruptedError(job);
    if (!job.op_error.ok()) return job.op_error;
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
    event_cv_.WaitWithDeadline(&mu_,
                               on_wait != nullptr ? std::min(deadline, next_report) : deadline);
  }
}

void CoordinatorService::Log(const std::string& message, logging::LogLevel level) const {
  if (options_.log != nullptr) {
    options_.log(level, message);
    return;
  }
  logging::Log("coordinator", level, message);
}

}  // namespace pipetrain::coordinator
