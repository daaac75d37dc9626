// The coordinator's streaming reactors: JoinReactor (a worker's control stream) and TrainReactor
// (a client's Train stream). Each keeps at most one read and one write in flight, never blocks in
// a reaction (events go to CoordinatorService's non-blocking hooks, steps to the job's OpThread)
// and deletes itself in OnDone.
#ifndef PIPETRAIN_SERVER_COORDINATOR_REACTORS_H_
#define PIPETRAIN_SERVER_COORDINATOR_REACTORS_H_

#include <grpcpp/grpcpp.h>

#include <deque>
#include <string>
#include <utility>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/wire/grpc_status.h"
#include "pipetrain/v1/coordinator.pb.h"
#include "server/coordinator/coordinator_service.h"

namespace pipetrain::coordinator {

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
    const absl::Status posted = service_->PostToJob(job_, [this] {
      absl::StatusOr<v1::StepResult> result = service_->DoTrainStep(request_);
      if (!result.ok()) {
        FinishAndRelease(result.status());
        return;
      }
      result_ = *std::move(result);
      StartWrite(&result_);
    });
    if (!posted.ok()) FinishAndRelease(posted);
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

}  // namespace pipetrain::coordinator

#endif  // PIPETRAIN_SERVER_COORDINATOR_REACTORS_H_
