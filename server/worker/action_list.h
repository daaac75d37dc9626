// The checks of a stage worker's action list on its own, before any compute: the contract
// StepExecutor::RunStep documents (executor.h), which makes a pipeline of executors bitwise equal
// to the reference trainer.
#ifndef PIPETRAIN_SERVER_WORKER_ACTION_LIST_H_
#define PIPETRAIN_SERVER_WORKER_ACTION_LIST_H_

#include <cstddef>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/schedule/ir.h"
#include "server/worker/chunk_routes.h"

namespace pipetrain::worker {

// Checks `actions` of a worker whose chunks are given by `local_of_chunk` ([global chunk] ->
// index among the chunks the worker holds, increasing with the global index; -1 where not held)
// and returns M, the number of micro-batches they cover (1 + the largest). Every action must be
// on a chunk held here; every micro-batch in [0, M) needs, per chunk, one F and either one B or
// one I and one W, F before I before W; per chunk, weight gradients (B or W) must accumulate in
// increasing micro-batch order. A violation is INVALID_ARGUMENT naming the position and the
// action (ActionAt), or the (micro-batch, chunk) that lacks an action. With `routes` (null: one
// copy of the model) only the (micro-batch, chunk) pairs on the micro-batch's route
// (ChunkRoutes::OnRoute) need and may have actions, and with two copies M must be even.
// Thread-safe.
absl::StatusOr<int> CheckActionList(const std::vector<schedule::Action>& actions,
                                    const std::vector<int>& local_of_chunk,
                                    const ChunkRoutes* routes = nullptr);

// "position P F(mb=M, chunk=C)": how errors name the action at `position` of an action list.
std::string ActionAt(size_t position, const schedule::Action& action);

}  // namespace pipetrain::worker

#endif  // PIPETRAIN_SERVER_WORKER_ACTION_LIST_H_
