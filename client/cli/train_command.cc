#include "client/cli/train_command.h"

#include <deque>
#include <filesystem>
#include <fstream>
#include <memory>
#include <utility>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "client/cli/reference_command.h"
#include "client/cli/training_setup.h"
#include "client/sdk/client.h"
#include "common/io/dataset.h"
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
  if (t.eval_samples.has_value() && t.save_dir.empty()) {
    return absl::InvalidArgumentError(
        "--eval-samples needs --save DIR for train and local: the final checkpoint is what is "
        "evaluated");
  }
  if (t.eval_every > 0 && t.save_dir.empty()) {
    return absl::InvalidArgumentError(
        "--eval-every needs --save DIR for train and local: each evaluation reads the checkpoint "
        "written at that step");
  }
  if (o.trace_steps.has_value() && o.trace_path.empty()) {
    return absl::InvalidArgumentError("--trace-steps needs --trace FILE (where the trace goes)");
  }
  if (o.stages < 1) {
    return absl::InvalidArgumentError(absl::StrCat("--stages must be >= 1, got ", o.stages));
  }
  if (o.virtual_stages < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--virtual must be >= 0 (0: the schedule's default), got ", o.virtual_stages));
  }
  if (o.min_stages < 0 || o.min_stages > o.stages) {
    return absl::InvalidArgumentError(
        absl::StrCat("--min-stages must be in [0, --stages = ", o.stages, "], got ", o.min_stages));
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

// The JobSpec of a `train` run: the resolved model, the optimizer, the pipeline's flags, and the
// directories it saves into and resumes from (absolute, on the coordinator's host: the
// coordinator checks them before the job takes its workers).
absl::StatusOr<v1::JobSpec> JobSpecFor(const TrainCommandOptions& o, const TrainingSetup& setup,
                                       const math::OptimizerConfig& optimizer,
                                       schedule::ScheduleKind kind, const std::string& save_dir) {
  const TrainingOptions& t = o.training;
  v1::JobSpec job_spec;
  *job_spec.mutable_model() = setup.spec;
  *job_spec.mutable_optimizer() = model::OptimizerToProto(optimizer);
  job_spec.set_schedule(std::string(schedule::ScheduleKindName(kind)));
  job_spec.set_stages(o.stages);
  job_spec.set_microbatches(static_cast<int32_t>(t.microbatches));
  job_spec.set_virtual_stages(o.virtual_stages);
  job_spec.set_seed(t.seed);
  job_spec.set_threads(t.threads);
  job_spec.set_recover(true);  // survive a lost worker: replace it, restart, replay (docs).
  job_spec.set_replace_timeout_ms(absl::ToInt64Milliseconds(o.replace_timeout));
  job_spec.set_min_stages(o.min_stages);
  job_spec.set_isa(t.isa);              // empty: the highest level every worker runs.
  job_spec.set_planned_steps(t.steps);  // the target of the job's progress and ETA.
  // The coordinator writes it into every checkpoint of the job.
  if (setup.tokenizer != nullptr) job_spec.set_tokenizer(setup.tokenizer->model());
  if (!save_dir.empty()) {
    job_spec.set_save_to(save_dir);
    job_spec.set_keep_checkpoints(t.keep_checkpoints);
  }
  if (!t.resume_dir.empty()) {
    // On loopback the checkpoint is on this host too: its optimizer kind (which decides the state
    // tensors) must be this run's. Elsewhere the coordinator's host has it.
    if (net::IsLoopbackAddress(o.coordinator)) {
      absl::StatusOr<model::CheckpointManifest> resumed =
          model::ReadCheckpointManifest(t.resume_dir);
      // An unreadable manifest is the coordinator's to report, with the rest of its checks.
      if (resumed.ok()) {
        PT_RETURN_IF_ERROR(model::CheckOptimizerResumes(t.resume_dir, *resumed, optimizer));
      }
    }
    std::error_code ec;
    job_spec.set_resume_from(std::filesystem::absolute(t.resume_dir, ec).string());
    if (ec) {
      return absl::InvalidArgumentError(
          absl::StrCat("--resume ", t.resume_dir, ": ", ec.message()));
    }
  }
  return job_spec;
}

}  // namespace

absl::Status RunTrainCommand(const TrainCommandOptions& o, std::ostream& out,
                             const InterruptFn& interrupted) {
  PT_RETURN_IF_ERROR(CheckTrainCommandOptions(o));
  if (o.coordinator.empty()) {
    return absl::InvalidArgumentError(
        "--coordinator HOST:PORT is required (or the environment variable "
        "PIPETRAIN_COORDINATOR): the address a running coordinator listens on (its --listen); "
        "`pipetrain local` trains on a coordinator and workers it starts here instead");
  }
  const TrainingOptions& t = o.training;
  PT_ASSIGN_OR_RETURN(schedule::ScheduleKind kind, schedule::ParseScheduleKind(o.schedule));
  PT_ASSIGN_OR_RETURN(math::OptimizerConfig optimizer, OptimizerConfigFor(t));
  // --save is a directory on the coordinator's host, which checks it when it creates the job.
  std::string save_dir;
  if (!t.save_dir.empty()) {
    std::error_code ec;
    save_dir = std::filesystem::absolute(t.save_dir, ec).string();
    if (ec) {
      return absl::InvalidArgumentError(absl::StrCat("--save ", t.save_dir, ": ", ec.message()));
    }
  }
  // --tokenizer, or the tokenizer of a --resume checkpoint that is readable here too.
  PT_ASSIGN_OR_RETURN(std::shared_ptr<const io::Tokenizer> tokenizer,
                      TokenizerForTraining(t, /*remote=*/true));
  PT_ASSIGN_OR_RETURN(TrainingSetup setup,
                      SetUpTrainingFromFile(t.model_path, t.data, t.data_dir, t.seed,
                                            math::DefaultIsa(), tokenizer));
  const v1::ModelSpec& spec = setup.spec;
  const std::unique_ptr<io::Dataset>& data = setup.data;
  const std::unique_ptr<model::Model>& net = setup.model;
  const io::DatasetInfo& info = data->info();

  PT_ASSIGN_OR_RETURN(std::unique_ptr<client::Client> client,
                      client::Client::Connect(o.coordinator, o.client));
  PT_ASSIGN_OR_RETURN(v1::JobSpec job_spec, JobSpecFor(o, setup, optimizer, kind, save_dir));
  PT_ASSIGN_OR_RETURN(v1::JobStatus job, client->CreateJob(job_spec));
  // Ends the job on every way out: FinishJob after the last step and checkpoint, CancelJob on an
  // error or an interrupt, so that its workers are freed at once — but for a failed checkpoint,
  // which leaves the job and its weights for a retry of the save (SaveFailed).
  client::ScopedJob scoped(client.get(), job.job());
  // The data stream continues where the checkpoint's left off, as `reference --resume` does.
  io::DataCursor cursor;
  if (job.has_resumed_from()) {
    const v1::ResumedFrom& r = job.resumed_from();
    if (r.data() != t.data || r.batch_size() != t.batch) {
      return absl::FailedPreconditionError(
          absl::StrCat(t.resume_dir, ": checkpoint was written with --data ", r.data(), " --seed ",
                       t.seed, " --batch ", r.batch_size(), "; resume with the same values"));
    }
    cursor.epoch = r.cursor_epoch();
    cursor.batch = r.cursor_batch();
  }
  PT_ASSIGN_OR_RETURN(io::BatchSampler sampler,
                      io::BatchSampler::Create(data.get(), t.batch, t.seed, cursor));
  // Step numbers are global: a resumed job goes on from its checkpoint's. Both counts are below
  // 2^53 when they come from a checkpoint and the flags; the coordinator's answer is checked.
  if (job.steps_done() < 0 || job.steps_done() >= model::kMaxManifestCount) {
    return absl::FailedPreconditionError(absl::StrCat(
        "job ", job.job(), " reports ", job.steps_done(), " steps done, outside [0, 2^53)"));
  }
  const int64_t first_step = job.steps_done() + 1, last_step = job.steps_done() + t.steps;
  if (o.trace_steps.has_value() &&
      (o.trace_steps->last < first_step || o.trace_steps->first > last_step)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--trace-steps ", o.trace_steps->first, ":", o.trace_steps->last,
                     " selects none of this run's steps ", first_step, ":", last_step));
  }
  std::vector<v1::StepResult> traced;  // the steps --trace writes, in order.
  if (!t.json) {
    out << absl::StrFormat(
        "model %s: %d layers, %d parameters; data %s: %d train samples; job %s: %d stages, "
        "schedule %s, imbalance %.3f, instruction set %s\n",
        spec.name().empty() ? t.model_path : spec.name(), net->num_layers(), net->NumParameters(),
        info.name, data->size(io::Split::kTrain), job.job(), o.stages, o.schedule, job.imbalance(),
        job.spec().isa());
    for (const v1::StageStatus& s : job.stages()) {
      out << absl::StrFormat("  rank %d  %-16s %-22s layers", s.rank(), s.worker(), s.address());
      for (const v1::ChunkSpec& c : s.chunks()) {
        out << absl::StrFormat(" [%d, %d)", c.first_layer(), c.last_layer());
      }
      out << "\n";
    }
    out.flush();
  }

  // A lost worker is replaced and the job restarts from its last checkpoint; the session replays
  // the batches since, and each recovery is reported here.
  v1::StepResult last;  // the last step's result.
  client::TrainOptions train_options;
  train_options.replay = true;
  train_options.first_step = job.steps_done();
  train_options.reconnect_timeout = o.reconnect_timeout;
  // Ctrl-C also ends a wait for the job or the coordinator (CANCELLED; the job is cancelled).
  train_options.interrupted = interrupted;
  // The step the session was at when a recovery began (the coordinator does not know it after a
  // restart).
  int64_t failed_at = 0;
  // Lines of their own (waits, recoveries, checkpoints, evaluations) erase the live progress
  // line first and draw it again after.
  ProgressLine progress(out, ProgressOptionsFor(t, /*pipeline=*/true));
  train_options.on_wait = [&out, &t, &o, &failed_at, &last, &job,
                           &progress](const absl::Status& why) {
    failed_at = last.step();
    progress.Clear();
    out << WaitingLine(why, last.step(), job.job(), o.reconnect_timeout, t.json);
    out.flush();
    progress.Redraw();
  };
  train_options.on_recovery = [&out, &t, &failed_at, &progress](const v1::RecoveryEvent& r) {
    progress.Clear();
    std::string lost =
        r.lost_worker().empty()
            ? r.cause()
            : absl::StrFormat("%s (rank %d, %s)", r.lost_worker(), r.rank(), r.cause());
    if (!r.also_lost().empty()) {
      absl::StrAppend(&lost, ", then ", absl::StrJoin(r.also_lost(), ", "), " during the recovery");
    }
    if (t.json) {
      const std::string also =
          r.also_lost().empty() ? ""
                                : absl::StrCat("\"", absl::StrJoin(r.also_lost(), "\", \""), "\"");
      out << absl::StrFormat(
          "{\"recovery\": {\"lost_worker\": \"%s\", \"rank\": %d, \"cause\": \"%s\", "
          "\"steps_done\": %d, \"restored_step\": %d, \"generation\": %d, \"stages\": %d, "
          "\"workers\": [\"%s\"], \"also_lost\": [%s], \"seconds\": %.3f}}\n",
          r.lost_worker(), r.rank(), r.cause(), failed_at, r.restored_step(), r.generation(),
          r.stages(), absl::StrJoin(r.workers(), "\", \""), also, r.seconds());
    } else {
      out << absl::StrFormat(
          "recovered: lost %s after step %d; restarted from step %d on %d stages (%s) in %.2f s; "
          "replayed %d steps\n",
          lost, failed_at, r.restored_step(), r.stages(), absl::StrJoin(r.workers(), ", "),
          r.seconds(), failed_at - r.restored_step());
    }
    out.flush();
    progress.Redraw();
  };
  PT_ASSIGN_OR_RETURN(std::unique_ptr<client::TrainSession> session,
                      client->StartTraining(job.job(), std::move(train_options)));
  bool checkpoint_visible = false;   // the last checkpoint's manifest is on this file system.
  std::deque<int64_t> samples_sent;  // the samples of each batch sent and not yet answered.
  auto send_next = [&sampler, &session, &samples_sent]() -> absl::Status {
    io::Batch batch = sampler.Next();
    PT_RETURN_IF_ERROR(
        session->Send(client::BatchView{&batch.inputs, &batch.targets, batch.samples}));
    samples_sent.push_back(batch.samples);
    return absl::OkStatus();
  };
  for (int64_t i = 0; i < t.steps; ++i) {
    if (interrupted && interrupted()) {
      scoped.set_cancel_reason(
          absl::StrCat("interrupted: the client stopped after step ", last.step()));
      PT_RETURN_IF_ERROR(scoped.Cancel());
      return absl::CancelledError(absl::StrCat("interrupted: job ", job.job(), " cancelled after ",
                                               last.step(), " steps; its workers are free"));
    }
    // What follows this step (step numbers are global, and each batch is answered in turn).
    const int64_t step = first_step + i;
    const bool evaluate = t.eval_every > 0 && step % t.eval_every == 0;
    const bool checkpoint = CheckpointDue(t, step, i + 1 == t.steps) || evaluate;
    // Batch i+1 is sent before result i is read, so that the coordinator starts step i+1 as soon
    // as step i is committed — except when a checkpoint follows step i: the job must be idle
    // then, and the sampler's cursor (in the manifest) at that step.
    if (samples_sent.empty()) PT_RETURN_IF_ERROR(send_next());
    if (i + 1 < t.steps && !checkpoint) PT_RETURN_IF_ERROR(send_next());
    absl::StatusOr<v1::StepResult> received = session->Receive();
    if (!received.ok()) return AbandonJob(scoped, received.status(), o.client.cleanup_timeout);
    last = *std::move(received);
    const int64_t samples = samples_sent.front();
    samples_sent.pop_front();
    if (!o.trace_path.empty() &&
        (o.trace_steps.has_value() ? o.trace_steps->Contains(last.step()) : i + 1 == t.steps)) {
      traced.push_back(last);
    }
    if (t.json) {
      out << absl::StrFormat(
          "{\"step\": %d, \"loss\": %.9g, \"step_ms\": %.3f, \"bubble_fraction\": %.4f, "
          "\"predicted_bubble_fraction\": %.4f, \"link_latency_ms\": %s}\n",
          last.step(), last.loss(), last.step_ms(), last.bubble_fraction(),
          last.predicted_bubble_fraction(),
          last.has_link_latency_ms() ? absl::StrFormat("%.4f", last.link_latency_ms()) : "null");
      out.flush();
    } else {
      progress.Step({last.step(), last.loss(), samples, last.bubble_fraction(),
                     last.predicted_bubble_fraction()});
    }
    // Before a checkpoint nothing was sent ahead: the job is idle, and the coordinator's
    // Checkpoint may run while the stream is open.
    if (checkpoint) {
      progress.Clear();
      absl::StatusOr<bool> saved =
          SaveThroughCoordinator(*session, save_dir, t, sampler.cursor(), out);
      if (!saved.ok()) {
        return SaveFailed(saved.status(), *client, *session, o, job.job(), save_dir);
      }
      checkpoint_visible = *saved;
      progress.Redraw();
    }
    if (evaluate) {
      // The weights of this step, evaluated as `reference --eval-every` does.
      if (!checkpoint_visible) {
        return absl::FailedPreconditionError(absl::StrCat(
            "--eval-every: checkpoint ", save_dir, " is on the coordinator's host, not here"));
      }
      EvaluateCommandOptions eval;
      eval.checkpoint_dir = save_dir;
      eval.data = t.data;
      eval.data_dir = t.data_dir;
      eval.eval_samples = t.eval_samples.value_or(kDefaultEvalSamples);
      eval.json = t.json;
      eval.step = last.step();
      progress.Clear();
      PT_RETURN_IF_ERROR(RunEvaluateCommand(eval, out));
      progress.Redraw();
    }
  }
  progress.Finish();
  PT_RETURN_IF_ERROR(session->Finish());
  // The job is over: its workers are free for the next job.
  PT_RETURN_IF_ERROR(scoped.Finish());

  if (!o.trace_path.empty()) {
    schedule::ScheduleParams params{
        kind, o.stages, static_cast<int>(t.microbatches),
        o.virtual_stages > 0 ? o.virtual_stages : schedule::DefaultVirtualStages(kind)};
    PT_ASSIGN_OR_RETURN(std::string trace,
                        RenderStepTraceAs(TraceFormatOf(o.trace_path), traced, params));
    PT_RETURN_IF_ERROR(WriteTextFile(o.trace_path, trace));
    if (!t.json) {
      out << (traced.size() == 1 ? absl::StrCat("trace of step ", traced[0].step())
                                 : absl::StrCat("trace of steps ", traced.front().step(), " to ",
                                                traced.back().step()))
          << " written to " << o.trace_path << "\n";
      out.flush();
    }
  }
  if (t.eval_samples.has_value()) {
    // The final checkpoint, evaluated as `pipetrain evaluate` does (CheckTrainCommandOptions
    // made sure there is one).
    if (!checkpoint_visible) {
      return absl::FailedPreconditionError(
          absl::StrCat("--eval-samples: checkpoint ", save_dir,
                       " is on the coordinator's host, not here; run `pipetrain evaluate` there"));
    }
    EvaluateCommandOptions eval;
    eval.checkpoint_dir = save_dir;
    eval.data = t.data;
    eval.data_dir = t.data_dir;
    eval.eval_samples = *t.eval_samples;
    eval.json = t.json;
    PT_RETURN_IF_ERROR(RunEvaluateCommand(eval, out));
  }
  return absl::OkStatus();
}

}  // namespace pipetrain::cli
