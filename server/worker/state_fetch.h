// Fetching a job's starting state from the coordinator (Assign.restore): the checkpoint files of
// this worker's chunks, streamed by Coordinator.FetchState and verified here end to end.
#ifndef PIPETRAIN_SERVER_WORKER_STATE_FETCH_H_
#define PIPETRAIN_SERVER_WORKER_STATE_FETCH_H_

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/math/tensor.h"
#include "pipetrain/v1/coordinator.grpc.pb.h"

namespace pipetrain::worker {

struct StateRequest {
  std::string job;
  int64_t epoch = 0;
  std::string worker;  // this worker's registered name.
  int64_t step = 0;    // the checkpoint's step (Assign.restore_step).
  // The layer ranges [first, last) of this worker's chunks: every file must lie within one.
  std::vector<std::pair<int64_t, int64_t>> layer_ranges;
  absl::Duration timeout = absl::Minutes(5);
};

// Every tensor of the files the coordinator sends for `request`, keyed by global name. Each file
// is checked as a checkpoint load checks it (model::ParseCheckpointShard: size, SHA-256, step
// metadata, finite values); chunks must arrive in order and within the file's announced size.
// Errors: the coordinator's status (e.g. ABORTED for a stale epoch), DATA_LOSS naming the file,
// INVALID_ARGUMENT for a file outside this worker's layers or a tensor sent twice,
// DEADLINE_EXCEEDED after `timeout`. Blocks; thread-safe.
absl::StatusOr<std::map<std::string, math::Tensor>> FetchState(v1::Coordinator::Stub* stub,
                                                               const StateRequest& request);

}  // namespace pipetrain::worker

#endif  // PIPETRAIN_SERVER_WORKER_STATE_FETCH_H_
