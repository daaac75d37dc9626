// stage_worker: the pipeline stage worker daemon. Flags -> StageWorkerOptions -> run until
// SIGINT/SIGTERM. All behaviour lives in StageWorkerDaemon (server/worker/stage_worker_daemon.h).
#include <malloc.h>

#include <algorithm>
#include <csignal>
#include <cstddef>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/flags/usage.h"
#include "absl/strings/str_format.h"
#include "common/util/flag_names.h"
#include "server/worker/stage_worker_daemon.h"

ABSL_FLAG(std::string, coordinator, "", "The coordinator's host:port (required).");
ABSL_FLAG(std::string, listen, "127.0.0.1:0",
          "Address to serve StageWorker.Exchange, health and reflection on (port 0: pick one). "
          "A non-loopback address needs --tls-cert/--tls-key/--tls-ca or --insecure.");
ABSL_FLAG(std::string, name, "", "Stable worker name (default: the advertised address).");
ABSL_FLAG(std::string, advertise, "",
          "host:port peers use to reach this worker (default: derived from --listen).");
ABSL_FLAG(double, emulate_gflops, 0,
          "> 0: every action takes at least FLOPs / (X * 1e9) seconds (benchmarks).");
ABSL_FLAG(int, threads_max, 0, "Most compute threads a job may ask for (0: all cores).");
ABSL_FLAG(std::string, tls_cert, "",
          "PEM certificate of this worker (mTLS on every hop; it must name the --advertise host)");
ABSL_FLAG(std::string, tls_key, "", "PEM private key of --tls-cert");
ABSL_FLAG(std::string, tls_ca, "", "PEM CA certificate that signs the coordinator and the workers");
ABSL_FLAG(bool, insecure, false,
          "allow plaintext gRPC on a non-loopback --listen (anyone who reaches it can join)");
ABSL_FLAG(absl::Duration, keepalive, absl::Seconds(10),
          "ping the coordinator after this long without traffic; no answer within max(this, 10s) "
          "ends the control stream (the job is dropped and the worker redials)");

int main(int argc, char** argv) {
  // gRPC allocates multi-MiB receive slices per read; above glibc's default mmap threshold each
  // is a fresh mmap whose page faults dominate the receive path. Keep them on the heap
  // (docs/wire.md §5: about 2x stream throughput).
  mallopt(M_MMAP_THRESHOLD, 64 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  absl::SetProgramUsageMessage(
      "stage_worker --coordinator HOST:PORT --listen ADDR [--name NAME] [--advertise HOST:PORT] "
      "[--emulate-gflops X] [--threads-max T] [--tls-cert FILE --tls-key FILE --tls-ca FILE | "
      "--insecure]");
  // --emulate-gflops and --emulate_gflops alike.
  std::vector<std::string> args = pipetrain::NormaliseFlagNames(argc, argv);
  std::vector<char*> arg_ptrs = pipetrain::ArgvOf(args);
  absl::ParseCommandLine(static_cast<int>(arg_ptrs.size()), arg_ptrs.data());

  pipetrain::worker::StageWorkerOptions options;
  options.coordinator = absl::GetFlag(FLAGS_coordinator);
  options.listen = absl::GetFlag(FLAGS_listen);
  options.name = absl::GetFlag(FLAGS_name);
  options.advertise = absl::GetFlag(FLAGS_advertise);
  options.emulate_gflops = absl::GetFlag(FLAGS_emulate_gflops);
  options.threads_max = absl::GetFlag(FLAGS_threads_max);
  options.keepalive = absl::GetFlag(FLAGS_keepalive);
  options.tls.cert_file = absl::GetFlag(FLAGS_tls_cert);
  options.tls.key_file = absl::GetFlag(FLAGS_tls_key);
  options.tls.ca_file = absl::GetFlag(FLAGS_tls_ca);
  options.insecure = absl::GetFlag(FLAGS_insecure);

  // Block the stop signals in every thread (the daemon's threads inherit the mask) and wait for
  // them here, so that shutdown runs in ordinary thread context.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  auto daemon = pipetrain::worker::StageWorkerDaemon::Start(options);
  if (!daemon.ok()) {
    absl::FPrintF(stderr, "stage_worker: %s\n", daemon.status().ToString());
    return 2;
  }
  int signal = 0;
  sigwait(&stop_signals, &signal);
  absl::FPrintF(stderr, "stage_worker: signal %d, shutting down\n", signal);
  (*daemon)->Shutdown();
  return 0;
}
