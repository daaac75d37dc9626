// Facts about the host a stage worker runs on: its name, memory and float32 GEMM rate, and the
// "host:port" syntax of the worker's addresses. All functions are thread-safe except
// MeasureGflops (see there).
#ifndef PIPETRAIN_SERVER_WORKER_HOST_PROBE_H_
#define PIPETRAIN_SERVER_WORKER_HOST_PROBE_H_

#include <cstdint>
#include <string>

#include "absl/time/time.h"

namespace pipetrain::worker {

// This machine's host name ("localhost" if it has none).
std::string HostName();

// Physical memory in bytes; 0 if unknown.
int64_t PhysicalMemoryBytes();

// Splits "host:port" (host may be "[v6]" or empty); false unless the port is a number in
// [0, 65535].
bool SplitHostPort(const std::string& address, std::string* host, std::string* port);

// Measures this machine's float32 GEMM rate in GFLOP/s: 256x256x256 Eigen products repeated for
// about `duration` on the calling thread, with one Eigen thread (Eigen's process-wide thread
// count is restored afterwards; do not call while another thread runs Eigen products). > 0.
double MeasureGflops(absl::Duration duration = absl::Milliseconds(100));

}  // namespace pipetrain::worker

#endif  // PIPETRAIN_SERVER_WORKER_HOST_PROBE_H_
