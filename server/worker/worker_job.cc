#include "server/worker/worker_job.h"

#include <algorithm>
#include <thread>
#include <utility>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "common/math/optimizer.h"
#include "common/model/optimizer_proto.h"
#include "common/model/stage.h"
#include "common/net/token_auth.h"
#include "common/util/cpu_set.h"
#include "common/wire/grpc_status.h"
#include "server/control/control_proto.h"
#include "server/worker/proto_convert.h"
#include "server/worker/state_transfer.h"
#include "pipetrain/v1/worker_control.pb.h"

namespace pipetrain::worker {

using link::kCoordinatorPeer;
using link::kStagePeerPrefix;
using link::LinkSettings;
using link::PeerHello;
using link::PeerLink;
using wire::TensorKey;
using wire::TensorKind;

void JobHost::EmitError(const std::string& job, int64_t epoch, int64_t step,
                        const absl::Status& status) {
  Log(absl::StrCat("error (job ", job, ", epoch ", epoch, ", step ", step,
                   "): ", status.ToString()),
      logging::LogLevel::kWarning);
  Emit(control::ErrorEvent(job, epoch, step, status));
}

WorkerJob::WorkerJob(const v1::Assign& assign, const WorkerJobOptions& options, JobHost* host)
    : host_(host),
      options_(options),
      assign_(assign),
      pacer_(options.emulate_gflops > 0 ? std::make_unique<ComputePacer>(options.emulate_gflops)
                                        : nullptr),
      mailbox_(MailboxOptions{0, pacer_.get()}) {
  job_ = assign.job();
  epoch_ = assign.epoch();
  rank_ = assign.rank();
}

void WorkerJob::Stop(absl::string_view why) {
  if (pacer_ != nullptr) pacer_->Cancel();
  {
    absl::MutexLock lock(&upload_mu_);
    stopping_ = true;
    if (upload_context_ != nullptr) upload_context_->TryCancel();
  }
  mailbox_.Abort(absl::AbortedError(absl::StrCat("job ", job_, " epoch ", epoch_, ": ", why)));
  {
    absl::MutexLock lock(&compute_mu_);
    compute_stop_ = true;
    compute_queue_.clear();
  }
  if (compute_thread_.joinable()) compute_thread_.join();
  std::vector<std::unique_ptr<PeerLink>> links;
  {
    absl::MutexLock lock(&links_mu_);
    RecordLinkMetrics(/*forget=*/true);
    closed_ = true;
    for (auto& [rank, slot] : peers_) {
      if (slot.link != nullptr) links.push_back(std::move(slot.link));
      slot.pending.clear();
    }
    for (auto& link : coordinator_links_) links.push_back(std::move(link));
    coordinator_links_.clear();
  }
  for (auto& link : links) link->Shutdown();
}

void WorkerJob::Post(std::function<void()> task) {
  absl::MutexLock lock(&compute_mu_);
  if (compute_stop_) return;
  compute_queue_.push_back(std::move(task));
}

void WorkerJob::ComputeLoop() {
  for (;;) {
    std::function<void()> task;
    {
      absl::MutexLock lock(&compute_mu_);
      auto ready = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(compute_mu_) {
        return compute_stop_ || !compute_queue_.empty();
      };
      compute_mu_.Await(absl::Condition(&ready));
      if (compute_stop_) return;
      task = std::move(compute_queue_.front());
      compute_queue_.pop_front();
    }
    task();
  }
}

absl::StatusOr<std::shared_ptr<WorkerJob>> WorkerJob::Create(const v1::Assign& a,
                                                             const WorkerJobOptions& options,
                                                             JobHost* host) {
  auto bad = [&a](absl::string_view what) {
    return absl::InvalidArgumentError(
        absl::StrCat("Assign(job ", a.job(), ", epoch ", a.epoch(), "): ", what));
  };
  if (a.job().empty()) return bad("empty job id");
  if (a.epoch() < 0) return bad(absl::StrCat("epoch ", a.epoch(), " < 0"));
  if (a.stages() < 1 || a.virtual_stages() < 1 || a.microbatches() < 1) {
    return bad(absl::StrCat("stages (", a.stages(), "), virtual_stages (", a.virtual_stages(),
                            ") and microbatches (", a.microbatches(), ") must be >= 1"));
  }
  if (static_cast<int64_t>(a.stages()) * a.virtual_stages() > (int64_t{1} << 20)) {
    return bad("stages * virtual_stages is too large");
  }
  if (a.rank() < 0 || a.rank() >= a.stages()) {
    return bad(absl::StrCat("rank ", a.rank(), " is outside [0, ", a.stages(), ")"));
  }
  if (a.link_secret().empty()) {
    return bad("no link_secret: without it any process could feed this job's data streams");
  }
  const int threads_max = std::max(1, options.threads_max);
  if (a.threads() < 1 || a.threads() > threads_max) {
    return bad(absl::StrCat("threads ", a.threads(), " is outside [1, ", threads_max, "]"));
  }
  if (a.worker_addresses_size() != a.stages()) {
    return bad(
        absl::StrCat(a.worker_addresses_size(), " worker addresses for ", a.stages(), " stages"));
  }
  const int num_chunks = a.stages() * a.virtual_stages();
  if (a.chunks_size() != num_chunks) {
    return bad(
        absl::StrCat(a.chunks_size(), " chunks, expected stages * virtual_stages = ", num_chunks));
  }
  // The level every rank of the job runs (empty: a coordinator older than Assign.isa, which ran
  // every worker at the lowest built level).
  math::Isa isa = math::BuiltIsas().front();
  if (!a.isa().empty()) {
    absl::StatusOr<math::Isa> parsed = math::ParseIsa(a.isa());
    if (!parsed.ok()) return bad(absl::StrCat("isa: ", parsed.status().message()));
    isa = *parsed;
  }
  const std::vector<math::Isa> runnable = math::SupportedIsas(options.max_isa);
  if (std::find(runnable.begin(), runnable.end(), isa) == runnable.end()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "Assign(job ", a.job(), ", epoch ", a.epoch(), "): this worker cannot run instruction set ",
        math::IsaName(isa), " (it runs ", math::IsaListName(runnable), ")"));
  }
  absl::StatusOr<std::unique_ptr<model::Model>> model =
      model::Model::Build(a.model(), model::ModelLimits(), isa);
  if (!model.ok()) return bad(absl::StrCat("model: ", model.status().message()));
  const int64_t layers = (*model)->num_layers();
  std::vector<int> owner(num_chunks);
  for (int c = 0; c < num_chunks; ++c) {
    const v1::ChunkSpec& spec = a.chunks(c);
    const int64_t expected_first = c == 0 ? 0 : a.chunks(c - 1).last_layer();
    if (spec.chunk() != c) {
      return bad(absl::StrCat("chunks[", c, "] has chunk index ", spec.chunk()));
    }
    if (spec.worker() < 0 || spec.worker() >= a.stages()) {
      return bad(absl::StrCat("chunk ", c, " is on worker ", spec.worker(), " outside [0, ",
                              a.stages(), ")"));
    }
    if (spec.first_layer() != expected_first || spec.last_layer() <= spec.first_layer() ||
        spec.last_layer() > layers || (c == num_chunks - 1 && spec.last_layer() != layers)) {
      return bad(absl::StrCat("chunk ", c, " has layers [", spec.first_layer(), ", ",
                              spec.last_layer(), "); chunks must tile [0, ", layers,
                              ") in order, each non-empty"));
    }
    if (a.worker_addresses(spec.worker()).empty()) {
      return bad(absl::StrCat("worker ", spec.worker(), " has no address"));
    }
    owner[c] = spec.worker();
  }
  absl::StatusOr<std::vector<schedule::Action>> actions = control::ActionsFromProto(a.actions());
  if (!actions.ok()) return bad(actions.status().message());
  if (actions->empty()) return bad("no actions");
  for (size_t i = 0; i < actions->size(); ++i) {
    const schedule::Action& act = (*actions)[i];
    if (act.chunk >= num_chunks || owner[act.chunk] != a.rank()) {
      return bad(absl::StrCat("action ", i, " ", schedule::ActionToString(act),
                              " is on a chunk this worker (rank ", a.rank(), ") does not hold"));
    }
    if (act.mb >= a.microbatches()) {
      return bad(absl::StrCat("action ", i, " ", schedule::ActionToString(act),
                              " has a micro-batch outside [0, ", a.microbatches(), ")"));
    }
  }
  absl::StatusOr<math::OptimizerConfig> optimizer = model::OptimizerFromProto(a.optimizer());
  if (!optimizer.ok()) return bad(absl::StrCat("optimizer: ", optimizer.status().message()));

  std::shared_ptr<WorkerJob> job(new WorkerJob(a, options, host));
  job->num_chunks_ = num_chunks;
  job->microbatches_ = a.microbatches();
  job->owner_ = owner;
  job->actions_ = *std::move(actions);
  job->model_ = *std::move(model);
  std::vector<OwnedChunk> chunks;
  for (int c = 0; c < num_chunks; ++c) {
    if (owner[c] != a.rank()) continue;
    const v1::ChunkSpec& spec = a.chunks(c);
    absl::StatusOr<model::Stage> stage = model::Stage::Create(
        job->model_.get(), spec.first_layer(), spec.last_layer(), a.seed(), *optimizer);
    if (!stage.ok()) return bad(absl::StrCat("chunk ", c, ": ", stage.status().message()));
    chunks.push_back(OwnedChunk{c, *std::move(stage)});
    for (const model::CheckpointShard& shard :
         model::LayerShards(*job->model_, spec.first_layer(), spec.last_layer())) {
      job->shards_.push_back(shard);
    }
    for (int n : {c - 1, c + 1}) {
      if (n < 0 || n >= num_chunks || owner[n] == a.rank()) continue;
      std::vector<int>& peers = owner[n] > a.rank() ? job->higher_peers_ : job->lower_peers_;
      if (std::find(peers.begin(), peers.end(), owner[n]) == peers.end()) {
        peers.push_back(owner[n]);
      }
    }
  }
  if (chunks.empty()) return bad(absl::StrCat("rank ", a.rank(), " holds no chunk"));
  if (a.restore()) {
    StateRequest request;
    request.job = a.job();
    request.epoch = a.epoch();
    request.worker = host->name();
    request.step = a.restore_step();
    for (const OwnedChunk& c : chunks) {
      request.layer_ranges.emplace_back(a.chunks(c.chunk).first_layer(),
                                        a.chunks(c.chunk).last_layer());
    }
    absl::StatusOr<std::map<std::string, math::Tensor>> state =
        FetchState(host->coordinator(), request);
    if (!state.ok()) {
      return wire::Annotate(state.status(),
                            absl::StrCat("Assign(job ", a.job(), ", epoch ", a.epoch(),
                                         "): restoring step ", a.restore_step()));
    }
    for (OwnedChunk& c : chunks) {
      if (absl::Status s = c.stage.ImportState(*state); !s.ok()) {
        return wire::Annotate(s,
                              absl::StrCat("Assign(job ", a.job(), "): restoring chunk ", c.chunk));
      }
    }
    host->Log(absl::StrCat("job ", a.job(), ": restored ", state->size(), " tensors of step ",
                           a.restore_step(), " from the coordinator"));
  }
  absl::StatusOr<std::unique_ptr<StepExecutor>> executor = StepExecutor::Create(
      job->model_.get(), std::move(chunks), num_chunks, &job->mailbox_, job.get());
  if (!executor.ok()) return bad(executor.status().message());
  job->executor_ = *std::move(executor);
  if (job->pacer_ != nullptr) {
    std::vector<std::pair<int64_t, int64_t>> chunk_layers;
    for (int c = 0; c < num_chunks; ++c) {
      chunk_layers.emplace_back(a.chunks(c).first_layer(), a.chunks(c).last_layer());
    }
    job->pacer_->Configure(job->model_.get(), job->actions_, std::move(chunk_layers), num_chunks);
  }
  {
    absl::MutexLock lock(&job->links_mu_);
    for (int p : job->higher_peers_) job->peers_[p];
    for (int p : job->lower_peers_) job->peers_[p];
  }
  // The job's level has its own copy of Eigen's settings (math::Kernels::ConfigureEigen).
  job->model_->kernels().ConfigureEigen(a.threads());
  job->compute_thread_ = std::thread([raw = job.get()] { raw->ComputeLoop(); });
  return job;
}

LinkSettings WorkerJob::SettingsFor(uint32_t kinds, int peer_rank) {
  LinkSettings settings;
  settings.validation.expected = wire::StreamIdentity{job_, epoch_};
  settings.validation.num_microbatches = microbatches_;
  settings.validation.num_chunks = num_chunks_;
  settings.validation.allowed_kinds = kinds;
  settings.validation.max_tensor_bytes = options_.max_tensor_bytes;
  const std::string peer =
      peer_rank < 0 ? std::string(kCoordinatorPeer) : absl::StrCat(kStagePeerPrefix, peer_rank);
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

absl::Status WorkerJob::Deliver(int peer_rank, const TensorKey& key, math::Matrix tensor) {
  // The frame decoder checked job, epoch, ranges and kinds; here: does the tensor belong here,
  // from this peer?
  bool ok = key.chunk >= 0 && key.chunk < num_chunks_ && owner_[key.chunk] == rank_;
  if (ok && peer_rank >= 0) {
    const int from = key.kind == TensorKind::kActivation ? key.chunk - 1 : key.chunk + 1;
    ok = (key.kind == TensorKind::kActivation || key.kind == TensorKind::kGradient) && from >= 0 &&
         from < num_chunks_ && owner_[from] == peer_rank;
  }
  if (!ok) {
    return absl::InvalidArgumentError(absl::StrCat(
        "rank ", rank_, " received ", key.ToString(), " from ",
        peer_rank < 0 ? std::string(kCoordinatorPeer) : absl::StrCat(kStagePeerPrefix, peer_rank),
        ", which is not routed to it by the chunk placement"));
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
  const absl::Status annotated =
      wire::Annotate(status, absl::StrCat("job ", job_, " epoch ", epoch_, ": link to ", peer));
  // A stage link is part of the epoch: once it failed, the epoch cannot run a step any more. The
  // coordinator's feed stream is replaceable (it redials it in the same epoch) and its failure
  // is the coordinator's to handle (it aborts the step it was feeding).
  const bool coordinator = peer == kCoordinatorPeer;
  {
    absl::MutexLock lock(&links_mu_);
    if (closed_) return;
    if (!coordinator && broken_.ok()) broken_ = annotated;
  }
  host_->Log(absl::StrCat("job ", job_, " epoch ", epoch_, ": link to ", peer, " at ",
                          PeerAddress(peer), " failed: ", status.ToString()),
             logging::LogLevel::kWarning);
  if (!coordinator) mailbox_.Abort(annotated);
  host_->LinkFailed(job_, epoch_, annotated, coordinator);
}

std::string WorkerJob::PeerAddress(const std::string& peer) const {
  if (peer == kCoordinatorPeer) return host_->coordinator_address();
  int rank = -1;
  absl::string_view rest = peer;
  if (absl::ConsumePrefix(&rest, kStagePeerPrefix) && absl::SimpleAtoi(rest, &rank) && rank >= 0 &&
      rank < assign_.worker_addresses_size()) {
    return assign_.worker_addresses(rank);
  }
  return "an unknown address";
}

absl::StatusOr<LinkSettings> WorkerJob::Accept(const PeerHello& hello,
                                               std::unique_ptr<PeerLink> link) {
  if (hello.identity.job != job_) {
    // Links are dialled only after every worker answered Assigned: a stream for another job
    // means this worker lost that job (restarted or re-assigned), hence ABORTED.
    return absl::AbortedError(absl::StrCat("worker rank ", rank_, " runs job '", job_, "', not '",
                                           hello.identity.job, "'"));
  }
  if (hello.identity.epoch != epoch_) {
    return absl::AbortedError(absl::StrCat("job ", job_, " is at epoch ", epoch_,
                                           "; stream for epoch ", hello.identity.epoch, " from '",
                                           hello.peer, "' is stale"));
  }
  // Only the peers this epoch's Assign names know its secret; checked before the stream can take
  // a peer's slot, so an impostor never displaces (or pre-empts) the real neighbour.
  if (!net::ConstantTimeEquals(hello.secret, assign_.link_secret())) {
    return absl::UnauthenticatedError(
        absl::StrCat("rank ", rank_, " refuses the Exchange stream of '", hello.peer, "' for job ",
                     job_, " epoch ", epoch_,
                     ": it does not present the epoch's link secret (only the peers the "
                     "coordinator's Assign names may send this job frames)"));
  }
  if (hello.peer == kCoordinatorPeer) {
    uint32_t kinds = 0;
    if (owner_[0] == rank_) kinds |= wire::KindBit(TensorKind::kInput);
    if (owner_[num_chunks_ - 1] == rank_) kinds |= wire::KindBit(TensorKind::kTarget);
    if (kinds == 0) {
      return absl::FailedPreconditionError(absl::StrCat(
          "rank ", rank_, " holds neither the first nor the last chunk: no coordinator stream"));
    }
    LinkSettings settings = SettingsFor(kinds, -1);
    std::vector<std::unique_ptr<PeerLink>> ended;
    {
      absl::MutexLock lock(&links_mu_);
      if (closed_) return absl::AbortedError(absl::StrCat("job ", job_, " is shutting down"));
      // The coordinator keeps one stream per rank and epoch, and opens a new one only after the
      // old one failed: streams that ended are dropped, and beyond kMaxCoordinatorLinks live
      // ones a new stream is refused, so that no client can pile up streams here.
      for (auto it = coordinator_links_.begin(); it != coordinator_links_.end();) {
        if ((*it)->status().ok()) {
          ++it;
        } else {
          ended.push_back(std::move(*it));
          it = coordinator_links_.erase(it);
        }
      }
      if (coordinator_links_.size() >= kMaxCoordinatorLinks) {
        return absl::ResourceExhaustedError(
            absl::StrCat("rank ", rank_, " of job ", job_, " epoch ", epoch_, " already has ",
                         coordinator_links_.size(), " live coordinator streams (at most ",
                         kMaxCoordinatorLinks, ")"));
      }
      coordinator_links_.push_back(std::move(link));
    }
    // Outside links_mu_: Shutdown may wait for a link callback that takes it.
    for (auto& old : ended) old->Shutdown();
    return settings;
  }
  int peer_rank = -1;
  absl::string_view name = hello.peer;
  if (!absl::ConsumePrefix(&name, kStagePeerPrefix) || !absl::SimpleAtoi(name, &peer_rank) ||
      std::find(lower_peers_.begin(), lower_peers_.end(), peer_rank) == lower_peers_.end()) {
    return absl::FailedPreconditionError(
        absl::StrCat("rank ", rank_,
                     " accepts Exchange streams only from 'coordinator' and lower-rank "
                     "neighbours, not from '",
                     hello.peer, "'"));
  }
  LinkSettings settings = SettingsFor(
      wire::KindBit(TensorKind::kActivation) | wire::KindBit(TensorKind::kGradient), peer_rank);
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
    const std::string& address = assign_.worker_addresses(p);
    LinkSettings settings = SettingsFor(
        wire::KindBit(TensorKind::kActivation) | wire::KindBit(TensorKind::kGradient), p);
    if (connections > 1) {
      host_->Log(absl::StrCat("link to stage/", p, " (", address, "): ", connections,
                              " connections, tensors of at least ", options_.link.stripe_min_bytes,
                              " bytes split over them"),
                 logging::LogLevel::kInfo);
    }
    absl::StatusOr<std::unique_ptr<PeerLink>> link = PeerLink::Connect(
        link::CreateExchangeChannels(address, connections, options_.link_credentials),
        absl::StrCat(kStagePeerPrefix, p, " (", address, ")"),
        PeerHello{absl::StrCat(kStagePeerPrefix, rank_), wire::StreamIdentity{job_, epoch_},
                  assign_.link_secret()},
        options_.link, std::move(settings));
    if (!link.ok()) {
      LinkFailed(absl::StrCat(kStagePeerPrefix, p), link.status());
      continue;
    }
    absl::MutexLock lock(&links_mu_);
    if (closed_) return;
    peers_[p].link = *std::move(link);
  }
}

void WorkerJob::Send(const TensorKey& key, math::Matrix tensor) {
  if (pacer_ != nullptr) pacer_->BeforeSend(key);
  const int owner = key.chunk >= 0 && key.chunk < num_chunks_ ? owner_[key.chunk] : -1;
  if (owner == rank_) {
    absl::Status put = mailbox_.Put(key, std::move(tensor));
    if (!put.ok() && mailbox_.status().ok()) mailbox_.Abort(put);
    return;
  }
  link_spans_.SendQueued(absl::StrCat(kStagePeerPrefix, owner), key,
                         static_cast<int64_t>(tensor.size()) * sizeof(float),
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

void WorkerJob::OnOpenLinks() {
  if (!dialled_) {
    dialled_ = true;
    DialPeers();
  }
}

void WorkerJob::OnRunStep(const v1::RunStep& run) {
  OnOpenLinks();
  requested_step_ = run.step();
  const int64_t run_index = ++requested_runs_;
  const int64_t step = run.step();
  const int64_t rows = run.batch_rows();
  Post([this, step, rows, run_index] {
    absl::Status broken;
    {
      absl::MutexLock lock(&links_mu_);
      broken = broken_;
    }
    if (pacer_ != nullptr) pacer_->BeginStep(step, rows);
    absl::StatusOr<StepReport> report =
        broken.ok() ? executor_->RunStep(step, actions_, rows) : absl::StatusOr<StepReport>(broken);
    if (report.ok()) FlushPeerLinks(run_index);
    if (pacer_ != nullptr && report.ok()) {
      pacer_->EndStep();
      pacer_->RewriteTimings(&*report);
    }
    bool aborted = false;
    {
      absl::MutexLock lock(&state_mu_);
      ++finished_runs_;
      last_step_failed_ = !report.ok();
      aborted = aborted_run_ == run_index;
    }
    // Clean up before answering, so that the answer tells the coordinator that this worker is
    // ready for the next RunStep (also a re-run of this step): the mailbox is reset after the
    // coordinator's Abort (unless a link broke: the epoch is over), a failed step's leftovers
    // are dropped and the executor discards the failed step at once.
    if (aborted && broken.ok()) {
      mailbox_.Reset();
      link_spans_.Clear();
    } else if (!report.ok()) {
      mailbox_.ClearStep(step);
    }
    if (!report.ok()) executor_->Abort();
    step_ok_ = report.ok() && !aborted;
    ran_step_ = step;
    if (!report.ok()) {
      EmitError(step, report.status());
      return;
    }
    RecordStepMetrics(*report);
    v1::WorkerEvent event;
    *event.mutable_step_done() =
        StepDoneFromReport(job_, epoch_, *report,
                           link_spans_.TakeStep(step, report->started, LinkSpanLog::Clock::now()));
    Emit(std::move(event));
  });
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

void WorkerJob::OnCommit(const v1::Commit& commit) {
  const int64_t step = commit.step();
  const float clip_scale = commit.clip_scale();
  Post([this, step, clip_scale] {
    if (!step_ok_ || ran_step_ != step) {
      EmitError(step, absl::FailedPreconditionError(absl::StrCat(
                          "Commit(", step, "): step ", step, " has not run successfully here")));
      return;
    }
    step_ok_ = false;
    // Steps are numbered from 0: step n is the (n+1)-th optimizer update.
    if (absl::Status s = executor_->CheckCommit(step + 1, clip_scale); !s.ok()) {
      EmitError(step, s);
      return;
    }
    // The update cannot fail once checked, and every later command runs on this thread after
    // it: the coordinator hears Committed at once and answers the step while the update is
    // applied, off the step's critical path (a worker lost meanwhile is lost after its commit,
    // which recovery already handles: every rank restarts from the last checkpoint).
    mailbox_.ClearStep(step);
    v1::WorkerEvent event;
    v1::Committed* committed = event.mutable_committed();
    committed->set_job(job_);
    committed->set_epoch(epoch_);
    committed->set_step(step);
    Emit(std::move(event));
    // A rank whose step starts with a forward of a later chunk waits for its first activation
    // anyway: it applies the update then, and leaves this core to the ranks (and the control
    // plane) that are on the critical path between two steps.
    const bool defer = !actions_.empty() && actions_.front().op == schedule::Op::kForward &&
                       actions_.front().chunk != 0;
    if (absl::Status s = executor_->Commit(step + 1, clip_scale, defer); !s.ok()) {
      // Unreachable (checked above); fails the next command rather than passing silently.
      EmitError(step, s);
    }
  });
}

void WorkerJob::OnAbort(const v1::Abort& abort) {
  if (abort.step() != requested_step_) {
    host_->Log(absl::StrCat("ignoring Abort(", abort.step(), ") of job ", job_, " epoch ", epoch_,
                            ": the latest step is ", requested_step_));
    return;
  }
  {
    // Atomic with the compute thread's end-of-run bookkeeping: either the run is still queued
    // or running (then it is woken here and resets the mailbox itself before it answers), or it
    // has answered already (then the mailbox is left alone: a re-run's inputs may be in it).
    absl::MutexLock lock(&state_mu_);
    if (finished_runs_ < requested_runs_) {
      aborted_run_ = requested_runs_;
      mailbox_.Abort(absl::AbortedError(
          absl::StrCat("step ", abort.step(), " aborted by the coordinator: ", abort.reason())));
    }
  }
  Post([this] {
    executor_->Abort();
    step_ok_ = false;
    absl::MutexLock lock(&links_mu_);
    // Outputs of the aborted run still waiting for a lower-rank peer's stream are dropped, so
    // a re-run of the step cannot deliver them twice.
    for (auto& [rank, slot] : peers_) slot.pending.clear();
  });
}

void WorkerJob::OnSaveShards(const v1::SaveShards& save) {
  const int64_t step = save.step();
  Post([this, step] {
    StateUpload upload;
    upload.job = job_;
    upload.epoch = epoch_;
    upload.step = step;
    upload.worker = host_->name();
    upload.shards = shards_;
    grpc::ClientContext context;
    {
      absl::MutexLock lock(&upload_mu_);
      if (stopping_) return;
      upload_context_ = &context;
    }
    absl::Status s =
        PutState(host_->coordinator(), &context, upload, executor_->ExportState()).status();
    {
      absl::MutexLock lock(&upload_mu_);
      upload_context_ = nullptr;
    }
    if (!s.ok()) {
      EmitError(step, s);
      return;
    }
    v1::WorkerEvent event;
    v1::ShardsSaved* saved = event.mutable_shards_saved();
    saved->set_job(job_);
    saved->set_epoch(epoch_);
    saved->set_step(step);
    Emit(std::move(event));
  });
}

void WorkerJob::OnLinkFailed(const absl::Status& status, bool coordinator_link) {
  if (coordinator_link) {
    // The coordinator sees its own stream fail: it aborts the step it was feeding (Abort) and
    // dials a new feed stream for the next one; if it died, the control stream ends too.
    // Deciding here would race with the replacement stream, so this is only logged.
    host_->Log(absl::StrCat("feed stream ended: ", status.ToString()));
    return;
  }
  int64_t step = 0;
  {
    absl::MutexLock lock(&state_mu_);
    // A queued or running step fails on the aborted mailbox (or the broken link) and reports
    // the error itself; a step that failed already told the coordinator.
    if (finished_runs_ < requested_runs_ || last_step_failed_) return;
    step = std::max<int64_t>(requested_step_, 0);
  }
  EmitError(step, status);
}

}  // namespace pipetrain::worker
