// The coordinator daemon: serves pipetrain.v1.Coordinator (worker control streams and the client
// API), the gRPC health service and, when available, reflection.
//
//   coordinator --listen 127.0.0.1:7070 [--client-listen ADDR] [--port-file PATH]
//               [--client-lease 5m] [--job-retention 1h] [--max-ended-jobs 1000]
//               [--step-deadline-floor 60s] [--step-deadline-factor 50]
//               [--checkpoint-root DIR] [--state-dir DIR] [--metrics-listen HOST:PORT]
//               [--max-message-size BYTES] [--max-concurrent-streams N]
//               [--max-layers N] [--max-microbatches N]
//               [--tls-cert FILE --tls-key FILE --tls-ca FILE [--auth-token-file FILE
//                [--auth-token-reload 5s]]]
//               [--insecure]
//
// With a port of 0 the kernel picks a free port; the daemon prints one line
// "coordinator listening on HOST:PORT" to stdout once it serves, and writes "PORT\n" to
// --port-file (atomically) if given. SIGINT/SIGTERM shut it down cleanly (exit code 0).
#include <grpcpp/grpcpp.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_cat.h"
#include "common/io/file_util.h"
#include "common/net/token_auth.h"
#include "common/net/transport_security.h"
#include "common/util/annotate.h"
#include "common/util/command_line.h"
#include "common/util/heap_tuning.h"
#include "common/util/lock_checks.h"
#include "common/util/status_macros.h"
#include "server/coordinator/coordinator_service.h"
#include "server/introspection/introspection.h"
#include "server/logging/daemon_log.h"
#include "server/metrics/coordinator_metrics.h"
#include "server/metrics/metrics_server.h"

ABSL_FLAG(std::string, listen, "127.0.0.1:7070",
          "host:port for the worker control plane (and the client API); port 0 picks one");
ABSL_FLAG(std::string, client_listen, "",
          "optional second host:port serving the same service, e.g. for clients");
ABSL_FLAG(std::string, port_file, "", "write the chosen --listen port here (atomically)");
ABSL_FLAG(absl::Duration, client_lease, absl::Minutes(5),
          "cancel a ready job that has had no Train stream and no Checkpoint for this long "
          "(status queries do not count)");
ABSL_FLAG(absl::Duration, job_retention, absl::Hours(1),
          "keep ended jobs listed (ListJobs/GetJob) this long");
ABSL_FLAG(int32_t, max_ended_jobs, 1000, "keep at most this many ended jobs listed");
ABSL_FLAG(int32_t, job_events, 256,
          "events of each job kept for `pipetrain watch` (WatchJob): its recent history; a slower "
          "watcher skips older ones");
ABSL_FLAG(absl::Duration, step_deadline_floor, absl::Seconds(60),
          "a step's workers must all answer within max(this, --step-deadline-factor x the plan's "
          "predicted step time)");
ABSL_FLAG(absl::Duration, peer_keepalive, absl::Seconds(5),
          "ping every connection (workers' control streams, clients) this often; one that does "
          "not answer within max(this, 10s) is closed, so a stopped or cut-off worker is "
          "noticed as lost (its job recovers)");
ABSL_FLAG(std::string, checkpoint_root, "",
          "checkpoint and resume directories that clients name must lie under this directory");
ABSL_FLAG(std::string, state_dir, "",
          "keep a durable journal of the unfinished jobs here; a coordinator restarted on the "
          "same directory continues them from their last checkpoint (docs/recovery.md); one "
          "coordinator per directory (a second one refuses to start); empty: jobs do not "
          "survive a restart");
ABSL_FLAG(std::string, growth_dir, "",
          "where a job that grows (--max-stages) writes the checkpoint it takes for the growth, "
          "as <dir>/<job id> (docs/scaling.md, \"Jobs that change shape\")");
ABSL_FLAG(std::string, log_format, "text",
          "log lines as text (TIME LEVEL SOURCE MESSAGE) or json (one object per line)");
ABSL_FLAG(std::string, log_level, "info",
          "least severe log lines written: debug|info|warning|error");
ABSL_FLAG(std::string, metrics_listen, "",
          "host:port to serve Prometheus metrics on (/metrics); port 0 picks one");
ABSL_FLAG(double, step_deadline_factor, 50,
          "margin over the plan's predicted step time before a worker is declared stuck");
ABSL_FLAG(std::string, tls_cert, "", "PEM certificate of the coordinator (mTLS on every hop)");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls-cert");
ABSL_FLAG(std::string, tls_ca, "",
          "PEM CA certificate that signs the workers and clients this coordinator accepts");
ABSL_FLAG(std::string, auth_token_file, "",
          "client tokens, one per line: every client call must send one (authorization: Bearer); "
          "then --client-listen also takes clients without a certificate. Needs TLS");
ABSL_FLAG(absl::Duration, auth_token_reload, absl::Seconds(5),
          "how often --auth-token-file is checked for changes; a changed file's tokens replace "
          "the old ones (a file that no longer reads keeps them, with a log line)");
ABSL_FLAG(bool, insecure, false,
          "allow plaintext gRPC on a non-loopback --listen/--client-listen (anyone who reaches "
          "it can register workers and submit jobs)");

ABSL_FLAG(int64_t, max_message_size, int64_t{512} << 20,
          "largest gRPC message (bytes) received, e.g. a Train batch");
ABSL_FLAG(int32_t, max_concurrent_streams, 100,
          "most concurrent gRPC streams one connection (a client, a worker) may open");
ABSL_FLAG(int32_t, max_layers, 4096, "most layers a job's model may have");
ABSL_FLAG(bool, probe_links, true,
          "have each worker that registers measure its links to the idle workers registered "
          "before it (listed by ListWorkers, used by `pipetrain plan`)");
ABSL_FLAG(int32_t, max_microbatches, 1024, "most micro-batches a job's step may have");

namespace {

using pipetrain::coordinator::CoordinatorOptions;
using pipetrain::coordinator::CoordinatorService;
using pipetrain::coordinator::ServiceTransport;

// Everything main() reads from its flags, checked once (Config).
struct DaemonConfig {
  std::string listen;                               // --listen.
  std::string client_listen;                        // --client-listen; empty: none.
  std::string port_file;                            // --port-file; empty: none.
  std::string state_dir;                            // --state-dir; empty: no journal.
  std::string metrics_listen;                       // --metrics-listen; empty: no metrics.
  std::string token_file;                           // --auth-token-file; empty: no tokens.
  absl::Duration token_reload;                      // --auth-token-reload.
  std::vector<pipetrain::net::ClientToken> tokens;  // its tokens.
  pipetrain::net::TlsOptions tls;                   // --tls-cert, --tls-key, --tls-ca.
  absl::Duration keepalive;                         // --peer-keepalive.
  int max_message = 0;                              // --max-message-size.
  int max_streams = 0;                              // --max-concurrent-streams.
  CoordinatorOptions core;
  ServiceTransport transport;  // its link credentials are set by MakeCredentials.
};

// The server's credentials: the --listen port's, the --client-listen port's.
struct Credentials {
  std::shared_ptr<grpc::ServerCredentials> listen;
  std::shared_ptr<grpc::ServerCredentials> client_listen;
  // With TLS: the processor that checks every call (its tokens reload when the file changes).
  std::shared_ptr<pipetrain::net::TokenAuthProcessor> processor;
};

// Host part of "host:port" (brackets kept for IPv6).
std::string HostOf(const std::string& address) {
  const size_t colon = address.rfind(':');
  return colon == std::string::npos ? address : address.substr(0, colon);
}

bool WritePortFile(const std::string& path, int port) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << port << "\n";
    if (!out.good()) return false;
  }
  return std::rename(tmp.c_str(), path.c_str()) == 0;
}

// The listen addresses and the transport security flags: plaintext only where allowed, tokens
// only with TLS (docs/security.md).
absl::Status SecurityConfig(DaemonConfig& c) {
  c.tls.cert_file = absl::GetFlag(FLAGS_tls_cert);
  c.tls.key_file = absl::GetFlag(FLAGS_tls_key);
  c.tls.ca_file = absl::GetFlag(FLAGS_tls_ca);
  c.listen = absl::GetFlag(FLAGS_listen);
  c.client_listen = absl::GetFlag(FLAGS_client_listen);
  c.token_file = absl::GetFlag(FLAGS_auth_token_file);
  c.token_reload = absl::GetFlag(FLAGS_auth_token_reload);
  if (c.token_reload <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--auth-token-reload must be > 0");
  }
  for (const auto& [flag, address] : {std::pair<const char*, std::string>{"--listen", c.listen},
                                      {"--client-listen", c.client_listen}}) {
    if (address.empty()) continue;
    PT_RETURN_IF_ERROR(pipetrain::net::CheckListenSecurity(flag, address, c.tls.enabled(),
                                                           absl::GetFlag(FLAGS_insecure)));
  }
  if (!c.token_file.empty() && !c.tls.enabled()) {
    return absl::InvalidArgumentError(
        "--auth-token-file needs TLS (--tls-cert, --tls-key, --tls-ca): tokens are never "
        "accepted in clear");
  }
  if (!c.token_file.empty()) {
    absl::StatusOr<std::vector<pipetrain::net::ClientToken>> read =
        pipetrain::net::ReadTokenFile(c.token_file);
    if (!read.ok()) return pipetrain::util::Annotate(read.status(), "--auth-token-file");
    c.tokens = *std::move(read);
  }
  return absl::OkStatus();
}

// --growth-dir, or its default: <state dir>/growth, else pipetrain-growth-<pid> in the temporary
// directory (jobs do not outlive this process then).
std::string GrowthDir(const std::string& flag, const std::string& state_dir) {
  if (!flag.empty()) return flag;
  if (!state_dir.empty()) return pipetrain::io::JoinPath(state_dir, "growth");
  std::error_code error;
  std::string tmp = std::filesystem::temp_directory_path(error).string();
  if (error || tmp.empty()) tmp = "/tmp";
  return pipetrain::io::JoinPath(tmp, absl::StrCat("pipetrain-growth-", getpid()));
}

// Every flag, checked: INVALID_ARGUMENT naming the flag.
absl::StatusOr<DaemonConfig> Config() {
  DaemonConfig c;
  PT_RETURN_IF_ERROR(SecurityConfig(c));
  c.port_file = absl::GetFlag(FLAGS_port_file);
  c.state_dir = absl::GetFlag(FLAGS_state_dir);
  c.metrics_listen = absl::GetFlag(FLAGS_metrics_listen);
  c.core.client_lease = absl::GetFlag(FLAGS_client_lease);
  c.core.job_retention = absl::GetFlag(FLAGS_job_retention);
  c.core.max_ended_jobs = absl::GetFlag(FLAGS_max_ended_jobs);
  c.core.job_events = absl::GetFlag(FLAGS_job_events);
  c.core.step_deadline_floor = absl::GetFlag(FLAGS_step_deadline_floor);
  c.core.step_deadline_factor = absl::GetFlag(FLAGS_step_deadline_factor);
  c.core.probe_links = absl::GetFlag(FLAGS_probe_links);
  c.core.checkpoint_root = absl::GetFlag(FLAGS_checkpoint_root);
  c.core.growth_dir = GrowthDir(absl::GetFlag(FLAGS_growth_dir), c.state_dir);
  c.core.job_limits.max_layers = absl::GetFlag(FLAGS_max_layers);
  c.core.job_limits.max_microbatches = absl::GetFlag(FLAGS_max_microbatches);
  c.transport.check_worker_certificates = c.tls.enabled();
  const int64_t max_message = absl::GetFlag(FLAGS_max_message_size);
  const int32_t max_streams = absl::GetFlag(FLAGS_max_concurrent_streams);
  if (max_message < (int64_t{1} << 20) || max_message > INT32_MAX || max_streams < 4) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--max-message-size must be in [1 MiB, 2 GiB) and --max-concurrent-streams >= 4, got ",
        max_message, " and ", max_streams));
  }
  c.max_message = static_cast<int>(max_message);
  c.max_streams = max_streams;
  c.keepalive = absl::GetFlag(FLAGS_peer_keepalive);
  if (c.keepalive <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError("--peer-keepalive must be > 0");
  }
  PT_RETURN_IF_ERROR(c.core.Check());
  return c;
}

// The credentials of both ports and of the data links to the workers; with TLS, the token and
// certificate authorization of every call. Logs what it set up.
absl::StatusOr<Credentials> MakeCredentials(DaemonConfig& c) {
  using pipetrain::net::ClientCertificate;
  Credentials out;
  PT_ASSIGN_OR_RETURN(out.listen, pipetrain::net::MakeServerCredentials(c.tls));
  // --client-listen takes a client with a token alone when tokens are configured.
  PT_ASSIGN_OR_RETURN(
      out.client_listen,
      pipetrain::net::MakeServerCredentials(
          c.tls, c.tokens.empty() ? ClientCertificate::kRequired : ClientCertificate::kOptional));
  PT_ASSIGN_OR_RETURN(c.transport.link_credentials, pipetrain::net::MakeChannelCredentials(c.tls));
  if (!c.tls.enabled()) {
    if (absl::GetFlag(FLAGS_insecure)) {
      std::cerr << "coordinator: --insecure: plaintext gRPC, anyone who reaches "
                << (c.client_listen.empty() ? c.listen : c.listen + " / " + c.client_listen)
                << " can register workers and submit jobs\n";
    }
    return out;
  }
  pipetrain::net::TokenAuthOptions auth;
  auth.tokens = c.tokens;
  // Workers authenticate with their certificate alone (docs/security.md); the health service
  // is open; every other service (the client API, reflection) needs a client's credentials.
  auth.certificate_services = {pipetrain::v1::WorkerControl::service_full_name()};
  auth.open_services = {"grpc.health.v1.Health"};
  auth.log = [](const std::string& line) { std::cerr << "coordinator: " << line << "\n"; };
  out.processor = std::make_shared<pipetrain::net::TokenAuthProcessor>(std::move(auth));
  out.listen->SetAuthMetadataProcessor(out.processor);
  out.client_listen->SetAuthMetadataProcessor(out.processor);
  absl::StatusOr<std::string> line = pipetrain::net::CheckTlsFiles(c.tls);
  std::cerr << "coordinator: " << (line.ok() ? *line : line.status().ToString()) << "; "
            << (c.tokens.empty()
                    ? std::string("clients need a certificate")
                    : absl::StrCat(c.tokens.size(), " client token(s) from ", c.token_file))
            << "\n";
  return out;
}

// The server's channel settings: keepalive (a peer that stops answering pings has its connection
// closed, which ends a worker's Join stream like a crash would), message and stream limits.
void ConfigureChannels(const DaemonConfig& c, grpc::ServerBuilder& builder) {
  const int keepalive_ms =
      static_cast<int>(std::min<int64_t>(absl::ToInt64Milliseconds(c.keepalive), int64_t{1} << 30));
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, keepalive_ms);
  // At least 10 s to answer: an idle client's channel answers pings only from gRPC's backup
  // poller (every 5 s), and must not be cut off for that.
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS, std::max(keepalive_ms, 10000));
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
  builder.SetMaxReceiveMessageSize(c.max_message);
  // What the coordinator sends is bounded by construction (a model spec of at most 1 MiB in an
  // Assign, 1 MiB FetchState chunks); each receiver enforces its own limit.
  builder.SetMaxSendMessageSize(-1);
  builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS, c.max_streams);
  pipetrain::coordinator::AllowClientKeepalive(builder);
}

// Serves until SIGINT or SIGTERM (blocked in every thread, awaited here), then shuts down.
// The exit code.
int Serve(const DaemonConfig& c, const Credentials& credentials, CoordinatorService& service,
          const sigset_t& signals) {
  grpc::ServerBuilder builder;
  pipetrain::introspection::AddHealthAndReflection(&builder);
  int port = 0;
  builder.AddListeningPort(c.listen, credentials.listen, &port);
  int client_port = 0;
  if (!c.client_listen.empty()) {
    builder.AddListeningPort(c.client_listen, credentials.client_listen, &client_port);
  }
  ConfigureChannels(c, builder);
  service.RegisterOn(builder);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr || port == 0 || (!c.client_listen.empty() && client_port == 0)) {
    std::cerr << "coordinator: cannot listen on " << c.listen
              << (c.client_listen.empty() ? "" : " / " + c.client_listen) << "\n";
    return 1;
  }
  pipetrain::introspection::SetServing(server.get(), CoordinatorService::ServiceNames());
  if (!c.port_file.empty() && !WritePortFile(c.port_file, port)) {
    std::cerr << "coordinator: cannot write --port-file " << c.port_file << "\n";
    server->Shutdown();
    return 1;
  }
  const std::string bound = absl::StrCat(HostOf(c.listen), ":", port);
  service.RecordListenAddress(bound);  // names this process in the state directory's lock file.
  std::cout << "coordinator listening on " << bound << std::endl;
  pipetrain::logging::Log(
      "coordinator", pipetrain::logging::LogLevel::kInfo,
      absl::StrCat("serving on ", bound,
                   c.client_listen.empty() ? "" : absl::StrCat(" and port ", client_port)));
  int sig = 0;
  sigwait(&signals, &sig);
  pipetrain::logging::Log("coordinator", pipetrain::logging::LogLevel::kInfo,
                          absl::StrCat("signal ", sig, ", shutting down"));
  pipetrain::introspection::SetNotServing(server.get());
  service.Shutdown();
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(2));
  server->Wait();
  return 0;
}

// Parses the command line and configures logging: the exit code if the process should stop.
std::optional<int> ParseCommandLine(int argc, char** argv) {
  // Every flag defined here; --help lists them, dashes and underscores alike, flag files too.
  const pipetrain::ProgramSpec program{
      "coordinator",
      "the pipetrain coordinator daemon: registers stage workers, plans jobs and drives their "
      "steps; serves pipetrain.v1.Coordinator, health and reflection",
      {},
      pipetrain::ProgramFlags(),
      "",
      // What the flags' own defaults ("") stand for.
      {{"checkpoint_root", "none: this coordinator keeps no checkpoints"},
       {"state_dir", "none: jobs do not survive a restart"},
       {"growth_dir", "<state-dir>/growth, else pipetrain-growth-<pid> in $TMPDIR"}}};
  absl::SetProgramUsageMessage(program.summary);
  if (std::optional<int> exit_code = pipetrain::ParseDaemonCommandLine(program, argc, argv)) {
    return exit_code;
  }
  if (const absl::Status s = pipetrain::logging::ConfigureLoggingFromFlags(
          absl::GetFlag(FLAGS_log_format), absl::GetFlag(FLAGS_log_level));
      !s.ok()) {
    std::cerr << "coordinator: " << s.message() << "\n";
    return 2;
  }
  return std::nullopt;
}

}  // namespace

int main(int argc, char** argv) {
  // Release builds: no lock-order bookkeeping on every Mutex acquisition (lock_checks.h).
  pipetrain::util::ConfigureLockChecks();
  // gRPC allocates multi-MiB receive slices per read; keep them on the heap instead of a fresh
  // mmap each (docs/wire.md §5).
  if (absl::Status s = pipetrain::util::KeepLargeBuffersOnHeap(); !s.ok()) {
    std::cerr << "coordinator: " << s.message() << "; continuing with glibc's defaults\n";
  }
  if (std::optional<int> exit_code = ParseCommandLine(argc, argv)) return *exit_code;
  // Block the shutdown signals in every thread; Serve waits for them with sigwait.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  signal(SIGPIPE, SIG_IGN);
  absl::StatusOr<DaemonConfig> config = Config();
  absl::StatusOr<Credentials> credentials =
      config.ok() ? MakeCredentials(*config) : config.status();
  if (!credentials.ok()) {
    std::cerr << "coordinator: " << credentials.status().message() << "\n";
    return 2;
  }
  // Logs the certificate's new expiry when its files change (gRPC reloads them).
  std::unique_ptr<pipetrain::net::CertificateWatcher> certificate_watcher;
  // Reloads the client tokens when the token file changes, as the certificates are.
  std::unique_ptr<pipetrain::net::TokenFileWatcher> token_watcher;
  if (!config->token_file.empty()) {
    token_watcher = std::make_unique<pipetrain::net::TokenFileWatcher>(
        config->token_file, config->token_reload, credentials->processor,
        [](const std::string& line) { std::cerr << "coordinator: " << line << "\n"; });
  }
  if (config->tls.enabled()) {
    certificate_watcher = std::make_unique<pipetrain::net::CertificateWatcher>(
        config->tls, config->tls.refresh_interval,
        [](const std::string& line) { std::cerr << "coordinator: " << line << "\n"; });
  }
  // Metrics first, so a bad --metrics-listen fails before the service starts.
  pipetrain::metrics::MetricsRegistry metrics_registry("coordinator");
  if (!config->metrics_listen.empty()) {
    config->core.metrics =
        std::make_shared<pipetrain::metrics::CoordinatorMetrics>(metrics_registry);
  }
  absl::StatusOr<std::unique_ptr<pipetrain::metrics::MetricsServer>> metrics_server =
      pipetrain::metrics::MetricsServer::ServeIfRequested(config->metrics_listen, metrics_registry,
                                                          "coordinator");
  if (!metrics_server.ok()) {
    std::cerr << "coordinator: " << metrics_server.status().message() << "\n";
    return 2;
  }
  auto service = std::make_unique<CoordinatorService>(config->core, config->transport);
  if (!config->state_dir.empty()) {
    // One coordinator per state directory: a second one stops here, naming the holder.
    if (const absl::Status s = service->OpenJournal(config->state_dir, config->listen); !s.ok()) {
      std::cerr << "coordinator: --state-dir " << config->state_dir << ": " << s.message() << "\n";
      return 1;
    }
  }
  return Serve(*config, *credentials, *service, signals);
}
