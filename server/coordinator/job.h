// Job: one training job as the coordinator core keeps it — its layout, its life, its client's
// lease, the operation in flight and its recoveries. Every field but `id`, `mu` and `links` is
// guarded by the core's lock (`mu`); `links` belong to the job's thread.
#ifndef PIPETRAIN_SERVER_COORDINATOR_JOB_H_
#define PIPETRAIN_SERVER_COORDINATOR_JOB_H_

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/model/checkpoint.h"
#include "common/model/model.h"
#include "common/schedule/ir.h"
#include "pipetrain/v1/coordinator.pb.h"
#include "pipetrain/v1/worker_control.pb.h"
#include "server/coordinator/feed_link.h"
#include "server/coordinator/job_event_log.h"
#include "server/coordinator/job_pace.h"
#include "server/coordinator/job_state.h"
#include "server/coordinator/op_thread.h"

namespace pipetrain::coordinator {

// The answers the operation in flight waits for, by position (job_shape.h: replica x S + rank;
// a rank with one replica) (Assigned, StepDone, ShardsSaved), and its first failure. Every RunStep
// a rank is sent gets exactly one answer (StepDone or WorkerError), in order: only the answer to
// the latest belongs to the current attempt.
struct OperationBook {
  int64_t step = -1;  // the step being run or saved; -1 when none.
  std::vector<bool> assigned;
  std::vector<int64_t> runs_sent;
  std::vector<int64_t> runs_answered;
  std::vector<std::optional<v1::StepDone>> reports;
  std::vector<bool> saved;
  // An evaluation's answers (EvalDone), by rank, while one runs (EvalRun).
  std::vector<std::optional<v1::EvalDone>> evals;
  // A decode round's answers (GenDone), by rank, while one runs (GenRun).
  std::vector<std::optional<v1::GenDone>> gens;
  absl::Status error;  // the first WorkerError or link failure of the operation.

  // Every rank's bookkeeping reset for `ranks` ranks (a new assignment).
  void Reset(int ranks);
  // Ranks that have not answered every RunStep they were sent, increasing.
  std::vector<int> UnansweredRanks() const;
  // Ranks without a StepDone for the step in flight, increasing.
  std::vector<int> RanksWithoutReport() const;
  bool AllAssigned() const;
  bool AllReported() const;
  bool AllSaved() const;
};

// The last step's Commit until every rank confirmed it (Committed). A step whose next batch is
// already queued leaves it to be confirmed by that step, after its RunStep went out, so that the
// next step does not wait for a round trip.
struct CommitBook {
  int64_t step = -1;  // -1: nothing unconfirmed.
  std::vector<bool> committed;
  absl::Time deadline = absl::InfiniteFuture();
  absl::Duration timeout = absl::ZeroDuration();  // for messages.
  absl::Status refusal;                           // a rank's refusal of it.

  bool AllCommitted() const;
  // The ranks that have not confirmed, increasing.
  std::vector<int> Unconfirmed() const;
};

struct Job {
  // `event_capacity`: how many events its log keeps (CoordinatorOptions::job_events).
  Job(absl::Mutex& core_mu, std::string job_id, size_t event_capacity = 256)
      : mu(core_mu), id(std::move(job_id)), events(event_capacity) {}
  Job(const Job&) = delete;
  Job& operator=(const Job&) = delete;

  absl::Mutex& mu;       // the coordinator core's lock.
  const std::string id;  // "job-<hex>-<n>".

  // The layout: the spec (V, threads and replicas filled in; its stages and replicas are the
  // current shape, ShapeOf), model, the plan of one replica's M / R micro-batches, the chunks
  // (the same for every replica) and the worker of each position (R x S of them, p = replica x S
  // + rank; kept after the job ended), and the partition's imbalance.
  v1::JobSpec spec ABSL_GUARDED_BY(mu);
  std::shared_ptr<const model::Model> model ABSL_GUARDED_BY(mu);
  schedule::Plan plan ABSL_GUARDED_BY(mu);
  std::vector<v1::ChunkSpec> chunks ABSL_GUARDED_BY(mu);
  std::vector<std::string> workers ABSL_GUARDED_BY(mu);
  double imbalance ABSL_GUARDED_BY(mu) = 1;

  // The fencing counter of the current assignment and its data links' secret (new with every
  // Assign): messages of an earlier one are refused.
  int64_t generation ABSL_GUARDED_BY(mu) = 1;
  std::string link_secret ABSL_GUARDED_BY(mu);

  // Its life (job_state.h) and progress.
  JobState state ABSL_GUARDED_BY(mu) = JobState::kAssigning;
  std::string reason ABSL_GUARDED_BY(mu);  // why it FAILED or was CANCELLED.
  int64_t steps_done ABSL_GUARDED_BY(mu) = 0;
  absl::Time created ABSL_GUARDED_BY(mu);
  absl::Time ended ABSL_GUARDED_BY(mu) = absl::InfinitePast();

  // The principal that created the job ("" without client authentication): only it and admin
  // see the job (net::MaySee).
  std::string owner ABSL_GUARDED_BY(mu);

  // The client lease (CoordinatorOptions::client_lease): the Train stream holding the job, if any,
  // and whether a Checkpoint is writing it; while neither holds a READY job, it is cancelled at
  // lease_expiry (restarted when the job becomes READY, a stream ends or a Checkpoint finishes).
  // `train_generation`: the generation the stream claimed the job at; once a recovery started
  // another, the stream's batches and its client's checkpoints are refused (CheckClaimCurrent),
  // so that the client hears of the recovery and replays.
  const void* train_owner ABSL_GUARDED_BY(mu) = nullptr;
  bool checkpointing ABSL_GUARDED_BY(mu) = false;
  int64_t train_generation ABSL_GUARDED_BY(mu) = 0;
  absl::Time lease_expiry ABSL_GUARDED_BY(mu) = absl::InfiniteFuture();

  // Checkpoints: the one it started from (JobSpec.resume_from, verified at creation), the one a
  // recovery restarts from (the last written, or the resumed one; none: step 0), and the staging
  // directory of the one in progress (PutState writes there; empty when none is).
  std::string resume_dir ABSL_GUARDED_BY(mu);
  std::optional<model::CheckpointManifest> resume ABSL_GUARDED_BY(mu);
  std::string restore_dir ABSL_GUARDED_BY(mu);
  std::optional<model::CheckpointManifest> restore ABSL_GUARDED_BY(mu);
  std::string checkpoint_staging ABSL_GUARDED_BY(mu);
  // The directory of its last Checkpoint request (in progress, written, or failed: a retry writes
  // it there). With spec.save_to, the directories it holds until it ends: no other job may write
  // them (one writer per checkpoint directory).
  std::string checkpoint_dir ABSL_GUARDED_BY(mu);
  // The client's data position (CheckpointRequest.data_position) at step data_position_step:
  // written into the manifest of every checkpoint of that step, a retry's too.
  std::optional<v1::DataPosition> data_position ABSL_GUARDED_BY(mu);
  int64_t data_position_step ABSL_GUARDED_BY(mu) = -1;

  // Recoveries so far, and the one in progress (state RECOVERING).
  std::vector<v1::RecoveryEvent> recoveries ABSL_GUARDED_BY(mu);
  v1::RecoveryEvent recovering ABSL_GUARDED_BY(mu);
  absl::Time recovery_start ABSL_GUARDED_BY(mu);
  // A worker of the layout the recovery in progress assigns was lost: the recovery starts over
  // (Recover is queued again) rather than wait for that worker's Assigned.
  bool recovery_restart ABSL_GUARDED_BY(mu) = false;

  // Its changes of shape so far (growths, and growths that failed; job_growth.cc), the workers
  // joining the growth in progress (losing one fails the growth, not the job), and the idle
  // workers its last growth failed or was refused with: it does not try again with the same ones.
  std::vector<v1::ShapeChange> shape_changes ABSL_GUARDED_BY(mu);
  std::vector<std::string> joining ABSL_GUARDED_BY(mu);
  std::vector<std::string> growth_refused ABSL_GUARDED_BY(mu);

  // Mailbox steps its evaluation runs used so far: the next one's keys start at kEvalStepBase +
  // this count (wire::EvalKey).
  int64_t eval_runs ABSL_GUARDED_BY(mu) = 0;

  OperationBook op ABSL_GUARDED_BY(mu);
  CommitBook commit ABSL_GUARDED_BY(mu);

  // Its recent history and the watches reading it (WatchJob), and its training pace
  // (JobStatus.progress), both updated as steps commit.
  JobEventLog events ABSL_GUARDED_BY(mu);
  JobPace pace ABSL_GUARDED_BY(mu);

  // Runs the job's blocking operations one at a time (null only while it is being created).
  std::unique_ptr<OpThread> ops ABSL_GUARDED_BY(mu);

  // Job thread only, never under mu (a link's Shutdown may wait for a callback that takes it):
  // the data links to every replica's first and last chunk owners, by position, for generation
  // `links_generation`.
  std::map<int, std::shared_ptr<FeedLink>> links;
  int64_t links_generation = -1;
};

}  // namespace pipetrain::coordinator

#endif  // PIPETRAIN_SERVER_COORDINATOR_JOB_H_
