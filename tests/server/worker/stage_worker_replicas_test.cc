// Data-parallel replicas on stage worker daemons on loopback (127.0.0.1), driven by a fake
// coordinator: R x S real daemons, worker p = replica * S + rank, each replica fed its share of
// every step's micro-batches, the gradients reduced over real Exchange streams between the
// replicas (replica_gradient frames). Weights, losses and norms after several steps are the
// reference trainer's bit for bit (R = 2, S = 2 under 1F1B and ZB-V; R = 4, S = 1; R = 2 with a
// tied embedding); a replica_gradient from a peer that is not a reduction partner is refused;
// a lost replica peer fails the step with UNAVAILABLE. Synchronisation waits on conditions,
// never sleeps; the timeouts only bound a failing test.
#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/io/dataset.h"
#include "common/math/optimizer.h"
#include "common/model/checkpoint.h"
#include "common/model/model.h"
#include "common/model/optimizer_proto.h"
#include "common/model/reference_trainer.h"
#include "common/schedule/generator.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "pipetrain/v1/worker_control.pb.h"
#include "server/control/control_proto.h"
#include "server/link/peer_link.h"
#include "server/worker/stage_worker_daemon.h"
#include "tests/common/model/test_models.h"
#include "tests/server/worker/fake_coordinator.h"

namespace pipetrain::worker {
namespace {

using link::LinkOptions;
using link::LinkSettings;
using link::PeerHello;
using link::PeerLink;
using testing::FakeCoordinator;
using ::testing::HasSubstr;
using wire::TensorKey;
using wire::TensorKind;

constexpr char kJob[] = "job-r";
constexpr uint64_t kSeed = 11;
constexpr int64_t kSamples = 16;
constexpr int64_t kGeneration = 1;
constexpr char kSecret[] = "secret-of-the-replicated-job";

math::OptimizerConfig Optimizer() {
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

std::string ReadBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

v1::WorkerCommand Command(int64_t step, const char* what, float clip_scale = 1.0f,
                          int64_t rows = 0) {
  v1::WorkerCommand c;
  if (std::string(what) == "run") {
    c.mutable_run_step()->set_job(kJob);
    c.mutable_run_step()->set_generation(kGeneration);
    c.mutable_run_step()->set_step(step);
    c.mutable_run_step()->set_batch_rows(rows);
  } else if (std::string(what) == "commit") {
    c.mutable_commit()->set_job(kJob);
    c.mutable_commit()->set_generation(kGeneration);
    c.mutable_commit()->set_step(step);
    c.mutable_commit()->set_clip_scale(clip_scale);
  } else {
    c.mutable_save_shards()->set_job(kJob);
    c.mutable_save_shards()->set_generation(kGeneration);
    c.mutable_save_shards()->set_step(step);
  }
  return c;
}

// R x S daemons registered with a fake coordinator, and the job's plan for M / R micro-batches.
class ReplicaTest : public ::testing::Test {
 protected:
  // Starts the daemons and plans the job: `replicas` x `stages`, `microbatches` per step.
  void Start(int replicas, int stages, int microbatches, schedule::ScheduleKind kind,
             int virtual_stages, const char* spec) {
    replicas_ = replicas;
    stages_ = stages;
    microbatches_ = microbatches;
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    builder.RegisterService(&coordinator_);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    for (int w = 0; w < replicas * stages; ++w) {
      StageWorkerOptions o;
      o.coordinator = absl::StrCat("127.0.0.1:", port_);
      o.listen = "127.0.0.1:0";
      o.name = Name(w);
      o.gflops = 1;  // no probe in tests.
      o.threads_max = 1;
      absl::StatusOr<std::unique_ptr<StageWorkerDaemon>> d = StageWorkerDaemon::Start(o);
      ASSERT_TRUE(d.ok()) << d.status();
      daemons_.push_back(*std::move(d));
    }
    for (int w = 0; w < replicas * stages; ++w) {
      ASSERT_TRUE(coordinator_.WaitRegistered(Name(w)).ok()) << Name(w);
    }
    model_ = model::testing::BuildOrDie(spec);
    absl::StatusOr<schedule::Plan> plan =
        schedule::GenerateSchedule({kind, stages, microbatches / replicas, virtual_stages});
    ASSERT_TRUE(plan.ok()) << plan.status();
    plan_ = *std::move(plan);
  }

  void TearDown() override {
    for (auto& link : feeds_) link->Shutdown();
    for (auto& d : daemons_) {
      if (d != nullptr) d->Shutdown();
    }
    daemons_.clear();
    if (server_ != nullptr) server_->Shutdown(std::chrono::system_clock::now());
  }

  static std::string Name(int w) { return absl::StrCat("w", w); }
  int Worker(int replica, int rank) const { return replica * stages_ + rank; }
  int LastChunk() const { return plan_.num_chunks() - 1; }
  int PerReplica() const { return microbatches_ / replicas_; }

  // The Assign of the worker at (replica, rank): the layers cut evenly into the plan's chunks.
  v1::WorkerCommand AssignCommand(int replica, int rank) {
    v1::WorkerCommand c;
    v1::Assign* a = c.mutable_assign();
    a->set_job(kJob);
    a->set_generation(kGeneration);
    a->set_rank(rank);
    a->set_replica(replica);
    a->set_replicas(replicas_);
    *a->mutable_model() = model_->spec();
    *a->mutable_optimizer() = model::OptimizerToProto(Optimizer());
    a->set_seed(kSeed);
    a->set_threads(1);
    a->set_stages(stages_);
    a->set_virtual_stages(plan_.virtual_stages());
    a->set_microbatches(PerReplica());
    const int chunks = plan_.num_chunks();
    const int64_t layers = model_->num_layers();
    for (int chunk = 0; chunk < chunks; ++chunk) {
      v1::ChunkSpec* spec = a->add_chunks();
      spec->set_chunk(chunk);
      spec->set_rank(plan_.placement.OwnerOf(chunk));
      spec->set_first_layer(chunk * layers / chunks);
      spec->set_last_layer((chunk + 1) * layers / chunks);
    }
    for (int r = 0; r < stages_; ++r) a->add_worker_addresses(Address(replica, r));
    for (int q = 0; q < replicas_; ++q) a->add_replica_addresses(Address(q, rank));
    for (const schedule::Action& act : plan_.actions[rank]) {
      *a->add_actions() = control::ActionToProto(act);
    }
    a->set_link_secret(kSecret);
    a->set_isa(std::string(math::IsaName(model_->isa())));
    return c;
  }

  std::string Address(int replica, int rank) const {
    return daemons_[Worker(replica, rank)]->address();
  }

  // Assigns every worker and waits for every Assigned.
  void AssignAll() {
    for (int q = 0; q < replicas_; ++q) {
      for (int r = 0; r < stages_; ++r) {
        ASSERT_TRUE(coordinator_.Send(Name(Worker(q, r)), AssignCommand(q, r)));
      }
    }
    for (int w = 0; w < replicas_ * stages_; ++w) {
      absl::StatusOr<v1::WorkerEvent> e = coordinator_.Next(Name(w));
      ASSERT_TRUE(e.ok()) << e.status();
      ASSERT_TRUE(e->has_assigned()) << e->DebugString();
    }
  }

  // Opens the coordinator's feed stream to worker `w`.
  PeerLink* Feed(int w) {
    LinkSettings settings;
    settings.validation.expected = wire::StreamIdentity{kJob, kGeneration};
    settings.validation.num_microbatches = PerReplica();
    settings.validation.num_chunks = plan_.num_chunks();
    settings.callbacks.on_tensor = [](const TensorKey&, math::Matrix) {
      return absl::InvalidArgumentError("the coordinator receives no tensors");
    };
    absl::StatusOr<std::unique_ptr<PeerLink>> link = PeerLink::Connect(
        link::CreateExchangeChannel(daemons_[w]->address()), daemons_[w]->address(),
        PeerHello{"coordinator", wire::StreamIdentity{kJob, kGeneration}, kSecret}, LinkOptions{},
        settings);
    EXPECT_TRUE(link.ok()) << link.status();
    if (!link.ok()) return nullptr;
    feeds_.push_back(*std::move(link));
    return feeds_.back().get();
  }

  // Opens the feeds of every replica: [replica] -> {first chunk's owner, last chunk's owner}.
  void OpenFeeds() {
    for (int q = 0; q < replicas_; ++q) {
      const int first = Worker(q, plan_.placement.OwnerOf(0));
      const int last = Worker(q, plan_.placement.OwnerOf(LastChunk()));
      PeerLink* in = Feed(first);
      PeerLink* target = last == first ? in : Feed(last);
      ASSERT_NE(in, nullptr);
      ASSERT_NE(target, nullptr);
      inputs_.push_back(in);
      targets_.push_back(target);
    }
  }

  // Replica q gets the step's micro-batches [q M / R, (q + 1) M / R), numbered from 0.
  void FeedBatch(int64_t step, const io::Batch& batch) {
    const int64_t mb_rows = batch.inputs.rows() / microbatches_;
    for (int q = 0; q < replicas_; ++q) {
      for (int i = 0; i < PerReplica(); ++i) {
        const int64_t row = (q * PerReplica() + i) * mb_rows;
        auto x = std::make_shared<const math::Matrix>(batch.inputs.middleRows(row, mb_rows));
        ASSERT_TRUE(inputs_[q]->Send(TensorKey{step, i, 0, TensorKind::kInput}, x).ok());
        auto y = std::make_shared<const math::Matrix>(batch.targets.middleRows(row, mb_rows));
        ASSERT_TRUE(
            targets_[q]->Send(TensorKey{step, i, LastChunk(), TensorKind::kTarget}, y).ok());
      }
    }
  }

  absl::StatusOr<std::unique_ptr<model::ReferenceTrainer>> Reference() const {
    model::TrainerOptions ro;
    ro.microbatches = microbatches_;
    ro.threads = 1;
    ro.seed = kSeed;
    ro.optimizer = Optimizer();
    return model::ReferenceTrainer::Create(model_.get(), ro);
  }

  // Runs `steps` steps and compares each with the reference, then every replica's layer files.
  void ExpectStepsBitwiseEqualToTheReference(int steps);

  FakeCoordinator coordinator_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  int replicas_ = 1, stages_ = 1, microbatches_ = 1;
  std::vector<std::unique_ptr<StageWorkerDaemon>> daemons_;
  std::vector<std::unique_ptr<PeerLink>> feeds_;
  std::vector<PeerLink*> inputs_, targets_;  // by replica.
  std::unique_ptr<model::Model> model_;
  schedule::Plan plan_;
};

void ReplicaTest::ExpectStepsBitwiseEqualToTheReference(int steps) {
  AssignAll();
  OpenFeeds();
  auto reference = Reference();
  ASSERT_TRUE(reference.ok()) << reference.status();
  const int workers = replicas_ * stages_;
  const int last_rank = plan_.placement.OwnerOf(LastChunk());
  for (int64_t step = 1; step <= steps; ++step) {
    SCOPED_TRACE(absl::StrCat("step ", step));
    const io::Batch batch = model::testing::MakeBatch(*model_, kSamples, static_cast<int>(step));
    absl::StatusOr<model::StepResult> want = (*reference)->Step(batch);
    ASSERT_TRUE(want.ok()) << want.status();
    for (int w = 0; w < workers; ++w) {
      ASSERT_TRUE(coordinator_.Send(Name(w), Command(step, "run", 1, batch.inputs.rows())));
    }
    FeedBatch(step, batch);
    // Norms by replica and layer; the step's losses in the step's micro-batch order.
    std::vector<std::vector<double>> norms(replicas_,
                                           std::vector<double>(model_->num_layers(), -1.0));
    std::vector<float> losses(microbatches_, 0.0f);
    for (int w = 0; w < workers; ++w) {
      const int q = w / stages_, rank = w % stages_;
      absl::StatusOr<v1::WorkerEvent> e = coordinator_.Next(Name(w));
      ASSERT_TRUE(e.ok()) << e.status();
      ASSERT_TRUE(e->has_step_done()) << Name(w) << ": " << e->DebugString();
      for (const v1::LayerNormSq& n : e->step_done().grad_norms()) {
        norms[q][n.layer()] = n.norm_sq();
      }
      if (rank == last_rank) {
        ASSERT_EQ(e->step_done().microbatch_losses_size(), PerReplica());
        for (int i = 0; i < PerReplica(); ++i) {
          losses[q * PerReplica() + i] = e->step_done().microbatch_losses(i);
        }
      }
    }
    for (int mb = 0; mb < microbatches_; ++mb) {
      EXPECT_EQ(Bits(losses[mb]), Bits(want->microbatch_losses[mb])) << "mb " << mb;
    }
    // Every replica reports the norms of the reduced gradients: the same, the reference's.
    for (int q = 1; q < replicas_; ++q) EXPECT_EQ(norms[q], norms[0]) << "replica " << q;
    const double norm_sq = model::SumLayerNormSq(norms[0]);
    EXPECT_EQ(norm_sq, want->grad_norm_sq);
    const float clip = math::ClipScale(norm_sq, Optimizer().clip_norm);
    ASSERT_EQ(Bits(clip), Bits(want->clip_scale));
    for (int w = 0; w < workers; ++w) {
      ASSERT_TRUE(coordinator_.Send(Name(w), Command(step, "commit", clip)));
    }
    for (int w = 0; w < workers; ++w) {
      absl::StatusOr<v1::WorkerEvent> e = coordinator_.Next(Name(w));
      ASSERT_TRUE(e.ok()) << e.status();
      ASSERT_TRUE(e->has_committed()) << e->DebugString();
    }
  }
  // Every replica's layer files are byte for byte the reference's.
  const char* base = std::getenv("TEST_TMPDIR");
  const std::string dir = absl::StrCat(base != nullptr ? base : "/tmp", "/replica_test_", getpid());
  std::filesystem::remove_all(dir);
  model::CheckpointManifest manifest;
  manifest.step = (*reference)->steps_done();
  manifest.model_spec = model_->spec();
  manifest.optimizer = math::FormatOptimizerConfig(Optimizer());
  manifest.seed = kSeed;
  manifest.batch_size = kSamples;
  manifest.microbatches = microbatches_;
  manifest.shards = model::LayerShards(*model_, 0, model_->num_layers());
  ASSERT_TRUE(model::SaveCheckpoint(dir, manifest, (*reference)->ExportState()).ok());
  for (int q = 0; q < replicas_; ++q) {
    SCOPED_TRACE(absl::StrCat("replica ", q));
    coordinator_.ClearUploads();
    for (int r = 0; r < stages_; ++r) {
      ASSERT_TRUE(coordinator_.Send(Name(Worker(q, r)), Command(steps, "save")));
    }
    for (int r = 0; r < stages_; ++r) {
      absl::StatusOr<v1::WorkerEvent> e = coordinator_.Next(Name(Worker(q, r)));
      ASSERT_TRUE(e.ok()) << e.status();
      ASSERT_TRUE(e->has_shards_saved()) << e->DebugString();
    }
    for (const model::CheckpointShard& shard : manifest.shards) {
      const std::string want = ReadBytes(absl::StrCat(dir, "/", shard.file));
      ASSERT_FALSE(want.empty()) << shard.file;
      EXPECT_TRUE(coordinator_.Uploaded(shard.file) == want) << shard.file << " differs";
    }
  }
  std::filesystem::remove_all(dir);
}

TEST_F(ReplicaTest, TwoReplicasOfTwoStagesUnder1F1BEqualTheReference) {
  Start(2, 2, 4, schedule::ScheduleKind::kOneFOneB, 1, model::testing::kMlpSpec);
  ExpectStepsBitwiseEqualToTheReference(3);
}

// ZB-V: rank 0 holds chunks 0 and 3; chunk 3's W end before chunk 0's, so its reduction
// overlaps the rest of the action list.
TEST_F(ReplicaTest, TwoReplicasOfTwoStagesUnderZbVEqualTheReference) {
  Start(2, 2, 8, schedule::ScheduleKind::kZbV, 2, model::testing::kMlpSpec);
  ExpectStepsBitwiseEqualToTheReference(3);
}

TEST_F(ReplicaTest, FourReplicasOfOneStageEqualTheReference) {
  Start(4, 1, 8, schedule::ScheduleKind::kOneFOneB, 1, model::testing::kMlpSpec);
  ExpectStepsBitwiseEqualToTheReference(3);
}

// The tied GPT: each end's part is reduced over the replicas first, then the ranks of the
// embedding and the head exchange the sums, as the reference adds its two whole-batch parts.
TEST_F(ReplicaTest, TwoReplicasOfATiedModelEqualTheReference) {
  Start(2, 2, 4, schedule::ScheduleKind::kOneFOneB, 1, model::testing::kTiedGptSpec);
  ExpectStepsBitwiseEqualToTheReference(3);
}

// Opens an Exchange stream to `address` as `peer` (with the job's secret), sends one [2, 3]
// tensor under `key` and returns the status the stream ends with.
absl::Status SendAndAwaitEnd(const std::string& address, const std::string& peer, int chunks,
                             int rounds, const TensorKey& key) {
  absl::Mutex mu;
  absl::Status ended;
  bool done = false;
  LinkSettings settings;
  settings.validation.expected = wire::StreamIdentity{kJob, kGeneration};
  settings.validation.num_microbatches = 4;
  settings.validation.num_chunks = chunks;
  settings.validation.replica_rounds = rounds;
  settings.callbacks.on_tensor = [](const TensorKey&, math::Matrix) { return absl::OkStatus(); };
  settings.callbacks.on_error = [&](const absl::Status& status) {
    absl::MutexLock lock(&mu);
    ended = status;
    done = true;
  };
  absl::StatusOr<std::unique_ptr<PeerLink>> link = PeerLink::Connect(
      link::CreateExchangeChannel(address), address,
      PeerHello{peer, wire::StreamIdentity{kJob, kGeneration}, kSecret}, LinkOptions{}, settings);
  if (!link.ok()) return link.status();
  absl::Status sent = (*link)->Send(key, std::make_shared<const math::Matrix>(2, 3));
  {
    absl::MutexLock lock(&mu);
    if (sent.ok() && !mu.AwaitWithTimeout(absl::Condition(&done), absl::Seconds(30))) {
      ended = absl::DeadlineExceededError("the stream was not refused within 30 s");
    }
  }
  (*link)->Shutdown();  // no callback runs after this: `mu` may go.
  absl::MutexLock lock(&mu);
  return sent.ok() ? ended : sent;
}

// With 4 replicas of one stage, replica 3 reduces with replica 2 (rounds 0 and 3) and replica 1
// (rounds 1 and 2), and accepts their streams (lower replicas dial). Replica 0 is no partner: its
// stream is refused. Replica 1's stream is accepted, but a round-0 message from it (replica 2's
// round) is refused, and so is a replica_gradient on the coordinator's feed.
TEST_F(ReplicaTest, AReplicaGradientFromANonPartnerIsRefused) {
  Start(4, 1, 8, schedule::ScheduleKind::kOneFOneB, 1, model::testing::kMlpSpec);
  AssignAll();
  const std::string replica3 = Address(3, 0);
  const TensorKey round0{1, 0, 0, TensorKind::kReplicaGradient};
  const absl::Status stranger = SendAndAwaitEnd(replica3, "replica/0", 1, 4, round0);
  EXPECT_EQ(stranger.code(), absl::StatusCode::kFailedPrecondition) << stranger;
  EXPECT_THAT(stranger.message(), HasSubstr("not from 'replica/0'"));
  const absl::Status wrong_round = SendAndAwaitEnd(replica3, "replica/1", 1, 4, round0);
  EXPECT_EQ(wrong_round.code(), absl::StatusCode::kInvalidArgument) << wrong_round;
  EXPECT_THAT(wrong_round.message(),
              HasSubstr("received replica_gradient(step=1, mb=0, chunk=0) from replica/1"));
  const absl::Status feed = SendAndAwaitEnd(replica3, "coordinator", 1, 4, round0);
  EXPECT_EQ(feed.code(), absl::StatusCode::kInvalidArgument) << feed;
  EXPECT_THAT(feed.message(), HasSubstr("replica_gradient frames are not accepted on this stream"));
}

// Replica 1 goes away while replica 0's step waits for its reduction messages: replica 0's
// step fails with the replica link's UNAVAILABLE, naming the peer.
TEST_F(ReplicaTest, ALostReplicaPeerFailsTheStepWithUnavailable) {
  Start(2, 1, 4, schedule::ScheduleKind::kOneFOneB, 1, model::testing::kMlpSpec);
  AssignAll();
  OpenFeeds();
  const io::Batch batch = model::testing::MakeBatch(*model_, kSamples, 1);
  const int64_t rows = batch.inputs.rows();
  // Step 1 on both replicas: the link between them is established.
  for (int w = 0; w < 2; ++w) ASSERT_TRUE(coordinator_.Send(Name(w), Command(1, "run", 1, rows)));
  FeedBatch(1, batch);
  for (int w = 0; w < 2; ++w) {
    absl::StatusOr<v1::WorkerEvent> e = coordinator_.Next(Name(w));
    ASSERT_TRUE(e.ok()) << e.status();
    ASSERT_TRUE(e->has_step_done()) << e->DebugString();
  }
  for (int w = 0; w < 2; ++w) ASSERT_TRUE(coordinator_.Send(Name(w), Command(1, "commit")));
  for (int w = 0; w < 2; ++w) {
    absl::StatusOr<v1::WorkerEvent> e = coordinator_.Next(Name(w));
    ASSERT_TRUE(e.ok()) << e.status();
    ASSERT_TRUE(e->has_committed()) << e->DebugString();
  }
  // Step 2 on replica 0 only: it waits for replica 1's messages, and replica 1 goes away.
  ASSERT_TRUE(coordinator_.Send(Name(0), Command(2, "run", 1, rows)));
  FeedBatch(2, batch);
  daemons_[1]->Shutdown();
  // The link may break before replica 0 reads RunStep(2) (they travel on different streams); it
  // then first reports the failure against its latest step, 1. Either way step 2 fails.
  absl::StatusOr<v1::WorkerEvent> e = coordinator_.Next(Name(0));
  ASSERT_TRUE(e.ok()) << e.status();
  ASSERT_TRUE(e->has_error()) << e->DebugString();
  if (e->error().step() == 1) {
    EXPECT_EQ(e->error().code(), static_cast<int>(absl::StatusCode::kUnavailable));
    e = coordinator_.Next(Name(0));
    ASSERT_TRUE(e.ok()) << e.status();
    ASSERT_TRUE(e->has_error()) << e->DebugString();
  }
  EXPECT_EQ(e->error().step(), 2);
  EXPECT_EQ(e->error().code(), static_cast<int>(absl::StatusCode::kUnavailable))
      << e->error().message();
  EXPECT_THAT(e->error().message(), HasSubstr("replica/1"));
}

}  // namespace
}  // namespace pipetrain::worker
