// Facts about the host a stage worker runs on: its name and memory, and the "host:port" syntax of
// the worker's addresses (its GEMM rate: math::Kernels::MeasureGemmGflops). All functions are
// thread-safe.
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

}  // namespace pipetrain::worker

#endif  // PIPETRAIN_SERVER_WORKER_HOST_PROBE_H_
