#include "client/cli/job_commands.h"

#include <algorithm>
#include <filesystem>
#include <memory>
#include <system_error>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "client/cli/progress.h"
#include "client/cli/shape_line.h"
#include "client/sdk/client.h"
#include "common/util/status_macros.h"
#include "nlohmann/json.hpp"

namespace pipetrain::cli {
namespace {

// "ready", "done", ... from JOB_STATE_READY, JOB_STATE_DONE, ...
std::string StateName(v1::JobState state) {
  std::string name = v1::JobState_Name(state);
  const std::string prefix = "JOB_STATE_";
  if (name.rfind(prefix, 0) == 0) name = name.substr(prefix.size());
  for (char& c : name) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return name;
}

// The ETA of `job`'s progress: "0:07"; "unknown" for a live job whose client did not say how many
// steps it runs (JobSpec.planned_steps) or that has no pace yet; "-" once it ended.
std::string EtaText(const v1::JobStatus& job) {
  if (job.ended_unix_ms() > 0) return "-";
  if (!job.progress().has_eta_seconds()) return "unknown";
  return FormatClock(absl::Seconds(job.progress().eta_seconds()));
}

// Steps done, "/target" when the target is known: "30/100".
std::string StepsText(const v1::JobStatus& job) {
  const int64_t target = job.progress().target_step();
  return target > 0 ? absl::StrCat(job.steps_done(), "/", target) : absl::StrCat(job.steps_done());
}

// Whole seconds, minutes or hours since `unix_ms`: "42s", "7m", "3h".
std::string Age(int64_t unix_ms, absl::Time now) {
  const absl::Duration age = now - absl::FromUnixMillis(unix_ms);
  if (age < absl::Minutes(2)) return absl::StrCat(absl::ToInt64Seconds(age), "s");
  if (age < absl::Hours(2)) return absl::StrCat(absl::ToInt64Minutes(age), "m");
  return absl::StrCat(absl::ToInt64Hours(age), "h");
}

absl::StatusOr<std::unique_ptr<client::Client>> Connect(const JobCommandOptions& o) {
  if (o.coordinator.empty()) {
    return absl::InvalidArgumentError(
        "--coordinator HOST:PORT is required (or the environment variable "
        "PIPETRAIN_COORDINATOR): the address a running coordinator listens on (its --listen)");
  }
  return client::Client::Connect(o.coordinator, o.client);
}

absl::Status RequireJob(const JobCommandOptions& o, const char* command) {
  if (o.job.empty()) {
    return absl::InvalidArgumentError(absl::StrCat("usage: pipetrain ", command,
                                                   " JOB --coordinator HOST:PORT (the job id, as "
                                                   "`pipetrain jobs` lists it)"));
  }
  return absl::OkStatus();
}

// What `checkpoint` did, as text or one JSON object.
void PrintCheckpoint(const JobCommandOptions& o, const v1::CheckpointResponse& saved,
                     const v1::JobStatus& job, std::ostream& out) {
  const bool finished = job.state() == v1::JOB_STATE_DONE;
  if (o.json) {
    const nlohmann::ordered_json j = {{"job", job.job()},
                                      {"step", saved.step()},
                                      {"directory", saved.directory()},
                                      {"state", StateName(job.state())},
                                      {"data_position", saved.has_data_position()}};
    out << j.dump() << "\n";
    return;
  }
  out << absl::StrFormat("checkpoint of step %d written to %s\n", saved.step(), saved.directory());
  if (!saved.has_data_position()) {
    out << "  its manifest has no data set or data cursor (no client gave them for this step): "
           "`pipetrain evaluate` reads it, `pipetrain train --resume` does not\n";
  }
  if (finished) {
    out << absl::StrFormat("job %s finished; its workers are free\n", job.job());
  } else {
    out << absl::StrFormat("job %s left %s: a client is training it\n", job.job(),
                           StateName(job.state()));
  }
}

// The job's shape, how far it may grow and its changes of shape, when it may or did change.
void PrintShape(const v1::JobStatus& job, std::ostream& out) {
  const v1::JobSpec& s = job.spec();
  if (s.max_stages() <= s.stages() && s.max_replicas() <= std::max(1, s.replicas()) &&
      job.shape_changes().empty()) {
    return;
  }
  out << "  shape " << ShapeOfSpec(s);
  if (s.max_stages() > s.stages()) out << ", grows up to " << s.max_stages() << " stages";
  out << "\n";
  for (const v1::ShapeChange& c : job.shape_changes()) out << "    " << ShapeChangeLine(c, false);
}

void PrintStatus(const v1::JobStatus& job, absl::Time now, std::ostream& out) {
  out << absl::StrFormat("job %s: %s", job.job(), StateName(job.state()));
  if (!job.reason().empty()) out << " (" << job.reason() << ")";
  out << absl::StrFormat("\n  steps done %d, generation %d, created %s ago", job.steps_done(),
                         job.generation(), Age(job.created_unix_ms(), now));
  if (job.ended_unix_ms() > 0) out << ", ended " << Age(job.ended_unix_ms(), now) << " ago";
  out << (job.client_attached() ? ", a client is training it" : "") << "\n";
  const v1::JobProgress& p = job.progress();
  if (p.step() > 0) {
    out << absl::StrFormat("  step %d: loss %.6f, %.0f samples/s, step %.1f ms; ETA %s\n", p.step(),
                           p.loss(), p.samples_per_second(), p.step_ms(), EtaText(job));
  }
  if (p.target_step() > 0) {
    out << absl::StrFormat("  target step %d (%d to go)\n", p.target_step(),
                           std::max<int64_t>(0, p.target_step() - job.steps_done()));
  }
  const v1::JobSpec& s = job.spec();
  out << absl::StrFormat(
      "  %s x %d virtual, schedule %s, %d micro-batches, seed %d, %d threads, imbalance "
      "%.3f\n",
      ShapeText(job), s.virtual_stages(), s.schedule(), s.microbatches(), s.seed(), s.threads(),
      job.imbalance());
  PrintShape(job, out);
  for (const v1::StageStatus& st : job.stages()) {
    std::vector<std::string> layers;
    for (const v1::ChunkSpec& c : st.chunks()) {
      layers.push_back(absl::StrFormat("[%d, %d)", c.first_layer(), c.last_layer()));
    }
    out << absl::StrFormat("  %s  %-16s %-22s layers %s\n", PositionText(job, st), st.worker(),
                           st.address(), absl::StrJoin(layers, " "));
  }
}

// The "progress" object of a job's JSON: nulls where there is no figure yet (no step, no target,
// no ETA).
nlohmann::ordered_json ProgressJson(const v1::JobProgress& p) {
  const nlohmann::ordered_json none;
  return {
      {"step", p.step()},
      {"loss", p.step() > 0 ? nlohmann::ordered_json(p.loss()) : none},
      {"samples_per_second", p.step() > 0 ? nlohmann::ordered_json(p.samples_per_second()) : none},
      {"step_ms", p.step() > 0 ? nlohmann::ordered_json(p.step_ms()) : none},
      {"target_step", p.target_step() > 0 ? nlohmann::ordered_json(p.target_step()) : none},
      {"eta_s", p.has_eta_seconds() ? nlohmann::ordered_json(p.eta_seconds()) : none}};
}

// Each change of the job's shape, as ShapeChangeLine's JSON object.
nlohmann::ordered_json ShapeChangesJson(const v1::JobStatus& job) {
  nlohmann::ordered_json changes = nlohmann::ordered_json::array();
  for (const v1::ShapeChange& c : job.shape_changes()) {
    changes.push_back(nlohmann::ordered_json::parse(ShapeChangeLine(c, true)).at("shape_change"));
  }
  return changes;
}

// The links `w` measured at registration (WorkerInfo.links), one object each; a failed probe
// carries its error instead of figures.
nlohmann::json LinksJson(const v1::WorkerInfo& w) {
  nlohmann::json links = nlohmann::json::array();
  for (const v1::MeasuredLink& l : w.links()) {
    nlohmann::json j = {{"from", l.from()}, {"to", l.to()}};
    if (l.error().empty()) {
      j["latency_seconds"] = l.latency_seconds();
      j["bytes_per_second"] = l.bytes_per_second();
      j["cpu_seconds_per_message"] = l.cpu_seconds_per_message();
    } else {
      j["error"] = l.error();
    }
    links.push_back(std::move(j));
  }
  return links;
}

}  // namespace

std::string ShapeText(const v1::JobStatus& job) {
  const std::string text = absl::StrCat(job.spec().stages(), " stages");
  if (job.replicas() <= 1) return text;
  return absl::StrCat(text, " x ", job.replicas(), " replicas");
}

std::string PositionText(const v1::JobStatus& job, const v1::StageStatus& stage) {
  if (job.replicas() <= 1) return absl::StrCat("rank ", stage.rank());
  return absl::StrCat("replica ", stage.replica(), " rank ", stage.rank());
}

std::string JobStatusJson(const v1::JobStatus& job, absl::Time now) {
  nlohmann::ordered_json stages = nlohmann::ordered_json::array();
  for (const v1::StageStatus& st : job.stages()) {
    nlohmann::ordered_json layers = nlohmann::ordered_json::array();
    for (const v1::ChunkSpec& c : st.chunks()) layers.push_back({c.first_layer(), c.last_layer()});
    stages.push_back({{"rank", st.rank()},
                      {"replica", st.replica()},
                      {"worker", st.worker()},
                      {"address", st.address()},
                      {"layers", layers}});
  }
  const nlohmann::ordered_json j = {
      {"job", job.job()},
      {"state", StateName(job.state())},
      {"reason", job.reason()},
      {"steps_done", job.steps_done()},
      {"generation", job.generation()},
      {"schedule", job.spec().schedule()},
      {"stages", job.spec().stages()},
      {"replicas", std::max(job.replicas(), 1)},
      {"microbatches", job.spec().microbatches()},
      {"age_s", absl::ToInt64Seconds(now - absl::FromUnixMillis(job.created_unix_ms()))},
      {"client_attached", job.client_attached()},
      {"workers", stages},
      {"progress", ProgressJson(job.progress())},
      {"replicas", std::max(1, job.spec().replicas())},
      {"max_stages", job.spec().max_stages()},
      {"max_replicas", job.spec().max_replicas()},
      {"shape_changes", ShapeChangesJson(job)},
  };
  return j.dump();
}

absl::Status RunJobsCommand(const JobCommandOptions& o, std::ostream& out) {
  PT_ASSIGN_OR_RETURN(std::unique_ptr<client::Client> client, Connect(o));
  PT_ASSIGN_OR_RETURN(std::vector<v1::JobStatus> jobs, client->ListJobs());
  const absl::Time now = absl::Now();
  if (o.json) {
    for (const v1::JobStatus& job : jobs) out << JobStatusJson(job, now) << "\n";
    return absl::OkStatus();
  }
  if (jobs.empty()) {
    out << "no jobs\n";
    return absl::OkStatus();
  }
  constexpr char kRow[] = "%-22s %-10s %13s %6s %-11s %5s %10s %9s %8s %8s  %s\n";
  out << absl::StrFormat(kRow, "JOB", "STATE", "STEPS", "STAGES", "SCHEDULE", "AGE", "LOSS",
                         "SAMPLES/S", "STEP_MS", "ETA", "REASON");
  for (const v1::JobStatus& job : jobs) {
    const v1::JobProgress& p = job.progress();
    const bool stepped = p.step() > 0;
    out << absl::StrFormat(
        kRow, job.job(), StateName(job.state()), StepsText(job),
        job.replicas() > 1 ? absl::StrCat(job.spec().stages(), "x", job.replicas())
                           : absl::StrCat(job.spec().stages()),
        job.spec().schedule(), Age(job.created_unix_ms(), now),
        stepped ? absl::StrFormat("%.6f", p.loss()) : "-",
        stepped ? absl::StrFormat("%.0f", p.samples_per_second()) : "-",
        stepped ? absl::StrFormat("%.1f", p.step_ms()) : "-", EtaText(job), job.reason());
  }
  return absl::OkStatus();
}

absl::Status RunWorkersCommand(const JobCommandOptions& o, std::ostream& out) {
  PT_ASSIGN_OR_RETURN(std::unique_ptr<client::Client> client, Connect(o));
  PT_ASSIGN_OR_RETURN(std::vector<v1::WorkerInfo> workers, client->ListWorkers());
  if (o.json) {
    for (const v1::WorkerInfo& w : workers) {
      const nlohmann::json j = {
          {"name", w.name()},
          {"address", w.address()},
          {"cores", w.cores()},
          {"gflops", w.gflops()},
          {"memory_bytes", w.memory_bytes()},
          {"isa_levels", std::vector<std::string>(w.isa_levels().begin(), w.isa_levels().end())},
          {"job", w.job()},
          {"rank", w.rank()},
          {"replica", w.replica()},
          {"links", LinksJson(w)},
      };
      out << j.dump() << "\n";
    }
    return absl::OkStatus();
  }
  if (workers.empty()) {
    out << "no workers\n";
    return absl::OkStatus();
  }
  constexpr char kRow[] = "%-20s %-22s %5s %8s %10s %-21s %-22s %4s %7s\n";
  out << absl::StrFormat(kRow, "WORKER", "ADDRESS", "CORES", "GFLOP/S", "MEMORY", "ISA", "JOB",
                         "RANK", "REPLICA");
  for (const v1::WorkerInfo& w : workers) {
    const bool idle = w.job().empty();
    out << absl::StrFormat(
        kRow, w.name(), w.address(), absl::StrCat(w.cores()), absl::StrFormat("%.1f", w.gflops()),
        absl::StrFormat("%.1f GiB", w.memory_bytes() / double{1 << 30}),
        w.isa_levels().empty() ? "-" : absl::StrJoin(w.isa_levels(), ","), idle ? "-" : w.job(),
        idle ? "-" : absl::StrCat(w.rank()), idle ? "-" : absl::StrCat(w.replica()));
  }
  return absl::OkStatus();
}

absl::Status RunStatusCommand(const JobCommandOptions& o, std::ostream& out) {
  PT_RETURN_IF_ERROR(RequireJob(o, "status"));
  PT_ASSIGN_OR_RETURN(std::unique_ptr<client::Client> client, Connect(o));
  PT_ASSIGN_OR_RETURN(v1::JobStatus job, client->GetJob(o.job));
  if (o.json) {
    out << JobStatusJson(job, absl::Now()) << "\n";
  } else {
    PrintStatus(job, absl::Now(), out);
  }
  return absl::OkStatus();
}

absl::Status RunCancelCommand(const JobCommandOptions& o, std::ostream& out) {
  PT_RETURN_IF_ERROR(RequireJob(o, "cancel"));
  PT_ASSIGN_OR_RETURN(std::unique_ptr<client::Client> client, Connect(o));
  PT_ASSIGN_OR_RETURN(v1::JobStatus before, client->GetJob(o.job));
  PT_ASSIGN_OR_RETURN(
      v1::JobStatus job,
      client->CancelJob(o.job, o.reason.empty() ? "cancelled by pipetrain cancel" : o.reason));
  if (o.json) {
    out << JobStatusJson(job, absl::Now()) << "\n";
  } else if (before.state() == job.state() && job.state() != v1::JOB_STATE_CANCELLED) {
    out << absl::StrFormat("job %s had already ended: %s%s\n", job.job(), StateName(job.state()),
                           job.reason().empty() ? "" : absl::StrCat(" (", job.reason(), ")"));
  } else if (before.state() == v1::JOB_STATE_CANCELLED) {
    out << absl::StrFormat("job %s was already cancelled (%s)\n", job.job(), job.reason());
  } else {
    out << absl::StrFormat("job %s cancelled after %d steps; its %d workers are free\n", job.job(),
                           job.steps_done(), job.stages_size());
  }
  return absl::OkStatus();
}

absl::Status RunCheckpointCommand(const JobCommandOptions& o, std::ostream& out) {
  PT_RETURN_IF_ERROR(RequireJob(o, "checkpoint"));
  if (o.save_dir.empty()) {
    return absl::InvalidArgumentError(
        "usage: pipetrain checkpoint JOB --save DIR --coordinator HOST:PORT (DIR on the "
        "coordinator's host, under its --checkpoint-root)");
  }
  if (o.keep_checkpoints < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("--keep-checkpoints must be >= 1, got ", o.keep_checkpoints));
  }
  std::error_code ec;
  const std::string dir = std::filesystem::absolute(o.save_dir, ec).string();
  if (ec)
    return absl::InvalidArgumentError(absl::StrCat("--save ", o.save_dir, ": ", ec.message()));
  PT_ASSIGN_OR_RETURN(std::unique_ptr<client::Client> client, Connect(o));
  // The coordinator keeps the data position the job's client gave for this step.
  PT_ASSIGN_OR_RETURN(v1::CheckpointResponse saved,
                      client->Checkpoint(o.job, dir, o.keep_checkpoints));
  PT_ASSIGN_OR_RETURN(v1::JobStatus job, client->GetJob(o.job));
  // A job no client trains is done once its weights are saved; one that a client trains is its.
  if (!job.client_attached() && job.state() == v1::JOB_STATE_READY) {
    PT_ASSIGN_OR_RETURN(job, client->FinishJob(o.job));
  }
  PrintCheckpoint(o, saved, job, out);
  return absl::OkStatus();
}

}  // namespace pipetrain::cli
