// WorkerChannel: the coordinator core's end of one worker's control stream (Join), without the
// transport. The gRPC shell implements it over a Join reactor (server/coordinator/join_reactor.h);
// tests implement it with an in-memory fake (tests/server/coordinator/fake_worker_channel.h).
#ifndef PIPETRAIN_SERVER_COORDINATOR_WORKER_CHANNEL_H_
#define PIPETRAIN_SERVER_COORDINATOR_WORKER_CHANNEL_H_

#include "absl/status/status.h"
#include "pipetrain/v1/coordinator.pb.h"
#include "pipetrain/v1/worker_control.pb.h"

namespace pipetrain::coordinator {

class WorkerChannel {
 public:
  virtual ~WorkerChannel() = default;

  // Queues `command` for the worker, after every command queued before it; dropped once the
  // channel is closing. Thread-safe and non-blocking: the core calls it with its lock held.
  virtual void Send(const v1::WorkerCommand& command) = 0;

  // Ends the stream with `status` once the commands in flight are written; later commands are
  // dropped. Thread-safe, non-blocking, idempotent. The core then hears WorkerGone as for a
  // stream that broke (unless it removed the worker itself).
  virtual void Close(const absl::Status& status) = 0;
};

}  // namespace pipetrain::coordinator

#endif  // PIPETRAIN_SERVER_COORDINATOR_WORKER_CHANNEL_H_
