// GenerateRun: one Generate request (coordinator.proto) on a job's committed weights, run on the
// job's thread between two steps, as EvalRun runs an evaluation:
//
//   admit   the request is valid for the job's model (a language model; prompts, tokens and
//           sampling in range), the job READY with every run answered and its last Commit
//           confirmed; the job is TRAINING (an operation in flight).
//   rounds  max_tokens decode rounds. Each prompt has a model::DecodeWindow (which positions run)
//           and a model::TokenSampler seeded with the request's seed, exactly as
//           model::Generator::Generate has for one prompt. A round feeds every prompt's run (its
//           token ids) to the first chunk's owner as one micro-batch each under the round's own
//           mailbox steps (wire::EvalKey from kEvalStepBase + the job's evaluation steps so far),
//           sends GenRun to every rank (the first round opens the workers' KV caches, the last
//           closes them), awaits every GenDone, samples each prompt's next token from the last
//           chunk owner's logits and appends it to the prompt's window.
//
// A failure, or the client's cancellation between rounds, aborts the round on every rank (Abort
// names its step; the workers free the request's caches) and leaves the job READY, or
// RECOVERING when a worker was lost (as for a step). Nothing of the job changes otherwise.
#ifndef PIPETRAIN_SERVER_COORDINATOR_GENERATE_RUN_H_
#define PIPETRAIN_SERVER_COORDINATOR_GENERATE_RUN_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/model/decode_window.h"
#include "common/model/model.h"
#include "common/model/token_sampler.h"
#include "pipetrain/v1/coordinator.pb.h"
#include "server/coordinator/coordinator_core.h"

namespace pipetrain::coordinator {

// Most prompts one Generate request may hold (its micro-batches per round).
inline constexpr int64_t kMaxGeneratePrompts = 64;
// Most tokens one prompt may hold (beyond the context only its last context tokens are used).
inline constexpr int64_t kMaxGeneratePromptTokens = 65536;
// Most tokens one Generate request generates per prompt (its decode rounds).
inline constexpr int64_t kMaxGenerateRounds = 4096;
// Most bytes of logits one decode round's GenDone may carry (prompts x vocabulary x 4): far below
// the coordinator's --max-message-size default (512 MiB).
inline constexpr int64_t kMaxGenerateLogitBytes = int64_t{16} << 20;

// OK if `request` fits `net`: FAILED_PRECONDITION when `net` is not a language model
// (model::CheckLanguageModel's reason); INVALID_ARGUMENT for no prompt, an empty prompt, a token
// outside [0, vocab) (naming prompt and position), max_tokens < 1 or bad sampling options;
// RESOURCE_EXHAUSTED beyond kMaxGeneratePrompts, kMaxGeneratePromptTokens, kMaxGenerateRounds or
// kMaxGenerateLogitBytes.
absl::Status CheckGenerateRequest(const v1::GenerateRequest& request, const model::Model& net);

class GenerateRun {
 public:
  // `cancelled` (may be null) is asked between rounds.
  GenerateRun(CoordinatorCore& core, const v1::GenerateRequest& request,
              std::function<bool()> cancelled)
      : core_(core), request_(request), cancelled_(std::move(cancelled)) {}
  GenerateRun(const GenerateRun&) = delete;
  GenerateRun& operator=(const GenerateRun&) = delete;

  // Runs every phase; the tokens generated, or why it failed.
  absl::StatusOr<v1::GenerateResult> Run() ABSL_LOCKS_EXCLUDED(core_.mu_);

 private:
  // Admit: the request (without the lock), then the job; the prompts' windows started.
  absl::Status Admit() ABSL_LOCKS_EXCLUDED(core_.mu_);
  absl::Status AdmitJob() ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_.mu_, job_->mu);
  // The next round's mailbox steps and bookkeeping.
  void NextRound() ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_.mu_, job_->mu);
  // Feeds the round's token ids, without the lock; the feed's error.
  absl::Status Feed() ABSL_LOCKS_EXCLUDED(core_.mu_);
  // GenRun to every rank (unless the job left TRAINING meanwhile), then the feed's outcome.
  absl::Status Start(const absl::Status& feed, bool open, bool close)
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_.mu_, job_->mu);
  absl::Status Await() ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_.mu_, job_->mu);
  // Samples every prompt's next token from the last chunk owner's GenDone and, unless it was the
  // last round, appends it to the prompt's window.
  absl::Status Sample(bool last_round) ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_.mu_, job_->mu);
  // GenDone's deadline: max(step_deadline_floor, step_deadline_factor x the round's forward
  // FLOPs on the slowest rank's measured speed).
  absl::Duration Deadline() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(core_.mu_, job_->mu);

  CoordinatorCore& core_;
  const v1::GenerateRequest& request_;
  const std::function<bool()> cancelled_;
  const absl::Time start_ = absl::Now();
  Job* job_ = nullptr;  // set by Admit; lives while its thread runs this request.
  int64_t vocab_ = 0;
  int64_t request_id_ = 0;  // > 0, names the workers' caches.
  int64_t step_ = 0;        // the round's first mailbox step (>= kEvalStepBase).
  int per_step_ = 1;        // micro-batches per mailbox step: the job's M.
  int64_t generation_ = 0;  // the generation it runs in.
  std::pair<FeedTarget, FeedTarget> feed_;
  std::vector<model::DecodeWindow> windows_;   // [prompt]
  std::vector<model::DecodeRun> runs_;         // [prompt]: the round's run.
  std::vector<model::TokenSampler> samplers_;  // [prompt]
  v1::GenerateResult result_;
};

}  // namespace pipetrain::coordinator

#endif  // PIPETRAIN_SERVER_COORDINATOR_GENERATE_RUN_H_
