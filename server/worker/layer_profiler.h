// LayerProfiler: a stage worker's answer to the coordinator's ProfileLayers (docs/worker.md,
// "Layer profiles"): it times the layers of a model on this worker with plan::MeasureLayerCosts
// (the code a stage runs, the lower quartile of repeats, in CPU seconds) for each micro-batch size
// asked, on a thread of its own confined to the compute CPUs a job of that many threads uses, and
// answers LayersProfiled through `emit`. The command thread never waits for the timing, except
// for Stop (an Assign waits for the sample count being timed to end).
//
// One profile at a time; each ends by its deadline (checked between sample counts) or at Stop.
#ifndef PIPETRAIN_SERVER_WORKER_LAYER_PROFILER_H_
#define PIPETRAIN_SERVER_WORKER_LAYER_PROFILER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/math/isa.h"
#include "common/math/optimizer.h"
#include "common/model/model.h"
#include "pipetrain/v1/worker_control.pb.h"

namespace pipetrain::worker {

struct LayerProfilerOptions {
  std::string name;                  // the worker's registered name, for messages.
  double gflops = 0;                 // its registered GFLOP/s: the speed the seconds hold at, > 0.
  int threads_max = 1;               // bound on ProfileLayers.threads, >= 1.
  std::optional<math::Isa> max_isa;  // the highest level this worker runs (none: any).
  // Called on the profile's thread before each sample count (with its samples), before the
  // stop and deadline checks; tests hold a profile there. Null (default): nothing.
  std::function<void(int64_t samples)> before_sample_count;
};

// A ProfileLayers command, checked: the model built at its level, and the rest parsed.
struct ProfileRequest {
  int64_t profile = 0;
  std::unique_ptr<model::Model> model;
  math::OptimizerConfig optimizer;
  std::vector<int64_t> samples;
  int threads = 1;
  absl::Duration deadline;
};

// Checks `command` as an Assign is checked (the same model::Model::Build at the level it names,
// RunnableIsa, OptimizerFromProto): INVALID_ARGUMENT "ProfileLayers(P): <what>" for no or too many
// sample counts, a count outside [1, plan::kMaxProfileSamples], threads outside [1, threads_max]
// (0 means 1), a deadline outside [0, plan::kMaxProfileDeadlineMs] (0: the default), a bad model or
// optimizer; FAILED_PRECONDITION for a level this worker cannot run. Thread-safe.
absl::StatusOr<ProfileRequest> CheckProfileLayers(const v1::ProfileLayers& command,
                                                  const LayerProfilerOptions& options);

class LayerProfiler {
 public:
  // `emit` sends an event to the coordinator; it is called from the profile's thread and the
  // caller of Start, and must be thread-safe.
  LayerProfiler(LayerProfilerOptions options, std::function<void(v1::WorkerEvent)> emit);
  // Stop("the worker is shutting down").
  ~LayerProfiler();
  LayerProfiler(const LayerProfiler&) = delete;
  LayerProfiler& operator=(const LayerProfiler&) = delete;

  // Starts timing `command` on a new thread, which answers LayersProfiled when done. Answers at
  // once instead (LayersProfiled with the error) for a command CheckProfileLayers refuses, or
  // UNAVAILABLE while another profile runs. Call from one thread (the command thread).
  void Start(const v1::ProfileLayers& command);

  // Asks the running profile, if any, to end: it answers ABORTED naming `why` before its next
  // sample count. Does not wait. Thread-safe.
  void RequestStop(absl::string_view why);
  // RequestStop, then returns once the profile's thread ended (after the sample count being
  // timed). Call from the thread that calls Start.
  void Stop(absl::string_view why);

  // True while a profile runs. Thread-safe.
  bool running() const;

 private:
  // The profile's thread: times every sample count, then answers.
  void Run(const std::shared_ptr<ProfileRequest>& request);
  // The figures of `request`, or why not (ABORTED when stopped, DEADLINE_EXCEEDED past the
  // deadline, the errors of plan::MeasureLayerCosts).
  absl::StatusOr<std::vector<v1::SampleLayerCosts>> Measure(const ProfileRequest& request,
                                                            absl::Time deadline);
  // The answer to profile `profile`: `costs` or `status`'s error.
  v1::WorkerEvent Answer(int64_t profile, const absl::Status& status,
                         std::vector<v1::SampleLayerCosts> costs, double cpu_seconds) const;

  // Constant after construction.
  const LayerProfilerOptions options_;
  const std::function<void(v1::WorkerEvent)> emit_;

  // Protects the running flag and the stop reason the profile's thread reads between sample
  // counts.
  mutable absl::Mutex mu_;
  bool running_ ABSL_GUARDED_BY(mu_) = false;
  std::string stop_reason_ ABSL_GUARDED_BY(mu_);  // non-empty: stop before the next count.

  std::thread thread_;  // the last profile's; touched only by the thread that calls Start/Stop.
};

}  // namespace pipetrain::worker

#endif  // PIPETRAIN_SERVER_WORKER_LAYER_PROFILER_H_
