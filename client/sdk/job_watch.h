// JobWatch: the client's end of a WatchJob stream (coordinator.proto) — following a job that any
// client trains, as `pipetrain watch` does:
//
//   PT_ASSIGN_OR_RETURN(std::unique_ptr<client::JobWatch> watch, client->WatchJob(job));
//   for (;;) {
//     PT_ASSIGN_OR_RETURN(std::optional<v1::JobEvent> event, watch->Next());
//     if (!event.has_value()) break;  // the job ended (its `ended` event came before)
//     ...
//   }
//
// The first event is the job's status, then the events its log still keeps, then each event as
// it happens. Watching does not keep the job alive (its client lease) and never changes it.
#ifndef PIPETRAIN_CLIENT_SDK_JOB_WATCH_H_
#define PIPETRAIN_CLIENT_SDK_JOB_WATCH_H_

#include <grpcpp/grpcpp.h>

#include <memory>
#include <optional>
#include <string>

#include "absl/status/statusor.h"
#include "client/sdk/client.h"
#include "pipetrain/v1/coordinator.pb.h"

namespace pipetrain::client {

class JobWatch {
 public:
  // Cancels the stream if it is still open.
  ~JobWatch();
  JobWatch(const JobWatch&) = delete;
  JobWatch& operator=(const JobWatch&) = delete;

  // Blocks for the next event: the event, or none once the stream ended OK (after the job's
  // `ended` event). Errors: the coordinator's (NOT_FOUND for an unknown job or one the caller may
  // not see, RESOURCE_EXHAUSTED for too many watches, CANCELLED when it shuts down), UNAVAILABLE
  // when it stops answering (Client's keepalive), CANCELLED after Cancel(). Not thread-safe: one
  // reader.
  absl::StatusOr<std::optional<v1::JobEvent>> Next();
  // Ends the stream: a blocked Next() returns CANCELLED. Thread-safe (e.g. from a signal
  // watcher's thread), idempotent.
  void Cancel();

 private:
  friend class Client;
  JobWatch(const Client* client, std::unique_ptr<grpc::ClientContext> context,
           std::unique_ptr<grpc::ClientReader<v1::JobEvent>> stream)
      : client_(client), context_(std::move(context)), stream_(std::move(stream)) {}

  const Client* const client_;
  const std::unique_ptr<grpc::ClientContext> context_;
  const std::unique_ptr<grpc::ClientReader<v1::JobEvent>> stream_;
  bool done_ = false;  // Finish was called (the reader's thread only).
  absl::Status final_;
};

}  // namespace pipetrain::client

#endif  // PIPETRAIN_CLIENT_SDK_JOB_WATCH_H_
