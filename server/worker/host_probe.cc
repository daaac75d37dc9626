#include "server/worker/host_probe.h"

#include <unistd.h>

#include <Eigen/Core>
#include <algorithm>
#include <chrono>

#include "absl/strings/numbers.h"

namespace pipetrain::worker {

std::string HostName() {
  char buf[256] = {};
  if (gethostname(buf, sizeof(buf) - 1) != 0 || buf[0] == '\0') return "localhost";
  return buf;
}

int64_t PhysicalMemoryBytes() {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page_size = sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page_size <= 0) return 0;
  return static_cast<int64_t>(pages) * static_cast<int64_t>(page_size);
}

// Splits "host:port" (host may be "[v6]"); false if there is no port.
bool SplitHostPort(const std::string& address, std::string* host, std::string* port) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos || colon + 1 == address.size()) return false;
  *host = address.substr(0, colon);
  *port = address.substr(colon + 1);
  int value = 0;
  return absl::SimpleAtoi(*port, &value) && value >= 0 && value <= 65535;
}

double MeasureGflops(absl::Duration duration) {
  constexpr int kN = 256;
  Eigen::MatrixXf a = Eigen::MatrixXf::Constant(kN, kN, 0.5f);
  Eigen::MatrixXf b = Eigen::MatrixXf::Constant(kN, kN, 0.25f);
  Eigen::MatrixXf c(kN, kN);
  // One compute thread: the rate per thread, whatever Eigen's (process-wide) setting is.
  const int threads = Eigen::nbThreads();
  Eigen::setNbThreads(1);
  const auto t0 = std::chrono::steady_clock::now();
  const auto until = t0 + absl::ToChronoNanoseconds(duration);
  int64_t products = 0;
  auto now = t0;
  do {
    c.noalias() = a * b;
    a(0, 0) = c(kN - 1, kN - 1) * 1e-9f;  // keep the products observable.
    ++products;
    now = std::chrono::steady_clock::now();
  } while (now < until);
  Eigen::setNbThreads(threads);
  const double seconds = std::chrono::duration<double>(now - t0).count();
  const double flops = 2.0 * kN * kN * kN * static_cast<double>(products);
  return std::max(1e-3, flops / std::max(seconds, 1e-9) / 1e9);
}

}  // namespace pipetrain::worker
