#include "tests/server/worker/fake_job.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "common/model/checkpoint.h"
#include "common/model/optimizer_proto.h"
#include "gtest/gtest.h"
#include "server/control/control_proto.h"
#include "tests/common/model/test_models.h"

namespace pipetrain::worker::testing {
namespace {

using link::PeerLink;
using wire::TensorKey;
using wire::TensorKind;

// Sets the job, generation and step of `command` (a RunStep, Commit, SaveShards or Abort); returns
// it.
template <typename Command>
Command* Fence(const FakeJob& job, int64_t step, Command* command) {
  command->set_job(job.job);
  command->set_generation(job.generation);
  command->set_step(step);
  return command;
}

std::string ReadBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// What one step's StepDone events carry: the norms by replica and layer (-1: not reported) and
// the losses in the step's micro-batch order.
struct StepReports {
  std::vector<std::vector<double>> norms;
  std::vector<float> losses;
};

// Waits for every worker's StepDone of `step`, checks what each reports of itself and gathers
// the norms and losses into *reports.
void CollectStepDone(FakeCoordinator* coordinator, const FakeJob& job, int64_t step,
                     StepReports* reports) {
  const schedule::Plan& plan = *job.plan;
  const int64_t layers = job.model->num_layers();
  reports->norms.assign(job.replicas, std::vector<double>(layers, -1.0));
  reports->losses.assign(job.microbatches, 0.0f);
  // The rank whose loss each of a replica's micro-batches is (its route's last chunk's owner).
  std::vector<int> loss_owner;
  for (int i = 0; i < job.PerReplica(); ++i) {
    loss_owner.push_back(plan.placement.OwnerOf(plan.RouteEnd(i) - 1));
  }
  for (int p = 0; p < job.workers(); ++p) {
    const int q = p / job.stages, rank = p % job.stages;
    absl::StatusOr<v1::WorkerEvent> e = coordinator->Next(WorkerName(p));
    ASSERT_TRUE(e.ok()) << e.status();
    ASSERT_TRUE(e->has_step_done()) << WorkerName(p) << ": " << e->DebugString();
    const v1::StepDone& done = e->step_done();
    EXPECT_EQ(done.step(), step);
    EXPECT_EQ(done.generation(), job.generation);
    EXPECT_EQ(done.timings_size(), static_cast<int>(plan.actions[rank].size()));
    for (const v1::ActionTiming& t : done.timings()) {
      EXPECT_LE(t.start_us(), t.end_us());
      EXPECT_GE(t.wait_us(), 0);
    }
    for (const v1::LayerNormSq& n : done.grad_norms()) {
      ASSERT_TRUE(n.layer() >= 0 && n.layer() < layers) << "layer " << n.layer();
      EXPECT_EQ(reports->norms[q][n.layer()], -1.0) << "layer " << n.layer() << " reported twice";
      reports->norms[q][n.layer()] = n.norm_sq();
    }
    if (std::count(loss_owner.begin(), loss_owner.end(), rank) == 0) {
      EXPECT_EQ(done.microbatch_losses_size(), 0);
      continue;
    }
    ASSERT_EQ(done.microbatch_losses_size(), job.PerReplica());
    for (int i = 0; i < job.PerReplica(); ++i) {
      if (loss_owner[i] == rank) {
        reports->losses[q * job.PerReplica() + i] = done.microbatch_losses(i);
      }
    }
  }
}

// Runs `step` on every worker and checks it against `want`; commits it.
void RunStepBitwise(FakeCoordinator* coordinator, const FakeJob& job,
                    const std::map<int, PeerLink*>& feeds, int64_t step, const io::Batch& batch,
                    const model::StepResult& want) {
  ASSERT_TRUE(
      SendToAll(coordinator, job.workers(), RunStepCommand(job, step, batch.inputs.rows())));
  ASSERT_NO_FATAL_FAILURE(FeedRouted(job, feeds, step, batch));
  StepReports got;
  ASSERT_NO_FATAL_FAILURE(CollectStepDone(coordinator, job, step, &got));
  ASSERT_EQ(got.losses.size(), want.microbatch_losses.size());
  float loss = 0;
  for (size_t mb = 0; mb < got.losses.size(); ++mb) {
    EXPECT_EQ(Bits(got.losses[mb]), Bits(want.microbatch_losses[mb])) << "mb " << mb;
    loss += got.losses[mb];
  }
  EXPECT_EQ(Bits(loss), Bits(want.loss));
  // Every replica reports the norms of the reduced gradients: the same, the reference's.
  for (int q = 1; q < job.replicas; ++q) EXPECT_EQ(got.norms[q], got.norms[0]) << "replica " << q;
  const double norm_sq = model::SumLayerNormSq(got.norms[0]);
  EXPECT_EQ(norm_sq, want.grad_norm_sq);
  const float clip = math::ClipScale(norm_sq, job.optimizer.clip_norm);
  ASSERT_EQ(Bits(clip), Bits(want.clip_scale));
  ASSERT_TRUE(SendToAll(coordinator, job.workers(), CommitCommand(job, step, clip)));
  std::vector<v1::WorkerEvent> committed;
  ASSERT_NO_FATAL_FAILURE(
      ExpectNextOfAll(coordinator, job.workers(), &v1::WorkerEvent::has_committed, &committed));
  for (const v1::WorkerEvent& e : committed) EXPECT_EQ(e.committed().step(), step);
}

// Has every replica save its shards of step `steps` and compares the uploaded layer files with
// the checkpoint of `reference` (which has run `steps` steps).
void ExpectShardsOfTheReference(FakeCoordinator* coordinator, const FakeJob& job,
                                model::ReferenceTrainer& reference, int steps) {
  const char* base = std::getenv("TEST_TMPDIR");
  const std::string dir =
      absl::StrCat(base != nullptr ? base : "/tmp", "/fake_job_", job.job, "_", getpid());
  std::filesystem::remove_all(dir);
  model::CheckpointManifest manifest;
  manifest.step = reference.steps_done();
  manifest.model_spec = job.model->spec();
  manifest.optimizer = math::FormatOptimizerConfig(job.optimizer);
  manifest.seed = job.seed;
  manifest.batch_size = job.samples;
  manifest.microbatches = job.microbatches;
  manifest.shards = model::LayerShards(*job.model, 0, job.model->num_layers());
  ASSERT_EQ(manifest.step, steps);
  ASSERT_TRUE(model::SaveCheckpoint(dir, manifest, reference.ExportState()).ok());
  ASSERT_FALSE(manifest.shards.empty());
  for (int q = 0; q < job.replicas; ++q) {
    SCOPED_TRACE(absl::StrCat("replica ", q));
    coordinator->ClearUploads();
    for (int r = 0; r < job.stages; ++r) {
      ASSERT_TRUE(coordinator->Send(WorkerName(job.Worker(q, r)), SaveShardsCommand(job, steps)));
    }
    for (int r = 0; r < job.stages; ++r) {
      absl::StatusOr<v1::WorkerEvent> e = coordinator->Next(WorkerName(job.Worker(q, r)));
      ASSERT_TRUE(e.ok()) << e.status();
      ASSERT_TRUE(e->has_shards_saved()) << e->DebugString();
    }
    for (const model::CheckpointShard& shard : manifest.shards) {
      const std::string want = ReadBytes(absl::StrCat(dir, "/", shard.file));
      ASSERT_FALSE(want.empty()) << shard.file;
      EXPECT_TRUE(coordinator->Uploaded(shard.file) == want)
          << shard.file << " differs from the reference's";
    }
  }
  std::filesystem::remove_all(dir);
}

}  // namespace

std::string WorkerName(int p) { return absl::StrCat("w", p); }

absl::Status StartLoopback(FakeCoordinator* coordinator, int workers, StageWorkerOptions options,
                           std::unique_ptr<grpc::Server>* server,
                           std::vector<std::unique_ptr<StageWorkerDaemon>>* daemons) {
  int port = 0;
  grpc::ServerBuilder builder;
  builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  builder.RegisterService(coordinator);
  *server = builder.BuildAndStart();
  if (*server == nullptr) return absl::UnavailableError("the fake coordinator did not start");
  options.coordinator = absl::StrCat("127.0.0.1:", port);
  options.listen = "127.0.0.1:0";
  for (int p = 0; p < workers; ++p) {
    options.name = WorkerName(p);
    absl::StatusOr<std::unique_ptr<StageWorkerDaemon>> d = StageWorkerDaemon::Start(options);
    if (!d.ok()) return d.status();
    daemons->push_back(*std::move(d));
  }
  for (int p = 0; p < workers; ++p) {
    if (absl::StatusOr<v1::RegisterWorker> reg = coordinator->WaitRegistered(WorkerName(p));
        !reg.ok()) {
      return reg.status();
    }
  }
  return absl::OkStatus();
}

void ShutdownLoopback(const std::vector<std::unique_ptr<PeerLink>>& feeds,
                      std::vector<std::unique_ptr<StageWorkerDaemon>>* daemons,
                      grpc::Server* server) {
  for (const auto& link : feeds) link->Shutdown();
  for (auto& d : *daemons) {
    if (d != nullptr) d->Shutdown();
  }
  daemons->clear();
  if (server != nullptr) server->Shutdown(std::chrono::system_clock::now());
}

bool SendToAll(FakeCoordinator* coordinator, int workers, const v1::WorkerCommand& command) {
  for (int p = 0; p < workers; ++p) {
    if (!coordinator->Send(WorkerName(p), command)) return false;
  }
  return true;
}

void ExpectNextOfAll(FakeCoordinator* coordinator, int workers,
                     bool (v1::WorkerEvent::*has)() const, std::vector<v1::WorkerEvent>* events) {
  for (int p = 0; p < workers; ++p) {
    absl::StatusOr<v1::WorkerEvent> e = coordinator->Next(WorkerName(p));
    ASSERT_TRUE(e.ok()) << e.status();
    ASSERT_TRUE(((*e).*has)()) << WorkerName(p) << ": " << e->DebugString();
    if (events != nullptr) events->push_back(*std::move(e));
  }
}

void ExpectRefusal(FakeCoordinator* coordinator, const std::string& name,
                   const v1::WorkerCommand& command, v1::WorkerError* error) {
  ASSERT_TRUE(coordinator->Send(name, command)) << name;
  absl::StatusOr<v1::WorkerEvent> e = coordinator->Next(name);
  ASSERT_TRUE(e.ok()) << e.status();
  ASSERT_TRUE(e->has_error()) << e->DebugString();
  *error = e->error();
}

void ExpectStepUnavailable(FakeCoordinator* coordinator, const std::string& name, int64_t step,
                           v1::WorkerError* error) {
  absl::StatusOr<v1::WorkerEvent> e = coordinator->Next(name);
  ASSERT_TRUE(e.ok()) << e.status();
  ASSERT_TRUE(e->has_error()) << e->DebugString();
  if (e->error().step() == step - 1) {
    EXPECT_EQ(e->error().code(), static_cast<int>(absl::StatusCode::kUnavailable));
    e = coordinator->Next(name);
    ASSERT_TRUE(e.ok()) << e.status();
    ASSERT_TRUE(e->has_error()) << e->DebugString();
  }
  EXPECT_EQ(e->error().step(), step);
  EXPECT_EQ(e->error().code(), static_cast<int>(absl::StatusCode::kUnavailable))
      << e->error().message();
  *error = e->error();
}

math::OptimizerConfig TestOptimizer() {
  math::OptimizerConfig o;
  o.kind = math::OptimizerKind::kSgd;
  o.lr = 0.1f;
  o.momentum = 0.9f;
  o.weight_decay = 0.01f;
  o.clip_norm = 0.5f;
  return o;
}

uint32_t Bits(float v) {
  uint32_t b;
  std::memcpy(&b, &v, sizeof b);
  return b;
}

v1::WorkerCommand RunStepCommand(const FakeJob& job, int64_t step, int64_t rows) {
  v1::WorkerCommand c;
  Fence(job, step, c.mutable_run_step())->set_batch_rows(rows);
  return c;
}

v1::WorkerCommand CommitCommand(const FakeJob& job, int64_t step, float clip_scale) {
  v1::WorkerCommand c;
  Fence(job, step, c.mutable_commit())->set_clip_scale(clip_scale);
  return c;
}

v1::WorkerCommand SaveShardsCommand(const FakeJob& job, int64_t step) {
  v1::WorkerCommand c;
  Fence(job, step, c.mutable_save_shards());
  return c;
}

v1::WorkerCommand AbortCommand(const FakeJob& job, int64_t step, const std::string& reason) {
  v1::WorkerCommand c;
  Fence(job, step, c.mutable_abort())->set_reason(reason);
  return c;
}

v1::WorkerCommand AssignCommand(const FakeJob& job, int replica, int rank) {
  const schedule::Plan& plan = *job.plan;
  v1::WorkerCommand c;
  v1::Assign* a = c.mutable_assign();
  a->set_job(job.job);
  a->set_generation(job.generation);
  a->set_rank(rank);
  *a->mutable_model() = job.model->spec();
  *a->mutable_optimizer() = model::OptimizerToProto(job.optimizer);
  a->set_seed(job.seed);
  a->set_threads(1);
  a->set_stages(job.stages);
  a->set_virtual_stages(plan.virtual_stages());
  a->set_microbatches(job.PerReplica());
  const int chunks = plan.num_chunks();
  const int64_t layers = job.model->num_layers();
  const bool copies = plan.placement.kind == schedule::PlacementKind::kBidirectional;
  const int cuts = copies ? chunks / 2 : chunks;
  for (int chunk = 0; chunk < chunks; ++chunk) {
    const int k = chunk % cuts;
    v1::ChunkSpec* spec = a->add_chunks();
    spec->set_chunk(chunk);
    spec->set_rank(plan.placement.OwnerOf(chunk));
    spec->set_first_layer(k * layers / cuts);
    spec->set_last_layer((k + 1) * layers / cuts);
  }
  for (int r = 0; r < job.stages; ++r)
    a->add_worker_addresses(job.addresses[job.Worker(replica, r)]);
  if (job.replicas > 1) {
    a->set_replica(replica);
    a->set_replicas(job.replicas);
    for (int q = 0; q < job.replicas; ++q)
      a->add_replica_addresses(job.addresses[job.Worker(q, rank)]);
  }
  for (const schedule::Action& act : plan.actions[rank]) {
    *a->add_actions() = control::ActionToProto(act);
  }
  a->set_link_secret(job.secret);
  // The level of the in-process reference the results are compared with.
  a->set_isa(std::string(math::IsaName(job.model->isa())));
  return c;
}

absl::StatusOr<std::unique_ptr<model::ReferenceTrainer>> Reference(const FakeJob& job) {
  model::TrainerOptions ro;
  ro.microbatches = job.microbatches;
  ro.threads = 1;
  ro.seed = job.seed;
  ro.optimizer = job.optimizer;
  return model::ReferenceTrainer::Create(job.model, ro);
}

absl::StatusOr<std::unique_ptr<PeerLink>> OpenFeed(const FakeJob& job, int p) {
  link::LinkSettings settings;
  settings.validation.expected = wire::StreamIdentity{job.job, job.generation};
  settings.validation.num_microbatches = job.PerReplica();
  settings.validation.num_chunks = job.plan->num_chunks();
  settings.callbacks.on_tensor = [](const TensorKey&, math::Matrix) {
    return absl::InvalidArgumentError("the coordinator receives no tensors");
  };
  const std::string& address = job.addresses[p];
  return PeerLink::Connect(
      link::CreateExchangeChannel(address), address,
      link::PeerHello{"coordinator", wire::StreamIdentity{job.job, job.generation}, job.secret},
      link::LinkOptions{}, settings);
}

std::vector<int> FedWorkers(const FakeJob& job) {
  const schedule::Plan& plan = *job.plan;
  std::set<int> fed;
  for (int q = 0; q < job.replicas; ++q) {
    for (int i = 0; i < job.PerReplica(); ++i) {
      for (int chunk : {plan.RouteBegin(i), plan.RouteEnd(i) - 1}) {
        fed.insert(job.Worker(q, plan.placement.OwnerOf(chunk)));
      }
    }
  }
  return std::vector<int>(fed.begin(), fed.end());
}

void FeedRouted(const FakeJob& job, const std::map<int, PeerLink*>& feeds, int64_t step,
                const io::Batch& batch) {
  const schedule::Plan& plan = *job.plan;
  const int64_t mb_rows = batch.inputs.rows() / job.microbatches;
  for (int q = 0; q < job.replicas; ++q) {
    for (int i = 0; i < job.PerReplica(); ++i) {
      const int first = plan.RouteBegin(i);
      const int last = plan.RouteEnd(i) - 1;
      const int64_t row = (q * job.PerReplica() + i) * mb_rows;
      auto x = std::make_shared<const math::Matrix>(batch.inputs.middleRows(row, mb_rows));
      const auto in = feeds.find(job.Worker(q, plan.placement.OwnerOf(first)));
      ASSERT_NE(in, feeds.end());
      ASSERT_TRUE(in->second->Send(TensorKey{step, i, first, TensorKind::kInput}, x).ok());
      auto y = std::make_shared<const math::Matrix>(batch.targets.middleRows(row, mb_rows));
      const auto target = feeds.find(job.Worker(q, plan.placement.OwnerOf(last)));
      ASSERT_NE(target, feeds.end());
      ASSERT_TRUE(target->second->Send(TensorKey{step, i, last, TensorKind::kTarget}, y).ok());
    }
  }
}

void RunAndCommit(FakeCoordinator* coordinator, const FakeJob& job,
                  const std::map<int, PeerLink*>& feeds, int64_t step, const io::Batch& batch) {
  ASSERT_TRUE(
      SendToAll(coordinator, job.workers(), RunStepCommand(job, step, batch.inputs.rows())));
  ASSERT_NO_FATAL_FAILURE(FeedRouted(job, feeds, step, batch));
  ASSERT_NO_FATAL_FAILURE(
      ExpectNextOfAll(coordinator, job.workers(), &v1::WorkerEvent::has_step_done));
  ASSERT_TRUE(SendToAll(coordinator, job.workers(), CommitCommand(job, step, 1.0f)));
  ASSERT_NO_FATAL_FAILURE(
      ExpectNextOfAll(coordinator, job.workers(), &v1::WorkerEvent::has_committed));
}

absl::Status StreamEndStatus(const std::string& address, const link::PeerHello& hello,
                             const wire::FrameValidation& validation,
                             const std::optional<TensorKey>& key, absl::Duration timeout) {
  absl::Mutex mu;
  absl::Status ended;
  bool done = false;
  link::LinkSettings settings;
  settings.validation = validation;
  settings.callbacks.on_tensor = [](const TensorKey&, math::Matrix) { return absl::OkStatus(); };
  settings.callbacks.on_error = [&](const absl::Status& status) {
    absl::MutexLock lock(&mu);
    ended = status;
    done = true;
  };
  absl::StatusOr<std::unique_ptr<PeerLink>> link = PeerLink::Connect(
      link::CreateExchangeChannel(address), address, hello, link::LinkOptions{}, settings);
  if (!link.ok()) return link.status();
  const absl::Status sent = key.has_value()
                                ? (*link)->Send(*key, std::make_shared<const math::Matrix>(2, 3))
                                : absl::OkStatus();
  {
    absl::MutexLock lock(&mu);
    if (sent.ok() && !mu.AwaitWithTimeout(absl::Condition(&done), timeout)) {
      ended = absl::DeadlineExceededError(
          absl::StrCat("the stream was not refused within ", absl::FormatDuration(timeout)));
    }
  }
  (*link)->Shutdown();  // no callback runs after this: `mu` may go.
  absl::MutexLock lock(&mu);
  return sent.ok() ? ended : sent;
}

void ExpectStepsBitwiseEqualToTheReference(FakeCoordinator* coordinator, const FakeJob& job,
                                           const std::map<int, PeerLink*>& feeds, int steps) {
  auto reference = Reference(job);
  ASSERT_TRUE(reference.ok()) << reference.status();
  for (int64_t step = 1; step <= steps; ++step) {
    SCOPED_TRACE(absl::StrCat("step ", step));
    const io::Batch batch =
        model::testing::MakeBatch(*job.model, job.samples, static_cast<int>(step));
    absl::StatusOr<model::StepResult> want = (*reference)->Step(batch);
    ASSERT_TRUE(want.ok()) << want.status();
    ASSERT_NO_FATAL_FAILURE(RunStepBitwise(coordinator, job, feeds, step, batch, *want));
  }
  ExpectShardsOfTheReference(coordinator, job, **reference, steps);
}

}  // namespace pipetrain::worker::testing
