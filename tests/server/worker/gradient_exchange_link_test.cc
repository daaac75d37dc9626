// The gradient exchange over a real Exchange stream on 127.0.0.1 (PeerLink, ExchangeService): two
// peers swap a 4 MB part (fragmented, credit-controlled) and both hold the same lower + upper
// bits; AllReduceSum over the same link gives SumWithPeer's bits; a dialler of another generation
// or without the link secret fails both peers' exchange with ABORTED or UNAUTHENTICATED.
#include <cstdint>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "server/link/exchange_service.h"
#include "server/link/peer_link.h"
#include "server/worker/gradient_exchange.h"
#include "server/worker/mailbox.h"
#include "tests/server/link/loopback_server.h"

namespace pipetrain::worker {
namespace {

using link::LinkSettings;
using link::PeerHello;
using link::PeerLink;
using ::testing::HasSubstr;
using wire::TensorKey;
using wire::TensorKind;

constexpr char kJob[] = "job-tie";
constexpr int64_t kGeneration = 3;
constexpr char kSecret[] = "secret-of-generation-3";

wire::FrameValidation Validation() {
  wire::FrameValidation v;
  v.expected = wire::StreamIdentity{kJob, kGeneration};
  v.num_microbatches = 256;
  v.num_chunks = 2;  // peer 0 owns chunk 0 (the embedding's end), peer 1 chunk 1 (the head's).
  return v;
}

// One peer: its mailbox (fed by its link's on_tensor, aborted by its on_error) and its link.
struct Peer : public ExchangeTransport {
  Mailbox mailbox;
  absl::Mutex mu;
  PeerLink* link ABSL_GUARDED_BY(mu) = nullptr;

  link::LinkCallbacks Callbacks() {
    link::LinkCallbacks c;
    c.on_tensor = [this](const TensorKey& key, math::Matrix tensor) {
      return mailbox.Put(key, std::move(tensor));
    };
    c.on_error = [this](const absl::Status& status) { mailbox.Abort(status); };
    return c;
  }
  void Send(const TensorKey& key, math::Matrix tensor) override {
    absl::MutexLock lock(&mu);
    auto held = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return link != nullptr; };
    mu.AwaitWithTimeout(absl::Condition(&held), absl::Seconds(30));
    if (link == nullptr) {
      mailbox.Abort(absl::DeadlineExceededError("no link"));
      return;
    }
    if (absl::Status s = link->Send(key, std::make_shared<const math::Matrix>(std::move(tensor)));
        !s.ok()) {
      mailbox.Abort(s);
    }
  }
  absl::StatusOr<math::Matrix> Take(const TensorKey& key) override {
    return mailbox.Take(key, absl::Now() + absl::Seconds(30));
  }
};

// Peer 1 serves (checks the secret as a stage worker does), peer 0 dials it.
class ExchangeLinkTest : public ::testing::Test {
 protected:
  void SetUp() override {
    server_ = std::make_unique<link::testing::LoopbackServer>(
        [this](const PeerHello& hello,
               std::unique_ptr<PeerLink> accepted) -> absl::StatusOr<LinkSettings> {
          if (hello.secret != kSecret) {
            return absl::UnauthenticatedError("the stream does not present the link secret");
          }
          absl::MutexLock lock(&upper_.mu);
          upper_link_ = std::move(accepted);
          upper_.link = upper_link_.get();
          return LinkSettings{Validation(), upper_.Callbacks()};
        });
    ASSERT_TRUE(server_->serving());
  }

  void Dial(int64_t generation, const std::string& secret) {
    const std::string address = server_->Address();
    auto dialled = PeerLink::Connect(link::CreateExchangeChannel(address), address,
                                     PeerHello{"stage/0", {kJob, generation}, secret},
                                     link::LinkOptions{}, {Validation(), lower_.Callbacks()});
    ASSERT_TRUE(dialled.ok()) << dialled.status();
    lower_link_ = *std::move(dialled);
    absl::MutexLock lock(&lower_.mu);
    lower_.link = lower_link_.get();
  }

  void TearDown() override {
    if (lower_link_ != nullptr) lower_link_->Shutdown();
    {
      absl::MutexLock lock(&upper_.mu);
      if (upper_link_ != nullptr) upper_link_->Shutdown();
    }
    if (server_ != nullptr) server_->Shutdown();
  }

  // SumWithPeer on both peers at once; returns {lower's, upper's}.
  std::pair<absl::StatusOr<math::Tensor>, absl::StatusOr<math::Tensor>> Swap(
      const math::Tensor& lower, const math::Tensor& upper) {
    absl::StatusOr<math::Tensor> got_upper = absl::UnknownError("not run");
    std::thread t([&] {
      got_upper = SumWithPeer(&upper_, TensorKey{1, 0, 0, TensorKind::kTiedGradient},
                              TensorKey{1, 0, 1, TensorKind::kTiedGradient}, upper, false);
    });
    absl::StatusOr<math::Tensor> got_lower =
        SumWithPeer(&lower_, TensorKey{1, 0, 1, TensorKind::kTiedGradient},
                    TensorKey{1, 0, 0, TensorKind::kTiedGradient}, lower, true);
    t.join();
    return {std::move(got_lower), std::move(got_upper)};
  }

  Peer lower_, upper_;
  std::unique_ptr<link::testing::LoopbackServer> server_;
  std::unique_ptr<PeerLink> lower_link_;
  std::unique_ptr<PeerLink> upper_link_;  // guarded by upper_.mu while the server runs.
};

math::Tensor Part(int64_t rows, int64_t cols, int salt) {
  math::Tensor t{{rows, cols}, std::vector<float>(static_cast<size_t>(rows * cols))};
  for (size_t i = 0; i < t.data.size(); ++i) {
    t.data[i] = (i % 3 == 0 ? 1e6f : 1e-3f) * static_cast<float>((i * 7 + salt * 13) % 29) - 3.0f;
  }
  return t;
}

TEST_F(ExchangeLinkTest, BothPeersHoldTheSameSumOfA4MBPart) {
  Dial(kGeneration, kSecret);
  const math::Tensor lower = Part(1000, 1024, 1), upper = Part(1000, 1024, 2);
  auto [got_lower, got_upper] = Swap(lower, upper);
  ASSERT_TRUE(got_lower.ok()) << got_lower.status();
  ASSERT_TRUE(got_upper.ok()) << got_upper.status();
  std::vector<float> want(lower.data.size());
  for (size_t i = 0; i < want.size(); ++i) want[i] = lower.data[i] + upper.data[i];
  EXPECT_EQ(std::memcmp(got_lower->data.data(), want.data(), want.size() * 4), 0);
  EXPECT_EQ(std::memcmp(got_upper->data.data(), want.data(), want.size() * 4), 0);

  // The allreduce of 2 peers over the same link: the same bits.
  const auto key = [](int from, int to, int round) {
    return TensorKey{2, from * 64 + round, to, TensorKind::kTiedGradient};
  };
  math::Tensor a = lower, b = upper;
  absl::Status upper_status;
  std::thread t([&] { upper_status = AllReduceSum(&upper_, 1, 2, key, &b); });
  const absl::Status lower_status = AllReduceSum(&lower_, 0, 2, key, &a);
  t.join();
  ASSERT_TRUE(lower_status.ok()) << lower_status;
  ASSERT_TRUE(upper_status.ok()) << upper_status;
  EXPECT_EQ(std::memcmp(a.data.data(), want.data(), want.size() * 4), 0);
  EXPECT_EQ(std::memcmp(b.data.data(), want.data(), want.size() * 4), 0);
}

TEST_F(ExchangeLinkTest, ADiallerOfAnotherGenerationFailsTheExchangeWithAborted) {
  Dial(kGeneration + 1, kSecret);  // its frames name generation 4; the server is at 3.
  auto [got_lower, got_upper] = Swap(Part(4, 8, 1), Part(4, 8, 2));
  EXPECT_EQ(got_upper.status().code(), absl::StatusCode::kAborted) << got_upper.status();
  EXPECT_THAT(got_upper.status().message(), HasSubstr("stale frame tied_gradient"));
  // Whether the dialler got the server's part before the stream ended is a race: not asserted.
}

TEST_F(ExchangeLinkTest, ADiallerWithoutTheSecretFailsWithUnauthenticated) {
  Dial(kGeneration, "not-the-secret");
  // Only the lower peer runs: the server never gets a stream.
  const absl::StatusOr<math::Tensor> got =
      SumWithPeer(&lower_, TensorKey{1, 0, 1, TensorKind::kTiedGradient},
                  TensorKey{1, 0, 0, TensorKind::kTiedGradient}, Part(4, 8, 1), true);
  EXPECT_EQ(got.status().code(), absl::StatusCode::kUnauthenticated) << got.status();
  EXPECT_THAT(got.status().message(), HasSubstr("link secret"));
}

}  // namespace
}  // namespace pipetrain::worker
