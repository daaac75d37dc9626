// MetricsServer: serves a MetricsRegistry as /metrics over HTTP (prometheus-cpp's Exposer, a
// civetweb server with its own threads), for `--metrics-listen HOST:PORT` on both daemons.
#ifndef PIPETRAIN_SERVER_METRICS_METRICS_SERVER_H_
#define PIPETRAIN_SERVER_METRICS_METRICS_SERVER_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "server/metrics/metrics_registry.h"

namespace prometheus {
class Exposer;
}  // namespace prometheus

namespace pipetrain::metrics {

class MetricsServer {
 public:
  // Serves `registry` at http://`listen`/metrics ("HOST:PORT"; port 0 picks a free one; an IPv6
  // host in brackets). INVALID_ARGUMENT for an address without a port; UNAVAILABLE naming the
  // address if it cannot listen there. The registry must outlive the server.
  static absl::StatusOr<std::unique_ptr<MetricsServer>> Start(const std::string& listen,
                                                              const MetricsRegistry& registry);
  // The daemons' --metrics-listen: null (and no server) for an empty `listen`; else Start, and
  // logs "serving /metrics on HOST:PORT" as `source` (logging::Log).
  static absl::StatusOr<std::unique_ptr<MetricsServer>> ServeIfRequested(
      const std::string& listen, const MetricsRegistry& registry, const std::string& source);
  ~MetricsServer();
  MetricsServer(const MetricsServer&) = delete;
  MetricsServer& operator=(const MetricsServer&) = delete;

  // "HOST:PORT" with the port actually bound.
  const std::string& address() const { return address_; }

 private:
  MetricsServer(std::unique_ptr<prometheus::Exposer> exposer, std::string address);
  std::unique_ptr<prometheus::Exposer> exposer_;
  const std::string address_;
};

}  // namespace pipetrain::metrics

#endif  // PIPETRAIN_SERVER_METRICS_METRICS_SERVER_H_
