// WorkerJob's data-plane links: the Exchange streams it accepts (from the coordinator and its
// lower-rank neighbours) and dials (to its higher-rank neighbours), the routing of the tensors it
// sends and receives, link failures, and the flush that keeps StepDone behind the data.
#include <algorithm>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/net/token_auth.h"
#include "common/util/cpu_set.h"
#include "common/util/status_macros.h"
#include "common/wire/grpc_status.h"
#include "server/worker/gradient_exchange.h"
#include "server/worker/worker_job.h"

namespace pipetrain::worker {

using link::kCoordinatorPeer;
using link::kStagePeerPrefix;
using link::LinkSettings;
using link::PeerHello;
using link::PeerLink;
using wire::TensorKey;
using wire::TensorKind;

LinkSettings WorkerJob::SettingsFor(uint32_t kinds, int peer_rank) {
  LinkSettings settings;
  settings.validation.expected = wire::StreamIdentity{job_, generation_};
  settings.validation.num_microbatches = microbatches_;
  settings.validation.num_chunks = num_chunks_;
  settings.validation.replica_rounds = std::max(0, AllReduceRounds(replicas_));
  settings.validation.two_copies = two_copies_;
  settings.validation.allowed_kinds = kinds;
  settings.validation.max_tensor_bytes = options_.max_tensor_bytes;
  const std::string peer = PeerName(peer_rank);
  settings.callbacks.on_tensor = [this, peer_rank](const TensorKey& key, math::Matrix tensor) {
    return Deliver(peer_rank, key, std::move(tensor));
  };
  settings.callbacks.on_error = [this, peer](const absl::Status& status) {
    LinkFailed(peer, status);
  };
  settings.callbacks.on_transfer = [this, peer](const link::LinkTransfer& transfer) {
    link_spans_.Record(peer, transfer);
  };
  return settings;
}

std::string WorkerJob::PeerName(int peer) const {
  if (peer < 0) return std::string(kCoordinatorPeer);
  if (IsReplicaPeer(peer)) return absl::StrCat(kReplicaPeerPrefix, peer - assign_.stages());
  return absl::StrCat(kStagePeerPrefix, peer);
}

int WorkerJob::ParsePeer(absl::string_view name) const {
  int n = -1;
  if (absl::ConsumePrefix(&name, kStagePeerPrefix)) {
    return absl::SimpleAtoi(name, &n) && n >= 0 && n < assign_.stages() ? n : -1;
  }
  if (absl::ConsumePrefix(&name, kReplicaPeerPrefix)) {
    return absl::SimpleAtoi(name, &n) && n >= 0 && n < replicas_ ? ReplicaPeer(n) : -1;
  }
  return -1;
}

uint32_t WorkerJob::StageLinkKinds(int peer_rank) const {
  if (IsReplicaPeer(peer_rank)) return wire::KindBit(TensorKind::kReplicaGradient);
  uint32_t kinds = wire::KindBit(TensorKind::kActivation) | wire::KindBit(TensorKind::kGradient);
  const int embedding = owner_[0];
  const int head = owner_[num_chunks_ - 1];
  if (model_->tie().has_value() && embedding != head &&
      ((rank_ == embedding && peer_rank == head) || (rank_ == head && peer_rank == embedding))) {
    kinds |= wire::KindBit(TensorKind::kTiedGradient);
  }
  if (two_copies_ && peer_rank == CopyPeer()) kinds |= wire::KindBit(TensorKind::kCopyGradient);
  return kinds;
}

absl::Status WorkerJob::Deliver(int peer_rank, const TensorKey& key, math::Matrix tensor) {
  // The frame decoder checked job, generation, ranges and kinds; here: does the tensor belong here,
  // from this peer?
  bool ok = key.chunk >= 0 && key.chunk < num_chunks_ && owner_[key.chunk] == rank_;
  if (ok && key.kind == TensorKind::kReplicaGradient) {
    // A round's message comes from that round's partner replica only (AllReducePartner).
    const int rounds = AllReduceRounds(replicas_);
    ok = rounds > 0 && peer_rank >= 0 && IsReplicaPeer(peer_rank) &&
         ReplicaPeer(AllReducePartner(replica_, replicas_, key.microbatch % rounds)) == peer_rank;
  } else if (ok && peer_rank >= 0 && IsReplicaPeer(peer_rank)) {
    ok = false;  // a replica peer sends nothing else.
  } else if (ok && key.kind == TensorKind::kTiedGradient) {
    // The other end's part: for chunk 0 from the last chunk's owner and the other way round.
    const int from = key.chunk == 0 ? num_chunks_ - 1 : 0;
    ok = peer_rank >= 0 && key.microbatch == 0 && owner_[from] == peer_rank;
  } else if (ok && key.kind == TensorKind::kCopyGradient) {
    // A message of the reduction with the other copy of the same stage (any segment and round:
    // the micro-batch field is segment * 2 + round), only from the rank holding that copy.
    const int from =
        key.chunk < num_chunks_ / 2 ? key.chunk + num_chunks_ / 2 : key.chunk - num_chunks_ / 2;
    ok = two_copies_ && peer_rank >= 0 && owner_[from] == peer_rank;
  } else if (ok && peer_rank >= 0) {
    const int from = key.kind == TensorKind::kActivation ? key.chunk - 1 : key.chunk + 1;
    ok = (key.kind == TensorKind::kActivation || key.kind == TensorKind::kGradient) && from >= 0 &&
         from < num_chunks_ && owner_[from] == peer_rank;
  }
  if (!ok) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rank ", rank_, " (replica ", replica_, ") received ", key.ToString(), " from ",
        PeerName(peer_rank),
        ", which is not routed to it by the chunk placement or the replica reduction"));
  }
  absl::Status put = mailbox_.Put(key, std::move(tensor));
  // While the mailbox is aborted (a failed or aborted step) late tensors are dropped quietly.
  if (!put.ok() && !mailbox_.status().ok()) return absl::OkStatus();
  // A second input or target for one key means stale data of an aborted run is in the mailbox:
  // fail the step rather than compute with it.
  if (!put.ok() && peer_rank < 0) mailbox_.Abort(put);
  return put;
}

void WorkerJob::LinkFailed(const std::string& peer, const absl::Status& status) {
  const absl::Status annotated = wire::Annotate(
      status, absl::StrCat("job ", job_, " generation ", generation_, ": link to ", peer));
  // A stage link is part of the generation: once it failed, the generation cannot run a step any
  // more. The coordinator's feed stream is replaceable (it redials it in the same generation) and
  // its failure is the coordinator's to handle (it aborts the step it was feeding).
  const bool coordinator = peer == kCoordinatorPeer;
  {
    absl::MutexLock lock(&links_mu_);
    if (closed_) return;
    if (!coordinator && broken_.ok()) broken_ = annotated;
  }
  host_->Log(absl::StrCat("job ", job_, " generation ", generation_, ": link to ", peer, " at ",
                          PeerAddress(peer), " failed: ", status.ToString()),
             logging::LogLevel::kWarning);
  if (!coordinator) mailbox_.Abort(annotated);
  host_->LinkFailed(job_, generation_, annotated, coordinator);
}

std::string WorkerJob::PeerAddress(const std::string& peer) const {
  if (peer == kCoordinatorPeer) return host_->coordinator_address();
  const int id = ParsePeer(peer);
  if (id < 0) return "an unknown address";
  if (!IsReplicaPeer(id)) return assign_.worker_addresses(id);
  const int q = id - assign_.stages();
  return q < static_cast<int>(replica_addresses_.size()) ? replica_addresses_[q]
                                                         : "an unknown address";
}

absl::StatusOr<LinkSettings> WorkerJob::Accept(const PeerHello& hello,
                                               std::unique_ptr<PeerLink> link) {
  PT_RETURN_IF_ERROR(CheckHello(hello));
  if (hello.peer == kCoordinatorPeer) return AcceptCoordinator(std::move(link));
  return AcceptNeighbour(hello, std::move(link));
}

absl::Status WorkerJob::CheckHello(const PeerHello& hello) const {
  if (hello.identity.job != job_) {
    // Links are dialled only after every worker answered Assigned: a stream for another job
    // means this worker lost that job (restarted or re-assigned), hence ABORTED.
    return absl::AbortedError(absl::StrCat("worker rank ", rank_, " runs job '", job_, "', not '",
                                           hello.identity.job, "'"));
  }
  if (hello.identity.generation != generation_) {
    return absl::AbortedError(absl::StrCat("job ", job_, " is at generation ", generation_,
                                           "; stream for generation ", hello.identity.generation,
                                           " from '", hello.peer, "' is stale"));
  }
  // Only the peers this generation's Assign names know its secret; checked before the stream can
  // take a peer's slot, so an impostor never displaces (or pre-empts) the real neighbour.
  if (!net::ConstantTimeEquals(hello.secret, assign_.link_secret())) {
    return absl::UnauthenticatedError(
        absl::StrCat("rank ", rank_, " refuses the Exchange stream of '", hello.peer, "' for job ",
                     job_, " generation ", generation_,
                     ": it does not present the generation's link secret (only the peers the "
                     "coordinator's Assign names may send this job frames)"));
  }
  return absl::OkStatus();
}

absl::StatusOr<LinkSettings> WorkerJob::AcceptCoordinator(std::unique_ptr<PeerLink> link) {
  uint32_t kinds = 0;
  // With two copies the up copy's first chunk (S) takes inputs and the down copy's last (S-1)
  // targets as well.
  const int half = num_chunks_ / 2;
  if (owner_[0] == rank_ || (two_copies_ && owner_[half] == rank_)) {
    kinds |= wire::KindBit(TensorKind::kInput);
  }
  if (owner_[num_chunks_ - 1] == rank_ || (two_copies_ && owner_[half - 1] == rank_)) {
    kinds |= wire::KindBit(TensorKind::kTarget);
  }
  if (kinds == 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        "rank ", rank_, " holds neither the first nor the last chunk: no coordinator stream"));
  }
  LinkSettings settings = SettingsFor(kinds, -1);
  std::vector<std::unique_ptr<PeerLink>> ended;
  {
    absl::MutexLock lock(&links_mu_);
    PT_RETURN_IF_ERROR(AddCoordinatorLinkLocked(&link, &ended));
  }
  // Outside links_mu_: Shutdown may wait for a link callback that takes it.
  for (auto& old : ended) old->Shutdown();
  return settings;
}

absl::Status WorkerJob::AddCoordinatorLinkLocked(std::unique_ptr<PeerLink>* link,
                                                 std::vector<std::unique_ptr<PeerLink>>* ended) {
  if (closed_) return absl::AbortedError(absl::StrCat("job ", job_, " is shutting down"));
  // The coordinator keeps one stream per rank and generation, and opens a new one only after the
  // old one failed: streams that ended are dropped, and beyond kMaxCoordinatorLinks live
  // ones a new stream is refused, so that no client can pile up streams here.
  for (auto it = coordinator_links_.begin(); it != coordinator_links_.end();) {
    if ((*it)->status().ok()) {
      ++it;
    } else {
      ended->push_back(std::move(*it));
      it = coordinator_links_.erase(it);
    }
  }
  if (coordinator_links_.size() >= kMaxCoordinatorLinks) {
    return absl::ResourceExhaustedError(
        absl::StrCat("rank ", rank_, " of job ", job_, " generation ", generation_, " already has ",
                     coordinator_links_.size(), " live coordinator streams (at most ",
                     kMaxCoordinatorLinks, ")"));
  }
  coordinator_links_.push_back(std::move(*link));
  return absl::OkStatus();
}

absl::StatusOr<LinkSettings> WorkerJob::AcceptNeighbour(const PeerHello& hello,
                                                        std::unique_ptr<PeerLink> link) {
  const int peer_rank = ParsePeer(hello.peer);
  if (peer_rank < 0 ||
      std::find(lower_peers_.begin(), lower_peers_.end(), peer_rank) == lower_peers_.end()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "rank ", rank_, " (replica ", replica_, " of ", replicas_,
        ") accepts Exchange streams only from 'coordinator', lower-rank neighbours (or a tied "
        "embedding's other end, or the rank holding the other copies of its stages) and the lower "
        "replicas the gradient reduction pairs it with, not from '",
        hello.peer, "'"));
  }
  LinkSettings settings = SettingsFor(StageLinkKinds(peer_rank), peer_rank);
  std::vector<std::pair<TensorKey, std::shared_ptr<const math::Matrix>>> pending;
  PeerLink* raw = link.get();
  {
    absl::MutexLock lock(&links_mu_);
    if (closed_) return absl::AbortedError(absl::StrCat("job ", job_, " is shutting down"));
    PeerSlot& slot = peers_[peer_rank];
    if (slot.link != nullptr) {
      return absl::FailedPreconditionError(
          absl::StrCat("rank ", rank_, " already has a stream from '", hello.peer, "'"));
    }
    slot.link = std::move(link);
    pending.swap(slot.pending);
  }
  // Tensors the compute thread produced before the stream arrived (queued, not yet written:
  // the link starts writing once it is configured and the peer granted credit).
  for (auto& [key, tensor] : pending) {
    if (absl::Status s = raw->Send(key, std::move(tensor)); !s.ok()) mailbox_.Abort(s);
  }
  return settings;
}

void WorkerJob::DialPeers() {
  const int connections =
      options_.link_connections > 0
          ? options_.link_connections
          : link::AutoLinkConnections(util::UsableCpuCount(), assign_.threads());
  for (int p : higher_peers_) {
    const std::string address = PeerAddress(PeerName(p));
    const std::string self = IsReplicaPeer(p) ? absl::StrCat(kReplicaPeerPrefix, replica_)
                                              : absl::StrCat(kStagePeerPrefix, rank_);
    LinkSettings settings = SettingsFor(StageLinkKinds(p), p);
    if (connections > 1) {
      host_->Log(absl::StrCat("link to ", PeerName(p), " (", address, "): ", connections,
                              " connections, tensors of at least ", options_.link.stripe_min_bytes,
                              " bytes split over them"),
                 logging::LogLevel::kInfo);
    }
    absl::StatusOr<std::unique_ptr<PeerLink>> link = PeerLink::Connect(
        link::CreateExchangeChannels(address, connections, options_.link_credentials),
        absl::StrCat(PeerName(p), " (", address, ")"),
        PeerHello{self, wire::StreamIdentity{job_, generation_}, assign_.link_secret()},
        options_.link, std::move(settings));
    if (!link.ok()) {
      LinkFailed(PeerName(p), link.status());
      continue;
    }
    absl::MutexLock lock(&links_mu_);
    if (closed_) return;
    peers_[p].link = *std::move(link);
  }
}

void WorkerJob::Send(const TensorKey& key, math::Matrix tensor) {
  int owner = -1;
  if (key.kind == TensorKind::kReplicaGradient) {
    // From the replica reduction's thread: to the round's partner replica (not paced).
    const int rounds = AllReduceRounds(replicas_);
    const int q = rounds > 0 ? AllReducePartner(replica_, replicas_, key.microbatch % rounds) : -1;
    owner = q >= 0 ? ReplicaPeer(q) : -1;
  } else if (key.kind == TensorKind::kCopyGradient) {
    // From the reduction's thread: to the other copy's owner (not paced).
    owner = key.chunk >= 0 && key.chunk < num_chunks_ ? owner_[key.chunk] : -1;
  } else {
    if (pacer_ != nullptr) pacer_->BeforeSend(key);
    owner = key.chunk >= 0 && key.chunk < num_chunks_ ? owner_[key.chunk] : -1;
  }
  if (owner == rank_ && key.kind != TensorKind::kReplicaGradient) {
    absl::Status put = mailbox_.Put(key, std::move(tensor));
    if (!put.ok() && mailbox_.status().ok()) mailbox_.Abort(put);
    return;
  }
  link_spans_.SendQueued(PeerName(owner), key, static_cast<int64_t>(tensor.size()) * sizeof(float),
                         LinkSpanLog::Clock::now());
  auto shared = std::make_shared<const math::Matrix>(std::move(tensor));
  PeerLink* link = nullptr;
  {
    absl::MutexLock lock(&links_mu_);
    if (closed_) return;
    auto it = peers_.find(owner);
    if (it == peers_.end()) {
      mailbox_.Abort(
          absl::InternalError(absl::StrCat("rank ", rank_, " has no route for ", key.ToString())));
      return;
    }
    if (it->second.link == nullptr) {
      it->second.pending.emplace_back(key, std::move(shared));
      return;
    }
    link = it->second.link.get();  // lives until Stop(), which joins this thread first.
  }
  if (absl::Status s = link->Send(key, std::move(shared)); !s.ok()) mailbox_.Abort(s);
}

void WorkerJob::FlushPeerLinks(int64_t run_index) {
  auto written = [](const link::LinkStats& s) {
    return s.closed || (s.queued_tensors == 0 && !s.writing);
  };
  for (;;) {
    std::vector<link::PeerLink*> links;  // live until Stop(), which joins this thread first.
    bool pending = false;
    {
      absl::MutexLock lock(&links_mu_);
      if (!broken_.ok() || closed_) return;
      for (auto& [rank, slot] : peers_) {
        pending = pending || !slot.pending.empty();
        if (slot.link != nullptr) links.push_back(slot.link.get());
      }
    }
    {
      absl::MutexLock lock(&state_mu_);
      if (aborted_run_ == run_index) return;
    }
    {
      absl::MutexLock lock(&compute_mu_);
      if (compute_stop_) return;  // Stop() joins this thread before it closes the links.
    }
    bool flushed = !pending;
    for (size_t i = 0; i < links.size() && flushed; ++i) {
      // Short waits: an Abort or a failed link is noticed between them.
      flushed = links[i]->WaitFor(written, absl::Milliseconds(20));
    }
    if (flushed) return;
    if (pending) absl::SleepFor(absl::Milliseconds(1));  // a peer's stream is still to come.
  }
}

}  // namespace pipetrain::worker
