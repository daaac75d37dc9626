// stage_worker: the pipeline stage worker daemon. Flags -> StageWorkerOptions -> run until
// SIGINT/SIGTERM. All behaviour lives in StageWorkerDaemon (server/worker/stage_worker_daemon.h).
#include <algorithm>
#include <csignal>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <iostream>
#include <memory>
#include <optional>
#include <string>

#include "absl/flags/flag.h"
#include "absl/flags/usage.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/util/command_line.h"
#include "common/util/cpu_set.h"
#include "common/util/heap_tuning.h"
#include "common/util/lock_checks.h"
#include "server/logging/daemon_log.h"
#include "server/metrics/metrics_server.h"
#include "server/metrics/worker_metrics.h"
#include "server/worker/stage_worker_daemon.h"

ABSL_FLAG(std::string, coordinator, "",
          "HOST:PORT of the coordinator this worker joins: the address it listens on (its "
          "--listen)");
ABSL_FLAG(std::string, listen, "127.0.0.1:0",
          "Address to serve StageWorker.Exchange, health and reflection on (port 0: pick one). "
          "A non-loopback address needs --tls-cert/--tls-key/--tls-ca or --insecure.");
ABSL_FLAG(std::string, name, "",
          "Stable worker name; with TLS, one its certificate vouches for (docs/security.md).");
ABSL_FLAG(std::string, advertise, "", "host:port peers use to reach this worker.");
ABSL_FLAG(double, emulate_gflops, 0,
          "emulate a worker of X GFLOP/s: every action takes at least FLOPs / (X * 1e9) seconds "
          "(benchmarks).");
ABSL_FLAG(std::string, gflops, "",
          "GFLOP/s to register instead of measuring (> 0), e.g. the same value on hosts known to "
          "be equal: the coordinator partitions layers by it");
ABSL_FLAG(int, threads_max, 0, "Most compute threads a job may ask for.");
ABSL_FLAG(std::string, cpus, "",
          "CPUs every thread of this worker runs on, as a list like 0-3,8. Several workers on one "
          "host each on their own CPUs transfer "
          "tensors faster (docs/performance.md, \"One core per worker\"); `pipetrain local` "
          "does this for its workers");
ABSL_FLAG(std::string, log_format, "text",
          "log lines as text (TIME LEVEL SOURCE MESSAGE) or json (one object per line)");
ABSL_FLAG(std::string, log_level, "info",
          "least severe log lines written: debug|info|warning|error");
ABSL_FLAG(std::string, metrics_listen, "",
          "host:port to serve Prometheus metrics on (/metrics); port 0 picks one");
ABSL_FLAG(std::string, tls_cert, "",
          "PEM certificate of this worker (mTLS on every hop; it must name the --advertise host)");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls-cert");
ABSL_FLAG(std::string, tls_ca, "", "PEM CA certificate that signs the coordinator and the workers");
ABSL_FLAG(bool, insecure, false,
          "allow plaintext gRPC on a non-loopback --listen (anyone who reaches it can join)");
ABSL_FLAG(absl::Duration, keepalive, absl::Seconds(10),
          "ping the coordinator after this long without traffic; no answer within max(this, 10s) "
          "ends the control stream (the job is dropped and the worker redials)");

ABSL_FLAG(int64_t, max_message_size, int64_t{16} << 20,
          "largest message (bytes) accepted from the coordinator on the control channel");
ABSL_FLAG(int64_t, max_tensor_bytes, int64_t{512} << 20,
          "largest tensor (bytes) a peer may send on an Exchange stream");
ABSL_FLAG(std::string, max_isa, "",
          "Highest instruction set of the math this worker offers: x86-64-v3 or x86-64-v4");
ABSL_FLAG(int32_t, max_concurrent_streams, 16,
          "most concurrent gRPC streams one connection may open to this worker");
ABSL_FLAG(std::string, link_connections, "auto",
          "HTTP/2 connections per link this worker dials to its higher-rank neighbour: 1-8, or "
          "auto (1 unless this worker may use more CPUs than the job's compute threads + 1; then "
          "min(4, CPUs - compute threads)). The neighbour accepts what it is sent. "
          "docs/wire.md section 5");
ABSL_FLAG(int64_t, link_stripe_threshold, int64_t{4} << 20,
          "on a link of several connections, tensors of at least this many bytes are split over "
          "them; smaller ones go whole on the first connection");

namespace {

// Tunes the process before any thread starts: no lock-order bookkeeping in release builds, large
// buffers kept on the heap. Never fails (a tuning that cannot be applied is reported on stderr).
void TuneProcess() {
  // Release builds: no lock-order bookkeeping on every Mutex acquisition (lock_checks.h).
  pipetrain::util::ConfigureLockChecks();
  // gRPC allocates multi-MiB receive slices per read and Eigen a packing buffer per product;
  // above glibc's default mmap threshold each is a fresh mmap whose page faults dominate the
  // receive path (docs/wire.md §5: about 2x stream throughput) and the products. Keep them on
  // the heap.
  if (absl::Status s = pipetrain::util::KeepLargeBuffersOnHeap(); !s.ok()) {
    std::cerr << "stage_worker: " << s.message() << "; continuing with glibc's defaults\n";
  }
}

// Confines the process to --cpus and configures logging from --log-format and --log-level; the
// error to print (naming the flag) otherwise. Before any other thread starts, so that every
// thread of the daemon inherits the CPUs.
absl::Status ConfigureProcess() {
  if (const std::string cpus = absl::GetFlag(FLAGS_cpus); !cpus.empty()) {
    if (absl::Status s = pipetrain::util::ConfineToCpuList(cpus); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--cpus: ", s.message()));
    }
  }
  return pipetrain::logging::ConfigureLoggingFromFlags(absl::GetFlag(FLAGS_log_format),
                                                       absl::GetFlag(FLAGS_log_level));
}

// The daemon's options from the flags (all but the metrics); INVALID_ARGUMENT naming the flag
// for a bad --max-isa or --link-connections.
absl::StatusOr<pipetrain::worker::StageWorkerOptions> OptionsFromFlags() {
  pipetrain::worker::StageWorkerOptions options;
  options.coordinator = absl::GetFlag(FLAGS_coordinator);
  if (options.coordinator.empty()) {
    return absl::InvalidArgumentError(
        "--coordinator HOST:PORT is required: the address the coordinator this worker joins "
        "listens on (its --listen; e.g. --coordinator 127.0.0.1:7070). `stage_worker --help` lists "
        "every flag");
  }
  options.listen = absl::GetFlag(FLAGS_listen);
  options.name = absl::GetFlag(FLAGS_name);
  options.advertise = absl::GetFlag(FLAGS_advertise);
  options.emulate_gflops = absl::GetFlag(FLAGS_emulate_gflops);
  if (const std::string gflops = absl::GetFlag(FLAGS_gflops); !gflops.empty()) {
    if (!absl::SimpleAtod(gflops, &options.gflops) || !(options.gflops > 0)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--gflops must be a number > 0 (GFLOP/s), got '", gflops, "'"));
    }
  }
  options.threads_max = absl::GetFlag(FLAGS_threads_max);
  options.keepalive = absl::GetFlag(FLAGS_keepalive);
  options.max_message_bytes = absl::GetFlag(FLAGS_max_message_size);
  options.max_concurrent_streams = absl::GetFlag(FLAGS_max_concurrent_streams);
  options.max_tensor_bytes = absl::GetFlag(FLAGS_max_tensor_bytes);
  options.tls.cert_file = absl::GetFlag(FLAGS_tls_cert);
  options.tls.key_file = absl::GetFlag(FLAGS_tls_key);
  options.tls.ca_file = absl::GetFlag(FLAGS_tls_ca);
  options.insecure = absl::GetFlag(FLAGS_insecure);
  absl::StatusOr<std::optional<pipetrain::math::Isa>> max_isa =
      pipetrain::math::ParseOptionalIsa(absl::GetFlag(FLAGS_max_isa));
  if (!max_isa.ok()) {
    return absl::InvalidArgumentError(absl::StrCat("--max-isa: ", max_isa.status().message()));
  }
  options.max_isa = *max_isa;
  if (const std::string connections = absl::GetFlag(FLAGS_link_connections);
      connections == "auto") {
    options.link_connections = 0;
  } else if (!absl::SimpleAtoi(connections, &options.link_connections) ||
             options.link_connections < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--link-connections must be auto or 1-8, got '", connections, "'"));
  }
  options.link.stripe_min_bytes = absl::GetFlag(FLAGS_link_stripe_threshold);
  return options;
}

// Blocks SIGINT and SIGTERM in this thread and every thread it starts afterwards (they inherit
// the mask) and returns them, for sigwait: shutdown then runs in ordinary thread context.
sigset_t BlockStopSignals() {
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  return stop_signals;
}

}  // namespace

int main(int argc, char** argv) {
  TuneProcess();
  // Every flag defined here; --help lists them, dashes and underscores alike, flag files too.
  const pipetrain::ProgramSpec program{
      "stage_worker",
      "the pipetrain stage worker daemon: joins a coordinator and runs its pipeline stages; serves "
      "pipetrain.v1.StageWorker, health and reflection",
      {},
      pipetrain::ProgramFlags(),
      "",
      // What the flags' own defaults ("") stand for.
      {{"coordinator", pipetrain::kRequired},
       {"name", "the advertised address"},
       {"advertise", "--listen's host (the host name for a wildcard) and bound port"},
       {"cpus", "all the process may use"},
       {"max_isa", "the highest this CPU runs"},
       {"emulate_gflops", "off"},
       {"gflops", "measured: the 90th percentile of 200 short sgemm probes"},
       {"threads_max", "every CPU this worker may run on"}}};
  absl::SetProgramUsageMessage(program.summary);
  if (std::optional<int> exit_code = pipetrain::ParseDaemonCommandLine(program, argc, argv)) {
    return *exit_code;
  }
  if (const absl::Status s = ConfigureProcess(); !s.ok()) {
    absl::FPrintF(stderr, "stage_worker: %s\n", s.message());
    return 2;
  }
  absl::StatusOr<pipetrain::worker::StageWorkerOptions> options = OptionsFromFlags();
  if (!options.ok()) {
    absl::FPrintF(stderr, "stage_worker: %s\n", options.status().message());
    return 2;
  }
  const sigset_t stop_signals = BlockStopSignals();

  pipetrain::metrics::MetricsRegistry metrics_registry("stage_worker");
  const std::string metrics_listen = absl::GetFlag(FLAGS_metrics_listen);
  if (!metrics_listen.empty()) {
    options->metrics = std::make_shared<pipetrain::metrics::WorkerMetrics>(metrics_registry);
  }
  absl::StatusOr<std::unique_ptr<pipetrain::metrics::MetricsServer>> metrics_server =
      pipetrain::metrics::MetricsServer::ServeIfRequested(metrics_listen, metrics_registry,
                                                          "stage_worker");
  if (!metrics_server.ok()) {
    absl::FPrintF(stderr, "stage_worker: %s\n", metrics_server.status().message());
    return 2;
  }
  auto daemon = pipetrain::worker::StageWorkerDaemon::Start(*options);
  if (!daemon.ok()) {
    absl::FPrintF(stderr, "stage_worker: %s\n", daemon.status().ToString());
    return 2;
  }
  int signal = 0;
  sigwait(&stop_signals, &signal);
  pipetrain::logging::Log("stage_worker", pipetrain::logging::LogLevel::kInfo,
                          absl::StrCat("signal ", signal, ", shutting down"));
  (*daemon)->Shutdown();
  return 0;
}
