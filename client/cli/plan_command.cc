#include "client/cli/plan_command.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <map>
#include <memory>
#include <tuple>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "client/cli/training_setup.h"
#include "client/cli/worker_profiles.h"
#include "common/plan/layer_costs.h"
#include "common/plan/speed_probe.h"
#include "common/util/cpu_set.h"
#include "common/util/status_macros.h"
#include "nlohmann/json.hpp"

namespace pipetrain::cli {
namespace {

double HostMemoryBytes() {
  const long pages = sysconf(_SC_PHYS_PAGES);
  const long page_size = sysconf(_SC_PAGESIZE);
  return pages > 0 && page_size > 0 ? static_cast<double>(pages) * page_size : 0;
}

absl::Status CheckPlanOptions(const PlanCommandOptions& o) {
  if ((o.local_workers > 0) == !o.coordinator.empty()) {
    return absl::InvalidArgumentError(
        "give exactly one of --local N (plan for N workers on this host) and --coordinator "
        "HOST:PORT (plan for its idle workers)");
  }
  if (o.local_workers < 0 || o.local_workers > util::kMaxCpus) {
    return absl::InvalidArgumentError(
        absl::StrCat("--local must be in [1, ", util::kMaxCpus, "], got ", o.local_workers));
  }
  if (const double l = o.link_latency_seconds.value_or(0); !(l >= 0 && l <= 1e6)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--link-latency must be in [0, 1e6] seconds, got ", l));
  }
  const double bw = o.link_bytes_per_second.value_or(0);
  if (!(bw == 0 || (bw >= 1e-3 && bw <= 1e30))) {
    return absl::InvalidArgumentError(
        absl::StrCat("--link-bandwidth must be 0 (infinite) or in [1e-3, 1e30] bytes/s, got ", bw));
  }
  if (const double c = o.message_cpu_seconds.value_or(0); !(c >= 0 && c <= 1e6)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--message-cpu must be in [0, 1e6] seconds, got ", c));
  }
  if (!(o.step_overhead_seconds >= 0 && o.step_overhead_seconds <= 1e6)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--step-overhead must be in [0, 1e6] seconds, got ", o.step_overhead_seconds));
  }
  if (o.top < 1 || o.max_microbatches < 1) {
    return absl::InvalidArgumentError(absl::StrCat("--top must be >= 1, got ", o.top));
  }
  if (o.local_workers > 0) PT_RETURN_IF_ERROR(o.link_probe.Check());
  return CheckTrainingOptions(o.training);
}

// The link figures: those given; the others measured on this host's loopback link (--local), the
// worst of those the coordinator's idle `workers` measured (`links`), or the defaults. A failed
// loopback probe is an error saying how to plan without it.
absl::StatusOr<PlanLinkFigures> PlanLink(const PlanCommandOptions& o,
                                         const std::vector<plan::WorkerResources>& workers,
                                         const std::vector<v1::MeasuredLink>& links) {
  PlanLinkFigures f;
  f.costs = {kDefaultLinkLatencySeconds, kDefaultLinkBytesPerSecond, kDefaultMessageCpuSeconds};
  const bool all_given = o.link_latency_seconds && o.link_bytes_per_second && o.message_cpu_seconds;
  if (o.local_workers == 0) ApplyMeasuredLinks(links, workers, &f);
  if (o.local_workers > 0 && !all_given) {
    absl::StatusOr<link::LinkMeasurement> m = link::MeasureLoopbackLink(o.link_probe);
    if (!m.ok()) {
      return absl::Status(
          m.status().code(),
          absl::StrCat("measuring this host's loopback link for the plans failed (give "
                       "--link-latency, --link-bandwidth and --message-cpu to plan without "
                       "measuring): ",
                       m.status().message()));
    }
    f.costs = {m->latency_seconds, m->bytes_per_second, m->cpu_seconds_per_message};
    f.latency = f.bandwidth = f.message_cpu = LinkFigureSource::kMeasured;
    f.measured_on = "this host's loopback link";
  }
  if (o.link_latency_seconds) {
    f.costs.latency_seconds = *o.link_latency_seconds;
    f.latency = LinkFigureSource::kGiven;
  }
  if (o.link_bytes_per_second) {
    f.costs.bytes_per_second = *o.link_bytes_per_second;
    f.bandwidth = LinkFigureSource::kGiven;
  }
  if (o.message_cpu_seconds) {
    f.costs.cpu_seconds_per_message = *o.message_cpu_seconds;
    f.message_cpu = LinkFigureSource::kGiven;
  }
  for (std::vector<plan::LinkCosts>& row : f.pairs) {
    for (plan::LinkCosts& pair : row) {
      if (o.link_latency_seconds) pair.latency_seconds = *o.link_latency_seconds;
      if (o.link_bytes_per_second) pair.bytes_per_second = *o.link_bytes_per_second;
      pair.cpu_seconds_per_message = f.costs.cpu_seconds_per_message;
    }
  }
  return f;
}

const char* SourceName(LinkFigureSource source) {
  switch (source) {
    case LinkFigureSource::kMeasured:
      return "measured";
    case LinkFigureSource::kGiven:
      return "given";
    case LinkFigureSource::kDefault:
      return "default";
  }
  return "unknown";
}

// "45 us", "3.2 us": microseconds, with a decimal below 10.
std::string Microseconds(double seconds) {
  const double us = seconds * 1e6;
  return us < 10 ? absl::StrFormat("%.1f us", us) : absl::StrFormat("%.0f us", us);
}

// "2.1 GB/s", "12.5 MB/s", "infinite bandwidth" (1 GB = 10^9 bytes).
std::string Rate(double bytes_per_second) {
  if (bytes_per_second == 0) return "infinite bandwidth";
  if (bytes_per_second >= 1e9) return absl::StrFormat("%.1f GB/s", bytes_per_second / 1e9);
  if (bytes_per_second >= 1e6) return absl::StrFormat("%.1f MB/s", bytes_per_second / 1e6);
  return absl::StrFormat("%.1f kB/s", bytes_per_second / 1e3);
}

// --local N twins at this host's speed, or the coordinator's idle workers in rank order (and the
// links they measured, into `links`); then --memory-cap over their memory.
absl::StatusOr<std::vector<plan::WorkerResources>> PlanWorkers(
    const PlanCommandOptions& o, double local_gflops, std::vector<v1::MeasuredLink>* links) {
  std::vector<plan::WorkerResources> workers;
  if (o.local_workers > 0) {
    for (int w = 0; w < o.local_workers; ++w) {
      workers.push_back(
          {absl::StrCat("local-", w), local_gflops, HostMemoryBytes() / o.local_workers});
    }
  } else {
    PT_ASSIGN_OR_RETURN(std::unique_ptr<client::Client> client,
                        client::Client::Connect(o.coordinator, o.client));
    PT_ASSIGN_OR_RETURN(std::vector<v1::WorkerInfo> infos, client->ListWorkers());
    for (const v1::WorkerInfo& w : infos) {
      if (!w.job().empty()) continue;
      workers.push_back({w.name(), w.gflops(), static_cast<double>(w.memory_bytes())});
      links->insert(links->end(), w.links().begin(), w.links().end());
    }
    if (workers.empty()) {
      return absl::FailedPreconditionError(absl::StrCat("the coordinator at ", o.coordinator,
                                                        " has no idle worker to plan for (",
                                                        infos.size(), " registered)"));
    }
  }
  if (!o.memory_caps.empty()) {
    if (o.memory_caps.size() != 1 && o.memory_caps.size() != workers.size()) {
      return absl::InvalidArgumentError(absl::StrCat("--memory-cap has ", o.memory_caps.size(),
                                                     " values; need one, or one per worker (",
                                                     workers.size(), ")"));
    }
    for (size_t w = 0; w < workers.size(); ++w) {
      workers[w].memory_bytes = o.memory_caps[o.memory_caps.size() == 1 ? 0 : w];
    }
  }
  return workers;
}

// The layers' costs timed on this machine (plan::MeasureLayerCosts: what each plan is cut by, and
// the byte figures) for every micro-batch count M dividing the batch, up to max_microbatches.
absl::StatusOr<std::map<int, plan::ModelCosts>> CostsByMicrobatches(
    const PlanCommandOptions& o, const model::Model& net, const math::OptimizerConfig& optimizer,
    double gflops) {
  std::map<int, plan::ModelCosts> by_m;
  const int64_t batch = o.training.batch;
  plan::MeasureOptions measure;
  measure.threads = o.training.threads;
  measure.seed = o.training.seed;
  for (int64_t m = 1; m <= std::min<int64_t>(batch, o.max_microbatches); ++m) {
    if (batch % m != 0) continue;
    PT_ASSIGN_OR_RETURN(by_m[static_cast<int>(m)],
                        plan::MeasureLayerCosts(net, batch / m, optimizer, gflops, measure));
  }
  return by_m;
}

// The coordinator's workers' own measurements of the layers (worker_profiles.h) at the
// micro-batch sizes of `by_m`; unprofiled workers (and why) in the notes.
absl::StatusOr<WorkerProfiles> ProfileOnCoordinator(const PlanCommandOptions& o,
                                                    const model::Model& net,
                                                    const math::OptimizerConfig& optimizer,
                                                    const std::map<int, plan::ModelCosts>& by_m,
                                                    const std::vector<plan::WorkerResources>& w) {
  PT_ASSIGN_OR_RETURN(std::unique_ptr<client::Client> client,
                      client::Client::Connect(o.coordinator, o.client));
  return MeasureOnWorkers(
      *client, ProfileRequestFor(net.spec(), by_m, o.training.threads, optimizer, o.training.isa),
      w, net.num_layers());
}

// Times each worker's chunks on this machine (plan::MeasureWorkerChunkSeconds), each set of
// chunks and M once.
class ChunkTimings {
 public:
  ChunkTimings(const model::Model* net, const math::OptimizerConfig& optimizer,
               const TrainingOptions& training)
      : net_(net), optimizer_(optimizer), batch_(training.batch) {
    measure_.threads = training.threads;
    measure_.seed = training.seed;
  }

  absl::StatusOr<std::vector<plan::ChunkSeconds>> operator()(
      const std::vector<plan::LayerRange>& chunks, int microbatches, int in_flight) {
    auto key = std::make_tuple(chunks, microbatches, in_flight);
    if (auto it = seconds_.find(key); it != seconds_.end()) return it->second;
    PT_ASSIGN_OR_RETURN(std::vector<plan::ChunkSeconds> s,
                        plan::MeasureWorkerChunkSeconds(*net_, chunks, batch_ / microbatches,
                                                        optimizer_, measure_, in_flight));
    seconds_.emplace(std::move(key), s);
    return s;
  }

 private:
  const model::Model* net_;
  math::OptimizerConfig optimizer_;
  int64_t batch_;
  plan::MeasureOptions measure_;
  std::map<std::tuple<std::vector<plan::LayerRange>, int, int>, std::vector<plan::ChunkSeconds>>
      seconds_;
};

// Confines the calling thread to the first `threads` CPUs it may use while it lives, as `pipetrain
// local` confines each worker (an unconfined thread timed the deep MLP 1.6x slower than a
// confined worker ran it on a loaded host), and gives it back its CPUs after. Does nothing when
// the CPUs do not fit or the kernel refuses (the timings are then those of an unconfined thread).
class ConfinedTimingScope {
 public:
  explicit ConfinedTimingScope(int threads) {
    CPU_ZERO(&saved_);
    if (sched_getaffinity(0, sizeof(saved_), &saved_) != 0) return;
    const std::vector<std::vector<int>> group = util::CpuGroups(util::AllowedCpus(), 1, threads);
    confined_ = !group.empty() && util::ConfineToCpus(group[0]).ok();
  }
  // Restores the saved mask directly: ConfineToCpus refuses CPUs outside the confined set.
  ~ConfinedTimingScope() {
    if (confined_) sched_setaffinity(0, sizeof(saved_), &saved_);
  }
  ConfinedTimingScope(const ConfinedTimingScope&) = delete;
  ConfinedTimingScope& operator=(const ConfinedTimingScope&) = delete;

 private:
  cpu_set_t saved_;
  bool confined_ = false;
};

std::string HumanBytes(double x) {
  static constexpr const char* kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int unit = 0;
  while (x >= 1024 && unit < 4) {
    x /= 1024;
    ++unit;
  }
  return unit == 0 ? absl::StrFormat("%.0f B", x) : absl::StrFormat("%.1f %s", x, kUnits[unit]);
}

double MaxOf(const std::vector<double>& v) {
  return v.empty() ? 0 : *std::max_element(v.begin(), v.end());
}

// Which workers' chunks are costed by their own measurements, and why the others are not.
std::string ProfileHeader(const PlanResult& r) {
  if (r.measured.empty()) return "";
  std::vector<std::string> profiled;
  for (size_t w = 0; w < r.workers.size() && w < r.measured.size(); ++w) {
    if (!r.measured[w].empty()) profiled.push_back(r.workers[w].name);
  }
  std::string out =
      absl::StrCat("costed by their own layer profiles: ", profiled.empty() ? "none" : "",
                   absl::StrJoin(profiled, ", "),
                   r.profile_notes.empty() ? "\n" : "; by the GFLOP/s ratio (not profiled):\n");
  for (const std::string& note : r.profile_notes) absl::StrAppend(&out, "  ", note, "\n");
  return out;
}

}  // namespace

void ApplyMeasuredLinks(const std::vector<v1::MeasuredLink>& links,
                        const std::vector<plan::WorkerResources>& workers, PlanLinkFigures* f) {
  std::map<std::string, size_t> index;
  for (size_t w = 0; w < workers.size(); ++w) index[workers[w].name] = w;
  std::vector<const v1::MeasuredLink*> usable;
  for (const v1::MeasuredLink& l : links) {
    if (l.error().empty() && index.count(l.from()) > 0 && index.count(l.to()) > 0 &&
        l.from() != l.to()) {
      usable.push_back(&l);
    }
  }
  if (usable.empty()) return;
  plan::LinkCosts& c = f->costs;
  for (size_t k = 0; k < usable.size(); ++k) {
    const v1::MeasuredLink& l = *usable[k];
    const bool first = k == 0;
    c.latency_seconds =
        first ? l.latency_seconds() : std::max(c.latency_seconds, l.latency_seconds());
    c.bytes_per_second =
        first ? l.bytes_per_second() : std::min(c.bytes_per_second, l.bytes_per_second());
    c.cpu_seconds_per_message =
        first ? l.cpu_seconds_per_message()
              : std::max(c.cpu_seconds_per_message, l.cpu_seconds_per_message());
  }
  f->pairs.assign(workers.size(), std::vector<plan::LinkCosts>(workers.size(), c));
  for (const v1::MeasuredLink* l : usable) {
    const size_t a = index[l->from()];
    const size_t b = index[l->to()];
    f->pairs[a][b] =
        f->pairs[b][a] = {l->latency_seconds(), l->bytes_per_second(), c.cpu_seconds_per_message};
  }
  f->latency = f->bandwidth = f->message_cpu = LinkFigureSource::kMeasured;
  const size_t n = usable.size();
  f->measured_on = absl::StrCat("the worst of ", n, " measured link", n == 1 ? "" : "s",
                                " between the coordinator's workers; each measured pair's own "
                                "latency and bandwidth in the plans");
}

absl::StatusOr<PlanResult> ComputePlans(const PlanCommandOptions& o) {
  PT_RETURN_IF_ERROR(CheckPlanOptions(o));
  PT_ASSIGN_OR_RETURN(const math::Isa isa, ReferenceIsaFor(o.training));
  PT_ASSIGN_OR_RETURN(math::OptimizerConfig optimizer, OptimizerConfigFor(o.training));
  PT_ASSIGN_OR_RETURN(std::shared_ptr<const io::Tokenizer> tokenizer,
                      TokenizerForTraining(o.training, /*remote=*/false));
  PT_ASSIGN_OR_RETURN(TrainingSetup setup,
                      SetUpTrainingFromFile(o.training.model_path, o.training.data,
                                            o.training.data_dir, o.training.seed, isa, tokenizer));
  const model::Model& net = *setup.model;
  PlanResult result;
  result.batch = o.training.batch;
  std::vector<v1::MeasuredLink> links;
  if (o.local_workers == 0) {
    PT_ASSIGN_OR_RETURN(result.workers, PlanWorkers(o, 0, &links));
  }
  // Before the timing confines this thread: the probe's gRPC threads would inherit its CPUs.
  PT_ASSIGN_OR_RETURN(result.link, PlanLink(o, result.workers, links));
  const int host_cpus = util::UsableCpuCount();  // before the timing confines this thread.
  ConfinedTimingScope confined(o.training.threads);
  const math::Kernels& kernels = net.kernels();
  PT_ASSIGN_OR_RETURN(const plan::SpeedProbe probe,
                      plan::ProbeSpeed([&kernels] { return kernels.MeasureGemmGflops(0); }));
  result.local_gflops = probe.speed;
  if (o.local_workers > 0) {
    PT_ASSIGN_OR_RETURN(result.workers, PlanWorkers(o, probe.speed, &links));
  }
  PT_ASSIGN_OR_RETURN(const auto by_m, CostsByMicrobatches(o, net, optimizer, probe.speed));
  ChunkTimings timings(&net, optimizer, o.training);
  plan::PlannerOptions po;
  if (o.local_workers == 0) {
    PT_ASSIGN_OR_RETURN(const WorkerProfiles profiles,
                        ProfileOnCoordinator(o, net, optimizer, by_m, result.workers));
    po.measured = profiles.measured;
    result.measured = profiles.measured;
    result.profile_notes = profiles.notes;
  }
  po.batch = o.training.batch;
  po.workers = result.workers;
  po.link = result.link.costs;
  po.pair_links = result.link.pairs;
  po.step_overhead_seconds = o.step_overhead_seconds;
  po.chunk_timer = [&timings](const std::vector<plan::LayerRange>& chunks, int m, int in_flight) {
    return timings(chunks, m, in_flight);
  };
  po.threads = o.training.threads;
  po.max_replicas = static_cast<int>(result.workers.size());
  po.partition_by_layer_costs = o.partition_by_layer_costs;
  if (o.local_workers > 0) po.host_cpus = host_cpus;
  PT_ASSIGN_OR_RETURN(result.plans, plan::RankPlans(net.LayerFlops(1), by_m, po));
  return result;
}

std::string LinkFiguresText(const PlanLinkFigures& link) {
  const std::string latency = Microseconds(link.costs.latency_seconds);
  const std::string rate = Rate(link.costs.bytes_per_second);
  const std::string cpu = Microseconds(link.costs.cpu_seconds_per_message) + " CPU per message";
  if (link.latency != link.bandwidth || link.latency != link.message_cpu) {
    return absl::StrCat("link: ", latency, " ", SourceName(link.latency), ", ", rate, " ",
                        SourceName(link.bandwidth), ", ", cpu, " ", SourceName(link.message_cpu));
  }
  std::string text =
      absl::StrCat("link ", SourceName(link.latency), ": ", latency, ", ", rate, ", ", cpu);
  if (link.latency == LinkFigureSource::kMeasured && !link.measured_on.empty()) {
    absl::StrAppend(&text, " (", link.measured_on, ")");
  } else if (link.latency == LinkFigureSource::kDefault) {
    absl::StrAppend(&text,
                    " (no link between the coordinator's workers was measured: give "
                    "--link-latency, --link-bandwidth and --message-cpu)");
  }
  return text;
}

absl::StatusOr<plan::PlanChoice> BestPlan(const PlanResult& result, int max_replicas) {
  std::vector<plan::PlanChoice> allowed;
  for (const plan::PlanChoice& p : result.plans) {
    if (p.replicas <= max_replicas) allowed.push_back(p);
  }
  if (allowed.empty() || !allowed.front().fits_memory) {
    double least = 0;
    for (const plan::PlanChoice& p : allowed) {
      const double need = MaxOf(p.peak_memory_bytes);
      if (least == 0 || need < least) least = need;
    }
    return absl::FailedPreconditionError(
        absl::StrCat("no plan fits the workers' memory: the smallest needs ", HumanBytes(least),
                     " on one worker (give --memory-cap, more workers, or a smaller --batch)"));
  }
  return allowed.front();
}

std::string FormatPlans(const PlanResult& r, int top, bool json) {
  std::string out;
  const int n = std::min<int>(top, static_cast<int>(r.plans.size()));
  if (json) {
    for (int k = 0; k < n; ++k) {
      const plan::PlanChoice& p = r.plans[k];
      const nlohmann::ordered_json j = {
          {"rank", k + 1},
          {"replicas", p.replicas},
          {"stages", p.stages},
          {"schedule", std::string(schedule::ScheduleKindName(p.kind))},
          {"virtual", p.virtual_stages},
          {"microbatches", p.microbatches},
          {"samples_per_second", p.samples_per_second},
          {"step_seconds", p.step_seconds},
          {"bubble", p.bubble},
          {"reduction_seconds", p.reduction_seconds},
          {"coordinator_seconds", p.coordinator_seconds},
          {"imbalance", p.imbalance},
          {"boundaries", p.boundaries},
          {"peak_memory_bytes", p.peak_memory_bytes},
          {"fits_memory", p.fits_memory},
          {"link",
           {{"latency_seconds", r.link.costs.latency_seconds},
            {"latency_source", SourceName(r.link.latency)},
            {"bytes_per_second", r.link.costs.bytes_per_second},
            {"bandwidth_source", SourceName(r.link.bandwidth)},
            {"cpu_seconds_per_message", r.link.costs.cpu_seconds_per_message},
            {"message_cpu_source", SourceName(r.link.message_cpu)}}}};
      absl::StrAppend(&out, j.dump(), "\n");
    }
    return out;
  }
  absl::StrAppend(&out, absl::StrFormat("%d plans for batch %d on %d workers (", r.plans.size(),
                                        r.batch, r.workers.size()));
  for (size_t w = 0; w < r.workers.size(); ++w) {
    absl::StrAppend(&out, w == 0 ? "" : ", ",
                    absl::StrFormat("%s %.1f GFLOP/s %s", r.workers[w].name, r.workers[w].gflops,
                                    HumanBytes(r.workers[w].memory_bytes)));
  }
  absl::StrAppend(&out,
                  absl::StrFormat("); layer costs timed here at %.1f GFLOP/s\n", r.local_gflops));
  absl::StrAppend(&out, LinkFiguresText(r.link), "\n");
  absl::StrAppend(&out, ProfileHeader(r));
  constexpr char kRow[] = "%-4s %-8s %-6s %-20s %-7s %-12s %10s %9s %7s %9s %9s %11s %s\n";
  absl::StrAppend(&out, absl::StrFormat(kRow, "#", "REPLICAS", "STAGES", "SCHEDULE", "VIRTUAL",
                                        "MICROBATCHES", "SAMPLES/S", "STEP MS", "BUBBLE",
                                        "REDUCE MS", "IMBALANCE", "PEAK MEMORY", "FITS"));
  for (int k = 0; k < n; ++k) {
    const plan::PlanChoice& p = r.plans[k];
    absl::StrAppend(
        &out,
        absl::StrFormat(kRow, absl::StrCat(k + 1), absl::StrCat(p.replicas), absl::StrCat(p.stages),
                        schedule::ScheduleKindName(p.kind), absl::StrCat(p.virtual_stages),
                        absl::StrCat(p.microbatches), absl::StrFormat("%.0f", p.samples_per_second),
                        absl::StrFormat("%.2f", p.step_seconds * 1e3),
                        absl::StrFormat("%.1f%%", p.bubble * 100),
                        absl::StrFormat("%.2f", p.reduction_seconds * 1e3),
                        absl::StrFormat("%.3f", p.imbalance),
                        HumanBytes(MaxOf(p.peak_memory_bytes)), p.fits_memory ? "yes" : "no"));
  }
  return out;
}

absl::Status RunPlanCommand(const PlanCommandOptions& options, std::ostream& out) {
  PT_ASSIGN_OR_RETURN(const PlanResult result, ComputePlans(options));
  out << FormatPlans(result, options.top, options.json);
  return absl::OkStatus();
}

}  // namespace pipetrain::cli
