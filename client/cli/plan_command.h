// `pipetrain plan`: the ranked plans for a model and batch on this host's or a coordinator's
// workers (docs/scaling.md), and the choice `train --plan auto` and `local --plan auto` run.
//
//   pipetrain plan --model FILE [--data ...] --batch B (--local N | --coordinator ADDR)
//       [--threads T] [--optimizer ...] [--memory-cap BYTES[,...]] [--link-latency S]
//       [--link-bandwidth BYTES_PER_S] [--message-cpu S] [--step-overhead S] [--top K] [--json]
//
// The link figures not given are measured on this host's loopback link (--local; the workers'
// own link code, link::MeasureLoopbackLink) or, for a coordinator's workers, the worst of the
// links they measured between each other (WorkerInfo.links), else the defaults.
// The per-layer costs are timed on this machine (plan::MeasureLayerCosts) for every micro-batch
// count M dividing B (up to 64): each plan is cut by them (what `--plan auto` sends as
// JobSpec.layer_costs, so the coordinator makes the same cut), its chunks are timed together
// (plan::MeasureChunkSeconds) and scaled to each worker (with --coordinator, by what the worker
// measured of the same layers itself, ProfileWorkers in client/cli/worker_profiles.h, against
// this machine's figures; else, or for a worker not profiled, by its GFLOP/s against this
// machine's speed probe), simulated and checked against the workers' memory (plan::RankPlans), with
// R replicas of S stages for every power of two R the step's gradient tree supports and R x S <=
// workers. Not thread-safe (it runs compute on the calling thread).
#ifndef PIPETRAIN_CLIENT_CLI_PLAN_COMMAND_H_
#define PIPETRAIN_CLIENT_CLI_PLAN_COMMAND_H_

#include <map>
#include <optional>
#include <ostream>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "client/cli/training_options.h"
#include "client/sdk/client.h"
#include "common/plan/planner.h"
#include "pipetrain/v1/plan.pb.h"
#include "server/link/link_probe.h"

namespace pipetrain::cli {

// The most replicas `--plan auto` may choose: as many as `pipetrain plan` ranks (the workers'
// count bounds them first; this only caps what a plan may ask of the coordinator).
inline constexpr int kAutoPlanMaxReplicas = 4096;

// The link figures of a coordinator's workers when neither given nor measured by them (e.g. a
// coordinator run with --probe-links=false): what docs/performance.md measured
// between two pinned workers on one host (~100 us per tensor, ~2 GB/s for a stream, and what
// their busy time grew by per tensor, docs/scaling.md).
inline constexpr double kDefaultLinkLatencySeconds = 100e-6;
inline constexpr double kDefaultLinkBytesPerSecond = 2e9;
inline constexpr double kDefaultMessageCpuSeconds = 30e-6;

struct PlanCommandOptions {
  // --model, --data, --data-dir, --tokenizer, --batch, --seed, --threads, --optimizer, --isa.
  TrainingOptions training;
  // --local N: plan for N workers on this host (each at this host's probe speed; memory: the
  // host's physical memory / N). 0: the idle workers of `coordinator`.
  int local_workers = 0;
  std::string coordinator;  // --coordinator HOST:PORT, with local_workers == 0.
  client::ClientOptions client;
  // --memory-cap: bytes a plan may fill per worker, one value or one per worker (as `partition`).
  // Empty: each worker's memory.
  std::vector<double> memory_caps;
  // --link-latency (seconds per message, >= 0), --link-bandwidth (bytes/s; 0: infinite) and
  // --message-cpu (CPU seconds a worker spends per tensor it sends or receives, >= 0). A figure
  // given is used as it is (users on known networks). Unset, with --local: measured on this
  // host's loopback link through the workers' link code (link::MeasureLoopbackLink with
  // `link_probe`; the probe is not run when all three are given); with --coordinator: the worst
  // of the links its workers measured between each other (ListWorkers' WorkerInfo.links: the
  // highest latency and CPU per message, the lowest bandwidth, each over every measured pair of
  // the idle workers), or the kDefault* figures below when none was measured.
  std::optional<double> link_latency_seconds;
  std::optional<double> link_bytes_per_second;
  std::optional<double> message_cpu_seconds;
  link::LinkProbeOptions link_probe;  // the loopback probe's options (defaults: ~0.3 s).
  // --step-overhead: seconds per step outside the workers' action lists (RunStep, StepDone and
  // Commit round trips; docs/performance.md: 1.0-1.2 ms), >= 0.
  double step_overhead_seconds = 1.2e-3;
  int max_microbatches = 64;  // M tried: the divisors of B up to this.
  int top = 10;               // --top K: rows printed, >= 1.
  bool json = false;          // --json: one JSON object per plan instead of the table.
  // --partition-by measured (true, default): each plan is cut by its layers' timed costs (what
  // --plan auto sends as JobSpec.layer_costs); flops (false): by FLOPs, as the coordinator cuts a
  // run that sends none.
  bool partition_by_layer_costs = true;
};

// Where a link figure of the plans came from.
enum class LinkFigureSource {
  kMeasured,  // the link probe: on this host's loopback (--local), or the workers' (--coordinator).
  kGiven,     // its flag.
  kDefault,   // kDefault*: not given, and no link of the coordinator's workers was measured.
};

// The link figures the plans were computed with, and where each came from.
struct PlanLinkFigures {
  plan::LinkCosts costs;
  LinkFigureSource latency = LinkFigureSource::kDefault;
  LinkFigureSource bandwidth = LinkFigureSource::kDefault;
  LinkFigureSource message_cpu = LinkFigureSource::kDefault;
  // What the measured figures are of: "this host's loopback link", "the worst of 3 measured
  // links between the coordinator's workers"; empty when none is measured.
  std::string measured_on;
  // With links measured between the coordinator's workers: [a][b] the latency and bandwidth
  // between the plan's workers a and b (plan::PlannerOptions::pair_links): each measured pair its
  // own (measured one way, taken for both), the others `costs`', given figures everywhere. Empty:
  // `costs` between every pair.
  std::vector<std::vector<plan::LinkCosts>> pairs;
};

// Into `f`: the worst of `links` (a coordinator's ListWorkers) between two of `workers` without
// an error, each figure on its own, with f->measured_on saying so, and f->pairs each measured
// pair's own figures; nothing when no such link was measured. Pure.
void ApplyMeasuredLinks(const std::vector<v1::MeasuredLink>& links,
                        const std::vector<plan::WorkerResources>& workers, PlanLinkFigures* f);

// One line for plan headers: "link measured: 45 us, 2.1 GB/s, 12 us CPU per message (this
// host's loopback link)" (measured_on) when the figures share a source (measured, given or
// default), else each
// figure with its own, e.g. "link: 45 us measured, 10.0 MB/s given, 12 us CPU per message
// measured". A bandwidth of 0 reads "infinite bandwidth". Pure.
std::string LinkFiguresText(const PlanLinkFigures& link);

// The plans and what they were computed from.
struct PlanResult {
  int64_t batch = 0;
  double local_gflops = 0;  // this machine's speed probe: the speed the timed costs hold at.
  PlanLinkFigures link;     // the link figures every plan was simulated with.
  std::vector<plan::WorkerResources> workers;
  // With --coordinator: [w] workers[w]'s own layer measurements by micro-batch samples (empty
  // map: not profiled; PlannerOptions::measured), and why the unprofiled ones are not.
  std::vector<std::map<int64_t, plan::ModelCosts>> measured;
  std::vector<std::string> profile_notes;
  std::vector<plan::PlanChoice> plans;  // best first.
};

// Measures and ranks. Errors: INVALID_ARGUMENT for bad options (naming the flag), those of the
// training setup (model, data), UNAVAILABLE and others from the coordinator, FAILED_PRECONDITION
// when it has no idle worker or no plan runs, and the loopback probe's (UNAVAILABLE,
// DEADLINE_EXCEEDED: its message says which flags plan without it).
absl::StatusOr<PlanResult> ComputePlans(const PlanCommandOptions& options);

// The best plan of at most `max_replicas` replicas that fits every worker's memory.
// FAILED_PRECONDITION naming the smallest need if none does.
absl::StatusOr<plan::PlanChoice> BestPlan(const PlanResult& result,
                                          int max_replicas = kAutoPlanMaxReplicas);

// The ranked table (or JSON lines) of the first `top` plans, with a header naming the workers and
// the link figures (LinkFiguresText; in JSON, each plan's "link" object).
std::string FormatPlans(const PlanResult& result, int top, bool json);

// ComputePlans, then FormatPlans to `out`.
absl::Status RunPlanCommand(const PlanCommandOptions& options, std::ostream& out);

}  // namespace pipetrain::cli

#endif  // PIPETRAIN_CLIENT_CLI_PLAN_COMMAND_H_
