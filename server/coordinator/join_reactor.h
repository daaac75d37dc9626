// JoinReactor: the coordinator's end of one worker's Join stream, and the core's WorkerChannel
// to it. One read in flight (events go to CoordinatorCore::OnWorkerEvent, which never blocks);
// commands are queued and written one at a time. Deletes itself in OnDone.
#ifndef PIPETRAIN_SERVER_COORDINATOR_JOIN_REACTOR_H_
#define PIPETRAIN_SERVER_COORDINATOR_JOIN_REACTOR_H_

#include <grpcpp/grpcpp.h>

#include <deque>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"
#include "common/net/transport_security.h"
#include "pipetrain/v1/coordinator.pb.h"
#include "pipetrain/v1/worker_control.pb.h"
#include "server/coordinator/coordinator_core.h"
#include "server/coordinator/worker_channel.h"

namespace pipetrain::coordinator {

class JoinReactor final : public grpc::ServerBidiReactor<v1::WorkerEvent, v1::WorkerCommand>,
                          public WorkerChannel {
 public:
  // `certificate`: the worker's verified TLS certificate, which must vouch for the host it
  // advertises and the name it registers (nullopt: no such check, e.g. plaintext).
  JoinReactor(CoordinatorCore* core, std::optional<net::PeerCertificate> certificate);

  // WorkerChannel. Thread-safe, non-blocking.
  void Send(const v1::WorkerCommand& command) override;
  void Close(const absl::Status& status) override;

  void OnReadDone(bool ok) override;
  void OnWriteDone(bool ok) override;
  void OnDone() override;

 private:
  // The registration's certificate check (mTLS): the address peers will dial and the name the
  // worker takes must be ones its certificate vouches for, so a cluster member can neither
  // advertise (and receive another's traffic at) someone else's host nor take someone else's name
  // (and lock the real worker out, or displace it).
  absl::Status CheckCertificate(const v1::RegisterWorker& r) const;

  CoordinatorCore* const core_;
  const std::optional<net::PeerCertificate> certificate_;
  v1::WorkerEvent event_;  // the read in flight; touched only by reactions (sequential).
  std::string name_;       // set by the RegisterWorker event; reactions only.

  // Protects the write queue. Taken after the core's lock when both are held.
  absl::Mutex write_mu_;
  std::deque<v1::WorkerCommand> queue_ ABSL_GUARDED_BY(write_mu_);  // front: in flight.
  bool writing_ ABSL_GUARDED_BY(write_mu_) = false;
  bool closed_ ABSL_GUARDED_BY(write_mu_) = false;
  grpc::Status finish_status_ ABSL_GUARDED_BY(write_mu_);
};

}  // namespace pipetrain::coordinator

#endif  // PIPETRAIN_SERVER_COORDINATOR_JOIN_REACTOR_H_
