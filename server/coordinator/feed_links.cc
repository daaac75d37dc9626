// The data links a job's thread feeds its steps over: dialled to the owners of the first and the
// last chunk when the job becomes ready, redialled by a step if one failed, closed by the job's
// last task.
#include <filesystem>
#include <memory>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/io/file_util.h"
#include "common/util/annotate.h"
#include "pipetrain/v1/worker_control.pb.h"
#include "server/coordinator/coordinator_core.h"

namespace pipetrain::coordinator {

std::pair<FeedTarget, FeedTarget> CoordinatorCore::FeedTargets(const Job& job, int replica) const {
  const int C = job.plan.num_chunks();
  const JobShape shape = ShapeOf(job.spec);
  const std::vector<std::string> addresses = RankAddresses(job);
  auto target = [&](int rank) ABSL_EXCLUSIVE_LOCKS_REQUIRED(job.mu) {
    FeedTarget t;
    t.job = job.id;
    t.generation = job.generation;
    t.secret = job.link_secret;
    t.rank = shape.Position(replica, rank);
    t.address = addresses[t.rank];
    t.microbatches = job::MicrobatchesPerReplica(job.spec);
    t.chunks = C;
    t.copy_chunks = job.plan.RouteEnd(0);  // micro-batch 0's route: one copy.
    return t;
  };
  // The owners of chunk 0 and of the last chunk of micro-batch 0's route (with two copies of the
  // stages they also hold the up copy's last and first chunk: RouteOf).
  return {target(job.plan.placement.OwnerOf(0)),
          target(job.plan.placement.OwnerOf(job.plan.RouteEnd(0) - 1))};
}

void CoordinatorCore::CloseJobLinks(Job* job) {
  std::vector<std::shared_ptr<FeedLink>> dead;
  for (auto& [rank, link] : job->links) dead.push_back(std::move(link));
  job->links.clear();
  // Without the lock: Shutdown waits for a running link callback, which may be waiting for it.
  for (auto& link : dead) link->Shutdown();
  // A job that finished or was cancelled restores nothing any more: its growth checkpoint goes. A
  // failed job's stays (its last state); a job of a coordinator shutting down is journaled and
  // restores from it after a restart.
  bool drop = false;
  {
    absl::MutexLock lock(&mu_);
    job->mu.AssertHeld();
    drop = (job->state == JobState::kDone || job->state == JobState::kCancelled) &&
           !job->shape_changes.empty();
  }
  if (!drop || options_.growth_dir.empty()) return;
  const std::string directory = io::JoinPath(options_.growth_dir, job->id);
  std::error_code error;
  std::filesystem::remove_all(directory, error);
  if (error) {
    Log(absl::StrCat("job ", job->id, ": cannot remove its growth checkpoint ", directory, ": ",
                     error.message()),
        logging::LogLevel::kWarning);
  }
}

absl::Status CoordinatorCore::EnsureFeedLinks(Job* job, const FeedTarget& first,
                                              const FeedTarget& last) {
  std::vector<std::shared_ptr<FeedLink>> stale;
  if (job->links_generation != first.generation) {
    for (auto& [rank, link] : job->links) stale.push_back(link);
    job->links.clear();
    job->links_generation = first.generation;
  }
  for (auto it = job->links.begin(); it != job->links.end();) {
    if (!it->second->status().ok()) {
      stale.push_back(it->second);
      it = job->links.erase(it);
    } else {
      ++it;
    }
  }
  for (auto& link : stale) link->Shutdown();
  for (const FeedTarget* target : {&first, &last}) {
    if (job->links.count(target->rank) != 0) continue;
    const std::string job_id = target->job;
    const int rank = target->rank;
    auto on_error = [this, job_id, rank](const absl::Status& status) {
      absl::MutexLock lock(&mu_);
      auto it = jobs_.find(job_id);
      if (it == jobs_.end()) return;
      Job& j = *it->second;
      j.mu.AssertHeld();
      if (j.state == JobState::kTraining && j.op.error.ok()) {
        j.op.error = util::Annotate(status, absl::StrCat("data link to rank ", rank));
        event_cv_.SignalAll();
      }
    };
    absl::StatusOr<std::unique_ptr<FeedLink>> link = link_factory_->Dial(*target, on_error);
    if (!link.ok()) return link.status();
    job->links[rank] = std::move(*link);
  }
  return absl::OkStatus();
}

void CoordinatorCore::OpenLinksEarly(Job* job) {
  std::vector<std::pair<FeedTarget, FeedTarget>> targets;
  {
    absl::MutexLock lock(&mu_);
    job->mu.AssertHeld();
    if (job->state != JobState::kReady) return;
    for (int q = 0; q < ShapeOf(job->spec).replicas; ++q) targets.push_back(FeedTargets(*job, q));
    // Every rank accepted this generation's assignment, so each may dial its neighbours now.
    v1::WorkerCommand command;
    command.mutable_open_links()->set_job(job->id);
    command.mutable_open_links()->set_generation(job->generation);
    SendToRanks(*job, command);
  }
  absl::Status opened;
  for (const auto& [first, last] : targets) {
    opened.Update(EnsureFeedLinks(job, first, last));
  }
  if (!opened.ok()) {
    Log(absl::StrCat("job ", targets.front().first.job,
                     ": opening the data links to feed its first step failed (", opened.ToString(),
                     "); the step will dial them again"),
        logging::LogLevel::kWarning);
  }
}

}  // namespace pipetrain::coordinator
