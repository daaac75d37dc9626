#include "server/worker/control_stream.h"

#include <utility>

#include "common/wire/grpc_status.h"
#include "pipetrain/v1/worker_control.pb.h"

namespace pipetrain::worker {

ControlStream::ControlStream(std::function<void(v1::WorkerCommand)> on_command)
    : on_command_(std::move(on_command)) {}

void ControlStream::Begin(v1::WorkerControl::Stub* stub, v1::WorkerEvent first) {
  context_.set_wait_for_ready(false);
  stub->async()->Join(&context_, this);
  AddHold();  // removed when the read side ends: Write() runs outside reactions.
  {
    absl::MutexLock lock(&mu_);
    current_ = std::move(first);  // writing_ is already true: Write() calls only queue.
  }
  StartWrite(&current_);
  StartRead(&read_buf_);
  StartCall();
}

void ControlStream::Write(v1::WorkerEvent event) {
  {
    absl::MutexLock lock(&mu_);
    if (closed_) return;
    if (writing_) {
      queue_.push_back(std::move(event));
      return;
    }
    writing_ = true;
    current_ = std::move(event);
    ++outside_ops_;
  }
  StartWrite(&current_);
  bool remove = false;
  {
    absl::MutexLock lock(&mu_);
    --outside_ops_;
    remove = ReleaseHoldLocked();
  }
  if (remove) RemoveHold();
}

absl::Status ControlStream::AwaitDone() {
  absl::MutexLock lock(&mu_);
  mu_.Await(absl::Condition(&done_));
  return status_;
}

bool ControlStream::got_command() {
  absl::MutexLock lock(&mu_);
  return got_command_;
}

void ControlStream::OnWriteDone(bool ok) {
  {
    absl::MutexLock lock(&mu_);
    if (!ok) closed_ = true;
    if (closed_ || queue_.empty()) {
      writing_ = false;
      queue_.clear();
      return;
    }
    current_ = std::move(queue_.front());
    queue_.pop_front();
  }
  StartWrite(&current_);
}

void ControlStream::OnReadDone(bool ok) {
  if (!ok) {
    bool remove = false;
    {
      absl::MutexLock lock(&mu_);
      closed_ = true;
      read_ended_ = true;
      remove = ReleaseHoldLocked();
    }
    if (remove) RemoveHold();
    return;
  }
  {
    absl::MutexLock lock(&mu_);
    got_command_ = true;
  }
  v1::WorkerCommand command = std::move(read_buf_);
  read_buf_.Clear();
  on_command_(std::move(command));
  StartRead(&read_buf_);
}

void ControlStream::OnDone(const grpc::Status& status) {
  absl::MutexLock lock(&mu_);
  status_ = wire::FromGrpcStatus(status, "control stream");
  if (status_.ok()) status_ = absl::UnavailableError("control stream: ended by the coordinator");
  done_ = true;
}

bool ControlStream::ReleaseHoldLocked() {
  if (!read_ended_ || outside_ops_ > 0 || hold_released_) return false;
  hold_released_ = true;
  return true;
}

}  // namespace pipetrain::worker
