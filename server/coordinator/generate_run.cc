#include "server/coordinator/generate_run.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/model/generator.h"
#include "common/util/annotate.h"
#include "common/util/status_macros.h"
#include "common/wire/eval_key.h"
#include "pipetrain/v1/worker_control.pb.h"
#include "server/coordinator/eval_run.h"

namespace pipetrain::coordinator {

absl::Status CheckGenerateRequest(const v1::GenerateRequest& request, const model::Model& net) {
  if (absl::Status lm = model::CheckLanguageModel(net); !lm.ok()) {
    return absl::FailedPreconditionError(absl::StrCat("Generate: ", lm.message()));
  }
  const int64_t vocab = net.spec().layers(0).embedding().vocab_size();
  if (request.prompts_size() == 0) {
    return absl::InvalidArgumentError("Generate: no prompt (at least one is needed)");
  }
  if (request.prompts_size() > kMaxGeneratePrompts) {
    return absl::ResourceExhaustedError(absl::StrCat("Generate: ", request.prompts_size(),
                                                     " prompts, more than the ",
                                                     kMaxGeneratePrompts, " one request may hold"));
  }
  const int64_t logit_bytes = int64_t{request.prompts_size()} * vocab * 4;
  if (logit_bytes > kMaxGenerateLogitBytes) {
    return absl::ResourceExhaustedError(
        absl::StrCat("Generate: ", request.prompts_size(), " prompts of a vocabulary of ", vocab,
                     " make ", logit_bytes, " bytes of logits per token, more than the ",
                     kMaxGenerateLogitBytes, " a decode round may return: send at most ",
                     kMaxGenerateLogitBytes / (vocab * 4), " prompts per request"));
  }
  for (int p = 0; p < request.prompts_size(); ++p) {
    const auto& tokens = request.prompts(p).tokens();
    if (tokens.empty())
      return absl::InvalidArgumentError(absl::StrCat("Generate: prompt ", p, " is empty"));
    if (tokens.size() > kMaxGeneratePromptTokens) {
      return absl::ResourceExhaustedError(absl::StrCat("Generate: prompt ", p, " has ",
                                                       tokens.size(), " tokens, more than ",
                                                       kMaxGeneratePromptTokens));
    }
    for (int i = 0; i < tokens.size(); ++i) {
      if (tokens[i] < 0 || tokens[i] >= vocab) {
        return absl::InvalidArgumentError(absl::StrCat("Generate: prompt ", p, " token ", i, " is ",
                                                       tokens[i], ", outside the vocabulary [0, ",
                                                       vocab, ")"));
      }
    }
  }
  if (request.max_tokens() < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("Generate: max_tokens must be >= 1, got ", request.max_tokens()));
  }
  if (request.max_tokens() > kMaxGenerateRounds) {
    return absl::ResourceExhaustedError(absl::StrCat("Generate: max_tokens ", request.max_tokens(),
                                                     " is more than the ", kMaxGenerateRounds,
                                                     " one request may generate"));
  }
  const model::SamplingOptions sampling{request.temperature(), request.top_k(), request.seed()};
  return util::Annotate(model::CheckSamplingOptions(sampling), "Generate");
}

absl::StatusOr<v1::GenerateResult> CoordinatorCore::Generate(
    const v1::GenerateRequest& request, const std::function<bool()>& cancelled) {
  GenerateRun run(*this, request, cancelled);
  return run.Run();
}

absl::StatusOr<v1::GenerateResult> GenerateRun::Run() {
  PT_RETURN_IF_ERROR(Admit());
  const int64_t rounds = request_.max_tokens();
  for (int64_t round = 0; round < rounds; ++round) {
    const absl::Status feed = Feed();
    absl::MutexLock lock(&core_.mu_);
    job_->mu.AssertHeld();
    PT_RETURN_IF_ERROR(Start(feed, round == 0, round + 1 == rounds));  // ended the run if failed.
    if (absl::Status waited = Await(); !waited.ok()) {
      return core_.FailForwardRun(*job_, step_, waited);
    }
    PT_RETURN_IF_ERROR(Sample(round + 1 == rounds));
    if (round + 1 == rounds) break;
    if (cancelled_ && cancelled_()) {
      // The caches are open on the workers: Abort of the last round frees them.
      return core_.FailForwardRun(*job_, step_,
                                  absl::CancelledError("Generate cancelled by the client"));
    }
    NextRound();
  }
  absl::MutexLock lock(&core_.mu_);
  job_->mu.AssertHeld();
  result_.set_step(job_->steps_done);
  result_.set_rounds(rounds);
  result_.set_generate_ms(absl::ToDoubleMilliseconds(absl::Now() - start_));
  job_->state = JobState::kReady;
  job_->op.step = -1;
  job_->op.gens.clear();
  core_.Log(absl::StrFormat("job %s step %d generated: %d prompts x %d tokens, %.3f ms", job_->id,
                            result_.step(), request_.prompts_size(), rounds,
                            result_.generate_ms()));
  return std::move(result_);
}

absl::Status GenerateRun::Admit() {
  std::shared_ptr<const model::Model> net;
  {
    absl::MutexLock lock(&core_.mu_);
    if (core_.shutting_down_) return absl::CancelledError("coordinator shutting down");
    PT_ASSIGN_OR_RETURN(job_, core_.ReadyJob(request_.job()));
    job_->mu.AssertHeld();
    net = job_->model;
  }
  // The request is checked before any worker hears of it (no lock: pure compute).
  PT_RETURN_IF_ERROR(CheckGenerateRequest(request_, *net));
  vocab_ = net->spec().layers(0).embedding().vocab_size();
  const model::SamplingOptions sampling{request_.temperature(), request_.top_k(), request_.seed()};
  for (const v1::GeneratePrompt& prompt : request_.prompts()) {
    windows_.emplace_back(net->tokens_per_sample(), vocab_);
    PT_ASSIGN_OR_RETURN(model::DecodeRun run, windows_.back().Start(prompt.tokens()));
    runs_.push_back(run);
    samplers_.emplace_back(sampling);
    result_.add_sequences();
  }
  absl::MutexLock lock(&core_.mu_);
  job_->mu.AssertHeld();
  return AdmitJob();
}

absl::Status GenerateRun::AdmitJob() {
  PT_RETURN_IF_ERROR(CheckReady(*job_));
  PT_RETURN_IF_ERROR(CheckClaimCurrent(*job_));
  core_.RestartLease(*job_);  // a client's call for the job, as a Checkpoint is.
  // Every run a rank was sent is answered (an aborted step's answer may trail its failure), so
  // that the answer counted next is this request's.
  if (!job_->op.UnansweredRanks().empty()) {
    job_->op.error = absl::OkStatus();
    PT_RETURN_IF_ERROR(core_.AwaitOp(
        *job_,
        [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(job_->mu) {
          return job_->state != JobState::kReady || job_->op.UnansweredRanks().empty();
        },
        Deadline(), "the answers to an aborted step"));
    PT_RETURN_IF_ERROR(CheckReady(*job_));
  }
  // The weights generated from are those of the last step on every rank.
  PT_RETURN_IF_ERROR(core_.ConfirmCommit(*job_));
  // Replica 0 runs it (every replica holds the same weights), in its own share's numbering.
  per_step_ = std::max(1, job::MicrobatchesPerReplica(job_->spec));
  generation_ = job_->generation;
  request_id_ = job_->eval_runs + 1;
  job_->state = JobState::kTraining;
  feed_ = core_.FeedTargets(*job_);
  NextRound();
  return absl::OkStatus();
}

void GenerateRun::NextRound() {
  step_ = kEvalStepBase + job_->eval_runs;
  job_->eval_runs += wire::EvalSteps(static_cast<int64_t>(runs_.size()), per_step_);
  job_->op.step = step_;
  job_->op.error = absl::OkStatus();
  job_->op.gens.assign(ShapeOf(job_->spec).stages, std::nullopt);
}

absl::Status GenerateRun::Feed() {
  // The job's links are its thread's: no lock.
  PT_RETURN_IF_ERROR(core_.EnsureFeedLinks(job_, feed_.first, feed_.second));
  for (size_t p = 0; p < runs_.size(); ++p) {
    const absl::Span<const int64_t> tokens = windows_[p].RunTokens(runs_[p]);
    auto x = std::make_shared<math::Matrix>(static_cast<int64_t>(tokens.size()), 1);
    for (size_t i = 0; i < tokens.size(); ++i) {
      (*x)(static_cast<int64_t>(i), 0) = static_cast<float>(tokens[i]);
    }
    const wire::TensorKey key =
        wire::EvalKey(step_, static_cast<int64_t>(p), per_step_, 0, wire::TensorKind::kInput);
    const absl::Status sent = job_->links[feed_.first.rank]->Send(key, std::move(x));
    if (!sent.ok()) {
      return util::Annotate(sent, absl::StrCat("data link to rank ", feed_.first.rank));
    }
  }
  return absl::OkStatus();
}

absl::Status GenerateRun::Start(const absl::Status& feed, bool open, bool close) {
  // GenRun follows even when the feed failed, as RunStep does: the round is then aborted on
  // every rank, which drops what reached it. Not after a recovery began meanwhile.
  const bool run_sent = job_->state == JobState::kTraining && job_->generation == generation_;
  if (run_sent) {
    v1::WorkerCommand command;
    v1::GenRun* run = command.mutable_gen_run();
    run->set_job(job_->id);
    run->set_generation(generation_);
    run->set_step(step_);
    run->set_request(request_id_);
    run->set_sequences(static_cast<int64_t>(runs_.size()));
    run->set_open(open);
    run->set_close(close);
    for (size_t p = 0; p < runs_.size(); ++p) {
      v1::DecodeMicrobatch* mb = run->add_runs();
      mb->set_sequence(static_cast<int64_t>(p));
      mb->set_position(runs_[p].position);
      mb->set_restart(runs_[p].restart);
      mb->set_rows(static_cast<int64_t>(windows_[p].RunTokens(runs_[p]).size()));
    }
    for (int rank = 0; rank < ShapeOf(job_->spec).stages; ++rank) {
      core_.SendToRank(*job_, rank, command);
      ++job_->op.runs_sent[rank];
    }
  }
  if (!feed.ok()) {
    return core_.FailForwardRun(*job_, step_, util::Annotate(feed, "feeding a decode round"));
  }
  if (!run_sent) {
    const absl::Status why = CheckReady(*job_);
    return core_.FailForwardRun(*job_, step_,
                                why.ok()
                                    ? absl::AbortedError(absl::StrCat(
                                          "the generation of job '", job_->id, "' was interrupted"))
                                    : why);
  }
  return absl::OkStatus();
}

absl::Status GenerateRun::Await() {
  auto answered = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(job_->mu) {
    for (const auto& g : job_->op.gens) {
      if (!g.has_value()) return false;
    }
    return true;
  };
  absl::Status waited = core_.AwaitOp(*job_, answered, Deadline(), "GenDone of a decode round");
  if (!absl::IsDeadlineExceeded(waited)) return waited;
  std::vector<int> missing;
  for (int rank = 0; rank < static_cast<int>(job_->op.gens.size()); ++rank) {
    if (!job_->op.gens[rank].has_value()) missing.push_back(rank);
  }
  return absl::DeadlineExceededError(
      absl::StrCat(waited.message(), " from ", CoordinatorCore::RankLabels(*job_, missing)));
}

absl::Status GenerateRun::Sample(bool last_round) {
  const int last_rank = feed_.second.rank;
  const v1::GenDone& done = *job_->op.gens[last_rank];
  const int64_t prompts = static_cast<int64_t>(runs_.size());
  if (done.vocab() != vocab_ || done.logits_size() != prompts * vocab_) {
    return core_.FailForwardRun(
        *job_, step_,
        absl::InternalError(absl::StrCat(
            WorkerLabel(job_->workers[last_rank], last_rank), " reported ", done.logits_size(),
            " logits of vocab ", done.vocab(), " for ", prompts, " prompts of vocab ", vocab_)));
  }
  for (int64_t p = 0; p < prompts; ++p) {
    const absl::Span<const float> logits =
        absl::MakeConstSpan(done.logits().data() + p * vocab_, static_cast<size_t>(vocab_));
    if (!std::all_of(logits.begin(), logits.end(), [](float v) { return std::isfinite(v); })) {
      return core_.FailForwardRun(
          *job_, step_,
          absl::FailedPreconditionError(absl::StrCat(
              "Generate: the model's logits for prompt ", p,
              " are not finite (the job's weights diverged?): no token can be sampled")));
    }
    const int64_t token = samplers_[p].Next(logits);
    result_.mutable_sequences(static_cast<int>(p))->add_tokens(token);
    if (last_round) continue;
    absl::StatusOr<model::DecodeRun> run = windows_[p].Append(token);
    if (!run.ok()) return core_.FailForwardRun(*job_, step_, run.status());
    runs_[p] = *run;
  }
  return absl::OkStatus();
}

absl::Duration GenerateRun::Deadline() const {
  int64_t rows = 0;
  for (size_t p = 0; p < runs_.size(); ++p) {
    rows += static_cast<int64_t>(windows_[p].RunTokens(runs_[p]).size());
  }
  double flops = 0;
  for (int64_t l = 0; l < job_->model->num_layers(); ++l) {
    flops += job_->model->layer(l).Flops(std::max<int64_t>(rows, 1)).forward;
  }
  return core_.ForwardRunDeadline(*job_, flops);
}

}  // namespace pipetrain::coordinator
