// ControlStream: the worker's end of one WorkerControl.Join stream (client side). Shared by the
// daemon's session thread (which drops its reference after AwaitDone()) and event emitters (which
// may still hold one; Write is a no-op once the stream closed). At most one read and one write in
// flight; events are queued by Write() from any thread. Reactions never block: a received command
// is handed to the `on_command` callback. gRPC calls are never made with a lock held (reactions
// may run inline).
#ifndef PIPETRAIN_SERVER_WORKER_CONTROL_STREAM_H_
#define PIPETRAIN_SERVER_WORKER_CONTROL_STREAM_H_

#include <grpcpp/grpcpp.h>

#include <deque>
#include <functional>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "pipetrain/v1/coordinator.pb.h"
#include "pipetrain/v1/worker_control.grpc.pb.h"
#include "pipetrain/v1/worker_control.pb.h"

namespace pipetrain::worker {

class ControlStream final : public grpc::ClientBidiReactor<v1::WorkerEvent, v1::WorkerCommand> {
 public:
  // `on_command` receives every command read, in order, on a gRPC thread; it must not block.
  explicit ControlStream(std::function<void(v1::WorkerCommand)> on_command);
  ControlStream(const ControlStream&) = delete;
  ControlStream& operator=(const ControlStream&) = delete;

  // Starts the call with `first` (RegisterWorker) as the first event. Events written before
  // Begin are queued behind it.
  void Begin(v1::WorkerControl::Stub* stub, v1::WorkerEvent first);

  // Queues `event`; dropped once the stream is closing. Thread-safe, non-blocking.
  void Write(v1::WorkerEvent event);

  // Cancels the call (thread-safe; the stream then ends with CANCELLED).
  void Cancel() { context_.TryCancel(); }

  // Blocks until OnDone and returns the call's status.
  absl::Status AwaitDone();

  // Whether a command was received (the coordinator accepted us).
  bool got_command();

  void OnWriteDone(bool ok) override;

  void OnReadDone(bool ok) override;

  void OnDone(const grpc::Status& status) override;

 private:
  // True (once) when the hold can go: the read side ended and no outside write is starting.
  bool ReleaseHoldLocked() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const std::function<void(v1::WorkerCommand)> on_command_;
  grpc::ClientContext context_;
  v1::WorkerCommand read_buf_;  // owned by the read chain.

  // Protects the write queue, the stream's flags and its final status.
  absl::Mutex mu_;
  v1::WorkerEvent current_;  // the event being written; owned by the write chain while writing_.
  std::deque<v1::WorkerEvent> queue_ ABSL_GUARDED_BY(mu_);
  bool writing_ ABSL_GUARDED_BY(mu_) = true;  // the first event, from Begin.
  bool closed_ ABSL_GUARDED_BY(mu_) = false;
  bool read_ended_ ABSL_GUARDED_BY(mu_) = false;
  bool hold_released_ ABSL_GUARDED_BY(mu_) = false;
  int outside_ops_ ABSL_GUARDED_BY(mu_) = 0;
  bool got_command_ ABSL_GUARDED_BY(mu_) = false;
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status status_ ABSL_GUARDED_BY(mu_);
};

}  // namespace pipetrain::worker

#endif  // PIPETRAIN_SERVER_WORKER_CONTROL_STREAM_H_
