// Runtime overhead: the measured step time of a real pipeline — a coordinator and S stage_worker
// processes on loopback, driven through the client SDK — over the timed simulator's prediction
// for the same plan replayed with the same measured per-action compute times, for every schedule.
//
// Two modes:
//   runtime_bench [GFLOPS_PER_WORKER]  (default 1) S=4, M=16, B=64; compute is emulated at a fixed
//       FLOP rate (stage_worker --emulate-gflops), so the ratio shows only what the runtime adds:
//       communication, waiting, the control plane and the optimizer step. Goal <= 1.05.
//   runtime_bench --real               S=2, M=8, B=256; real compute (one thread per worker), the
//       deep MLP as users run it. Goal <= 1.10.
// Prints one line per schedule: the measured and predicted step (medians of steps 2..), their
// ratio, and what the difference is made of (see Breakdown).
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "client/sdk/client.h"
#include "common/io/dataset.h"
#include "common/model/model.h"
#include "common/schedule/generator.h"
#include "common/schedule/simulator.h"

extern char** environ;

namespace pipetrain {
namespace {

// One configuration of the bench.
struct BenchConfig {
  int stages = 4;
  int microbatches = 16;
  int batch = 64;
  int steps = 6;        // the first is a warm-up (links open) and not counted.
  double gflops = 1.0;  // emulated GFLOP/s per worker; 0: real compute.
};

pid_t Spawn(const std::vector<std::string>& args) {
  std::vector<char*> argv;
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  pid_t pid = -1;
  if (posix_spawn(&pid, argv[0], nullptr, nullptr, argv.data(), environ) != 0) return -1;
  return pid;
}

// Polls `path` until it holds a port number (bounded: ~10 s).
int ReadPortFile(const std::string& path) {
  for (int i = 0; i < 1000; ++i) {
    std::ifstream f(path);
    int port = 0;
    if (f >> port && port > 0) return port;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return -1;
}

struct Cluster {
  std::vector<pid_t> pids;
  ~Cluster() {
    for (pid_t p : pids) kill(p, SIGTERM);
    for (pid_t p : pids) waitpid(p, nullptr, 0);
  }
};

// The simulator's makespan (µs) of `plan` with each action's measured compute time (its
// duration minus the time it waited for inputs), i.e. the step time of a runtime that adds
// nothing to the schedule.
absl::StatusOr<double> PredictedMakespanUs(const schedule::Plan& plan,
                                           const v1::StepResult& result) {
  schedule::CostModel costs = schedule::UniformCostModel(plan.placement, {});
  costs.action_durations.resize(plan.stages());
  for (const v1::WorkerTimeline& w : result.workers()) {
    if (w.rank() < 0 || w.rank() >= plan.stages()) return absl::InternalError("bad rank");
    auto& d = costs.action_durations[w.rank()];
    for (const v1::ActionTiming& t : w.timings()) {
      d.push_back(std::max(0.0, t.end_us() - t.start_us() - t.wait_us()));
    }
  }
  auto sim = schedule::Simulate(plan, costs);
  if (!sim.ok()) return sim.status();
  return sim->stats.makespan;
}

// Where a measured step's time goes beyond the workers' action timelines (µs, one step).
struct Breakdown {
  double outside_us = 0;      // step_ms minus the latest action end over the workers: the
                              // coordinator's round trips (RunStep, StepDone, Commit), batch
                              // validation and feeding, and the optimizer update after Commit.
  double gap_per_action = 0;  // mean time between a worker's actions (and before its first)
                              // that is neither compute nor a wait for inputs: dispatch, mailbox
                              // and thread wake-ups.
  double timeline_us = 0;     // the latest action end over the workers.
};

Breakdown BreakDown(const v1::StepResult& result) {
  Breakdown b;
  double gaps = 0;
  int64_t actions = 0;
  for (const v1::WorkerTimeline& w : result.workers()) {
    double prev_end = 0;
    for (const v1::ActionTiming& t : w.timings()) {
      gaps += std::max(0.0, t.start_us() - prev_end);
      prev_end = t.end_us();
      ++actions;
    }
    b.timeline_us = std::max(b.timeline_us, prev_end);
  }
  b.outside_us = result.step_ms() * 1000.0 - b.timeline_us;
  b.gap_per_action = actions > 0 ? gaps / static_cast<double>(actions) : 0.0;
  return b;
}

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

int Run(const BenchConfig& config) {
  const int stages = config.stages, microbatches = config.microbatches;
  auto spec = model::LoadModelSpecFile(PIPETRAIN_SOURCE_DIR "/examples/deep_mlp.textproto");
  if (!spec.ok()) return 1;
  auto net = model::Model::Build(*spec);
  if (!net.ok()) return 1;
  io::DatasetOptions dopts;
  dopts.input_features = (*net)->input_features();
  dopts.num_classes = (*net)->output_features();
  auto data = io::OpenDataset("synthetic", dopts);
  if (!data.ok()) return 1;
  auto sampler = io::BatchSampler::Create(data->get(), config.batch, 1);
  if (!sampler.ok()) return 1;
  std::vector<io::Batch> batches;
  for (int s = 0; s < config.steps; ++s) batches.push_back(sampler->Next());

  const std::string compute =
      config.gflops > 0 ? absl::StrCat("compute emulated at ", config.gflops, " GFLOP/s per worker")
                        : std::string("real compute, 1 thread per worker");
  std::printf(
      "runtime overhead: S=%d M=%d B=%d, deep MLP, %s; measured step / simulated step (same "
      "plan, measured action costs), medians of steps 2..%d\n",
      stages, microbatches, config.batch, compute.c_str(), config.steps);
  std::printf("%-12s %10s %13s %7s %14s %12s %13s\n", "schedule", "step_ms", "predicted_ms",
              "ratio", "timeline_extra", "outside_us", "gap_us/action");
  for (const char* kind : {"gpipe", "1f1b", "interleaved", "zb-h1", "zb-v", "dualpipe-v",
                           "1f1b-overlap", "interleaved-overlap"}) {
    Cluster cluster;
    const std::string port_file =
        absl::StrCat("/tmp/pipetrain_runtime_bench_", getpid(), "_", kind, ".port");
    unlink(port_file.c_str());
    cluster.pids.push_back(
        Spawn({PIPETRAIN_COORDINATOR, "--listen", "127.0.0.1:0", "--port_file", port_file}));
    const int port = ReadPortFile(port_file);
    unlink(port_file.c_str());
    if (port < 0) {
      std::fprintf(stderr, "coordinator did not start\n");
      return 1;
    }
    const std::string coordinator = absl::StrCat("127.0.0.1:", port);
    for (int w = 0; w < stages; ++w) {
      std::vector<std::string> args = {
          PIPETRAIN_STAGE_WORKER, "--coordinator", coordinator,         "--listen",
          "127.0.0.1:0",          "--name",        absl::StrCat("w", w)};
      if (config.gflops > 0) {
        args.insert(args.end(), {"--emulate_gflops", absl::StrCat(config.gflops)});
      }
      cluster.pids.push_back(Spawn(args));
    }
    auto client = client::Client::Connect(coordinator);
    if (!client.ok()) return 1;
    for (int i = 0; i < 1000; ++i) {  // bounded wait for the workers to register (~10 s)
      auto workers = (*client)->ListWorkers();
      if (workers.ok() && static_cast<int>(workers->size()) >= stages) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    v1::JobSpec job;
    *job.mutable_model() = *spec;
    job.mutable_optimizer()->mutable_sgd()->set_lr(0.01f);
    job.set_schedule(kind);
    job.set_stages(stages);
    job.set_microbatches(microbatches);
    job.set_seed(1);
    job.set_threads(1);
    auto status = (*client)->CreateJob(job);
    if (!status.ok()) {
      std::fprintf(stderr, "%s: %s\n", kind, std::string(status.status().message()).c_str());
      return 1;
    }
    auto session = (*client)->StartTraining(status->job());
    if (!session.ok()) return 1;
    auto parsed = schedule::ParseScheduleKind(kind);
    schedule::ScheduleParams params{*parsed, stages, microbatches,
                                    schedule::DefaultVirtualStages(*parsed)};
    auto plan = schedule::GenerateSchedule(params);
    if (!plan.ok()) return 1;
    std::vector<double> measured, predicted, ratios, extra, outside, gaps;
    for (int s = 0; s < config.steps; ++s) {
      client::BatchView view{&batches[s].inputs, &batches[s].targets, batches[s].samples};
      auto r = (*session)->Step(view);
      if (!r.ok()) {
        std::fprintf(stderr, "%s step %d: %s\n", kind, s,
                     std::string(r.status().message()).c_str());
        return 1;
      }
      auto p = PredictedMakespanUs(*plan, *r);
      if (!p.ok()) {
        std::fprintf(stderr, "%s: %s\n", kind, std::string(p.status().message()).c_str());
        return 1;
      }
      if (s == 0) continue;  // warm-up: links open at the first step
      measured.push_back(r->step_ms());
      predicted.push_back(*p / 1000.0);
      ratios.push_back(r->step_ms() * 1000.0 / *p);
      const Breakdown b = BreakDown(*r);
      extra.push_back(b.timeline_us - *p);
      outside.push_back(b.outside_us);
      gaps.push_back(b.gap_per_action);
    }
    (void)(*session)->Finish();
    std::printf("%-12s %10.1f %13.1f %7.3f %14.0f %12.0f %13.1f\n", kind, Median(measured),
                Median(predicted), Median(ratios), Median(extra), Median(outside), Median(gaps));
  }
  return 0;
}

}  // namespace
}  // namespace pipetrain

int main(int argc, char** argv) {
  pipetrain::BenchConfig config;
  if (argc > 1 && std::string(argv[1]) == "--real") {
    config.stages = 2;
    config.microbatches = 8;
    config.batch = 256;
    config.steps = 8;
    config.gflops = 0;
  } else {
    config.gflops = argc > 1 ? std::atof(argv[1]) : 1.0;
    if (!(config.gflops > 0)) {
      std::fprintf(stderr, "usage: runtime_bench [GFLOPS_PER_WORKER > 0 | --real]\n");
      return 2;
    }
  }
  return pipetrain::Run(config);
}
