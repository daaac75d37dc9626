// FakeWorker and FakeFeedLinks: the coordinator core's peers without a transport. A FakeWorker is
// a WorkerChannel whose thread answers the core's commands as a stage worker does (Assigned,
// StepDone with losses from the last chunk's owner, Committed, ShardsSaved after writing its
// shards through the core's upload path), unless the test scripts otherwise. FakeFeedLinks record
// the tensors a step feeds and can refuse a rank's link.
#ifndef PIPETRAIN_TESTS_SERVER_COORDINATOR_FAKE_WORKER_H_
#define PIPETRAIN_TESTS_SERVER_COORDINATOR_FAKE_WORKER_H_

#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "common/math/tensor.h"
#include "common/model/checkpoint.h"
#include "pipetrain/v1/coordinator.pb.h"
#include "pipetrain/v1/worker_control.pb.h"
#include "server/coordinator/coordinator_core.h"
#include "server/coordinator/feed_link.h"
#include "server/coordinator/worker_channel.h"

namespace pipetrain::coordinator::testing {

// The token a fake last chunk owner makes greedy sampling pick after decode run `run`:
// (position + rows + 3 * sequence) % vocab.
inline int64_t FakeNextToken(const v1::DecodeMicrobatch& run, int64_t vocab) {
  return (run.position() + run.rows() + 3 * run.sequence()) % vocab;
}

// What a worker freshly assigned an Assign holds (the fakes train nothing): the initial tensors of
// its chunks' layers, by name, and those layers' checkpoint shards.
struct AssignedState {
  std::map<std::string, math::Tensor> tensors;
  std::vector<model::CheckpointShard> shards;
};

// The state of a worker freshly assigned `assign` (the layers of its rank's chunks); an error if
// the Assign's model or optimizer does not build.
absl::StatusOr<AssignedState> InitialStateOf(const v1::Assign& assign);

class FakeWorker final : public WorkerChannel {
 public:
  // Starts the worker's thread; Register() sends its registration.
  FakeWorker(CoordinatorCore* core, std::string name);
  // Ends its stream (OnWorkerGone) unless Gone() did, and joins the thread.
  ~FakeWorker() override;

  // Registers with `gflops` as its speed and `isa_levels` (none: the lowest level): the core's
  // answer.
  absl::Status Register(double gflops = 10, const std::vector<std::string>& isa_levels = {});
  // Its stream ends, as when the process dies (the core hears OnWorkerGone). Idempotent.
  void Gone();

  void Send(const v1::WorkerCommand& command) override;
  void Close(const absl::Status& status) override;

  // Script: RunSteps, EvalRuns and GenRuns are not answered until their Abort (then WorkerError
  // ABORTED).
  void HoldRunSteps();
  // Script: Assigns are never answered (a replacement that hangs or dies while taking over).
  void HoldAssigns();
  // Script: Assigns are answered `delay` after they arrive.
  void DelayAssigns(absl::Duration delay);
  // Script: Assigns are answered only once OpenAssigns() was called (at most 30 s later), so that
  // a test acts while the core waits for them.
  void GateAssigns();
  void OpenAssigns();
  // Script: the gradient norms it reports (when the job clips: layer + 1 for each of its layers)
  // are `by` higher, as a replica whose reduction went wrong would report.
  void SkewGradNorms(double by);
  // Script: a RunStep (and an EvalRun) is answered with this error.
  void FailRunSteps(absl::Status status);

  // Script: ProfileLayers are never answered (a worker that hangs or dies while timing).
  void HoldProfiles();
  // Script: ProfileLayers are answered with this error.
  void FailProfiles(absl::Status status);
  // Script: the seconds it answers ProfileLayers with are `factor` times the default: layer l
  // (from 0) of a micro-batch of s samples takes F = 1e-3 (l + 1) s, I = W = 2 F, and its
  // optimizer update 1e-4 (l + 1).
  void SlowProfiles(double factor);
  // The last ProfileLayers received.
  v1::ProfileLayers profile() const;

  const std::string& name() const { return name_; }
  // The GenRuns received, in order.
  std::vector<v1::GenRun> GenRuns() const;
  // The kinds of commands received, in order ("assign", "open_links", "run_step", "commit",
  // "abort", "save_shards", "release", "eval_run", "gen_run", "profile_layers").
  std::vector<std::string> Received() const;
  // Waits (at most 10 s) until `count` commands of `kind` arrived; false on timeout.
  bool WaitFor(const std::string& kind, int count = 1) const;
  // The last Assign received.
  v1::Assign assign() const;
  // The status the core closed the channel with, if it did.
  std::optional<absl::Status> closed() const;

 private:
  void Loop();
  // The event answering `command`, or none.
  std::optional<v1::WorkerEvent> Answer(const v1::WorkerCommand& command);
  // The event answering `run`, a RunStep, EvalRun or GenRun, as scripted (held: none; failing:
  // WorkerError), else its StepDone, EvalDone or GenDone.
  std::optional<v1::WorkerEvent> AnswerRun(const v1::WorkerCommand& run);
  v1::WorkerEvent StepDone(const v1::RunStep& run) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  v1::WorkerEvent EvalDone(const v1::EvalRun& run) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  // The last chunk owner's logits: FakeNextToken of each run (others: none).
  v1::WorkerEvent GenDone(const v1::GenRun& run) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status UploadShards(const v1::SaveShards& save) const;
  // The answer to `p`: the scripted error, or the seconds SlowProfiles describes.
  v1::WorkerEvent Profiled(const v1::ProfileLayers& p) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  CoordinatorCore* const core_;
  const std::string name_;
  std::string registered_;  // the core's name for this stream (the thread's after Register).

  mutable absl::Mutex mu_;
  std::deque<v1::WorkerCommand> inbox_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> received_ ABSL_GUARDED_BY(mu_);
  v1::Assign assign_ ABSL_GUARDED_BY(mu_);
  bool hold_runs_ ABSL_GUARDED_BY(mu_) = false;
  bool hold_assigns_ ABSL_GUARDED_BY(mu_) = false;
  absl::Duration assign_delay_ ABSL_GUARDED_BY(mu_);
  std::shared_ptr<absl::Notification> assign_gate_ ABSL_GUARDED_BY(mu_);
  absl::Status fail_runs_ ABSL_GUARDED_BY(mu_);
  double grad_norm_skew_ ABSL_GUARDED_BY(mu_) = 0;
  // The run commands HoldRunSteps holds, at most one of each kind, until an Abort.
  std::map<v1::WorkerCommand::CommandCase, v1::WorkerCommand> held_ ABSL_GUARDED_BY(mu_);
  std::vector<v1::GenRun> gen_runs_ ABSL_GUARDED_BY(mu_);
  std::optional<absl::Status> closed_ ABSL_GUARDED_BY(mu_);
  bool hold_profiles_ ABSL_GUARDED_BY(mu_) = false;
  absl::Status fail_profiles_ ABSL_GUARDED_BY(mu_);
  double profile_factor_ ABSL_GUARDED_BY(mu_) = 1;
  v1::ProfileLayers profile_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  bool gone_ ABSL_GUARDED_BY(mu_) = false;
  std::thread thread_;
};

// Feed links that keep what they are sent. Thread-safe.
class FakeFeedLinks final : public FeedLinkFactory {
 public:
  absl::StatusOr<std::unique_ptr<FeedLink>> Dial(
      const FeedTarget& target, std::function<void(const absl::Status&)> on_error) override;

  // Every link to `rank` fails with `status` on its first Send (and reports it to on_error).
  void Refuse(int rank, absl::Status status);
  // "input/target step S mb M" of every tensor sent to `rank`, in order.
  std::vector<std::string> Sent(int rank) const;
  // The first element of every tensor sent to `rank`, in order (which rows it carries).
  std::vector<float> FirstValues(int rank) const;
  int dials() const;

 private:
  class Link;
  mutable absl::Mutex mu_;
  std::map<int, absl::Status> refused_ ABSL_GUARDED_BY(mu_);
  std::map<int, std::vector<std::string>> sent_ ABSL_GUARDED_BY(mu_);
  std::map<int, std::vector<float>> first_values_ ABSL_GUARDED_BY(mu_);
  int dials_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace pipetrain::coordinator::testing

#endif  // PIPETRAIN_TESTS_SERVER_COORDINATOR_FAKE_WORKER_H_
