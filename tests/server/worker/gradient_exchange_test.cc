// The gradient exchange (server/worker/gradient_exchange.h) over in-process mailboxes, one thread
// per peer: SumWithPeer's lower-then-upper sum on both peers, and AllReduceSum's binary-tree order
// over 1 to 8 peers (every peer the same bits, the tree's, which a left-to-right sum does not
// give), and their errors: a peer's part of another shape or length, a lost peer, bad arguments.
#include "server/worker/gradient_exchange.h"

#include <cstdint>
#include <cstring>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/worker/mailbox.h"

namespace pipetrain::worker {
namespace {

using ::testing::HasSubstr;
using wire::TensorKey;
using wire::TensorKind;

// Peers in one process: peer p's mailbox receives the keys whose chunk is p. Takes wait at most a
// minute, so that a bug fails the test instead of hanging it.
class LoopbackTransport : public ExchangeTransport {
 public:
  LoopbackTransport(std::vector<std::unique_ptr<Mailbox>>* boxes, int me)
      : boxes_(boxes), me_(me) {}
  void Send(const TensorKey& key, math::Matrix tensor) override {
    EXPECT_TRUE((*boxes_)[key.chunk]->Put(key, std::move(tensor)).ok());
  }
  absl::StatusOr<math::Matrix> Take(const TensorKey& key) override {
    return (*boxes_)[me_]->Take(key, absl::Now() + absl::Minutes(1));
  }

 private:
  std::vector<std::unique_ptr<Mailbox>>* const boxes_;
  const int me_;
};

std::vector<std::unique_ptr<Mailbox>> Mailboxes(int n) {
  std::vector<std::unique_ptr<Mailbox>> boxes;
  for (int i = 0; i < n; ++i) boxes.push_back(std::make_unique<Mailbox>());
  return boxes;
}

// Routes to peer `to` (the chunk), distinct per (from, round): microbatch = from * 64 + round.
TensorKey AllReduceKey(int from, int to, int round) {
  return TensorKey{1, from * 64 + round, to, TensorKind::kTiedGradient};
}

// Values of very different magnitudes, so that the order of a sum changes its bits.
math::Tensor PeerData(int peer, int64_t n) {
  math::Tensor t{{1, n}, std::vector<float>(static_cast<size_t>(n))};
  for (int64_t i = 0; i < n; ++i) {
    const float scale = (peer + i) % 3 == 0 ? 1e7f : ((peer + i) % 3 == 1 ? 1.0f : 1e-3f);
    t.data[i] = scale * (0.37f + 0.11f * static_cast<float>((peer * 7 + i * 13) % 17));
    if ((peer * 5 + i) % 4 == 0) t.data[i] = -t.data[i];
  }
  return t;
}

// Element i summed over peers [first, first + count) as the binary tree of their indices.
float TreeSum(const std::vector<math::Tensor>& parts, int first, int count, int64_t i) {
  if (count == 1) return parts[first].data[i];
  return TreeSum(parts, first, count / 2, i) + TreeSum(parts, first + count / 2, count / 2, i);
}

bool SameBits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST(SumWithPeerTest, BothPeersFormLowerPlusUpper) {
  auto boxes = Mailboxes(2);
  const math::Tensor lower{{2, 3}, {1e8f, 1, -1e8f, 0.5f, 3, 7}};
  const math::Tensor upper{{2, 3}, {1, 1e-8f, 2, -0.25f, -3, 1e9f}};
  absl::StatusOr<math::Tensor> got_lower, got_upper;
  std::thread t([&] {
    LoopbackTransport transport(&boxes, 1);
    got_upper = SumWithPeer(&transport, TensorKey{4, 0, 0, TensorKind::kTiedGradient},
                            TensorKey{4, 0, 1, TensorKind::kTiedGradient}, upper, false);
  });
  LoopbackTransport transport(&boxes, 0);
  got_lower = SumWithPeer(&transport, TensorKey{4, 0, 1, TensorKind::kTiedGradient},
                          TensorKey{4, 0, 0, TensorKind::kTiedGradient}, lower, true);
  t.join();
  ASSERT_TRUE(got_lower.ok()) << got_lower.status();
  ASSERT_TRUE(got_upper.ok()) << got_upper.status();
  std::vector<float> want(6);
  for (int i = 0; i < 6; ++i) want[i] = lower.data[i] + upper.data[i];
  EXPECT_TRUE(SameBits(got_lower->data, want));
  EXPECT_TRUE(SameBits(got_upper->data, want));
  EXPECT_EQ(got_upper->shape, (std::vector<int64_t>{2, 3}));
}

TEST(SumWithPeerTest, APartOfAnotherShapeIsInvalidArgument) {
  auto boxes = Mailboxes(2);
  ASSERT_TRUE(
      boxes[0]->Put(TensorKey{4, 0, 0, TensorKind::kTiedGradient}, math::Matrix(3, 2)).ok());
  LoopbackTransport transport(&boxes, 0);
  const absl::StatusOr<math::Tensor> sum =
      SumWithPeer(&transport, TensorKey{4, 0, 1, TensorKind::kTiedGradient},
                  TensorKey{4, 0, 0, TensorKind::kTiedGradient},
                  math::Tensor{{2, 3}, std::vector<float>(6, 1.0f)}, true);
  EXPECT_EQ(sum.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(sum.status().message(),
              HasSubstr("the peer's part tied_gradient(step=4, mb=0, chunk=0) has shape [3, 2], "
                        "the local part [2, 3]"));
  const absl::StatusOr<math::Tensor> rank1 =
      SumWithPeer(&transport, TensorKey{5, 0, 1, TensorKind::kTiedGradient},
                  TensorKey{5, 0, 0, TensorKind::kTiedGradient},
                  math::Tensor{{6}, std::vector<float>(6)}, true);
  EXPECT_EQ(rank1.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(rank1.status().message(), HasSubstr("is not a rank-2 tensor"));
}

TEST(SumWithPeerTest, ALostPeerIsTheLinksStatus) {
  auto boxes = Mailboxes(2);
  boxes[0]->Abort(absl::UnavailableError("link to stage/1 failed: Socket closed"));
  LoopbackTransport transport(&boxes, 0);
  const absl::StatusOr<math::Tensor> sum = SumWithPeer(
      &transport, TensorKey{4, 0, 1, TensorKind::kTiedGradient},
      TensorKey{4, 0, 0, TensorKind::kTiedGradient}, math::Tensor{{1, 2}, {1.0f, 2.0f}}, true);
  EXPECT_EQ(sum.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(sum.status().message(), HasSubstr("link to stage/1 failed"));
}

// Runs AllReduceSum on `peers` threads over `n` elements; returns each peer's result.
std::vector<absl::StatusOr<math::Tensor>> RunAllReduce(int peers, int64_t n,
                                                       std::vector<math::Tensor>* inputs) {
  auto boxes = Mailboxes(peers);
  std::vector<absl::StatusOr<math::Tensor>> out(peers, absl::UnknownError("not run"));
  for (int p = 0; p < peers; ++p) inputs->push_back(PeerData(p, n));
  std::vector<std::thread> threads;
  for (int p = 0; p < peers; ++p) {
    threads.emplace_back([&, p] {
      LoopbackTransport transport(&boxes, p);
      math::Tensor data = (*inputs)[p];
      const absl::Status s = AllReduceSum(&transport, p, peers, AllReduceKey, &data);
      out[p] = s.ok() ? absl::StatusOr<math::Tensor>(std::move(data)) : s;
    });
  }
  for (std::thread& t : threads) t.join();
  for (const auto& box : boxes) EXPECT_EQ(box->size(), 0) << "a message was left over";
  return out;
}

TEST(AllReduceSumTest, EveryPeerHoldsTheBinaryTreeSum) {
  for (int peers : {1, 2, 4, 8}) {
    for (int64_t n : {1, 3, 7, 64, 1001}) {
      SCOPED_TRACE(testing::Message() << peers << " peers, " << n << " elements");
      std::vector<math::Tensor> inputs;
      const auto results = RunAllReduce(peers, n, &inputs);
      std::vector<float> want(static_cast<size_t>(n));
      for (int64_t i = 0; i < n; ++i) want[i] = TreeSum(inputs, 0, peers, i);
      for (int p = 0; p < peers; ++p) {
        ASSERT_TRUE(results[p].ok()) << "peer " << p << ": " << results[p].status();
        EXPECT_TRUE(SameBits(results[p]->data, want)) << "peer " << p;
      }
    }
  }
}

// The order is the tree's, not a left-to-right sum's: with these values the two differ.
TEST(AllReduceSumTest, TheTreeOrderIsNotALeftToRightSum) {
  std::vector<math::Tensor> inputs;
  const auto results = RunAllReduce(8, 1001, &inputs);
  ASSERT_TRUE(results[0].ok());
  int differ = 0;
  for (int64_t i = 0; i < 1001; ++i) {
    float left = inputs[0].data[i];
    for (int p = 1; p < 8; ++p) left += inputs[p].data[i];
    differ += left != results[0]->data[i];
  }
  EXPECT_GT(differ, 0);
}

TEST(AllReduceSumTest, RefusesBadArgumentsAndAMessageOfAnotherLength) {
  auto boxes = Mailboxes(2);
  LoopbackTransport transport(&boxes, 0);
  math::Tensor data{{1, 4}, {1, 2, 3, 4}};
  for (auto [me, peers] : {std::pair(0, 3), std::pair(2, 2), std::pair(-1, 4), std::pair(0, 0)}) {
    const absl::Status s = AllReduceSum(&transport, me, peers, AllReduceKey, &data);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << me << " of " << peers;
    EXPECT_THAT(s.message(), HasSubstr("a power of two is needed")) << me << " of " << peers;
  }
  // Peer 1's round-0 message should hold peer 0's kept half (2 floats); it holds 3.
  ASSERT_TRUE(boxes[0]->Put(AllReduceKey(1, 0, 0), math::Matrix(1, 3)).ok());
  const absl::Status s = AllReduceSum(&transport, 0, 2, AllReduceKey, &data);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(s.message(), HasSubstr("allreduce: peer 1's message tied_gradient(step=1, mb=64, "
                                     "chunk=0) holds 3 floats, expected 2"));
}

TEST(AllReduceSumTest, ALostPeerFailsWithTheLinksStatus) {
  auto boxes = Mailboxes(4);
  boxes[2]->Abort(absl::UnavailableError("link to stage/0 failed: Socket closed"));
  LoopbackTransport transport(&boxes, 2);
  math::Tensor data = PeerData(2, 16);
  const absl::Status s = AllReduceSum(&transport, 2, 4, AllReduceKey, &data);
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable);
}

// The partner of each round (who may send a peer that round's message): the halving pairs bit
// 0, 1, 2 ..., the doubling the same bits in reverse; the relation is symmetric.
TEST(AllReduceSumTest, PartnersPairBitsUpThenDown) {
  EXPECT_EQ(AllReduceRounds(1), 0);
  EXPECT_EQ(AllReduceRounds(2), 2);
  EXPECT_EQ(AllReduceRounds(8), 6);
  EXPECT_EQ(AllReduceRounds(6), -1);
  EXPECT_EQ(AllReduceRounds(0), -1);
  const std::vector<int> of_five = {4, 7, 1, 1, 7, 4};  // 5 ^ 1, 5 ^ 2, 5 ^ 4, then back.
  for (int round = 0; round < 6; ++round) {
    EXPECT_EQ(AllReducePartner(5, 8, round), of_five[round]) << round;
    for (int me = 0; me < 8; ++me) {
      EXPECT_EQ(AllReducePartner(AllReducePartner(me, 8, round), 8, round), me);
    }
  }
  EXPECT_EQ(AllReducePartner(0, 2, 0), 1);
  EXPECT_EQ(AllReducePartner(1, 2, 1), 0);
  EXPECT_EQ(AllReducePartner(0, 2, 2), -1);  // past the last round.
  EXPECT_EQ(AllReducePartner(0, 1, 0), -1);  // one peer: no round.
  EXPECT_EQ(AllReducePartner(2, 2, 0), -1);  // not a peer.
  EXPECT_EQ(AllReducePartner(0, 3, 0), -1);  // not a power of two.
}

}  // namespace
}  // namespace pipetrain::worker
