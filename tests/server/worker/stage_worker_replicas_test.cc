// Data-parallel replicas on stage worker daemons on loopback (127.0.0.1), driven by a fake
// coordinator: R x S real daemons, worker p = replica * S + rank, each replica fed its share of
// every step's micro-batches, the gradients reduced over real Exchange streams between the
// replicas (replica_gradient frames). Weights, losses and norms after several steps are the
// reference trainer's bit for bit (R = 2, S = 2 under 1F1B and ZB-V; R = 4, S = 1; R = 2 with a
// tied embedding); a replica_gradient from a peer that is not a reduction partner is refused;
// a lost replica peer fails the step with UNAVAILABLE. Synchronisation waits on conditions,
// never sleeps; the timeouts only bound a failing test.
#include <grpcpp/grpcpp.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "common/io/dataset.h"
#include "common/model/model.h"
#include "common/schedule/generator.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "pipetrain/v1/worker_control.pb.h"
#include "server/link/peer_link.h"
#include "server/worker/stage_worker_daemon.h"
#include "tests/common/model/test_models.h"
#include "tests/server/worker/fake_coordinator.h"
#include "tests/server/worker/fake_job.h"

namespace pipetrain::worker {
namespace {

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

// R x S daemons registered with a fake coordinator, and the job's plan for M / R micro-batches.
class ReplicaTest : public ::testing::Test {
 protected:
  // Starts the daemons and plans the job: `replicas` x `stages`, `microbatches` per step.
  void Start(int replicas, int stages, int microbatches, schedule::ScheduleKind kind,
             int virtual_stages, const char* spec) {
    replicas_ = replicas;
    stages_ = stages;
    microbatches_ = microbatches;
    StageWorkerOptions o;
    o.gflops = 1;  // no probe in tests.
    o.threads_max = 1;
    const absl::Status started =
        testing::StartLoopback(&coordinator_, replicas * stages, o, &server_, &daemons_);
    ASSERT_TRUE(started.ok()) << started;
    model_ = model::testing::BuildOrDie(spec);
    absl::StatusOr<schedule::Plan> plan =
        schedule::GenerateSchedule({kind, stages, microbatches / replicas, virtual_stages});
    ASSERT_TRUE(plan.ok()) << plan.status();
    plan_ = *std::move(plan);
  }

  void TearDown() override { testing::ShutdownLoopback(links_, &daemons_, server_.get()); }

  static std::string Name(int w) { return testing::WorkerName(w); }
  int Worker(int replica, int rank) const { return replica * stages_ + rank; }

  // The job on every daemon: model_ and plan_, R x S, M = microbatches_.
  testing::FakeJob Job() const {
    testing::FakeJob job = testing::FakeJob::Of(model_.get(), &plan_, daemons_);
    job.job = kJob;
    job.generation = kGeneration;
    job.secret = kSecret;
    job.seed = kSeed;
    job.replicas = replicas_;
    job.stages = stages_;
    job.microbatches = microbatches_;
    job.samples = kSamples;
    return job;
  }

  std::string Address(int replica, int rank) const {
    return daemons_[Worker(replica, rank)]->address();
  }

  // Assigns every worker and waits for every Assigned.
  void AssignAll() {
    for (int q = 0; q < replicas_; ++q) {
      for (int r = 0; r < stages_; ++r) {
        ASSERT_TRUE(coordinator_.Send(Name(Worker(q, r)), testing::AssignCommand(Job(), q, r)));
      }
    }
    ASSERT_NO_FATAL_FAILURE(testing::ExpectNextOfAll(&coordinator_, replicas_ * stages_,
                                                     &v1::WorkerEvent::has_assigned));
  }

  // Opens the coordinator's feed streams to the ends of every replica's routes.
  void OpenFeeds() {
    for (int w : testing::FedWorkers(Job())) {
      absl::StatusOr<std::unique_ptr<PeerLink>> link = testing::OpenFeed(Job(), w);
      ASSERT_TRUE(link.ok()) << link.status();
      feeds_[w] = link->get();
      links_.push_back(*std::move(link));
    }
  }

  // Replica q gets the step's micro-batches [q M / R, (q + 1) M / R), numbered from 0.
  void FeedBatch(int64_t step, const io::Batch& batch) {
    testing::FeedRouted(Job(), feeds_, step, batch);
  }

  // Runs `steps` steps and compares each with the reference, then every replica's layer files.
  void ExpectStepsBitwiseEqualToTheReference(int steps);

  FakeCoordinator coordinator_;
  std::unique_ptr<grpc::Server> server_;
  int replicas_ = 1, stages_ = 1, microbatches_ = 1;
  std::vector<std::unique_ptr<StageWorkerDaemon>> daemons_;
  std::vector<std::unique_ptr<PeerLink>> links_;  // the feed streams, owned.
  std::map<int, PeerLink*> feeds_;                // the same by worker.
  std::unique_ptr<model::Model> model_;
  schedule::Plan plan_;
};

void ReplicaTest::ExpectStepsBitwiseEqualToTheReference(int steps) {
  AssignAll();
  OpenFeeds();
  testing::ExpectStepsBitwiseEqualToTheReference(&coordinator_, Job(), feeds_, steps);
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
  wire::FrameValidation validation;
  validation.expected = wire::StreamIdentity{kJob, kGeneration};
  validation.num_microbatches = 4;
  validation.num_chunks = chunks;
  validation.replica_rounds = rounds;
  return testing::StreamEndStatus(address,
                                  PeerHello{peer, wire::StreamIdentity{kJob, kGeneration}, kSecret},
                                  validation, key, absl::Seconds(30));
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
  ASSERT_NO_FATAL_FAILURE(testing::RunAndCommit(&coordinator_, Job(), feeds_, 1, batch));
  // Step 2 on replica 0 only: it waits for replica 1's messages, and replica 1 goes away.
  ASSERT_TRUE(coordinator_.Send(Name(0), testing::RunStepCommand(Job(), 2, rows)));
  FeedBatch(2, batch);
  daemons_[1]->Shutdown();
  // Step 2 fails (perhaps after a report against step 1).
  v1::WorkerError error;
  ASSERT_NO_FATAL_FAILURE(testing::ExpectStepUnavailable(&coordinator_, Name(0), 2, &error));
  EXPECT_THAT(error.message(), HasSubstr("replica/1"));
}

}  // namespace
}  // namespace pipetrain::worker
