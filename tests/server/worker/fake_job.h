// A job as a fake coordinator (fake_coordinator.h) drives it on real stage worker daemons on
// loopback: the commands it sends, its Assigns (the layers cut evenly into the plan's chunks), its
// feed streams, and the step driver that runs steps and a checkpoint and compares them bit for bit
// with the reference trainer. A job has R replicas of S ranks: worker p = replica * S + rank,
// registered as WorkerName(p); replica q gets every step's micro-batches [q M / R, (q + 1) M / R),
// numbered from 0 in its plan. The functions that check use GoogleTest assertions (a failure ends
// the function: callers test HasFatalFailure() or wrap them in ASSERT_NO_FATAL_FAILURE).
#ifndef PIPETRAIN_TESTS_SERVER_WORKER_FAKE_JOB_H_
#define PIPETRAIN_TESTS_SERVER_WORKER_FAKE_JOB_H_

#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "common/io/dataset.h"
#include "common/math/optimizer.h"
#include "common/model/model.h"
#include "common/model/reference_trainer.h"
#include "common/schedule/ir.h"
#include "common/wire/frame_codec.h"
#include "common/wire/tensor_key.h"
#include "pipetrain/v1/worker_control.pb.h"
#include "server/link/peer_link.h"
#include "server/worker/stage_worker_daemon.h"
#include "tests/server/worker/fake_coordinator.h"

namespace pipetrain::worker::testing {

// SGD with lr 0.1, momentum 0.9, weight decay 0.01 and clip norm 0.5: the tests' jobs' optimizer.
math::OptimizerConfig TestOptimizer();

// What a fake coordinator knows of one job. The model and plan are the caller's and must outlive
// every use.
struct FakeJob {
  std::string job;
  int64_t generation = 1;
  std::string secret;  // Assign.link_secret, which the feed streams present.
  uint64_t seed = 0;
  math::OptimizerConfig optimizer = TestOptimizer();
  int replicas = 1;
  int stages = 1;
  int microbatches = 1;  // per step over all replicas: the reference's M.
  int64_t samples = 16;  // the rows of each step's batch (model::testing::MakeBatch).
  const model::Model* model = nullptr;
  const schedule::Plan* plan = nullptr;  // each replica's, of M / R micro-batches.
  std::vector<std::string> addresses;    // the daemons' Exchange addresses, by worker.

  // The job (its other fields at their defaults) of `model` and `plan` on `daemons`: worker p is
  // daemons[p].
  static FakeJob Of(const model::Model* model, const schedule::Plan* plan,
                    const std::vector<std::unique_ptr<StageWorkerDaemon>>& daemons) {
    FakeJob job;
    job.model = model;
    job.plan = plan;
    for (const auto& d : daemons) job.addresses.push_back(d->address());
    return job;
  }

  int workers() const { return replicas * stages; }
  int Worker(int replica, int rank) const { return replica * stages + rank; }
  int PerReplica() const { return microbatches / replicas; }
};

// The name worker `p` registers with: "w<p>".
std::string WorkerName(int p);

// Starts a server for `coordinator` on 127.0.0.1 and `workers` daemons with `options` (their
// coordinator, listen address and name set here: worker p registers as WorkerName(p)) into
// *server and *daemons, and waits until each has registered. An error says what did not start.
absl::Status StartLoopback(FakeCoordinator* coordinator, int workers, StageWorkerOptions options,
                           std::unique_ptr<grpc::Server>* server,
                           std::vector<std::unique_ptr<StageWorkerDaemon>>* daemons);

// Shuts down `feeds`, then `daemons` (and forgets them), then `server` (if any).
void ShutdownLoopback(const std::vector<std::unique_ptr<link::PeerLink>>& feeds,
                      std::vector<std::unique_ptr<StageWorkerDaemon>>* daemons,
                      grpc::Server* server);

// Sends `command` to each of workers 0..`workers` - 1; false if one has no open stream.
bool SendToAll(FakeCoordinator* coordinator, int workers, const v1::WorkerCommand& command);

// Waits for the next event of each of workers 0..`workers` - 1, in order, and expects it to be of
// the kind `has` tells (e.g. &v1::WorkerEvent::has_step_done); appends them to *events if given.
void ExpectNextOfAll(FakeCoordinator* coordinator, int workers,
                     bool (v1::WorkerEvent::*has)() const,
                     std::vector<v1::WorkerEvent>* events = nullptr);

// Sends `command` to worker `name` and waits for its answer, expected to be a WorkerError; the
// error into *error.
void ExpectRefusal(FakeCoordinator* coordinator, const std::string& name,
                   const v1::WorkerCommand& command, v1::WorkerError* error);

// Waits for worker `name` to report that `step` failed with UNAVAILABLE, a link of it having
// broken. The link may break before the worker reads RunStep(`step`) (they travel on different
// streams): it then first reports the failure against step - 1, also UNAVAILABLE. The step's
// error into *error.
void ExpectStepUnavailable(FakeCoordinator* coordinator, const std::string& name, int64_t step,
                           v1::WorkerError* error);

// The bits of `v` (for bitwise comparisons).
uint32_t Bits(float v);

// The job's commands for `step`: RunStep of a batch of `rows` rows, Commit with `clip_scale`,
// SaveShards, Abort for `reason`.
v1::WorkerCommand RunStepCommand(const FakeJob& job, int64_t step, int64_t rows);
v1::WorkerCommand CommitCommand(const FakeJob& job, int64_t step, float clip_scale);
v1::WorkerCommand SaveShardsCommand(const FakeJob& job, int64_t step);
v1::WorkerCommand AbortCommand(const FakeJob& job, int64_t step, const std::string& reason = "");

// The Assign of the worker at (`replica`, `rank`): the layers cut evenly into the plan's chunks
// (under dualpipe, two copies: chunk C / 2 + k repeats chunk k's layers), placed by the plan, the
// plan's actions for `rank`, the reference's instruction-set level. The replica fields are set
// only when the job has more than one replica (as for a job of one, which leaves them unset).
v1::WorkerCommand AssignCommand(const FakeJob& job, int replica, int rank);

// The single-process trainer the job's steps must equal: the same model, M, seed and optimizer,
// one thread.
absl::StatusOr<std::unique_ptr<model::ReferenceTrainer>> Reference(const FakeJob& job);

// Opens the coordinator's feed stream (as peer "coordinator", with the job's secret) to worker `p`.
absl::StatusOr<std::unique_ptr<link::PeerLink>> OpenFeed(const FakeJob& job, int p);

// The workers at the ends of every replica's micro-batch routes (plan RouteBegin/RouteEnd: chunk 0
// and the last chunk, or one copy's under dualpipe), in increasing order: the ones the coordinator
// feeds.
std::vector<int> FedWorkers(const FakeJob& job);

// Sends the input and the target of every micro-batch of `batch` for `step` to the ends of its
// route in its replica, over `feeds` (the coordinator's stream to each of FedWorkers, by worker).
void FeedRouted(const FakeJob& job, const std::map<int, link::PeerLink*>& feeds, int64_t step,
                const io::Batch& batch);

// Runs `step` of the job on every worker with `batch` fed over `feeds` (as FeedRouted) and commits
// it with clip scale 1: RunStep, each worker's StepDone, Commit, each worker's Committed.
void RunAndCommit(FakeCoordinator* coordinator, const FakeJob& job,
                  const std::map<int, link::PeerLink*>& feeds, int64_t step,
                  const io::Batch& batch);

// Opens an Exchange stream to `address` presenting `hello`, the frames it receives checked as
// `validation`, sends a [2, 3] tensor under `key` if there is one, and returns the status the
// stream ends with: the Send's error, or DEADLINE_EXCEEDED if the stream still runs after
// `timeout`.
absl::Status StreamEndStatus(const std::string& address, const link::PeerHello& hello,
                             const wire::FrameValidation& validation,
                             const std::optional<wire::TensorKey>& key, absl::Duration timeout);

// Runs steps 1..`steps` of the job (assigned, `feeds` open) through `coordinator`: each step's
// batch (MakeBatch with the step as its seed) fed, every worker's StepDone checked (step,
// generation, timings, each layer's norm reported once per replica, losses from their routes'
// last ranks only), the losses, the loss, the norms (equal in every replica) and the clip scale
// bit for bit the reference's, then Commit and Committed; finally every replica's uploaded layer
// files (SaveShards) byte for byte the reference's checkpoint.
void ExpectStepsBitwiseEqualToTheReference(FakeCoordinator* coordinator, const FakeJob& job,
                                           const std::map<int, link::PeerLink*>& feeds, int steps);

}  // namespace pipetrain::worker::testing

#endif  // PIPETRAIN_TESTS_SERVER_WORKER_FAKE_JOB_H_
