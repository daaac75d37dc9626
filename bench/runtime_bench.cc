// Runtime overhead: the measured step time of a real pipeline — a coordinator and S stage_worker
// processes on loopback, driven through the client SDK — over the timed simulator's prediction
// for the same plan replayed with the same measured per-action compute times, for every schedule.
// Compute is emulated at a fixed FLOP rate (stage_worker --emulate-gflops), so the ratio shows
// only what the runtime adds: communication, waiting, the control plane and the optimizer step.
//
// Usage: runtime_bench [GFLOPS_PER_WORKER] (default 1). Prints one line per schedule and the
// ratio measured / predicted (goal <= 1.05).
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

constexpr int kStages = 4;
constexpr int kMicrobatches = 16;
constexpr int kBatch = 64;
constexpr int kSteps = 6;

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

int Run(double gflops) {
  auto spec = model::LoadModelSpecFile(PIPETRAIN_SOURCE_DIR "/examples/deep_mlp.textproto");
  if (!spec.ok()) return 1;
  auto net = model::Model::Build(*spec);
  if (!net.ok()) return 1;
  io::DatasetOptions dopts;
  dopts.input_features = (*net)->input_features();
  dopts.num_classes = (*net)->output_features();
  auto data = io::OpenDataset("synthetic", dopts);
  if (!data.ok()) return 1;
  auto sampler = io::BatchSampler::Create(data->get(), kBatch, 1);
  if (!sampler.ok()) return 1;
  std::vector<io::Batch> batches;
  for (int s = 0; s < kSteps; ++s) batches.push_back(sampler->Next());

  std::printf(
      "runtime overhead: S=%d M=%d B=%d, deep MLP, compute emulated at %.2f GFLOP/s per "
      "worker; measured step / simulated step (same plan, measured action costs)\n",
      kStages, kMicrobatches, kBatch, gflops);
  std::printf("%-12s %12s %14s %8s\n", "schedule", "step_ms", "predicted_ms", "ratio");
  for (const char* kind : {"gpipe", "1f1b", "interleaved", "zb-h1", "zb-v", "dualpipe-v"}) {
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
    for (int w = 0; w < kStages; ++w) {
      cluster.pids.push_back(
          Spawn({PIPETRAIN_STAGE_WORKER, "--coordinator", coordinator, "--listen", "127.0.0.1:0",
                 "--name", absl::StrCat("w", w), "--emulate_gflops", absl::StrCat(gflops)}));
    }
    auto client = client::Client::Connect(coordinator);
    if (!client.ok()) return 1;
    for (int i = 0; i < 1000; ++i) {  // bounded wait for the workers to register (~10 s)
      auto workers = (*client)->ListWorkers();
      if (workers.ok() && static_cast<int>(workers->size()) >= kStages) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    v1::JobSpec job;
    *job.mutable_model() = *spec;
    job.mutable_optimizer()->mutable_sgd()->set_lr(0.01f);
    job.set_schedule(kind);
    job.set_stages(kStages);
    job.set_microbatches(kMicrobatches);
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
    schedule::ScheduleParams params{*parsed, kStages, kMicrobatches,
                                    schedule::DefaultVirtualStages(*parsed)};
    auto plan = schedule::GenerateSchedule(params);
    if (!plan.ok()) return 1;
    std::vector<double> measured, predicted;
    for (int s = 0; s < kSteps; ++s) {
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
    }
    (void)(*session)->Finish();
    std::vector<double> ratios;
    for (size_t i = 0; i < measured.size(); ++i) ratios.push_back(measured[i] / predicted[i]);
    std::sort(ratios.begin(), ratios.end());
    std::sort(measured.begin(), measured.end());
    std::sort(predicted.begin(), predicted.end());
    const size_t mid = ratios.size() / 2;
    std::printf("%-12s %12.1f %14.1f %8.3f\n", kind, measured[mid], predicted[mid], ratios[mid]);
  }
  return 0;
}

}  // namespace
}  // namespace pipetrain

int main(int argc, char** argv) {
  const double gflops = argc > 1 ? std::atof(argv[1]) : 1.0;
  if (!(gflops > 0)) {
    std::fprintf(stderr, "usage: runtime_bench [GFLOPS_PER_WORKER > 0]\n");
    return 2;
  }
  return pipetrain::Run(gflops);
}
