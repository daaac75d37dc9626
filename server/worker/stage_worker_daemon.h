// StageWorkerDaemon: the stage worker daemon as a library (the `stage_worker` binary is a thin
// main() around it; tests run several in one process).
//
// It serves StageWorker.Exchange (server/link/exchange_service.h), the standard gRPC health
// service and (when built with it) server reflection on one port, and keeps one control stream
// WorkerControl.Join open to the coordinator, redialling with exponential backoff when it breaks.
// Commands from the coordinator (Assign, RunStep, Commit, Abort, SaveShards, ProfileLayers) are
// handled on a command thread (a ProfileLayers on an idle worker runs on a LayerProfiler's thread);
// each job (job id, generation) is a WorkerJob (server/worker/worker_job.h) that runs its steps on
// its own compute thread. The control protocol as implemented here (step numbering, which events
// answer which commands, link dialling) is in docs/worker.md.
//
// Threads: gRPC's callback threads only decode and queue (never block, never compute); the
// command thread validates and builds jobs; the compute thread runs steps, commits and writes
// checkpoint shards; the session thread dials the coordinator and waits out the backoff.
#ifndef PIPETRAIN_SERVER_WORKER_STAGE_WORKER_DAEMON_H_
#define PIPETRAIN_SERVER_WORKER_STAGE_WORKER_DAEMON_H_

#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <string>
#include <thread>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "common/math/isa.h"
#include "common/net/transport_security.h"
#include "pipetrain/v1/coordinator.pb.h"
#include "pipetrain/v1/worker_control.grpc.pb.h"
#include "pipetrain/v1/worker_control.pb.h"
#include "server/link/exchange_service.h"
#include "server/link/link_probe.h"
#include "server/link/peer_link.h"
#include "server/worker/control_stream.h"
#include "server/worker/host_probe.h"
#include "server/worker/layer_profiler.h"
#include "server/worker/link_prober.h"
#include "server/worker/worker_job.h"

namespace grpc {
class Server;
}  // namespace grpc

namespace pipetrain::metrics {
class WorkerMetrics;
}  // namespace pipetrain::metrics

namespace pipetrain::worker {

// How a StageWorkerDaemon runs. Checked once by StageWorkerDaemon::Start.
struct StageWorkerOptions {
  // The coordinator's "host:port" (its Coordinator service). Required.
  std::string coordinator;
  // Where to serve StageWorker.Exchange, health and reflection, "host:port". Port 0: a free port
  // is picked and advertised. A non-loopback address needs `tls` or `insecure`
  // (net::CheckListenSecurity). Default "127.0.0.1:0".
  std::string listen = "127.0.0.1:0";
  // "host:port" peers and the coordinator use to reach this worker. Empty (default): the listen
  // host with the bound port, or this machine's host name when listening on a wildcard address.
  std::string advertise;
  // Stable identity sent in RegisterWorker. Empty (default): the advertised address.
  std::string name;
  // > 0: the compute thread runs on a virtual clock where every action takes its FLOPs /
  // (emulate_gflops * 1e9) seconds (the math still runs; the thread sleeps before sending an
  // action's output and before StepDone until the virtual time), so benchmarks see a fixed
  // compute rate. See docs/worker.md. 0 (default): off.
  double emulate_gflops = 0;
  // Upper bound on Assign.threads (compute threads); 0 (default): the hardware's core count.
  int threads_max = 0;
  // > 0 (--gflops): report this GFLOP/s instead of running the sgemm probe, e.g. for hosts known
  // to be equal; in [partition::kMinSpeed, partition::kMaxSpeed]. Default 0: the emulated rate
  // with emulate_gflops > 0 (what actions will take), else the probe (plan::ProbeSpeed over
  // single sgemm products at the highest instruction-set level this worker runs).
  double gflops = 0;
  // The highest instruction-set level this worker offers the coordinator (--max-isa; the levels
  // it registers are those this binary has and this CPU runs, up to this one). None (default):
  // every level this CPU runs. Check() refuses a cap below every level the CPU runs
  // (FAILED_PRECONDITION).
  std::optional<math::Isa> max_isa;
  // Backoff between control-stream attempts: starts at redial_initial, doubles up to
  // redial_max, and restarts from redial_initial once a stream got its first command; each pause
  // is a random 50-100 % of the backoff (jitter), so a restarted coordinator is found within
  // redial_max.
  absl::Duration redial_initial = absl::Milliseconds(100);
  absl::Duration redial_max = absl::Seconds(5);
  // The control stream pings the coordinator after this long without traffic, with or without
  // data in flight; no answer within max(this, 10 s) ends the stream (the job is dropped, the
  // worker redials). Default 10 s; at least 1 s (the coordinator refuses faster pings).
  absl::Duration keepalive = absl::Seconds(10);
  // Data-plane link options (fragment size, credit window, the size from which a tensor is split
  // over a link's connections: --link-stripe-threshold) for every Exchange stream.
  link::LinkOptions link;
  // HTTP/2 connections per link this worker dials to its higher-rank neighbours
  // (--link-connections): 1..link::kMaxLinkConnections, or 0 (default, "auto"):
  // link::AutoLinkConnections of the hardware threads and the job's compute threads. The
  // accepting side takes what the dialler chose (docs/wire.md §5).
  int link_connections = 0;
  // Prometheus metrics every job records (busy time, links, mailbox, stash); null: none.
  std::shared_ptr<metrics::WorkerMetrics> metrics;
  // Largest message accepted from the coordinator on the control channel (Assign, FetchState
  // chunks of 1 MiB): --max-message-size. Default 16 MiB; at least 2 MiB. The Exchange streams'
  // limit is the frame cap, wire::kMaxFrameMessageBytes.
  int64_t max_message_bytes = int64_t{16} << 20;
  // Most concurrent streams one connection may open to this worker's server
  // (GRPC_ARG_MAX_CONCURRENT_STREAMS): --max-concurrent-streams. A job needs at most two per peer.
  // Default 16; at least 4.
  int max_concurrent_streams = 16;
  // Largest tensor a peer may send on an Exchange stream: a frame header promising more is
  // refused (RESOURCE_EXHAUSTED) before anything is allocated: --max-tensor-bytes. Default 512 MiB;
  // at least 4 bytes.
  int64_t max_tensor_bytes = int64_t{512} << 20;
  // mTLS (--tls-cert/--tls-key/--tls-ca): the Exchange server requires and verifies a client
  // certificate signed by tls.ca_file, and every channel this worker dials (the coordinator, its
  // neighbours) is TLS with this certificate, which must name the advertised host
  // (docs/security.md). Default: plaintext.
  net::TlsOptions tls;
  // Allow plaintext on a non-loopback `listen` (--insecure). Default false.
  bool insecure = false;
  // Log lines ("<time> stage_worker[<name>] <message>") go to stderr unless false.
  bool log = true;

  // OK, or INVALID_ARGUMENT naming the bad field.
  absl::Status Check() const;
};

// The GFLOP/s a worker registers (what the coordinator partitions with) and where it came from.
struct WorkerSpeed {
  double gflops = 0;
  std::string source;  // e.g. "given by --gflops", "probe: 90th percentile of 200 ...".
};

// options.gflops when > 0, else options.emulate_gflops when > 0, else the speed probe
// (plan::ProbeSpeed over single 256^3 sgemm products at `isa`, which this CPU must run; about
// 0.2 s on an idle core, at most 2 s on a busy one). Errors only from the probe (INVALID_ARGUMENT
// for a sample that is not > 0). Not thread-safe against other products at `isa` (it sets
// Eigen's thread count for the probe).
absl::StatusOr<WorkerSpeed> ChooseWorkerSpeed(const StageWorkerOptions& options, math::Isa isa);

class StageWorkerDaemon final : private JobHost {
 public:
  // Pins Eigen's GEMM blocking (process-wide, once per process), measures GFLOP/s unless given,
  // starts the gRPC server and the daemon's threads, and begins dialling the coordinator (an
  // unreachable coordinator is retried, not an error). Errors: INVALID_ARGUMENT for bad options
  // or TLS files (NOT_FOUND for a missing one); FAILED_PRECONDITION for a non-loopback listen
  // address without TLS or `insecure`; UNAVAILABLE if the listen address cannot be bound.
  static absl::StatusOr<std::unique_ptr<StageWorkerDaemon>> Start(
      const StageWorkerOptions& options);

  // Shuts down (see Shutdown) and joins every thread.
  ~StageWorkerDaemon();
  StageWorkerDaemon(const StageWorkerDaemon&) = delete;
  StageWorkerDaemon& operator=(const StageWorkerDaemon&) = delete;

  // Stops the daemon: cancels the control stream, aborts and drops the current job (its links
  // closed, its compute thread joined) and stops the gRPC server. Idempotent; thread-safe; must
  // not be called from a gRPC callback. Returns when everything has stopped.
  void Shutdown();

  // Blocks until Shutdown() has been called (from another thread, e.g. a signal watcher).
  void Wait();

  // The advertised "host:port", the bound port, the name and the GFLOP/s sent in
  // RegisterWorker. Constant after Start; thread-safe.
  const std::string& address() const { return address_; }
  int port() const { return port_; }
  const std::string& name() const override { return name_; }
  double gflops() const { return gflops_; }

 private:
  // One unit of work for the command thread.
  struct Task {
    enum class Kind { kCommand, kStreamLost, kLinkFailed };
    Kind kind = Kind::kCommand;
    v1::WorkerCommand command;  // kCommand.
    std::string job;            // kLinkFailed: the job and generation whose link failed.
    int64_t generation = 0;
    absl::Status status;            // kStreamLost / kLinkFailed.
    bool coordinator_link = false;  // kLinkFailed: the coordinator's feed stream failed.
  };

  StageWorkerDaemon(const StageWorkerOptions& options, double gflops);

  absl::Status StartServer();
  // Session thread: dial, wait for the stream's end, back off, repeat until shutdown.
  void SessionLoop();
  // Command thread: runs tasks in order until shutdown.
  void CommandLoop();
  // Runs one task on the command thread: a command, the lost control stream (drops the job) or
  // a failed link of the current job (WorkerJob::OnLinkFailed).
  void HandleTask(Task task) ABSL_LOCKS_EXCLUDED(job_mu_);
  // Hands a coordinator command to `job` (the current job, or null) if it names it, else answers
  // it (CheckCurrent); Assign replaces the job; Release and OpenLinks of another job are ignored.
  void HandleCommand(const v1::WorkerCommand& command, const std::shared_ptr<WorkerJob>& job)
      ABSL_LOCKS_EXCLUDED(job_mu_);
  void HandleAssign(const v1::Assign& assign);
  // ProfileLayers: starts the profile on an idle worker (LayerProfiler), answers
  // FAILED_PRECONDITION on one that holds `job`.
  void HandleProfile(const v1::ProfileLayers& command, const std::shared_ptr<WorkerJob>& job);
  // Drops the current job (aborts its step, closes its links, joins its compute thread).
  void DropJob(absl::string_view why);
  // Checks that a command names the current job and generation; otherwise answers it (stale
  // generation: ABORTED; unknown job: FAILED_PRECONDITION) and returns false.
  bool CheckCurrent(const std::string& job, int64_t generation, int64_t step,
                    absl::string_view what);

  // Thread-safe; never blocks on the network.
  void Enqueue(Task task);
  // JobHost. Emit queues `event` on the current control stream (dropped if there is none).
  void Emit(v1::WorkerEvent event) override;
  void Log(absl::string_view message,
           logging::LogLevel level = logging::LogLevel::kInfo) const override;
  void LinkFailed(const std::string& job, int64_t generation, const absl::Status& status,
                  bool coordinator_link) override;
  v1::WorkerControl::Stub* coordinator() override { return coordinator_stub_.get(); }
  std::string coordinator_address() const override { return options_.coordinator; }
  // Accept callback of the ExchangeService (gRPC threads).
  absl::StatusOr<link::LinkSettings> Accept(const link::PeerHello& hello,
                                            std::unique_ptr<link::PeerLink> link);

  // Constant after construction.
  const StageWorkerOptions options_;
  const double gflops_;
  // RegisterWorker.incarnation: this daemon's start time in ns since the Unix epoch.
  const uint64_t incarnation_ = static_cast<uint64_t>(absl::GetCurrentTimeNanos());
  std::string address_;  // set in Start before any thread runs.
  std::string name_;     // likewise.
  int port_ = 0;         // likewise.

  // Answers the probe streams other workers open to measure their links to this one (Accept).
  link::ProbeAnswerer probe_answerer_;
  // Runs the coordinator's ProbeLinks (set in Start before any thread runs).
  std::unique_ptr<LinkProber> link_prober_;
  std::unique_ptr<link::ExchangeService> exchange_;
  std::unique_ptr<grpc::Server> server_;
  std::shared_ptr<grpc::Channel> coordinator_channel_;
  std::unique_ptr<v1::WorkerControl::Stub> coordinator_stub_;
  // Credentials of every channel this worker dials (set in StartServer).
  std::shared_ptr<grpc::ChannelCredentials> channel_credentials_;
  // With TLS: logs the certificate again when its files change (set in Start).
  std::unique_ptr<net::CertificateWatcher> certificate_watcher_;

  // Protects the shutdown flag, the current control stream and the task queue. `stop_` is also
  // what the session thread's backoff waits on.
  absl::Mutex mu_;
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool stopped_ ABSL_GUARDED_BY(mu_) = false;  // Shutdown() finished.
  // The open control stream (shared with Emit callers, which write outside mu_).
  std::shared_ptr<ControlStream> stream_ ABSL_GUARDED_BY(mu_);
  std::deque<Task> tasks_ ABSL_GUARDED_BY(mu_);

  // Protects the job that accepts Exchange streams (read by gRPC threads, replaced by the command
  // thread). Never held while calling into a Job.
  absl::Mutex job_mu_;
  std::shared_ptr<WorkerJob> job_ ABSL_GUARDED_BY(job_mu_);

  // Serialises Shutdown() callers.
  absl::Mutex shutdown_mu_;

  // Times layers for the coordinator's ProfileLayers (set in Start; used by the command thread).
  std::unique_ptr<LayerProfiler> profiler_;

  std::thread session_thread_;
  std::thread command_thread_;
};

}  // namespace pipetrain::worker

#endif  // PIPETRAIN_SERVER_WORKER_STAGE_WORKER_DAEMON_H_
