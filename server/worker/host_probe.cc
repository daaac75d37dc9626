#include "server/worker/host_probe.h"

#include <unistd.h>

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

}  // namespace pipetrain::worker
