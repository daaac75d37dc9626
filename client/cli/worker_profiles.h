// The coordinator's idle workers' own measurements of a model's layers, for `pipetrain plan
// --coordinator` (docs/scaling.md, "Where the figures come from"): one ProfileWorkers call for
// every micro-batch size the planner tries, turned into PlannerOptions::measured.
#ifndef PIPETRAIN_CLIENT_CLI_WORKER_PROFILES_H_
#define PIPETRAIN_CLIENT_CLI_WORKER_PROFILES_H_

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "client/sdk/client.h"
#include "common/math/optimizer.h"
#include "common/plan/layer_costs.h"
#include "common/plan/planner.h"
#include "pipetrain/v1/coordinator.pb.h"

namespace pipetrain::cli {

// What the workers measured, by worker in the planner's order.
struct WorkerProfiles {
  // [w]: workers[w]'s per-layer seconds by micro-batch samples; empty map: not profiled.
  std::vector<std::map<int64_t, plan::ModelCosts>> measured;
  // One line per worker without measurements, or for the whole call: why ("w1: UNAVAILABLE:
  // ..."); empty when every worker was profiled.
  std::vector<std::string> notes;
};

// The request for `model` (resolved) at every micro-batch size of `by_m`, `threads` compute
// threads, `optimizer`, instruction-set level `isa` (empty: the coordinator's choice). Pure.
v1::ProfileWorkersRequest ProfileRequestFor(const v1::ModelSpec& model,
                                            const std::map<int, plan::ModelCosts>& by_m,
                                            int threads, const math::OptimizerConfig& optimizer,
                                            const std::string& isa);

// `response` as PlannerOptions::measured for `workers` (matched by name), each worker's figures
// checked (plan::LayerSecondsFromProto at its GFLOP/s for `layers` layers); a worker with an
// error, bad figures or no entry gets a note instead. Pure.
WorkerProfiles ProfilesFromResponse(const v1::ProfileWorkersResponse& response,
                                    const std::vector<plan::WorkerResources>& workers,
                                    int64_t layers);

// Asks the coordinator (ProfileWorkersRequest from ProfileRequestFor) and converts the answer. A
// failed call is no error: every worker is then unprofiled and the note says why (e.g.
// UNIMPLEMENTED from a coordinator older than ProfileWorkers). Blocks up to the call's deadline.
WorkerProfiles MeasureOnWorkers(client::Client& client, const v1::ProfileWorkersRequest& request,
                                const std::vector<plan::WorkerResources>& workers, int64_t layers);

}  // namespace pipetrain::cli

#endif  // PIPETRAIN_CLIENT_CLI_WORKER_PROFILES_H_
