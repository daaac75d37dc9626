// Moving a worker's state to and from the coordinator, which keeps the checkpoints (no file
// system is shared with the workers): FetchState loads a job's starting state (Assign.restore),
// PutState uploads the layer files of a checkpoint (SaveShards).
#ifndef PIPETRAIN_SERVER_WORKER_STATE_TRANSFER_H_
#define PIPETRAIN_SERVER_WORKER_STATE_TRANSFER_H_

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/math/tensor.h"
#include "common/model/checkpoint.h"
#include "pipetrain/v1/worker_control.grpc.pb.h"

namespace pipetrain::worker {

struct StateRequest {
  std::string job;
  int64_t generation = 0;
  std::string worker;  // this worker's registered name.
  int64_t step = 0;    // the checkpoint's step (Assign.restore_step).
  // The layer ranges [first, last) of this worker's chunks: every file must lie within one.
  std::vector<std::pair<int64_t, int64_t>> layer_ranges;
  absl::Duration timeout = absl::Minutes(5);
};

// Every tensor of the files the coordinator sends for `request`, keyed by global name. Each file
// is checked as a checkpoint load checks it (model::ParseCheckpointShard: size, SHA-256, step
// metadata, finite values); chunks must arrive in order and within the file's announced size.
// Errors: the coordinator's status (e.g. ABORTED for a stale generation), DATA_LOSS naming the
// file, INVALID_ARGUMENT for a file outside this worker's layers or a tensor sent twice,
// DEADLINE_EXCEEDED after `timeout`. Blocks; thread-safe.
absl::StatusOr<std::map<std::string, math::Tensor>> FetchState(v1::WorkerControl::Stub* stub,
                                                               const StateRequest& request);

// What PutState uploads: the files of `shards` (this worker's layers) serialized from `tensors`
// with `step` in their metadata, exactly as a checkpoint written to disk.
struct StateUpload {
  std::string job;
  int64_t generation = 0;
  int64_t step = 0;
  std::string worker;  // this worker's registered name.
  std::vector<model::CheckpointShard> shards;
  absl::Duration timeout = absl::Minutes(10);
};

// Streams the files to WorkerControl.PutState in chunks of at most 1 MiB, one file serialized at a
// time (memory: the largest file). `context` is the call's (the caller may TryCancel it from
// another thread to stop the upload). Returns the shards with sha256 and bytes filled, or the
// coordinator's status (e.g. FAILED_PRECONDITION when that checkpoint is no longer in progress),
// or SerializeCheckpointShard's error. Blocks; thread-safe.
absl::StatusOr<std::vector<model::CheckpointShard>> PutState(
    v1::WorkerControl::Stub* stub, grpc::ClientContext* context, const StateUpload& upload,
    const std::map<std::string, math::Tensor>& tensors);

}  // namespace pipetrain::worker

#endif  // PIPETRAIN_SERVER_WORKER_STATE_TRANSFER_H_
