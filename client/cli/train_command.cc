#include "client/cli/train_command.h"

#include <algorithm>
#include <deque>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "client/cli/job_commands.h"
#include "client/cli/reference_command.h"
#include "client/cli/remote_evaluation.h"
#include "client/cli/shape_line.h"
#include "client/sdk/client.h"
#include "common/io/dataset.h"
#include "common/io/tokenizer.h"
#include "common/math/isa.h"
#include "common/math/optimizer.h"
#include "common/model/checkpoint.h"
#include "common/model/model.h"
#include "common/model/optimizer_proto.h"
#include "common/net/transport_security.h"
#include "common/schedule/generator.h"
#include "common/schedule/ir.h"
#include "common/util/status_macros.h"

namespace pipetrain::cli {

absl::Status CheckTrainCommandOptions(const TrainCommandOptions& o) {
  const TrainingOptions& t = o.training;
  PT_RETURN_IF_ERROR(CheckTrainingOptions(t));
  if (o.trace_steps.has_value() && o.trace_path.empty()) {
    return absl::InvalidArgumentError("--trace-steps needs --trace FILE (where the trace goes)");
  }
  if (o.stages < 1) {
    return absl::InvalidArgumentError(absl::StrCat("--stages must be >= 1, got ", o.stages));
  }
  if (o.replicas < 1) {
    return absl::InvalidArgumentError(absl::StrCat("--replicas must be >= 1, got ", o.replicas));
  }
  if (o.virtual_stages < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--virtual must be >= 0 (0: the schedule's default), got ", o.virtual_stages));
  }
  if (o.min_stages < 0 || o.min_stages > o.stages) {
    return absl::InvalidArgumentError(
        absl::StrCat("--min-stages must be in [0, --stages = ", o.stages, "], got ", o.min_stages));
  }
  if (o.max_stages != 0 && o.max_stages < o.stages) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--max-stages must be 0 (never grow) or >= --stages = ", o.stages, ", got ", o.max_stages));
  }
  if (o.max_replicas < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--max-replicas must be 0 (never grow) or >= 1, got ", o.max_replicas));
  }
  if (o.replace_timeout <= absl::ZeroDuration() || o.reconnect_timeout <= absl::ZeroDuration()) {
    return absl::InvalidArgumentError(
        absl::StrCat("--replace-timeout and --reconnect-timeout must be > 0, got ",
                     absl::FormatDuration(o.replace_timeout), " and ",
                     absl::FormatDuration(o.reconnect_timeout)));
  }
  PT_ASSIGN_OR_RETURN(schedule::ScheduleKind kind, schedule::ParseScheduleKind(o.schedule));
  return schedule::CheckExecutable(kind);
}

namespace {

absl::Status WriteTextFile(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f << text;
  f.close();
  if (!f) return absl::UnavailableError(absl::StrCat("cannot write ", path));
  return absl::OkStatus();
}

// Checkpoints the session's job into `dir` (absolute, on the coordinator's file system) through
// the coordinator (TrainSession::Checkpoint: through a recovery that interrupts it, and the kept
// batches trimmed): the workers write the layer files and the coordinator the manifest, with the
// data set, batch size and data cursor `cursor` this client gives it — exactly what `pipetrain
// reference --save` writes. Returns whether `dir` is visible here (false: the coordinator's file
// system is not ours).
absl::StatusOr<bool> SaveThroughCoordinator(client::TrainSession& session, const std::string& dir,
                                            const TrainingOptions& o, const io::DataCursor& cursor,
                                            std::ostream& out) {
  v1::DataPosition position;
  position.set_data(o.data);
  position.set_batch_size(o.batch);
  position.set_cursor_epoch(cursor.epoch);
  position.set_cursor_batch(cursor.batch);
  PT_ASSIGN_OR_RETURN(v1::CheckpointResponse saved,
                      session.Checkpoint(dir, o.keep_checkpoints, position));
  const bool visible = std::filesystem::exists(dir + "/" + model::kManifestName);
  if (!o.json) {
    out << "checkpoint of step " << saved.step() << " written to " << dir
        << (visible ? "" : " on the coordinator's host") << "\n";
    out.flush();
  }
  return visible;
}

// The line `pipetrain train` prints when its session starts waiting after `why` at `step`: what
// failed, and what it waits for.
std::string WaitingLine(const absl::Status& why, int64_t step, const std::string& job,
                        absl::Duration reconnect_timeout, bool json) {
  const bool unreachable = absl::IsUnavailable(why);
  if (json) {
    return absl::StrFormat(
        "{\"waiting\": {\"after_step\": %d, \"code\": \"%s\", \"for\": \"%s\"%s}}\n", step,
        absl::StatusCodeToString(why.code()), unreachable ? "coordinator" : "recovery",
        unreachable ? absl::StrFormat(", \"reconnect_timeout_s\": %.3f",
                                      absl::ToDoubleSeconds(reconnect_timeout))
                    : "");
  }
  if (unreachable) {
    return absl::StrFormat(
        "after step %d: %s; waiting up to %s for the coordinator to answer again "
        "(--reconnect-timeout), then for job %s to be ready\n",
        step, why.message(), absl::FormatDuration(reconnect_timeout), job);
  }
  return absl::StrFormat(
      "after step %d: %s; waiting for job %s to recover (a replacement worker, then a restart "
      "from its last checkpoint)\n",
      step, why.message(), job);
}

// `error`, the reason a run stops after its job was created: the job is cancelled now (so that
// its workers are free at once; best effort, within `timeout`); if the coordinator cannot be
// told, the error says that the job is left to its client lease.
absl::Status AbandonJob(client::ScopedJob& job, const absl::Status& error, absl::Duration timeout) {
  job.set_cancel_reason(absl::StrCat("the client stopped: ", error.message()));
  const absl::Status cancelled = job.Cancel(timeout);
  if (cancelled.ok()) return error;
  return absl::Status(
      error.code(), absl::StrCat(error.message(), "; job ", job.job(), " could not be cancelled (",
                                 cancelled.message(),
                                 "): the coordinator cancels it once it has had no client for its "
                                 "--client-lease, counted from when it runs again"));
}

// The command that saves a job's weights after its save into `dir` failed (`pipetrain
// checkpoint`), with the flags of this run that it needs.
std::string RetryCommand(const TrainCommandOptions& o, const std::string& job,
                         const std::string& dir) {
  std::string command =
      absl::StrCat("pipetrain checkpoint ", job, " --save ", dir, " --coordinator ", o.coordinator);
  if (o.training.keep_checkpoints != 2) {
    absl::StrAppend(&command, " --keep-checkpoints ", o.training.keep_checkpoints);
  }
  if (o.client.tls.enabled() || !o.client.token.empty()) {
    absl::StrAppend(&command, " (with this run's --tls-* and --token-file flags)");
  }
  return command;
}

// `failed` (the error of the job's save into `dir`) and what became of the job's weights: a job
// that has not ended keeps them (ScopedJob leaves a job whose checkpoint failed) and says how to
// save them; the Train stream is ended in order first, so that the job has no client left.
absl::Status SaveFailed(const absl::Status& failed, client::Client& client,
                        client::TrainSession& session, const TrainCommandOptions& o,
                        const std::string& job, const std::string& dir) {
  session.Finish().IgnoreError();  // the save's error says what went wrong.
  absl::StatusOr<v1::JobStatus> status = client.GetJob(job);
  if (!status.ok() || status->state() == v1::JOB_STATE_DONE ||
      status->state() == v1::JOB_STATE_FAILED || status->state() == v1::JOB_STATE_CANCELLED) {
    return failed;  // nothing is left to save.
  }
  const std::string what = absl::StrCat("saving step ", status->steps_done(), " into ", dir,
                                        " failed: ", failed.message());
  if (o.own_coordinator) {
    return absl::Status(failed.code(), absl::StrCat(what, "; the weights of job ", job,
                                                    " end with this run's coordinator"));
  }
  return absl::Status(
      failed.code(),
      absl::StrCat(what, "\njob ", job, " keeps the weights of its ", status->steps_done(),
                   " steps: save them with\n  ", RetryCommand(o, job, dir),
                   "\n(the job then ends), or free its workers with `pipetrain cancel ", job,
                   "`; the coordinator cancels it after its --client-lease (default 5m) with no "
                   "call naming it"));
}

// The JobSpec of a run: what CreateJob gets (the coordinator resolves nothing more: the model is
// resolved against the data set already), with the directories it saves into and resumes from
// (absolute, on the coordinator's host: the coordinator checks them before the job takes its
// workers).
absl::StatusOr<v1::JobSpec> JobSpecFor(const TrainCommandOptions& o, const PreparedTrain& p) {
  const TrainingOptions& t = o.training;
  v1::JobSpec spec;
  *spec.mutable_model() = p.setup.spec;
  *spec.mutable_optimizer() = model::OptimizerToProto(p.optimizer);
  spec.set_schedule(std::string(schedule::ScheduleKindName(p.kind)));
  spec.set_stages(o.stages);
  spec.set_replicas(o.replicas);
  spec.set_microbatches(static_cast<int32_t>(t.microbatches));
  spec.set_virtual_stages(o.virtual_stages);
  for (double c : o.layer_costs) spec.add_layer_costs(c);
  spec.set_seed(t.seed);
  spec.set_threads(t.threads);
  spec.set_recover(true);  // survive a lost worker: replace it, restart, replay (docs).
  spec.set_replace_timeout_ms(absl::ToInt64Milliseconds(o.replace_timeout));
  spec.set_min_stages(o.min_stages);
  spec.set_max_stages(o.max_stages);
  spec.set_max_replicas(o.max_replicas);
  spec.set_isa(t.isa);              // empty: the highest level every worker runs.
  spec.set_planned_steps(t.steps);  // the target of the job's progress and ETA.
  // The coordinator writes it into every checkpoint of the job.
  if (p.setup.tokenizer != nullptr) spec.set_tokenizer(p.setup.tokenizer->model());
  if (!p.save_dir.empty()) {
    spec.set_save_to(p.save_dir);
    spec.set_keep_checkpoints(t.keep_checkpoints);
  }
  if (!t.resume_dir.empty()) {
    std::error_code ec;
    spec.set_resume_from(std::filesystem::absolute(t.resume_dir, ec).string());
    if (ec) {
      return absl::InvalidArgumentError(
          absl::StrCat("--resume ", t.resume_dir, ": ", ec.message()));
    }
  }
  return spec;
}

// --save as an absolute path ("" without it): a directory on the coordinator's host, which
// checks it when it creates the job (JobSpec.save_to).
absl::StatusOr<std::string> SaveDirFor(const TrainingOptions& t) {
  if (t.save_dir.empty()) return std::string();
  std::error_code ec;
  std::string dir = std::filesystem::absolute(t.save_dir, ec).string();
  if (ec)
    return absl::InvalidArgumentError(absl::StrCat("--save ", t.save_dir, ": ", ec.message()));
  return dir;
}

// On a shared file system the --resume checkpoint is here too: its optimizer kind (which decides
// the state tensors) must be this run's. An unreadable manifest is the coordinator's to report,
// with the rest of its checks.
absl::Status CheckResumeHere(const TrainingOptions& t, const math::OptimizerConfig& optimizer) {
  if (t.resume_dir.empty()) return absl::OkStatus();
  absl::StatusOr<model::CheckpointManifest> resumed = model::ReadCheckpointManifest(t.resume_dir);
  if (!resumed.ok()) return absl::OkStatus();
  return model::CheckOptimizerResumes(t.resume_dir, *resumed, optimizer);
}

// The line a --json run prints for one step.
std::string JsonStepLine(const v1::StepResult& r) {
  return absl::StrFormat(
      "{\"step\": %d, \"loss\": %.9g, \"step_ms\": %.3f, \"bubble_fraction\": %.4f, "
      "\"predicted_bubble_fraction\": %.4f, \"link_latency_ms\": %s}\n",
      r.step(), r.loss(), r.step_ms(), r.bubble_fraction(), r.predicted_bubble_fraction(),
      r.has_link_latency_ms() ? absl::StrFormat("%.4f", r.link_latency_ms()) : "null");
}

// The line a run prints for a recovery (`failed_at`: the step the run was at when it began).
std::string RecoveryLine(const v1::RecoveryEvent& r, int64_t failed_at, bool json) {
  if (json) {
    const std::string also = r.also_lost().empty()
                                 ? ""
                                 : absl::StrCat("\"", absl::StrJoin(r.also_lost(), "\", \""), "\"");
    return absl::StrFormat(
        "{\"recovery\": {\"lost_worker\": \"%s\", \"rank\": %d, \"cause\": \"%s\", "
        "\"steps_done\": %d, \"restored_step\": %d, \"generation\": %d, \"stages\": %d, "
        "\"replicas\": %d, \"workers\": [\"%s\"], \"also_lost\": [%s], \"seconds\": %.3f}}\n",
        r.lost_worker(), r.rank(), r.cause(), failed_at, r.restored_step(), r.generation(),
        r.stages(), std::max(r.replicas(), 1), absl::StrJoin(r.workers(), "\", \""), also,
        r.seconds());
  }
  std::string lost = r.lost_worker().empty() ? r.cause()
                                             : absl::StrFormat("%s (rank %d, %s)", r.lost_worker(),
                                                               r.rank(), r.cause());
  if (!r.also_lost().empty()) {
    absl::StrAppend(&lost, ", then ", absl::StrJoin(r.also_lost(), ", "), " during the recovery");
  }
  return absl::StrFormat(
      "recovered: lost %s after step %d; restarted from step %d on %d stages%s (%s) in %.2f s; "
      "replayed %d steps\n",
      lost, failed_at, r.restored_step(), r.stages(),
      r.replicas() > 1 ? absl::StrCat(" x ", r.replicas(), " replicas") : "",
      absl::StrJoin(r.workers(), ", "), r.seconds(), failed_at - r.restored_step());
}

// One run on its job: the created job, its Train session, the progress it prints and what it
// writes (checkpoints, evaluations, the trace). Run once.
class TrainRun {
 public:
  TrainRun(const TrainCommandOptions& o, PreparedTrain& p, std::ostream& out)
      : o_(o), t_(o.training), p_(p), out_(out), progress_(out, ProgressOptionsFor(t_, true)) {}

  // Creates the job on `client`, trains it and ends it. Errors as RunTrainCommand.
  absl::Status Run(client::Client& client, const InterruptFn& interrupted) {
    client_ = &client;
    PT_ASSIGN_OR_RETURN(job_, client.CreateJob(p_.job_spec));
    // Ends the job on every way out: FinishJob after the last step and checkpoint, CancelJob on
    // an error or an interrupt, so that its workers are freed at once — but for a failed
    // checkpoint, which leaves the job and its weights for a retry of the save (SaveFailed).
    client::ScopedJob scoped(&client, job_.job());
    PT_RETURN_IF_ERROR(StartSampler());
    PrintHeader();
    PT_ASSIGN_OR_RETURN(session_, client.StartTraining(job_.job(), SessionOptions(interrupted)));
    for (int64_t i = 0; i < t_.steps; ++i) {
      if (interrupted && interrupted()) {
        scoped.set_cancel_reason(
            absl::StrCat("interrupted: the client stopped after step ", last_.step()));
        PT_RETURN_IF_ERROR(scoped.Cancel());
        return absl::CancelledError(absl::StrCat("interrupted: job ", job_.job(),
                                                 " cancelled after ", last_.step(),
                                                 " steps; its workers are free"));
      }
      PT_RETURN_IF_ERROR(Step(i, scoped));
    }
    progress_.Finish();
    PT_RETURN_IF_ERROR(session_->Finish());
    // The job is over: its workers are free for the next job.
    PT_RETURN_IF_ERROR(scoped.Finish());
    PT_RETURN_IF_ERROR(WriteTrace());
    return FinalEvaluation();
  }

 private:
  // The sampler, continuing where a resumed checkpoint's data stream left off (as `reference
  // --resume` does), and the checks of the job's step numbers and --trace-steps against them.
  absl::Status StartSampler() {
    io::DataCursor cursor;
    if (job_.has_resumed_from()) {
      const v1::ResumedFrom& r = job_.resumed_from();
      if (r.data() != t_.data || r.batch_size() != t_.batch) {
        return absl::FailedPreconditionError(absl::StrCat(
            t_.resume_dir, ": checkpoint was written with --data ", r.data(), " --seed ", t_.seed,
            " --batch ", r.batch_size(), "; resume with the same values"));
      }
      cursor.epoch = r.cursor_epoch();
      cursor.batch = r.cursor_batch();
    }
    PT_ASSIGN_OR_RETURN(io::BatchSampler sampler,
                        io::BatchSampler::Create(p_.setup.data.get(), t_.batch, t_.seed, cursor));
    sampler_.emplace(std::move(sampler));
    // Step numbers are global: a resumed job goes on from its checkpoint's. Both counts are below
    // 2^53 when they come from a checkpoint and the flags; the coordinator's answer is checked.
    if (job_.steps_done() < 0 || job_.steps_done() >= model::kMaxManifestCount) {
      return absl::FailedPreconditionError(absl::StrCat(
          "job ", job_.job(), " reports ", job_.steps_done(), " steps done, outside [0, 2^53)"));
    }
    first_step_ = job_.steps_done() + 1;
    const int64_t last_step = job_.steps_done() + t_.steps;
    if (o_.trace_steps.has_value() &&
        (o_.trace_steps->last < first_step_ || o_.trace_steps->first > last_step)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--trace-steps ", o_.trace_steps->first, ":", o_.trace_steps->last,
                       " selects none of this run's steps ", first_step_, ":", last_step));
    }
    return absl::OkStatus();
  }

  // Without --json: the model, the data, the job and each rank's layers.
  void PrintHeader() {
    if (t_.json) return;
    const model::Model& net = *p_.setup.model;
    const io::Dataset& data = *p_.setup.data;
    out_ << absl::StrFormat(
        "model %s: %d layers, %d parameters; data %s: %d train samples; job %s: %s, "
        "schedule %s, imbalance %.3f, instruction set %s\n",
        p_.setup.spec.name().empty() ? t_.model_path : p_.setup.spec.name(), net.num_layers(),
        net.NumParameters(), data.info().name, data.size(io::Split::kTrain), job_.job(),
        ShapeText(job_), o_.schedule, job_.imbalance(), job_.spec().isa());
    for (const v1::StageStatus& s : job_.stages()) {
      out_ << absl::StrFormat("  %s  %-16s %-22s layers", PositionText(job_, s), s.worker(),
                              s.address());
      for (const v1::ChunkSpec& c : s.chunks()) {
        out_ << absl::StrFormat(" [%d, %d)", c.first_layer(), c.last_layer());
      }
      out_ << "\n";
    }
    out_.flush();
  }

  // A lost worker is replaced and the job restarts from its last checkpoint; the session replays
  // the batches since, and each wait and recovery is reported on a line of its own (erasing the
  // live progress line first and drawing it again after). `interrupted` (Ctrl-C) also ends a wait
  // for the job or the coordinator (CANCELLED; the job is cancelled).
  client::TrainOptions SessionOptions(const InterruptFn& interrupted) {
    client::TrainOptions options;
    options.replay = true;
    options.first_step = job_.steps_done();
    options.reconnect_timeout = o_.reconnect_timeout;
    options.interrupted = interrupted;
    options.on_wait = [this](const absl::Status& why) {
      failed_at_ = last_.step();
      progress_.Clear();
      out_ << WaitingLine(why, last_.step(), job_.job(), o_.reconnect_timeout, t_.json);
      out_.flush();
      progress_.Redraw();
    };
    options.on_recovery = [this](const v1::RecoveryEvent& r) {
      progress_.Clear();
      out_ << RecoveryLine(r, failed_at_, t_.json);
      out_.flush();
      progress_.Redraw();
    };
    // A change of shape (the job grew onto idle workers, or a growth failed): one line each.
    options.on_shape_change = [this](const v1::ShapeChange& change) {
      progress_.Clear();
      out_ << ShapeChangeLine(change, t_.json);
      out_.flush();
      progress_.Redraw();
    };
    return options;
  }

  absl::Status SendNext() {
    io::Batch batch = sampler_->Next();
    PT_RETURN_IF_ERROR(
        session_->Send(client::BatchView{&batch.inputs, &batch.targets, batch.samples}));
    samples_sent_.push_back(batch.samples);
    return absl::OkStatus();
  }

  // The run's step `i` (0-based) of the job `scoped`: its result printed, then its checkpoint and
  // evaluation if due. A failed step cancels the job (AbandonJob); a failed save leaves it
  // (SaveFailed).
  absl::Status Step(int64_t i, client::ScopedJob& scoped) {
    const int64_t step = first_step_ + i;  // global, and each batch is answered in turn.
    const bool evaluate = t_.eval_every > 0 && step % t_.eval_every == 0;
    const bool checkpoint = CheckpointDue(t_, step, i + 1 == t_.steps);
    const bool last = i + 1 == t_.steps;
    // Batch i+1 is sent before result i is read, so that the coordinator starts step i+1 as soon
    // as step i is committed — except when a checkpoint or an evaluation follows step i: the job
    // must be idle then, and the sampler's cursor (in the manifest) at that step.
    if (samples_sent_.empty()) PT_RETURN_IF_ERROR(SendNext());
    if (!last && !checkpoint && !evaluate) PT_RETURN_IF_ERROR(SendNext());
    absl::StatusOr<v1::StepResult> received = session_->Receive();
    if (!received.ok()) return AbandonJob(scoped, received.status(), o_.client.cleanup_timeout);
    last_ = *std::move(received);
    const int64_t samples = samples_sent_.front();
    samples_sent_.pop_front();
    if (!o_.trace_path.empty() &&
        (o_.trace_steps.has_value() ? o_.trace_steps->Contains(last_.step()) : i + 1 == t_.steps)) {
      traced_.push_back(last_);
    }
    if (t_.json) {
      out_ << JsonStepLine(last_);
      out_.flush();
    } else {
      progress_.Step({last_.step(), last_.loss(), samples, last_.bubble_fraction(),
                      last_.predicted_bubble_fraction()});
    }
    // Before a checkpoint nothing was sent ahead: the job is idle, and the coordinator's
    // Checkpoint may run while the stream is open.
    if (checkpoint) {
      progress_.Clear();
      absl::StatusOr<bool> saved =
          SaveThroughCoordinator(*session_, p_.save_dir, t_, sampler_->cursor(), out_);
      if (!saved.ok()) {
        return SaveFailed(saved.status(), *client_, *session_, o_, job_.job(), p_.save_dir);
      }
      progress_.Redraw();
    }
    // --eval-samples: the final weights, evaluated before the job ends, printed at the end.
    if (last && t_.eval_samples.has_value()) {
      absl::StatusOr<model::EvalResult> final_eval =
          EvaluateThroughCoordinator(*session_, p_.setup, *t_.eval_samples);
      if (!final_eval.ok())
        return AbandonJob(scoped, final_eval.status(), o_.client.cleanup_timeout);
      final_eval_ = *final_eval;
    }
    if (!evaluate) return absl::OkStatus();
    // The weights of this step, evaluated through the coordinator (the Evaluate RPC: no file
    // system in common with it) with the same figures as `reference --eval-every`.
    absl::StatusOr<model::EvalResult> eval = EvaluateThroughCoordinator(
        *session_, p_.setup, t_.eval_samples.value_or(kDefaultEvalSamples));
    if (!eval.ok()) return AbandonJob(scoped, eval.status(), o_.client.cleanup_timeout);
    progress_.Clear();
    PrintEvaluation(*eval, p_.setup.spec.loss().has_softmax_cross_entropy(), t_.json, last_.step(),
                    out_);
    progress_.Redraw();
    return absl::OkStatus();
  }

  // --trace: the traced steps' timeline, in the format its file name asks for.
  absl::Status WriteTrace() {
    if (o_.trace_path.empty()) return absl::OkStatus();
    schedule::ScheduleParams params{
        p_.kind, o_.stages, static_cast<int>(t_.microbatches),
        o_.virtual_stages > 0 ? o_.virtual_stages : schedule::DefaultVirtualStages(p_.kind)};
    PT_ASSIGN_OR_RETURN(std::string trace,
                        RenderStepTraceAs(TraceFormatOf(o_.trace_path), traced_, params));
    PT_RETURN_IF_ERROR(WriteTextFile(o_.trace_path, trace));
    if (!t_.json) {
      out_ << (traced_.size() == 1 ? absl::StrCat("trace of step ", traced_[0].step())
                                   : absl::StrCat("trace of steps ", traced_.front().step(), " to ",
                                                  traced_.back().step()))
           << " written to " << o_.trace_path << "\n";
      out_.flush();
    }
    return absl::OkStatus();
  }

  // --eval-samples: the final weights' evaluation (made through the coordinator after the last
  // step), printed as `pipetrain evaluate` prints it.
  absl::Status FinalEvaluation() {
    if (!final_eval_.has_value()) return absl::OkStatus();
    PrintEvaluation(*final_eval_, p_.setup.spec.loss().has_softmax_cross_entropy(), t_.json, 0,
                    out_);
    return absl::OkStatus();
  }

  const TrainCommandOptions& o_;
  const TrainingOptions& t_;
  PreparedTrain& p_;
  std::ostream& out_;
  ProgressLine progress_;
  client::Client* client_ = nullptr;  // the job's coordinator, set by Run.
  v1::JobStatus job_;
  std::optional<io::BatchSampler> sampler_;
  std::unique_ptr<client::TrainSession> session_;
  int64_t first_step_ = 1;
  v1::StepResult last_;                          // the last step's result.
  int64_t failed_at_ = 0;                        // the step the run was at when a recovery began.
  std::vector<v1::StepResult> traced_;           // the steps --trace writes, in order.
  std::optional<model::EvalResult> final_eval_;  // --eval-samples, after the last step.
  std::deque<int64_t> samples_sent_;  // the samples of each batch sent and not yet answered.
};

}  // namespace

absl::StatusOr<PreparedTrain> PrepareTrainCommand(const TrainCommandOptions& o,
                                                  const job::JobLimits& limits, bool shares_files) {
  PT_RETURN_IF_ERROR(CheckTrainCommandOptions(o));
  const TrainingOptions& t = o.training;
  PreparedTrain p;
  PT_ASSIGN_OR_RETURN(p.kind, schedule::ParseScheduleKind(o.schedule));
  PT_ASSIGN_OR_RETURN(p.optimizer, OptimizerConfigFor(t));
  PT_ASSIGN_OR_RETURN(p.save_dir, SaveDirFor(t));
  // --tokenizer, or the tokenizer of a --resume checkpoint (when it is readable here).
  PT_ASSIGN_OR_RETURN(std::shared_ptr<const io::Tokenizer> tokenizer,
                      TokenizerForTraining(t, /*remote=*/!shares_files));
  PT_ASSIGN_OR_RETURN(p.setup, SetUpTrainingFromFile(t.model_path, t.data, t.data_dir, t.seed,
                                                     math::DefaultIsa(), tokenizer));
  // The batch against the data set (the run's sampler starts where the job's checkpoint says).
  PT_RETURN_IF_ERROR(
      io::BatchSampler::Create(p.setup.data.get(), t.batch, t.seed, io::DataCursor()).status());
  if (shares_files) PT_RETURN_IF_ERROR(CheckResumeHere(t, p.optimizer));
  PT_ASSIGN_OR_RETURN(p.job_spec, JobSpecFor(o, p));
  // The coordinator's own checks of the job (it fills the copy's defaults).
  v1::JobSpec checked = p.job_spec;
  PT_RETURN_IF_ERROR(job::CheckJobSpec(limits, &checked).status());
  return p;
}

absl::Status RunPreparedTrainCommand(const TrainCommandOptions& o, PreparedTrain& prepared,
                                     std::ostream& out, const InterruptFn& interrupted) {
  PT_ASSIGN_OR_RETURN(std::unique_ptr<client::Client> client,
                      client::Client::Connect(o.coordinator, o.client));
  TrainRun run(o, prepared, out);
  return run.Run(*client, interrupted);
}

absl::Status RunTrainCommand(const TrainCommandOptions& o, std::ostream& out,
                             const InterruptFn& interrupted) {
  PT_RETURN_IF_ERROR(CheckTrainCommandOptions(o));
  if (o.coordinator.empty()) {
    return absl::InvalidArgumentError(
        "--coordinator HOST:PORT is required (or the environment variable "
        "PIPETRAIN_COORDINATOR): the address a running coordinator listens on (its --listen); "
        "`pipetrain local` trains on a coordinator and workers it starts here instead");
  }
  // A loopback coordinator and its workers share this process's file system. Its flags (the
  // caps) are its own.
  PT_ASSIGN_OR_RETURN(
      PreparedTrain prepared,
      PrepareTrainCommand(o, job::JobLimits::Unlimited(), net::IsLoopbackAddress(o.coordinator)));
  return RunPreparedTrainCommand(o, prepared, out, interrupted);
}

}  // namespace pipetrain::cli
