#include "server/metrics/metrics_server.h"

#include <prometheus/exposer.h>

#include <exception>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "server/logging/daemon_log.h"

namespace pipetrain::metrics {

MetricsServer::MetricsServer(std::unique_ptr<prometheus::Exposer> exposer, std::string address)
    : exposer_(std::move(exposer)), address_(std::move(address)) {}

MetricsServer::~MetricsServer() = default;

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::Start(
    const std::string& listen, const MetricsRegistry& registry) {
  const size_t colon = listen.rfind(':');
  if (colon == std::string::npos || colon == 0 || colon + 1 == listen.size() ||
      listen.find_first_not_of("0123456789", colon + 1) != std::string::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("--metrics-listen '", listen, "': expected HOST:PORT"));
  }
  std::unique_ptr<prometheus::Exposer> exposer;
  try {
    // One server thread is plenty for a scrape every few seconds.
    exposer = std::make_unique<prometheus::Exposer>(listen, /*num_threads=*/1);
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat("cannot serve metrics on ", listen, ": ", e.what()));
  }
  exposer->RegisterCollectable(registry.collectable());
  const std::vector<int> ports = exposer->GetListeningPorts();
  if (ports.empty()) {
    return absl::UnavailableError(absl::StrCat("cannot serve metrics on ", listen));
  }
  return std::unique_ptr<MetricsServer>(new MetricsServer(
      std::move(exposer), absl::StrCat(listen.substr(0, colon), ":", ports.front())));
}

absl::StatusOr<std::unique_ptr<MetricsServer>> MetricsServer::ServeIfRequested(
    const std::string& listen, const MetricsRegistry& registry, const std::string& source) {
  if (listen.empty()) return nullptr;
  absl::StatusOr<std::unique_ptr<MetricsServer>> server = Start(listen, registry);
  if (server.ok()) {
    logging::Log(source, logging::LogLevel::kInfo,
                 absl::StrCat("serving /metrics on ", (*server)->address()));
  }
  return server;
}

}  // namespace pipetrain::metrics
