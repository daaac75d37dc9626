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

#include <algorithm>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
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
#include "common/model/model.h"
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
#include "tests/server/worker/fake_job.h"

namespace pipetrain::worker {
namespace {

using link::PeerHello;
using link::PeerLink;
using ::testing::HasSubstr;
using wire::TensorKey;
using wire::TensorKind;

constexpr char kJob[] = "job-1";
constexpr uint64_t kSeed = 7;
constexpr int kMicrobatches = 4;
constexpr int64_t kSamples = 16;

using testing::Bits;
using testing::FakeCoordinator;

// ------------------------------------------------------------------ helpers

// `job` (by default: nothing else known) at `generation`, with its name and link secret: enough
// for its commands.
testing::FakeJob JobAt(int64_t generation, testing::FakeJob job = {}) {
  job.job = kJob;
  job.generation = generation;
  job.secret = absl::StrCat("secret-of-generation-", generation);
  return job;
}

v1::WorkerCommand RunStepCommand(int64_t generation, int64_t step, int64_t rows) {
  return testing::RunStepCommand(JobAt(generation), step, rows);
}

// Two daemons registered with a fake coordinator, and the job's plan.
class StageWorkerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    StageWorkerOptions o;
    o.gflops = 1;  // no probe in tests.
    o.threads_max = 2;
    o.emulate_gflops = emulate_gflops_;
    const absl::Status started = testing::StartLoopback(&coordinator_, 2, o, &server_, &daemons_);
    ASSERT_TRUE(started.ok()) << started;
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

  void TearDown() override { testing::ShutdownLoopback(feeds_, &daemons_, server_.get()); }

  static std::string Name(int w) { return testing::WorkerName(w); }

  // Replaces the plan (1F1B, S = 2, V = 1 after SetUp).
  void UsePlan(schedule::ScheduleKind kind, int virtual_stages) {
    absl::StatusOr<schedule::Plan> plan =
        schedule::GenerateSchedule({kind, 2, kMicrobatches, virtual_stages});
    ASSERT_TRUE(plan.ok()) << plan.status();
    plan_ = *std::move(plan);
  }

  int LastChunk() const { return plan_.num_chunks() - 1; }

  // The job at `generation` on both daemons: model_ and plan_, M = kMicrobatches.
  testing::FakeJob Job(int64_t generation) const {
    testing::FakeJob job = JobAt(generation, testing::FakeJob::Of(model_.get(), &plan_, daemons_));
    job.seed = kSeed;
    job.stages = 2;
    job.microbatches = kMicrobatches;
    job.samples = kSamples;
    return job;
  }

  // The Assign of worker `rank`: the layers cut evenly into the plan's chunks (with S*V = 2:
  // [0, 3) and [3, 6)), placed by the plan.
  v1::WorkerCommand AssignCommand(int rank, int64_t generation) const {
    return testing::AssignCommand(Job(generation), 0, rank);
  }

  // The link secret the fake coordinator gives `generation` (Assign.link_secret).
  static std::string SecretOf(int64_t generation) { return JobAt(generation).secret; }

  // The checks a stream of the job at `generation` applies to the frames it receives.
  wire::FrameValidation Validation(int64_t generation) const {
    wire::FrameValidation validation;
    validation.expected = wire::StreamIdentity{kJob, generation};
    validation.num_microbatches = kMicrobatches;
    validation.num_chunks = plan_.num_chunks();
    return validation;
  }

  // Opens an Exchange stream to worker `w` as `peer` for (kJob, generation) presenting `secret`,
  // and returns the status the stream ends with (DEADLINE_EXCEEDED if it still runs after 10 s).
  absl::Status StreamEnd(int w, const std::string& peer, int64_t generation,
                         const std::string& secret) {
    return testing::StreamEndStatus(daemons_[w]->address(),
                                    PeerHello{peer, wire::StreamIdentity{kJob, generation}, secret},
                                    Validation(generation), std::nullopt, absl::Seconds(10));
  }

  // Opens an Exchange stream to worker `w` as `peer` (with the secret of `generation`), sends one
  // [2, 3] tensor under `key` and returns the status the stream ends with (DEADLINE_EXCEEDED if
  // it still runs after 10 s).
  absl::Status SendAndAwaitEnd(int w, const std::string& peer, int64_t generation,
                               const TensorKey& key) {
    return testing::StreamEndStatus(
        daemons_[w]->address(),
        PeerHello{peer, wire::StreamIdentity{kJob, generation}, SecretOf(generation)},
        Validation(generation), key, absl::Seconds(10));
  }

  // Assigns both workers at `generation` and waits for both Assigned.
  void AssignBoth(int64_t generation) {
    for (int w = 0; w < 2; ++w)
      ASSERT_TRUE(coordinator_.Send(Name(w), AssignCommand(w, generation)));
    std::vector<v1::WorkerEvent> assigned;
    ASSERT_NO_FATAL_FAILURE(
        testing::ExpectNextOfAll(&coordinator_, 2, &v1::WorkerEvent::has_assigned, &assigned));
    for (const v1::WorkerEvent& e : assigned) {
      EXPECT_EQ(e.assigned().job(), kJob);
      EXPECT_EQ(e.assigned().generation(), generation);
    }
  }

  // Sends `command` to worker `w` and waits for its answer, expected to be a WorkerError (into
  // *error).
  void ExpectRefusal(int w, const v1::WorkerCommand& command, v1::WorkerError* error) {
    testing::ExpectRefusal(&coordinator_, Name(w), command, error);
  }

  // Sends `assign` to worker `w` and expects it to answer Assigned.
  void ExpectAssigned(int w, const v1::WorkerCommand& assign) {
    ASSERT_TRUE(coordinator_.Send(Name(w), assign));
    absl::StatusOr<v1::WorkerEvent> e = coordinator_.Next(Name(w));
    ASSERT_TRUE(e.ok()) << e.status();
    EXPECT_TRUE(e->has_assigned()) << e->DebugString();
  }

  // Sends `command` to both workers; false if one has no open stream.
  bool SendBoth(const v1::WorkerCommand& command) {
    return testing::SendToAll(&coordinator_, 2, command);
  }

  // The next event of both workers, each of the kind `has` tells, into *events if given.
  void ExpectNextOfBoth(bool (v1::WorkerEvent::*has)() const,
                        std::vector<v1::WorkerEvent>* events = nullptr) {
    testing::ExpectNextOfAll(&coordinator_, 2, has, events);
  }

  // Runs `step` of the job at `generation` (1F1B over both workers), `batch` fed over `in` to
  // rank 0 and `target` to rank 1, and commits it (clip scale 1).
  void RunAndCommit(int64_t generation, int64_t step, PeerLink* in, PeerLink* target,
                    const io::Batch& batch) {
    testing::RunAndCommit(&coordinator_, Job(generation), {{0, in}, {1, target}}, step, batch);
  }

  // The single-process trainer the workers' steps must equal.
  absl::StatusOr<std::unique_ptr<model::ReferenceTrainer>> Reference() const {
    return testing::Reference(Job(1));
  }

  // Opens the coordinator's feed stream to worker `w` (as peer "coordinator").
  PeerLink* Feed(int w, int64_t generation) {
    absl::StatusOr<std::unique_ptr<PeerLink>> link = testing::OpenFeed(Job(generation), w);
    EXPECT_TRUE(link.ok()) << link.status();
    if (!link.ok()) return nullptr;
    feeds_.push_back(*std::move(link));
    return feeds_.back().get();
  }

  // Runs `step` of the job at `generation` on both workers with `batch` fed over `in` and
  // `target` (no Commit), and expects the last rank's losses to be those of the reference's first
  // step on `batch`.
  void ExpectStepLossesOfTheReference(int64_t generation, int64_t step, PeerLink* in,
                                      PeerLink* target, const io::Batch& batch) {
    auto reference = Reference();
    ASSERT_TRUE(reference.ok()) << reference.status();
    absl::StatusOr<model::StepResult> want = (*reference)->Step(batch);
    ASSERT_TRUE(want.ok()) << want.status();
    ASSERT_TRUE(SendBoth(RunStepCommand(generation, step, batch.inputs.rows())));
    FeedBatch(in, target, step, batch);
    std::vector<v1::WorkerEvent> done;
    ASSERT_NO_FATAL_FAILURE(ExpectNextOfBoth(&v1::WorkerEvent::has_step_done, &done));
    const v1::StepDone& last = done[1].step_done();
    ASSERT_EQ(last.microbatch_losses_size(), kMicrobatches);
    for (int mb = 0; mb < kMicrobatches; ++mb) {
      EXPECT_EQ(Bits(last.microbatch_losses(mb)), Bits(want->microbatch_losses[mb])) << "mb " << mb;
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
  // The ranks at the ends of the micro-batches' routes.
  std::map<int, PeerLink*> feeds;
  for (int rank : testing::FedWorkers(Job(kGeneration))) {
    feeds[rank] = Feed(rank, kGeneration);
    ASSERT_NE(feeds[rank], nullptr);
  }
  testing::ExpectStepsBitwiseEqualToTheReference(&coordinator_, Job(kGeneration), feeds, 2);
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

// Only the tie's other end sends a tied_gradient: the coordinator's feed stream to rank 0 (inputs
// and targets only) is refused naming the kind. The tie's own stream is a neighbour's, fenced by
// generation and secret like every other.
TEST_P(StageWorkerTiedScheduleTest, ATiedGradientFromAnotherPeerIsRefused) {
  if (GetParam().kind != schedule::ScheduleKind::kOneFOneB) GTEST_SKIP() << "one case suffices";
  UsePlan(GetParam().kind, GetParam().virtual_stages);
  AssignBoth(1);
  const absl::Status feed =
      SendAndAwaitEnd(0, "coordinator", 1, TensorKey{1, 0, 0, TensorKind::kTiedGradient});
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
      SendAndAwaitEnd(0, "coordinator", 1, TensorKey{1, 0, 0, TensorKind::kCopyGradient});
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
  ASSERT_TRUE(SendBoth(RunStepCommand(kGeneration, 0, rows)));
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
  ASSERT_TRUE(SendBoth(RunStepCommand(kGeneration, 0, rows)));
  ASSERT_TRUE(SendBoth(testing::AbortCommand(JobAt(kGeneration), 0, "test")));
  for (int w = 0; w < 2; ++w) {
    absl::StatusOr<v1::WorkerEvent> e = coordinator_.Next(Name(w));
    ASSERT_TRUE(e.ok()) << e.status();
    ASSERT_TRUE(e->has_error()) << e->DebugString();
    EXPECT_EQ(e->error().code(), static_cast<int>(absl::StatusCode::kAborted));
    EXPECT_EQ(e->error().step(), 0);
  }
  // The re-run is exact.
  ASSERT_NO_FATAL_FAILURE(ExpectStepLossesOfTheReference(kGeneration, 0, in, target, batch));
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
  const io::Batch batch = model::testing::MakeBatch(*model_, kSamples, 0);
  ASSERT_NO_FATAL_FAILURE(ExpectStepLossesOfTheReference(kGeneration, 0, in, target, batch));
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
  v1::WorkerError error;
  v1::WorkerCommand bad = AssignCommand(0, 3);
  bad.mutable_assign()->mutable_chunks(1)->set_rank(7);  // no such rank
  ASSERT_NO_FATAL_FAILURE(ExpectRefusal(0, bad, &error));
  EXPECT_EQ(error.code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(error.message(), HasSubstr("chunk 1"));
  EXPECT_EQ(error.job(), kJob);
  EXPECT_EQ(error.generation(), 3);

  v1::WorkerCommand foreign = AssignCommand(0, 3);
  *foreign.mutable_assign()->mutable_actions(0) =
      control::ActionToProto(schedule::Action{schedule::Op::kForward, 0, 1});  // worker 1's chunk
  ASSERT_NO_FATAL_FAILURE(ExpectRefusal(0, foreign, &error));
  EXPECT_EQ(error.code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(error.message(), HasSubstr("does not hold"));

  v1::WorkerCommand bad_model = AssignCommand(0, 3);
  bad_model.mutable_assign()->mutable_model()->mutable_layers(3)->mutable_linear()->set_in_features(
      99);
  ASSERT_NO_FATAL_FAILURE(ExpectRefusal(0, bad_model, &error));
  EXPECT_EQ(error.code(), static_cast<int>(absl::StatusCode::kInvalidArgument));

  v1::WorkerCommand no_secret = AssignCommand(0, 3);
  no_secret.mutable_assign()->clear_link_secret();
  ASSERT_NO_FATAL_FAILURE(ExpectRefusal(0, no_secret, &error));
  EXPECT_EQ(error.code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(error.message(), HasSubstr("no link_secret"));

  // An instruction-set level the worker does not know is refused; every worker registered the
  // levels this CPU runs (no --max-isa here).
  v1::WorkerCommand bad_isa = AssignCommand(0, 3);
  bad_isa.mutable_assign()->set_isa("x86-64-v9");
  ASSERT_NO_FATAL_FAILURE(ExpectRefusal(0, bad_isa, &error));
  EXPECT_EQ(error.code(), static_cast<int>(absl::StatusCode::kInvalidArgument));
  EXPECT_THAT(error.message(), HasSubstr("unknown instruction set 'x86-64-v9'"));
  absl::StatusOr<v1::RegisterWorker> reg = coordinator_.WaitRegistered(Name(0));
  ASSERT_TRUE(reg.ok()) << reg.status();
  std::vector<std::string> levels;
  for (math::Isa isa : math::SupportedIsas()) levels.emplace_back(math::IsaName(isa));
  EXPECT_THAT(reg->isa_levels(), ::testing::ElementsAreArray(levels));

  // A RunStep for a job the worker does not have is refused; a valid Assign then works.
  ASSERT_NO_FATAL_FAILURE(ExpectRefusal(0, RunStepCommand(3, 0, kSamples), &error));
  EXPECT_EQ(error.code(), static_cast<int>(absl::StatusCode::kFailedPrecondition));

  ExpectAssigned(0, AssignCommand(0, 3));
}

TEST_F(StageWorkerTest, BrokenControlStreamDropsTheJobAndRedials) {
  v1::WorkerError error;
  AssignBoth(6);
  ASSERT_EQ(coordinator_.registrations(Name(0)), 1);
  ASSERT_TRUE(coordinator_.Kick(Name(0)));
  ASSERT_TRUE(coordinator_.WaitRegistrations(Name(0), 2));
  // The job went with the stream: a RunStep for it is refused.
  ASSERT_NO_FATAL_FAILURE(ExpectRefusal(0, RunStepCommand(6, 0, kSamples), &error));
  EXPECT_EQ(error.code(), static_cast<int>(absl::StatusCode::kFailedPrecondition));
  // And a new Assign works on the new stream.
  ExpectAssigned(0, AssignCommand(0, 7));
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
  v1::WorkerError error;
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
  ASSERT_NO_FATAL_FAILURE(ExpectRefusal(1, RunStepCommand(9, 0, kSamples), &error));
  EXPECT_EQ(error.code(), static_cast<int>(absl::StatusCode::kFailedPrecondition));
  EXPECT_THAT(error.message(), HasSubstr("no job"));
  // Worker 0 still runs the job: its step fails only by the Abort (ABORTED) or by its released
  // neighbour refusing the link it dials at the step (ABORTED or UNAVAILABLE naming the link) —
  // whichever comes first is the scheduler's choice — never with its own "no job".
  ASSERT_NO_FATAL_FAILURE(ExpectRefusal(0, testing::AbortCommand(JobAt(9), 0), &error));
  EXPECT_THAT(error.code(), ::testing::AnyOf(static_cast<int>(absl::StatusCode::kAborted),
                                             static_cast<int>(absl::StatusCode::kUnavailable)))
      << error.DebugString();
  EXPECT_EQ(error.job(), kJob);
  EXPECT_THAT(error.message(), ::testing::Not(HasSubstr("this worker has no job")));
  // The released worker takes a new job.
  ExpectAssigned(1, AssignCommand(1, 10));
}

TEST_F(StageWorkerTest, FeedStreamCanBeReplacedWithinTheGeneration) {
  constexpr int64_t kGeneration = 8;
  AssignBoth(kGeneration);
  const io::Batch batch = model::testing::MakeBatch(*model_, kSamples, 0);
  for (int64_t step = 1; step <= 2; ++step) {
    SCOPED_TRACE(absl::StrCat("step ", step));
    // A fresh pair of feed streams per step; the previous pair is closed first.
    for (auto& link : feeds_) link->Shutdown();
    PeerLink* in = Feed(0, kGeneration);
    PeerLink* target = Feed(1, kGeneration);
    ASSERT_NE(in, nullptr);
    ASSERT_NE(target, nullptr);
    ASSERT_NO_FATAL_FAILURE(RunAndCommit(kGeneration, step, in, target, batch));
  }
}

TEST_F(StageWorkerTest, StaleGenerationCommandIsAborted) {
  AssignBoth(5);
  v1::WorkerError error;
  ASSERT_NO_FATAL_FAILURE(ExpectRefusal(1, RunStepCommand(4, 0, kSamples), &error));
  EXPECT_EQ(error.code(), static_cast<int>(absl::StatusCode::kAborted));
  EXPECT_EQ(error.generation(), 4);
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
  ASSERT_NO_FATAL_FAILURE(RunAndCommit(kGeneration, 1, in, target, batch));
  // Step 2: no targets, so worker 1 waits and worker 0 waits for its gradients; then worker 1
  // goes away and worker 0's established link breaks.
  ASSERT_TRUE(SendBoth(RunStepCommand(kGeneration, 2, rows)));
  FeedBatch(in, nullptr, 2, batch);
  daemons_[1]->Shutdown();
  // Step 2 fails (perhaps after a report against step 1).
  v1::WorkerError error;
  ASSERT_NO_FATAL_FAILURE(testing::ExpectStepUnavailable(&coordinator_, Name(0), 2, &error));
  EXPECT_THAT(error.message(), HasSubstr("stage/1"));
  // The generation is broken: a new RunStep fails at once with the link's status.
  ASSERT_TRUE(coordinator_.Send(Name(0), testing::AbortCommand(JobAt(kGeneration), 2)));
  ASSERT_NO_FATAL_FAILURE(ExpectRefusal(0, RunStepCommand(kGeneration, 2, rows), &error));
  EXPECT_EQ(error.code(), static_cast<int>(absl::StatusCode::kUnavailable));
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
