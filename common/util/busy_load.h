// BusyLoad: threads that keep some CPUs busy with a fixed unit of work and count the units they
// finish, so that a measurement can tell how much of those CPUs something else running meanwhile
// took from them: the link probe's cost of a message to a worker whose compute thread keeps its
// CPU busy (server/link/link_probe.h, docs/scaling.md "Links").
//
// Each unit is one pass over a 1 MiB buffer of floats (a fused multiply-add per element), a
// working set the size of a core's L2 cache here, as a worker's weights and activations are: what
// runs in between evicts it, as it evicts a worker's.
#ifndef PIPETRAIN_COMMON_UTIL_BUSY_LOAD_H_
#define PIPETRAIN_COMMON_UTIL_BUSY_LOAD_H_

#include <atomic>
#include <memory>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"

namespace pipetrain::util {

class BusyLoad {
 public:
  // Starts one thread per CPU of `cpus`, each confined to its CPU (ConfineToCpus) before it runs
  // a unit; returns once every thread runs. INVALID_ARGUMENT for no CPU, a CPU named twice or one
  // this process may not use (ConfineToCpus's message).
  static absl::StatusOr<std::unique_ptr<BusyLoad>> Start(const std::vector<int>& cpus);

  ~BusyLoad();  // Stop()s.
  BusyLoad(const BusyLoad&) = delete;
  BusyLoad& operator=(const BusyLoad&) = delete;

  // Stops the threads (each finishes its unit) and returns the units they finished per second of
  // wall time from Start to Stop, summed over the threads; > 0. Later calls return the same
  // figure.
  double Stop();

 private:
  struct Worker {
    std::atomic<int64_t> units{0};
    std::thread thread;
  };

  BusyLoad() = default;

  std::atomic<bool> stop_{false};
  std::vector<std::unique_ptr<Worker>> workers_;
  absl::Time start_;
  int64_t units_at_start_ = 0;
  double rate_ = -1;  // set by the first Stop.
};

}  // namespace pipetrain::util

#endif  // PIPETRAIN_COMMON_UTIL_BUSY_LOAD_H_
