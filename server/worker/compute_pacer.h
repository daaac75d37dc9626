// ComputePacer: the stage worker's --emulate-gflops mode (benchmarks). Keeps a virtual clock of
// the compute thread in which every action takes exactly FLOPs / rate and starts when both the
// previous action has ended and its inputs have arrived (in-order execution, as the simulator
// models it). The real math still runs; the compute thread is held back where the pipeline can
// observe it:
//  * before each Send (the output of F on a non-last chunk, of I/B on a chunk > 0) it sleeps until
//    the virtual end of the producing action;
//  * after RunStep it sleeps until the virtual end of the last action, before StepDone.
// Input arrival times come from the mailbox (MailboxObserver: the end of a blocked Take); an
// input already present when taken arrived before the virtual clock needs it (the real thread
// never runs behind the virtual one at a Take), so it does not delay the action.
// Actions without a Send (W, F of the last chunk, I/B of chunk 0) are not slept on themselves:
// their time is paid at the next Send or at the end of the step, so the reported per-action
// timings attribute it to that later action; step time and every tensor's send time follow the
// virtual clock. Thread-safe: the observer calls come from any thread; the rest from the compute
// thread.
#ifndef PIPETRAIN_SERVER_WORKER_COMPUTE_PACER_H_
#define PIPETRAIN_SERVER_WORKER_COMPUTE_PACER_H_

#include <chrono>
#include <cstdint>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "common/model/model.h"
#include "common/schedule/ir.h"
#include "common/wire/tensor_key.h"
#include "server/worker/executor.h"
#include "server/worker/mailbox.h"

namespace pipetrain::worker {

class ComputePacer final : public MailboxObserver {
 public:
  using Clock = std::chrono::steady_clock;

  explicit ComputePacer(double gflops);

  // Before the compute thread starts: the worker's actions, the model and each chunk's layers.
  void Configure(const model::Model* model, std::vector<schedule::Action> actions,
                 std::vector<std::pair<int64_t, int64_t>> chunk_layers, int num_chunks);

  // Compute thread, right before StepExecutor::RunStep.
  void BeginStep(int64_t step, int64_t batch_rows);

  // Compute thread, from the Sender: waits until the virtual end of the action sending `key`.
  void BeforeSend(const wire::TensorKey& key);

  // Compute thread, after a successful RunStep: waits until the virtual end of the last action.
  void EndStep();

  // After EndStep: replaces the executor's timings of `report` (one per action, in order) by the
  // virtual ones, relative to BeginStep, so the reported timeline is the emulated one.
  void RewriteTimings(StepReport* report);

  // Ends every current and future sleep at once (the job is stopping). Any thread.
  void Cancel();

  void OnWaitStart(const wire::TensorKey& key) override;
  void OnWaitEnd(const wire::TensorKey& key) override;

 private:
  int64_t Slot(int mb, int chunk, wire::TensorKind kind) const;
  int Microbatches() const;
  double ActionFlops(size_t i, int64_t rows) const;
  // Waits (releasing mu_) until `until` or Cancel().
  void SleepUntilLocked(Clock::time_point until) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Runs the virtual clock through action `k` and returns its virtual end.
  Clock::time_point AdvanceLocked(int k) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  // Constant after Configure (before the compute thread starts).
  const double flops_per_second_;
  const model::Model* model_ = nullptr;
  std::vector<schedule::Action> actions_;
  std::vector<std::pair<int64_t, int64_t>> chunk_layers_;  // [chunk] -> [first, last) layers.
  int num_chunks_ = 0;
  absl::flat_hash_map<int64_t, int> take_index_;  // (mb, chunk, kind) taken -> action index.
  absl::flat_hash_map<int64_t, int> send_index_;  // (mb, chunk, kind) sent -> action index.

  // Compute thread only.
  std::vector<double> seconds_;  // per action, for micro-batches of seconds_rows_ rows.
  int64_t seconds_rows_ = -1;

  // Protects the step's virtual clock, input arrival times and the cancel flag; the compute
  // thread sleeps on it (AwaitWithTimeout), so observer calls are never held up by a sleep.
  absl::Mutex mu_;
  int64_t step_ ABSL_GUARDED_BY(mu_) = -1;
  std::vector<Clock::time_point> ready_ ABSL_GUARDED_BY(mu_);    // latest input arrival.
  std::vector<Clock::time_point> starts_ ABSL_GUARDED_BY(mu_);   // virtual starts so far.
  std::vector<Clock::time_point> readies_ ABSL_GUARDED_BY(mu_);  // virtual input readiness.
  std::vector<Clock::time_point> ends_ ABSL_GUARDED_BY(mu_);     // virtual ends so far.
  Clock::time_point base_ ABSL_GUARDED_BY(mu_);                  // BeginStep's time.
  int next_ ABSL_GUARDED_BY(mu_) = 0;             // first action not yet on the virtual clock.
  Clock::time_point clock_ ABSL_GUARDED_BY(mu_);  // virtual end of the last advanced action.
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
};

}  // namespace pipetrain::worker

#endif  // PIPETRAIN_SERVER_WORKER_COMPUTE_PACER_H_
