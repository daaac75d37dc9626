#include "client/cli/worker_profiles.h"

#include "absl/strings/str_cat.h"
#include "common/model/optimizer_proto.h"
#include "common/plan/layer_costs_proto.h"

namespace pipetrain::cli {

v1::ProfileWorkersRequest ProfileRequestFor(const v1::ModelSpec& model,
                                            const std::map<int, plan::ModelCosts>& by_m,
                                            int threads, const math::OptimizerConfig& optimizer,
                                            const std::string& isa) {
  v1::ProfileWorkersRequest request;
  *request.mutable_model() = model;
  for (const auto& [m, costs] : by_m) request.add_samples(costs.samples);
  request.set_threads(threads);
  *request.mutable_optimizer() = model::OptimizerToProto(optimizer);
  request.set_isa(isa);
  return request;
}

WorkerProfiles ProfilesFromResponse(const v1::ProfileWorkersResponse& response,
                                    const std::vector<plan::WorkerResources>& workers,
                                    int64_t layers) {
  WorkerProfiles out;
  out.measured.resize(workers.size());
  for (size_t w = 0; w < workers.size(); ++w) {
    const v1::WorkerLayerProfile* entry = nullptr;
    for (const v1::WorkerLayerProfile& e : response.workers()) {
      if (e.name() == workers[w].name) entry = &e;
    }
    const std::string& name = workers[w].name;
    if (entry == nullptr) {
      out.notes.push_back(absl::StrCat(name, ": not profiled (it was not idle when asked)"));
      continue;
    }
    if (entry->code() != 0) {
      out.notes.push_back(absl::StrCat(
          name, ": ", absl::StatusCodeToString(static_cast<absl::StatusCode>(entry->code())), ": ",
          entry->message()));
      continue;
    }
    std::map<int64_t, plan::ModelCosts> measured;
    for (const v1::SampleLayerCosts& c : entry->costs()) {
      absl::StatusOr<plan::ModelCosts> costs = plan::LayerSecondsFromProto(
          c, layers, entry->gflops(), absl::StrCat("worker '", name, "'"));
      if (!costs.ok()) {
        out.notes.push_back(absl::StrCat(name, ": ", costs.status().message()));
        measured.clear();
        break;
      }
      measured[costs->samples] = *std::move(costs);
    }
    out.measured[w] = std::move(measured);
  }
  return out;
}

WorkerProfiles MeasureOnWorkers(client::Client& client, const v1::ProfileWorkersRequest& request,
                                const std::vector<plan::WorkerResources>& workers, int64_t layers) {
  absl::StatusOr<v1::ProfileWorkersResponse> response = client.ProfileWorkers(request);
  if (!response.ok()) {
    WorkerProfiles none;
    none.measured.resize(workers.size());
    none.notes.push_back(absl::StrCat("no worker profiled: ", response.status().ToString()));
    return none;
  }
  return ProfilesFromResponse(*response, workers, layers);
}

}  // namespace pipetrain::cli
