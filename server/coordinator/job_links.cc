#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/wire/grpc_status.h"
#include "common/wire/tensor_key.h"
#include "server/coordinator/coordinator_service.h"

// The data links a job's thread feeds its steps over: dialled to the owners of the first and the
// last chunk when the job becomes ready, redialled by a step if one failed, closed by the job's
// last task.
namespace pipetrain::coordinator {

void CoordinatorService::CloseJobLinks(const std::string& id) {
  std::vector<std::shared_ptr<link::PeerLink>> dead;
  {
    absl::MutexLock lock(&mu_);
    auto it = jobs_.find(id);
    if (it == jobs_.end()) return;
    for (auto& [rank, link] : it->second->links) dead.push_back(std::move(link));
    it->second->links.clear();
  }
  // Outside mu_: Shutdown waits for a running link callback, which may be waiting for mu_.
  for (auto& link : dead) link->Shutdown();
}

absl::Status CoordinatorService::EnsureFeedLinks(Job* job, int64_t epoch, const std::string& secret,
                                                 const std::vector<std::string>& addresses) {
  const int M = job->spec.microbatches();
  const int C = job->plan.num_chunks();
  const int first_rank = job->plan.placement.OwnerOf(0);
  const int last_rank = job->plan.placement.OwnerOf(C - 1);
  std::vector<std::shared_ptr<link::PeerLink>> stale;
  if (job->links_epoch != epoch) {
    for (auto& [rank, link] : job->links) stale.push_back(link);
    job->links.clear();
    job->links_epoch = epoch;
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
  stale.clear();
  for (int rank : {first_rank, last_rank}) {
    if (job->links.count(rank) != 0) continue;
    link::PeerHello hello;
    hello.peer = link::kCoordinatorPeer;
    hello.identity.job = job->id;
    hello.identity.epoch = epoch;
    hello.secret = secret;
    link::LinkSettings settings;
    settings.validation.expected = hello.identity;
    settings.validation.num_microbatches = M;
    settings.validation.num_chunks = C;
    settings.validation.allowed_kinds = 0;  // the coordinator receives no tensors.
    settings.callbacks.on_tensor = [](const wire::TensorKey& key, math::Matrix) {
      return absl::InvalidArgumentError(
          absl::StrCat("the coordinator accepts no tensors, got ", key.ToString()));
    };
    const std::string job_id = job->id;
    settings.callbacks.on_error = [this, job_id, rank](const absl::Status& status) {
      absl::MutexLock lock(&mu_);
      auto it = jobs_.find(job_id);
      if (it == jobs_.end()) return;
      Job& j = *it->second;
      if (j.state == JobState::kTraining && j.op_error.ok()) {
        j.op_error = wire::Annotate(status, absl::StrCat("data link to rank ", rank));
        event_cv_.SignalAll();
      }
    };
    absl::StatusOr<std::unique_ptr<link::PeerLink>> link = link::PeerLink::Connect(
        link::CreateExchangeChannel(addresses[rank], options_.link_credentials), addresses[rank],
        hello, options_.link, std::move(settings));
    if (!link.ok()) return link.status();
    job->links[rank] = std::move(*link);
  }
  return absl::OkStatus();
}

void CoordinatorService::OpenLinksEarly(Job* job) {
  int64_t epoch = 0;
  std::string secret;
  std::vector<std::string> addresses;
  {
    absl::MutexLock lock(&mu_);
    if (job->state != JobState::kReady) return;
    epoch = job->epoch;
    secret = job->link_secret;
    addresses = RankAddresses(*job);
    // Every rank accepted this epoch's assignment, so each may dial its neighbours now.
    v1::WorkerCommand command;
    command.mutable_open_links()->set_job(job->id);
    command.mutable_open_links()->set_epoch(epoch);
    for (int rank = 0; rank < static_cast<int>(job->workers.size()); ++rank) {
      SendToRank(*job, rank, command);
    }
  }
  const absl::Status opened = EnsureFeedLinks(job, epoch, secret, addresses);
  if (!opened.ok()) {
    Log(absl::StrCat("job ", job->id, ": opening the data links to feed its first step failed (",
                     opened.ToString(), "); the step will dial them again"),
        logging::LogLevel::kWarning);
  }
}

}  // namespace pipetrain::coordinator
