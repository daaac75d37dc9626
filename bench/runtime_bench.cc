// Runtime overhead: the measured step time of a real pipeline — a coordinator and S stage worker
// processes on loopback, driven through the client SDK with two batches in flight as `pipetrain
// train` keeps them — over the timed simulator's replay of the same plan with the same measured
// per-action compute times, for every schedule the workers run; and the runtime's fixed costs in
// microseconds (per action, per tensor, per step).
//
// Two modes:
//   runtime_bench [GFLOPS_PER_WORKER]  (default 1) S=4, M=16, B=64; every worker emulates a fixed
//       FLOP rate (stage_worker --emulate-gflops), so the ratio shows only what the runtime adds.
//       Goal <= 1.05.
//   runtime_bench --real [--stages 2|4]  (default: both) the deep MLP, B=256, one compute thread
//       per worker, goal <= 1.10. S=2, M=8: two workers on real compute. S=4, M=8 and M=16:
//       ranks 0 and 1 on real compute, ranks 2 and 3 emulated (the machine has two cores). Before
//       each configuration a 1F1B calibration job with its M on two stock stage_workers measures
//       the rate R (model FLOPs / compute time) real compute reaches on the model; at S=4 a second
//       one measures what the real ranks reach next to the emulated ones. The real-compute workers
//       are runtime_bench_worker processes (the stage worker daemon) registering R, the emulated
//       ones run at R/3 and register that: the coordinator's speed-weighted partition then makes
//       every stage take about as long, the emulated ranks holding a third of a real rank's FLOPs
//       (their math still runs: a third of the CPU over their busy time). See
//       docs/performance.md "On real compute".
// Prints markdown tables per configuration (docs/perf-log/ keeps them as they are): the
// step, the replay, their ratio, the simulator's ideal step for the measured compute, each
// schedule's step and ideal relative to 1F1B; then the fixed costs (see StepFigures). Daemon
// logs go to a file named at the start.
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "client/sdk/client.h"
#include "common/io/dataset.h"
#include "common/model/model.h"
#include "common/schedule/generator.h"
#include "common/schedule/simulator.h"
#include "common/util/cpu_set.h"
#include "common/util/status_macros.h"

extern char** environ;

namespace pipetrain {
namespace {

constexpr double kNone = std::numeric_limits<double>::quiet_NaN();

// runtime_bench --real at S=4: the emulated ranks' rate as a share of the calibrated real rate.
// The partition gives them that share of a real rank's FLOPs for the same stage time, and their
// math (which still runs) takes that share of the CPU over their busy time. A third: the deep
// MLP's 512x512 Linears split 6/6/2/2 (`pipetrain partition --speeds 3,3,1,1`: imbalance
// 1.02-1.03 on every placement); a quarter rounds to 7/7/1/1 (imbalance 1.29, the emulated
// stages ~40% shorter than the real ones).
constexpr double kEmulatedRateShare = 1.0 / 3.0;

// Which workers a cluster runs: ranks [0, real_workers) compute for real, the others emulate.
struct ClusterSpec {
  int stages = 2;
  int real_workers = 2;
  // > 0: the real workers are runtime_bench_worker processes registering this GFLOP/s; 0: stock
  // stage_workers registering their sgemm probe.
  double real_gflops = 0;
  double emulated_gflops = 0;  // the emulated ranks' rate (stage_worker --emulate-gflops).
};

// One configuration of the bench.
struct BenchConfig {
  ClusterSpec cluster;
  int microbatches = 8;
  int batch = 256;
  int steps = 16;  // the first is a warm-up (links open) and not counted.
};

// A step's figures (µs unless said otherwise). Worker clocks start at each worker's receipt of
// RunStep; figures that compare two workers' clocks say how they cancel the offset.
struct StepFigures {
  double step_ms = 0;      // the coordinator's step time (StepResult.step_ms).
  double replay_ms = 0;    // the simulator's replay of the plan with the measured action costs.
  double ideal_units = 0;  // the simulator's step with uniform costs (F=1, B=2 per stage).
  double ideal_ms = 0;     // ideal_units scaled to this step's compute: the ideal step of a
                           // perfectly balanced partition with free messages, each rank
                           // computing the mean busy time (a stage's F+B over M micro-batches
                           // is 3M units).
  double timeline_us = 0;  // latest action end over the workers.
  double extra_us = 0;     // timeline_us - replay: what the runtime adds inside the timelines.
  double outside_us = 0;   // step - timeline_us: RunStep fan-out, StepDone -> Commit ->
                           // Committed, the optimizer, feeding and validating the batch.
  double gap_us = kNone;   // per action on the real-compute ranks: from the end of the previous
                           // action (or the step start) to its start: dispatch, mailbox, wake-up.
  double send_us = kNone;  // per tensor between stages: the send span (handed to the link ->
                           // last write completed).
  double recv_us = kNone;  // per tensor between stages: the receive span (first fragment ->
                           // reassembled, before the mailbox).
  double latency_us = kNone;    // per tensor: receiver's receive end - sender's send start,
                                // averaged over both directions of each pair of ranks ((d_AB +
                                // d_BA) / 2: the clock offset cancels), then over the pairs.
  double messages_us = kNone;   // the replay with latency_us on every message minus the
                                // replay: what the transfers cost on the critical path.
  double real_gflops = kNone;   // model FLOPs / compute time over the real-compute ranks.
  double update_us = 0;         // the longest optimizer update before the step over the workers
                                // (WorkerTimeline.update_us): compute outside the timelines.
  std::vector<double> busy_ms;  // per rank: compute (action time minus input waits).
};

// The kind's medians over the counted steps, or why it did not run.
struct KindResult {
  std::string kind;
  std::string skipped;  // non-empty: the reason it did not run.
  StepFigures median;
  double ratio = 0;  // median of per-step step / replay.
};

double Median(std::vector<double> v) {
  v.erase(std::remove_if(v.begin(), v.end(), [](double x) { return std::isnan(x); }), v.end());
  if (v.empty()) return kNone;
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double Mean(double sum, int64_t count) {
  return count > 0 ? sum / static_cast<double>(count) : kNone;
}

// Starts `args` with stdout and stderr appended to `log`; the child's PID or -1.
pid_t Spawn(const std::vector<std::string>& args, const std::string& log) {
  std::vector<char*> argv;
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  posix_spawn_file_actions_t files;
  posix_spawn_file_actions_init(&files);
  posix_spawn_file_actions_addopen(&files, STDOUT_FILENO, log.c_str(),
                                   O_WRONLY | O_CREAT | O_APPEND, 0644);
  posix_spawn_file_actions_adddup2(&files, STDOUT_FILENO, STDERR_FILENO);
  pid_t pid = -1;
  const int rc = posix_spawn(&pid, argv[0], &files, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&files);
  return rc == 0 ? pid : -1;
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

std::string LoadAverage() {
  std::ifstream f("/proc/loadavg");
  double a = 0, b = 0, c = 0;
  if (!(f >> a >> b >> c)) return "?";
  return absl::StrFormat("%.2f %.2f %.2f", a, b, c);
}

// A coordinator and its workers on loopback with a connected client; the processes (started
// here, signalled by PID) stop when it is destroyed. Not thread-safe.
class Cluster {
 public:
  // Starts the coordinator, then the real-compute workers ("real<r>"), waits until they have
  // registered (ranks follow registration order), then the emulated ones ("emul<r>").
  // UNAVAILABLE if a process does not start or register within ~10 s each.
  static absl::StatusOr<std::unique_ptr<Cluster>> Start(const ClusterSpec& spec,
                                                        const std::string& log) {
    auto cluster = std::unique_ptr<Cluster>(new Cluster());
    const std::string port_file = absl::StrCat("/tmp/pipetrain_runtime_bench_", getpid(), ".port");
    unlink(port_file.c_str());
    cluster->Add(Spawn(
        {PIPETRAIN_COORDINATOR_BINARY, "--listen", "127.0.0.1:0", "--port_file", port_file}, log));
    const int port = ReadPortFile(port_file);
    unlink(port_file.c_str());
    if (port < 0) return absl::UnavailableError("the coordinator did not start (see " + log + ")");
    const std::string address = absl::StrCat("127.0.0.1:", port);
    PT_ASSIGN_OR_RETURN(cluster->client_, client::Client::Connect(address));
    // The real-compute workers on CPUs of their own, as `pipetrain local` runs them (one thread
    // each); the emulated ones float.
    const std::vector<std::vector<int>> cpus =
        util::CpuGroups(util::AllowedCpus(), spec.real_workers, 1);
    for (int r = 0; r < spec.stages; ++r) {
      std::vector<std::string> args;
      if (r >= spec.real_workers) {
        args = {PIPETRAIN_STAGE_WORKER,
                "--coordinator",
                address,
                "--name",
                absl::StrCat("emul", r),
                "--emulate_gflops",
                absl::StrCat(spec.emulated_gflops)};
      } else if (spec.real_gflops > 0) {
        args = {PIPETRAIN_BENCH_WORKER, address, absl::StrCat("real", r),
                absl::StrCat(spec.real_gflops)};
        if (!cpus.empty()) args.push_back(util::FormatCpuList(cpus[r]));
      } else {
        args = {PIPETRAIN_STAGE_WORKER, "--coordinator", address, "--name",
                absl::StrCat("real", r)};
        if (!cpus.empty()) args.push_back("--cpus=" + util::FormatCpuList(cpus[r]));
      }
      cluster->Add(Spawn(args, log));
      if (r + 1 == spec.real_workers || r + 1 == spec.stages) {
        PT_RETURN_IF_ERROR(cluster->AwaitWorkers(r + 1, log));
      }
    }
    return cluster;
  }

  ~Cluster() {
    for (pid_t p : pids_) kill(p, SIGTERM);
    for (pid_t p : pids_) waitpid(p, nullptr, 0);
  }
  Cluster(const Cluster&) = delete;
  Cluster& operator=(const Cluster&) = delete;

  client::Client& client() { return *client_; }

 private:
  Cluster() = default;
  void Add(pid_t pid) {
    if (pid > 0) pids_.push_back(pid);
  }
  absl::Status AwaitWorkers(int count, const std::string& log) {
    for (int i = 0; i < 1000; ++i) {  // bounded: ~10 s
      auto workers = client_->ListWorkers();
      if (workers.ok() && static_cast<int>(workers->size()) >= count) return absl::OkStatus();
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return absl::UnavailableError(
        absl::StrCat(count, " workers did not register within 10 s (see ", log, ")"));
  }

  std::vector<pid_t> pids_;
  std::unique_ptr<client::Client> client_;
};

// What a job's actions compute: FLOPs per action as the emulation counts them (docs/worker.md
// "--emulate-gflops": the chunk's layers' Layer::Flops for the micro-batch's rows).
class ActionFlops {
 public:
  ActionFlops(const model::Model& net, const v1::JobStatus& job, int64_t rows) {
    for (const v1::StageStatus& stage : job.stages()) {
      for (const v1::ChunkSpec& c : stage.chunks()) {
        if (c.chunk() < 0) continue;
        if (static_cast<size_t>(c.chunk()) >= chunks_.size()) chunks_.resize(c.chunk() + 1);
        math::FlopCount& sum = chunks_[c.chunk()];
        for (int64_t l = c.first_layer(); l < c.last_layer() && l < net.num_layers(); ++l) {
          const math::FlopCount f = net.layer(l).Flops(rows);
          sum.forward += f.forward;
          sum.backward_input += f.backward_input;
          sum.backward_weight += f.backward_weight;
        }
      }
    }
  }
  double Of(const v1::Action& a) const {
    if (a.chunk() < 0 || static_cast<size_t>(a.chunk()) >= chunks_.size()) return 0;
    const math::FlopCount& f = chunks_[a.chunk()];
    switch (a.op()) {
      case v1::ACTION_OP_FORWARD:
        return f.forward;
      case v1::ACTION_OP_BACKWARD:
        return f.backward_input + f.backward_weight;
      case v1::ACTION_OP_INPUT_GRAD:
        return f.backward_input;
      case v1::ACTION_OP_WEIGHT_GRAD:
        return f.backward_weight;
      default:
        return 0;
    }
  }

 private:
  std::vector<math::FlopCount> chunks_;  // [chunk] FLOPs of one micro-batch.
};

double ComputeUs(const v1::ActionTiming& t) {
  return std::max(0.0, t.end_us() - t.start_us() - t.wait_us());
}

// The simulator's makespan (µs) of `plan` with each action's measured compute time (its
// duration minus the time it waited for inputs) and `message_us` per message between workers:
// with 0, the step of a runtime that adds nothing.
absl::StatusOr<double> ReplayUs(const schedule::Plan& plan, const v1::StepResult& result,
                                double message_us) {
  schedule::CostModel costs = schedule::UniformCostModel(plan.placement, {});
  costs.link.latency = message_us;
  costs.action_durations.resize(plan.stages());
  costs.action_output_times.resize(plan.stages());
  costs.worker_start.assign(plan.stages(), 0.0);
  for (const v1::WorkerTimeline& w : result.workers()) {
    if (w.rank() < 0 || w.rank() >= plan.stages()) {
      return absl::InternalError(
          absl::StrCat("the step result names rank ", w.rank(), " of ", plan.stages()));
    }
    auto& d = costs.action_durations[w.rank()];
    auto& o = costs.action_output_times[w.rank()];
    for (const v1::ActionTiming& t : w.timings()) {
      d.push_back(ComputeUs(t));
      // A B hands on its input gradient before it adds its weight gradients (output_us).
      const double output =
          t.output_us() > 0 ? t.output_us() - t.start_us() - t.wait_us() : d.back();
      o.push_back(std::clamp(output, 0.0, d.back()));
    }
    // The optimizer update before the step is the worker's compute, not the runtime's: the
    // replay starts the worker's actions after it, every worker's update starting with the step.
    // (Not the first action's start_us: each worker's clock starts at its own receipt of
    // RunStep, which a worker busy with its update at Commit sees later than one that deferred
    // its update to the RunStep; one clock's offset must not count as another's delay.)
    costs.worker_start[w.rank()] = std::max(0.0, w.update_us());
  }
  PT_ASSIGN_OR_RETURN(schedule::SimulationResult sim, schedule::Simulate(plan, costs));
  return sim.stats.makespan;
}

// Rank of a "stage/<rank>" peer, or -1.
int PeerRank(const std::string& peer) {
  int rank = -1;
  if (!absl::StartsWith(peer, "stage/") || !absl::SimpleAtoi(peer.substr(6), &rank)) return -1;
  return rank;
}

// The link figures of StepFigures from every rank's LinkSpans.
void LinkFigures(const v1::StepResult& result, StepFigures* f) {
  using Key = std::tuple<int, int, int, int, int>;  // (from, to, kind, micro-batch, chunk)
  std::map<Key, double> send_start;
  double send = 0, recv = 0;
  int64_t sends = 0, recvs = 0;
  for (const v1::WorkerTimeline& w : result.workers()) {
    for (const v1::LinkSpan& s : w.links()) {
      const int peer = PeerRank(s.peer());
      if (peer < 0) continue;  // the coordinator's inputs and targets.
      if (s.direction() == v1::LINK_DIRECTION_SEND && s.complete()) {
        send += s.end_us() - s.start_us();
        ++sends;
        send_start[Key{w.rank(), peer, s.kind(), s.microbatch(), s.chunk()}] = s.start_us();
      } else if (s.direction() == v1::LINK_DIRECTION_RECEIVE) {
        recv += s.end_us() - s.start_us();
        ++recvs;
      }
    }
  }
  f->send_us = Mean(send, sends);
  f->recv_us = Mean(recv, recvs);
  // d[(A, B)]: mean of (B's receive end - A's send start) over the tensors A sent B.
  std::map<std::pair<int, int>, std::pair<double, int64_t>> d;
  for (const v1::WorkerTimeline& w : result.workers()) {
    for (const v1::LinkSpan& s : w.links()) {
      const int peer = PeerRank(s.peer());
      if (peer < 0 || s.direction() != v1::LINK_DIRECTION_RECEIVE) continue;
      auto it = send_start.find(Key{peer, w.rank(), s.kind(), s.microbatch(), s.chunk()});
      if (it == send_start.end()) continue;
      auto& [sum, n] = d[{peer, w.rank()}];
      sum += s.end_us() - it->second;
      ++n;
    }
  }
  double pairs_sum = 0;
  int pairs = 0;
  for (const auto& [ab, stat] : d) {
    if (ab.first >= ab.second) continue;
    auto ba = d.find({ab.second, ab.first});
    if (ba == d.end()) continue;
    pairs_sum += (Mean(stat.first, stat.second) + Mean(ba->second.first, ba->second.second)) / 2;
    ++pairs;
  }
  f->latency_us = Mean(pairs_sum, pairs);
}

absl::StatusOr<StepFigures> Figures(const schedule::Plan& plan, const v1::StepResult& result,
                                    const ActionFlops& flops, int real_workers,
                                    double ideal_units) {
  StepFigures f;
  f.step_ms = result.step_ms();
  PT_ASSIGN_OR_RETURN(const double replay_us, ReplayUs(plan, result, 0));
  f.replay_ms = replay_us / 1000.0;
  f.ideal_units = ideal_units;
  f.busy_ms.assign(plan.stages(), 0.0);
  double gaps = 0, real_flops = 0, real_us = 0;
  int64_t actions = 0;
  for (const v1::WorkerTimeline& w : result.workers()) {
    // A rank that deferred its update applied it after its clock started: not a gap.
    double prev_end =
        w.timings_size() > 0 && w.timings(0).start_us() >= w.update_us() ? w.update_us() : 0;
    for (const v1::ActionTiming& t : w.timings()) {
      if (w.rank() < real_workers) {
        gaps += std::max(0.0, t.start_us() - prev_end);
        ++actions;
        real_flops += flops.Of(t.action());
        real_us += ComputeUs(t);
      }
      if (w.rank() >= 0 && w.rank() < plan.stages()) f.busy_ms[w.rank()] += ComputeUs(t) / 1000;
      prev_end = t.end_us();
    }
    f.update_us = std::max(f.update_us, w.update_us());
    f.timeline_us = std::max(f.timeline_us, prev_end);
  }
  double busy_sum = 0;
  for (double b : f.busy_ms) busy_sum += b;
  f.ideal_ms = ideal_units * busy_sum / plan.stages() / (3.0 * plan.microbatches);
  f.extra_us = f.timeline_us - replay_us;
  f.outside_us = f.step_ms * 1000.0 - f.timeline_us;
  f.gap_us = Mean(gaps, actions);
  f.real_gflops = real_us > 0 ? real_flops / real_us / 1e3 : kNone;
  LinkFigures(result, &f);
  if (!std::isnan(f.latency_us)) {
    PT_ASSIGN_OR_RETURN(const double with_messages, ReplayUs(plan, result, f.latency_us));
    f.messages_us = with_messages - replay_us;
  }
  return f;
}

// The simulator's step for `plan` with uniform costs (per stage F=1, B=2, I=W=1; chunks share
// them by V): the schedule's ideal, free of this machine's costs and of the partition.
absl::StatusOr<double> IdealUnits(const schedule::Plan& plan) {
  PT_ASSIGN_OR_RETURN(schedule::SimulationResult sim,
                      schedule::Simulate(plan, schedule::UniformCostModel(plan.placement, {})));
  return sim.stats.makespan;
}

// The bench's inputs: the deep MLP and `steps` batches of synthetic data.
struct Workload {
  v1::ModelSpec spec;
  std::unique_ptr<model::Model> net;
  std::vector<io::Batch> batches;
};

absl::StatusOr<Workload> LoadWorkload(const BenchConfig& config) {
  Workload w;
  PT_ASSIGN_OR_RETURN(
      w.spec, model::LoadModelSpecFile(PIPETRAIN_SOURCE_DIR "/examples/deep_mlp.textproto"));
  PT_ASSIGN_OR_RETURN(w.net, model::Model::Build(w.spec));
  io::DatasetOptions dopts;
  dopts.input_features = w.net->input_features();
  dopts.num_classes = w.net->output_features();
  PT_ASSIGN_OR_RETURN(std::unique_ptr<io::Dataset> data, io::OpenDataset("synthetic", dopts));
  PT_ASSIGN_OR_RETURN(io::BatchSampler sampler,
                      io::BatchSampler::Create(data.get(), config.batch, 1));
  for (int s = 0; s < config.steps; ++s) w.batches.push_back(sampler.Next());
  return w;
}

// Runs `kind` on a fresh cluster for config.steps steps; medians of steps 2.. .
absl::StatusOr<KindResult> RunKind(const BenchConfig& config, const Workload& work,
                                   const std::string& kind, const std::string& log) {
  KindResult out;
  out.kind = kind;
  const ClusterSpec& cs = config.cluster;
  PT_ASSIGN_OR_RETURN(schedule::ScheduleKind parsed, schedule::ParseScheduleKind(kind));
  const schedule::ScheduleParams params{parsed, cs.stages, config.microbatches,
                                        schedule::DefaultVirtualStages(parsed)};
  if (absl::Status s = schedule::CheckScheduleParams(params); !s.ok()) {
    out.skipped = std::string(s.message());
    return out;
  }
  PT_ASSIGN_OR_RETURN(schedule::Plan plan, schedule::GenerateSchedule(params));
  PT_ASSIGN_OR_RETURN(const double ideal, IdealUnits(plan));
  PT_ASSIGN_OR_RETURN(std::unique_ptr<Cluster> cluster, Cluster::Start(cs, log));
  v1::JobSpec job;
  *job.mutable_model() = work.spec;
  job.mutable_optimizer()->mutable_sgd()->set_lr(0.01f);
  job.set_schedule(kind);
  job.set_stages(cs.stages);
  job.set_microbatches(config.microbatches);
  job.set_seed(1);
  job.set_threads(1);
  PT_ASSIGN_OR_RETURN(v1::JobStatus status, cluster->client().CreateJob(job));
  for (int r = 0; r < status.stages_size(); ++r) {  // ranks follow registration order
    const char* want = r < cs.real_workers ? "real" : "emul";
    if (!absl::StartsWith(status.stages(r).worker(), want)) {
      return absl::FailedPreconditionError(absl::StrCat(kind, ": rank ", r, " went to worker '",
                                                        status.stages(r).worker(), "', not a ",
                                                        want, "* one"));
    }
  }
  const ActionFlops flops(*work.net, status, config.batch / config.microbatches);
  PT_ASSIGN_OR_RETURN(std::unique_ptr<client::TrainSession> session,
                      cluster->client().StartTraining(status.job()));
  std::vector<StepFigures> steps;
  std::vector<double> ratios;
  auto view = [&work](int s) {
    const io::Batch& b = work.batches[s];
    return client::BatchView{&b.inputs, &b.targets, b.samples};
  };
  // Two batches in flight, as `pipetrain train` and `local` keep them: each result is read after
  // the next batch is sent, so the step-to-step path measured is the product's (the next step
  // starts as soon as this one's Commit is sent; docs/architecture.md, step 5).
  PT_RETURN_IF_ERROR(session->Send(view(0)));
  for (int s = 0; s < config.steps; ++s) {
    if (s + 1 < config.steps) PT_RETURN_IF_ERROR(session->Send(view(s + 1)));
    PT_ASSIGN_OR_RETURN(v1::StepResult r, session->Receive());
    PT_ASSIGN_OR_RETURN(StepFigures f, Figures(plan, r, flops, cs.real_workers, ideal));
    if (s == 0) continue;  // warm-up: links open at the first step
    ratios.push_back(f.step_ms / f.replay_ms);
    steps.push_back(std::move(f));
  }
  (void)session->Finish();
  out.ratio = Median(ratios);
  // Medians field by field.
  auto med = [&](double StepFigures::*field) {
    std::vector<double> v;
    for (const StepFigures& f : steps) v.push_back(f.*field);
    return Median(v);
  };
  StepFigures& m = out.median;
  for (double StepFigures::*field :
       {&StepFigures::step_ms, &StepFigures::replay_ms, &StepFigures::ideal_units,
        &StepFigures::ideal_ms, &StepFigures::timeline_us, &StepFigures::extra_us,
        &StepFigures::outside_us, &StepFigures::gap_us, &StepFigures::send_us,
        &StepFigures::recv_us, &StepFigures::latency_us, &StepFigures::messages_us,
        &StepFigures::real_gflops, &StepFigures::update_us}) {
    m.*field = med(field);
  }
  m.busy_ms.assign(cs.stages, 0.0);
  for (int r = 0; r < cs.stages; ++r) {
    std::vector<double> v;
    for (const StepFigures& f : steps) v.push_back(f.busy_ms[r]);
    m.busy_ms[r] = Median(v);
  }
  return out;
}

std::string Num(double v, int decimals) {
  return std::isnan(v) ? std::string("-") : absl::StrFormat("%.*f", decimals, v);
}

// The schedules jobs can run, in the CLI's order (dualpipe is simulated only).
std::vector<std::string> ExecutableKinds() {
  std::vector<std::string> kinds;
  for (schedule::ScheduleKind k : schedule::kAllScheduleKinds) {
    if (schedule::CheckExecutable(k).ok()) kinds.emplace_back(schedule::ScheduleKindName(k));
  }
  return kinds;
}

std::string Describe(const BenchConfig& c) {
  const ClusterSpec& cs = c.cluster;
  std::string who;
  if (cs.real_workers == 0) {
    who = absl::StrFormat("every rank emulated at %g GFLOP/s", cs.emulated_gflops);
  } else {
    who = absl::StrFormat("ranks 0-%d real compute (1 thread, %s)", cs.real_workers - 1,
                          cs.real_gflops > 0
                              ? absl::StrFormat("registering %.1f GFLOP/s", cs.real_gflops)
                              : std::string("registering the sgemm probe"));
    if (cs.stages > cs.real_workers) {
      absl::StrAppendFormat(&who, ", ranks %d-%d emulated at %.1f GFLOP/s", cs.real_workers,
                            cs.stages - 1, cs.emulated_gflops);
    }
  }
  return absl::StrFormat("S=%d M=%d B=%d, deep MLP, SGD; %s; medians of steps 2-%d", cs.stages,
                         c.microbatches, c.batch, who, c.steps);
}

// Runs every executable kind under `config` and prints the two tables. False on an error.
bool RunAndPrint(const BenchConfig& config, const std::string& log) {
  const std::string load_before = LoadAverage();
  absl::StatusOr<Workload> work = LoadWorkload(config);
  if (!work.ok()) {
    std::fprintf(stderr, "runtime_bench: %s\n", work.status().ToString().c_str());
    return false;
  }
  std::vector<KindResult> results;
  for (const std::string& kind : ExecutableKinds()) {
    absl::StatusOr<KindResult> r = RunKind(config, *work, kind, log);
    if (!r.ok()) {
      std::fprintf(stderr, "runtime_bench: %s: %s\n", kind.c_str(), r.status().ToString().c_str());
      return false;
    }
    results.push_back(*std::move(r));
  }
  const KindResult* base = nullptr;
  for (const KindResult& r : results) {
    if (r.kind == "1f1b" && r.skipped.empty()) base = &r;
  }
  std::printf("\n%s\nload average %s before, %s after\n\n", Describe(config).c_str(),
              load_before.c_str(), LoadAverage().c_str());
  std::printf(
      "| schedule | step ms | replay ms | ratio | ideal ms | step / ideal | step / 1f1b | ideal / "
      "1f1b | replay / 1f1b | real GFLOP/s | busy ms by rank |\n"
      "|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (const KindResult& r : results) {
    if (!r.skipped.empty()) {
      std::printf("| %s | skipped: %s | | | | | | | | | |\n", r.kind.c_str(), r.skipped.c_str());
      continue;
    }
    const StepFigures& m = r.median;
    std::vector<std::string> busy;
    for (double b : m.busy_ms) busy.push_back(Num(b, 1));
    std::printf("| %s | %.1f | %.1f | %.3f | %.1f | %.3f | %s | %s | %s | %s | %s |\n",
                r.kind.c_str(), m.step_ms, m.replay_ms, r.ratio, m.ideal_ms, m.step_ms / m.ideal_ms,
                base ? Num(m.step_ms / base->median.step_ms, 3).c_str() : "-",
                base ? Num(m.ideal_units / base->median.ideal_units, 3).c_str() : "-",
                base ? Num(m.replay_ms / base->median.replay_ms, 3).c_str() : "-",
                Num(m.real_gflops, 1).c_str(), absl::StrJoin(busy, " / ").c_str());
  }
  std::printf(
      "\n| schedule | gap µs/action | send µs/tensor | receive µs/tensor | transfer µs/tensor | "
      "transfers µs/step | outside µs/step | timeline_extra µs/step | update µs/step |\n"
      "|---|---|---|---|---|---|---|---|---|\n");
  for (const KindResult& r : results) {
    if (!r.skipped.empty()) continue;
    const StepFigures& m = r.median;
    std::printf("| %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", r.kind.c_str(),
                Num(m.gap_us, 1).c_str(), Num(m.send_us, 0).c_str(), Num(m.recv_us, 0).c_str(),
                Num(m.latency_us, 0).c_str(), Num(m.messages_us, 0).c_str(),
                Num(m.outside_us, 0).c_str(), Num(m.extra_us, 0).c_str(),
                Num(m.update_us, 0).c_str());
  }
  std::fflush(stdout);
  return true;
}

// The rate (GFLOP/s) the real-compute ranks of `cluster` reach on the deep MLP with
// `microbatches` micro-batches: a 1F1B job, model FLOPs over compute time, median of steps 2-9.
absl::StatusOr<double> CalibrateRealGflops(const ClusterSpec& cluster, int microbatches,
                                           const std::string& log) {
  BenchConfig c;
  c.cluster = cluster;
  c.microbatches = microbatches;
  c.steps = 9;
  PT_ASSIGN_OR_RETURN(Workload work, LoadWorkload(c));
  PT_ASSIGN_OR_RETURN(KindResult r, RunKind(c, work, "1f1b", log));
  if (!r.skipped.empty() || !(r.median.real_gflops > 0)) {
    return absl::InternalError("the calibration job measured no compute");
  }
  return r.median.real_gflops;
}

// The cluster of a configuration: two real-compute workers registering the rate they reach
// (calibrated with the configuration's M: two stock stage_workers at S=2; at S>2 a second job
// next to the emulated ranks, started with the S=2 rate), the other ranks emulated at
// kEmulatedRateShare of it.
absl::StatusOr<ClusterSpec> CalibratedCluster(int stages, int microbatches,
                                              const std::string& log) {
  PT_ASSIGN_OR_RETURN(double rate, CalibrateRealGflops(ClusterSpec{2, 2, 0, 0}, microbatches, log));
  std::printf(
      "calibration: real compute reaches %.1f GFLOP/s at S=2, M=%d (1F1B, stock "
      "stage_workers; model FLOPs / compute time)\n",
      rate, microbatches);
  if (stages > 2) {
    PT_ASSIGN_OR_RETURN(rate,
                        CalibrateRealGflops(ClusterSpec{stages, 2, rate, rate * kEmulatedRateShare},
                                            microbatches, log));
    std::printf("calibration: %.1f GFLOP/s at S=%d, M=%d next to the emulated ranks\n", rate,
                stages, microbatches);
  }
  return ClusterSpec{stages, 2, rate, rate * kEmulatedRateShare};
}

// S=2, M=8; S=4, M=8 and M=16 (see the file comment).
int RunReal(const std::vector<int>& stage_counts, const std::string& log) {
  for (int stages : stage_counts) {
    for (int microbatches : stages == 2 ? std::vector<int>{8} : std::vector<int>{8, 16}) {
      BenchConfig c;  // B=256
      c.steps = 31;   // medians of 30 steps: 15 spread by several % from run to run
      c.microbatches = microbatches;
      absl::StatusOr<ClusterSpec> cluster = CalibratedCluster(stages, microbatches, log);
      if (!cluster.ok()) {
        std::fprintf(stderr, "runtime_bench: calibration: %s\n",
                     cluster.status().ToString().c_str());
        return 1;
      }
      c.cluster = *cluster;
      if (!RunAndPrint(c, log)) return 1;
    }
  }
  return 0;
}

}  // namespace
}  // namespace pipetrain

int main(int argc, char** argv) {
  const std::string usage =
      "usage: runtime_bench [GFLOPS_PER_WORKER > 0] | runtime_bench --real [--stages 2|4]\n";
  const std::string log = absl::StrCat("/tmp/pipetrain_runtime_bench_", getpid(), ".log");
  if (argc > 1 && std::string(argv[1]) == "--real") {
    std::vector<int> stage_counts = {2, 4};
    if (argc == 4 && std::string(argv[2]) == "--stages" &&
        (std::string(argv[3]) == "2" || std::string(argv[3]) == "4")) {
      stage_counts = {std::atoi(argv[3])};
    } else if (argc != 2) {
      std::fprintf(stderr, "%s", usage.c_str());
      return 2;
    }
    std::printf("daemon logs: %s\n", log.c_str());
    return pipetrain::RunReal(stage_counts, log);
  }
  pipetrain::BenchConfig config;
  config.cluster = pipetrain::ClusterSpec{4, 0, 0, 1.0};
  config.microbatches = 16;
  config.batch = 64;
  config.steps = 6;
  if (argc > 2 || (argc == 2 && (!absl::SimpleAtod(argv[1], &config.cluster.emulated_gflops) ||
                                 !(config.cluster.emulated_gflops > 0)))) {
    std::fprintf(stderr, "%s", usage.c_str());
    return 2;
  }
  std::printf("daemon logs: %s\n", log.c_str());
  return pipetrain::RunAndPrint(config, log) ? 0 : 1;
}
