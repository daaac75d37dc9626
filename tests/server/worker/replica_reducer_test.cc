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
      auto reducer =
          ReplicaReducer::Create(q, r, senders.back().get(), boxes[q].get(), absl::Minutes(1));
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
        replicas.reducers[q]->Submit(chunk, parts[chunk].back());
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
  replicas.reducers[0]->Submit(0, Part(0, 100, 0));
  replicas.reducers[0]->Submit(1, Part(0, 100, 1));  // skipped once the first failed.
  replicas.reducers[0]->Cancel();
  absl::StatusOr<std::map<int, std::vector<float>>> sums = replicas.reducers[0]->Finish();
  EXPECT_EQ(sums.status().code(), absl::StatusCode::kCancelled) << sums.status();
  EXPECT_THAT(sums.status().message(), HasSubstr("step 1"));
  replicas.boxes[0]->ClearStep(1);
  replicas.boxes[1]->ClearStep(1);
  for (int q = 0; q < 2; ++q) {
    replicas.reducers[q]->Start(2);
    replicas.reducers[q]->Submit(0, Part(q, 100, 0));
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
  replicas.reducers[0]->Submit(0, Part(0, 100, 0));
  replicas.boxes[0]->Abort(absl::UnavailableError("link to replica/1 lost"));
  absl::StatusOr<std::map<int, std::vector<float>>> sums = replicas.reducers[0]->Finish();
  EXPECT_EQ(sums.status().code(), absl::StatusCode::kUnavailable) << sums.status();
  EXPECT_THAT(sums.status().message(), HasSubstr("replica reduction of chunk 0"));
  EXPECT_THAT(sums.status().message(), HasSubstr("replica/1 lost"));
}

TEST(ReplicaReducerTest, BadArgumentsAreInvalidArgument) {
  Mailbox box;
  RouteToPartner sender(nullptr, 0, 2);
  EXPECT_EQ(ReplicaReducer::Create(0, 3, &sender, &box, absl::Seconds(1)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ReplicaReducer::Create(0, 1, &sender, &box, absl::Seconds(1)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ReplicaReducer::Create(2, 2, &sender, &box, absl::Seconds(1)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ReplicaReducer::Create(0, 2, nullptr, &box, absl::Seconds(1)).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ReplicaReducer::Create(0, 2, &sender, &box, absl::ZeroDuration()).status().code(),
            absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace pipetrain::worker
