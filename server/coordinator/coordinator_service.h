// CoordinatorService: the coordinator's gRPC shell. It owns the transport-free CoordinatorCore
// (coordinator_core.h) and only moves messages: one service per audience (client_service.h,
// worker_control_service.h), unary calls answered from the core's results, streams as reactors
// (join_reactor.h, train_reactor.h, state_reactors.h) whose disk I/O runs on the shell's own I/O
// threads.
#ifndef PIPETRAIN_SERVER_COORDINATOR_COORDINATOR_SERVICE_H_
#define PIPETRAIN_SERVER_COORDINATOR_COORDINATOR_SERVICE_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "server/coordinator/client_service.h"
#include "server/coordinator/coordinator_core.h"
#include "server/coordinator/io_pool.h"
#include "server/coordinator/shard_transfer.h"
#include "server/coordinator/worker_control_service.h"
#include "server/link/peer_link.h"

namespace grpc {
class ChannelCredentials;
class ServerBuilder;
}  // namespace grpc

namespace pipetrain::coordinator {

// The shell's own options: how it reaches workers and stores checkpoint files.
struct ServiceTransport {
  // Options of the data links the coordinator opens to the first and last chunk owners.
  link::LinkOptions link;
  // Credentials of those links (the workers' Exchange servers): TLS with the coordinator's
  // certificate under mTLS (net::MakeChannelCredentials). Null (default): plaintext.
  std::shared_ptr<grpc::ChannelCredentials> link_credentials;
  // RegisterWorker is refused (PERMISSION_DENIED) unless the Join stream's verified TLS client
  // certificate names the host the worker advertises (net::CheckCertificateNamesHost). Set with
  // mTLS. Default false.
  bool check_worker_certificates = false;
  // Threads for checkpoint uploads and downloads (disk I/O). Default 2.
  int io_threads = 2;
  // Called on an I/O thread before each chunk of an uploaded checkpoint file is written (tests:
  // a slow disk). Default none.
  ShardUpload::WriteHook before_state_write;

  // OK, or INVALID_ARGUMENT naming the bad field.
  absl::Status Check() const;
};

// The coordinator's gRPC shell: the CoordinatorCore, its I/O threads and the two services it
// serves — ClientService (pipetrain.v1.Coordinator, for clients) and WorkerControlService
// (pipetrain.v1.WorkerControl, for stage workers). Thread-safe. Create it, RegisterOn a
// grpc::ServerBuilder, start the server; to stop, call Shutdown(), then shut the server down,
// then destroy it.
class CoordinatorService {
 public:
  explicit CoordinatorService(CoordinatorOptions options = {}, ServiceTransport transport = {});
  ~CoordinatorService();
  CoordinatorService(const CoordinatorService&) = delete;
  CoordinatorService& operator=(const CoordinatorService&) = delete;

  // Registers both services on `builder` (not thread-safe, as the builder).
  void RegisterOn(grpc::ServerBuilder& builder);
  // The full names of the services it serves (for the health service).
  static std::vector<std::string> ServiceNames();

  // CoordinatorCore::Shutdown, OpenJournal and RecordListenAddress.
  void Shutdown() { core_.Shutdown(); }
  absl::Status OpenJournal(const std::string& state_dir, const std::string& address = "") {
    return core_.OpenJournal(state_dir, address);
  }
  void RecordListenAddress(const std::string& address) { core_.RecordListenAddress(address); }

 private:
  const ServiceTransport transport_;
  CoordinatorCore core_;
  IoPool io_;  // after core_: destroyed first, its queued tasks may still call the core.
  ClientService clients_;
  WorkerControlService workers_;
};

// Sets on `builder` (of a server that registers the CoordinatorService) the ping policy that lets
// clients and workers keep their connections alive: HTTP/2 pings every 0.5 s or slower are
// accepted, with or without calls in flight and however long no data moves. gRPC's default (at
// most one ping per 5 minutes without data) answers a client's keepalive (client::ClientOptions,
// every 5 s by default) with GOAWAY "too_many_pings" during a long step. Not thread-safe (as
// the builder).
void AllowClientKeepalive(grpc::ServerBuilder& builder);

}  // namespace pipetrain::coordinator

#endif  // PIPETRAIN_SERVER_COORDINATOR_COORDINATOR_SERVICE_H_
