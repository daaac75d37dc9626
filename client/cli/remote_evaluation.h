// Held-out evaluation of a job's live weights through the coordinator (the Evaluate RPC), for
// `pipetrain train` and `local` (--eval-every, --eval-samples): the client sends the held-out
// samples of its own data set, so the coordinator needs no file system in common with it.
#ifndef PIPETRAIN_CLIENT_CLI_REMOTE_EVALUATION_H_
#define PIPETRAIN_CLIENT_CLI_REMOTE_EVALUATION_H_

#include <cstdint>

#include "absl/status/statusor.h"
#include "client/cli/training_setup.h"
#include "client/sdk/client.h"
#include "common/model/reference_trainer.h"

namespace pipetrain::cli {

// Largest Evaluate request this client sends (bytes of inputs and targets); more samples go in
// further requests, each holding whole evaluation chunks.
inline constexpr int64_t kMaxEvaluateRequestBytes = int64_t{16} << 20;

// Evaluates the first `eval_samples` (0: all) held-out samples of `setup.data` on the job of
// `session` between two steps, in evaluation chunks of model::EvalChunkSamples(256) samples as
// `pipetrain evaluate` takes them, the chunks' loss sums folded in order: the same figures,
// bitwise, as `pipetrain evaluate` on a checkpoint of the job's weights at this step. Errors:
// INVALID_ARGUMENT for eval_samples < 0 or no held-out sample; TrainSession::Evaluate's;
// INTERNAL if the coordinator answers with other chunks than it was sent.
absl::StatusOr<model::EvalResult> EvaluateThroughCoordinator(client::TrainSession& session,
                                                             const TrainingSetup& setup,
                                                             int64_t eval_samples);

}  // namespace pipetrain::cli

#endif  // PIPETRAIN_CLIENT_CLI_REMOTE_EVALUATION_H_
