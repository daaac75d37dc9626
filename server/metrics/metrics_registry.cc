#include "server/metrics/metrics_registry.h"

#include <prometheus/gauge.h>
#include <prometheus/text_serializer.h>

#include <cstdlib>
#include <sstream>
#include <utility>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "common/util/build_info.h"
#include "server/metrics/process_metrics.h"

namespace pipetrain::metrics {

namespace {

// A registry's families followed by the process metrics.
class DaemonCollectable : public prometheus::Collectable {
 public:
  explicit DaemonCollectable(std::shared_ptr<prometheus::Registry> registry)
      : registry_(std::move(registry)) {}

  std::vector<prometheus::MetricFamily> Collect() const override {
    std::vector<prometheus::MetricFamily> families = registry_->Collect();
    for (prometheus::MetricFamily& f : process_.Collect()) families.push_back(std::move(f));
    return families;
  }

 private:
  const std::shared_ptr<prometheus::Registry> registry_;
  const ProcessCollector process_;
};

}  // namespace

std::string BuildVersion() { return std::string(util::ProjectVersion()); }

std::string BuildCommit() {
  const absl::string_view commit = util::GitCommit();
  return commit.empty() ? "unknown" : std::string(commit);
}

MetricsRegistry::MetricsRegistry(const std::string& daemon)
    : registry_(std::make_shared<prometheus::Registry>()),
      collectable_(std::make_shared<DaemonCollectable>(registry_)) {
  prometheus::BuildGauge()
      .Name("pipetrain_build_info")
      .Help("Always 1; the labels say which daemon, version and git commit this is")
      .Register(*registry_)
      .Add({{"daemon", daemon}, {"version", BuildVersion()}, {"commit", BuildCommit()}})
      .Set(1);
}

std::string MetricsRegistry::TextExposition() const {
  return prometheus::TextSerializer().Serialize(collectable_->Collect());
}

std::optional<double> SampleValue(const std::string& exposition, const std::string& name,
                                  const std::map<std::string, std::string>& labels) {
  for (absl::string_view line : absl::StrSplit(exposition, '\n')) {
    if (line.empty() || line[0] == '#') continue;
    const size_t space = line.rfind(' ');
    if (space == absl::string_view::npos) continue;
    absl::string_view series = line.substr(0, space);
    absl::string_view value = line.substr(space + 1);
    absl::string_view label_text;
    const size_t brace = series.find('{');
    if (brace != absl::string_view::npos) {
      label_text = series.substr(brace + 1);
      series = series.substr(0, brace);
      if (!absl::ConsumeSuffix(&label_text, "}")) continue;
    }
    if (series != name) continue;
    std::map<std::string, std::string> found;
    for (absl::string_view pair : absl::StrSplit(label_text, ',', absl::SkipEmpty())) {
      const size_t eq = pair.find('=');
      if (eq == absl::string_view::npos) continue;
      absl::string_view v = pair.substr(eq + 1);
      absl::ConsumePrefix(&v, "\"");
      absl::ConsumeSuffix(&v, "\"");
      found[std::string(pair.substr(0, eq))] = std::string(v);
    }
    if (found != labels) continue;
    double d = 0;
    if (value == "+Inf") return HUGE_VAL;
    if (absl::SimpleAtod(value, &d)) return d;
  }
  return std::nullopt;
}

}  // namespace pipetrain::metrics
