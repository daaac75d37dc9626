// The scaling table (docs/scaling.md, "How a job scales"): the planner's predicted throughput of
// one model on 8 to 1,024 workers (R replicas x S stages), so that users see how a job scales
// before they rent the hosts.
//
// Every worker is taken to be this host (its speed probe, or --gflops) on a host of its own,
// joined to the others by the link model (--link-latency, --link-bandwidth, --message-cpu). The
// batch grows with the workers (--per-worker-batch samples per worker per step: weak scaling).
// For N workers it evaluates every plan of R x S = N (R a power of two, S at most the layers),
// schedules 1f1b, zb-h1 and interleaved (V = 2), and M / R = S, 2S, 4S, 8S or 16S micro-batches per
// replica, cut by the layers' costs timed here (plan::MeasureLayerCosts) and simulated by
// plan::EvaluatePlan, and prints the best, the best with one replica (pure pipeline) and the best
// with one stage (pure data parallelism), with the efficiency against N independent workers.
// The reference, measured in the same run: one worker on a batch of --per-worker-batch samples.
//
// Usage: scaling_bench --model FILE [--data D] [--optimizer O] [--workers 8,16,...] [--csv FILE]
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/flags/flag.h"
#include "absl/flags/parse.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "client/cli/training_options.h"
#include "client/cli/training_setup.h"
#include "common/partition/partitioner.h"
#include "common/plan/layer_costs.h"
#include "common/plan/planner.h"
#include "common/plan/speed_probe.h"
#include "common/schedule/generator.h"
#include "common/util/status_macros.h"

ABSL_FLAG(std::string, model, "examples/deep_mlp.textproto", "model file (ModelSpec text)");
ABSL_FLAG(std::string, data, "", "data set (pipetrain's --data); empty: what the model implies");
ABSL_FLAG(std::string, optimizer, "adamw", "optimizer (pipetrain's --optimizer)");
ABSL_FLAG(std::string, workers, "8,16,32,64,128,256,512,1024", "worker counts N, comma-separated");
ABSL_FLAG(int64_t, per_worker_batch, 16, "samples per worker per step (B = this x N)");
ABSL_FLAG(double, gflops, 0, "each worker's GFLOP/s; 0: this host's speed probe");
ABSL_FLAG(int, threads, 1, "compute threads per worker");
ABSL_FLAG(double, link_latency, 50e-6, "seconds per message between workers");
ABSL_FLAG(double, link_bandwidth, 1.25e9, "bytes/s of a link between workers (10 Gbit/s)");
ABSL_FLAG(double, message_cpu, 30e-6, "CPU seconds a worker spends per tensor it moves");
ABSL_FLAG(double, step_overhead, 1.2e-3, "seconds per step outside the action lists");
ABSL_FLAG(std::string, csv, "", "also write the rows to this CSV file");

namespace pipetrain::bench {
namespace {

struct ScalingOptions {
  std::vector<int> workers;       // N, each in [1, 2^20].
  int64_t per_worker_batch = 16;  // >= 1.
  double gflops = 0;              // 0: probe.
  int threads = 1;                // >= 1.
  plan::LinkCosts link;           // checked by the planner.
  double step_overhead = 0;       // >= 0.
  std::string csv;                // empty: none.
};

// The best plan found among a class of plans (unset: none ran).
struct Best {
  bool found = false;
  plan::PlanChoice plan;
  void Offer(const plan::PlanChoice& p) {
    if (!found || p.samples_per_second > plan.samples_per_second) plan = p;
    found = true;
  }
};

// The model's layer costs for micro-batches of `samples` samples, timed once each.
class CostCache {
 public:
  CostCache(const model::Model* net, math::OptimizerConfig optimizer, double gflops, int threads)
      : net_(net), optimizer_(std::move(optimizer)), gflops_(gflops) {
    measure_.threads = threads;
  }
  absl::StatusOr<const plan::ModelCosts*> Get(int64_t samples) {
    auto it = costs_.find(samples);
    if (it == costs_.end()) {
      PT_ASSIGN_OR_RETURN(plan::ModelCosts c,
                          plan::MeasureLayerCosts(*net_, samples, optimizer_, gflops_, measure_));
      it = costs_.emplace(samples, std::move(c)).first;
    }
    return &it->second;
  }

 private:
  const model::Model* net_;
  math::OptimizerConfig optimizer_;
  double gflops_;
  plan::MeasureOptions measure_;
  std::map<int64_t, plan::ModelCosts> costs_;
};

plan::PlannerOptions PlannerFor(const ScalingOptions& o, int n, double gflops) {
  plan::PlannerOptions po;
  po.batch = o.per_worker_batch * n;
  po.workers.assign(n, plan::WorkerResources{"w", gflops, 0});
  po.link = o.link;
  po.threads = o.threads;
  po.step_overhead_seconds = o.step_overhead;
  po.max_replicas = n;
  po.partition_by_layer_costs = true;
  return po;
}

// Every plan of R x S = n workers (see the file comment); the best overall, with R = 1 and S = 1.
absl::Status EvaluateScale(const ScalingOptions& o, int n, int64_t layers, CostCache* cache,
                           double gflops, Best best[3]) {
  const plan::PlannerOptions po = PlannerFor(o, n, gflops);
  for (int r = 1; r <= n; r *= 2) {
    if (n % r != 0 || n / r > layers) continue;
    const int s = n / r;
    for (int j : {1, 2, 4, 8, 16}) {
      const int per_replica = s * j;
      const int64_t m = static_cast<int64_t>(r) * per_replica;
      if (po.batch % m != 0) continue;
      PT_ASSIGN_OR_RETURN(const plan::ModelCosts* costs, cache->Get(po.batch / m));
      for (auto [kind, v] : {std::pair{schedule::ScheduleKind::kOneFOneB, 1},
                             std::pair{schedule::ScheduleKind::kZbH1, 1},
                             std::pair{schedule::ScheduleKind::kInterleaved, 2}}) {
        if (!schedule::CheckScheduleParams({kind, s, per_replica, v}).ok() ||
            !partition::CheckLayersCoverChunks(layers, s, v).ok()) {
          continue;
        }
        PT_ASSIGN_OR_RETURN(const plan::PlanChoice p,
                            plan::EvaluatePlan(plan::LayerPartitionCosts(*costs), *costs, po, s,
                                               kind, v, static_cast<int>(m), r));
        best[0].Offer(p);
        if (r == 1) best[1].Offer(p);
        if (s == 1) best[2].Offer(p);
      }
    }
  }
  return absl::OkStatus();
}

// "1234" or "-" for a class with no plan.
std::string Rate(const Best& b) {
  return b.found ? absl::StrFormat("%.0f", b.plan.samples_per_second) : "-";
}

absl::Status PrintScale(const ScalingOptions& o, int n, const Best best[3], double single,
                        std::ofstream* csv) {
  const plan::PlanChoice& p = best[0].plan;
  const double efficiency = p.samples_per_second / (single * n);
  std::printf("%6d %7lld %4d %4d %-12s %2d %6d %11.0f %9.2f %9.2f %6.1f%% %6.1f%% %11s %11s\n", n,
              static_cast<long long>(o.per_worker_batch * n), p.replicas, p.stages,
              std::string(schedule::ScheduleKindName(p.kind)).c_str(), p.virtual_stages,
              p.microbatches, p.samples_per_second, p.step_seconds * 1e3, p.reduction_seconds * 1e3,
              p.bubble * 100, efficiency * 100, Rate(best[1]).c_str(), Rate(best[2]).c_str());
  if (csv != nullptr && csv->is_open()) {
    *csv << absl::StrCat(n, ",", o.per_worker_batch * n, ",", p.replicas, ",", p.stages, ",",
                         schedule::ScheduleKindName(p.kind), ",", p.virtual_stages, ",",
                         p.microbatches, ",", p.samples_per_second, ",", p.step_seconds, ",",
                         p.reduction_seconds, ",", p.bubble, ",", efficiency, ",", Rate(best[1]),
                         ",", Rate(best[2]), "\n");
  }
  return absl::OkStatus();
}

// One worker on a batch of per_worker_batch samples, one micro-batch: the reference.
absl::StatusOr<double> SingleWorker(const ScalingOptions& o, CostCache* cache, double gflops) {
  PT_ASSIGN_OR_RETURN(const plan::ModelCosts* costs, cache->Get(o.per_worker_batch));
  const plan::PlannerOptions po = PlannerFor(o, 1, gflops);
  PT_ASSIGN_OR_RETURN(const plan::PlanChoice p,
                      plan::EvaluatePlan(plan::LayerPartitionCosts(*costs), *costs, po, 1,
                                         schedule::ScheduleKind::kOneFOneB, 1, 1, 1));
  return p.samples_per_second;
}

absl::Status Run(const ScalingOptions& o, const cli::TrainingOptions& training) {
  PT_ASSIGN_OR_RETURN(math::OptimizerConfig optimizer, cli::OptimizerConfigFor(training));
  PT_ASSIGN_OR_RETURN(cli::TrainingSetup setup,
                      cli::SetUpTrainingFromFile(training.model_path, training.data, "", 1));
  const model::Model& net = *setup.model;
  double gflops = o.gflops;
  if (gflops <= 0) {
    const math::Kernels& kernels = net.kernels();
    PT_ASSIGN_OR_RETURN(const plan::SpeedProbe probe,
                        plan::ProbeSpeed([&kernels] { return kernels.MeasureGemmGflops(0); }));
    gflops = probe.speed;
  }
  CostCache cache(&net, optimizer, gflops, o.threads);
  PT_ASSIGN_OR_RETURN(const double single, SingleWorker(o, &cache, gflops));
  std::printf(
      "scaling_bench: %s, %lld layers, %lld samples per worker per step, workers at %.1f GFLOP/s, "
      "links %.0f us + %.3g B/s, %.0f us CPU per tensor, %.2f ms per step; reference: one "
      "worker %.0f samples/s\n",
      training.model_path.c_str(), static_cast<long long>(net.num_layers()),
      static_cast<long long>(o.per_worker_batch), gflops, o.link.latency_seconds * 1e6,
      o.link.bytes_per_second, o.link.cpu_seconds_per_message * 1e6, o.step_overhead * 1e3, single);
  std::printf("%6s %7s %4s %4s %-12s %2s %6s %11s %9s %9s %7s %7s %11s %11s\n", "N", "B", "R", "S",
              "schedule", "V", "M", "samples/s", "step_ms", "reduce_ms", "bubble", "eff", "R=1 s/s",
              "S=1 s/s");
  std::ofstream csv;
  if (!o.csv.empty()) {
    csv.open(o.csv);
    if (!csv) return absl::InvalidArgumentError(absl::StrCat("--csv ", o.csv, ": cannot write"));
    csv << "workers,batch,replicas,stages,schedule,virtual,microbatches,samples_per_second,"
           "step_seconds,reduction_seconds,bubble,efficiency,pipeline_only,replicas_only\n";
  }
  for (int n : o.workers) {
    Best best[3];
    PT_RETURN_IF_ERROR(EvaluateScale(o, n, net.num_layers(), &cache, gflops, best));
    if (!best[0].found) {
      std::printf("%6d: no plan (needs R x S = N with S <= layers and M dividing B)\n", n);
      continue;
    }
    PT_RETURN_IF_ERROR(PrintScale(o, n, best, single, &csv));
  }
  return absl::OkStatus();
}

absl::StatusOr<ScalingOptions> OptionsFromFlags() {
  ScalingOptions o;
  for (absl::string_view w : absl::StrSplit(absl::GetFlag(FLAGS_workers), ',')) {
    int n = 0;
    if (!absl::SimpleAtoi(w, &n) || n < 1 || n > (1 << 20)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--workers: '", w, "' is not a count in [1, 2^20]"));
    }
    o.workers.push_back(n);
  }
  o.per_worker_batch = absl::GetFlag(FLAGS_per_worker_batch);
  o.gflops = absl::GetFlag(FLAGS_gflops);
  o.threads = absl::GetFlag(FLAGS_threads);
  o.link = {absl::GetFlag(FLAGS_link_latency), absl::GetFlag(FLAGS_link_bandwidth),
            absl::GetFlag(FLAGS_message_cpu)};
  o.step_overhead = absl::GetFlag(FLAGS_step_overhead);
  o.csv = absl::GetFlag(FLAGS_csv);
  if (o.per_worker_batch < 1 || o.per_worker_batch > (1 << 20) || o.threads < 1 ||
      o.threads > 1024 || !(o.gflops >= 0 && o.gflops <= 1e9) ||
      !(o.step_overhead >= 0 && o.step_overhead <= 1e6)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--per-worker-batch must be in [1, 2^20], --threads in [1, 1024], --gflops in [0, 1e9] "
        "and --step-overhead in [0, 1e6] s; got ",
        o.per_worker_batch, ", ", o.threads, ", ", o.gflops, " and ", o.step_overhead));
  }
  return o;
}

}  // namespace
}  // namespace pipetrain::bench

int main(int argc, char** argv) {
  absl::ParseCommandLine(argc, argv);
  absl::StatusOr<pipetrain::bench::ScalingOptions> options = pipetrain::bench::OptionsFromFlags();
  pipetrain::cli::TrainingOptions training;
  training.model_path = absl::GetFlag(FLAGS_model);
  training.data = absl::GetFlag(FLAGS_data);
  training.optimizer = absl::GetFlag(FLAGS_optimizer);
  const absl::Status status =
      options.ok() ? pipetrain::bench::Run(*options, training) : options.status();
  if (!status.ok()) {
    std::fprintf(stderr, "scaling_bench: %s\n", status.ToString().c_str());
    return 1;
  }
  return 0;
}
