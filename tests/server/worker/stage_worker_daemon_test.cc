// StageWorkerDaemon end to end on loopback (127.0.0.1): a fake coordinator (the generated
// WorkerControl callback service: Join and PutState) registers two real daemons in this process,
// assigns a small MLP split over them with a 1F1B plan, feeds inputs and targets over Exchange as
// "coordinator", runs steps with Commit, and compares losses and the saved layer files bitwise
// with the reference trainer. Plus: a bad Assign is answered with INVALID_ARGUMENT, and a lost
// neighbour fails the step. Synchronisation waits on conditions (AwaitWithTimeout), never sleeps;
// the timeouts only bound a failing test.
#include "server/worker/stage_worker_daemon.h"

#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
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
#include "pipetrain/v1/coordinator.grpc.pb.h"
#include "pipetrain/v1/worker_control.grpc.pb.h"
#include "pipetrain/v1/worker_control.pb.h"
#include "server/control/control_proto.h"
#include "server/link/peer_link.h"
#include "tests/common/model/test_models.h"
#include "tests/server/worker/fake_coordinator.h"

namespace pipetrain::worker {
namespace {

using link::LinkOptions;
using link::LinkSettings;
using link::PeerHello;
using link::PeerLink;
using ::testing::HasSubstr;
using wire::TensorKey;
using wire::TensorKind;

constexpr char kJob[] = "job-1";
constexpr uint64_t kSeed = 7;
constexpr int kMicrobatches = 4;
constexpr int64_t kSamples = 16;

using testing::FakeCoordinator;

// ------------------------------------------------------------------ helpers

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

std::string TempDir(const std::string& name) {
  const char* base = std::getenv("TEST_TMPDIR");
  std::string dir =
      absl::StrCat(base != nullptr ? base : "/tmp", "/stage_worker_test_", getpid(), "_", name);
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

v1::WorkerCommand RunStepCommand(int64_t generation, int64_t step, int64_t rows) {
  v1::WorkerCommand c;
  v1::RunStep* r = c.mutable_run_step();
  r->set_job(kJob);
  r->set_generation(generation);
  r->set_step(step);
  r->set_batch_rows(rows);
  return c;
}

// Two daemons registered with a fake coordinator, and the job's plan.
class StageWorkerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    grpc::ServerBuilder builder;
    builder.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port_);
    builder.RegisterService(&coordinator_);
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    for (int w = 0; w < 2; ++w) {
      StageWorkerOptions o;
      o.coordinator = absl::StrCat("127.0.0.1:", port_);
      o.listen = "127.0.0.1:0";
      o.name = absl::StrCat("w", w);
      o.gflops = 1;  // no probe in tests.
      o.threads_max = 2;
      o.emulate_gflops = emulate_gflops_;
      absl::StatusOr<std::unique_ptr<StageWorkerDaemon>> d = StageWorkerDaemon::Start(o);
      ASSERT_TRUE(d.ok()) << d.status();
      daemons_.push_back(*std::move(d));
    }
    for (int w = 0; w < 2; ++w) {
      absl::StatusOr<v1::RegisterWorker> reg = coordinator_.WaitRegistered(Name(w));
      ASSERT_TRUE(reg.ok()) << reg.status();
      EXPECT_EQ(reg->address(), daemons_[w]->address());
      EXPECT_GT(reg->gflops(), 0);
      EXPECT_GT(reg->cores(), 0);
    }
    model_ = model::testing::BuildOrDie(model::testing::kMlpSpec);
    absl::StatusOr<schedule::Plan> plan =
        schedule::GenerateSchedule({schedule::ScheduleKind::kOneFOneB, 2, kMicrobatches, 1});
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

  // Replaces the plan (1F1B, S = 2, V = 1 after SetUp).
  void UsePlan(schedule::ScheduleKind kind, int virtual_stages) {
    absl::StatusOr<schedule::Plan> plan =
        schedule::GenerateSchedule({kind, 2, kMicrobatches, virtual_stages});
    ASSERT_TRUE(plan.ok()) << plan.status();
    plan_ = *std::move(plan);
  }

  int LastChunk() const { return plan_.num_chunks() - 1; }

  // The Assign of worker `rank`: the layers cut evenly into the plan's chunks (with S*V = 2:
  // [0, 3) and [3, 6)), placed by the plan.
  v1::WorkerCommand AssignCommand(int rank, int64_t generation) {
    v1::WorkerCommand c;
    v1::Assign* a = c.mutable_assign();
    a->set_job(kJob);
    a->set_generation(generation);
    a->set_rank(rank);
    *a->mutable_model() = model_->spec();
    *a->mutable_optimizer() = model::OptimizerToProto(Optimizer());
    a->set_seed(kSeed);
    a->set_threads(1);
    a->set_stages(2);
    a->set_virtual_stages(plan_.virtual_stages());
    a->set_microbatches(kMicrobatches);
    const int chunks = plan_.num_chunks();
    const int64_t layers = model_->num_layers();
    // dualpipe: two copies of 2 stages, chunk 2 + k repeating chunk k's layers.
    const bool copies = plan_.placement.kind == schedule::PlacementKind::kBidirectional;
    const int cuts = copies ? chunks / 2 : chunks;
    for (int chunk = 0; chunk < chunks; ++chunk) {
      const int k = chunk % cuts;
      v1::ChunkSpec* spec = a->add_chunks();
      spec->set_chunk(chunk);
      spec->set_rank(plan_.placement.OwnerOf(chunk));
      spec->set_first_layer(k * layers / cuts);
      spec->set_last_layer((k + 1) * layers / cuts);
    }
    for (auto& d : daemons_) a->add_worker_addresses(d->address());
    for (const schedule::Action& act : plan_.actions[rank])
      *a->add_actions() = control::ActionToProto(act);
    a->set_link_secret(SecretOf(generation));
    // The level of the in-process reference the results are compared with.
    a->set_isa(std::string(math::IsaName(model_->isa())));
    return c;
  }

  // The link secret the fake coordinator gives `generation` (Assign.link_secret).
  static std::string SecretOf(int64_t generation) {
    return absl::StrCat("secret-of-generation-", generation);
  }

  // Opens an Exchange stream to worker `w` as `peer` for (kJob, generation) presenting `secret`,
  // and returns the status the stream ends with (DEADLINE_EXCEEDED if it still runs after 10 s).
  absl::Status StreamEnd(int w, const std::string& peer, int64_t generation,
                         const std::string& secret) {
    absl::Mutex mu;
    absl::Status ended;
    bool done = false;
    LinkSettings settings;
    settings.validation.expected = wire::StreamIdentity{kJob, generation};
    settings.validation.num_microbatches = kMicrobatches;
    settings.validation.num_chunks = plan_.num_chunks();
    settings.callbacks.on_tensor = [](const TensorKey&, math::Matrix) { return absl::OkStatus(); };
    settings.callbacks.on_error = [&](const absl::Status& status) {
      absl::MutexLock lock(&mu);
      ended = status;
      done = true;
    };
    absl::StatusOr<std::unique_ptr<PeerLink>> link = PeerLink::Connect(
        link::CreateExchangeChannel(daemons_[w]->address()), daemons_[w]->address(),
        PeerHello{peer, wire::StreamIdentity{kJob, generation}, secret}, LinkOptions{}, settings);
    if (!link.ok()) return link.status();
    {
      absl::MutexLock lock(&mu);
      if (!mu.AwaitWithTimeout(absl::Condition(&done), absl::Seconds(10))) {
        ended = absl::DeadlineExceededError("the stream was not refused within 10 s");
      }
    }
    (*link)->Shutdown();  // no callback runs after this: `mu` may go.
    absl::MutexLock lock(&mu);
    return ended;
  }

  // Assigns both workers at `generation` and waits for both Assigned.
  void AssignBoth(int64_t generation) {
    for (int w = 0; w < 2; ++w)
      ASSERT_TRUE(coordinator_.Send(Name(w), AssignCommand(w, generation)));
    for (int w = 0; w < 2; ++w) {
      absl::StatusOr<v1::WorkerEvent> e = coordinator_.Next(Name(w));
      ASSERT_TRUE(e.ok()) << e.status();
      ASSERT_TRUE(e->has_assigned()) << e->DebugString();
      EXPECT_EQ(e->assigned().job(), kJob);
      EXPECT_EQ(e->assigned().generation(), generation);
    }
  }

  // The single-process trainer the workers' steps must equal: the same model, micro-batches, seed
  // and optimizer, one thread.
  absl::StatusOr<std::unique_ptr<model::ReferenceTrainer>> Reference() const {
    model::TrainerOptions ro;
    ro.microbatches = kMicrobatches;
    ro.threads = 1;
    ro.seed = kSeed;
    ro.optimizer = Optimizer();
    return model::ReferenceTrainer::Create(model_.get(), ro);
  }

  // Opens the coordinator's feed stream to worker `w` (as peer "coordinator").
  PeerLink* Feed(int w, int64_t generation) {
    LinkSettings settings;
    settings.validation.expected = wire::StreamIdentity{kJob, generation};
    settings.validation.num_microbatches = kMicrobatches;
    settings.validation.num_chunks = plan_.num_chunks();
    settings.callbacks.on_tensor = [](const TensorKey& key, math::Matrix) {
      return absl::InvalidArgumentError("the coordinator receives no tensors");
    };
    absl::StatusOr<std::unique_ptr<PeerLink>> link = PeerLink::Connect(
        link::CreateExchangeChannel(daemons_[w]->address()), daemons_[w]->address(),
        PeerHello{"coordinator", wire::StreamIdentity{kJob, generation}, SecretOf(generation)},
        LinkOptions{}, settings);
    EXPECT_TRUE(link.ok()) << link.status();
    if (!link.ok()) return nullptr;
    feeds_.push_back(*std::move(link));
    return feeds_.back().get();
  }

  // Sends the input and the target of every micro-batch of `batch` to the ends of its route
  // (plan_.RouteBegin/RouteEnd: chunk 0 and the last chunk, or one copy's under dualpipe), over
  // `feeds`, the coordinator's stream to each rank.
  void FeedRouted(const std::map<int, PeerLink*>& feeds, int64_t step, const io::Batch& batch) {
    const int64_t mb_rows = batch.inputs.rows() / kMicrobatches;
    for (int mb = 0; mb < kMicrobatches; ++mb) {
      const int first = plan_.RouteBegin(mb);
      const int last = plan_.RouteEnd(mb) - 1;
      auto x = std::make_shared<const math::Matrix>(batch.inputs.middleRows(mb * mb_rows, mb_rows));
      ASSERT_TRUE(feeds.at(plan_.placement.OwnerOf(first))
                      ->Send(TensorKey{step, mb, first, TensorKind::kInput}, x)
                      .ok());
      auto y =
          std::make_shared<const math::Matrix>(batch.targets.middleRows(mb * mb_rows, mb_rows));
      ASSERT_TRUE(feeds.at(plan_.placement.OwnerOf(last))
                      ->Send(TensorKey{step, mb, last, TensorKind::kTarget}, y)
                      .ok());
    }
  }

  // Sends the inputs of every micro-batch of `batch` to `in` and the targets to `target`.
  void FeedBatch(PeerLink* in, PeerLink* target, int64_t step, const io::Batch& batch) {
    const int64_t mb_rows = batch.inputs.rows() / kMicrobatches;
    for (int mb = 0; mb < kMicrobatches; ++mb) {
      if (in != nullptr) {
        auto x =
            std::make_shared<const math::Matrix>(batch.inputs.middleRows(mb * mb_rows, mb_rows));
        ASSERT_TRUE(in->Send(TensorKey{step, mb, 0, TensorKind::kInput}, x).ok());
      }
      if (target != nullptr) {
        auto y =
            std::make_shared<const math::Matrix>(batch.targets.middleRows(mb * mb_rows, mb_rows));
        ASSERT_TRUE(target->Send(TensorKey{step, mb, LastChunk(), TensorKind::kTarget}, y).ok());
      }
    }
  }

  FakeCoordinator coordinator_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  double emulate_gflops_ = 0;  // set by derived fixtures before SetUp.
  std::vector<std::unique_ptr<StageWorkerDaemon>> daemons_;
  std::vector<std::unique_ptr<PeerLink>> feeds_;
  std::unique_ptr<model::Model> model_;
  schedule::Plan plan_;
};

struct ScheduleCase {
  schedule::ScheduleKind kind;
  int virtual_stages;
};

class StageWorkerScheduleTest : public StageWorkerTest,
                                public ::testing::WithParamInterface<ScheduleCase> {
 protected:
  // Two steps of the parameter's schedule and a checkpoint, bitwise equal to the reference.
  void ExpectTwoStepsBitwiseEqualToTheReference();
};

std::string CaseName(const ::testing::TestParamInfo<ScheduleCase>& info) {
  std::string name(schedule::ScheduleKindName(info.param.kind));
  for (char& ch : name) {
    if (ch == '-') ch = '_';
  }
  return absl::StrCat(name, "_V", info.param.virtual_stages);
}

INSTANTIATE_TEST_SUITE_P(Schedules, StageWorkerScheduleTest,
                         ::testing::Values(ScheduleCase{schedule::ScheduleKind::kOneFOneB, 1},
                                           ScheduleCase{schedule::ScheduleKind::kGPipe, 1},
                                           ScheduleCase{schedule::ScheduleKind::kZbH1, 1},
                                           ScheduleCase{schedule::ScheduleKind::kInterleaved, 2},
                                           ScheduleCase{schedule::ScheduleKind::kZbV, 2},
                                           ScheduleCase{schedule::ScheduleKind::kDualPipe, 2}),
                         CaseName);

// Two steps and a checkpoint, bitwise equal to the reference. Interleaved sends activations from
// rank 1 to rank 0 (chunk 1 -> 2) over the stream rank 0 dialled; ZB-V places chunks 0 and 3 on
// rank 0, which then gets both inputs and targets from the coordinator.
TEST_P(StageWorkerScheduleTest, TwoStepsAreBitwiseEqualToTheReference) {
  ExpectTwoStepsBitwiseEqualToTheReference();
}

void StageWorkerScheduleTest::ExpectTwoStepsBitwiseEqualToTheReference() {
  UsePlan(GetParam().kind, GetParam().virtual_stages);
  constexpr int64_t kGeneration = 1;
  AssignBoth(kGeneration);
  // The ranks at the ends of the micro-batches' routes, and the one whose loss each reports.
  std::map<int, PeerLink*> feeds;
  std::vector<int> loss_owner;
  for (int mb = 0; mb < kMicrobatches; ++mb) {
    for (int chunk : {plan_.RouteBegin(mb), plan_.RouteEnd(mb) - 1}) {
      const int rank = plan_.placement.OwnerOf(chunk);
      if (feeds.count(rank) == 0) feeds[rank] = Feed(rank, kGeneration);
      ASSERT_NE(feeds[rank], nullptr);
    }
    loss_owner.push_back(plan_.placement.OwnerOf(plan_.RouteEnd(mb) - 1));
  }

  auto reference = Reference();
  ASSERT_TRUE(reference.ok()) << reference.status();

  for (int64_t step = 1; step <= 2; ++step) {
    SCOPED_TRACE(absl::StrCat("step ", step));
    const io::Batch batch = model::testing::MakeBatch(*model_, kSamples, static_cast<int>(step));
    absl::StatusOr<model::StepResult> want = (*reference)->Step(batch);
    ASSERT_TRUE(want.ok()) << want.status();

    const int64_t rows = batch.inputs.rows();
    for (int w = 0; w < 2; ++w) {
      ASSERT_TRUE(coordinator_.Send(Name(w), RunStepCommand(kGeneration, step, rows)));
    }
    FeedRouted(feeds, step, batch);
    std::vector<double> per_layer(model_->num_layers(), 0.0);
    std::vector<float> losses(kMicrobatches, 0.0f);
    for (int w = 0; w < 2; ++w) {
      absl::StatusOr<v1::WorkerEvent> e = coordinator_.Next(Name(w));
      ASSERT_TRUE(e.ok()) << e.status();
      ASSERT_TRUE(e->has_step_done()) << e->DebugString();
      const v1::StepDone& done = e->step_done();
      EXPECT_EQ(done.step(), step);
      EXPECT_EQ(done.generation(), kGeneration);
      EXPECT_EQ(done.timings_size(), static_cast<int>(plan_.actions[w].size()));
      for (const v1::ActionTiming& t : done.timings()) {
        EXPECT_LE(t.start_us(), t.end_us());
        EXPECT_GE(t.wait_us(), 0);
      }
      for (const v1::LayerNormSq& n : done.grad_norms()) {
        EXPECT_EQ(per_layer[n.layer()], 0.0) << "layer " << n.layer() << " reported twice";
        per_layer[n.layer()] = n.norm_sq();
      }
      if (std::count(loss_owner.begin(), loss_owner.end(), w) == 0) {
        EXPECT_EQ(done.microbatch_losses_size(), 0);
        continue;
      }
      ASSERT_EQ(done.microbatch_losses_size(), kMicrobatches);
      for (int mb = 0; mb < kMicrobatches; ++mb) {
        if (loss_owner[mb] == w) losses[mb] = done.microbatch_losses(mb);
      }
    }
    ASSERT_EQ(losses.size(), want->microbatch_losses.size());
    float loss = 0;
    for (size_t mb = 0; mb < losses.size(); ++mb) {
      EXPECT_EQ(Bits(losses[mb]), Bits(want->microbatch_losses[mb])) << "mb " << mb;
      loss += losses[mb];
    }
    EXPECT_EQ(Bits(loss), Bits(want->loss));
    const double norm_sq = model::SumLayerNormSq(per_layer);
    EXPECT_EQ(norm_sq, want->grad_norm_sq);
    const float clip = math::ClipScale(norm_sq, Optimizer().clip_norm);
    EXPECT_EQ(Bits(clip), Bits(want->clip_scale));

    for (int w = 0; w < 2; ++w) {
      v1::WorkerCommand c;
      v1::Commit* commit = c.mutable_commit();
      commit->set_job(kJob);
      commit->set_generation(kGeneration);
      commit->set_step(step);
      commit->set_clip_scale(clip);
      ASSERT_TRUE(coordinator_.Send(Name(w), c));
    }
    for (int w = 0; w < 2; ++w) {
      absl::StatusOr<v1::WorkerEvent> e = coordinator_.Next(Name(w));
      ASSERT_TRUE(e.ok()) << e.status();
      ASSERT_TRUE(e->has_committed()) << e->DebugString();
      EXPECT_EQ(e->committed().step(), step);
    }
  }

  // Shards uploaded by both workers, byte for byte equal to the reference's files.
  const std::string ref_dir = TempDir("reference");
  for (int w = 0; w < 2; ++w) {
    v1::WorkerCommand c;
    v1::SaveShards* save = c.mutable_save_shards();
    save->set_job(kJob);
    save->set_generation(kGeneration);
    save->set_step(2);
    ASSERT_TRUE(coordinator_.Send(Name(w), c));
  }
  for (int w = 0; w < 2; ++w) {
    absl::StatusOr<v1::WorkerEvent> e = coordinator_.Next(Name(w));
    ASSERT_TRUE(e.ok()) << e.status();
    ASSERT_TRUE(e->has_shards_saved()) << e->DebugString();
  }
  model::CheckpointManifest manifest;
  manifest.step = (*reference)->steps_done();
  manifest.model_spec = model_->spec();
  manifest.optimizer = math::FormatOptimizerConfig(Optimizer());
  manifest.seed = kSeed;
  manifest.batch_size = kSamples;
  manifest.microbatches = kMicrobatches;
  manifest.shards = model::LayerShards(*model_, 0, model_->num_layers());
  ASSERT_EQ(manifest.step, 2);
  ASSERT_TRUE(model::SaveCheckpoint(ref_dir, manifest, (*reference)->ExportState()).ok());
  ASSERT_FALSE(manifest.shards.empty());
  for (const model::CheckpointShard& shard : manifest.shards) {
    const std::string want = ReadBytes(absl::StrCat(ref_dir, "/", shard.file));
    const std::string got = coordinator_.Uploaded(shard.file);
    ASSERT_FALSE(want.empty()) << shard.file;
    EXPECT_TRUE(got == want) << shard.file << " differs from the reference's";
  }
}

// The tied GPT (tie_embeddings) on two daemons: with 1F1B and interleaved the ranks of chunk 0 and
// the last chunk exchange their parts of the table's gradient over the Exchange stream between
// them; with ZB-V rank 0 holds both ends and sums them itself. Every step and the checkpoint (no
// file for the head) are the reference's bit for bit.
class StageWorkerTiedScheduleTest : public StageWorkerScheduleTest {
 protected:
  void SetUp() override {
    StageWorkerScheduleTest::SetUp();
    model_ = model::testing::BuildOrDie(model::testing::kTiedGptSpec);
  }
};

INSTANTIATE_TEST_SUITE_P(Schedules, StageWorkerTiedScheduleTest,
                         ::testing::Values(ScheduleCase{schedule::ScheduleKind::kOneFOneB, 1},
                                           ScheduleCase{schedule::ScheduleKind::kInterleaved, 2},
                                           ScheduleCase{schedule::ScheduleKind::kZbV, 2},
                                           ScheduleCase{schedule::ScheduleKind::kDualPipe, 2}),
                         CaseName);

TEST_P(StageWorkerTiedScheduleTest, TwoStepsAreBitwiseEqualToTheReference) {
  ExpectTwoStepsBitwiseEqualToTheReference();
}

// Opens an Exchange stream to worker `w` as `peer` (with the generation's secret), sends one
// [2, 3] tensor under `key` and returns the status the stream ends with (DEADLINE_EXCEEDED if it
// still runs after 10 s).
absl::Status SendAndAwaitEnd(const std::string& address, const std::string& peer,
                             int64_t generation, const std::string& secret, int chunks,
                             const TensorKey& key) {
  absl::Mutex mu;
  absl::Status ended;
  bool done = false;
  LinkSettings settings;
  settings.validation.expected = wire::StreamIdentity{kJob, generation};
  settings.validation.num_microbatches = kMicrobatches;
  settings.validation.num_chunks = chunks;
  settings.callbacks.on_tensor = [](const TensorKey&, math::Matrix) { return absl::OkStatus(); };
  settings.callbacks.on_error = [&](const absl::Status& status) {
    absl::MutexLock lock(&mu);
    ended = status;
    done = true;
  };
  absl::StatusOr<std::unique_ptr<PeerLink>> link = PeerLink::Connect(
      link::CreateExchangeChannel(address), address,
      PeerHello{peer, wire::StreamIdentity{kJob, generation}, secret}, LinkOptions{}, settings);
  if (!link.ok()) return link.status();
  absl::Status sent = (*link)->Send(key, std::make_shared<const math::Matrix>(2, 3));
  {
    absl::MutexLock lock(&mu);
    if (sent.ok() && !mu.AwaitWithTimeout(absl::Condition(&done), absl::Seconds(10))) {
      ended = absl::DeadlineExceededError("the stream was not refused within 10 s");
    }
  }
  (*link)->Shutdown();  // no callback runs after this: `mu` may go.
  absl::MutexLock lock(&mu);
  return sent.ok() ? ended : sent;
}

// Only the tie's other end sends a tied_gradient: the coordinator's feed stream to rank 0 (inputs
// and targets only) is refused naming the kind. The tie's own stream is a neighbour's, fenced by
// generation and secret like every other.
TEST_P(StageWorkerTiedScheduleTest, ATiedGradientFromAnotherPeerIsRefused) {
  if (GetParam().kind != schedule::ScheduleKind::kOneFOneB) GTEST_SKIP() << "one case suffices";
  UsePlan(GetParam().kind, GetParam().virtual_stages);
  AssignBoth(1);
  const absl::Status feed =
      SendAndAwaitEnd(daemons_[0]->address(), "coordinator", 1, SecretOf(1), plan_.num_chunks(),
                      TensorKey{1, 0, 0, TensorKind::kTiedGradient});
  EXPECT_EQ(feed.code(), absl::StatusCode::kInvalidArgument) << feed;
  EXPECT_THAT(feed.message(), HasSubstr("tied_gradient frames are not accepted on this stream"));
  EXPECT_EQ(StreamEnd(1, "stage/0", 2, SecretOf(2)).code(), absl::StatusCode::kAborted);
  EXPECT_EQ(StreamEnd(1, "stage/0", 1, "not-the-secret").code(),
            absl::StatusCode::kUnauthenticated);
}

// Under dualpipe only the rank holding a stage's other copy sends its copy_gradient: the same
// frame on the coordinator's feed stream to rank 0 (inputs and targets only) is refused naming
// the kind, and the stream ends.
TEST_P(StageWorkerScheduleTest, ACopyGradientFromANonPeerIsRefused) {
  if (GetParam().kind != schedule::ScheduleKind::kDualPipe) GTEST_SKIP() << "dualpipe only";
  UsePlan(GetParam().kind, GetParam().virtual_stages);
  AssignBoth(1);
  const absl::Status feed =
      SendAndAwaitEnd(daemons_[0]->address(), "coordinator", 1, SecretOf(1), plan_.num_chunks(),
                      TensorKey{1, 0, 0, TensorKind::kCopyGradient});
  EXPECT_EQ(feed.code(), absl::StatusCode::kInvalidArgument) << feed;
  EXPECT_THAT(feed.message(), HasSubstr("copy_gradient frames are not accepted on this stream"));
}

// Daemons emulating 1e-4 GFLOP/s (1e5 FLOP/s): the test MLP's step then takes ~0.1 s of
// emulated compute per worker.
class StageWorkerEmulationTest : public StageWorkerTest {
 protected:
  StageWorkerEmulationTest() { emulate_gflops_ = 1e-4; }
};

TEST_F(StageWorkerEmulationTest, ActionsTakeTheirEmulatedTimeAndResultsStayExact) {
  constexpr int64_t kGeneration = 1;
  AssignBoth(kGeneration);
  PeerLink* in = Feed(0, kGeneration);
  PeerLink* target = Feed(1, kGeneration);
  ASSERT_NE(in, nullptr);
  ASSERT_NE(target, nullptr);
  auto reference = Reference();
  ASSERT_TRUE(reference.ok()) << reference.status();
  const io::Batch batch = model::testing::MakeBatch(*model_, kSamples, 0);
  absl::StatusOr<model::StepResult> want = (*reference)->Step(batch);
  ASSERT_TRUE(want.ok()) << want.status();

  // Each worker's actions, serialised at the emulated rate, bound the step's time from below.
  const int64_t rows = batch.inputs.rows();
  const int64_t mb_rows = rows / kMicrobatches;
  const int64_t layers = model_->num_layers();
  double longest = 0;
  std::vector<std::vector<double>> action_us(2);  // [worker][action] emulated microseconds.
  for (int w = 0; w < 2; ++w) {
    double total = 0;
    for (const schedule::Action& a : plan_.actions[w]) {
      double flops = 0;
      for (int64_t l = a.chunk * layers / 2; l < (a.chunk + 1) * layers / 2; ++l) {
        const math::FlopCount f = model_->layer(l).Flops(mb_rows);
        flops += a.op == schedule::Op::kForward ? f.forward : f.backward_input + f.backward_weight;
      }
      action_us[w].push_back(flops / (emulate_gflops_ * 1e9) * 1e6);
      total += flops / (emulate_gflops_ * 1e9);
    }
    longest = std::max(longest, total);
  }
  ASSERT_GT(longest, 0.01);

  const absl::Time t0 = absl::Now();
  for (int w = 0; w < 2; ++w) {
    ASSERT_TRUE(coordinator_.Send(Name(w), RunStepCommand(kGeneration, 0, rows)));
  }
  FeedBatch(in, target, 0, batch);
  std::vector<float> losses;
  for (int w = 0; w < 2; ++w) {
    absl::StatusOr<v1::WorkerEvent> e = coordinator_.Next(Name(w));
    ASSERT_TRUE(e.ok()) << e.status();
    ASSERT_TRUE(e->has_step_done()) << e->DebugString();
    if (w == 1) {
      losses.assign(e->step_done().microbatch_losses().begin(),
                    e->step_done().microbatch_losses().end());
    }
    // The reported timeline is the emulated one: each action computes for its emulated time (or
    // longer: where the real compute was slower, e.g. on a loaded machine, real time wins), in
    // order, without overlap.
    const auto& timings = e->step_done().timings();
    ASSERT_EQ(timings.size(), static_cast<int>(action_us[w].size()));
    double prev_end = 0;
    for (int i = 0; i < timings.size(); ++i) {
      const v1::ActionTiming& t = timings[i];
      EXPECT_GE(t.end_us() - t.start_us() - t.wait_us(), action_us[w][i] - 0.01) << i;
      EXPECT_NEAR(t.start_us(), prev_end, 0.01) << i;
      EXPECT_GE(t.wait_us(), 0) << i;
      prev_end = t.end_us();
    }
  }
  const double wall = absl::ToDoubleSeconds(absl::Now() - t0);
  EXPECT_GE(wall, longest * 0.999) << "emulated compute of the busiest worker: " << longest;
  ASSERT_EQ(losses.size(), want->microbatch_losses.size());
  for (size_t mb = 0; mb < losses.size(); ++mb) {
    EXPECT_EQ(Bits(losses[mb]), Bits(want->microbatch_losses[mb])) << "mb " << mb;
  }
}

TEST_F(StageWorkerTest, AbortedStepRunsAgainInTheSameGeneration) {
  constexpr int64_t kGeneration = 4;
  AssignBoth(kGeneration);
  PeerLink* in = Feed(0, kGeneration);
  PeerLink* target = Feed(1, kGeneration);
  ASSERT_NE(in, nullptr);
  ASSERT_NE(target, nullptr);
  const io::Batch batch = model::testing::MakeBatch(*model_, kSamples, 0);
  const int64_t rows = batch.inputs.rows();
  // Step 0 starts without inputs (nothing is in flight), and is aborted.
  for (int w = 0; w < 2; ++w) {
    ASSERT_TRUE(coordinator_.Send(Name(w), RunStepCommand(kGeneration, 0, rows)));
  }
  for (int w = 0; w < 2; ++w) {
    v1::WorkerCommand c;
    c.mutable_abort()->set_job(kJob);
    c.mutable_abort()->set_generation(kGeneration);
    c.mutable_abort()->set_step(0);
    c.mutable_abort()->set_reason("test");
    ASSERT_TRUE(coordinator_.Send(Name(w), c));
  }
  for (int w = 0; w < 2; ++w) {
    absl::StatusOr<v1::WorkerEvent> e = coordinator_.Next(Name(w));
    ASSERT_TRUE(e.ok()) << e.status();
    ASSERT_TRUE(e->has_error()) << e->DebugString();
    EXPECT_EQ(e->error().code(), static_cast<int>(absl::StatusCode::kAborted));
    EXPECT_EQ(e->error().step(), 0);
  }
  // The re-run is exact.
  auto reference = Reference();
  ASSERT_TRUE(reference.ok()) << reference.status();
  absl::StatusOr<model::StepResult> want = (*reference)->Step(batch);
  ASSERT_TRUE(want.ok()) << want.status();
  for (int w = 0; w < 2; ++w) {
    ASSERT_TRUE(coordinator_.Send(Name(w), RunStepCommand(kGeneration, 0, rows)));
  }
  FeedBatch(in, target, 0, batch);
  for (int w = 0; w < 2; ++w) {
    absl::StatusOr<v1::WorkerEvent> e = coordinator_.Next(Name(w));
    ASSERT_TRUE(e.ok()) << e.status();
    ASSERT_TRUE(e->has_step_done()) << e->DebugString();
    if (w == 1) {
      ASSERT_EQ(e->step_done().microbatch_losses_size(), kMicrobatches);
      for (int mb = 0; mb < kMicrobatches; ++mb) {
        EXPECT_EQ(Bits(e->step_done().microbatch_losses(mb)), Bits(want->microbatch_losses[mb]));
      }
    }
  }
}

// Issue 14: a process that is not one of the generation's peers opens Exchange streams to rank 1
// claiming to be rank 0 (and the coordinator) before the real rank 0 dials. Without the
// generation's link secret it is refused, takes no slot, and the step runs exactly as without it.
TEST_F(StageWorkerTest, ImpostorWithoutTheLinkSecretIsRefusedAndDisplacesNoPeer) {
  constexpr int64_t kGeneration = 2;
  AssignBoth(kGeneration);
  for (const std::string& secret :
       {std::string(), SecretOf(kGeneration - 1), std::string("guess")}) {
    SCOPED_TRACE(absl::StrCat("secret '", secret, "'"));
    const absl::Status as_peer = StreamEnd(1, "stage/0", kGeneration, secret);
    EXPECT_EQ(as_peer.code(), absl::StatusCode::kUnauthenticated) << as_peer;
    EXPECT_THAT(as_peer.message(), HasSubstr("does not present the generation's link secret"));
    EXPECT_EQ(StreamEnd(1, "coordinator", kGeneration, secret).code(),
              absl::StatusCode::kUnauthenticated);
  }
  PeerLink* in = Feed(0, kGeneration);
  PeerLink* target = Feed(1, kGeneration);
  ASSERT_NE(in, nullptr);
  ASSERT_NE(target, nullptr);
  auto reference = Reference();
  ASSERT_TRUE(reference.ok()) << reference.status();
  const io::Batch batch = model::testing::MakeBatch(*model_, kSamples, 0);
  absl::StatusOr<model::StepResult> want = (*reference)->Step(batch);
  ASSERT_TRUE(want.ok()) << want.status();
  for (int w = 0; w < 2; ++w) {
    ASSERT_TRUE(coordinator_.Send(Name(w), RunStepCommand(kGeneration, 0, batch.inputs.rows())));
  }
  FeedBatch(in, target, 0, batch);
  for (int w = 0; w < 2; ++w) {
    absl::StatusOr<v1::WorkerEvent> e = coordinator_.Next(Name(w));
    ASSERT_TRUE(e.ok()) << e.status();
    ASSERT_TRUE(e->has_step_done()) << e->DebugString();
    if (w == 1) {
      ASSERT_EQ(e->step_done().microbatch_losses_size(), kMicrobatches);
      for (int mb = 0; mb < kMicrobatches; ++mb) {
        EXPECT_EQ(Bits(e->step_done().microbatch_losses(mb)), Bits(want->microbatch_losses[mb]));
      }
    }
  }
  // Once rank 0's real stream is in, a second claimant with the secret is still refused: the
  // legitimate stream is never displaced.
  EXPECT_EQ(StreamEnd(1, "stage/0", kGeneration, SecretOf(kGeneration)).code(),
            absl::StatusCode::kFailedPrecondition);
}

TEST_F(StageWorkerTest, HealthServiceReportsServing) {
  // grpc.health.v1.Health/Check with an empty request (service ""), over the generic stub.
  grpc::GenericStub stub(
      grpc::CreateChannel(daemons_[0]->address(), grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  grpc::CompletionQueue cq;
  grpc::Slice empty("");
  grpc::ByteBuffer request(&empty, 1);
  std::unique_ptr<grpc::GenericClientAsyncResponseReader> call =
      stub.PrepareUnaryCall(&context, "/grpc.health.v1.Health/Check", request, &cq);
  call->StartCall();
  grpc::ByteBuffer response;
  grpc::Status status;
  call->Finish(&response, &status, reinterpret_cast<void*>(1));
  void* tag = nullptr;
  bool ok = false;
  ASSERT_TRUE(cq.Next(&tag, &ok));
  EXPECT_TRUE(ok);
  ASSERT_TRUE(status.ok()) << status.error_message();
  std::vector<grpc::Slice> slices;
  ASSERT_TRUE(response.Dump(&slices).ok());
  std::string bytes;
  for (const grpc::Slice& slice : slices) {
    bytes.append(reinterpret_cast<const char*>(slice.begin()), slice.size());
  }
  EXPECT_EQ(bytes, std::string("\x08\x01"));  // HealthCheckResponse{status: SERVING}
  cq.Shutdown();
  while (cq.Next(&tag, &ok)) {
  }
}

TEST_F(StageWorkerTest, BadAssignIsInvalidArgumentAndTheWorkerStaysUsable) {
  v1::WorkerCommand bad = AssignCommand(0, 3);
  bad.mutable_assign()->mutable_chunks(1)->set_rank(7);  // no such rank
  ASSERT_TRUE(coordinator_.Send(Name(0), bad));
  absl::StatusOr<v1::WorkerEvent> e = coordinator_.Next(Name(0));
  ASSERT_TRUE(e.ok()) << e.status();
  ASSERT_TRUE(e->has_error()) << e->DebugString();
  EXPECT_EQ(e->error().code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(e->error().message(), HasSubstr("chunk 1"));
  EXPECT_EQ(e->error().job(), kJob);
  EXPECT_EQ(e->error().generation(), 3);

  v1::WorkerCommand foreign = AssignCommand(0, 3);
  *foreign.mutable_assign()->mutable_actions(0) =
      control::ActionToProto(schedule::Action{schedule::Op::kForward, 0, 1});  // worker 1's chunk
  ASSERT_TRUE(coordinator_.Send(Name(0), foreign));
  e = coordinator_.Next(Name(0));
  ASSERT_TRUE(e.ok()) << e.status();
  ASSERT_TRUE(e->has_error()) << e->DebugString();
  EXPECT_EQ(e->error().code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(e->error().message(), HasSubstr("does not hold"));

  v1::WorkerCommand bad_model = AssignCommand(0, 3);
  bad_model.mutable_assign()->mutable_model()->mutable_layers(3)->mutable_linear()->set_in_features(
      99);
  ASSERT_TRUE(coordinator_.Send(Name(0), bad_model));
  e = coordinator_.Next(Name(0));
  ASSERT_TRUE(e.ok()) << e.status();
  ASSERT_TRUE(e->has_error()) << e->DebugString();
  EXPECT_EQ(e->error().code(), static_cast<int>(absl::StatusCode::kInvalidArgument));

  v1::WorkerCommand no_secret = AssignCommand(0, 3);
  no_secret.mutable_assign()->clear_link_secret();
  ASSERT_TRUE(coordinator_.Send(Name(0), no_secret));
  e = coordinator_.Next(Name(0));
  ASSERT_TRUE(e.ok()) << e.status();
  ASSERT_TRUE(e->has_error()) << e->DebugString();
  EXPECT_EQ(e->error().code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(e->error().message(), HasSubstr("no link_secret"));

  // An instruction-set level the worker does not know is refused; every worker registered the
  // levels this CPU runs (no --max-isa here).
  v1::WorkerCommand bad_isa = AssignCommand(0, 3);
  bad_isa.mutable_assign()->set_isa("x86-64-v9");
  ASSERT_TRUE(coordinator_.Send(Name(0), bad_isa));
  e = coordinator_.Next(Name(0));
  ASSERT_TRUE(e.ok()) << e.status();
  ASSERT_TRUE(e->has_error()) << e->DebugString();
  EXPECT_EQ(e->error().code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(e->error().message(), HasSubstr("unknown instruction set 'x86-64-v9'"));
  absl::StatusOr<v1::RegisterWorker> reg = coordinator_.WaitRegistered(Name(0));
  ASSERT_TRUE(reg.ok()) << reg.status();
  std::vector<std::string> levels;
  for (math::Isa isa : math::SupportedIsas()) levels.emplace_back(math::IsaName(isa));
  EXPECT_THAT(reg->isa_levels(), ::testing::ElementsAreArray(levels));

  // A RunStep for a job the worker does not have is refused; a valid Assign then works.
  ASSERT_TRUE(coordinator_.Send(Name(0), RunStepCommand(3, 0, kSamples)));
  e = coordinator_.Next(Name(0));
  ASSERT_TRUE(e.ok()) << e.status();
  ASSERT_TRUE(e->has_error()) << e->DebugString();
  EXPECT_EQ(e->error().code(), static_cast<int>(absl::StatusCode::kFailedPrecondition));

  ASSERT_TRUE(coordinator_.Send(Name(0), AssignCommand(0, 3)));
  e = coordinator_.Next(Name(0));
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_TRUE(e->has_assigned()) << e->DebugString();
}

TEST_F(StageWorkerTest, BrokenControlStreamDropsTheJobAndRedials) {
  AssignBoth(6);
  ASSERT_EQ(coordinator_.registrations(Name(0)), 1);
  ASSERT_TRUE(coordinator_.Kick(Name(0)));
  ASSERT_TRUE(coordinator_.WaitRegistrations(Name(0), 2));
  // The job went with the stream: a RunStep for it is refused.
  ASSERT_TRUE(coordinator_.Send(Name(0), RunStepCommand(6, 0, kSamples)));
  absl::StatusOr<v1::WorkerEvent> e = coordinator_.Next(Name(0));
  ASSERT_TRUE(e.ok()) << e.status();
  ASSERT_TRUE(e->has_error()) << e->DebugString();
  EXPECT_EQ(e->error().code(), static_cast<int>(absl::StatusCode::kFailedPrecondition));
  // And a new Assign works on the new stream.
  ASSERT_TRUE(coordinator_.Send(Name(0), AssignCommand(0, 7)));
  e = coordinator_.Next(Name(0));
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_TRUE(e->has_assigned()) << e->DebugString();
}

// ProfileLayers (docs/worker.md, "Layer profiles"): an idle worker times the model's layers at
// its registered speed; one that holds a job's stage refuses (FAILED_PRECONDITION).
TEST_F(StageWorkerTest, ProfileLayersIsTimedWhenIdleAndRefusedWhileHoldingAStage) {
  const v1::Assign assign = AssignCommand(0, 4).assign();
  v1::WorkerCommand profile;
  v1::ProfileLayers* p = profile.mutable_profile_layers();
  p->set_profile(1);
  *p->mutable_model() = assign.model();
  p->add_samples(2);
  p->set_threads(1);
  *p->mutable_optimizer() = assign.optimizer();
  ASSERT_TRUE(coordinator_.Send(Name(0), profile));
  absl::StatusOr<v1::WorkerEvent> e = coordinator_.Next(Name(0));
  ASSERT_TRUE(e.ok()) << e.status();
  ASSERT_TRUE(e->has_layers_profiled()) << e->DebugString();
  EXPECT_EQ(e->layers_profiled().profile(), 1);
  ASSERT_EQ(e->layers_profiled().code(), 0) << e->layers_profiled().message();
  EXPECT_EQ(e->layers_profiled().gflops(), daemons_[0]->gflops());
  ASSERT_EQ(e->layers_profiled().costs_size(), 1);
  EXPECT_EQ(e->layers_profiled().costs(0).samples(), 2);
  EXPECT_EQ(e->layers_profiled().costs(0).layers_size(), assign.model().layers_size());

  AssignBoth(4);
  p->set_profile(2);
  ASSERT_TRUE(coordinator_.Send(Name(0), profile));
  e = coordinator_.Next(Name(0));
  ASSERT_TRUE(e.ok()) << e.status();
  ASSERT_TRUE(e->has_layers_profiled()) << e->DebugString();
  EXPECT_EQ(e->layers_profiled().profile(), 2);
  EXPECT_EQ(e->layers_profiled().code(), static_cast<int>(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(e->layers_profiled().message(), HasSubstr("holds a stage of job"));
  EXPECT_EQ(e->layers_profiled().costs_size(), 0);
}

TEST_F(StageWorkerTest, ReleaseDropsTheJob) {
  AssignBoth(9);
  // A Release of another job or a later generation's job leaves the job alone...
  v1::WorkerCommand other;
  other.mutable_release()->set_job("another-job");
  other.mutable_release()->set_generation(9);
  ASSERT_TRUE(coordinator_.Send(Name(0), other));
  v1::WorkerCommand release;
  release.mutable_release()->set_job(kJob);
  release.mutable_release()->set_generation(9);
  release.mutable_release()->set_reason("job done");
  ASSERT_TRUE(coordinator_.Send(Name(1), release));
  // ... Release is not answered, and commands are handled in order: the RunStep behind each
  // Release shows what it did.
  ASSERT_TRUE(coordinator_.Send(Name(0), RunStepCommand(9, 0, kSamples)));
  ASSERT_TRUE(coordinator_.Send(Name(1), RunStepCommand(9, 0, kSamples)));
  absl::StatusOr<v1::WorkerEvent> e = coordinator_.Next(Name(1));
  ASSERT_TRUE(e.ok()) << e.status();
  ASSERT_TRUE(e->has_error()) << e->DebugString();
  EXPECT_EQ(e->error().code(), static_cast<int>(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(e->error().message(), HasSubstr("no job"));
  // Worker 0 still runs the job: its step fails only by the Abort (ABORTED) or by its released
  // neighbour refusing the link it dials at the step (ABORTED or UNAVAILABLE naming the link) —
  // whichever comes first is the scheduler's choice — never with its own "no job".
  v1::WorkerCommand abort;
  abort.mutable_abort()->set_job(kJob);
  abort.mutable_abort()->set_generation(9);
  abort.mutable_abort()->set_step(0);
  ASSERT_TRUE(coordinator_.Send(Name(0), abort));
  e = coordinator_.Next(Name(0));
  ASSERT_TRUE(e.ok()) << e.status();
  ASSERT_TRUE(e->has_error()) << e->DebugString();
  EXPECT_THAT(e->error().code(), ::testing::AnyOf(static_cast<int>(absl::StatusCode::kAborted),
                                                  static_cast<int>(absl::StatusCode::kUnavailable)))
      << e->DebugString();
  EXPECT_EQ(e->error().job(), kJob);
  EXPECT_THAT(e->error().message(), ::testing::Not(HasSubstr("this worker has no job")));
  // The released worker takes a new job.
  ASSERT_TRUE(coordinator_.Send(Name(1), AssignCommand(1, 10)));
  e = coordinator_.Next(Name(1));
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_TRUE(e->has_assigned()) << e->DebugString();
}

TEST_F(StageWorkerTest, FeedStreamCanBeReplacedWithinTheGeneration) {
  constexpr int64_t kGeneration = 8;
  AssignBoth(kGeneration);
  const io::Batch batch = model::testing::MakeBatch(*model_, kSamples, 0);
  const int64_t rows = batch.inputs.rows();
  for (int64_t step = 1; step <= 2; ++step) {
    SCOPED_TRACE(absl::StrCat("step ", step));
    // A fresh pair of feed streams per step; the previous pair is closed first.
    for (auto& link : feeds_) link->Shutdown();
    PeerLink* in = Feed(0, kGeneration);
    PeerLink* target = Feed(1, kGeneration);
    ASSERT_NE(in, nullptr);
    ASSERT_NE(target, nullptr);
    for (int w = 0; w < 2; ++w) {
      ASSERT_TRUE(coordinator_.Send(Name(w), RunStepCommand(kGeneration, step, rows)));
    }
    FeedBatch(in, target, step, batch);
    for (int w = 0; w < 2; ++w) {
      absl::StatusOr<v1::WorkerEvent> e = coordinator_.Next(Name(w));
      ASSERT_TRUE(e.ok()) << e.status();
      ASSERT_TRUE(e->has_step_done()) << e->DebugString();
    }
    for (int w = 0; w < 2; ++w) {
      v1::WorkerCommand c;
      c.mutable_commit()->set_job(kJob);
      c.mutable_commit()->set_generation(kGeneration);
      c.mutable_commit()->set_step(step);
      c.mutable_commit()->set_clip_scale(1.0f);
      ASSERT_TRUE(coordinator_.Send(Name(w), c));
    }
    for (int w = 0; w < 2; ++w) {
      absl::StatusOr<v1::WorkerEvent> e = coordinator_.Next(Name(w));
      ASSERT_TRUE(e.ok()) << e.status();
      ASSERT_TRUE(e->has_committed()) << e->DebugString();
    }
  }
}

TEST_F(StageWorkerTest, StaleGenerationCommandIsAborted) {
  AssignBoth(5);
  v1::WorkerCommand stale = RunStepCommand(4, 0, kSamples);
  ASSERT_TRUE(coordinator_.Send(Name(1), stale));
  absl::StatusOr<v1::WorkerEvent> e = coordinator_.Next(Name(1));
  ASSERT_TRUE(e.ok()) << e.status();
  ASSERT_TRUE(e->has_error()) << e->DebugString();
  EXPECT_EQ(e->error().code(), static_cast<int>(absl::StatusCode::kAborted));
  EXPECT_EQ(e->error().generation(), 4);
}

TEST_F(StageWorkerTest, NeighbourLostMidStepFailsTheStep) {
  constexpr int64_t kGeneration = 3;
  AssignBoth(kGeneration);
  PeerLink* in = Feed(0, kGeneration);
  PeerLink* target = Feed(1, kGeneration);
  ASSERT_NE(in, nullptr);
  ASSERT_NE(target, nullptr);
  const io::Batch batch = model::testing::MakeBatch(*model_, kSamples, 0);
  const int64_t rows = batch.inputs.rows();
  // Step 1 completes: the link between the workers is established.
  for (int w = 0; w < 2; ++w) {
    ASSERT_TRUE(coordinator_.Send(Name(w), RunStepCommand(kGeneration, 1, rows)));
  }
  FeedBatch(in, target, 1, batch);
  for (int w = 0; w < 2; ++w) {
    absl::StatusOr<v1::WorkerEvent> e = coordinator_.Next(Name(w));
    ASSERT_TRUE(e.ok()) << e.status();
    ASSERT_TRUE(e->has_step_done()) << e->DebugString();
  }
  for (int w = 0; w < 2; ++w) {
    v1::WorkerCommand c;
    c.mutable_commit()->set_job(kJob);
    c.mutable_commit()->set_generation(kGeneration);
    c.mutable_commit()->set_step(1);
    c.mutable_commit()->set_clip_scale(1.0f);
    ASSERT_TRUE(coordinator_.Send(Name(w), c));
  }
  for (int w = 0; w < 2; ++w) {
    absl::StatusOr<v1::WorkerEvent> e = coordinator_.Next(Name(w));
    ASSERT_TRUE(e.ok()) << e.status();
    ASSERT_TRUE(e->has_committed()) << e->DebugString();
  }
  // Step 2: no targets, so worker 1 waits and worker 0 waits for its gradients; then worker 1
  // goes away and worker 0's established link breaks.
  for (int w = 0; w < 2; ++w) {
    ASSERT_TRUE(coordinator_.Send(Name(w), RunStepCommand(kGeneration, 2, rows)));
  }
  FeedBatch(in, nullptr, 2, batch);
  daemons_[1]->Shutdown();
  // The link may break before worker 0 reads RunStep(2) (they travel on different streams); it
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
  EXPECT_EQ(e->error().code(), static_cast<int>(absl::StatusCode::kUnavailable));
  EXPECT_THAT(e->error().message(), HasSubstr("stage/1"));
  // The generation is broken: a new RunStep fails at once with the link's status.
  v1::WorkerCommand abort;
  abort.mutable_abort()->set_job(kJob);
  abort.mutable_abort()->set_generation(kGeneration);
  abort.mutable_abort()->set_step(2);
  ASSERT_TRUE(coordinator_.Send(Name(0), abort));
  ASSERT_TRUE(coordinator_.Send(Name(0), RunStepCommand(kGeneration, 2, rows)));
  e = coordinator_.Next(Name(0));
  ASSERT_TRUE(e.ok()) << e.status();
  ASSERT_TRUE(e->has_error()) << e->DebugString();
  EXPECT_EQ(e->error().code(), static_cast<int>(absl::StatusCode::kUnavailable));
}

TEST_F(StageWorkerTest, LostNeighbourFailsTheStep) {
  constexpr int64_t kGeneration = 2;
  AssignBoth(kGeneration);
  PeerLink* in = Feed(0, kGeneration);
  ASSERT_NE(in, nullptr);
  const io::Batch batch = model::testing::MakeBatch(*model_, kSamples, 0);
  // Only worker 0 runs the step: it dials worker 1, sends activations and waits for gradients
  // that never come, because worker 1 goes away.
  ASSERT_TRUE(coordinator_.Send(Name(0), RunStepCommand(kGeneration, 0, batch.inputs.rows())));
  FeedBatch(in, nullptr, 0, batch);
  daemons_[1]->Shutdown();
  absl::StatusOr<v1::WorkerEvent> e = coordinator_.Next(Name(0));
  ASSERT_TRUE(e.ok()) << e.status();
  ASSERT_TRUE(e->has_error()) << e->DebugString();
  EXPECT_EQ(e->error().step(), 0);
  EXPECT_EQ(e->error().generation(), kGeneration);
  EXPECT_NE(e->error().code(), static_cast<int>(absl::StatusCode::kOk));
  EXPECT_NE(e->error().code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
}

// OpenLinks (the coordinator saw every rank accept the generation) makes a worker dial its
// higher-rank neighbours before any step: a neighbour that is gone is reported then, as an error
// of the generation, with no RunStep sent.
TEST_F(StageWorkerTest, OpenLinksDialsTheNeighboursBeforeAnyStep) {
  constexpr int64_t kGeneration = 2;
  AssignBoth(kGeneration);
  daemons_[1]->Shutdown();
  v1::WorkerCommand open;
  open.mutable_open_links()->set_job(kJob);
  open.mutable_open_links()->set_generation(kGeneration);
  ASSERT_TRUE(coordinator_.Send(Name(0), open));
  absl::StatusOr<v1::WorkerEvent> e = coordinator_.Next(Name(0));
  ASSERT_TRUE(e.ok()) << e.status();
  ASSERT_TRUE(e->has_error()) << e->DebugString();
  EXPECT_EQ(e->error().generation(), kGeneration);
  EXPECT_EQ(e->error().step(), 0);
  EXPECT_NE(e->error().code(), static_cast<int>(absl::StatusCode::kOk));
  EXPECT_THAT(e->error().message(), HasSubstr("stage/1"));
}

}  // namespace
}  // namespace pipetrain::worker
