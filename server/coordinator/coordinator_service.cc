#include "server/coordinator/coordinator_service.h"

#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <utility>

#include "absl/strings/str_cat.h"
#include "common/math/optimizer.h"
#include "common/model/checkpoint.h"
#include "common/model/optimizer_proto.h"
#include "common/model/reference_trainer.h"
#include "common/partition/partitioner.h"
#include "common/schedule/generator.h"
#include "common/schedule/simulator.h"
#include "common/schedule/timeline.h"
#include "common/schedule/validator.h"
#include "common/util/status_macros.h"
#include "common/wire/grpc_status.h"
#include "common/wire/tensor_key.h"

namespace pipetrain::coordinator {

// ---------------------------------------------------------------- reactors

// The coordinator's end of one worker's Join stream. One read in flight at a time (events are
// handled inline, without blocking, by CoordinatorService::OnWorkerEvent); commands are queued
// and written one at a time. Deletes itself in OnDone.
class JoinReactor final : public grpc::ServerBidiReactor<v1::WorkerEvent, v1::WorkerCommand> {
 public:
  explicit JoinReactor(CoordinatorService* service) : service_(service) { StartRead(&event_); }

  // Queues `command` for writing; dropped once the stream is closing. Thread-safe, non-blocking.
  void Send(const v1::WorkerCommand& command) {
    absl::MutexLock lock(&write_mu_);
    if (closed_) return;
    queue_.push_back(command);
    if (!writing_) {
      writing_ = true;
      StartWrite(&queue_.front());
    }
  }

  // Ends the stream with `status` once the write in flight (if any) is done; later commands are
  // dropped. Thread-safe, non-blocking, idempotent.
  void Close(const grpc::Status& status) {
    absl::MutexLock lock(&write_mu_);
    if (closed_) return;
    closed_ = true;
    finish_status_ = status;
    if (writing_) {
      while (queue_.size() > 1) queue_.pop_back();
    } else {
      queue_.clear();
      Finish(finish_status_);
    }
  }

  void OnReadDone(bool ok) override {
    if (!ok) {  // the worker ended its side or the stream broke.
      Close(grpc::Status::OK);
      return;
    }
    const absl::Status status = service_->OnWorkerEvent(this, &name_, event_);
    if (!status.ok()) {
      Close(wire::ToGrpcStatus(status));
      return;
    }
    StartRead(&event_);
  }

  void OnWriteDone(bool ok) override {
    absl::MutexLock lock(&write_mu_);
    queue_.pop_front();
    writing_ = false;
    if (!ok && !closed_) {
      closed_ = true;
      finish_status_ = grpc::Status(grpc::StatusCode::UNAVAILABLE, "write to worker failed");
      queue_.clear();
    }
    if (closed_) {
      queue_.clear();
      Finish(finish_status_);
      return;
    }
    if (!queue_.empty()) {
      writing_ = true;
      StartWrite(&queue_.front());
    }
  }

  void OnDone() override {
    service_->OnWorkerGone(this, name_);
    delete this;
  }

 private:
  CoordinatorService* const service_;
  v1::WorkerEvent event_;  // the read in flight; touched only by reactions (sequential).
  std::string name_;       // set by the RegisterWorker event; reactions only.

  // Protects the write queue. Taken after CoordinatorService::mu_ when both are held.
  absl::Mutex write_mu_;
  std::deque<v1::WorkerCommand> queue_ ABSL_GUARDED_BY(write_mu_);  // front: in flight.
  bool writing_ ABSL_GUARDED_BY(write_mu_) = false;
  bool closed_ ABSL_GUARDED_BY(write_mu_) = false;
  grpc::Status finish_status_ ABSL_GUARDED_BY(write_mu_);
};

// One client's Train stream: read a batch, run its step on the job thread, write the result, read
// the next. At most one read or one write is in flight. Deletes itself in OnDone.
class TrainReactor final : public grpc::ServerBidiReactor<v1::TrainRequest, v1::StepResult> {
 public:
  explicit TrainReactor(CoordinatorService* service) : service_(service) { StartRead(&request_); }

  void OnReadDone(bool ok) override {
    if (!ok) {
      FinishAndRelease(absl::OkStatus());
      return;
    }
    if (job_.empty()) {
      const absl::Status claim = service_->ClaimJob(request_.job(), this);
      if (!claim.ok()) {
        FinishAndRelease(claim);
        return;
      }
      job_ = request_.job();
    } else if (request_.job() != job_) {
      FinishAndRelease(absl::InvalidArgumentError(
          absl::StrCat("this Train stream trains job '", job_, "', not '", request_.job(), "'")));
      return;
    }
    service_->Post([this] {
      absl::StatusOr<v1::StepResult> result = service_->DoTrainStep(request_);
      if (!result.ok()) {
        FinishAndRelease(result.status());
        return;
      }
      result_ = *std::move(result);
      StartWrite(&result_);
    });
  }

  void OnWriteDone(bool ok) override {
    if (!ok) {
      FinishAndRelease(absl::CancelledError("the client went away"));
      return;
    }
    StartRead(&request_);
  }

  void OnDone() override {
    if (!job_.empty()) service_->ReleaseJob(job_, this);
    delete this;
  }

 private:
  // Releases the job before the client can see the status, so that a new Train stream opened
  // after this one ended is never refused because of it.
  void FinishAndRelease(const absl::Status& status) {
    if (!job_.empty()) service_->ReleaseJob(job_, this);
    Finish(wire::ToGrpcStatus(status));
  }

  CoordinatorService* const service_;
  // Touched by one reaction or the job thread at a time (the stream is strictly sequential).
  v1::TrainRequest request_;
  v1::StepResult result_;
  std::string job_;
};

// ---------------------------------------------------------------- conversions

namespace {

v1::ActionOp ToProtoOp(schedule::Op op) {
  switch (op) {
    case schedule::Op::kForward:
      return v1::ACTION_OP_FORWARD;
    case schedule::Op::kBackward:
      return v1::ACTION_OP_BACKWARD;
    case schedule::Op::kInputGrad:
      return v1::ACTION_OP_INPUT_GRAD;
    case schedule::Op::kWeightGrad:
      return v1::ACTION_OP_WEIGHT_GRAD;
  }
  return v1::ACTION_OP_UNSPECIFIED;
}

bool FromProtoAction(const v1::Action& a, schedule::Action* out) {
  switch (a.op()) {
    case v1::ACTION_OP_FORWARD:
      out->op = schedule::Op::kForward;
      break;
    case v1::ACTION_OP_BACKWARD:
      out->op = schedule::Op::kBackward;
      break;
    case v1::ACTION_OP_INPUT_GRAD:
      out->op = schedule::Op::kInputGrad;
      break;
    case v1::ACTION_OP_WEIGHT_GRAD:
      out->op = schedule::Op::kWeightGrad;
      break;
    default:
      return false;
  }
  out->mb = a.microbatch();
  out->chunk = a.chunk();
  return true;
}

std::string WorkerLabel(const std::string& name, int rank) {
  return absl::StrCat("worker '", name, "' (rank ", rank, ")");
}

}  // namespace

absl::StatusOr<math::Matrix> DenseTensorToMatrix(const v1::DenseTensor& tensor,
                                                 const std::string& what) {
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

// ---------------------------------------------------------------- service

CoordinatorService::CoordinatorService(CoordinatorOptions options)
    : options_(std::move(options)), job_thread_([this] { JobThreadLoop(); }) {}

CoordinatorService::~CoordinatorService() {
  Shutdown();
  {
    absl::MutexLock lock(&queue_mu_);
    stop_thread_ = true;
  }
  job_thread_.join();
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

void CoordinatorService::Post(std::function<void()> task) {
  absl::MutexLock lock(&queue_mu_);
  queue_.push_back(std::move(task));
}

void CoordinatorService::JobThreadLoop() {
  for (;;) {
    std::function<void()> task;
    {
      absl::MutexLock lock(&queue_mu_);
      queue_mu_.Await(absl::Condition(this, &CoordinatorService::HasTaskOrStop));
      if (queue_.empty()) return;  // stop_thread_ and drained.
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    task();
  }
}

// ---- handlers

grpc::ServerBidiReactor<v1::WorkerEvent, v1::WorkerCommand>* CoordinatorService::Join(
    grpc::CallbackServerContext* /*context*/) {
  return new JoinReactor(this);
}

grpc::ServerBidiReactor<v1::TrainRequest, v1::StepResult>* CoordinatorService::Train(
    grpc::CallbackServerContext* /*context*/) {
  return new TrainReactor(this);
}

grpc::ServerUnaryReactor* CoordinatorService::CreateJob(grpc::CallbackServerContext* context,
                                                        const v1::CreateJobRequest* request,
                                                        v1::JobStatus* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  Post([this, reactor, request, response] {
    absl::StatusOr<v1::JobStatus> status = DoCreateJob(request->spec());
    if (status.ok()) *response = *std::move(status);
    reactor->Finish(wire::ToGrpcStatus(status.status()));
  });
  return reactor;
}

grpc::ServerUnaryReactor* CoordinatorService::Checkpoint(grpc::CallbackServerContext* context,
                                                         const v1::CheckpointRequest* request,
                                                         v1::CheckpointResponse* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  Post([this, reactor, request, response] {
    absl::StatusOr<v1::CheckpointResponse> result = DoCheckpoint(*request);
    if (result.ok()) *response = *std::move(result);
    reactor->Finish(wire::ToGrpcStatus(result.status()));
  });
  return reactor;
}

grpc::ServerUnaryReactor* CoordinatorService::GetJob(grpc::CallbackServerContext* context,
                                                     const v1::GetJobRequest* request,
                                                     v1::JobStatus* response) {
  grpc::ServerUnaryReactor* reactor = context->DefaultReactor();
  absl::Status status;
  {
    absl::MutexLock lock(&mu_);
    auto it = jobs_.find(request->job());
    if (it == jobs_.end()) {
      status = absl::NotFoundError(absl::StrCat("unknown job '", request->job(), "'"));
    } else {
      *response = StatusOf(*it->second);
    }
  }
  reactor->Finish(wire::ToGrpcStatus(status));
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
      w->set_memory_bytes(conn->info.memory_bytes());
      w->set_job(conn->job);
      w->set_rank(conn->rank);
    }
  }
  reactor->Finish(grpc::Status::OK);
  return reactor;
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
    if (shutting_down_) return absl::UnavailableError("coordinator shutting down");
    if (workers_.count(r.name()) != 0) {
      return absl::AlreadyExistsError(
          absl::StrCat("a live worker named '", r.name(), "' is already registered"));
    }
    WorkerConn& conn = workers_[r.name()];
    conn.info = r;
    conn.order = next_worker_order_++;
    conn.reactor = reactor;
    *name = r.name();
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
      if (current(c.job(), c.epoch()) && c.step() == job.op_step) job.committed[rank] = true;
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
      bool this_op = job.state == "assigning" || e.step() == job.op_step;
      if (job.runs_answered[rank] < job.runs_sent[rank]) {
        ++job.runs_answered[rank];
        this_op = this_op && job.runs_answered[rank] == job.runs_sent[rank];
      }
      if (this_op && job.op_error.ok()) {
        int code = e.code();
        if (code <= 0 || code > static_cast<int>(absl::StatusCode::kUnauthenticated)) {
          code = static_cast<int>(absl::StatusCode::kUnknown);
        }
        job.op_error = absl::Status(
            static_cast<absl::StatusCode>(code),
            absl::StrCat(WorkerLabel(*name, rank), ", step ", e.step(), ": ", e.message()));
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
  workers_.erase(it);
  if (!job_id.empty()) {
    auto jit = jobs_.find(job_id);
    if (jit != jobs_.end() && jit->second->state != "failed") {
      FailJob(*jit->second,
              absl::StrCat(WorkerLabel(name, rank), " was lost: its Join stream ended"));
    }
  }
  event_cv_.SignalAll();
}

absl::Status CoordinatorService::CheckReady(const Job& job) {
  if (job.state == "ready") return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat("job '", job.id, "' is ", job.state, job.error.empty() ? "" : ": ", job.error));
}

absl::StatusOr<CoordinatorService::Job*> CoordinatorService::ReadyJob(const std::string& id) {
  auto it = jobs_.find(id);
  if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("unknown job '", id, "'"));
  PT_RETURN_IF_ERROR(CheckReady(*it->second));
  return it->second.get();
}

absl::Status CoordinatorService::ClaimJob(const std::string& job_id, const void* owner) {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return absl::NotFoundError(absl::StrCat("unknown job '", job_id, "'"));
  Job& job = *it->second;
  if (job.train_owner != nullptr && job.train_owner != owner) {
    return absl::FailedPreconditionError(
        absl::StrCat("job '", job_id,
                     "' already has an active Train stream; only one client may train a job at a "
                     "time"));
  }
  if (job.state == "failed") {
    return absl::FailedPreconditionError(absl::StrCat("job '", job_id, "' failed: ", job.error));
  }
  if (job.state == "assigning") {
    return absl::FailedPreconditionError(absl::StrCat("job '", job_id, "' is not ready yet"));
  }
  job.train_owner = owner;
  return absl::OkStatus();
}

void CoordinatorService::ReleaseJob(const std::string& job_id, const void* owner) {
  absl::MutexLock lock(&mu_);
  auto it = jobs_.find(job_id);
  if (it != jobs_.end() && it->second->train_owner == owner) it->second->train_owner = nullptr;
}

// ---- helpers

void CoordinatorService::SendToRank(Job& job, int rank, const v1::WorkerCommand& command) {
  auto it = workers_.find(job.workers[rank]);
  if (it == workers_.end() || it->second.job != job.id || it->second.reactor == nullptr) return;
  it->second.reactor->Send(command);
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

void CoordinatorService::FailJob(Job& job, const std::string& error) {
  if (job.state == "training") AbortStep(job, job.op_step, error);
  job.state = "failed";
  job.error = error;
  for (auto& [name, conn] : workers_) {
    if (conn.job == job.id) {
      conn.job.clear();
      conn.rank = -1;
    }
  }
  event_cv_.SignalAll();
}

v1::JobStatus CoordinatorService::StatusOf(const Job& job) const {
  v1::JobStatus s;
  s.set_job(job.id);
  s.set_state(job.state);
  s.set_epoch(job.epoch);
  s.set_steps_done(job.steps_done);
  s.set_error(job.error);
  s.set_imbalance(job.imbalance);
  for (int rank = 0; rank < static_cast<int>(job.workers.size()); ++rank) {
    v1::StageStatus* st = s.add_stages();
    st->set_rank(rank);
    st->set_worker(job.workers[rank]);
    auto it = workers_.find(job.workers[rank]);
    if (it != workers_.end()) st->set_address(it->second.info.address());
    for (const v1::ChunkSpec& c : job.chunks) {
      if (c.worker() == rank) *st->add_chunks() = c;
    }
  }
  return s;
}

absl::Status CoordinatorService::FailStep(Job& job, int64_t step, const absl::Status& status) {
  if (job.state == "training") {
    AbortStep(job, step, status.ToString());
    job.state = "ready";
  }
  job.op_step = -1;
  return status;
}

absl::Status CoordinatorService::AwaitOp(Job& job, const std::function<bool()>& done,
                                         absl::Duration timeout, const std::string& what) {
  const absl::Time deadline = absl::Now() + timeout;
  for (;;) {
    if (shutting_down_) return absl::CancelledError("coordinator shutting down");
    if (job.state == "failed") {
      return absl::UnavailableError(absl::StrCat("job '", job.id, "' failed: ", job.error));
    }
    if (!job.op_error.ok()) return job.op_error;
    if (done()) return absl::OkStatus();
    if (event_cv_.WaitWithDeadline(&mu_, deadline) && !done()) {
      return absl::DeadlineExceededError(absl::StrCat("job '", job.id, "': timed out after ",
                                                      absl::FormatDuration(timeout),
                                                      " waiting for ", what));
    }
  }
}

// ---- operations (job thread)

void CoordinatorService::CloseLinksOfFailedJobs() {
  std::vector<std::shared_ptr<worker::PeerLink>> dead;
  {
    absl::MutexLock lock(&mu_);
    for (auto& [id, job] : jobs_) {
      if (job->state != "failed") continue;
      for (auto& [rank, link] : job->links) dead.push_back(std::move(link));
      job->links.clear();
    }
  }
  // Outside mu_: Shutdown waits for a running link callback, which may be waiting for mu_.
  for (auto& link : dead) link->Shutdown();
}

absl::StatusOr<v1::JobStatus> CoordinatorService::DoCreateJob(const v1::JobSpec& request) {
  CloseLinksOfFailedJobs();
  v1::JobSpec spec = request;
  PT_ASSIGN_OR_RETURN(schedule::ScheduleKind kind, schedule::ParseScheduleKind(spec.schedule()));
  if (spec.virtual_stages() == 0) {
    spec.set_virtual_stages(schedule::DefaultVirtualStages(kind));
  }
  if (spec.threads() == 0) spec.set_threads(1);
  if (spec.threads() < 1) {
    return absl::InvalidArgumentError(absl::StrCat("threads must be >= 1, got ", spec.threads()));
  }
  schedule::ScheduleParams params;
  params.kind = kind;
  params.stages = spec.stages();
  params.microbatches = spec.microbatches();
  params.virtual_stages = spec.virtual_stages();
  PT_RETURN_IF_ERROR(schedule::CheckScheduleParams(params));
  PT_RETURN_IF_ERROR(model::OptimizerFromProto(spec.optimizer()).status());
  PT_ASSIGN_OR_RETURN(std::unique_ptr<model::Model> built, model::Model::Build(spec.model()));
  std::shared_ptr<const model::Model> net = std::move(built);
  const int S = spec.stages();
  const int V = spec.virtual_stages();
  const int C = S * V;
  if (net->num_layers() < C) {
    return absl::InvalidArgumentError(absl::StrCat("the model has ", net->num_layers(),
                                                   " layers, fewer than the ", C, " chunks of ", S,
                                                   " stages x ", V, " virtual stages"));
  }
  PT_ASSIGN_OR_RETURN(schedule::Plan plan, schedule::GenerateSchedule(params));
  PT_RETURN_IF_ERROR(schedule::ValidatePlan(plan));

  Job* job = nullptr;
  std::vector<double> speeds;
  {
    absl::MutexLock lock(&mu_);
    if (shutting_down_) return absl::CancelledError("coordinator shutting down");
    std::vector<WorkerConn*> idle;
    int busy = 0;
    for (auto& [name, conn] : workers_) {
      if (conn.reactor == nullptr) continue;
      if (conn.job.empty()) {
        idle.push_back(&conn);
      } else {
        ++busy;
      }
    }
    const int live = static_cast<int>(idle.size());
    if (live < S) {
      return absl::FailedPreconditionError(absl::StrCat(
          "job needs ", S, " workers, ", live, " live: ", S - live, " missing",
          busy > 0 ? absl::StrCat(" (", busy, " more are busy with other jobs)") : ""));
    }
    std::sort(idle.begin(), idle.end(),
              [](const WorkerConn* a, const WorkerConn* b) { return a->order < b->order; });
    auto owned = std::make_unique<Job>();
    job = owned.get();
    job->id = absl::StrCat("job-", next_job_++);
    for (int rank = 0; rank < S; ++rank) {
      job->workers.push_back(idle[rank]->info.name());
      speeds.push_back(idle[rank]->info.gflops());
      idle[rank]->job = job->id;
      idle[rank]->rank = rank;
    }
    job->spec = spec;
    job->model = net;
    job->assigned.assign(S, false);
    job->runs_sent.assign(S, 0);
    job->runs_answered.assign(S, 0);
    jobs_[job->id] = std::move(owned);
  }

  // Partition (no lock: pure compute on the job thread's own data).
  partition::PartitionOptions popts;
  popts.stages = S;
  popts.placement = plan.placement.kind;
  popts.virtual_stages = V;
  popts.speeds = speeds;
  absl::StatusOr<partition::Partition> cut = partition::PartitionLayers(net->LayerFlops(1), popts);

  absl::MutexLock lock(&mu_);
  if (!cut.ok()) {
    FailJob(*job, cut.status().ToString());
    return cut.status();
  }
  if (job->state == "failed") {
    return absl::UnavailableError(absl::StrCat("job '", job->id, "' failed: ", job->error));
  }
  job->plan = plan;
  job->imbalance = cut->imbalance;
  for (int c = 0; c < C; ++c) {
    v1::ChunkSpec chunk;
    chunk.set_chunk(c);
    chunk.set_worker(plan.placement.OwnerOf(c));
    chunk.set_first_layer(cut->boundaries[c]);
    chunk.set_last_layer(cut->boundaries[c + 1]);
    job->chunks.push_back(chunk);
  }
  for (int rank = 0; rank < S; ++rank) {
    v1::WorkerCommand command;
    v1::Assign* a = command.mutable_assign();
    a->set_job(job->id);
    a->set_epoch(job->epoch);
    a->set_rank(rank);
    *a->mutable_model() = net->spec();
    *a->mutable_optimizer() = spec.optimizer();
    a->set_seed(spec.seed());
    a->set_threads(spec.threads());
    a->set_stages(S);
    a->set_virtual_stages(V);
    a->set_microbatches(spec.microbatches());
    for (const v1::ChunkSpec& c : job->chunks) *a->add_chunks() = c;
    for (const std::string& name : job->workers)
      a->add_worker_addresses(workers_[name].info.address());
    for (const schedule::Action& action : plan.actions[rank]) {
      v1::Action* pa = a->add_actions();
      pa->set_op(ToProtoOp(action.op));
      pa->set_microbatch(action.mb);
      pa->set_chunk(action.chunk);
    }
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
    if (job->state != "failed") FailJob(*job, waited.ToString());
    return waited;
  }
  job->state = "ready";
  return StatusOf(*job);
}

absl::StatusOr<v1::StepResult> CoordinatorService::DoTrainStep(const v1::TrainRequest& request) {
  const absl::Time t0 = absl::Now();
  CloseLinksOfFailedJobs();
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
  std::vector<std::string> addresses(S);
  {
    absl::MutexLock lock(&mu_);
    PT_RETURN_IF_ERROR(CheckReady(*job));
    // Steps are numbered from 0 on the control and data planes: step n is the (n+1)-th
    // optimizer update (StepResult.step reports n + 1).
    step = job->steps_done;
    epoch = job->epoch;
    job->op_step = step;
    job->op_error = absl::OkStatus();
    job->reports.assign(S, std::nullopt);
    job->committed.assign(S, false);
    job->state = "training";
    v1::WorkerCommand command;
    v1::RunStep* run = command.mutable_run_step();
    run->set_job(job->id);
    run->set_epoch(epoch);
    run->set_step(step);
    run->set_batch_rows(rows);
    for (int rank = 0; rank < S; ++rank) {
      SendToRank(*job, rank, command);
      ++job->runs_sent[rank];
      auto wit = workers_.find(job->workers[rank]);
      if (wit != workers_.end()) addresses[rank] = wit->second.info.address();
    }
  }

  // Data links (job thread only): opened lazily at the first step of an epoch, and again if one
  // failed.
  std::vector<std::shared_ptr<worker::PeerLink>> stale;
  if (job->links_epoch != epoch) {
    for (auto& [rank, link] : job->links) stale.push_back(link);
    job->links.clear();
    job->links_epoch = epoch;
  }
  for (auto it = job->links.begin(); it != job->links.end();) {
    if (!it->second->status().ok()) {
      stale.push_back(it->second);
      it = job->links.erase(it);
    } else {
      ++it;
    }
  }
  for (auto& link : stale) link->Shutdown();
  stale.clear();
  absl::Status feed;
  for (int rank : {first_rank, last_rank}) {
    if (job->links.count(rank) != 0) continue;
    worker::PeerHello hello;
    hello.peer = "coordinator";
    hello.identity.job = job->id;
    hello.identity.epoch = epoch;
    worker::LinkSettings settings;
    settings.validation.expected = hello.identity;
    settings.validation.num_microbatches = M;
    settings.validation.num_chunks = C;
    settings.validation.allowed_kinds = 0;  // the coordinator receives no tensors.
    settings.callbacks.on_tensor = [](const wire::TensorKey& key, math::Matrix) {
      return absl::InvalidArgumentError(
          absl::StrCat("the coordinator accepts no tensors, got ", key.ToString()));
    };
    const std::string job_id = job->id;
    settings.callbacks.on_error = [this, job_id, rank](const absl::Status& status) {
      absl::MutexLock lock(&mu_);
      auto it = jobs_.find(job_id);
      if (it == jobs_.end()) return;
      Job& j = *it->second;
      if (j.state == "training" && j.op_error.ok()) {
        j.op_error = wire::Annotate(status, absl::StrCat("data link to rank ", rank));
        event_cv_.SignalAll();
      }
    };
    absl::StatusOr<std::unique_ptr<worker::PeerLink>> link =
        worker::PeerLink::Connect(worker::CreateExchangeChannel(addresses[rank]), addresses[rank],
                                  hello, options_.link, std::move(settings));
    if (!link.ok()) {
      feed = link.status();
      break;
    }
    job->links[rank] = std::move(*link);
  }
  for (int mb = 0; mb < M && feed.ok(); ++mb) {
    feed = job->links[first_rank]->Send(wire::TensorKey{step, mb, 0, wire::TensorKind::kInput},
                                        mb_inputs[mb]);
    if (feed.ok()) {
      feed = job->links[last_rank]->Send(
          wire::TensorKey{step, mb, C - 1, wire::TensorKind::kTarget}, mb_targets[mb]);
    }
  }

  absl::MutexLock lock(&mu_);
  auto fail_step = [&](const absl::Status& status) ABSL_NO_THREAD_SAFETY_ANALYSIS {
    // Runs with mu_ held (the lock above); lambdas are not analysed with their enclosing scope.
    return FailStep(*job, step, status);
  };
  if (!feed.ok()) {
    return fail_step(wire::Annotate(feed, absl::StrCat("feeding step ", step)));
  }
  absl::Status waited = AwaitOp(
      *job,
      [job] {
        for (const auto& r : job->reports) {
          if (!r.has_value()) return false;
        }
        return true;
      },
      options_.step_timeout, absl::StrCat("StepDone of step ", step));
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
  // Global gradient norm: per-layer norms placed by layer, summed in increasing layer order.
  const int64_t L = net->num_layers();
  std::vector<double> per_layer(L, 0.0);
  std::vector<bool> seen(L, false);
  for (int rank = 0; rank < S; ++rank) {
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
  const double norm_sq = model::SumLayerNormSq(per_layer);
  const float clip = math::ClipScale(norm_sq, job->spec.optimizer().clip_norm());

  v1::WorkerCommand command;
  v1::Commit* commit = command.mutable_commit();
  commit->set_job(job->id);
  commit->set_epoch(epoch);
  commit->set_step(step);
  commit->set_clip_scale(clip);
  for (int rank = 0; rank < S; ++rank) SendToRank(*job, rank, command);
  waited = AwaitOp(
      *job,
      [job] {
        for (bool b : job->committed) {
          if (!b) return false;
        }
        return true;
      },
      options_.step_timeout, absl::StrCat("Committed of step ", step));
  if (!waited.ok()) {
    // Some workers may have applied the step: the replicas can no longer be trusted.
    if (job->state != "failed") {
      FailJob(*job,
              absl::StrCat("step ", step, " was not committed everywhere: ", waited.ToString()));
    }
    job->op_step = -1;
    return waited;
  }
  job->steps_done = step + 1;
  job->state = "ready";
  job->op_step = -1;

  // Timelines: measured (compute intervals, in ms) and the simulator's replay of the same costs.
  result.set_step(step + 1);
  result.set_loss(loss);
  result.set_step_ms(absl::ToDoubleMilliseconds(absl::Now() - t0));
  schedule::Timeline timeline;
  timeline.placement = job->plan.placement;
  timeline.workers.resize(S);
  schedule::CostModel costs = schedule::UniformCostModel(job->plan.placement, {});
  costs.action_durations.resize(S);
  bool replayable = true;
  for (int rank = 0; rank < S; ++rank) {
    v1::WorkerTimeline* wt = result.add_workers();
    wt->set_rank(rank);
    const v1::StepDone& r = *job->reports[rank];
    if (r.timings_size() != static_cast<int>(job->plan.actions[rank].size())) replayable = false;
    for (int p = 0; p < r.timings_size(); ++p) {
      const v1::ActionTiming& t = r.timings(p);
      *wt->add_timings() = t;
      schedule::TimedAction ta;
      if (!FromProtoAction(t.action(), &ta.action)) replayable = false;
      ta.start = (t.start_us() + t.wait_us()) / 1000.0;
      ta.end = std::max(ta.start, t.end_us() / 1000.0);
      timeline.workers[rank].push_back(ta);
      costs.action_durations[rank].push_back(ta.end - ta.start);
      if (replayable && !(ta.action == job->plan.actions[rank][p])) replayable = false;
    }
  }
  absl::StatusOr<schedule::TimelineStats> stats = schedule::SummarizeTimeline(timeline, {});
  if (stats.ok()) {
    result.set_bubble_fraction(stats->bubble_fraction);
    for (int rank = 0; rank < S && rank < static_cast<int>(stats->workers.size()); ++rank) {
      result.mutable_workers(rank)->set_busy_ms(stats->workers[rank].busy);
      result.mutable_workers(rank)->set_bubble_fraction(stats->workers[rank].bubble_fraction);
    }
  }
  if (replayable) {
    absl::StatusOr<schedule::SimulationResult> sim = schedule::Simulate(job->plan, costs);
    if (sim.ok()) result.set_predicted_bubble_fraction(sim->stats.bubble_fraction);
  }
  return result;
}

absl::StatusOr<v1::CheckpointResponse> CoordinatorService::DoCheckpoint(
    const v1::CheckpointRequest& request) {
  if (request.directory().empty()) {
    return absl::InvalidArgumentError("Checkpoint: empty directory");
  }
  Job* job = nullptr;
  int64_t step = 0;
  std::shared_ptr<const model::Model> net;
  v1::JobSpec spec;
  std::string staging;  // the workers write here; published as request.directory() when complete.
  {
    absl::MutexLock lock(&mu_);
    if (shutting_down_) return absl::CancelledError("coordinator shutting down");
    PT_ASSIGN_OR_RETURN(job, ReadyJob(request.job()));
    PT_ASSIGN_OR_RETURN(staging, model::BeginCheckpointStaging(request.directory()));
    step = job->steps_done;
    net = job->model;
    spec = job->spec;
    const int S = static_cast<int>(job->workers.size());
    job->op_step = step;
    job->op_error = absl::OkStatus();
    job->saved.assign(S, false);
    v1::WorkerCommand command;
    v1::SaveShards* save = command.mutable_save_shards();
    save->set_job(job->id);
    save->set_epoch(job->epoch);
    save->set_step(step);
    save->set_directory(staging);
    for (int rank = 0; rank < S; ++rank) SendToRank(*job, rank, command);
    const absl::Status waited = AwaitOp(
        *job,
        [job] {
          for (bool b : job->saved) {
            if (!b) return false;
          }
          return true;
        },
        options_.step_timeout, "every worker's ShardsSaved");
    job->op_step = -1;
    if (!waited.ok()) model::DiscardCheckpointStaging(staging).IgnoreError();
    PT_RETURN_IF_ERROR(waited);
  }
  // The manifest: what the coordinator knows. The data set, batch size and data cursor are the
  // client's (a client that knows them rewrites the manifest, see client/cli/train_command.cc).
  model::CheckpointManifest manifest;
  manifest.step = step;
  manifest.model_spec = net->spec();
  manifest.seed = spec.seed();
  manifest.microbatches = spec.microbatches();
  absl::StatusOr<math::OptimizerConfig> optimizer = model::OptimizerFromProto(spec.optimizer());
  if (optimizer.ok()) manifest.optimizer = math::FormatOptimizerConfig(*optimizer);
  // The workers share this file system: the digests are those of the files they wrote.
  PT_ASSIGN_OR_RETURN(
      manifest.shards,
      model::DigestCheckpointShards(staging, model::LayerShards(*net, 0, net->num_layers())));
  PT_RETURN_IF_ERROR(model::PublishCheckpoint(staging, request.directory(), manifest));
  v1::CheckpointResponse response;
  response.set_step(step);
  response.set_directory(request.directory());
  return response;
}

}  // namespace pipetrain::coordinator
