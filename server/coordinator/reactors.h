// The coordinator's streaming reactors: JoinReactor (a worker's control stream) and TrainReactor
// (a client's Train stream). Each keeps at most one read and one write in flight, never blocks in
// a reaction (events go to CoordinatorService's non-blocking hooks, steps to the job's OpThread)
// and deletes itself in OnDone.
#ifndef PIPETRAIN_SERVER_COORDINATOR_REACTORS_H_
#define PIPETRAIN_SERVER_COORDINATOR_REACTORS_H_

#include <fcntl.h>
#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/io/digest.h"
#include "common/io/dir_util.h"
#include "common/io/file_util.h"
#include "common/wire/grpc_status.h"
#include "pipetrain/v1/coordinator.pb.h"
#include "server/coordinator/coordinator_service.h"

namespace pipetrain::coordinator {

// The coordinator's end of one worker's Join stream. One read in flight at a time (events are
// handled inline, without blocking, by CoordinatorService::OnWorkerEvent); commands are queued
// and written one at a time. Deletes itself in OnDone.
class JoinReactor final : public grpc::ServerBidiReactor<v1::WorkerEvent, v1::WorkerCommand> {
 public:
  // `certificate_names`: the DNS/IP names of the worker's verified TLS certificate, which must
  // include the host it registers (nullopt: no such check, e.g. plaintext).
  JoinReactor(CoordinatorService* service,
              std::optional<std::vector<std::string>> certificate_names)
      : service_(service), certificate_names_(std::move(certificate_names)) {
    StartRead(&event_);
  }

  // See the constructor. Constant.
  const std::optional<std::vector<std::string>>& certificate_names() const {
    return certificate_names_;
  }

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
  const std::optional<std::vector<std::string>> certificate_names_;
  v1::WorkerEvent event_;  // the read in flight; touched only by reactions (sequential).
  std::string name_;       // set by the RegisterWorker event; reactions only.

  // Protects the write queue. Taken after CoordinatorService::mu_ when both are held.
  absl::Mutex write_mu_;
  std::deque<v1::WorkerCommand> queue_ ABSL_GUARDED_BY(write_mu_);  // front: in flight.
  bool writing_ ABSL_GUARDED_BY(write_mu_) = false;
  bool closed_ ABSL_GUARDED_BY(write_mu_) = false;
  grpc::Status finish_status_ ABSL_GUARDED_BY(write_mu_);
};

// The coordinator's end of a client's Train stream. Reads one batch ahead: while a step runs on
// the job's OpThread the next batch is already read and queued behind it, so a client that sends
// batch k+1 before it reads result k finds the coordinator running step k+1 as soon as step k
// committed. At most kStepsInFlight steps are queued or running; results are written in order,
// one write in flight. After a failed step the steps queued behind it are skipped (applied
// nowhere), the results written before it are still delivered, then the stream ends with the
// failure. Deletes itself in OnDone, which gRPC calls only after Finish — and Finish waits until
// no posted step still refers to the reactor.
class TrainReactor final : public grpc::ServerBidiReactor<v1::TrainRequest, v1::StepResult> {
 public:
  // The running step and one read ahead.
  static constexpr int kStepsInFlight = 2;

  explicit TrainReactor(CoordinatorService* service) : service_(service) {
    absl::MutexLock lock(&mu_);
    StartReadLocked();
  }

  void OnReadDone(bool ok) override {
    absl::MutexLock lock(&mu_);
    reading_ = false;
    if (!ok) {  // the client closed its side (or went away): finish once the queued steps are done.
      reads_done_ = true;
      MaybeFinishLocked();
      return;
    }
    if (!error_.ok()) {  // the stream is ending; this batch is applied nowhere.
      MaybeFinishLocked();
      return;
    }
    if (job_.empty()) {
      const absl::Status claim = service_->ClaimJob(incoming_.job(), this);
      if (!claim.ok()) {
        FailLocked(claim);
        return;
      }
      job_ = incoming_.job();
    } else if (incoming_.job() != job_) {
      FailLocked(absl::InvalidArgumentError(
          absl::StrCat("this Train stream trains job '", job_, "', not '", incoming_.job(), "'")));
      return;
    }
    auto request = std::make_shared<const v1::TrainRequest>(std::move(incoming_));
    incoming_.Clear();
    ++steps_in_flight_;
    const absl::Status posted = service_->PostToJob(job_, [this, request] { RunStep(*request); });
    if (!posted.ok()) {
      --steps_in_flight_;
      FailLocked(posted);
      return;
    }
    if (steps_in_flight_ < kStepsInFlight) StartReadLocked();
  }

  void OnWriteDone(bool ok) override {
    absl::MutexLock lock(&mu_);
    writing_ = false;
    results_.pop_front();
    if (!ok) {
      results_.clear();
      FailLocked(absl::CancelledError("the client went away"));
      return;
    }
    if (!results_.empty()) {
      writing_ = true;
      StartWrite(&results_.front());
      return;
    }
    MaybeFinishLocked();
  }

  // The client cancelled (or its connection broke): the queued step is skipped and the job
  // released at once; a running step completes on the job's thread.
  void OnCancel() override {
    absl::MutexLock lock(&mu_);
    FailLocked(absl::CancelledError("the client cancelled the Train stream"));
  }

  void OnDone() override {
    std::string job;
    {
      absl::MutexLock lock(&mu_);
      job = job_;
    }
    if (!job.empty()) service_->ReleaseJob(job, this);
    delete this;
  }

 private:
  // One step, on the job's OpThread: skipped once the stream failed.
  void RunStep(const v1::TrainRequest& request) ABSL_LOCKS_EXCLUDED(mu_) {
    bool skip = false;
    std::string job;
    {
      absl::MutexLock lock(&mu_);
      skip = !error_.ok();
      job = job_;
    }
    if (skip) {
      // The step before may have left its Commit for this one to confirm: confirm it here (a
      // failure ends or recovers the job; this stream reports its first failure already).
      service_->DoConfirmCommit(job).IgnoreError();
      absl::MutexLock lock(&mu_);
      --steps_in_flight_;
      MaybeFinishLocked();
      return;
    }
    // Another batch of this stream queued behind this one lets the step return once its Commit
    // is sent (CoordinatorService::DoTrainStep); read without mu_, which the step must not take.
    absl::StatusOr<v1::StepResult> result = service_->DoTrainStep(
        request, [this] { return steps_in_flight_.load(std::memory_order_acquire) > 1; });
    // A step refused before it ran (a bad batch, say) confirms no Commit: the one before it may
    // still be unconfirmed, and the stream ends here.
    if (!result.ok()) service_->DoConfirmCommit(job).IgnoreError();
    absl::MutexLock lock(&mu_);
    --steps_in_flight_;
    if (!result.ok()) {
      FailLocked(result.status());
      return;
    }
    if (!error_.ok()) {  // the client went away during the step.
      MaybeFinishLocked();
      return;
    }
    results_.push_back(*std::move(result));
    if (!writing_) {
      writing_ = true;
      StartWrite(&results_.front());
    }
    if (!reading_ && !reads_done_ && steps_in_flight_ < kStepsInFlight) StartReadLocked();
  }

  void StartReadLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    reading_ = true;
    StartRead(&incoming_);
  }

  // Ends the stream with `status` (the first failure wins) once nothing refers to it. Releases
  // the job at once, before the client can see the status, so that a new Train stream opened
  // after this one ended is never refused because of it.
  void FailLocked(const absl::Status& status) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (error_.ok()) {
      error_ = status;
      if (!job_.empty()) service_->ReleaseJob(job_, this);
    }
    MaybeFinishLocked();
  }

  // Finishes the stream once no step is queued or running and every result is written: with
  // error_ after a failure, OK once the client closed its side.
  void MaybeFinishLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (finished_ || steps_in_flight_ > 0 || writing_) return;
    if (error_.ok() && !reads_done_) return;
    finished_ = true;
    if (!job_.empty()) service_->ReleaseJob(job_, this);  // before the client sees the status.
    Finish(wire::ToGrpcStatus(error_));
  }

  CoordinatorService* const service_;
  // Protects everything below. Taken before CoordinatorService::mu_ (ClaimJob, PostToJob,
  // ReleaseJob); never held while a step runs.
  absl::Mutex mu_;
  v1::TrainRequest incoming_ ABSL_GUARDED_BY(mu_);           // the read in flight writes here.
  std::deque<v1::StepResult> results_ ABSL_GUARDED_BY(mu_);  // front: the write in flight.
  std::string job_ ABSL_GUARDED_BY(mu_);
  absl::Status error_ ABSL_GUARDED_BY(mu_);  // the stream's first failure.
  // Queued or running steps: changed under mu_, also read without it (RunStep's next_queued).
  std::atomic<int> steps_in_flight_{0};
  bool reading_ ABSL_GUARDED_BY(mu_) = false;
  bool writing_ ABSL_GUARDED_BY(mu_) = false;
  bool reads_done_ ABSL_GUARDED_BY(mu_) = false;
  bool finished_ ABSL_GUARDED_BY(mu_) = false;
};

// A worker's FetchState: streams checkpoint files, each as chunks of at most 1 MiB read with
// pread from the coordinator's local disk (one chunk per reaction, one write in flight), the
// first chunk of a file carrying its manifest entry. The worker verifies each file's size and
// SHA-256 end to end. Deletes itself in OnDone.
class StateReactor final : public grpc::ServerWriteReactor<v1::StateChunk> {
 public:
  static constexpr int64_t kChunkBytes = int64_t{1} << 20;

  // Finishes at once with `status` unless it is OK.
  StateReactor(std::vector<StateFile> files, const absl::Status& status)
      : files_(std::move(files)) {
    if (!status.ok()) {
      Finish(wire::ToGrpcStatus(status));
      return;
    }
    Next();
  }

  void OnWriteDone(bool ok) override {
    if (!ok) {
      Finish(grpc::Status(grpc::StatusCode::CANCELLED, "the worker stopped reading"));
      return;
    }
    Next();
  }

  void OnDone() override {
    if (fd_ >= 0) close(fd_);
    delete this;
  }

 private:
  // Writes the next chunk, or finishes after the last one.
  void Next() {
    while (index_ < files_.size() && fd_ >= 0 && offset_ >= files_[index_].shard.bytes) {
      close(fd_);
      fd_ = -1;
      ++index_;
    }
    if (index_ == files_.size()) {
      Finish(grpc::Status::OK);
      return;
    }
    const StateFile& f = files_[index_];
    chunk_.Clear();
    chunk_.set_file(f.shard.file);
    if (fd_ < 0) {
      fd_ = open(f.path.c_str(), O_RDONLY | O_CLOEXEC);
      if (fd_ < 0) {
        Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE,
                            absl::StrCat("cannot open ", f.path, ": ", strerror(errno))));
        return;
      }
      offset_ = 0;
      chunk_.set_first_layer(f.shard.first_layer);
      chunk_.set_last_layer(f.shard.last_layer);
      chunk_.set_sha256(f.shard.sha256);
      chunk_.set_bytes(f.shard.bytes);
    }
    const int64_t n = std::min(kChunkBytes, f.shard.bytes - offset_);
    std::string* data = chunk_.mutable_data();
    data->resize(static_cast<size_t>(n));
    if (pread(fd_, data->data(), static_cast<size_t>(n), offset_) != n) {
      Finish(
          grpc::Status(grpc::StatusCode::DATA_LOSS,
                       absl::StrCat(f.path, ": shorter than the ", f.shard.bytes,
                                    " bytes its manifest names (changed since it was verified?)")));
      return;
    }
    chunk_.set_offset(offset_);
    offset_ += n;
    StartWrite(&chunk_);
  }

  // Touched by one reaction at a time (at most one write in flight).
  const std::vector<StateFile> files_;
  size_t index_ = 0;
  int fd_ = -1;
  int64_t offset_ = 0;
  v1::StateChunk chunk_;
};

// A worker's PutState: stores its uploaded checkpoint files in the staging directory of the
// checkpoint in progress. One read in flight; each chunk is written with pwrite to "FILE.part" on
// the coordinator's local disk; a complete file is fsynced, checked against the size and SHA-256
// announced with it, renamed to its name and the directory fsynced. Only the files of the
// caller's layers are accepted, each once. Deletes itself in OnDone (removing a partial file).
class UploadReactor final : public grpc::ServerReadReactor<v1::PutStateRequest> {
 public:
  static constexpr int64_t kMaxFileBytes = int64_t{1} << 40;

  UploadReactor(CoordinatorService* service, v1::PutStateResponse* response)
      : service_(service), response_(response) {
    StartRead(&request_);
  }

  void OnReadDone(bool ok) override {
    if (!ok) {  // the worker's WritesDone (or a broken stream: then nobody reads the status).
      if (fd_ >= 0) {
        Fail(absl::DataLossError(absl::StrCat(current_.file, ": the upload ended after ", offset_,
                                              " of ", current_.bytes, " bytes")));
        return;
      }
      response_->set_files(files_);
      response_->set_bytes(bytes_);
      Finish(grpc::Status::OK);
      return;
    }
    if (absl::Status s = Handle(); !s.ok()) {
      Fail(s);
      return;
    }
    StartRead(&request_);
  }

  void OnDone() override {
    Cleanup();
    delete this;
  }

 private:
  absl::Status Handle() {
    if (!accepted_) {
      absl::StatusOr<std::pair<std::string, std::map<std::string, model::CheckpointShard>>> target =
          service_->AcceptUpload(request_);
      if (!target.ok()) return target.status();
      staging_ = std::move(target->first);
      expected_ = std::move(target->second);
      accepted_ = true;
    }
    if (!request_.has_chunk()) return absl::OkStatus();  // the identity message.
    const v1::StateChunk& c = request_.chunk();
    if (fd_ < 0) {
      auto it = expected_.find(c.file());
      if (it == expected_.end()) {
        return absl::PermissionDeniedError(absl::StrCat(
            "checkpoint file '", c.file(), "' is not one of this worker's layers (or came twice)"));
      }
      if (c.offset() != 0 || c.first_layer() != it->second.first_layer ||
          c.last_layer() != it->second.last_layer || c.bytes() < 0 || c.bytes() > kMaxFileBytes ||
          !io::IsSha256Hex(c.sha256())) {
        return absl::InvalidArgumentError(
            absl::StrCat(c.file(), ": the first chunk must carry offset 0, the layers [",
                         it->second.first_layer, ", ", it->second.last_layer,
                         "), a size in [0, 2^40] and a "
                         "SHA-256 in hex"));
      }
      current_ = it->second;
      current_.sha256 = c.sha256();
      current_.bytes = c.bytes();
      expected_.erase(it);
      part_ = io::JoinPath(staging_, current_.file + ".part");
      fd_ = open(part_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
      if (fd_ < 0) {
        return absl::UnavailableError(absl::StrCat("cannot create ", part_, ": ", strerror(errno),
                                                   " (the checkpoint was abandoned?)"));
      }
      offset_ = 0;
    }
    if (c.file() != current_.file || c.offset() != offset_ ||
        offset_ + static_cast<int64_t>(c.data().size()) > current_.bytes) {
      return absl::DataLossError(absl::StrCat(current_.file, ": chunk of '", c.file(),
                                              "' at offset ", c.offset(), " (", c.data().size(),
                                              " bytes) does not continue the ", offset_, " of ",
                                              current_.bytes, " bytes received"));
    }
    for (size_t done = 0; done < c.data().size();) {
      const ssize_t n = pwrite(fd_, c.data().data() + done, c.data().size() - done,
                               static_cast<off_t>(offset_ + static_cast<int64_t>(done)));
      if (n <= 0) {
        return absl::UnavailableError(absl::StrCat("writing ", part_, ": ", strerror(errno)));
      }
      done += static_cast<size_t>(n);
    }
    offset_ += static_cast<int64_t>(c.data().size());
    if (offset_ < current_.bytes) return absl::OkStatus();
    // The file is complete: durable, as announced, then under its name.
    const bool synced = fsync(fd_) == 0;
    close(fd_);
    fd_ = -1;
    if (!synced)
      return absl::UnavailableError(absl::StrCat("fsync ", part_, ": ", strerror(errno)));
    absl::StatusOr<io::FileDigest> digest = io::DigestFile(part_);
    if (!digest.ok()) return digest.status();
    if (digest->sha256 != current_.sha256) {
      unlink(part_.c_str());
      return absl::DataLossError(absl::StrCat(current_.file, ": received bytes have SHA-256 ",
                                              digest->sha256, ", the worker announced ",
                                              current_.sha256));
    }
    const std::string final_path = io::JoinPath(staging_, current_.file);
    if (rename(part_.c_str(), final_path.c_str()) != 0) {
      return absl::UnavailableError(
          absl::StrCat("rename ", part_, " -> ", final_path, ": ", strerror(errno)));
    }
    part_.clear();
    if (absl::Status s = io::SyncDirectory(staging_); !s.ok()) return s;
    ++files_;
    bytes_ += current_.bytes;
    return absl::OkStatus();
  }

  void Fail(const absl::Status& status) {
    Cleanup();
    Finish(wire::ToGrpcStatus(status));
  }

  // Closes and removes a partial file.
  void Cleanup() {
    if (fd_ >= 0) close(fd_);
    fd_ = -1;
    if (!part_.empty()) unlink(part_.c_str());
    part_.clear();
  }

  CoordinatorService* const service_;
  v1::PutStateResponse* const response_;
  // Touched by one reaction at a time (at most one read in flight).
  v1::PutStateRequest request_;
  bool accepted_ = false;
  std::string staging_;
  std::map<std::string, model::CheckpointShard> expected_;  // files not yet received.
  model::CheckpointShard current_;                          // the file being received.
  std::string part_;                                        // its ".part" path.
  int fd_ = -1;
  int64_t offset_ = 0;
  int64_t files_ = 0;
  int64_t bytes_ = 0;
};

}  // namespace pipetrain::coordinator

#endif  // PIPETRAIN_SERVER_COORDINATOR_REACTORS_H_
