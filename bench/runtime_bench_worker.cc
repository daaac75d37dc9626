// runtime_bench_worker: the stage worker daemon (StageWorkerDaemon, the same library as
// `stage_worker`) registering a given speed instead of its sgemm probe, for `runtime_bench
// --real`. The coordinator partitions layers by the registered speeds; a real worker's probe
// measures a bare sgemm (~2x the rate a training step reaches on this model), so next to
// emulated workers, which register the rate they emulate, it would get about twice its share of
// the model. Registering the rate measured on the model itself makes every stage take about as
// long as the others. Runs until SIGINT/SIGTERM, like `stage_worker`.
//
// Usage: runtime_bench_worker COORDINATOR NAME GFLOPS [CPUS]
//   host:port, worker name, GFLOP/s > 0, and the CPUs to run on (a list like stage_worker --cpus).
#include <signal.h>

#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "absl/strings/numbers.h"
#include "common/util/cpu_set.h"
#include "common/util/heap_tuning.h"
#include "common/util/lock_checks.h"
#include "server/worker/stage_worker_daemon.h"

int main(int argc, char** argv) {
  double gflops = 0;
  if (argc < 4 || argc > 5 || !absl::SimpleAtod(argv[3], &gflops) || !(gflops > 0)) {
    std::fprintf(stderr, "usage: runtime_bench_worker COORDINATOR NAME GFLOPS (> 0) [CPUS]\n");
    return 2;
  }
  if (argc == 5) {  // before any other thread starts: all of them inherit the CPUs.
    if (absl::Status confined = pipetrain::util::ConfineToCpuList(argv[4]); !confined.ok()) {
      std::fprintf(stderr, "runtime_bench_worker: CPUS: %s\n",
                   std::string(confined.message()).c_str());
      return 2;
    }
  }
  pipetrain::util::ConfigureLockChecks();  // as stage_worker does.
  if (absl::Status s = pipetrain::util::KeepLargeBuffersOnHeap(); !s.ok()) {
    std::fprintf(stderr, "runtime_bench_worker: %s; continuing with glibc's defaults\n",
                 std::string(s.message()).c_str());
  }
  pipetrain::worker::StageWorkerOptions options;
  options.coordinator = argv[1];
  options.name = argv[2];
  options.gflops = gflops;
  // The daemon's threads inherit the blocked stop signals; this thread waits for them.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  auto daemon = pipetrain::worker::StageWorkerDaemon::Start(options);
  if (!daemon.ok()) {
    std::fprintf(stderr, "runtime_bench_worker: %s\n", daemon.status().ToString().c_str());
    return 2;
  }
  int signal = 0;
  sigwait(&stop_signals, &signal);
  (*daemon)->Shutdown();
  return 0;
}
