#include "client/cli/train_command.h"

#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/cli/training_setup.h"
#include "client/sdk/client.h"
#include "common/io/dataset.h"
#include "common/math/optimizer.h"
#include "common/model/checkpoint.h"
#include "common/model/model.h"
#include "common/model/optimizer_proto.h"
#include "common/schedule/generator.h"
#include "common/schedule/ir.h"
#include "common/schedule/timeline.h"
#include "common/schedule/timeline_render.h"
#include "common/util/status_macros.h"

namespace pipetrain::cli {
namespace {}  // namespace

absl::Status CheckTrainCommandOptions(const TrainCommandOptions& o) {
  if (o.model_path.empty()) return absl::InvalidArgumentError("--model is required");
  if (o.stages < 1) {
    return absl::InvalidArgumentError(absl::StrCat("--stages must be >= 1, got ", o.stages));
  }
  if (o.virtual_stages < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("--virtual must be >= 0 (0: the schedule's default), got ", o.virtual_stages));
  }
  PT_RETURN_IF_ERROR(CheckTrainingLoopOptions(o.steps, o.batch, o.microbatches, o.log_every));
  if (o.threads < 1) {
    return absl::InvalidArgumentError(absl::StrCat("--threads must be >= 1, got ", o.threads));
  }
  return schedule::ParseScheduleKind(o.schedule).status();
}

namespace {

// The measured timeline of a step (compute intervals, in milliseconds), for --trace.
absl::StatusOr<schedule::Timeline> MeasuredTimeline(const v1::StepResult& r,
                                                    const schedule::Placement& placement) {
  schedule::Timeline t;
  t.placement = placement;
  t.workers.resize(r.workers_size());
  for (int w = 0; w < r.workers_size(); ++w) {
    for (const v1::ActionTiming& a : r.workers(w).timings()) {
      schedule::TimedAction ta;
      switch (a.action().op()) {
        case v1::ACTION_OP_FORWARD:
          ta.action.op = schedule::Op::kForward;
          break;
        case v1::ACTION_OP_BACKWARD:
          ta.action.op = schedule::Op::kBackward;
          break;
        case v1::ACTION_OP_INPUT_GRAD:
          ta.action.op = schedule::Op::kInputGrad;
          break;
        case v1::ACTION_OP_WEIGHT_GRAD:
          ta.action.op = schedule::Op::kWeightGrad;
          break;
        default:
          return absl::InvalidArgumentError("a worker reported an action without an op");
      }
      ta.action.mb = a.action().microbatch();
      ta.action.chunk = a.action().chunk();
      ta.start = (a.start_us() + a.wait_us()) / 1000.0;
      ta.end = std::max(ta.start, a.end_us() / 1000.0);
      t.workers[w].push_back(ta);
    }
  }
  return t;
}

absl::Status WriteTextFile(const std::string& path, const std::string& text) {
  std::ofstream f(path, std::ios::binary | std::ios::trunc);
  f << text;
  f.close();
  if (!f) return absl::UnavailableError(absl::StrCat("cannot write ", path));
  return absl::OkStatus();
}

}  // namespace

absl::Status RunTrainCommand(const TrainCommandOptions& o, std::ostream& out,
                             const InterruptFn& interrupted) {
  PT_RETURN_IF_ERROR(CheckTrainCommandOptions(o));
  if (o.coordinator.empty()) return absl::InvalidArgumentError("--coordinator is required");
  PT_ASSIGN_OR_RETURN(schedule::ScheduleKind kind, schedule::ParseScheduleKind(o.schedule));
  PT_ASSIGN_OR_RETURN(math::OptimizerConfig optimizer, math::ParseOptimizerConfig(o.optimizer));
  PT_ASSIGN_OR_RETURN(TrainingSetup setup,
                      SetUpTrainingFromFile(o.model_path, o.data, o.data_dir, o.seed));
  const v1::ModelSpec& spec = setup.spec;
  const std::unique_ptr<io::Dataset>& data = setup.data;
  const std::unique_ptr<model::Model>& net = setup.model;
  const io::DatasetInfo& info = data->info();
  PT_ASSIGN_OR_RETURN(io::BatchSampler sampler,
                      io::BatchSampler::Create(data.get(), o.batch, o.seed, io::DataCursor()));

  PT_ASSIGN_OR_RETURN(std::unique_ptr<client::Client> client,
                      client::Client::Connect(o.coordinator));
  v1::JobSpec job_spec;
  *job_spec.mutable_model() = spec;
  *job_spec.mutable_optimizer() = model::OptimizerToProto(optimizer);
  job_spec.set_schedule(std::string(schedule::ScheduleKindName(kind)));
  job_spec.set_stages(o.stages);
  job_spec.set_microbatches(static_cast<int32_t>(o.microbatches));
  job_spec.set_virtual_stages(o.virtual_stages);
  job_spec.set_seed(o.seed);
  job_spec.set_threads(o.threads);
  PT_ASSIGN_OR_RETURN(v1::JobStatus job, client->CreateJob(job_spec));
  if (!o.json) {
    out << absl::StrFormat(
        "model %s: %d layers, %d parameters; data %s: %d train samples; job %s: %d stages, "
        "schedule %s, imbalance %.3f\n",
        spec.name().empty() ? o.model_path : spec.name(), net->num_layers(), net->NumParameters(),
        info.name, data->size(io::Split::kTrain), job.job(), o.stages, o.schedule, job.imbalance());
    for (const v1::StageStatus& s : job.stages()) {
      out << absl::StrFormat("  rank %d  %-16s %-22s layers", s.rank(), s.worker(), s.address());
      for (const v1::ChunkSpec& c : s.chunks()) {
        out << absl::StrFormat(" [%d, %d)", c.first_layer(), c.last_layer());
      }
      out << "\n";
    }
  }

  PT_ASSIGN_OR_RETURN(std::unique_ptr<client::TrainSession> session,
                      client->StartTraining(job.job()));
  using Clock = std::chrono::steady_clock;
  auto window_start = Clock::now();
  int64_t window_samples = 0;
  v1::StepResult last;
  for (int64_t i = 0; i < o.steps; ++i) {
    if (interrupted && interrupted()) return absl::CancelledError("interrupted");
    io::Batch batch = sampler.Next();
    PT_ASSIGN_OR_RETURN(
        last, session->Step(client::BatchView{&batch.inputs, &batch.targets, batch.samples}));
    window_samples += batch.samples;
    if (o.json) {
      out << absl::StrFormat(
          "{\"step\": %d, \"loss\": %.9g, \"step_ms\": %.3f, \"bubble_fraction\": %.4f, "
          "\"predicted_bubble_fraction\": %.4f}\n",
          last.step(), last.loss(), last.step_ms(), last.bubble_fraction(),
          last.predicted_bubble_fraction());
      out.flush();
    } else if (last.step() % o.log_every == 0 || i == 0 || i + 1 == o.steps) {
      const double secs = std::chrono::duration<double>(Clock::now() - window_start).count();
      out << absl::StrFormat(
          "step %6d  loss %.6f  %.0f samples/s  bubble %.1f%% (predicted %.1f%%)\n", last.step(),
          last.loss(), secs > 0 ? window_samples / secs : 0.0, 100 * last.bubble_fraction(),
          100 * last.predicted_bubble_fraction());
      out.flush();
      window_start = Clock::now();
      window_samples = 0;
    }
  }
  PT_RETURN_IF_ERROR(session->Finish());

  if (!o.trace_path.empty()) {
    schedule::ScheduleParams params{
        kind, o.stages, static_cast<int>(o.microbatches),
        o.virtual_stages > 0 ? o.virtual_stages : schedule::DefaultVirtualStages(kind)};
    PT_ASSIGN_OR_RETURN(schedule::Placement placement, schedule::PlacementFor(params));
    PT_ASSIGN_OR_RETURN(schedule::Timeline timeline, MeasuredTimeline(last, placement));
    // Timeline times are milliseconds: 1000 trace microseconds per unit.
    PT_RETURN_IF_ERROR(WriteTextFile(o.trace_path, schedule::RenderChromeTrace(timeline, 1000)));
    if (!o.json) out << "trace of step " << last.step() << " written to " << o.trace_path << "\n";
  }
  if (!o.save_dir.empty()) {
    // The workers write the layer files and the coordinator a manifest with what it knows; the
    // client then rewrites the manifest with the fields only it knows (data set, batch size, data
    // cursor, the optimizer's canonical text), exactly as `pipetrain reference --save` writes it.
    std::error_code ec;
    const std::string dir = std::filesystem::absolute(o.save_dir, ec).string();
    if (ec)
      return absl::InvalidArgumentError(absl::StrCat("--save ", o.save_dir, ": ", ec.message()));
    PT_ASSIGN_OR_RETURN(v1::CheckpointResponse saved, client->Checkpoint(job.job(), dir));
    if (!std::filesystem::exists(dir + "/" + model::kManifestName)) {
      // The coordinator's file system is not ours (a remote coordinator): its manifest stays as
      // written, without the data set fields.
      if (!o.json) {
        out << "checkpoint written to " << dir << " on the coordinator's host (its manifest "
            << "lacks --data, --batch and the data cursor)\n";
      }
      return absl::OkStatus();
    }
    model::CheckpointManifest m;
    m.step = saved.step();
    m.model_spec = spec;
    m.optimizer = math::FormatOptimizerConfig(optimizer);
    m.seed = o.seed;
    m.data = o.data;
    m.batch_size = o.batch;
    m.microbatches = o.microbatches;
    m.data_cursor = sampler.cursor();
    m.shards = model::LayerShards(*net, 0, net->num_layers());
    PT_RETURN_IF_ERROR(model::WriteCheckpointManifest(dir, m));
    if (!o.json) out << "checkpoint written to " << o.save_dir << "\n";
  }
  return absl::OkStatus();
}

}  // namespace pipetrain::cli
