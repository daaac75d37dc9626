// ReplicaReducer over in-process mailboxes (the routing a WorkerJob does: each replica_gradient to
// the round's partner): every replica ends with the binary-tree sum of the replicas' vectors, bit
// for bit, also for a vector of more than one segment and for several chunks; a step that is
// cancelled or whose partner never answers ends with CANCELLED or the mailbox's status instead
// of hanging; bad arguments are INVALID_ARGUMENT.
#include "server/worker/replica_reducer.h"

#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/worker/executor.h"
#include "server/worker/gradient_exchange.h"
#include "server/worker/mailbox.h"

namespace pipetrain::worker {
namespace {

using ::testing::HasSubstr;
using wire::TensorKey;

// Replica `me`'s Sender: puts each message into the mailbox of the round's partner.
class RouteToPartner final : public Sender {
 public:
  RouteToPartner(std::vector<std::unique_ptr<Mailbox>>* boxes, int me, int replicas)
      : boxes_(boxes), me_(me), replicas_(replicas) {}
  void Send(const TensorKey& key, math::Matrix tensor) override {
    const int to = AllReducePartner(me_, replicas_, key.microbatch % AllReduceRounds(replicas_));
    ASSERT_GE(to, 0) << key.ToString();
    EXPECT_TRUE((*boxes_)[to]->Put(key, std::move(tensor)).ok()) << key.ToString();
  }

 private:
  std::vector<std::unique_ptr<Mailbox>>* const boxes_;
  const int me_;
  const int replicas_;
};

// R replicas, each with a mailbox, a sender and a reducer.
struct Replicas {
  explicit Replicas(int r) {
    for (int q = 0; q < r; ++q) boxes.push_back(std::make_unique<Mailbox>());
    for (int q = 0; q < r; ++q) {
      senders.push_back(std::make_unique<RouteToPartner>(&boxes, q, r));
      auto reducer = ReplicaReducer::Create(senders.back().get(), boxes[q].get(), absl::Minutes(1));
      EXPECT_TRUE(reducer.ok()) << reducer.status();
      reducers.push_back(*std::move(reducer));
    }
  }
  std::vector<std::unique_ptr<Mailbox>> boxes;
  std::vector<std::unique_ptr<RouteToPartner>> senders;
  std::vector<std::unique_ptr<ReplicaReducer>> reducers;
};

// Values of very different magnitudes, so that the order of a sum changes its bits.
std::vector<float> Part(int q, int64_t n, int salt) {
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const int k = static_cast<int>((q * 5 + i + salt) % 3);
    v[i] = (k == 0 ? 1e7f : (k == 1 ? 1.0f : 1e-3f)) * static_cast<float>((i * 7 + q) % 13 - 6);
  }
  return v;
}

// The binary tree of the replicas' parts, lower first at every node.
std::vector<float> TreeSum(const std::vector<std::vector<float>>& parts) {
  std::vector<std::vector<float>> level = parts;
  while (level.size() > 1) {
    std::vector<std::vector<float>> next;
    for (size_t i = 0; i < level.size(); i += 2) {
      std::vector<float> s(level[i].size());
      for (size_t j = 0; j < s.size(); ++j) s[j] = level[i][j] + level[i + 1][j];
      next.push_back(std::move(s));
    }
    level = std::move(next);
  }
  return level[0];
}

TEST(ReplicaReducerTest, EveryReplicaHoldsTheTreeSumOfEveryChunk) {
  for (int r : {2, 4, 8}) {
    Replicas replicas(r);
    // Chunk 3 spans two segments (for R <= 4, to bound the test's memory); chunk 1 is small;
    // chunk 5 has no parameters.
    const int64_t big = r <= 4 ? kReplicaSegmentFloats + 1001 : 1001;
    const std::map<int, int64_t> sizes = {{3, big}, {1, 37}, {5, 0}};
    std::map<int, std::vector<std::vector<float>>> parts;
    for (int q = 0; q < r; ++q) replicas.reducers[q]->Start(7);
    for (const auto& [chunk, n] : sizes) {
      for (int q = 0; q < r; ++q) {
        parts[chunk].push_back(Part(q, n, chunk));
        ASSERT_TRUE(replicas.reducers[q]
                        ->Submit(ReductionGroup::Replicas(chunk, q, r), parts[chunk].back())
                        .ok());
      }
    }
    for (int q = 0; q < r; ++q) {
      absl::StatusOr<std::map<int, std::vector<float>>> sums = replicas.reducers[q]->Finish();
      ASSERT_TRUE(sums.ok()) << sums.status();
      ASSERT_EQ(sums->size(), sizes.size());
      for (const auto& [chunk, n] : sizes) {
        const std::vector<float> want = TreeSum(parts[chunk]);
        const std::vector<float>& got = sums->at(chunk);
        ASSERT_EQ(got.size(), want.size());
        EXPECT_EQ(std::memcmp(got.data(), want.data(), want.size() * sizeof(float)), 0)
            << "R " << r << " replica " << q << " chunk " << chunk;
      }
      // Each replica sends 2 (R - 1) / R of every chunk (give or take a float per round).
      const int64_t floats = big + 37;
      const double expected = 2.0 * (r - 1) / r * floats * sizeof(float);
      EXPECT_NEAR(static_cast<double>(replicas.reducers[q]->stats().bytes_sent), expected,
                  64.0 * r);
    }
    for (auto& box : replicas.boxes) EXPECT_EQ(box->size(), 0) << "R " << r;
  }
}

// Replica 1 never runs its step: replica 0 waits for its first message until it is cancelled,
// then a later step runs normally.
TEST(ReplicaReducerTest, CancelEndsAWaitingReductionAndTheNextStepRuns) {
  Replicas replicas(2);
  replicas.reducers[0]->Start(1);
  ASSERT_TRUE(
      replicas.reducers[0]->Submit(ReductionGroup::Replicas(0, 0, 2), Part(0, 100, 0)).ok());
  // Dropped with the first.
  ASSERT_TRUE(
      replicas.reducers[0]->Submit(ReductionGroup::Replicas(1, 0, 2), Part(0, 100, 1)).ok());
  replicas.reducers[0]->Cancel();
  absl::StatusOr<std::map<int, std::vector<float>>> sums = replicas.reducers[0]->Finish();
  EXPECT_EQ(sums.status().code(), absl::StatusCode::kCancelled) << sums.status();
  EXPECT_THAT(sums.status().message(), HasSubstr("step 1"));
  replicas.boxes[0]->ClearStep(1);
  replicas.boxes[1]->ClearStep(1);
  for (int q = 0; q < 2; ++q) {
    replicas.reducers[q]->Start(2);
    ASSERT_TRUE(
        replicas.reducers[q]->Submit(ReductionGroup::Replicas(0, q, 2), Part(q, 100, 0)).ok());
  }
  for (int q = 0; q < 2; ++q) {
    absl::StatusOr<std::map<int, std::vector<float>>> ok = replicas.reducers[q]->Finish();
    ASSERT_TRUE(ok.ok()) << ok.status();
    EXPECT_EQ(ok->at(0), TreeSum({Part(0, 100, 0), Part(1, 100, 0)}));
  }
}

// A lost partner aborts the mailbox with the link's status: the reduction ends with it.
TEST(ReplicaReducerTest, AnAbortedMailboxEndsTheReductionWithItsStatus) {
  Replicas replicas(2);
  replicas.reducers[0]->Start(1);
  ASSERT_TRUE(
      replicas.reducers[0]->Submit(ReductionGroup::Replicas(0, 0, 2), Part(0, 100, 0)).ok());
  replicas.boxes[0]->Abort(absl::UnavailableError("link to replica/1 lost"));
  absl::StatusOr<std::map<int, std::vector<float>>> sums = replicas.reducers[0]->Finish();
  EXPECT_EQ(sums.status().code(), absl::StatusCode::kUnavailable) << sums.status();
  EXPECT_THAT(sums.status().message(), HasSubstr("replica reduction of chunk 0"));
  EXPECT_THAT(sums.status().message(), HasSubstr("replica/1 lost"));
}

TEST(ReplicaReducerTest, BadArgumentsAreInvalidArgument) {
  Mailbox box;
  RouteToPartner sender(nullptr, 0, 2);
  EXPECT_EQ(ReplicaReducer::Create(nullptr, &box, absl::Seconds(1)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ReplicaReducer::Create(&sender, nullptr, absl::Seconds(1)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ReplicaReducer::Create(&sender, &box, absl::ZeroDuration()).status().code(),
            absl::StatusCode::kInvalidArgument);
  auto reducer = ReplicaReducer::Create(&sender, &box, absl::Seconds(1));
  ASSERT_TRUE(reducer.ok()) << reducer.status();
  (*reducer)->Start(1);
  ReductionGroup tied = ReductionGroup::Replicas(0, 0, 2);
  tied.kind = wire::TensorKind::kTiedGradient;
  ReductionGroup other_chunk = ReductionGroup::Copies(0, 1, 2, /*down=*/true);
  other_chunk.peer_chunks[0] = 3;  // peer 0 (this worker) would not hold the chunk.
  for (const ReductionGroup& g :
       {ReductionGroup::Replicas(0, 0, 3), ReductionGroup::Replicas(0, 0, 1),
        ReductionGroup::Replicas(0, 2, 2), tied, other_chunk}) {
    const absl::Status s = (*reducer)->Submit(g, {1.0f});
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << g.what << ": " << s;
  }
  // Nothing was queued: the step ends at once.
  EXPECT_TRUE((*reducer)->Finish().ok());
}

// The two copies of a stage (dualpipe): a 2-peer reduction of copy_gradient messages keyed by the
// receiving copy's chunk, the down copy's part first -- exactly lower + upper. The two ranks hand
// their chunks over in opposite orders (as their last Ws may come): both still end, since every
// reduction runs at once.
TEST(ReplicaReducerTest, CopiesSumTheDownCopysPartFirstInAnyOrder) {
  // Rank 0 holds chunks 0 (stage 0, down) and 3 (stage 1, up); rank 1 chunks 1 (stage 1, down)
  // and 2 (stage 0, up). Each message goes to the owner of the chunk it names.
  std::vector<std::unique_ptr<Mailbox>> boxes;
  for (int q = 0; q < 2; ++q) boxes.push_back(std::make_unique<Mailbox>());
  class ToOwner final : public Sender {
   public:
    explicit ToOwner(std::vector<std::unique_ptr<Mailbox>>* boxes) : boxes_(boxes) {}
    void Send(const TensorKey& key, math::Matrix tensor) override {
      EXPECT_EQ(key.kind, wire::TensorKind::kCopyGradient) << key.ToString();
      const int owner = key.chunk == 0 || key.chunk == 3 ? 0 : 1;
      EXPECT_TRUE((*boxes_)[owner]->Put(key, std::move(tensor)).ok()) << key.ToString();
    }

   private:
    std::vector<std::unique_ptr<Mailbox>>* const boxes_;
  } sender(&boxes);
  std::vector<std::unique_ptr<ReplicaReducer>> reducers;
  for (int q = 0; q < 2; ++q) {
    auto r = ReplicaReducer::Create(&sender, boxes[q].get(), absl::Minutes(1));
    ASSERT_TRUE(r.ok()) << r.status();
    reducers.push_back(*std::move(r));
    reducers.back()->Start(4);
  }
  const int64_t n = 2 * kReplicaSegmentFloats + 5;  // three segments.
  const std::vector<float> down0 = Part(0, n, 0), up0 = Part(1, n, 0);
  const std::vector<float> down1 = Part(0, 50, 1), up1 = Part(1, 50, 1);
  // Rank 0: stage 0 first; rank 1: stage 1 first.
  ASSERT_TRUE(reducers[0]->Submit(ReductionGroup::Copies(0, 0, 2, true), down0).ok());
  ASSERT_TRUE(reducers[1]->Submit(ReductionGroup::Copies(1, 1, 3, true), down1).ok());
  ASSERT_TRUE(reducers[0]->Submit(ReductionGroup::Copies(1, 3, 1, false), up1).ok());
  ASSERT_TRUE(reducers[1]->Submit(ReductionGroup::Copies(0, 2, 0, false), up0).ok());
  const std::vector<float> stage0 = TreeSum({down0, up0}), stage1 = TreeSum({down1, up1});
  for (int q = 0; q < 2; ++q) {
    absl::StatusOr<std::map<int, std::vector<float>>> sums = reducers[q]->Finish();
    ASSERT_TRUE(sums.ok()) << sums.status();
    const std::vector<float>& s0 = sums->at(q == 0 ? 0 : 2);
    const std::vector<float>& s1 = sums->at(q == 0 ? 3 : 1);
    ASSERT_EQ(s0.size(), stage0.size());
    EXPECT_EQ(std::memcmp(s0.data(), stage0.data(), stage0.size() * sizeof(float)), 0) << q;
    EXPECT_EQ(s1, stage1) << q;
    EXPECT_EQ(boxes[q]->size(), 0);
  }
}

// A message of another length than the round's is INVALID_ARGUMENT naming the key.
TEST(ReplicaReducerTest, AMessageOfAnotherLengthFailsTheStep) {
  Replicas replicas(2);
  replicas.reducers[0]->Start(1);
  // Replica 1's round-0 message should hold replica 0's kept half (50 floats).
  ASSERT_TRUE(replicas.boxes[0]
                  ->Put(TensorKey{1, 0, 0, wire::TensorKind::kReplicaGradient}, math::Matrix(1, 7))
                  .ok());
  ASSERT_TRUE(
      replicas.reducers[0]->Submit(ReductionGroup::Replicas(0, 0, 2), Part(0, 100, 0)).ok());
  absl::StatusOr<std::map<int, std::vector<float>>> sums = replicas.reducers[0]->Finish();
  EXPECT_EQ(sums.status().code(), absl::StatusCode::kInvalidArgument) << sums.status();
  EXPECT_THAT(sums.status().message(), HasSubstr("holds 7 floats, expected 50"));
  EXPECT_THAT(sums.status().message(), HasSubstr("replica reduction of chunk 0 (replica 0 of 2)"));
}

// No message within the timeout: DEADLINE_EXCEEDED naming the awaited key.
TEST(ReplicaReducerTest, NoMessageWithinTheTimeoutIsDeadlineExceeded) {
  std::vector<std::unique_ptr<Mailbox>> boxes;
  boxes.push_back(std::make_unique<Mailbox>());
  boxes.push_back(std::make_unique<Mailbox>());
  RouteToPartner to_partner(&boxes, 0, 2);
  auto reducer = ReplicaReducer::Create(&to_partner, boxes[0].get(), absl::Milliseconds(20));
  ASSERT_TRUE(reducer.ok()) << reducer.status();
  (*reducer)->Start(3);
  ASSERT_TRUE((*reducer)->Submit(ReductionGroup::Replicas(2, 0, 2), Part(0, 10, 0)).ok());
  absl::StatusOr<std::map<int, std::vector<float>>> sums = (*reducer)->Finish();
  EXPECT_EQ(sums.status().code(), absl::StatusCode::kDeadlineExceeded) << sums.status();
  EXPECT_THAT(sums.status().message(), HasSubstr("replica_gradient(step=3, mb=0, chunk=2)"));
}

}  // namespace
}  // namespace pipetrain::worker
